"""A pickle reader that never imports or runs anything named by the pickle.

It subclasses the C ``pickle.Unpickler`` (speed) and overrides the only two ways a pickle reaches
outside itself: ``find_class`` maps an allowlist of (module, name) pairs to inert builders defined in
ckptfs (:mod:`ckptfs.allowlist`) and turns every other global into an inert opaque class (or refuses it
in strict mode); ``persistent_load`` records torch's storage ids as :class:`PersistentId`.
Everything the pickle then does (REDUCE, NEWOBJ, BUILD, SETITEMS, APPENDS) lands on those inert
objects or on plain containers.
"""

from __future__ import annotations

import codecs
import contextlib
import gc
import io
import os
import pickle
import pickletools
import select
import signal
import time
from typing import Callable, Iterator, Mapping, Sequence

from ..errors import CkptfsError, LimitError, UnsafePickleError
from ..limits import DEFAULT_LIMITS, Limits, memory_now
from .allowlist import ALLOWED, MODULE_ALIASES
from .nodes import PersistentId, opaque_class

STRICT_REFUSAL = "is not on the allowlist (strict mode)"


class SafeUnpickler(pickle.Unpickler):
    """The safe unpickler. ``allowlist`` maps (module, name) to what a global stands for (default: torch's
    checkpoints, :data:`ckptfs.pickle.allowlist.ALLOWED`); a format with a closed set of classes (DCP
    metadata) passes its own with ``strict=True``, and ``refusal`` says what a global outside it is not.
    ``persistent_ids=False`` refuses persistent ids; ``key_prefix`` is put before each storage key of
    torch's persistent ids (pickles from several records indexed as one graph: keys stay distinct)."""

    #: persistent ids are recorded in C (a class call), interpreted later by ckptfs.convert
    persistent_load = PersistentId

    def __init__(self, data: bytes | io.BufferedIOBase, *, strict: bool = False,
                 limits: Limits = DEFAULT_LIMITS, allowlist: Mapping[tuple[str, str], object] = ALLOWED,
                 refusal: str = STRICT_REFUSAL, persistent_ids: bool = True, key_prefix: str | None = None) -> None:
        # A buffered reader has peek(): the C unpickler then reads in big chunks instead of calling
        # read() once per opcode (4x faster on torch's state_dict pickles). A stream given instead of
        # bytes (the legacy format's main pickle, whose end is only known once read) must have peek()
        # too; the unpickler leaves it positioned just after STOP.
        # persistent_load is looked up when the C unpickler is initialised: set before super().__init__
        if not persistent_ids:
            self.persistent_load = _no_persistent_ids  # type: ignore[assignment]
        elif key_prefix is not None:
            self.persistent_load = _prefixed(key_prefix)  # type: ignore[assignment]
        stream: io.BufferedIOBase
        if isinstance(data, (bytes, bytearray, memoryview)):
            stream = io.BufferedReader(io.BytesIO(data), buffer_size=1 << 20)
        else:
            stream = data
        super().__init__(stream, encoding="utf-8", errors="surrogateescape")
        self.strict = strict
        self.limits = limits
        self.allowlist = allowlist
        self.refusal = refusal
        self.unknown_globals: dict[str, int] = {}  # qualified name -> times referenced
        self._stream = stream
        self._data = data if isinstance(data, (bytes, bytearray, memoryview)) else None
        self._size_hint = len(self._data) if self._data is not None else None

    def load(self) -> object:
        """Unpickle the next pickle: first in a forked child (see :func:`probe`), then here."""
        self.probe_first()
        return super().load()

    def probe_first(self, digest: Callable[[object], bytes | None] | None = None) -> bytes | None:
        """Probe the next pickle in a forked child unless it was probed already (:func:`probed_together`) or
        is plainly bounded; raise what the probe found. Returns the bytes of ``digest`` run in the child."""
        if not self.limits.unpickle_probe:
            return None
        known = _PROBED.get(id(self._data)) if self._data is not None else None
        if known is not None and known[0] is self._data:  # probed with others (probed_together)
            if known[1] is not None:
                raise type(known[1])(known[1].reason)
            return None
        if _plainly_bounded(self):
            return None
        return probe(self, self._size_hint, digest)

    def find_class(self, module: str, name: str) -> object:
        module = MODULE_ALIASES.get(module, module)
        found = self.allowlist.get((module, name))
        if found is not None:
            return found
        qualname = f"{module}.{name}"
        if self.strict:
            raise UnsafePickleError(f"global {qualname} {self.refusal}")
        seen = self.unknown_globals
        if qualname not in seen:
            if len(seen) >= self.limits.max_globals:
                raise LimitError(f"more than {self.limits.max_globals} distinct unknown globals")
            seen[qualname] = 0
        seen[qualname] += 1
        return opaque_class(qualname)


