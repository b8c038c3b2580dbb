"""A tensor's values, chunk by chunk: stored bytes decoded into numbers numpy can compute with.

Statistics and comparisons (``ckptfs stats``, ``ckptfs diff``) read a tensor through this module: its
logical bytes (:class:`~ckptfs.model.reader.TensorData`) in chunks of whole elements, read into one reused
buffer (memory stays bounded whatever the tensor's size), each chunk decoded by its tensor's
:class:`Decoding` into a numpy array of values:

* float16/32/64, complex64/128, integers: numpy's own types, in native byte order;
* bfloat16 (its bits are the top half of a float32) and the float8 formats (a 256-entry table built from
  each format's definition) decode exactly to float32, so no ml_dtypes is needed; complex32 to complex64;
* bool to numpy bools (any non-zero byte is True, as torch reads it);
* per-tensor quantized integers to their dequantized float32 values, as ``Tensor.dequantize()`` computes;
* the conjugate and negative bits torch.load applies are applied here too.

Packed dtypes (float4_e2m1fn_x2, quint4x2, bits*) have no numeric decoding: :func:`decoding` raises
:class:`~ckptfs.errors.UnsupportedError` for them (their bytes can still be compared).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from ..errors import UnsupportedError
from ..pickle.nodes import TensorNode
from .extents import ContentHandle, SourceRange, source_range
from .reader import TensorData
from .tensors import numel

FLOAT, COMPLEX, INT, BOOL = "float", "complex", "int", "bool"

#: Bytes of decoded float64 values per chunk: reads are ``CHUNK_BYTES // 8`` elements (so at most 16 MiB of
#: stored bytes for complex128), and a statistic or comparison holds a few arrays of this size at a time.
CHUNK_BYTES = 8 << 20

Values = np.ndarray  # a 1-D array of decoded values


@dataclass(frozen=True)
class Decoding:
    """How one tensor's stored bytes become values.

    ``signature`` says what the bytes mean: two tensors with equal signatures and equal bytes have equal
    values, so equal bytes can be taken as equal without decoding them."""

    kind: str  # FLOAT, COMPLEX, INT or BOOL: what the values are
    itemsize: int  # stored bytes per element
    signature: tuple[object, ...]
    decode: Callable[[np.ndarray], Values]  # whole elements as a uint8 array -> 1-D values

    def __call__(self, raw: np.ndarray) -> Values:
        return self.decode(raw)


def decoding(t: TensorNode, byteorder: str) -> Decoding:
    """The decoding of tensor ``t`` stored in ``byteorder``; UnsupportedError when its dtype has none."""
    name = t.dtype.name
    order = "<" if byteorder == "little" else ">"
    extra = t.extra or {}
    meta = t.metadata or {}
    conj, neg = bool(meta.get("conj")), bool(meta.get("neg"))
    base = _BASE.get(name)
    kind: str
    fn: Callable[[np.ndarray], Values]
    qparams: tuple[object, ...] = ()
    if t.dtype.quantized and name in ("qint8", "quint8", "qint32"):
        ints = _plain(("i1" if name == "qint8" else "u1" if name == "quint8" else "i4"), order)
        scale, zero_point = extra.get("scale"), extra.get("zero_point")
        if isinstance(scale, float) and type(zero_point) is int:
            fn, kind, qparams = _dequantize(ints, scale, zero_point), FLOAT, (scale, zero_point)
        else:  # the raw integers (the int_repr part of a per-channel quantized tensor)
            fn, kind = ints, INT
    elif base is not None:
        kind, make = base
        fn = make(order)
    else:
        reason = t.dtype.no_numpy_reason or "its elements are packed or have no arithmetic"
        raise UnsupportedError(f"{name} values cannot be decoded ({reason})")
    if conj and kind == COMPLEX:
        fn = _then(fn, np.conjugate)
    if neg and kind in (FLOAT, COMPLEX, INT):
        fn = _then(fn, np.negative)
    signature = (name, byteorder if t.dtype.itemsize > 1 else "", conj and kind == COMPLEX, neg, qparams)
    return Decoding(kind, t.dtype.itemsize, signature, fn)


def _then(fn: Callable[[np.ndarray], Values], after: Callable[[Values], Values]) -> Callable[[np.ndarray], Values]:
    return lambda raw: after(fn(raw))


# --- decoders ------------------------------------------------------------------------------------------------


def _plain(code: str, order: str) -> Callable[[np.ndarray], Values]:
    """numpy's own type ``code`` stored in ``order``: values in native order."""
    stored = np.dtype(order + code) if code[1:] != "1" else np.dtype(code)
    native = stored.newbyteorder("=")
    if stored == native:
        return lambda raw: raw.view(stored)
    return lambda raw: raw.view(stored).astype(native)


