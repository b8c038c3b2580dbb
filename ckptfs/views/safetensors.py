"""A checkpoint as safetensors files, computed from the index: the header from shapes and dtypes, the data
as pieces of the checkpoint itself.

A safetensors file is 8 bytes of header length, a JSON header (``{"__metadata__": {str: str}, name: {"dtype",
"shape", "data_offsets"}}``, padded with spaces to a multiple of 8) and the tensors' bytes, little-endian and
C-contiguous, end to end. Here each file is a :class:`~ckptfs.model.extents.Content`:

* the header is a ``Literal``, made from the index (shapes, dtypes, names) without reading tensor data;
* a contiguous little-endian tensor is a ``SourceRange`` of the checkpoint: its own bytes, no copy (tied
  tensors are two ranges over the same bytes, which the format allows);
* a strided view, a big-endian tensor, or a tensor with torch's conj / neg bit is ``Computed``, converted
  on the fly one request at a time (memory bounded by the request).

Tensors are laid out as the safetensors writer lays them out (by descending dtype, then by name; the header
padded to 8 bytes), so every tensor's data is aligned to its item size and a file with metadata ``{"format":
"pt"}`` only is byte for byte what ``safetensors.torch.save_file`` writes for the same tensors.

What safetensors cannot hold is never dropped silently: it is listed in ``__metadata__["ckptfs.omitted"]``
(key -> why: complex128, quantized, sparse, nested, meta tensors, objects of unknown classes, unreadable
tensors); values that are not tensors (epoch, hyper-parameters) are kept in ``__metadata__`` as JSON text
under their dotted keys (docs/views.md).
"""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ..errors import CkptfsError, LimitError
from ..model.catalog import Catalog
from ..model.extents import Computed, Content, Literal, Piece
from ..model.index import COMPOSITE, CONTAINERS, DICT, LEAF, LINK, OPAQUE, TENSOR, Index, component
from ..model.meta import _jsonable
from ..model.reader import TensorData
from ..model.tensors import NO_DATA_KINDS, ensure_valid, nbytes
from ..pickle.nodes import OpaqueObject, TensorNode

#: torch dtype name -> safetensors dtype
ST_DTYPES: dict[str, str] = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "float8_e5m2": "F8_E5M2", "float8_e4m3fn": "F8_E4M3",
    "float8_e8m0fnu": "F8_E8M0", "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "int16": "I16", "uint16": "U16", "float16": "F16", "bfloat16": "BF16", "int32": "I32", "uint32": "U32",
    "float32": "F32", "complex64": "C64", "float64": "F64", "int64": "I64", "uint64": "U64",
    "float4_e2m1fn_x2": "F4",
}
#: The safetensors writer's dtype order (its Dtype enum, ascending; it writes the largest first).
ST_ORDER = ("BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ",
            "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64")
_RANK = {name: i for i, name in enumerate(ST_ORDER)}

#: The safetensors library refuses headers longer than this.
MAX_HEADER = 100_000_000
#: JSON text of one value kept in ``__metadata__`` (a larger value is listed as omitted instead).
MAX_VALUE_JSON = 1 << 20
#: The name of a checkpoint's root when it is itself a tensor or a value (as in the mount: docs/layout.md).
ROOT_NAME = "%root"
FORMAT_KEY, OMITTED_KEY = "format", "ckptfs.omitted"
RESERVED_PREFIX = "ckptfs."


# --- what goes where -------------------------------------------------------------------------------------------


@dataclass
class TensorEntry:
    """One tensor of a safetensors file: its name, safetensors dtype and shape, and where its bytes are (found
    when first read: the header needs none of it)."""

    name: str
    row: int
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    node: TensorNode = field(repr=False)
    catalog: Catalog = field(repr=False)
    swap: int = 0  # byte-swap unit (big-endian file); 0: the bytes are little-endian already
    flags: tuple[str, ...] = ()  # torch's "conj" / "neg" bits, applied to the values served

    @property
    def data(self) -> TensorData:
        """The tensor's bytes, planned (its storage bound on first use; raises CkptfsError if unreadable)."""
        return self.catalog.data(self.row)

    def convert(self, buf: memoryview) -> None:
        """Turn stored bytes (whole elements) into this tensor's safetensors bytes, in place."""
        if self.swap or self.flags:
            _convert_in_place(buf, self.swap, self.node.dtype.name, self.flags)

    def pieces(self, data: TensorData | None = None) -> list[Piece]:
        """The tensor's bytes as pieces (of ``data``, by default its own: an exporter may pass the same
        tensor planned over another source of the same bytes). A tensor whose record turns out unreadable
        is a piece whose reads fail (the rest of the file reads)."""
        try:
            d = data or self.data
        except CkptfsError as e:
            return [Computed(self.nbytes, _failing(e), "unreadable tensor")]
        if not self.swap and not self.flags:
            return list(d.content.pieces)
        return [Computed(self.nbytes, _converter(d.content, self.node, self.swap, self.flags),
                         "byte swap" if not self.flags else "conj/neg", tuple(d.content.sources()))]