def unpickle(data: bytes | io.BufferedIOBase, *, strict: bool = False, limits: Limits = DEFAULT_LIMITS,
             file: str | None = None, record: str | None = None,
             allowlist: Mapping[tuple[str, str], object] = ALLOWED, refusal: str = STRICT_REFUSAL,
             persistent_ids: bool = True, key_prefix: str | None = None,
             digest: Callable[[object], bytes | None] | None = None) -> tuple[object, SafeUnpickler, bytes | None]:
    """Unpickle ``data`` (bytes, or a stream that bounds its own size) safely; any failure becomes one
    CkptfsError naming ``file`` and ``record``. The other options are :class:`SafeUnpickler`'s.

    ``digest``: run on the unpickled object where it is unpickled; when the probe's child unpickles it and
    ``digest`` returns bytes, those come back (third item) and this process never builds the object at all
    (the first item is then None)."""
    if isinstance(data, (bytes, bytearray, memoryview)) and len(data) > limits.max_pickle_bytes:
        raise LimitError(f"pickle of {len(data)} bytes is over the limit of {limits.max_pickle_bytes} "
                         "(raise Limits.max_pickle_bytes to index it)", file=file, record=record)
    up = SafeUnpickler(data, strict=strict, limits=limits, allowlist=allowlist, refusal=refusal,
                       persistent_ids=persistent_ids, key_prefix=key_prefix)
    try:
        with gc_paused():
            summary = up.probe_first(digest)
            if summary is not None:
                return None, up, summary
            obj = pickle.Unpickler.load(up)
    except CkptfsError as e:
        raise e.at(file=file, record=record) from None
    except MemoryError:
        raise LimitError("pickle declares an object too large to build", file=file, record=record) from None
    except RecursionError:
        raise LimitError("pickle nests too deeply", file=file, record=record) from None
    except Exception as e:  # the C unpickler raises many kinds on malformed input
        raise UnsafePickleError(f"malformed pickle ({type(e).__name__}: {_short(e)})", file=file,
                                record=record) from None
    return obj, up, None


def _no_persistent_ids(pid: object) -> object:
    raise UnsafePickleError("a persistent id in a pickle that has none")


def _prefixed(prefix: str) -> object:
    def persistent_load(pid: object) -> PersistentId:
        if type(pid) is tuple and len(pid) >= 3 and type(pid[2]) is str:
            pid = pid[:2] + (prefix + pid[2],) + pid[3:]
        return PersistentId(pid)

    return persistent_load


# --- the probe ---------------------------------------------------------------------------------------------
#
# The C unpickler runs code ckptfs cannot interrupt: building a dict or a set hashes its keys, and hashing a
# tuple recurses into its items with no depth check (a 10^6-deep tuple key overflows the C stack: SIGSEGV)
# and no caching (a tuple DAG of depth 64 built with the memo takes 2^64 steps). LONG_BINPUT 2^28 makes it
# allocate and clear a 4 GiB memo array in one opcode. None of this calls back into Python, so no check in
# find_class, the input stream or a watchdog thread can stop it. So each pickle is first unpickled in a
# forked child with a capped address space and a deadline; only if the child finishes does this process
# unpickle it (the same bytes, the same work: bounded by what the child just did).