def _bfloat16(order: str) -> Callable[[np.ndarray], Values]:
    u16 = np.dtype(order + "u2")

    def decode(raw: np.ndarray) -> Values:
        bits = raw.view(u16).astype(np.uint32)
        bits <<= 16
        return bits.view(np.float32)

    return decode


def _complex32(order: str) -> Callable[[np.ndarray], Values]:
    halves = np.dtype(order + "f2")

    def decode(raw: np.ndarray) -> Values:
        parts = raw.view(halves).astype(np.float32)
        return parts.view(np.complex64)  # (real, imag) float32 pairs are exactly complex64's layout

    return decode


def _bool(order: str) -> Callable[[np.ndarray], Values]:
    return lambda raw: raw != 0


def float8_table(exponent_bits: int, mantissa_bits: int, bias: int, variant: str) -> np.ndarray:
    """The 256 float32 values of a float8 format, from its definition.

    ``variant``: "ieee" (e5m2: an all-ones exponent is Inf or NaN), "fn" (e4m3fn: no Inf, only S.1111.111 is
    NaN), "fnuz" (no Inf, no negative zero: 0x80 is the only NaN), "e8m0" (8 exponent bits, no sign, no
    mantissa: 2^(e - 127), 0xff NaN)."""
    out = np.empty(256, dtype=np.float32)
    top = (1 << exponent_bits) - 1
    for byte in range(256):
        if variant == "e8m0":
            out[byte] = np.nan if byte == 0xFF else np.float32(2.0 ** (byte - bias))
            continue
        sign = -1.0 if byte & 0x80 else 1.0
        exp = (byte >> mantissa_bits) & top
        man = byte & ((1 << mantissa_bits) - 1)
        if variant == "fnuz" and byte == 0x80:
            value = float("nan")
        elif variant == "ieee" and exp == top:
            value = sign * float("inf") if man == 0 else float("nan")
        elif variant == "fn" and exp == top and man == (1 << mantissa_bits) - 1:
            value = float("nan")
        elif exp == 0:  # subnormal (and zero)
            value = sign * man * 2.0 ** (1 - bias - mantissa_bits)
        else:
            value = sign * (1 + man / (1 << mantissa_bits)) * 2.0 ** (exp - bias)
        out[byte] = value
    return out


_FLOAT8 = {
    "float8_e4m3fn": (4, 3, 7, "fn"),
    "float8_e5m2": (5, 2, 15, "ieee"),
    "float8_e4m3fnuz": (4, 3, 8, "fnuz"),
    "float8_e5m2fnuz": (5, 2, 16, "fnuz"),
    "float8_e8m0fnu": (8, 0, 127, "e8m0"),
}
_TABLES: dict[str, np.ndarray] = {}


def _float8(name: str) -> Callable[[str], Callable[[np.ndarray], Values]]:
    def make(order: str) -> Callable[[np.ndarray], Values]:
        table = _TABLES.get(name)
        if table is None:
            table = _TABLES[name] = float8_table(*_FLOAT8[name])
        return lambda raw: table[raw]

    return make


def _plain_maker(code: str) -> Callable[[str], Callable[[np.ndarray], Values]]:
    return lambda order: _plain(code, order)


_BASE: dict[str, tuple[str, Callable[[str], Callable[[np.ndarray], Values]]]] = {
    "float64": (FLOAT, _plain_maker("f8")),
    "float32": (FLOAT, _plain_maker("f4")),
    "float16": (FLOAT, _plain_maker("f2")),
    "bfloat16": (FLOAT, _bfloat16),
    **{name: (FLOAT, _float8(name)) for name in _FLOAT8},
    "complex128": (COMPLEX, _plain_maker("c16")),
    "complex64": (COMPLEX, _plain_maker("c8")),
    "complex32": (COMPLEX, _complex32),
    "int8": (INT, _plain_maker("i1")),
    "int16": (INT, _plain_maker("i2")),
    "int32": (INT, _plain_maker("i4")),
    "int64": (INT, _plain_maker("i8")),
    "uint8": (INT, _plain_maker("u1")),
    "uint16": (INT, _plain_maker("u2")),
    "uint32": (INT, _plain_maker("u4")),
    "uint64": (INT, _plain_maker("u8")),
    "bool": (BOOL, _bool),
}


