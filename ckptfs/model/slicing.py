"""Basic indexing as geometry: ``tensor[index]`` is a new strided view of the same storage.

A selection of ints, slices (step >= 1) and one Ellipsis becomes a new (offset, shape, stride) on the same
storage, whose bytes are then read like any tensor's: a contiguous row range is one pread, anything else
a gather of just the touched storage (``Checkpoint.slice(key)[...]``).
"""

from __future__ import annotations

from typing import Any, SupportsIndex

from ..pickle.nodes import TensorNode
from .tensors import STRIDED_KINDS


def slice_node(t: TensorNode, index: Any) -> TensorNode:
    """The TensorNode for ``tensor[index]`` (same storage, new offset/shape/stride)."""
    if t.kind not in STRIDED_KINDS or t.stride is None:
        raise TypeError(f"{t.kind} tensors cannot be sliced")
    if not isinstance(index, tuple):
        index = (index,)
    if sum(1 for i in index if i is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis")
    n_real = sum(1 for i in index if i is not Ellipsis)
    if n_real > len(t.shape):
        raise IndexError(f"too many indices: tensor has {len(t.shape)} dimensions, {n_real} given")
    if Ellipsis in index:
        pos = index.index(Ellipsis)
        index = index[:pos] + (slice(None),) * (len(t.shape) - n_real) + index[pos + 1:]
    index = index + (slice(None),) * (len(t.shape) - len(index))
    offset = t.storage_offset
    shape: list[int] = []
    stride: list[int] = []
    for dim, (i, size, st) in enumerate(zip(index, t.shape, t.stride, strict=False)):
        if isinstance(i, slice):
            start, stop, step = i.indices(size)
            if step < 1:
                raise ValueError("slice steps must be positive (torch has no negative strides)")
            n = len(range(start, stop, step))
            if n:
                offset += start * st
            shape.append(n)
            stride.append(st * step)
        elif isinstance(i, SupportsIndex) and not isinstance(i, bool):
            k = i.__index__()
            if k < 0:
                k += size
            if not 0 <= k < size:
                raise IndexError(f"index {i} is out of bounds for dimension {dim} with size {size}")
            offset += k * st
        else:
            raise TypeError(f"unsupported index {i!r}: use ints, slices and ...")
    v = TensorNode(t.kind, t.storage, t.dtype, tuple(shape), tuple(stride), offset, t.requires_grad, t.metadata)
    v.extra = t.extra
    return v
