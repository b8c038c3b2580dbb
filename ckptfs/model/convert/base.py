"""The converter's core: memoised conversion of recorded calls, and the helpers every concern uses."""

from __future__ import annotations

from typing import Any, Callable

from ...dtypes import UINT8
from ...errors import LimitError
from ...limits import DEFAULT_LIMITS, Limits
from ...pickle.nodes import (
    Call,
    NumpyArray,
    OpaqueObject,
    StorageOwner,
    StorageRef,
    TensorNode,
)
from .common import MAX_CALL_NESTING, show
from .values import numpy_array_value


class ConverterBase:
    """The converter's state and entry points; each concern adds its handlers in a subclass."""

    handlers: dict[str, Callable[[tuple[Any, ...], str], object]]

    def __init__(self, limits: Limits = DEFAULT_LIMITS, owner: StorageOwner | None = None) -> None:
        self.limits = limits
        self.owner = owner  # the container serving this file's storages
        self.refs: dict[str, StorageRef] = {}
        self._shapes: dict[tuple[int, ...], tuple[int, ...]] = {}
        self.done: dict[int, object] = {}
        self._keep: list[object] = []  # converted calls stay alive so their id() is not reused
        self._depth = 0
        self.handlers = {}

    # --- entry point ------------------------------------------------------------------------------------
    def convert(self, call: Call) -> object:
        cid = id(call)
        done = self.done.get(cid)
        if done is not None:
            return done
        if self._depth >= MAX_CALL_NESTING:
            raise LimitError(f"rebuild calls nest deeper than {MAX_CALL_NESTING} levels")
        self._depth += 1
        try:
            name = type(call).call
            out = self.handlers.get(name, self._unknown)(call.args, name)
        finally:
            self._depth -= 1
        self.done[cid] = out
        self._keep.append(call)
        return out

    def _unknown(self, a: tuple[Any, ...], name: str) -> object:
        """A recorded call no handler interprets."""
        raise NotImplementedError(name)

    def numpy_array(self, arr: NumpyArray) -> TensorNode | OpaqueObject:
        """A pickled numpy array as a node, once per array object (a memo may reference one many times)."""
        aid = id(arr)
        node = self.done.get(aid)
        if node is None:
            node = self.done[aid] = numpy_array_value(arr)
            self._keep.append(arr)
        return node  # type: ignore[return-value]

    def value(self, v: object) -> object:
        return self.convert(v) if isinstance(v, Call) else v

    def _bad_call(self, name: str, a: tuple[Any, ...], why: str | None = None) -> TensorNode:
        t = TensorNode("dense", None, UINT8, (), None, 0)
        t.error = why or f"{name} called with {len(a)} arguments: {show(a)}"
        return t
