"""A tensor as a ``.npy`` file: numpy's header, then the tensor's bytes (its pieces: no copy).

The header is made by numpy's own writer (``numpy.lib.format``: version 1.0, or 2.0 for a header over
64 KiB; the data starts at a multiple of 64), so ``np.load(path, mmap_mode="r")`` maps the tensor in place.
The bytes are the tensor's logical C-contiguous bytes in the byte order the checkpoint stores them (the
descr says which: ``<f4`` or ``>f4``). Dtypes numpy has no descr for (docs/layout.md):

* bfloat16 -> ``<u2``, float8_* and float4_e2m1fn_x2 -> ``|u1``: the raw bits, same shape
  (``arr.view(ml_dtypes.bfloat16)`` gives the values);
* complex32 -> ``<f2`` with a last axis of 2 (real, imaginary), as the sidecar's numpy_dtype_reason says;
* quantized tensors -> their integer representation (qint8 ``|i1``, quint8 ``|u1``, qint32 ``<i4``).
"""

from __future__ import annotations

import io

from ..dtypes import DType
from ..model.extents import Content, Literal
from ..model.reader import TensorData

#: Bit patterns only: dtypes numpy has no type for are served as unsigned integers of their width.
_RAW = {1: "u1", 2: "u2", 4: "u4", 8: "u8"}


def npy_descr(dtype: DType, byteorder: str = "little") -> tuple[str, tuple[int, ...]]:
    """(numpy descr, extra trailing axes) for a tensor's bytes: ``('<f4', ())``, ``('<f2', (2,))`` ..."""
    order = "<" if byteorder == "little" else ">"
    if dtype.name == "complex32":
        return order + "f2", (2,)
    if dtype.numpy is None or dtype.ml_dtypes:
        code = _RAW[dtype.itemsize]
    else:
        code = dtype.numpy
    return ("|" + code if dtype.itemsize == 1 else order + code), ()


def npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    """The .npy header numpy writes for a C-ordered array of ``descr`` and ``shape``."""
    from numpy.lib import format as npformat

    d = {"descr": descr, "fortran_order": False, "shape": tuple(shape)}
    out = io.BytesIO()
    try:
        npformat.write_array_header_1_0(out, d)
    except ValueError:  # a header over 64 KiB (thousands of dimensions): version 2.0
        out = io.BytesIO()
        npformat.write_array_header_2_0(out, d)
    return out.getvalue()


def npy_content(data: TensorData, byteorder: str) -> Content:
    """The .npy file of a tensor: header + the tensor's pieces."""
    t = data.t
    descr, extra = npy_descr(t.dtype, byteorder)
    return Content([Literal(npy_header(descr, tuple(t.shape) + extra)), *data.content.pieces])

