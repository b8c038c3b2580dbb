"""A bounded in-memory cache of fixed-size blocks of a remote object, with blocks in flight.

Every block is in one of three states: absent, *pending* (one thread fetches it; others wait on its event)
or cached (LRU, evicted beyond ``capacity`` bytes). A reader ``claim``s the absent blocks it needs (making
them pending: they are now its to fetch), fetches them, and ``put``s or ``fail``s each; readers of a pending
block ``wait`` for it. Blocks are never changed once cached.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from collections.abc import Iterable

from ..errors import RemoteError


class _Pending:
    __slots__ = ("event", "error")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.error: BaseException | None = None


class BlockCache:
    def __init__(self, block: int, capacity: int) -> None:
        self.block = block
        self.capacity = max(capacity, 4 * block)
        self._lock = threading.Lock()
        self._data: OrderedDict[int, bytes | bytearray] = OrderedDict()
        self._pending: dict[int, _Pending] = {}
        self._bytes = 0

    def get(self, idx: int) -> bytes | bytearray | None:
        with self._lock:
            data = self._data.get(idx)
            if data is not None:
                self._data.move_to_end(idx)
            return data

    def has(self, idx: int) -> bool:
        """Cached or pending."""
        with self._lock:
            return idx in self._data or idx in self._pending

    def claim(self, indices: Iterable[int]) -> list[int]:
        """Of ``indices``, those neither cached nor pending, now pending and the caller's to fetch."""
        out = []
        with self._lock:
            for idx in indices:
                if idx not in self._data and idx not in self._pending:
                    self._pending[idx] = _Pending()
                    out.append(idx)
        return out

    def put(self, idx: int, data: bytes | bytearray) -> None:
        with self._lock:
            pending = self._pending.pop(idx, None)
            old = self._data.pop(idx, None)
            if old is not None:
                self._bytes -= len(old)
            self._data[idx] = data
            self._bytes += len(data)
            while self._bytes > self.capacity and len(self._data) > 1:
                _, evicted = self._data.popitem(last=False)
                self._bytes -= len(evicted)
        if pending is not None:
            pending.event.set()

    def fail(self, indices: Iterable[int], error: BaseException) -> None:
        """The caller could not fetch these (still pending) blocks: their waiters see ``error``."""
        done = []
        with self._lock:
            for idx in indices:
                pending = self._pending.pop(idx, None)
                if pending is not None:
                    pending.error = error
                    done.append(pending)
        for pending in done:
            pending.event.set()

    def wait(self, idx: int, timeout: float, what: str) -> bytes | bytearray | None:
        """The block once cached; None if it is absent (or its fetch failed with a transient error: the caller
        fetches it again). Raises the fetch's error if it was not transient, RemoteError after ``timeout``."""
        with self._lock:
            data = self._data.get(idx)
            if data is not None:
                self._data.move_to_end(idx)
                return data
            pending = self._pending.get(idx)
        if pending is None:
            return None
        if not pending.event.wait(max(timeout, 0.0)):
            raise RemoteError(f"{what}: timed out waiting for bytes being fetched")
        if pending.error is not None and not isinstance(pending.error, RemoteError):
            raise copy.copy(pending.error)  # shared by the waiters: each adds its own record
        return self.get(idx)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._bytes = 0

    def after_fork(self) -> None:
        """In a forked child: no thread of the parent exists, so nothing pending will ever arrive."""
        self._lock = threading.Lock()
        pending, self._pending = self._pending, {}
        for p in pending.values():
            p.error = RemoteError("fetch abandoned by fork")
            p.event = threading.Event()
            p.event.set()
