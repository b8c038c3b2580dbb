"""An in-memory source: tests, and bytes made by ckptfs itself."""

from __future__ import annotations

from typing import Sequence

from .base import FileRegion, Identity


class BytesSource:
    """Bytes held in memory, read like a file."""

    read_size = 1 << 20

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
        return Identity("memory", (id(self._data),), self.size)

    def check_unchanged(self, thorough: bool = True) -> None:
        return None

    def region(self) -> FileRegion | None:
        return None

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> None:
        return None

    def close(self) -> None:
        return None

    def __repr__(self) -> str:
        return f"BytesSource({self.name!r}, size={self.size})"