_OK, _CKPTFS, _MEMORY, _OTHER, _DIGEST = b"K", b"E", b"M", b"X", b"D"
#: The digest may grow the probe child by this many times ``max_memory`` beyond what unpickling built.
DIGEST_MEMORY_FACTOR = 2
#: A probe child may build this many bytes of objects per byte of pickle (when that is over max_memory).
GRAPH_PER_PICKLE_BYTE = 10
#: In a probe child: the address-space soft limit it inherited (a cap is never raised past it).
_SOFT_BEFORE_CAP: int | None = None


SMALL_PICKLE = 8192
for _codec in ("raw-unicode-escape", "latin-1", "ascii", "utf-8"):  # what pickletools decodes text opcodes with:
    codecs.lookup(_codec)  # looked up now, so that scanning a hostile pickle never imports a codec module
_SHARING = frozenset({"BINGET", "LONG_BINGET", "GET", "DUP"})
_PUTS = frozenset({"BINPUT", "LONG_BINPUT", "PUT"})
_TUPLES = frozenset({"TUPLE", "TUPLE1", "TUPLE2", "TUPLE3"})


def _plainly_bounded(up: SafeUnpickler) -> bool:
    """True for a small pickle (the next one is under SMALL_PICKLE bytes) that never reuses an object
    (no memo GET, no DUP), keeps memo indices small and builds at most 256 tuples: its objects form a tree
    of at most a few thousand nodes with shallow tuples, so hashing, nesting and memory are all bounded
    and the probe's fork can be skipped (torch's small legacy header pickles, tiny checkpoints). Anything
    else, or anything unparsable, is probed."""
    if up._data is not None:
        head = bytes(up._data[:SMALL_PICKLE])
    else:
        peek = getattr(up._stream, "peek", None)
        head = peek(SMALL_PICKLE)[:SMALL_PICKLE] if peek is not None else b""
    tuples = 0
    try:
        for op, arg, _pos in pickletools.genops(head):
            name = op.name
            if name in _SHARING or name in _PUTS and arg >= SMALL_PICKLE:  # type: ignore[operator]
                return False
            if name in _TUPLES:
                tuples += 1
                if tuples > 256:  # nesting (and so C recursion when hashed) stays shallow on any thread stack
                    return False
            if name == "STOP":
                return True
    except Exception:  # noqa: BLE001 - cut short by the window, or malformed: probe it
        return False
    return False


