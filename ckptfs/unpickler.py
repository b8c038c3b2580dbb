"""A pickle reader that never imports or runs anything named by the pickle.

It subclasses the C ``pickle.Unpickler`` (speed) and overrides the only two ways a pickle reaches
outside itself: ``find_class`` maps an allowlist of (module, name) pairs to inert builders defined in
ckptfs (:mod:`ckptfs.allowlist`) and turns every other global into an inert opaque class (or refuses it
in strict mode); ``persistent_load`` records torch's storage ids as :class:`PersistentId`.
Everything the pickle then does (REDUCE, NEWOBJ, BUILD, SETITEMS, APPENDS) lands on those inert
objects or on plain containers.
"""

from __future__ import annotations

import contextlib
import gc
import io
import pickle
from typing import Iterator

from .allowlist import ALLOWED, MODULE_ALIASES
from .errors import CkptfsError, LimitError, UnsafePickleError
from .limits import DEFAULT_LIMITS, Limits
from .nodes import PersistentId, opaque_class


class SafeUnpickler(pickle.Unpickler):
    #: persistent ids are recorded in C (a class call), interpreted later by ckptfs.convert
    persistent_load = PersistentId

    def __init__(self, data: "bytes | io.BufferedIOBase", *, strict: bool = False,
                 limits: Limits = DEFAULT_LIMITS) -> None:
        # A buffered reader has peek(): the C unpickler then reads in big chunks instead of calling
        # read() once per opcode (4x faster on torch's state_dict pickles). A stream given instead of
        # bytes (the legacy format's main pickle, whose end is only known once read) must have peek()
        # too; the unpickler leaves it positioned just after STOP.
        if isinstance(data, (bytes, bytearray, memoryview)):
            stream = io.BufferedReader(io.BytesIO(data), buffer_size=1 << 20)  # type: ignore[arg-type]
        else:
            stream = data
        super().__init__(stream, encoding="utf-8", errors="surrogateescape")
        self.strict = strict
        self.limits = limits
        self.unknown_globals: dict[str, int] = {}  # qualified name -> times referenced

    def find_class(self, module: str, name: str) -> object:
        module = MODULE_ALIASES.get(module, module)
        found = ALLOWED.get((module, name))
        if found is not None:
            return found
        qualname = f"{module}.{name}"
        if self.strict:
            raise UnsafePickleError(f"global {qualname} is not on the allowlist (strict mode)")
        seen = self.unknown_globals
        if qualname not in seen:
            if len(seen) >= self.limits.max_globals:
                raise LimitError(f"more than {self.limits.max_globals} distinct unknown globals")
            seen[qualname] = 0
        seen[qualname] += 1
        return opaque_class(qualname)


def unpickle(data: "bytes | io.BufferedIOBase", *, strict: bool = False, limits: Limits = DEFAULT_LIMITS,
             file: str | None = None, record: str | None = None) -> tuple[object, SafeUnpickler]:
    """Unpickle ``data`` (bytes, or a stream that bounds its own size) safely; any failure becomes one
    CkptfsError naming ``file`` and ``record``."""
    if isinstance(data, (bytes, bytearray, memoryview)) and len(data) > limits.max_pickle_bytes:
        raise LimitError(f"pickle of {len(data)} bytes is over the limit of {limits.max_pickle_bytes} "
                         "(raise Limits.max_pickle_bytes to index it)", file=file, record=record)
    up = SafeUnpickler(data, strict=strict, limits=limits)
    try:
        with gc_paused():
            obj = up.load()
    except CkptfsError as e:
        raise e.at(file=file, record=record) from None
    except MemoryError:
        raise LimitError("pickle declares an object too large to build", file=file, record=record) from None
    except RecursionError:
        raise LimitError("pickle nests too deeply", file=file, record=record) from None
    except Exception as e:  # the C unpickler raises many kinds on malformed input
        raise UnsafePickleError(f"malformed pickle ({type(e).__name__}: {_short(e)})", file=file,
                                record=record) from None
    return obj, up


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
