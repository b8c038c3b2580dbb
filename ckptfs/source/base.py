"""The source seam: what a byte source is, and what it says it can do.

Everything above this package reads bytes through :class:`ByteSource` and nothing else: a size,
positional reads, an identity that tells whether the bytes changed, and two declared abilities that
callers ask for instead of probing with ``getattr``:

* :meth:`ByteSource.region` — where the bytes lie in a local file (an fd and an offset), or None. With
  a region, tensors become zero-copy maps of the page cache and a read can be verified with one fstat.
* :meth:`ByteSource.prefetch` — a hint that some ranges will be read soon (a remote source fetches them
  in one concurrent batch; a local file ignores it).

A new kind of source (HTTP, an object store, a cache) implements this Protocol and nothing else.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Sequence, runtime_checkable

from ..errors import FormatError

if TYPE_CHECKING:
    from .local import LocalFile


@dataclass(frozen=True)
class Identity:
    """What must not change while an index of a source is in use.

    ``token`` is opaque to callers: (device, inode, mtime) for a local file, (ETag, Last-Modified) for a
    remote object. Two identities are equal exactly when the bytes are taken to be the same."""

    kind: str
    token: tuple[object, ...]
    size: int
    #: when the bytes were last modified (ns since the epoch), for display (mount times); 0 if unknown
    modified_ns: int = 0

    def describe_change(self, now: Identity) -> str:
        """One line saying how ``now`` differs from this identity."""
        if now.size < self.size:
            return f"the checkpoint was truncated while in use ({self.size} -> {now.size} bytes)"
        if now.size != self.size:
            return f"the checkpoint changed size while in use ({self.size} -> {now.size} bytes)"
        if self.kind == "posix":
            return "the checkpoint was modified while in use (mtime changed)"
        return f"the checkpoint was replaced while in use ({self.kind} identity changed)"


@dataclass(frozen=True)
class FileRegion:
    """A source's bytes as a range of a local file: byte 0 of the source is byte ``offset`` of ``file``."""

    file: LocalFile
    offset: int

    @property
    def fd(self) -> int:
        return self.file.fd

    def mapping(self) -> tuple[mmap.mmap, int]:
        """The file's shared private (copy-on-write) map and where the source's byte 0 lies in it."""
        return self.file.mmap(), self.offset

    def view(self) -> tuple[mmap.mmap, int]:
        """The file's read-only map and where the source's byte 0 lies in it: for reading through the page
        cache (a private writable map of a file larger than memory may be refused: ENOMEM)."""
        return self.file.view(), self.offset


@runtime_checkable
class ByteSource(Protocol):
    """Bytes that can be read at any offset. Implementations must be safe to read from several threads."""

    #: Shown in messages (a path, or a URL without credentials).
    name: str
    size: int
    #: The read size that costs little more than a smaller one (1 MiB locally, larger for remote objects).
    read_size: int

    def pread(self, offset: int, n: int) -> bytes:
        """Exactly ``n`` bytes at ``offset`` (fewer only past the end), or raise."""
        ...

    def preadinto(self, buf: memoryview, offset: int) -> int:
        """Fill ``buf`` from ``offset``; returns the count (short only at the end)."""
        ...

    def identity(self) -> Identity: ...

    def check_unchanged(self, thorough: bool = True) -> None:
        """Raise :class:`~ckptfs.errors.StaleSourceError` if the bytes changed. ``thorough=False`` is the
        check made before every served read: it must be cheap (one fstat locally)."""
        ...

    def region(self) -> FileRegion | None:
        """Where the bytes lie in a local file, or None (remote, decompressed, in memory)."""
        ...

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Hint: these (offset, length) ranges will be read soon. May do nothing."""
        ...

    def close(self) -> None: ...


def read_exact(source: ByteSource, offset: int, n: int, what: str, record: str | None = None) -> bytes:
    """``n`` bytes at ``offset`` or a FormatError naming ``what`` (a structure the format says is there)."""
    data = source.pread(offset, n)
    if len(data) != n:
        raise FormatError(f"{what} is truncated (file ends at byte {source.size})", file=source.name, record=record)
    return data