def probe(up: SafeUnpickler, size_hint: int | None,
          digest: Callable[[object], bytes | None] | None = None) -> bytes | None:
    """Run ``up``'s next load() in a forked child; raise the CkptfsError it would end in (a limit, a
    crash, a timeout), or return if it finishes (also when it fails in an ordinary way: the real load
    then raises the same error). With ``digest``, the child also runs it on what it unpickled and sends
    back the bytes it returns (returned here), or None when it returns None."""
    if not hasattr(os, "fork"):
        return None
    limits = up.limits
    if size_hint is None:  # a stream (legacy format): how much it may still hold
        raw = getattr(up._stream, "raw", None)
        end, pos = getattr(raw, "end", None), getattr(raw, "pos", None)
        size_hint = end - pos if isinstance(end, int) and isinstance(pos, int) else limits.max_pickle_bytes
    # 1 s per MiB of pickle to unpickle it, as much again for the digest (it is linear in the same objects)
    timeout = limits.max_unpickle_seconds + size_hint / (1 << 20) * (2 if digest is not None else 1)
    r, w = os.pipe()
    try:
        pid = os.fork()
    except OSError as e:
        os.close(r)
        os.close(w)
        raise LimitError(f"cannot fork the unpickling probe ({e.strerror}); Limits(unpickle_probe=False) "
                         "skips it for trusted files") from None
    if pid == 0:  # the child: never returns
        _probe_child(up, r, w, digest, size_hint)
    os.close(w)
    msg = b""
    status = None
    try:
        poller = select.poll()
        poller.register(r, select.POLLIN | select.POLLHUP)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LimitError(f"unpickling did not finish within {timeout:.1f} s (a tuple whose hashing "
                                 "explodes? raise Limits.max_unpickle_seconds to wait longer)")
            if poller.poll(left * 1000):  # poll, not select: a busy process's fds may be over FD_SETSIZE
                break
        msg = _read_all(r)
        if msg[:1] in (_OK, _OTHER, _CKPTFS, _MEMORY, _DIGEST):
            _reap_later(pid)  # it answered: do not wait for it to tear down its memory
        else:
            status = _reap(pid)
        pid = 0
    finally:
        os.close(r)
        if pid:  # timed out or interrupted: the child must not outlive us
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _reap(pid)
    kind, body = msg[:1], msg[1:]
    if kind == _DIGEST:
        return body
    if kind == _OK or kind == _OTHER:
        return None
    if kind == _CKPTFS:
        name, _, reason = body.partition(b"\0")
        cls = {"LimitError": LimitError, "UnsafePickleError": UnsafePickleError}.get(name.decode(), CkptfsError)
        raise cls(reason.decode("utf-8", "backslashreplace"))
    if kind == _MEMORY:
        raise LimitError(f"unpickling needs more than {child_memory(limits, size_hint) >> 20} MiB of memory "
                         "(raise Limits.max_memory to index it)")
    sig = -status if status is not None and status < 0 else None
    how = f"signal {signal.Signals(sig).name}" if sig and sig in signal.Signals._value2member_map_ else \
        f"status {status}"
    raise UnsafePickleError(f"the pickle crashes the unpickler ({how}; a tuple nested too deeply to hash?)")


# --- probing many pickles at once ------------------------------------------------------------------------
#
# A directory of N torch files has N pickles: one probe each costs N forks (~8 ms each here). Probed together,
# they cost one fork: one child unpickles them in turn and reports each result as it goes. A pickle the child
# cannot finish (a crash, a timeout, memory) is probed again alone when others came before it in that child
# (its memory was the child's, not its own); the next ones go to a new child.

_PROBED: dict[int, tuple[object, CkptfsError | None]] = {}  # id(pickle bytes) -> (the bytes, the error)


@contextlib.contextmanager
def probed_together(datas: Sequence[bytes], limits: Limits = DEFAULT_LIMITS) -> Iterator[None]:
    """Probe ``datas`` (pickles about to be unpickled, whole) in as few forked children as possible; inside
    the block, unpickling one of these very bytes objects skips its own probe (and raises what the probe
    found, if anything)."""
    todo: list[bytes] = []
    if limits.unpickle_probe and hasattr(os, "fork") and len(datas) > 1:
        # (no _plainly_bounded scan: the one fork is paid anyway, and the child makes short work of small ones)
        todo = [d for d in datas if id(d) not in _PROBED]
    results = probe_many(todo, limits)
    for d, err in zip(todo, results, strict=False):
        _PROBED[id(d)] = (d, err)
    try:
        yield
    finally:
        for d in todo:
            _PROBED.pop(id(d), None)


def probe_many(datas: Sequence[bytes], limits: Limits) -> list[CkptfsError | None]:
    """For each pickle, the error its unpickling ends in (a limit, a crash, a timeout) or None."""
    out: list[CkptfsError | None] = [None] * len(datas)
    i = 0
    while i < len(datas):
        done, failure = _probe_batch(datas[i:], limits)
        for j, err in enumerate(done):
            out[i + j] = err
        i += len(done)
        if failure is None:
            continue
        if done:  # it failed after others: probe it alone
            out[i] = probe_many([datas[i]], limits)[0] if len(datas) > 1 else failure
        else:
            out[i] = failure
        i += 1
    return out