def _failing(error: CkptfsError) -> Callable[[memoryview, int], None]:
    def fill(buf: memoryview, offset: int) -> None:
        raise error

    return fill


@dataclass
class Selection:
    """What a set of index rows becomes: tensors, metadata values, and what is left out (with why)."""

    tensors: list[TensorEntry] = field(default_factory=list)
    values: dict[str, str] = field(default_factory=dict)  # metadata key -> JSON text
    omitted: dict[str, str] = field(default_factory=dict)  # key -> why it is not in the file
    notes: dict[int, str] = field(default_factory=dict)  # index row -> why (tensors and composite parts)

    def metadata(self, with_values: bool = True) -> dict[str, str]:
        """The ``__metadata__`` of a file holding this selection: format, values, the omitted list."""
        md = {FORMAT_KEY: "pt"}
        if with_values:
            md.update(self.values)
            if self.omitted:
                md[OMITTED_KEY] = _json_text(self.omitted)
        return md


def select(catalog: Catalog, roots: Sequence[int] | None = None, base: str = "") -> Selection:
    """Walk the catalog's tree (or the subtrees at ``roots``) in checkpoint order and sort every entry into
    a tensor of the file, a metadata value, or an omitted entry.

    * a tensor safetensors can hold (dtype, kind, readable) is a tensor named by its dotted key;
    * a value, or a container with no tensor anywhere below it, is one metadata value (JSON text);
    * a container with tensors below it is walked (its values each become a metadata value); an object of
      a class ckptfs does not know is walked the same way and listed as omitted (the object itself cannot
      be rebuilt);
    * a composite tensor (sparse, nested, per-channel quantized), and any tensor safetensors cannot hold,
      is omitted, with why;
    * a shared container met again (a link) is the value ``{"$ref": "<key of the first>"}``.

    ``base``: the key the names in the file are relative to (a member file of a directory: its tensors are
    named as in that file alone), so a name is judged without it.
    """
    index = catalog.index
    kinds, nodes, keys = index.kinds, index.nodes, index.keys
    holds = _tensor_subtrees(index)
    sel = Selection()
    stack = list(reversed(roots)) if roots is not None else [0]
    while stack:
        i = stack.pop()
        kind = kinds[i]
        key = keys[i] if i else ROOT_NAME
        if kind == TENSOR:
            _add_tensor(catalog, i, key, sel, base)
        elif kind == COMPOSITE:
            t: TensorNode = nodes[i]  # type: ignore[assignment]
            what = _composite_text(t)
            parts = ", ".join(keys[c] for c in index.children(i))
            why = f"{what}: safetensors holds dense tensors only (its parts: {parts})"
            sel.omitted[key] = why
            sel.notes[i] = why
            for r in _subtree(index, i):
                if r != i:
                    sel.notes[r] = f"part of {key} ({what})"
        elif kind == LEAF or kind == LINK or (kind in CONTAINERS and i and not holds[i]):
            _add_value(index, i, key, sel, base)
        elif kind in CONTAINERS:
            if kind == OPAQUE:
                sel.omitted[key] = (f"an object of class {_qualname(nodes[i])} (never imported): its tensors are "
                                    "in the file, its other values in __metadata__")
            stack.extend(reversed(index.children(i)))
    return sel