def _dequantize(ints: Callable[[np.ndarray], Values], scale: float, zero_point: int) -> Callable[[np.ndarray], Values]:
    """``Tensor.dequantize()`` of a per-tensor affine tensor, in float32 as ATen's vectorized kernel computes it:
    (float(q) - float(zero_point)) * float(scale)."""
    zp, sc = np.float32(zero_point), np.float32(scale)

    def decode(raw: np.ndarray) -> Values:
        q = ints(raw).astype(np.float32)
        q -= zp
        q *= sc
        return q

    return decode


# --- reading in chunks ----------------------------------------------------------------------------------------


def chunk_elements(chunk_bytes: int = CHUNK_BYTES) -> int:
    """Elements per chunk: ``chunk_bytes`` of float64 values."""
    return max(1, chunk_bytes // 8)


def chunks(data: TensorData, elements: int, *, buffer: bytearray | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """``(first element, raw)`` for consecutive runs of at most ``elements`` whole elements of a tensor's
    logical content; ``raw`` is a uint8 view of one reused buffer (valid until the next chunk). Each read
    first checks the checkpoint is unchanged (a file rewritten meanwhile raises StaleSourceError)."""
    itemsize = data.t.dtype.itemsize
    total = data.size // itemsize if itemsize else 0
    if total == 0:
        return
    per = max(1, min(elements, total))
    buf = buffer if buffer is not None and len(buffer) >= per * itemsize else bytearray(per * itemsize)
    view = memoryview(buf)
    handle = ContentHandle(data.content)
    arr = np.frombuffer(buf, dtype=np.uint8)
    for first in range(0, total, per):
        n = min(per, total - first) * itemsize
        got = handle.readinto(view[:n], first * itemsize)
        if got != n:
            raise data._fail(f"data ends after {first * itemsize + got} of {data.size} bytes")
        yield first, arr[:n]


def values(data: TensorData, dec: Decoding, elements: int) -> Iterator[tuple[int, Values]]:
    """``(first element, values)`` chunk by chunk (see :func:`chunks`)."""
    for first, raw in chunks(data, elements):
        yield first, dec(raw)


# --- where a tensor's bytes are --------------------------------------------------------------------------------


def placement(data: TensorData, identities: dict[int, tuple[object, ...]] | None = None) -> tuple[object, ...] | None:
    """What says exactly where a tensor's logical bytes come from: equal placements (same file identity,
    same range, same geometry) mean equal bytes, without reading them. None when unknown (bytes held in
    memory, no storage). ``identities`` caches each source's identity by id."""
    single = data.content.single_range()
    if single is not None:
        return ("range", _identity(single, identities), single.offset, single.size)
    t, storage = data.t, data.storage
    if storage is None or data.inline is not None or t.stride is None:
        return None
    root = source_range(storage, 0, 0)
    return ("strided", _identity(root, identities), root.offset, t.storage_offset, t.shape, t.stride,
            t.dtype.itemsize)


def _identity(r: SourceRange, cache: dict[int, tuple[object, ...]] | None) -> tuple[object, ...]:
    """What names a source's bytes across sources: a posix identity (device, inode, mtime) names one file
    wherever it is opened from; any other identity (an ETag, say) only together with the source's name, as
    two objects may share an ETag without sharing bytes."""
    ident = cache.get(id(r.source)) if cache is not None else None
    if ident is None:
        i = r.source.identity()
        ident = (i,) if i.kind == "posix" else (i, r.source.name)
        if cache is not None:
            cache[id(r.source)] = ident
    return ident


def unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    """The index of element ``flat`` (C order) in a tensor of ``shape``."""
    if not shape:
        return []
    return [int(i) for i in np.unravel_index(flat, shape)] if numel(shape) else []


def as_python(v: Any) -> Any:
    """A numpy scalar as a plain Python number (ints exact)."""
    if isinstance(v, np.generic):
        return v.item()
    return v
