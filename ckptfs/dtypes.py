"""The dtypes torch writes: names, item sizes, storage classes and numpy equivalents.

No torch import: dtypes are identified by torch's own names ("float32", "bfloat16", ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class DType:
    name: str  # torch's name, e.g. "bfloat16"
    itemsize: int  # bytes per element as stored
    numpy: str | None  # numpy type code without byte order ("f4"), an ml_dtypes name, or None
    ml_dtypes: bool = False  # numpy type comes from the ml_dtypes package
    no_numpy_reason: str | None = None  # why there is no numpy dtype (when numpy is None)
    quantized: bool = False

    def numpy_str(self, byteorder: str = "little") -> str | None:
        """The numpy dtype string with byte order: '<f4', '>i8', '|u1', 'bfloat16' (ml_dtypes)."""
        if self.numpy is None:
            return None
        if self.ml_dtypes:
            # ml_dtypes types are native-order only; multi-byte ones in a big-endian file are byteswapped
            # on read by numpy()/memmap callers (layout.md); their name says no order.
            return self.numpy if self.itemsize == 1 or byteorder == "little" else ">" + self.numpy
        if self.itemsize == 1:
            return "|" + self.numpy
        return ("<" if byteorder == "little" else ">") + self.numpy


def _d(name: str, itemsize: int, numpy: str | None, **kw: object) -> DType:
    return DType(name, itemsize, numpy, **kw)  # type: ignore[arg-type]


_ALL = [
    _d("float64", 8, "f8"),
    _d("float32", 4, "f4"),
    _d("float16", 2, "f2"),
    _d("bfloat16", 2, "bfloat16", ml_dtypes=True),
    _d("float8_e4m3fn", 1, "float8_e4m3fn", ml_dtypes=True),
    _d("float8_e5m2", 1, "float8_e5m2", ml_dtypes=True),
    _d("float8_e4m3fnuz", 1, "float8_e4m3fnuz", ml_dtypes=True),
    _d("float8_e5m2fnuz", 1, "float8_e5m2fnuz", ml_dtypes=True),
    _d("float8_e8m0fnu", 1, "float8_e8m0fnu", ml_dtypes=True),
    _d("float4_e2m1fn_x2", 1, None, no_numpy_reason="two packed 4-bit floats per byte; read the bytes as uint8"),
    _d("complex128", 16, "c16"),
    _d("complex64", 8, "c8"),
    _d(
        "complex32",
        4,
        None,
        no_numpy_reason="numpy has no complex32; view the bytes as float16 pairs (dtype '<f2', shape + (2,))",
    ),
    _d("int8", 1, "i1"),
    _d("int16", 2, "i2"),
    _d("int32", 4, "i4"),
    _d("int64", 8, "i8"),
    _d("uint8", 1, "u1"),
    _d("uint16", 2, "u2"),
    _d("uint32", 4, "u4"),
    _d("uint64", 8, "u8"),
    _d("bool", 1, "b1"),
    _d("qint8", 1, "i1", quantized=True),
    _d("quint8", 1, "u1", quantized=True),
    _d("qint32", 4, "i4", quantized=True),
    _d("quint4x2", 1, "u1", quantized=True),
    _d("quint2x4", 1, "u1", quantized=True),
    _d("bits8", 1, "u1"),
    _d("bits16", 2, "u2"),
    _d("bits1x8", 1, "u1"),
    _d("bits2x4", 1, "u1"),
    _d("bits4x2", 1, "u1"),
]

DTYPES: dict[str, DType] = {d.name: d for d in _ALL}

# torch's aliases (torch.float is float32, ...): a pickle names dtypes by canonical name, but accept both.
_ALIASES = {
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "cfloat": "complex64",
    "cdouble": "complex128",
    "chalf": "complex32",
    "long": "int64",
    "int": "int32",
    "short": "int16",
}
for _alias, _canon in _ALIASES.items():
    DTYPES[_alias] = DTYPES[_canon]

# Typed storage classes (module torch, torch.cuda, ...) -> element dtype. UntypedStorage is bytes.
STORAGE_DTYPES: dict[str, DType] = {
    "DoubleStorage": DTYPES["float64"],
    "FloatStorage": DTYPES["float32"],
    "HalfStorage": DTYPES["float16"],
    "BFloat16Storage": DTYPES["bfloat16"],
    "LongStorage": DTYPES["int64"],
    "IntStorage": DTYPES["int32"],
    "ShortStorage": DTYPES["int16"],
    "CharStorage": DTYPES["int8"],
    "ByteStorage": DTYPES["uint8"],
    "BoolStorage": DTYPES["bool"],
    "ComplexDoubleStorage": DTYPES["complex128"],
    "ComplexFloatStorage": DTYPES["complex64"],
    "QInt8Storage": DTYPES["qint8"],
    "QUInt8Storage": DTYPES["quint8"],
    "QInt32Storage": DTYPES["qint32"],
    "QUInt4x2Storage": DTYPES["quint4x2"],
    "QUInt2x4Storage": DTYPES["quint2x4"],
}
UNTYPED_STORAGE = "UntypedStorage"
STORAGE_MODULES = ("torch", "torch.cuda", "torch.storage", "torch.cuda.storage")

UINT8 = DTYPES["uint8"]


_NUMPY_DTYPES: dict[tuple[DType, str], np.dtype[Any]] = {}


def numpy_dtype(dt: DType, byteorder: str = "little") -> np.dtype[Any]:
    """The numpy dtype for ``dt`` in the file's byte order; raises :class:`UnsupportedError` if none."""
    found = _NUMPY_DTYPES.get((dt, byteorder))
    if found is None:
        found = _NUMPY_DTYPES[(dt, byteorder)] = _numpy_dtype(dt, byteorder)
    return found


def _numpy_dtype(dt: DType, byteorder: str) -> np.dtype[Any]:
    import numpy as np

    from .errors import UnsupportedError

    if dt.numpy is None:
        raise UnsupportedError(f"{dt.name}: {dt.no_numpy_reason}")
    if dt.ml_dtypes:
        try:
            import ml_dtypes
        except ImportError:
            raise UnsupportedError(
                f"{dt.name} needs the ml_dtypes package for a numpy view (pip install ml-dtypes); "
                "or read the raw bytes with Checkpoint.read() / view them as uint8"
            ) from None
        npdt: np.dtype[Any] = np.dtype(getattr(ml_dtypes, dt.numpy))
        return npdt.newbyteorder(">") if byteorder == "big" and dt.itemsize > 1 else npdt
    return np.dtype(dt.numpy_str(byteorder))
