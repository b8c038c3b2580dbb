"""Remote objects as byte sources: ranged reads, read-ahead, a bounded cache, retries and a deadline.

:class:`RemoteSource` is a :class:`~ckptfs.source.base.ByteSource` over a :class:`Transport` (HTTP(S) in
:mod:`.http`; S3 and any other fsspec protocol in :mod:`.fsspec_remote`) that knows how to learn an object's
identity and fetch a byte range of it. On top of that it keeps:

* an identity — (ETag, size, Last-Modified) from the first response — that every later response must
  match (HTTP and S3 send ``If-Match`` and compare what comes back): an object replaced while in use gives
  :class:`~ckptfs.errors.StaleSourceError` on every read from then on (EIO through a mount), never a mix
  of old and new bytes;
* a bounded LRU of 256 KiB blocks (:mod:`.blocks`) that concurrent readers share (a block being fetched is
  waited for, never fetched twice), and optionally an on-disk cache (:mod:`.disk_cache`);
* read-ahead (:mod:`.readahead`): reads that continue a sequential stream fetch a growing window ahead of
  it in the background, in parallel 8 MiB parts; random reads fetch only their blocks; a large read (a
  whole tensor through the API) is fetched straight into the caller's buffer in parallel parts;
* retries with exponential backoff for transient failures (connection refused or reset, 5xx, 429), all
  within ``timeout`` seconds per read: after that the read fails with :class:`~ckptfs.errors.RemoteError`;
  the next read tries again (a mount recovers when the server is back).

The first request fetches the object's first MiB along with its size and identity (a torch zip's data.pkl
comes first); ``prefetch`` fetches several ranges in one concurrent batch (the zip reader asks for the
head and the tail, where the central directory is). A checkpoint whose pickle is under 1 MiB is indexed in
two requests.

Fork safety: a forked child drops its parent's connections and in-flight fetches (:func:`os.register_at_fork`)
and keeps the cached blocks; the mount daemon, forked after indexing, takes the connections over
(:func:`handing_over`).
"""

from __future__ import annotations

import copy
import logging
import os
import random
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Protocol, TypeVar

from ..errors import CkptfsError, RemoteError, StaleSourceError
from .base import FileRegion, Identity
from .blocks import BlockCache
from .disk_cache import DiskCache, object_key
from .options import RemoteOptions
from .readahead import Readahead
from .urls import is_chain, scheme

log = logging.getLogger("ckptfs.remote")

BLOCK = 256 << 10  # cache unit: the least a random read fetches
OPEN_BYTES = 1 << 20  # the first request's range: a torch zip's data.pkl starts at byte ~64
INITIAL_WINDOW = 8 << 20  # read-ahead of a stream that just turned sequential; doubles from there
MAX_WINDOW = 64 << 20
PART = 8 << 20  # a window is fetched as parallel requests of at most this many bytes
DIRECT_MIN = 4 << 20  # reads at least this large go straight into the caller's buffer
BACKOFF_FIRST, BACKOFF_MAX = 0.1, 2.0
FAILED_FOR = 5.0  # seconds after a fetch gave up during which a read of its bytes gets only RETRY_SOON
RETRY_SOON = 0.5

T = TypeVar("T")


@dataclass(frozen=True)
class ObjectInfo:
    """What identifies a remote object's bytes, as its server reports it."""

    size: int
    etag: str = ""
    last_modified: str = ""  # as sent (compared as text)
    modified_ns: int = 0

    def change(self, size: int | None, etag: str | None, last_modified: str | None) -> str | None:
        """How a response's facts differ from these (None if they agree; a fact the response lacks agrees)."""
        if size is not None and size != self.size:
            return f"its size changed from {self.size} to {size} bytes"
        if etag and self.etag and _etag_value(etag) != _etag_value(self.etag):
            return f"its ETag changed from {self.etag} to {etag}"
        if last_modified and self.last_modified and last_modified != self.last_modified:
            return f"its Last-Modified changed from {self.last_modified} to {last_modified}"
        return None


def _etag_value(etag: str) -> str:
    return etag[2:] if etag.startswith("W/") else etag


