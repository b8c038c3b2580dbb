"""Values whose data lives in the pickle: numpy arrays and scalars (no torch storage involved)."""

from __future__ import annotations

import re

from ...dtypes import DTYPES, DType
from ...pickle.nodes import (
    NumpyArray,
    NumpyDType,
    NumpyScalar,
    OpaqueObject,
    TensorNode,
)
from .common import show

_NUMPY_CODE = re.compile(r"^[<>|=]?([fiucb?])(\d{0,2})$")
_NUMPY_TO_TORCH = {
    ("f", 2): "float16", ("f", 4): "float32", ("f", 8): "float64", ("i", 1): "int8", ("i", 2): "int16",
    ("i", 4): "int32", ("i", 8): "int64", ("u", 1): "uint8", ("u", 2): "uint16", ("u", 4): "uint32",
    ("u", 8): "uint64", ("b", 1): "bool", ("?", 1): "bool", ("c", 8): "complex64", ("c", 16): "complex128",
}


def numpy_code_dtype(code: object) -> tuple[DType | None, str]:
    """Map a numpy dtype code ('f4', '<i8', 'b1') to our DType and byte order; (None, reason) if not."""
    if not isinstance(code, str):
        return None, "little"
    m = _NUMPY_CODE.match(code)
    if not m:
        return None, "little"
    kind, size = m.group(1), int(m.group(2) or (1 if m.group(1) in "b?" else 0))
    name = _NUMPY_TO_TORCH.get((kind, size))
    order = "big" if code.startswith(">") else "little"
    return (DTYPES[name] if name else None), order


def numpy_array_node(arr: NumpyArray) -> TensorNode:
    """A numpy array pickled inside the checkpoint: its bytes are in the pickle (served from there)."""
    t = TensorNode("numpy", None, DTYPES["uint8"], (), None, 0)
    st = getattr(arr, "state", None)  # NEWOBJ can make one without running __init__: slots may be unset
    if not (isinstance(st, tuple) and len(st) == 5):
        t.unsupported = "numpy array with an unrecognised state"
        return t
    _version, shape, dt, is_fortran, raw = st
    if not (isinstance(shape, tuple) and all(type(s) is int and s >= 0 for s in shape)):
        t.error = "numpy array with a malformed shape"
        return t
    code, big = _numpy_dtype_fields(dt)
    dtype, order = numpy_code_dtype(code)
    if big:
        order = "big"
    t.shape = shape
    t.extra = {"numpy_dtype": code, "byteorder": order, "fortran_order": bool(is_fortran)}
    if dtype is None:
        t.unsupported = f"numpy array of dtype {code!r} (not a numeric dtype torch has)"
        return t
    t.dtype = dtype
    if isinstance(raw, str):  # Python-2 style: latin-1 text
        raw = raw.encode("latin-1", "surrogateescape")
    if not isinstance(raw, (bytes, bytearray)):
        t.unsupported = "numpy object array (its items are Python objects)"
        return t
    numel = 1
    for s in shape:
        numel *= s
    if numel * dtype.itemsize != len(raw):
        t.error = f"numpy array data is {len(raw)} bytes, its shape and dtype need {numel * dtype.itemsize}"
        return t
    stride = [0] * len(shape)
    acc = 1
    order_dims = range(len(shape)) if is_fortran else range(len(shape) - 1, -1, -1)
    for d in order_dims:
        stride[d] = acc
        acc *= max(shape[d], 1)  # as numpy (and torch) stride a size-0 dimension
    t.stride = tuple(stride)
    t.extra["inline"] = bytes(raw)
    return t


def numpy_array_value(arr: NumpyArray) -> TensorNode | OpaqueObject:
    """A pickled numpy array: a tensor served from its inline bytes, or, for an object array (whose items
    are Python objects, perhaps tensors), an opaque ``numpy.ndarray`` whose children are its items."""
    st = getattr(arr, "state", None)
    if isinstance(st, tuple) and len(st) == 5 and isinstance(st[4], list):
        from ...pickle.nodes import opaque_class

        cls = opaque_class("numpy.ndarray")
        obj = cls.__new__(cls)
        obj.how = "numpy._reconstruct"
        dt = st[2]
        obj.state = {"shape": st[1], "dtype": _numpy_dtype_fields(dt)[0] or show(dt),
                     "fortran_order": bool(st[3])}
        obj.list_items = st[4]
        return obj
    return numpy_array_node(arr)


def numpy_scalar_value(s: NumpyScalar) -> object:
    """The Python value of a pickled numpy scalar, decoded by numpy from its raw bytes."""
    code, big = _numpy_dtype_fields(getattr(s, "dtype", None))
    dtype, order = numpy_code_dtype(code)
    if big:
        order = "big"
    raw = getattr(s, "raw", None)
    raw = raw.encode("latin-1", "surrogateescape") if isinstance(raw, str) else raw
    if dtype is None or not isinstance(raw, bytes) or len(raw) != dtype.itemsize:
        return s
    import numpy as np

    from ...dtypes import numpy_dtype

    return np.frombuffer(raw, dtype=numpy_dtype(dtype, order))[0].item()


def _numpy_dtype_fields(dt: object) -> tuple[object, bool]:
    """(type code, big-endian?) of a pickled numpy dtype; slots NEWOBJ left unset read as missing."""
    if not isinstance(dt, NumpyDType):
        return None, False
    st = getattr(dt, "state", None)
    big = isinstance(st, tuple) and len(st) > 1 and st[1] == ">"
    return getattr(dt, "code", None), big
