"""A local file: one read-only fd, ``os.pread`` at absolute offsets (thread-safe, no shared position)."""

from __future__ import annotations

import mmap
import os
import stat
import threading
from typing import Sequence

from ..errors import CkptfsError, StaleSourceError
from .base import FileRegion, Identity

MemoryMap = mmap.mmap  # (a method below is named mmap)

LOCAL_READ_SIZE = 1 << 20


class LocalFile:
    """A local file opened read-only once; all reads are ``os.pread`` at absolute offsets."""

    read_size = LOCAL_READ_SIZE

    def __init__(self, path: str | os.PathLike[str], *, name: str | None = None, follow: bool = True) -> None:
        """Open ``path``; ``name`` is how messages name it when that differs from the path opened (a file of
        a directory opened by its real path); ``follow=False`` refuses a symlink (O_NOFOLLOW)."""
        self.name = os.fspath(path) if name is None else name
        self._path = os.fspath(path)
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | (0 if follow else getattr(os, "O_NOFOLLOW", 0))
        try:
            self.fd = os.open(self._path, flags)
        except OSError as e:
            raise CkptfsError(e.strerror or str(e), file=self.name) from None
        st = os.fstat(self.fd)
        if stat.S_ISDIR(st.st_mode):
            os.close(self.fd)
            raise CkptfsError("is a directory, not a checkpoint file", file=self.name)
        self._stat = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        self._identity = Identity("posix", (st.st_dev, st.st_ino, st.st_mtime_ns), st.st_size, st.st_mtime_ns)
        self.size = st.st_size
        self._closed = False
        self._map: mmap.mmap | None = None
        self._view: mmap.mmap | None = None
        self._map_lock = threading.Lock()
        self._region = FileRegion(self, 0)

    # -- reading -------------------------------------------------------------------------------
    def pread(self, offset: int, n: int) -> bytes:
        if n <= 0:
            return b""
        data = os.pread(self.fd, n, offset)
        if len(data) == n:
            return data
        # A short read below our recorded size means the file shrank under us; keep reading
        # otherwise (pread may legally return short on some file systems).
        parts = [data]
        got = len(data)
        while got < n:
            more = os.pread(self.fd, n - got, offset + got)
            if not more:
                break
            parts.append(more)
            got += len(more)
        if got < n and offset + got < self.size:
            raise self._shrunk(offset + got)
        return b"".join(parts)

    def preadinto(self, buf: memoryview, offset: int) -> int:
        n = len(buf)
        got = 0
        while got < n:
            k = os.preadv(self.fd, [buf[got:]], offset + got)
            if k <= 0:
                break
            got += k
        if got < n and offset + got < self.size:
            raise self._shrunk(offset + got)
        return got

    def _shrunk(self, at: int) -> StaleSourceError:
        return StaleSourceError(f"short read at offset {at} (file is shorter than when it was opened)",
                                file=self.name)

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> None:
        return None  # the page cache and the kernel's readahead do this for local files

    # -- abilities -----------------------------------------------------------------------------
    def region(self) -> FileRegion:
        return self._region

    def mmap(self) -> MemoryMap:
        """A private (copy-on-write) map of the whole file, created once: zero-copy numpy arrays and torch
        tensors view it. Writes to it never reach the file."""
        if self._map is None:
            with self._map_lock:
                if self._map is None:
                    self._map = mmap.mmap(self.fd, 0, access=mmap.ACCESS_COPY) if self.size else mmap.mmap(-1, 1)
        return self._map

    def view(self) -> MemoryMap:
        """A read-only shared map of the whole file, created once, for reading through the page cache
        (strided gathers). Unlike the private map it is never charged as memory the process might write,
        so it works for files larger than RAM under the kernel's default overcommit heuristic."""
        if self._view is None:
            with self._map_lock:
                if self._view is None:
                    self._view = mmap.mmap(self.fd, 0, access=mmap.ACCESS_READ) if self.size else mmap.mmap(-1, 1)
        return self._view

    # -- staleness -----------------------------------------------------------------------------
    def identity(self) -> Identity:
        return self._identity

    def check_unchanged(self, thorough: bool = True) -> None:
        """One fstat on our fd (catches truncation and in-place rewrites); ``thorough`` adds one stat of the
        path (catches a rename over it or deletion)."""
        st = os.fstat(self.fd)
        if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != self._stat:
            now = Identity("posix", (st.st_dev, st.st_ino, st.st_mtime_ns), st.st_size, st.st_mtime_ns)
            raise StaleSourceError(self._identity.describe_change(now), file=self.name)
        if not thorough:
            return
        try:
            pst = os.stat(self._path)
        except FileNotFoundError:
            raise StaleSourceError("the checkpoint was deleted while in use", file=self.name) from None
        except OSError:
            return
        if (pst.st_dev, pst.st_ino) != (st.st_dev, st.st_ino):
            raise StaleSourceError("the checkpoint was replaced (another file now has its name)", file=self.name)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            # The map is never closed explicitly: numpy arrays and torch tensors made from it may outlive
            # the checkpoint (torch.frombuffer keeps only a reference, so close() would unmap memory a
            # tensor still uses). It is unmapped when the last of them goes away.
            self._map = None
            self._view = None
            os.close(self.fd)

    def __enter__(self) -> LocalFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LocalFile({self.name!r}, size={self.size})"