def no_such_host(e: object) -> bool:
    """A name lookup answered "no such host" (not a DNS server that did not answer, EAI_AGAIN: that one is
    retried)."""
    return isinstance(e, socket.gaierror) and e.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME))


class Transient(Exception):
    """A failure worth retrying (connection refused or reset, timeout, 5xx, 429). Its text is shown."""


class NotFound(RemoteError):
    """The object does not exist (404, NoSuchKey)."""


class NotAFile(RemoteError):
    """The URL names a directory (a prefix of a listable store), not an object."""


class Deadline:
    """A time budget: ``remaining()`` seconds are left of ``seconds``; ``why`` says why it is not --timeout."""

    __slots__ = ("seconds", "start", "end", "why")

    def __init__(self, seconds: float, why: str = "") -> None:
        self.seconds = seconds
        self.why = why
        self.start = time.monotonic()
        self.end = self.start + seconds

    def remaining(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def elapsed(self) -> float:
        return time.monotonic() - self.start


def stale(name: str, why: str) -> StaleSourceError:
    return StaleSourceError(f"the remote object was replaced while in use ({why}); open it again", file=name)


class Transport(Protocol):
    """One remote object: learn its identity, fetch byte ranges of it. Methods are called from many threads.

    Errors: :class:`Transient` (retried), :class:`~ckptfs.errors.StaleSourceError` (the object no longer
    matches ``expect``), :class:`NotFound`, or another :class:`~ckptfs.errors.RemoteError` (refused; not
    retried). Messages never contain credentials."""

    #: the URL without credentials
    name: str

    def open(self, head: int, deadline: Deadline) -> tuple[ObjectInfo, bytes]:
        """The object's identity and its first ``min(head, size)`` bytes (``head`` >= 1)."""
        ...

    def fetch(self, start: int, bufs: Sequence[memoryview], expect: ObjectInfo, deadline: Deadline,
              filled: Callable[[int], None]) -> None:
        """Fill ``bufs`` in order with the bytes from ``start`` on (one request where it can); call
        ``filled(i)`` as soon as ``bufs[i]`` is complete. Checks the response against ``expect``."""
        ...

    def after_fork(self, keep_connections: bool) -> None:
        """In a forked child: forget sessions and event loops made by the parent, and its idle connections
        unless ``keep_connections`` (the parent hands them over: :func:`handing_over`)."""
        ...

    def close(self) -> None: ...


_LIVE: weakref.WeakSet[RemoteSource] = weakref.WeakSet()
_HANDOVER = [False]  # set by handing_over(): the next fork's child takes the idle connections


@contextmanager
def handing_over() -> Iterator[None]:
    """Around the fork of a process that takes over every remote source (the mount daemon: its parent then only
    waits for the mount and exits): the child keeps the idle connections the indexing made and the parent
    closes its copies, so that no connection is used by two processes. A fresh mount's first read then costs
    one round trip instead of a new connection's one or two more (a TLS handshake's)."""
    _HANDOVER[0] = True
    try:
        yield
    finally:
        _HANDOVER[0] = False


def _after_fork_in_child() -> None:
    keep, _HANDOVER[0] = _HANDOVER[0], False
    for source in list(_LIVE):
        source._after_fork(keep)


def _after_fork_in_parent() -> None:
    if _HANDOVER[0]:
        for source in list(_LIVE):
            source.transport.close()  # (its idle connections: they are the child's now)


os.register_at_fork(after_in_child=_after_fork_in_child, after_in_parent=_after_fork_in_parent)


class RemoteSource:
    """A remote object as a ByteSource (see the module doc). Safe to read from many threads."""

    def __init__(self, transport: Transport, options: RemoteOptions | None = None) -> None:
        self.transport = transport
        self.options = options = options or RemoteOptions()
        self.name = transport.name
        self.read_size = 4 << 20
        self._stale: StaleSourceError | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(options.max_concurrency)
        head = 1 if options.cache_dir else OPEN_BYTES  # with a disk cache, the head may be there already
        info, first = self._retrying("opening", Deadline(options.timeout), lambda d: transport.open(head, d))
        self.info = info
        self.size = info.size
        self._validated = time.monotonic()
        self._identity = Identity("remote", (info.etag, info.last_modified), info.size, info.modified_ns)
        self._blocks = BlockCache(BLOCK, options.memory_cache)
        # blocks whose fetch gave up (server down or stalled) -> until when a read of them gets only
        # RETRY_SOON seconds (the kernel reads a page again at once when its read-ahead failed: EIO after
        # --timeout, not twice that; a server that is back answers within that time)
        self._failed: dict[int, float] = {}
        max_window = min(MAX_WINDOW, max(BLOCK, options.memory_cache // 3))
        self._readahead = Readahead(self.size, BLOCK, min(INITIAL_WINDOW, max_window), max_window, PART)
        self._disk: DiskCache | None = None
        if options.cache_dir:
            if info.etag or info.last_modified:
                key = object_key(self.name, info.etag, info.size, info.last_modified)
                self._disk = DiskCache(options.cache_dir, options.cache_size, key, BLOCK,
                                       {"url": self.name, "etag": info.etag, "size": info.size,
                                        "last_modified": info.last_modified})
            else:
                log.warning("%s: the server gives no ETag or Last-Modified: not cached on disk (another version "
                            "could not be told apart)", self.name)
        for i in range(len(first) // BLOCK + 1):
            chunk = first[i * BLOCK : (i + 1) * BLOCK]
            if len(chunk) == self._block_len(i) and chunk:
                if self._disk is not None:
                    self._disk.put(i, chunk)
                self._blocks.put(i, chunk)
        _LIVE.add(self)

    # --- ByteSource ---------------------------------------------------------------------------------------
    def pread(self, offset: int, n: int) -> bytes:
        n = max(0, min(n, self.size - offset))
        buf = bytearray(n)
        got = self.preadinto(memoryview(buf), offset)
        return bytes(buf) if got == n else bytes(buf[:got])

    def preadinto(self, buf: memoryview, offset: int) -> int:
        if offset < 0:
            raise ValueError("negative offset")
        self._check_usable()
        n = max(0, min(len(buf), self.size - offset))
        if n == 0:
            return 0
        view = buf[:n] if n != len(buf) else buf
        first, last = offset // BLOCK, (offset + n - 1) // BLOCK
        deadline = self._deadline(first, last) if self._failed else Deadline(self.options.timeout)
        if n >= DIRECT_MIN:
            self._read_direct(view, offset, deadline)
            return n
        ahead, behind = self._readahead.on_read(offset, n)
        need = self._blocks.claim(range(first, last + 1))
        if ahead is not None:
            more = self._blocks.claim(range(ahead[0] // BLOCK, -(-ahead[1] // BLOCK)), once=True)
            if need and more and more[0] == need[-1] + 1 == need[0] + len(need):
                # the read's missing blocks lead the read-ahead's first request: one request on the one idle
                # connection, not two (the second on a new connection: a handshake more before the read returns)
                self._spawn(need + more, lead=True)
                need = []
            else:
                self._spawn(more)
        if need:
            self._fetch_parallel(need, deadline)
        pos = 0
        for idx in range(first, last + 1):
            b0 = idx * BLOCK
            lo = max(offset, b0) - b0
            hi = min(offset + n - b0, self._block_len(idx))
            self._copy_block(idx, view[pos : pos + hi - lo], lo, deadline)
            pos += hi - lo
        if behind is not None:  # a sequential reader is past these: their memory takes the next blocks
            self._blocks.drop(range(behind[0] // BLOCK, behind[1] // BLOCK))
        return n

    def identity(self) -> Identity:
        return self._identity

    def check_unchanged(self, thorough: bool = True) -> None:
        """Cheap: raises if any response showed the object replaced. ``thorough`` (a file being opened) also
        asks the server (one 1-byte request) when nothing confirmed the identity for ``revalidate_after`` s;
        a server that cannot be reached then does not fail the open (the reads will tell)."""
        self._check_usable()
        if not thorough or time.monotonic() - self._validated < self.options.revalidate_after:
            return
        try:
            info, _ = self.transport.open(1, Deadline(min(self.options.timeout, 10.0)))
        except (Transient, RemoteError) as e:
            if isinstance(e, NotFound):
                self._mark_stale(stale(self.name, "it was deleted"))
                self._check_usable()
            return
        except StaleSourceError as e:
            self._mark_stale(e)
            raise
        why = self.info.change(info.size, info.etag, info.last_modified)
        if why is not None:
            self._mark_stale(stale(self.name, why))
            self._check_usable()
        self._validated = time.monotonic()

    def region(self) -> FileRegion | None:
        return None

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Fetch the blocks of ``ranges`` not cached yet, in one concurrent batch; returns when they are in
        (or failed: the read that needs them tries again and reports)."""
        if self._stale is not None or self._closed:
            return
        wanted: set[int] = set()
        for offset, n in ranges:
            offset, end = max(0, offset), min(self.size, offset + n)
            if end > offset:
                wanted.update(range(offset // BLOCK, (end - 1) // BLOCK + 1))
        claimed = self._blocks.claim(sorted(wanted))
        if claimed:
            try:
                self._fetch_parallel(claimed, Deadline(self.options.timeout))
            except CkptfsError as e:
                log.debug("%s: prefetch failed: %s", self.name, e)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._blocks.clear()
            self.transport.close()
            _LIVE.discard(self)

    def __repr__(self) -> str:
        return f"RemoteSource({self.name!r}, size={self.size})"

    # --- internals ----------------------------------------------------------------------------------------
    def _check_usable(self) -> None:
        if self._stale is not None:
            raise copy.copy(self._stale)  # a copy each time: callers add the record they were reading
        if self._closed:
            raise CkptfsError("read after close", file=self.name)

    def _mark_stale(self, e: StaleSourceError) -> None:
        with self._lock:
            if self._stale is None:
                e.at(file=self.name)
                self._stale = e
                log.error("%s", e)

    def _block_len(self, idx: int) -> int:
        return max(0, min(BLOCK, self.size - idx * BLOCK))

    def _copy_block(self, idx: int, dest: memoryview, lo: int, deadline: Deadline) -> None:
        """Bytes ``[lo, lo + len(dest))`` of block ``idx`` into ``dest``: cached, awaited from another fetch,
        or fetched here."""
        while True:
            try:
                if self._blocks.wait(idx, deadline.remaining()) and self._blocks.copy(idx, dest, lo):
                    return
            except RemoteError as e:  # (a timeout waiting for another reader's fetch)
                raise RemoteError(f"{self._where(idx * BLOCK, BLOCK)}: {e.reason}", file=self.name) from None
            self._check_usable()
            if deadline.remaining() <= 0:
                raise RemoteError(f"{self._where(idx * BLOCK, BLOCK)}: timed out after "
                                  f"{deadline.seconds:g} s{'; ' + deadline.why if deadline.why else ''}",
                                  file=self.name)
            mine = self._blocks.claim([idx])
            if mine:
                self._fetch(mine, deadline)

    def _deadline(self, first: int, last: int) -> Deadline:
        """The time a read of blocks ``[first, last]`` gets: ``RETRY_SOON`` if one of them gave up moments ago
        (and is not cached since), else ``timeout``."""
        now = time.monotonic()
        soon = False
        with self._lock:
            for idx, until in list(self._failed.items()):
                if until <= now:
                    del self._failed[idx]
                elif first <= idx <= last and not self._blocks.cached(idx):
                    soon = True
        if soon and RETRY_SOON < self.options.timeout:
            return Deadline(RETRY_SOON, f"these bytes gave up less than {FAILED_FOR:g} s ago: tried again for "
                                        f"{RETRY_SOON:g} s")
        return Deadline(self.options.timeout)

    def _gave_up(self, idxs: list[int], e: BaseException) -> None:
        if not isinstance(e, RemoteError) or isinstance(e, (NotFound, NotAFile)):
            return
        until = time.monotonic() + FAILED_FOR
        with self._lock:
            if len(self._failed) > 4096:
                self._failed.clear()
            for idx in idxs:
                self._failed[idx] = until

    def _where(self, offset: int, n: int) -> str:
        return f"reading bytes {offset}-{min(offset + n, self.size) - 1}"

    def _retrying(self, what: str, deadline: Deadline, attempt: Callable[[Deadline], T]) -> T:
        return retrying(self.name, what, deadline, attempt)

    def _fetch(self, idxs: list[int], deadline: Deadline) -> None:
        """Fetch claimed consecutive blocks (from the disk cache where it has them): each is put or failed."""
        try:
            missing = idxs
            disk = self._disk
            if disk is not None:
                missing = []
                for idx in idxs:
                    data = disk.get(idx, self._block_len(idx))
                    if data is None:
                        missing.append(idx)
                    else:
                        self._blocks.put(idx, data)
            for run in _runs(missing):
                self._fetch_run(run, deadline)
        except BaseException as e:
            self._blocks.fail(idxs, e)
            if isinstance(e, StaleSourceError):
                self._mark_stale(e)
            else:
                self._gave_up(idxs, e)
            raise

    def _fetch_run(self, run: list[int], deadline: Deadline) -> None:
        bufs = [self._blocks.buffer(self._block_len(i)) for i in run]
        done = 0
        disk = self._disk

        def attempt(d: Deadline) -> None:
            nonlocal done
            base = done

            def filled(k: int) -> None:
                nonlocal done
                if disk is not None:  # before the cache has it: once cached, its buffer may be reused
                    disk.put(run[base + k], bufs[base + k])
                self._blocks.put(run[base + k], bufs[base + k])
                done = base + k + 1

            self.transport.fetch(run[base] * BLOCK, [memoryview(b) for b in bufs[base:]], self.info, d, filled)
            if done != len(run):
                raise Transient(f"the response ended after {done} of {len(run)} blocks")

        try:
            self._retrying(self._where(run[0] * BLOCK, len(run) * BLOCK), deadline, attempt)
        except BaseException:
            self._blocks.recycle(bufs[done:])  # (a transport writes only while its fetch runs)
            raise
        self._validated = time.monotonic()

    def _parts(self, idxs: list[int]) -> list[list[int]]:
        per = PART // BLOCK
        return [run[i : i + per] for run in _runs(idxs) for i in range(0, len(run), per)]

    def _fetch_parallel(self, idxs: list[int], deadline: Deadline) -> None:
        """Fetch claimed blocks now, their runs split in parts fetched concurrently; raises the first error."""
        _parallel([partial(self._fetch, p, deadline) for p in self._parts(idxs)], self.options.max_concurrency)

    def _spawn(self, idxs: list[int], lead: bool = False) -> None:
        """Fetch claimed blocks in the background (read-ahead), at most ``max_concurrency`` requests at once.
        ``lead``: a reader waits for the first part, which starts at once (it takes no slot)."""
        for i, part in enumerate(self._parts(idxs)):
            threading.Thread(target=self._background, args=(part, not (lead and i == 0)), name="ckptfs-readahead",
                             daemon=True).start()

    def _background(self, part: list[int], slot: bool = True) -> None:
        with self._slots if slot else nullcontext():
            if self._closed or self._stale is not None:
                self._blocks.fail(part, RemoteError("source closed"))
                return
            try:
                self._fetch(part, Deadline(self.options.timeout))
            except CkptfsError as e:
                log.debug("%s: read-ahead failed: %s", self.name, e)
            except BaseException:  # noqa: BLE001 - a background thread: the reader that needs the bytes reports
                log.exception("%s: read-ahead failed", self.name)

    def _read_direct(self, view: memoryview, offset: int, deadline: Deadline) -> None:
        """A large read: its first and last blocks through the cache (they hold bytes of neighbours too), the
        blocks between copied from memory or disk where cached, the rest fetched straight into ``view`` in
        parallel parts (and kept on disk when there is a disk cache)."""
        end = offset + len(view)
        first, last = offset // BLOCK, (end - 1) // BLOCK
        for idx in {first, last}:
            b0 = idx * BLOCK
            lo, hi = max(offset, b0), min(end, b0 + BLOCK)
            self._copy_block(idx, view[lo - offset : hi - offset], lo - b0, deadline)
        gaps: list[list[int]] = []
        for idx in range(first + 1, last):
            b0 = idx * BLOCK
            dest = view[b0 - offset : b0 - offset + BLOCK]
            if self._blocks.copy(idx, dest, 0):
                continue
            data = self._disk.get(idx, BLOCK) if self._disk is not None else None
            if data is not None:
                dest[:] = data
            elif gaps and gaps[-1][1] == b0:
                gaps[-1][1] = b0 + BLOCK
            else:
                gaps.append([b0, b0 + BLOCK])
        parts = [(a, min(a + PART, hi)) for lo, hi in gaps for a in range(lo, hi, PART)]

        def fetch(a: int, b: int) -> None:
            self._retrying(self._where(a, b - a), deadline, lambda d: self.transport.fetch(
                a, [view[a - offset : b - offset]], self.info, d, _ignore))

        try:
            _parallel([partial(fetch, a, b) for a, b in parts], self.options.max_concurrency)
        except StaleSourceError as e:
            self._mark_stale(e)
            raise
        self._validated = time.monotonic()
        if self._disk is not None:
            for lo, hi in gaps:
                for b0 in range(lo, hi, BLOCK):
                    self._disk.put(b0 // BLOCK, view[b0 - offset : b0 - offset + BLOCK])

    def _after_fork(self, keep_connections: bool) -> None:
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(self.options.max_concurrency)
        self._blocks.after_fork()
        self._readahead.after_fork()
        if self._disk is not None:
            self._disk.after_fork()
        self.transport.after_fork(keep_connections)


def retrying(name: str, what: str, deadline: Deadline, attempt: Callable[[Deadline], T]) -> T:
    """``attempt(deadline)``, tried again with backoff while it fails with :class:`Transient` and time is left;
    errors name ``name`` (a URL without credentials) and say what was being done."""
    tries = 0
    while True:
        try:
            return attempt(deadline)
        except Transient as e:
            tries += 1
            delay = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (tries - 1)) * random.uniform(0.5, 1.0)
            left = deadline.remaining()
            if left <= delay + 0.05:
                limit = deadline.why or f"--timeout is {deadline.seconds:g} s"
                raise RemoteError(f"{what}: {e} (gave up after {tries} attempt{'s' * (tries > 1)} in "
                                  f"{deadline.elapsed():.1f} s; {limit})", file=name) from None
            log.info("%s: %s: %s; retrying in %.2f s", name, what, e, delay)
            time.sleep(delay)
        except CkptfsError as e:
            raise e.at(file=name) from None


def _ignore(_: int) -> None:
    return None


def _runs(idxs: list[int]) -> list[list[int]]:
    """Sorted indices as runs of consecutive ones."""
    runs: list[list[int]] = []
    for i in sorted(idxs):
        if runs and runs[-1][-1] + 1 == i:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def _parallel(tasks: list[Callable[[], None]], width: int) -> None:
    """Run ``tasks`` on up to ``width`` threads (the first in this one); raise the first failure."""
    if not tasks:
        return
    if len(tasks) == 1:
        tasks[0]()
        return
    queue = list(reversed(tasks))
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker() -> None:
        while True:
            with lock:
                if not queue or errors:
                    return
                task = queue.pop()
            try:
                task()
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                with lock:
                    errors.append(e)

    threads = [threading.Thread(target=worker, name="ckptfs-fetch", daemon=True)
               for _ in range(min(width, len(tasks)) - 1)]
    for t in threads:
        t.start()
    worker()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def open_url(url: str, storage_options: Mapping[str, object] | None = None,
             options: RemoteOptions | None = None) -> RemoteSource:
    """A remote checkpoint as a source: ``http(s)://`` by ckptfs's own client, ``s3://`` and any other fsspec
    protocol through fsspec (s3fs for S3)."""
    options = options or RemoteOptions()
    transport: Transport
    if scheme(url) in ("http", "https") and not is_chain(url):
        from .http import HttpTransport

        transport = HttpTransport(url, storage_options or {}, options)
    else:
        from .fsspec_remote import fsspec_transport

        transport = fsspec_transport(url, storage_options or {}, options)
    try:
        return RemoteSource(transport, options)
    except BaseException:
        transport.close()
        raise