def omitted_notes(catalog: Catalog) -> dict[int, str]:
    """Why each tensor row safetensors cannot hold is left out (``ckptfs ls``'s note column), from the index
    alone (nothing is read: a tensor whose record turns out unreadable is only found by :func:`select`)."""
    index = catalog.index
    kinds, nodes, keys = index.kinds, index.nodes, index.keys
    notes: dict[int, str] = {}
    for i, kind in enumerate(kinds):
        if kind == COMPOSITE:
            what = _composite_text(nodes[i])  # type: ignore[arg-type]
            notes[i] = f"{what}: safetensors holds dense tensors only"
            for r in _subtree(index, i):
                if r != i:
                    notes[r] = f"part of {keys[i]} ({what})"
    for i in index.tensors():
        if i not in notes:
            why = unsupported_reason(nodes[i]) or _name_problem(keys[i] if i else ROOT_NAME)  # type: ignore[arg-type]
            if why is not None:
                notes[i] = why
    return notes


def _add_tensor(catalog: Catalog, row: int, key: str, sel: Selection, base: str = "") -> None:
    t: TensorNode = catalog.index.nodes[row]  # type: ignore[assignment]
    ensure_valid(t, catalog.limits.max_ndim)  # geometry against the storage's record (nothing read)
    why = unsupported_reason(t) or _name_problem(relative_key(key, base))
    if why is not None:
        sel.omitted[key] = why
        sel.notes[row] = why
        return
    dtype = ST_DTYPES[t.dtype.name]
    shape = tuple(t.shape)
    if dtype == "F4":  # two 4-bit floats per byte: safetensors counts elements, torch counts bytes
        shape = shape[:-1] + (shape[-1] * 2,)
    order = catalog.byteorder_of(t, row)
    unit = t.dtype.itemsize // (2 if t.dtype.name.startswith("complex") else 1)
    swap = unit if order == "big" and unit > 1 else 0
    flags = tuple(f for f in ("conj", "neg") if t.metadata and t.metadata.get(f) is True)
    sel.tensors.append(TensorEntry(key, row, dtype, shape, nbytes(t), t, catalog, swap, flags))


def unsupported_reason(t: TensorNode) -> str | None:
    """Why a tensor cannot be a tensor of a safetensors file (before reading anything), or None."""
    if t.error is not None:
        return t.error
    if t.parts is not None:
        return f"{_composite_text(t)}: safetensors holds dense tensors only"
    if t.kind in NO_DATA_KINDS:
        return (f"a {t.kind} tensor has no data (shape {list(t.shape)}, {t.dtype.name})" if t.kind == "meta"
                else f"a tensor subclass with no storage ({t.dtype.name} {list(t.shape)})")
    if t.kind == "quantized" or t.dtype.quantized:
        q = (t.extra or {}).get("qscheme", "")
        return f"a quantized tensor ({t.dtype.name}{' ' + str(q) if q else ''}): safetensors has no quantized dtypes"
    if t.unsupported is not None:
        return t.unsupported
    if t.dtype.name not in ST_DTYPES:
        extra = " (only complex64)" if t.dtype.name.startswith("complex") else ""
        return f"safetensors has no {t.dtype.name} dtype{extra}"
    if t.dtype.name == "float4_e2m1fn_x2" and not t.shape:
        return "a 0-d float4_e2m1fn_x2 tensor has no safetensors shape (two values per byte)"
    flags = t.metadata or {}
    if (flags.get("neg") is True or flags.get("conj") is True) and t.dtype.name not in _SIGNED:
        return f"torch's conj/neg bit on a {t.dtype.name} tensor"
    return None


#: dtypes whose values ckptfs can negate / conjugate (torch sets those bits on these only in practice)
_SIGNED = ("float16", "bfloat16", "float32", "float64", "complex64", "int8", "int16", "int32", "int64")


def relative_key(key: str, base: str) -> str:
    """``key`` as named in the file of the subtree at ``base`` ("": the whole checkpoint)."""
    if not base:
        return key
    return ROOT_NAME if key == base else key[len(base) + 1:] if key.startswith(base + ".") else key


def _name_problem(key: str) -> str | None:
    if key == "__metadata__":
        return "its name is the one safetensors reserves for the metadata"
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return "its name is not valid UTF-8 (a lone surrogate): safetensors names are UTF-8"
    return None


def _composite_text(t: TensorNode) -> str:
    extra = t.extra or {}
    if t.kind == "sparse":
        return f"a sparse tensor ({extra.get('layout', '?')})"
    if t.kind == "quantized":
        return f"a per-channel quantized tensor ({t.dtype.name})"
    return f"a {t.kind} tensor"