def _probe_batch(datas: Sequence[bytes], limits: Limits) -> tuple[list[CkptfsError | None], CkptfsError | None]:
    """One child unpickles ``datas`` in turn: the results of those it finished, and the error of the one it
    could not finish (None when it finished all)."""
    r, w = os.pipe()
    try:
        pid = os.fork()
    except OSError as e:
        os.close(r)
        os.close(w)
        raise LimitError(f"cannot fork the unpickling probe ({e.strerror}); Limits(unpickle_probe=False) "
                         "skips it for trusted files") from None
    if pid == 0:  # the child: never returns
        _batch_child(datas, limits, r, w)
    os.close(w)
    done: list[CkptfsError | None] = []
    failure: CkptfsError | None = None
    buf = b""
    try:
        poller = select.poll()
        poller.register(r, select.POLLIN | select.POLLHUP)
        for data in datas:
            timeout = limits.max_unpickle_seconds + len(data) / (1 << 20)
            deadline = time.monotonic() + timeout
            while len(buf) < 5 or len(buf) < 5 + int.from_bytes(buf[1:5], "little"):
                left = deadline - time.monotonic()
                if left <= 0:
                    failure = LimitError(f"unpickling did not finish within {timeout:.1f} s (a tuple whose hashing "
                                         "explodes? raise Limits.max_unpickle_seconds to wait longer)")
                    break
                if not poller.poll(left * 1000):
                    continue
                chunk = os.read(r, 65536)
                if not chunk:  # the child died on this one
                    os.close(r)
                    r = -1
                    status = _reap(pid)
                    pid = 0
                    failure = _crash(status)
                    break
                buf += chunk
            if failure is not None:
                break
            n = 5 + int.from_bytes(buf[1:5], "little")
            msg, buf = buf[:1] + buf[5:n], buf[n:]
            done.append(_outcome(msg, limits))
        if pid and failure is None:
            _reap_later(pid)
            pid = 0
    finally:
        if r >= 0:
            os.close(r)
        if pid:  # timed out or interrupted: the child must not outlive us
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _reap(pid)
    return done, failure


def _batch_child(datas: Sequence[bytes], limits: Limits, r: int, w: int) -> None:
    try:
        os.close(r)
        _quiet_and_capped(limits, max((len(d) for d in datas), default=0))
        for data in datas:
            code = _OTHER
            try:
                up = SafeUnpickler(data, limits=limits)
                with gc_paused():
                    pickle.Unpickler.load(up)
                code = _OK
            except CkptfsError as e:
                code = _CKPTFS + type(e).__name__.encode() + b"\0" + e.reason.encode("utf-8", "backslashreplace")[:2000]
            except MemoryError:
                code = _MEMORY
            except BaseException:  # noqa: BLE001 - the parent's own load raises it again, precisely
                code = _OTHER
            up = None  # type: ignore[assignment]  # its memo: free it before the next one
            os.write(w, code[:1] + len(code[1:]).to_bytes(4, "little") + code[1:])
    finally:
        os._exit(0)


def _outcome(msg: bytes, limits: Limits) -> CkptfsError | None:
    kind, body = msg[:1], msg[1:]
    if kind == _CKPTFS:
        name, _, reason = body.partition(b"\0")
        cls = {"LimitError": LimitError, "UnsafePickleError": UnsafePickleError}.get(name.decode(), CkptfsError)
        return cls(reason.decode("utf-8", "backslashreplace"))
    if kind == _MEMORY:
        return LimitError(f"unpickling needs more than {limits.max_memory >> 20} MiB of memory "
                          "(raise Limits.max_memory to index it)")
    return None


