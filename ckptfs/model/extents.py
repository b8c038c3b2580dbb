"""Where bytes live, as data: every file ckptfs serves is a list of pieces laid end to end.

A piece is literal bytes (a sidecar, a header), a range of a source (a tensor stored contiguously: the
checkpoint's own bytes, no copy), or a computed transform (a strided gather, a byte swap, chunks of
several files assembled). :class:`Content` is such a list; :class:`ContentHandle` is the one open-file
type every front end reads through (the FUSE adapter, the Python API, ``export``).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol, Sequence, Union

from ..errors import FormatError
from ..source import ByteSource, FileRegion, SubRange

#: A stretch of a file's bytes as they lie somewhere: ``(fd, position, length)`` in a local file, or the
#: bytes themselves (a literal piece). See :meth:`Content.file_spans`.
FileSpan = Union[tuple[int, int, int], bytes]


class Piece(Protocol):
    """``size`` bytes, readable from any offset inside the piece."""

    @property
    def size(self) -> int: ...

    def readinto(self, buf: memoryview, offset: int) -> None:
        """Fill all of ``buf`` (never more than ``size - offset`` bytes) from ``offset`` in the piece."""
        ...


@dataclass(frozen=True, slots=True)
class Literal:
    """Bytes held in memory."""

    data: bytes

    @property
    def size(self) -> int:
        return len(self.data)

    def readinto(self, buf: memoryview, offset: int) -> None:
        buf[:] = self.data[offset : offset + len(buf)]


@dataclass(frozen=True, slots=True)
class SourceRange:
    """``size`` bytes of ``source`` from ``offset``: served by ``preadinto``, never copied in between."""

    source: ByteSource
    offset: int
    size: int
    label: str | None = None  # the record, for messages

    def readinto(self, buf: memoryview, offset: int) -> None:
        n = len(buf)
        if self.source.preadinto(buf, self.offset + offset) != n:
            raise FormatError(f"data is truncated (wanted {n} bytes at {self.offset + offset})",
                              file=self.source.name, record=self.label)

    def region(self) -> FileRegion | None:
        """Where these bytes lie in a local file (zero-copy maps, splice), or None."""
        r = self.source.region()
        return None if r is None else FileRegion(r.file, r.offset + self.offset)

    def file_span(self, offset: int, n: int) -> tuple[int, int, int] | None:
        """``(fd, position, n)``: where bytes [offset, offset + n) of the piece lie in a local file, or None
        (not a local file, or the file is shorter than the range: reading it says why)."""
        r = self.source.region()
        if r is None:
            return None
        pos = r.offset + self.offset + offset
        if pos + n > r.file.size:
            return None
        return (r.fd, pos, n)


@dataclass(frozen=True, slots=True)
class Computed:
    """Bytes made on demand by ``fill(buf, offset)`` (a gather, a byte swap, an assembly of chunks).
    ``sources`` are the sources ``fill`` reads (checked for staleness like ranges)."""

    size: int
    fill: Callable[[memoryview, int], None]
    what: str
    sources: tuple[ByteSource, ...] = ()

    def readinto(self, buf: memoryview, offset: int) -> None:
        self.fill(buf, offset)


def source_range(source: ByteSource, offset: int, size: int) -> SourceRange:
    """A range of ``source``, expressed on its root source (ranges of ranges read in one call)."""
    label = None
    if isinstance(source, SubRange):
        label = source.label
        offset += source.start
        source = source.parent
    return SourceRange(source, offset, size, label)


class Content:
    """A file's bytes as pieces laid end to end."""

    __slots__ = ("pieces", "starts", "size", "_single")

    def __init__(self, pieces: Iterable[Piece]) -> None:
        self.pieces: list[Piece] = [p for p in pieces if p.size]
        starts = []
        pos = 0
        for p in self.pieces:
            starts.append(pos)
            pos += p.size
        self.starts = starts
        self.size = pos
        self._single = self.pieces[0] if len(self.pieces) == 1 else None

    @classmethod
    def of_bytes(cls, data: bytes) -> Content:
        return cls([Literal(data)])

    def readinto(self, buf: memoryview, offset: int) -> int:
        """Fill ``buf`` with bytes from ``offset``; returns the count (short only at the end)."""
        if offset < 0:
            raise ValueError("negative offset")
        n = min(len(buf), self.size - offset)
        if n <= 0:
            return 0
        single = self._single
        if single is not None:
            single.readinto(buf[:n] if n != len(buf) else buf, offset)
            return n
        pieces, starts = self.pieces, self.starts
        i = bisect.bisect_right(starts, offset) - 1
        done = 0
        while done < n:
            p = pieces[i]
            inner = offset + done - starts[i]
            k = min(p.size - inner, n - done)
            p.readinto(buf[done : done + k], inner)
            done += k
            i += 1
        return n

    def read(self, offset: int = 0, size: int = -1) -> bytes:
        if size < 0 or offset + size > self.size:
            size = max(0, self.size - offset)
        out = bytearray(size)
        self.readinto(memoryview(out), offset)
        return bytes(out)

    def file_spans(self, offset: int, size: int) -> list[FileSpan] | None:
        """Where bytes [offset, offset + size) lie, end to end: ``(fd, position, length)`` spans of local
        files and literal bytes, for a reader that moves them itself (the FUSE adapter splices file pages
        into its reply instead of copying them). Fewer bytes only at the end of the content; None when
        some of them must be made (a computed piece) or read through a source that is not a local file."""
        if offset < 0:
            raise ValueError("negative offset")
        n = min(size, self.size - offset)
        if n <= 0:
            return []
        pieces, starts = self.pieces, self.starts
        i = 0 if self._single is not None else bisect.bisect_right(starts, offset) - 1
        out: list[FileSpan] = []
        done = 0
        while done < n:
            p = pieces[i]
            inner = offset + done - starts[i]
            k = min(p.size - inner, n - done)
            if isinstance(p, SourceRange):
                span = p.file_span(inner, k)
                if span is None:
                    return None
                out.append(span)
            elif isinstance(p, Literal):
                out.append(p.data[inner : inner + k])
            else:
                return None
            done += k
            i += 1
        return out

    def sources(self) -> list[ByteSource]:
        """Every source the pieces read (for staleness checks), each once."""
        seen: dict[int, ByteSource] = {}
        for p in self.pieces:
            if isinstance(p, SourceRange):
                seen.setdefault(id(p.source), p.source)
            elif isinstance(p, Computed):
                for s in p.sources:
                    seen.setdefault(id(s), s)
        return list(seen.values())

    def single_range(self) -> SourceRange | None:
        """The whole content as one range of one source, or None."""
        return self._single if isinstance(self._single, SourceRange) else None

    def __repr__(self) -> str:
        return f"Content({len(self.pieces)} pieces, {self.size} bytes)"


