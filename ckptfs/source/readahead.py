"""Which bytes to fetch ahead of a reader: sequential streams, told apart by where each would read next.

A source is read by several readers at once (files of a mount, threads of a program) through positional
reads, without handles. Each read either continues a known *stream* (it starts near where a stream's last
read ended: up to ``BACK`` before, or within its window after) or starts a new one. A new stream fetches
only what its read needs (random access stays cheap); once reads continuing it add up to a block (a big
read followed by small ones nearby, as when a checkpoint is indexed, does not count), each read that
continues it makes sure the bytes ahead of it are on their way: a *window* that starts at ``initial`` bytes and doubles while the stream
stays sequential, up to ``maximum`` (shared out between the streams active at once, so that memory stays
bounded). Streams not read for a while are forgotten, the least recently used first beyond ``streams``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

BACK = 1 << 20  # a read this far before a stream's end still continues it (reads served out of order)
IDLE = 10.0  # seconds after which a stream no longer counts as active


@dataclass
class Stream:
    end: int  # where its last read ended
    ahead: int  # everything before this has been fetched or is on its way
    window: int = 0  # bytes fetched ahead at once (0: not sequential yet)
    used: float = 0.0
    run: int = 0  # bytes read by the reads that continued it


class Readahead:
    def __init__(self, size: int, block: int, initial: int, maximum: int, streams: int = 16) -> None:
        self.size = size
        self.block = block
        self.initial = max(initial, block)
        self.maximum = max(maximum, self.initial)
        self.max_streams = streams
        self.streams: list[Stream] = []  # most recently used last
        self._lock = threading.Lock()

    def _ceil(self, n: int) -> int:
        return min(self.size, -(-n // self.block) * self.block)

    def _match(self, offset: int) -> Stream | None:
        for s in reversed(self.streams):
            if s.end - BACK <= offset <= max(s.ahead, s.end + 2 * self.block):
                return s
        return None

    def on_read(self, offset: int, n: int) -> tuple[int, int] | None:
        """Record a read of ``[offset, offset + n)``; the byte range to fetch ahead of it now, if any."""
        end = offset + n
        now = time.monotonic()
        with self._lock:
            s = self._match(offset)
            if s is None:
                self.streams.append(Stream(end, self._ceil(end), 0, now))
                if len(self.streams) > self.max_streams:
                    del self.streams[0]
                return None
            self.streams.remove(s)
            self.streams.append(s)
            s.run += max(0, end - max(offset, s.end))
            s.end = max(s.end, end)
            s.used = now
            if s.run < self.block:
                return None
            if s.window == 0:
                s.window = self.initial
            if s.ahead - s.end > s.window // 2 or s.ahead >= self.size:
                return None
            start = max(s.ahead, self._ceil(s.end))
            stop = self._ceil(start + s.window)
            s.ahead = stop
            active = sum(1 for x in self.streams if x.window and now - x.used < IDLE)
            s.window = min(2 * s.window, max(self.initial, self.maximum // max(active, 1)))
            return (start, stop) if stop > start else None

    def after_fork(self) -> None:
        self._lock = threading.Lock()
        self.streams = []
