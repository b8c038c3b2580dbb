"""A bounded in-memory cache of fixed-size blocks of a remote object, with blocks in flight.

Every block is in one of three states: absent, *pending* (one thread fetches it; others wait on its event)
or cached (LRU, evicted beyond ``capacity`` bytes). A reader ``claim``s the absent blocks it needs (making
them pending: they are now its to fetch), fetches them into ``buffer()``s, and ``put``s or ``fail``s each;
readers of a pending block ``wait`` for it, then ``copy`` bytes out of it.

Buffers are recycled: an evicted or ``drop``ped block's buffer is kept (up to ``pool`` bytes) and handed out
again by ``buffer()``. A fresh buffer costs a page fault per 4 KiB when first written, as much as receiving
its bytes; a sequential reader that drops what it has read (drop-behind) fetches into the same memory over
and over. So that a buffer is never rewritten while a reader copies from it, bytes leave the cache only by
``copy``, under the cache's lock.
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
    def __init__(self, block: int, capacity: int, pool: int = 64 << 20) -> None:
        self.block = block
        self.capacity = max(capacity, 4 * block)
        self._pool_max = max(pool // block, 0)
        self._lock = threading.Lock()
        self._data: OrderedDict[int, bytes | bytearray] = OrderedDict()
        self._pending: dict[int, _Pending] = {}
        self._free: list[bytearray] = []
        self._bytes = 0

    # --- buffers -------------------------------------------------------------------------------------------
    def buffer(self, n: int) -> bytearray:
        """A buffer of ``n`` bytes to fetch a block into (a recycled one for a whole block)."""
        if n == self.block:
            with self._lock:
                if self._free:
                    return self._free.pop()
        return bytearray(n)

    def _recycle(self, data: bytes | bytearray) -> None:
        if type(data) is bytearray and len(data) == self.block and len(self._free) < self._pool_max:
            self._free.append(data)

    # --- states --------------------------------------------------------------------------------------------
    def has(self, idx: int) -> bool:
        """Cached or pending."""
        with self._lock:
            return idx in self._data or idx in self._pending

    def cached(self, idx: int) -> bool:
        with self._lock:
            return idx in self._data

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
        """Cache a block (fetched by the caller, who claimed it); never changed afterwards."""
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
                self._recycle(evicted)
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

    def drop(self, indices: Iterable[int]) -> None:
        """Forget cached blocks now (read past by a sequential reader): their memory is reused."""
        with self._lock:
            for idx in indices:
                data = self._data.pop(idx, None)
                if data is not None:
                    self._bytes -= len(data)
                    self._recycle(data)

    # --- reading -------------------------------------------------------------------------------------------
    def copy(self, idx: int, dest: memoryview, lo: int) -> bool:
        """Copy block ``idx``'s bytes from ``lo`` into all of ``dest``; False if it is not cached."""
        with self._lock:
            data = self._data.get(idx)
            if data is None:
                return False
            self._data.move_to_end(idx)
            dest[:] = memoryview(data)[lo : lo + len(dest)]
            return True

    def wait(self, idx: int, timeout: float) -> bool:
        """Wait until block ``idx`` is no longer pending; True if it is then cached. False means absent (or its
        fetch failed with a transient error): the caller fetches it. Raises the fetch's error if it was not
        transient, RemoteError after ``timeout``."""
        with self._lock:
            if idx in self._data:
                return True
            pending = self._pending.get(idx)
        if pending is None:
            return False
        if not pending.event.wait(max(timeout, 0.0)):
            raise RemoteError("timed out waiting for bytes being fetched")
        if pending.error is not None and not isinstance(pending.error, RemoteError):
            raise copy.copy(pending.error)  # shared by the waiters: each adds its own record
        return self.cached(idx)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._free.clear()
            self._bytes = 0

    def after_fork(self) -> None:
        """In a forked child: no thread of the parent exists, so nothing pending will ever arrive."""
        self._lock = threading.Lock()
        pending, self._pending = self._pending, {}
        for p in pending.values():
            p.error = RemoteError("fetch abandoned by fork")
            p.event = threading.Event()
            p.event.set()