def _qualname(obj: object) -> str:
    return type(obj).qualname if isinstance(obj, OpaqueObject) else type(obj).__name__


def _tensor_subtrees(index: Index) -> list[bool]:
    """Per row: a tensor (or composite) is at or below it (links not followed)."""
    kinds, parents = index.kinds, index.parents
    holds = [k == TENSOR or k == COMPOSITE for k in kinds]
    for i in reversed(index.order()):  # children before their parents
        if holds[i] and parents[i] >= 0:
            holds[parents[i]] = True
    return holds


def _subtree(index: Index, i: int) -> Iterable[int]:
    stack = [i]
    while stack:
        r = stack.pop()
        yield r
        stack.extend(index.children(r))


# --- values as JSON ---------------------------------------------------------------------------------------------


def _add_value(index: Index, row: int, key: str, sel: Selection, base: str = "") -> None:
    problem = _name_problem(relative_key(key, base))
    if problem is not None:
        sel.omitted[key] = f"a value: {problem}"
        return
    if key == FORMAT_KEY or key.startswith(RESERVED_PREFIX):  # ckptfs's own metadata keys win
        n = 2
        while f"{key}#{n}" in sel.values:
            n += 1
        key = f"{key}#{n}"
    budget = [100_000]
    try:
        text = _json_text(_row_json(index, row, budget))
    except _TooBig:
        text = None
    if text is None or len(text) > MAX_VALUE_JSON:
        sel.omitted[key] = (f"a value whose JSON form is over {MAX_VALUE_JSON >> 20} MiB (too large for the "
                            "safetensors header)")
        return
    sel.values[key] = text


class _TooBig(Exception):
    pass


def _row_json(index: Index, row: int, budget: list[int]) -> Any:
    """The JSON form of a row: leaves as values, containers as objects/arrays, links as ``{"$ref": key}``."""
    budget[0] -= 1
    if budget[0] < 0:
        raise _TooBig
    kind = index.kinds[row]
    node = index.nodes[row]
    if kind == LEAF:
        return leaf_json(node)
    if kind == LINK:
        return {"$ref": index.keys[index.resolve(row)]}
    if kind == TENSOR or kind == COMPOSITE:  # (not reached from select: such subtrees are walked)
        return _jsonable(node)
    children = index.children(row)
    if kind == OPAQUE:
        out: dict[str, Any] = {"$class": _qualname(node)}
        for c in children:
            out[component(index.names[c])] = _row_json(index, c, budget)
        return out
    if kind == DICT:
        return {component(index.names[c]): _row_json(index, c, budget) for c in children}
    return [_row_json(index, c, budget) for c in children]


def leaf_json(v: object) -> Any:
    """A value's JSON form: JSON types as they are, bytes as ``{"$bytes": base64}``, complex numbers as
    ``{"$complex": [re, im]}``, dtypes/devices/classes as their names (as sidecars show them)."""
    if v is None or type(v) in (bool, str, float):
        return v
    if type(v) is int:
        return v if v.bit_length() < 10_000 else hex(v)  # (str() refuses ints past 4300 digits)
    if isinstance(v, (bytes, bytearray)):
        if len(v) > MAX_VALUE_JSON:
            raise _TooBig
        return {"$bytes": base64.b64encode(bytes(v)).decode("ascii")}
    if type(v) is complex:
        return {"$complex": [v.real, v.imag]}
    return _jsonable(v)


