"""Tensor geometry and validation: which bytes of which record hold a tensor, or why none can.

Validation is lazy (first metadata error / read of a tensor) and happens once per tensor.

A dense tensor is (storage, dtype, shape, stride, storage_offset) as in ``Tensor.set_``. It is served
only if every element it addresses lies inside its storage, the storage's record exists and has
exactly the size the pickle declares, and nothing overflows. Anything else records an error on that
tensor alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import CkptfsError
from ..limits import Limits
from ..pickle.nodes import StorageRef, TensorNode

if TYPE_CHECKING:
    from .index import Index

#: Kinds whose bytes are a strided view of one storage (quantized tensors store raw integers the same way).
STRIDED_KINDS = ("dense", "quantized")
#: Kinds that have a shape and dtype but no data at all: served as 0 bytes (their metadata says why).
NO_DATA_KINDS = ("meta", "wrapper")
MAX_NBYTES = 1 << 62


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def is_contiguous(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """C-contiguous as torch defines it: strides of size-1 dimensions do not matter."""
    acc = 1
    for d in range(len(shape) - 1, -1, -1):
        s = shape[d]
        if s != 1:
            if stride[d] != acc:
                return False
            acc *= s
    return True


def nbytes(t: TensorNode) -> int:
    """Bytes of the tensor's logical (C-contiguous) content; 0 for kinds with no data."""
    if t.kind in NO_DATA_KINDS or t.parts is not None or t.unsupported is not None and t.kind != "numpy":
        return 0  # no data, or a composite (its bytes are its parts')
    return numel(t.shape) * t.dtype.itemsize


def validate_all(index: Index, limits: Limits) -> None:
    """Validate every tensor of an index (``ckptfs ls``, ``info``, ``check``)."""
    kinds, nodes = index.kinds, index.nodes
    max_ndim = limits.max_ndim
    for i in range(len(kinds)):
        if kinds[i] == "tensor" and not nodes[i].validated:  # type: ignore[attr-defined]
            ensure_valid(nodes[i], max_ndim)  # type: ignore[arg-type]


def ensure_valid(t: TensorNode, max_ndim: int) -> None:
    """Check a strided tensor against its storage and record once (on first use: opening a 20k-tensor
    checkpoint does not pay for tensors nobody reads); sets ``t.error`` on the first problem."""
    if t.validated:
        return
    if t.error is None and t.unsupported is None and t.parts is None and t.kind in STRIDED_KINDS:
        ref = t.storage
        if ref is not None and not ref.checked:
            check_storage(ref)
        t.error = check_geometry(t, max_ndim)
    t.validated = True


def check_storage(ref: StorageRef) -> None:
    """The storage's record must exist and hold exactly the bytes the pickle declares."""
    ref.checked = True
    if ref.error is not None:
        return
    if ref.owner is None:
        ref.error = "no container to read storages from"
        return
    try:
        size = ref.owner.storage_size(ref.key)
    except CkptfsError as e:
        ref.error = e.reason if e.record is None else f"{e.record}: {e.reason}"
        return
    if size != ref.nbytes:
        ref.error = (f"record data/{ref.key} holds {size} bytes but the pickle declares {ref.numel} x "
                     f"{ref.itemsize} = {ref.nbytes} bytes")


def check_geometry(t: TensorNode, max_ndim: int) -> str | None:
    """Every element the view addresses must lie inside its storage; nothing negative or overflowing."""
    shape, stride, offset = t.shape, t.stride, t.storage_offset
    ref = t.storage
    if ref is None:
        return "no storage"
    if ref.error is not None:
        return ref.error
    if stride is None:
        return "no strides"
    if len(shape) > max_ndim:
        return f"{len(shape)} dimensions (limit {max_ndim})"
    if offset < 0:
        return f"negative storage offset {offset}"
    n = 1
    last = offset
    for s, st in zip(shape, stride, strict=False):
        if s < 0 or st < 0:
            return f"negative size or stride (shape {shape}, stride {stride}; torch has no negative strides)"
        n *= s
        last += (s - 1) * st
    itemsize = t.dtype.itemsize
    if n * itemsize > MAX_NBYTES:
        return f"shape {shape} is too large ({n} elements of {itemsize} bytes overflow)"
    if n and (last + 1) * itemsize > ref.nbytes:
        return (f"elements reach byte {(last + 1) * itemsize} but storage {ref.key!r} holds {ref.nbytes} bytes "
                f"(shape {shape}, stride {stride}, offset {offset})")
    return None