class ContentHandle:
    """An open file of any kind: ``readinto(buf, offset)`` serves its content.

    With ``verify`` (the default for files read from a checkpoint), each read first checks the sources
    it reads from with ``check_unchanged(thorough=False)`` (one fstat for a local file), so a checkpoint
    truncated or rewritten while open gives an error instead of other bytes."""

    __slots__ = ("content", "_check")

    def __init__(self, content: Content, verify: bool = True) -> None:
        self.content = content
        self._check: Sequence[ByteSource] = content.sources() if verify else ()

    @property
    def size(self) -> int:
        return self.content.size

    def readinto(self, buf: memoryview, offset: int) -> int:
        for s in self._check:
            s.check_unchanged(False)
        return self.content.readinto(buf, offset)

    def read(self, offset: int = 0, size: int = -1) -> bytes:
        for s in self._check:
            s.check_unchanged(False)
        return self.content.read(offset, size)

    def file_spans(self, offset: int, size: int) -> list[FileSpan] | None:
        """Where bytes [offset, offset + size) lie (:meth:`Content.file_spans`), after the same staleness
        check as a read: the caller moves the bytes itself."""
        for s in self._check:
            s.check_unchanged(False)
        return self.content.file_spans(offset, size)

    def close(self) -> None:
        self._check = ()
