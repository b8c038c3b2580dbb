"""Byte sources: where a checkpoint's bytes come from.

Everything above this module sees only :class:`ByteSource`: a size, positional reads and an identity
that tells whether the bytes may have changed. A local file is one read-only fd read with ``os.pread``
(thread-safe, no shared seek position); remote sources can plug in behind the same interface.
"""

from __future__ import annotations

import mmap
import os
import stat
import threading
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..errors import CkptfsError, StaleSourceError


@dataclass(frozen=True)
class Identity:
    """What must not change while an index of the source is in use."""

    dev: int
    inode: int
    size: int
    mtime_ns: int


@runtime_checkable
class ByteSource(Protocol):
    name: str
    size: int

    def pread(self, offset: int, n: int) -> bytes:
        """Exactly ``n`` bytes at ``offset`` (fewer only past the end), or raise."""

    def preadinto(self, buf: memoryview, offset: int) -> int:
        """Fill ``buf`` from ``offset``; returns the count (short only at the end)."""

    def identity(self) -> Identity: ...

    def check_unchanged(self) -> None:
        """Raise :class:`StaleSourceError` if the bytes behind the source changed."""

    def close(self) -> None: ...


class LocalFile:
    """A local file opened read-only once; all reads are ``os.pread`` at absolute offsets."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.name = os.fspath(path)
        try:
            self.fd = os.open(self.name, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            raise CkptfsError(e.strerror or str(e), file=self.name) from None
        st = os.fstat(self.fd)
        if stat.S_ISDIR(st.st_mode):
            os.close(self.fd)
            raise CkptfsError("is a directory, not a checkpoint file", file=self.name)
        self._identity = Identity(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        self.size = st.st_size
        self._closed = False
        self._map: mmap.mmap | None = None
        self._map_lock = threading.Lock()

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
        data = b"".join(parts)
        if got < n and offset + got < self.size:
            raise StaleSourceError(
                f"short read at offset {offset + got} (file is shorter than when it was opened)", file=self.name
            )
        return data

    def preadinto(self, buf: memoryview, offset: int) -> int:
        n = len(buf)
        got = 0
        while got < n:
            k = os.preadv(self.fd, [buf[got:]], offset + got)
            if k <= 0:
                break
            got += k
        if got < n and offset + got < self.size:
            raise StaleSourceError(
                f"short read at offset {offset + got} (file is shorter than when it was opened)", file=self.name
            )
        return got

    def mmap(self) -> mmap.mmap:
        """A private (copy-on-write) map of the whole file, created once: zero-copy numpy arrays and torch
        tensors view it, strided gathers read through it. Writes to it never reach the file."""
        if self._map is None:
            with self._map_lock:
                if self._map is None:
                    self._map = mmap.mmap(self.fd, 0, access=mmap.ACCESS_COPY) if self.size else mmap.mmap(-1, 1)
        return self._map

    # -- staleness -----------------------------------------------------------------------------
    def identity(self) -> Identity:
        return self._identity

    def check_unchanged(self) -> None:
        """Cheap: one fstat on our fd (catches truncation / in-place rewrites) and one stat of the
        path (catches a rename over it or deletion)."""
        st = os.fstat(self.fd)
        now = Identity(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if now != self._identity:
            raise StaleSourceError(_describe_change(self._identity, now), file=self.name)
        try:
            pst = os.stat(self.name)
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
            os.close(self.fd)

    def __enter__(self) -> "LocalFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LocalFile({self.name!r}, size={self.size})"


class BytesSource:
    """An in-memory source (tests, records extracted from other containers)."""

    def __init__(self, data: bytes, name: str = "<bytes>") -> None:
        self._data = bytes(data)
        self.name = name
        self.size = len(self._data)

    def pread(self, offset: int, n: int) -> bytes:
        return self._data[offset : offset + max(n, 0)]

    def preadinto(self, buf: memoryview, offset: int) -> int:
        chunk = self._data[offset : offset + len(buf)]
        buf[: len(chunk)] = chunk
        return len(chunk)

    def identity(self) -> Identity:
        return Identity(0, id(self._data), self.size, 0)

    def check_unchanged(self) -> None:
        return None

    def close(self) -> None:
        return None


def _describe_change(old: Identity, new: Identity) -> str:
    if new.size < old.size:
        return f"the checkpoint was truncated while in use ({old.size} -> {new.size} bytes)"
    if new.size != old.size:
        return f"the checkpoint changed size while in use ({old.size} -> {new.size} bytes)"
    return "the checkpoint was modified while in use (mtime changed)"


def open_source(path_or_source: "str | os.PathLike[str] | ByteSource") -> ByteSource:
    if isinstance(path_or_source, (str, os.PathLike)):
        return LocalFile(path_or_source)
    if isinstance(path_or_source, ByteSource):
        return path_or_source
    raise TypeError(f"expected a path or a ByteSource, got {type(path_or_source).__name__}")