def _json_text(obj: Any) -> str:
    """JSON text (UTF-8-encodable: strings with lone surrogates are written with \\u escapes)."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(obj, ensure_ascii=True, separators=(",", ":"))
    return text


# --- one file ----------------------------------------------------------------------------------------------------


class SafetensorsFile:
    """One safetensors file: the header (computed once) and the tensors, in the writer's order."""

    def __init__(self, tensors: Sequence[TensorEntry], metadata: dict[str, str] | None, *,
                 name: str = "") -> None:
        self.name = name
        self.metadata = metadata
        # the writer's order: larger dtypes first (so every tensor is aligned to its item size), then by name
        self.tensors = sorted(tensors, key=lambda e: (-_RANK[e.dtype], e.name))
        header: dict[str, Any] = {}
        if metadata is not None:
            header["__metadata__"] = metadata
        offset = 0
        self.offsets: list[int] = []
        for e in self.tensors:
            header[e.name] = {"dtype": e.dtype, "shape": list(e.shape), "data_offsets": [offset, offset + e.nbytes]}
            self.offsets.append(offset)
            offset += e.nbytes
        text = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        text += b" " * (-len(text) % 8)
        if len(text) > MAX_HEADER:
            raise LimitError(f"its safetensors header would be {len(text):,} bytes, over the {MAX_HEADER:,} the "
                             "format allows", file=name or None)
        self.header = struct.pack("<Q", len(text)) + text
        self.data_bytes = offset
        self.size = len(self.header) + offset

    @property
    def data_start(self) -> int:
        return len(self.header)

    def content(self, pieces_of: Callable[[TensorEntry], list[Piece]] | None = None) -> Content:
        """The file's bytes as pieces (``pieces_of`` may plan a tensor's bytes another way: an exporter)."""
        pieces: list[Piece] = [Literal(self.header)]
        for e in self.tensors:
            pieces.extend(pieces_of(e) if pieces_of is not None else e.pieces())
        content = Content(pieces)
        assert content.size == self.size, (content.size, self.size)
        return content

    def __repr__(self) -> str:
        return f"SafetensorsFile({self.name!r}, {len(self.tensors)} tensors, {self.size} bytes)"


# --- several files: HF's sharded layout -----------------------------------------------------------------------


def shard_name(prefix: str, i: int, n: int, variant: str | None = None) -> str:
    """``model-00001-of-00003.safetensors`` (``model.fp16-00001-of-00003.safetensors`` for a variant), or
    ``model.safetensors`` when there is one file: the names transformers writes and looks for."""
    base = prefix if variant is None else f"{prefix}.{variant}"
    return f"{base}.safetensors" if n == 1 else f"{base}-{i + 1:05d}-of-{n:05d}.safetensors"


def index_name(prefix: str, variant: str | None = None) -> str:
    return f"{prefix}.safetensors.index.json" if variant is None else f"{prefix}.safetensors.index.{variant}.json"