def _crash(status: int | None) -> UnsafePickleError:
    sig = -status if status is not None and status < 0 else None
    how = f"signal {signal.Signals(sig).name}" if sig and sig in signal.Signals._value2member_map_ else \
        f"status {status}"
    return UnsafePickleError(f"the pickle crashes the unpickler ({how}; a tuple nested too deeply to hash?)")


def child_memory(limits: Limits, pickle_bytes: int) -> int:
    """What a probe child may build for pickles of ``pickle_bytes`` in all: ``max_memory``, or for pickles
    bigger than the defaults let through (a million tensors: a ~100 MB pickle, and the limits raised to index
    it), ``GRAPH_PER_PICKLE_BYTE`` times their size (torch's pickles build ~7 bytes of objects per byte):
    still bounded by what the file holds, not by what it says."""
    return max(limits.max_memory, GRAPH_PER_PICKLE_BYTE * pickle_bytes)


def _quiet_and_capped(limits: Limits, pickle_bytes: int) -> None:
    """In a probe child: nothing it prints reaches the caller's terminal; its address space is capped."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    except OSError:
        pass
    _cap_address_space(child_memory(limits, pickle_bytes), lower_only=True)


def _cap_address_space(extra: int, *, lower_only: bool = False) -> None:
    """Let this process's address space grow by at most ``extra`` bytes from now, never past the soft limit
    it had before the first call (the user's own ``ulimit -v``) nor the hard limit; with ``lower_only``,
    only if that lowers the cap in force."""
    now = memory_now()
    if now is None:
        return
    import resource

    global _SOFT_BEFORE_CAP
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if _SOFT_BEFORE_CAP is None:
        _SOFT_BEFORE_CAP = soft
    cap = now[0] + extra
    for bound in (_SOFT_BEFORE_CAP, hard):
        if bound != resource.RLIM_INFINITY:
            cap = min(cap, bound)
    if soft == resource.RLIM_INFINITY or cap < soft or not lower_only:
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def _probe_child(up: SafeUnpickler, r: int, w: int, digest: Callable[[object], bytes | None] | None,
                 size_hint: int) -> None:
    code = _OTHER
    try:
        os.close(r)
        _quiet_and_capped(up.limits, size_hint)
        try:
            with gc_paused():
                obj = pickle.Unpickler.load(up)
                summary = None
                if digest is not None:
                    # The cap was for what the pickle may build; the digest is ckptfs's own code, linear in
                    # what was built (a table of it, then its bytes): room for it, so that a large graph is
                    # not handed back to be built again, bigger, in the parent.
                    _cap_address_space(DIGEST_MEMORY_FACTOR * up.limits.max_memory)
                    try:
                        summary = digest(obj)
                    except MemoryError:  # no room for the digest: the parent unpickles as usual
                        summary = None
            code = _OK if summary is None else _DIGEST + summary
        except CkptfsError as e:
            code = _CKPTFS + type(e).__name__.encode() + b"\0" + e.reason.encode("utf-8", "backslashreplace")[:2000]
        except MemoryError:
            code = _MEMORY
        except BaseException:  # noqa: BLE001 - the parent's own load raises it again, precisely
            code = _OTHER
        view = memoryview(code)
        while view:
            view = view[os.write(w, view):]
    finally:
        os._exit(0)


def _read_all(fd: int) -> bytes:
    parts: list[bytes] = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)


def _reap_later(pid: int) -> None:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return
    if not done:
        import threading

        threading.Thread(target=_reap, args=(pid,), name="ckptfs-reap", daemon=True).start()


def _reap(pid: int) -> int | None:
    """Wait for the child; its exit code, or -signal; None if it was reaped elsewhere (SIGCHLD ignored)."""
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return None
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while building many objects none of which are garbage yet (it would rescan
    the growing heap over and over: ~40% of unpickling time on a 20k-tensor state_dict)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _short(e: BaseException, n: int = 200) -> str:
    s = " ".join(str(e).split())
    return s if len(s) <= n else s[: n - 3] + "..."
