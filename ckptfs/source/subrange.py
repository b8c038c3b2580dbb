"""A range of another source as a source of its own: a zip record stored verbatim, a storage of a legacy
stream, an item of a DCP ``.distcp`` file (a whole torch zip at an offset), a zip inside that item.

Ranges of ranges are flattened: every SubRange reads its root source directly, with one offset added.
"""

from __future__ import annotations

from typing import Sequence

from ..errors import FormatError
from .base import ByteSource, FileRegion, Identity


class SubRange:
    """Bytes ``[start, start + size)`` of ``parent``. ``label`` names the range in messages (a record)."""

    __slots__ = ("parent", "start", "size", "name", "label", "read_size")

    parent: ByteSource
    start: int
    size: int
    name: str
    label: str | None
    read_size: int

    def __init__(self, parent: ByteSource, start: int, size: int, label: str | None = None) -> None:
        if start < 0 or size < 0:
            raise ValueError(f"negative range [{start}, +{size})")
        if isinstance(parent, SubRange):
            if start + size > parent.size:
                raise FormatError(f"range [{start}, {start + size}) runs past the end of {parent.label or 'its parent'}"
                                  f" ({parent.size} bytes)", file=parent.name, record=label)
            start += parent.start
            parent = parent.parent
        self.parent = parent
        self.start = start
        self.size = size
        self.name = parent.name
        self.label = label
        self.read_size = parent.read_size

    def _clip(self, offset: int, n: int) -> int:
        if offset < 0 or n < 0:
            raise ValueError("negative offset or size")
        return max(0, min(n, self.size - offset))

    def pread(self, offset: int, n: int) -> bytes:
        n = self._clip(offset, n)
        if n == 0:
            return b""
        data = self.parent.pread(self.start + offset, n)
        if len(data) != n:
            raise self._truncated()
        return data

    def preadinto(self, buf: memoryview, offset: int) -> int:
        n = self._clip(offset, len(buf))
        if n == 0:
            return 0
        if self.parent.preadinto(buf[:n], self.start + offset) != n:
            raise self._truncated()
        return n

    def _truncated(self) -> FormatError:
        return FormatError(f"data is truncated (the file ends at byte {self.parent.size}, the range at "
                           f"{self.start + self.size})", file=self.name, record=self.label)

    def identity(self) -> Identity:
        return self.parent.identity()

    def check_unchanged(self, thorough: bool = True) -> None:
        self.parent.check_unchanged(thorough)

    def region(self) -> FileRegion | None:
        r = self.parent.region()
        return None if r is None else FileRegion(r.file, r.offset + self.start)

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> None:
        self.parent.prefetch([(self.start + o, n) for o, n in ranges])

    def close(self) -> None:
        return None  # the parent belongs to whoever opened it

    def __repr__(self) -> str:
        return f"SubRange({self.name!r}, [{self.start}, +{self.size}), {self.label!r})"
