"""safetensors files: an 8-byte little-endian header length N, N bytes of UTF-8 JSON, then the tensors' bytes.

The header maps each tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative
to the end of the header) and may hold ``"__metadata__": {str: str}``. It is validated as strictly as the
safetensors library does (safetensors/src/tensor.rs, as of safetensors 0.8): N at most 100,000,000; the
header valid UTF-8 JSON holding an object; every field of the expected type (other fields are ignored); entries sorted by offsets begin at 0 and follow each
other with no gap and no overlap; ``end - begin = numel x bits / 8`` (a whole number of bytes); and
``8 + N + last end`` is exactly the file's length. One rule is stricter than the library's: a name that
appears twice (in the header, or in an entry) is refused, where the library keeps the last one.

Each tensor is a range of the file: served by ``pread`` and mapped with no copy. The object graph is the
dict of the header's entries, in header order, as :class:`TensorNode`\\ s whose storage is owned by this
container.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from ..dtypes import DTYPES, DType
from ..errors import FormatError, LimitError, TensorError
from ..limits import DEFAULT_LIMITS, Limits
from ..pickle.nodes import StorageRef, TensorNode, contiguous_strides
from ..source import ByteSource, SubRange, read_exact
from .base import Attachment, GraphDigest, ObjectGraph

#: The library's bound on N (safetensors' MAX_HEADER_SIZE).
MAX_HEADER = 100_000_000
METADATA_KEY = "__metadata__"

#: safetensors dtype -> (torch dtype name, bits per element). F6 types have no torch dtype: served as bytes.
ST_DTYPES: dict[str, tuple[str | None, int]] = {
    "BOOL": ("bool", 8), "U8": ("uint8", 8), "I8": ("int8", 8), "F8_E5M2": ("float8_e5m2", 8),
    "F8_E4M3": ("float8_e4m3fn", 8), "F8_E8M0": ("float8_e8m0fnu", 8), "F8_E4M3FNUZ": ("float8_e4m3fnuz", 8),
    "F8_E5M2FNUZ": ("float8_e5m2fnuz", 8), "I16": ("int16", 16), "U16": ("uint16", 16), "F16": ("float16", 16),
    "BF16": ("bfloat16", 16), "I32": ("int32", 32), "U32": ("uint32", 32), "F32": ("float32", 32),
    "C64": ("complex64", 64), "F64": ("float64", 64), "I64": ("int64", 64), "U64": ("uint64", 64),
    "F4": ("float4_e2m1fn_x2", 4), "F6_E2M3": (None, 6), "F6_E3M2": (None, 6),
}
#: The dtype names a safetensors writer uses for torch dtypes (the inverse of ST_DTYPES).
TORCH_TO_ST = {torch_name: st for st, (torch_name, _bits) in ST_DTYPES.items() if torch_name}
U64 = 1 << 64
UINT8 = DTYPES["uint8"]


def is_safetensors(head: bytes, size: int) -> bool:
    """The first bytes look like a safetensors file: a header length, then ``{`` (after JSON whitespace,
    which the library accepts). Whether the length fits the file is the container's to say."""
    if len(head) < 9 or not head[8:].lstrip(b" \t\r\n").startswith(b"{"):
        return False
    return int.from_bytes(head[:8], "little") >= 2


class _Duplicate(Exception):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        raise _Duplicate(next(k for k, _ in pairs if k in seen or seen.add(k)))  # type: ignore[func-returns-value]
    return out


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")  # Python's json takes NaN and Infinity; the library does not


def _finite(text: str) -> float:
    v = float(text)
    if v in (float("inf"), float("-inf")):
        raise ValueError(f"number out of range: {text[:40]}")
    return v


def _uint(v: object) -> bool:
    return type(v) is int and 0 <= v < U64


class SafetensorsEntry:
    """One validated header entry."""

    __slots__ = ("name", "st_dtype", "st_shape", "begin", "end")

    def __init__(self, name: str, st_dtype: str, st_shape: tuple[int, ...], begin: int, end: int) -> None:
        self.name = name
        self.st_dtype = st_dtype
        self.st_shape = st_shape
        self.begin = begin
        self.end = end


class SafetensorsFile:
    """A safetensors file, validated when opened (FormatError naming the file and the entry)."""

    kind = "safetensors"
    byteorder = "little"

    def __init__(self, source: ByteSource, limits: Limits = DEFAULT_LIMITS) -> None:
        self.source = source
        self.limits = limits
        self.entries: dict[str, SafetensorsEntry] = {}
        self.metadata: dict[str, str] | None = None
        self.header_size = 0
        self._read_header()
        self.data_start = 8 + self.header_size
        self.info: dict[str, Any] = {"header_bytes": self.header_size, "tensors": len(self.entries),
                                     "metadata_keys": len(self.metadata or {}),
                                     "data_bytes": self.source.size - self.data_start}

    def _fail(self, msg: str, record: str | None = None) -> FormatError:
        return FormatError(msg, file=self.source.name, record=record)

    # --- the header ---------------------------------------------------------------------------------
    def _read_header(self) -> None:
        size = self.source.size
        if size < 8:
            raise self._fail(f"too short for a safetensors file ({size} bytes)")
        n = int.from_bytes(read_exact(self.source, 0, 8, "the header length"), "little")
        if n > MAX_HEADER:
            raise self._fail(f"safetensors header length {n} is over the format's limit of {MAX_HEADER} bytes")
        if 8 + n > size:
            raise self._fail(f"safetensors header length {n} runs past the end of the file ({size} bytes)")
        raw = read_exact(self.source, 8, n, "the header")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self._fail(f"header is not UTF-8 (byte {e.start})") from None
        try:
            doc = json.loads(text, object_pairs_hook=_pairs, parse_constant=_no_constant, parse_float=_finite)
        except _Duplicate as e:
            raise self._fail(f"{e.args[0]!r} appears twice in one object of the header (readers disagree on "
                             "which one is meant)") from None
        except RecursionError:
            raise self._fail("header JSON nests too deeply") from None
        except ValueError as e:
            raise self._fail(f"header is not valid JSON ({e})") from None
        if not isinstance(doc, dict):
            raise self._fail("header is not a JSON object")
        self.header_size = n
        meta = doc.pop(METADATA_KEY, None)
        if meta is not None:
            if not isinstance(meta, dict) or not all(type(v) is str and _text(v) and _text(k) for k, v in meta.items()):
                raise self._fail("__metadata__ is not an object of strings", record=METADATA_KEY)
            self.metadata = meta
        if len(doc) > self.limits.max_tensors:
            raise LimitError(f"{len(doc)} tensors is over the limit of {self.limits.max_tensors}",
                             file=self.source.name)
        entries = [self._entry(name, info) for name, info in doc.items()]
        self._check_layout(entries, size - 8 - n)
        self.entries = {e.name: e for e in entries}

    def _entry(self, name: str, info: object) -> SafetensorsEntry:
        if not _text(name):
            raise self._fail("tensor name is not valid Unicode (a lone surrogate escape)", record=repr(name))
        if not isinstance(info, dict):
            raise self._fail("entry is not an object", record=name)
        for field in ("dtype", "shape", "data_offsets"):
            if field not in info:
                raise self._fail(f"entry has no {field!r}", record=name)
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if type(dtype) is not str or dtype not in ST_DTYPES:
            raise self._fail(f"unknown dtype {dtype!r}", record=name)
        if type(shape) is not list or not all(_uint(s) for s in shape):
            raise self._fail(f"shape {shape!r} is not a list of non-negative integers", record=name)
        if len(shape) > self.limits.max_ndim:
            raise self._fail(f"{len(shape)} dimensions (limit {self.limits.max_ndim})", record=name)
        if type(offsets) is not list or len(offsets) != 2 or not all(_uint(o) for o in offsets):
            raise self._fail(f"data_offsets {offsets!r} is not a pair of non-negative integers", record=name)
        return SafetensorsEntry(name, dtype, tuple(shape), offsets[0], offsets[1])

    def _check_layout(self, entries: list[SafetensorsEntry], data_size: int) -> None:
        """The library's rules: sorted by offsets, entries start at 0 and follow each other exactly, each one
        numel x bits / 8 bytes, and the last one ends where the file does."""
        pos = 0
        for e in sorted(entries, key=lambda e: (e.begin, e.end)):
            if e.begin != pos or e.end < e.begin:
                why = "leaves a gap before it" if e.begin > pos else "overlaps the entry before it"
                if e.end < e.begin:
                    why = "ends before it begins"
                raise self._fail(f"data_offsets [{e.begin}, {e.end}] {why} (expected to begin at {pos})",
                                 record=e.name)
            pos = e.end
            numel = 1
            for s in e.st_shape:
                numel *= s
            bits = numel * ST_DTYPES[e.st_dtype][1]
            if bits >= U64 * 8:
                raise self._fail(f"shape {list(e.st_shape)} overflows", record=e.name)
            if bits % 8:
                raise self._fail(f"{numel} {e.st_dtype} values are not a whole number of bytes", record=e.name)
            if e.end - e.begin != bits // 8:
                raise self._fail(f"data_offsets [{e.begin}, {e.end}] hold {e.end - e.begin} bytes but shape "
                                 f"{list(e.st_shape)} of {e.st_dtype} needs {bits // 8}", record=e.name)
        if pos != data_size:
            raise self._fail(f"the tensors end at data byte {pos} but the file has {data_size} bytes of data "
                             "(truncated, or bytes appended)" if pos < data_size else
                             f"the tensors end at data byte {pos}, past the end of the file ({data_size} bytes of "
                             "data: truncated)")

    # --- the object graph ---------------------------------------------------------------------------
    def object_graph(self, strict: bool, digest: GraphDigest | None = None) -> ObjectGraph:
        # (``digest`` is for pickles unpickled in the probe's child: there is none here)
        root = {name: self._node(e) for name, e in self.entries.items()}
        return ObjectGraph([root], "header")

    def _node(self, e: SafetensorsEntry) -> TensorNode:
        torch_name, _bits = ST_DTYPES[e.st_dtype]
        shape = e.st_shape
        nbytes = e.end - e.begin
        dtype: DType = UINT8
        if torch_name == "float4_e2m1fn_x2" and shape and shape[-1] % 2 == 0:
            dtype, shape = DTYPES[torch_name], shape[:-1] + (shape[-1] // 2,)  # two values per byte, as torch
        elif torch_name is not None and torch_name != "float4_e2m1fn_x2":
            dtype = DTYPES[torch_name]
        else:  # packed sub-byte values torch has no dtype for: their bytes, as uint8
            shape = (nbytes,)
        ref = StorageRef(e.name, dtype, nbytes // dtype.itemsize, "cpu", "safetensors", self)
        return TensorNode("dense", ref, dtype, shape, contiguous_strides(shape), 0)  # as safetensors.torch makes them

    # --- storages -----------------------------------------------------------------------------------
    def _get(self, key: str) -> SafetensorsEntry:
        e = self.entries.get(key)
        if e is None:
            raise TensorError("no such tensor in the header", file=self.source.name, record=key)
        return e

    def pickles(self) -> Sequence[bytes]:
        return ()

    def bind(self, refs: Mapping[str, StorageRef]) -> None:
        return None

    def storage_size(self, key: str) -> int:
        e = self._get(key)
        return e.end - e.begin

    def storage_source(self, key: str) -> ByteSource:
        e = self._get(key)
        return SubRange(self.source, self.data_start + e.begin, e.end - e.begin, key)

    def record_name(self, key: str) -> str:
        e = self._get(key)
        return f"bytes {self.data_start + e.begin}..{self.data_start + e.end}"

    def storage_layout(self, key: str) -> dict[str, Any] | None:
        e = self._get(key)
        return {"safetensors": {"dtype": e.st_dtype, "shape": list(e.st_shape), "data_offsets": [e.begin, e.end]}}

    def attachments(self) -> Sequence[Attachment]:
        return ()

    def user_metadata(self) -> Mapping[str, str] | None:
        return self.metadata

    def close(self) -> None:
        self.source.close()


def _text(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