def index_json(files: Sequence[tuple[str, SafetensorsFile]], omitted: dict[str, str] | None = None) -> bytes:
    """``model.safetensors.index.json`` as transformers writes it (``indent=2``, sorted keys): total_size
    (the tensors' bytes) and weight_map; ckptfs adds the omitted entries, if any, under metadata."""
    weight_map = {e.name: fname for fname, f in files for e in f.tensors}
    meta: dict[str, Any] = {"total_size": sum(f.data_bytes for _, f in files)}
    if omitted:
        meta[OMITTED_KEY] = dict(omitted)
    doc = {"metadata": meta, "weight_map": weight_map}
    return (json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def split_by_size(tensors: Sequence[TensorEntry], max_bytes: int) -> list[list[TensorEntry]]:
    """Tensors into shards of at most ``max_bytes`` of data each, as huggingface_hub's split does: in order,
    a new shard when the next tensor would tip the current one over; a tensor larger than ``max_bytes`` in a
    shard of its own (placed before the one being filled); tensors sharing a storage (tied) in the shard of
    the first of them."""
    done: list[list[TensorEntry]] = []
    current: list[TensorEntry] = []
    size = 0
    first_of: dict[tuple[int, str], list[TensorEntry]] = {}  # storage -> the shard of its first tensor
    for e in tensors:
        ref = e.node.storage
        sid = (id(ref.owner), ref.key) if ref is not None and ref.owner is not None else None
        if sid is not None and sid in first_of:
            first_of[sid].append(e)
            continue
        if e.nbytes > max_bytes:
            done.append([e])
            shard = done[-1]
        else:
            if current and size + e.nbytes > max_bytes:
                done.append(current)
                current, size = [], 0
            current.append(e)
            size += e.nbytes
            shard = current
        if sid is not None:
            first_of[sid] = shard
    if current or not done:
        done.append(current)
    return done


def member_roots(catalog: Catalog) -> list[list[int]]:
    """Per member of the catalog, the rows at the top of its part of the tree (a one-file catalog: [[0]])."""
    index = catalog.index
    owners = index.owners
    if owners is None or len(catalog.members) == 1:
        return [[0]]
    out: list[list[int]] = [[] for _ in catalog.members]
    for c in index.children(0):
        out[max(owners[c], 0)].append(c)
    return out


def plan_members(catalog: Catalog, prefix: str = "model", variant: str | None = None
                 ) -> tuple[list[tuple[str, SafetensorsFile]], bytes | None, dict[str, str]]:
    """One safetensors file per member of the catalog (the shards of an HF directory, in order), each with
    its member's values and omitted entries; the index.json (None for one member: ``model.safetensors``);
    everything omitted."""
    groups = member_roots(catalog)
    n = len(groups)
    files = []
    omitted: dict[str, str] = {}
    for i, roots in enumerate(groups):
        sel = select(catalog, roots if roots != [0] else None)
        name = shard_name(prefix, i, n, variant)
        files.append((name, SafetensorsFile(sel.tensors, sel.metadata(), name=name)))
        omitted.update(sel.omitted)
    return files, (index_json(files, omitted) if n > 1 else None), omitted


def plan_by_size(sel: Selection, max_bytes: int, prefix: str = "model",
                 variant: str | None = None) -> tuple[list[tuple[str, SafetensorsFile]], bytes | None]:
    """The selection in shards of at most ``max_bytes`` of data (the first shard carries the values and the
    omitted list), and the index.json (None when it fits in one file)."""
    groups = split_by_size(sel.tensors, max_bytes)
    n = len(groups)
    files = []
    for i, group in enumerate(groups):
        name = shard_name(prefix, i, n, variant)
        files.append((name, SafetensorsFile(group, sel.metadata(with_values=i == 0), name=name)))
    return files, (index_json(files, sel.omitted) if n > 1 else None)


# --- conversions on the fly -------------------------------------------------------------------------------------


def _converter(src: Content, t: TensorNode, unit: int, flags: tuple[str, ...]) -> Callable[[memoryview, int], None]:
    """A Computed fill: ``src``'s bytes from ``offset``, byte-swapped per ``unit`` (big-endian to little) and
    with torch's conj / neg bits applied, whole elements at a time (an unaligned request reads the
    elements it touches into a small buffer first)."""
    itemsize = t.dtype.itemsize
    dtype_name = t.dtype.name

    def fill(buf: memoryview, offset: int) -> None:
        n = len(buf)
        a0 = offset - offset % itemsize
        a1 = -(-(offset + n) // itemsize) * itemsize
        if a0 == offset and a1 == offset + n:
            src.readinto(buf, offset)
            _convert_in_place(buf, unit, dtype_name, flags)
            return
        tmp = bytearray(a1 - a0)
        src.readinto(memoryview(tmp), a0)
        _convert_in_place(memoryview(tmp), unit, dtype_name, flags)
        buf[:] = tmp[offset - a0 : offset - a0 + n]

    return fill


_SIGN = {2: np.uint16(0x8000), 4: np.uint32(0x80000000), 8: np.uint64(0x8000000000000000)}


def _convert_in_place(buf: memoryview, unit: int, dtype_name: str, flags: tuple[str, ...]) -> None:
    if unit > 1:
        np.frombuffer(buf, dtype=np.dtype(f"u{unit}")).byteswap(inplace=True)
    if not flags:
        return
    complex_ = dtype_name.startswith("complex")
    if complex_:  # pairs of floats (complex64: float32 re, im)
        half = 4 if dtype_name == "complex64" else 2
        parts = np.frombuffer(buf, dtype=np.dtype(f"<u{half}")).reshape(-1, 2)
        sign = _SIGN[half]
        if "neg" in flags:
            parts ^= sign
        if "conj" in flags:
            parts[:, 1] ^= sign
        return
    if "neg" not in flags:  # conj of a real tensor changes nothing
        return
    if dtype_name.startswith(("float", "bfloat")):
        size = {"float64": 8, "float32": 4}.get(dtype_name, 2)
        vals = np.frombuffer(buf, dtype=np.dtype(f"<u{size}"))
        vals ^= _SIGN[size]
    else:  # signed integers: two's complement negation, wrapping like torch
        size = {"int8": 1, "int16": 2, "int32": 4, "int64": 8}[dtype_name]
        ints = np.frombuffer(buf, dtype=np.dtype(f"<i{size}"))
        np.negative(ints, out=ints)
