"""Which bytes to fetch ahead of a reader: sequential streams, told apart by where each would read next.

A source is read by several readers at once (files of a mount, threads of a program) through positional
reads, without handles. Each read either continues a known *stream* (it starts near where a stream's last
read ended: up to ``BACK`` before, up to ``FORWARD`` past what was fetched ahead of it — the kernel's own
read-ahead runs up to 16 MiB ahead of a reader, and a multi-threaded mount serves reads out of order) or starts a new
one. A new stream fetches only what its read needs (random access stays cheap); once reads continuing it
add up to a block (a big read followed by small ones nearby, as when a checkpoint is indexed, does not
count), the stream keeps a *window* of bytes ahead of its last read on their way: ``initial`` bytes at
first, doubling each time more is asked for, up to ``maximum`` (shared out between the streams active at
once, so that memory stays bounded); more is asked for once a ``step`` (or half the window) is missing.
What a sequential stream has read, ``KEEP`` bytes behind its furthest read, is dropped from the cache
(its memory takes the next blocks: fresh memory costs a page fault per 4 KiB). Streams not read for a while
are forgotten, the least recently used first beyond ``streams``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import NamedTuple

FORWARD = 16 << 20  # a read this far past what a stream fetched ahead still continues it (kernel read-ahead)
BACK = FORWARD + (8 << 20)  # ... and this far before its furthest read (the reader behind its kernel read-ahead)
KEEP = BACK  # a sequential stream's bytes further behind its furthest read than this are dropped: reads that far
# behind no longer continue it (a multi-threaded mount serves the kernel's read-ahead out of order: bytes fetched
# ahead are still to be copied out up to BACK behind the furthest read)
IDLE = 10.0  # seconds after which a stream no longer counts as active


@dataclass
class Stream:
    end: int  # where its last read ended
    ahead: int  # everything before this has been fetched or is on its way
    window: int = 0  # bytes fetched ahead at once (0: not sequential yet)
    used: float = 0.0
    run: int = 0  # bytes read by the reads that continued it
    kept: int = 0  # bytes before this were dropped (a sequential stream's past)


class Advice(NamedTuple):
    ahead: tuple[int, int] | None  # fetch this byte range now, in the background
    drop: tuple[int, int] | None  # forget the blocks of this range: a sequential reader is well past it


NOTHING = Advice(None, None)


class Readahead:
    def __init__(self, size: int, block: int, initial: int, maximum: int, step: int, streams: int = 16) -> None:
        self.size = size
        self.block = block
        self.initial = max(initial, block)
        self.maximum = max(maximum, self.initial)
        self.step = step
        self.max_streams = streams
        self.streams: list[Stream] = []  # most recently used last
        self._lock = threading.Lock()

    def _ceil(self, n: int) -> int:
        return min(self.size, -(-n // self.block) * self.block)

    def _match(self, offset: int) -> Stream | None:
        for s in reversed(self.streams):
            if s.end - BACK <= offset <= max(s.ahead, s.end) + FORWARD:
                return s
        return None

    def on_read(self, offset: int, n: int) -> Advice:
        """Record a read of ``[offset, offset + n)``: what to fetch ahead of it and what to forget now."""
        end = offset + n
        now = time.monotonic()
        with self._lock:
            s = self._match(offset)
            if s is None:
                self.streams.append(Stream(end, self._ceil(end), 0, now, 0, offset - offset % self.block))
                if len(self.streams) > self.max_streams:
                    del self.streams[0]
                return NOTHING
            self.streams.remove(s)
            self.streams.append(s)
            if s.window == 0 and offset > s.end + self.block:  # not sequential yet, and skipping ahead: the
                s.run = 0  # evidence starts again, and what was skipped was not read (never dropped)
                s.kept = offset - offset % self.block
            s.run += n
            s.end = max(s.end, end)
            s.used = now
            if s.run < self.block:
                return NOTHING
            drop = None
            keep_from = s.end - KEEP
            keep_from -= keep_from % self.block
            if s.window and keep_from - s.kept >= 4 * self.block:
                drop = (s.kept, keep_from)
                s.kept = keep_from
            if s.ahead >= self.size:
                return Advice(None, drop)
            if s.window == 0:
                s.window = self.initial
            start = max(s.ahead, self._ceil(s.end))
            stop = self._ceil(s.end + s.window)
            if stop - start < min(self.step, s.window // 2) and stop < self.size:
                return Advice(None, drop)
            s.ahead = stop
            active = sum(1 for x in self.streams if x.window and now - x.used < IDLE)
            s.window = min(2 * s.window, max(self.initial, self.maximum // max(active, 1)))
            return Advice((start, stop) if stop > start else None, drop)

    def after_fork(self) -> None:
        self._lock = threading.Lock()
        self.streams = []
