"""Helpers every conversion concern uses (bounded reprs, int tuples, opaque values)."""

from __future__ import annotations

from ...errors import brief
from ...pickle.nodes import OpaqueObject

U = "torch._utils."
MAX_CALL_NESTING = 32
#: Longest size/stride tuple looked at (torch's own limit is 64 dimensions; Limits.max_ndim applies later).
MAX_DIMS = 1024


def show(v: object, n: int = 80) -> str:
    return brief(v, n)  # bounded: a pickled value may be a memo DAG whose full repr never ends


def ascii_text(v: object) -> object:
    return v.decode("ascii", "backslashreplace") if isinstance(v, bytes) else v


def int_tuple(v: object) -> tuple[int, ...] | None:
    """A tuple of ints (sizes, strides), or None. Sequences longer than MAX_DIMS are not looked at: one
    memo-shared 10^5-item tuple given to 10^4 tensors would otherwise cost 10^9 steps."""
    if (type(v) is tuple or type(v) is list) and len(v) <= MAX_DIMS:
        for x in v:
            if type(x) is not int:
                return None
        return tuple(v)
    return None


def opaque_value(name: str, args: tuple[object, ...]) -> OpaqueObject:
    from ...pickle.allowlist import opaque_call

    return opaque_call(name, args)
