"""The decompressed bytes of a zstd frame held in another source (a DCP item written with ``stream.zstd/1``).

A zstd frame cannot be read from the middle: every byte is reached by decompressing from the start. Memory
stays bounded whatever the sizes: the frame is decompressed once, in 1 MiB steps, to learn its size (the
writer does not record it), keeping only its first and last ``EDGE`` bytes (where a torch zip's headers,
pickle and directory are); other reads go through a decompressing cursor that moves forward (a sequential
read costs one pass; a read before the cursor restarts it from the frame's start). The window a frame may
ask for is capped at ``MAX_WINDOW`` (zstd's own default limit). What follows the frame is read as torch's
reader reads it (zstandard's stream reader): another frame continues the data, anything else is an error.

``zstandard`` is an optional dependency: without it, opening such a source raises UnsupportedError.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

from ..errors import FormatError, UnsupportedError
from .base import ByteSource, FileRegion, Identity

STEP = 1 << 20
EDGE = 1 << 20
MAX_WINDOW = 1 << 27


class _Stream:
    """A source as the raw input stream zstandard reads from."""

    def __init__(self, source: ByteSource) -> None:
        self.source = source
        self.pos = 0

    def read(self, n: int = -1) -> bytes:
        if n < 0:
            n = self.source.size - self.pos
        data = self.source.pread(self.pos, min(n, max(0, self.source.size - self.pos)))
        self.pos += len(data)
        return data


class ZstdFrame:
    """A source whose bytes are the decompressed content of the zstd frame in ``compressed``."""

    def __init__(self, compressed: ByteSource, label: str | None = None) -> None:
        try:
            import zstandard
        except ImportError:
            raise UnsupportedError("zstd-compressed data needs the zstandard package (pip install zstandard)",
                                   file=compressed.name, record=label) from None
        self._zstd: Any = zstandard
        self.compressed = compressed
        self.name = compressed.name
        self.label = label
        self.read_size = STEP
        self._lock = threading.Lock()
        self._cursor: Any = None
        self._pos = 0
        self.size, self._head, self._tail = self._scan()

    def _reader(self) -> Any:
        dctx = self._zstd.ZstdDecompressor(max_window_size=MAX_WINDOW)
        return dctx.stream_reader(_Stream(self.compressed), read_size=STEP, read_across_frames=False)

    def _read(self, reader: Any, n: int) -> bytes:
        try:
            return bytes(reader.read(n))
        except self._zstd.ZstdError as e:
            raise FormatError(f"corrupt zstd data ({e})", file=self.name, record=self.label) from None

    def _scan(self) -> tuple[int, bytes, bytes]:
        reader = self._reader()
        head = bytearray()
        tail = b""
        size = 0
        while True:
            chunk = self._read(reader, STEP)
            if not chunk:
                break
            if len(head) < EDGE:
                head += chunk[: EDGE - len(head)]
            tail = (tail + chunk)[-EDGE:]
            size += len(chunk)
        return size, bytes(head), tail

    # --- reading ------------------------------------------------------------------------------------
    def pread(self, offset: int, n: int) -> bytes:
        if offset < 0 or n < 0:
            raise ValueError("negative offset or size")
        n = max(0, min(n, self.size - offset))
        if n == 0:
            return b""
        if offset + n <= len(self._head):
            return self._head[offset : offset + n]
        tail_start = self.size - len(self._tail)
        if offset >= tail_start:
            return self._tail[offset - tail_start : offset - tail_start + n]
        with self._lock:
            if self._cursor is None or self._pos > offset:
                self._cursor, self._pos = self._reader(), 0
            while self._pos < offset:  # move forward, discarding
                skipped = self._read(self._cursor, min(STEP, offset - self._pos))
                if not skipped:
                    raise FormatError("zstd data ends early", file=self.name, record=self.label)
                self._pos += len(skipped)
            parts = []
            got = 0
            while got < n:
                chunk = self._read(self._cursor, n - got)
                if not chunk:
                    raise FormatError("zstd data ends early", file=self.name, record=self.label)
                parts.append(chunk)
                got += len(chunk)
            self._pos += got
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def preadinto(self, buf: memoryview, offset: int) -> int:
        data = self.pread(offset, len(buf))
        buf[: len(data)] = data
        return len(data)

    # --- abilities ----------------------------------------------------------------------------------
    def identity(self) -> Identity:
        return self.compressed.identity()

    def check_unchanged(self, thorough: bool = True) -> None:
        self.compressed.check_unchanged(thorough)

    def region(self) -> FileRegion | None:
        return None

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> None:
        return None

    def close(self) -> None:
        self._cursor = None

    def __repr__(self) -> str:
        return f"ZstdFrame({self.name!r}, {self.label!r}, size={self.size})"
