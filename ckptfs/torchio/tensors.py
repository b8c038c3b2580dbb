"""Everything that needs torch: building torch tensors and the lazy state_dict (``ckptfs.load``).

Imported only when a torch object is asked for; the index, the CLI's ls/info and the mount never
import this module.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

import torch

from ..errors import CkptfsError, UnsupportedError
from ..model.index import COMPOSITE, DICT, LEAF, LIST, OPAQUE, SET, TENSOR, TUPLE, classify
from ..pickle.nodes import (
    Call,
    NumpyArray,
    NumpyScalar,
    OpaqueObject,
    PickledOrderedDict,
    StorageRef,
    TensorNode,
    TorchDevice,
    TorchDType,
    TorchGlobal,
)

if TYPE_CHECKING:
    from ..model.checkpoint import Checkpoint


def torch_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise CkptfsError(f"this torch ({torch.__version__}) has no dtype {name}")
    return dt


# --- devices ------------------------------------------------------------------------------------------


def resolve_device(map_location: Any, location: str) -> torch.device:
    """Where torch.load(map_location=...) would put a storage saved from ``location``."""
    target: Any
    if map_location is None:
        target = location
    elif isinstance(map_location, (str, torch.device)):
        target = map_location
    elif isinstance(map_location, dict):
        target = map_location.get(location, location)
    elif callable(map_location):
        probe = torch.UntypedStorage(0)
        res = map_location(probe, location)
        target = location if res is None else getattr(res, "device", res)
    else:
        raise TypeError(f"map_location of type {type(map_location).__name__} is not supported")
    dev = torch.device(target)
    if dev.type not in ("cpu", "meta"):
        mod = getattr(torch, dev.type, None)
        if mod is None or not getattr(mod, "is_available", lambda: False)():
            raise CkptfsError(f"tensor saved on {location!r} maps to {dev}, which this machine does not "
                              "have; pass map_location='cpu'")
    return dev


# --- tensors ------------------------------------------------------------------------------------------


def _read_into_tensor(r: Any, out: torch.Tensor) -> None:
    """Fill a contiguous tensor with the reader's bytes (straight into its memory, no extra copy)."""
    if r.size == 0:
        return
    flat = out.reshape(-1).view(torch.uint8)
    buf = memoryview(flat.numpy())
    r.readinto(buf, 0)


def _byteswap(out: torch.Tensor, itemsize: int, is_complex: bool) -> None:
    unit = itemsize // 2 if is_complex else itemsize
    if unit <= 1 or out.numel() == 0:
        return
    arr = out.reshape(-1).view(torch.uint8).numpy().reshape(-1, unit)
    arr[...] = arr[:, ::-1].copy()


def build_tensor(ckpt: "Checkpoint", key: Any, map_location: Any = "cpu", dtype: torch.dtype | None = None,
                 mmap: bool = True) -> torch.Tensor:
    i = ckpt.row(key)
    if ckpt.index.kinds[i] == COMPOSITE:
        return build_composite(ckpt, i, map_location, dtype, mmap)
    return build_tensor_from_reader(ckpt, ckpt.reader(key), map_location, dtype, mmap)


#: torch dtype of the raw integers of each quantized dtype (what ``int_repr()`` returns)
_QUANT_INT = {"qint8": torch.int8, "quint8": torch.uint8, "qint32": torch.int32}


def build_composite(ckpt: "Checkpoint", row: int, map_location: Any = "cpu", dtype: torch.dtype | None = None,
                    mmap: bool = True) -> torch.Tensor:
    """A sparse, nested or per-channel quantized tensor from its parts, as torch.load rebuilds it."""
    index = ckpt.index
    t: TensorNode = index.nodes[row]  # type: ignore[assignment]
    key = index.keys[row]
    if t.error:
        raise CkptfsError(t.error, file=ckpt.name, record=key)
    parts = {index.names[c]: build_tensor(ckpt, index.keys[c], map_location, None, mmap) for c in index.children(row)}
    extra = t.extra or {}
    if t.kind == "sparse":
        layout = getattr(torch, extra["layout"])
        values = parts["values"]
        if layout == torch.sparse_coo:
            out = torch.sparse_coo_tensor(parts["indices"], values, t.shape, is_coalesced=extra.get("is_coalesced"),
                                          check_invariants=True)
        else:
            names = [n for n in parts if n != "values"]
            out = torch.sparse_compressed_tensor(parts[names[0]], parts[names[1]], values, t.shape, layout=layout,
                                                 check_invariants=True)
    elif t.kind == "nested":
        out = torch._nested_view_from_buffer(parts["buffer"].contiguous(), parts["sizes"], parts["strides"],
                                             parts["offsets"])
    elif t.kind == "quantized":
        out = torch._make_per_channel_quantized_tensor(parts["int_repr"], parts["scales"], parts["zero_points"],
                                                       extra["axis"])
    else:
        raise UnsupportedError(f"{t.kind} composite tensors cannot be built", file=ckpt.name, record=key)
    if dtype is not None and out.dtype != dtype and not out.is_quantized:
        out = out.to(dtype)
    if t.requires_grad and (out.is_floating_point() or out.is_complex()):
        out.requires_grad_(True)
    return out


def part_of(tensor: torch.Tensor, name: str) -> torch.Tensor:
    """The component of a torch sparse / nested / per-channel quantized tensor that ckptfs shows as the
    part ``name`` (``w.indices`` ...): how ``ckptfs check`` and the tests find torch's side."""
    if tensor.is_quantized:
        return {"int_repr": tensor.int_repr, "scales": tensor.q_per_channel_scales,
                "zero_points": tensor.q_per_channel_zero_points}[name]()
    if tensor.is_nested:
        return {"buffer": tensor.values, "sizes": tensor._nested_tensor_size,
                "strides": tensor._nested_tensor_strides, "offsets": tensor._nested_tensor_storage_offsets}[name]()
    if tensor.layout == torch.sparse_coo:
        return {"indices": tensor._indices, "values": tensor._values}[name]()
    return getattr(tensor, name)()  # crow_indices, col_indices, ccol_indices, row_indices, values


def _mapped(ckpt: "Checkpoint", r: Any, tdt: torch.dtype) -> torch.Tensor | None:
    """A copy-on-write view of the file for a tensor stored as one range in native byte order."""
    offset = ckpt.file_offset(r)
    if offset is None:
        return None
    try:
        flat = torch.frombuffer(ckpt.source.mmap(), dtype=tdt, count=r.size // r.t.dtype.itemsize, offset=offset)
    except (ValueError, TypeError, RuntimeError):  # a dtype frombuffer does not take
        return None
    return flat.reshape(r.t.shape)


def build_tensor_from_reader(ckpt: "Checkpoint", r: Any, map_location: Any = "cpu",
                             dtype: torch.dtype | None = None, mmap: bool = False) -> torch.Tensor:
    t: TensorNode = r.t
    extra = t.extra or {}
    if t.kind == "meta":  # torch.load makes it on the meta device whatever map_location says
        return torch.empty_strided(t.shape, t.stride, dtype=torch_dtype(t.dtype.name), device="meta",
                                   requires_grad=t.requires_grad)
    if t.kind == "wrapper":
        raise UnsupportedError(f"a {extra.get('subclass')} wrapper subclass has no storage and ckptfs does not "
                               "import its class: metadata only (see Checkpoint.meta)", file=ckpt.name, record=r.key)
    if t.kind == "quantized":
        int_dtype = _QUANT_INT.get(t.dtype.name)
        if int_dtype is None or "scale" not in extra:
            raise UnsupportedError(f"{t.dtype.name} tensors ({extra.get('qscheme')}) cannot be built as torch tensors",
                                   file=ckpt.name, record=r.key)
        ints = torch.empty(t.shape, dtype=int_dtype)
        _read_into_tensor(r, ints)
        if ckpt.byteorder != sys.byteorder and t.dtype.itemsize > 1:
            _byteswap(ints, t.dtype.itemsize, False)
        return torch._make_per_tensor_quantized_tensor(ints, extra["scale"], extra["zero_point"])
    if t.unsupported is not None:
        raise UnsupportedError(t.unsupported, file=ckpt.name, record=r.key)
    if t.kind not in ("dense", "numpy"):
        raise UnsupportedError(f"{t.kind} tensors cannot be built as torch tensors", file=ckpt.name, record=r.key)
    tdt = torch_dtype(t.dtype.name)
    order = extra.get("byteorder", ckpt.byteorder)
    native = order == sys.byteorder or t.dtype.itemsize == 1
    out = _mapped(ckpt, r, tdt) if mmap and native else None
    if out is None:
        out = torch.empty(t.shape, dtype=tdt)
        _read_into_tensor(r, out)
        if not native:
            _byteswap(out, t.dtype.itemsize, t.dtype.name.startswith("complex"))
    if t.metadata:
        torch._utils.set_tensor_metadata(out, dict(t.metadata))  # conj / neg bits, as torch.load sets them
    location = extra.get("device") or (t.storage.location if t.storage is not None else "cpu")
    dev = resolve_device(map_location, location)
    if dev.type != "cpu":
        out = out.to(dev)
    if dtype is not None and out.dtype != dtype:
        out = out.to(dtype)
    if t.is_parameter:
        out = torch.nn.Parameter(out, requires_grad=t.requires_grad)
    elif t.requires_grad and (out.is_floating_point() or out.is_complex()):
        out.requires_grad_(True)
    if "python_state" in extra:
        _set_state(ckpt, out, extra["python_state"], map_location, dtype)
    return out


def _set_state(ckpt: "Checkpoint", out: torch.Tensor, state: Any, map_location: Any, dtype: Any) -> None:
    """Python attributes a Parameter / tensor subclass carried (``_rebuild_parameter_with_state``,
    ``_rebuild_from_type_v2``), set as torch.load sets them, as plain data only; names that are not plain
    identifiers, dunders, or that torch.Tensor itself has (``data``, ``grad`` ...) are not set."""
    if isinstance(state, tuple) and len(state) == 2:  # (dict state, slots state)
        merged: dict = {}
        for part in state:
            if isinstance(part, dict):
                merged.update(part)
        state = merged
    if not isinstance(state, dict):
        return
    for name, value in state.items():
        if isinstance(name, str) and name.isidentifier() and not name.startswith("__") \
                and not hasattr(torch.Tensor, name):
            setattr(out, name, to_plain(ckpt, value, map_location, dtype))


# --- metadata objects (zipslicer's get_meta) ---------------------------------------------------------------


@dataclass(frozen=True)
class TensorMeta:
    """What ``LazyStateDict.get_meta(key)`` returns: shape/dtype without reading the tensor."""

    shape: torch.Size
    dtype: torch.dtype
    stride: tuple
    storage_offset: int
    nbytes: int
    requires_grad: bool
    is_parameter: bool
    device: str
    record: str | None
    extra: dict = field(default_factory=dict)

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def numel(self) -> int:
        return self.shape.numel()

    def dim(self) -> int:
        return len(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)


@dataclass(frozen=True)
class OpaqueValue:
    """An object of a class ckptfs did not import: its qualified name and the data it was built from."""

    qualname: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    state: Any = None
    items: dict | None = None
    list_items: list | None = None


# --- the lazy state_dict ----------------------------------------------------------------------------------


class LazyStateDict(Mapping):
    """A read-on-access view of a dict in the checkpoint (a drop-in for zipslicer's LazyStateDict).

    Tensors are read when accessed (and not kept unless ``cache_tensors``); nested dicts are lazy too;
    other values are returned as plain Python data. Assigning or deleting keys changes only this view.
    """

    def __init__(self, ckpt: "Checkpoint", entry_idx: int = 0, *, map_location: Any = "cpu",
                 dtype: torch.dtype | None = None, cache_tensors: bool = False, debug: bool = False,
                 mmap: bool = True) -> None:
        self._ckpt = ckpt
        self.mmap = mmap
        self._idx = entry_idx
        self.map_location = map_location
        self.dtype = dtype
        self.cache_tensors = cache_tensors
        self.debug = debug
        index = ckpt.index
        names = index.names
        self._children: dict[Any, int] = {names[c]: c for c in index.children(entry_idx)}
        self._overrides: dict[Any, Any] = {}
        self._deleted: set = set()
        self._cache: dict[Any, Any] = {}

    # Mapping protocol
    def __getitem__(self, key: Any) -> Any:
        if key in self._overrides:
            return self._overrides[key]
        if key in self._deleted or key not in self._children:
            raise KeyError(key)
        if key in self._cache:
            return self._cache[key]
        value = self._value(self._children[key])
        if self.cache_tensors:
            self._cache[key] = value
        return value

    def __iter__(self) -> Iterator[Any]:
        for k in self._children:
            if k not in self._deleted:
                yield k
        for k in self._overrides:
            if k not in self._children:
                yield k

    def __len__(self) -> int:
        return len(self._children) - len(self._deleted) + sum(1 for k in self._overrides if k not in self._children)

    def __contains__(self, key: object) -> bool:
        return key in self._overrides or (key in self._children and key not in self._deleted)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._overrides[key] = value
        self._deleted.discard(key)

    def __delitem__(self, key: Any) -> None:
        if key not in self:
            raise KeyError(key)
        self._overrides.pop(key, None)
        if key in self._children:
            self._deleted.add(key)
        self._cache.pop(key, None)

    def __repr__(self) -> str:
        return f"<ckptfs.LazyStateDict of {self._ckpt.name!r}: {len(self)} keys>"

    # extras
    @property
    def _metadata(self) -> Any:
        node = self._ckpt.index.nodes[self._idx]
        if isinstance(node, PickledOrderedDict) and node.metadata is not None:
            return to_plain(self._ckpt, node.metadata, self.map_location, self.dtype)
        return None

    def get_meta(self, key: Any) -> TensorMeta | None:
        """Shape and dtype of a tensor without reading it; None for non-tensor values."""
        if key not in self._children or key in self._deleted:
            if key in self._overrides:
                v = self._overrides[key]
                return None if not isinstance(v, torch.Tensor) else _meta_of_tensor(v)
            raise KeyError(key)
        index = self._ckpt.index
        i = index.resolve(self._children[key])
        if index.kinds[i] != TENSOR:
            return None
        m = self._ckpt.meta(index.keys[i])
        return TensorMeta(torch.Size(m.shape or ()), torch_dtype(m.dtype or "uint8"), tuple(m.stride or ()),
                          m.storage_offset or 0, m.nbytes or 0, bool(m.requires_grad), bool(m.is_parameter),
                          m.location or "cpu", m.record, dict(m.extra))

    def checkpoint(self) -> "Checkpoint":
        return self._ckpt

    def close(self) -> None:
        self._ckpt.close()

    def _value(self, idx: int) -> Any:
        ckpt = self._ckpt
        i = ckpt.index.resolve(idx)
        if ckpt.index.kinds[i] == DICT:
            return LazyStateDict(ckpt, i, map_location=self.map_location, dtype=self.dtype,
                                 cache_tensors=self.cache_tensors, debug=self.debug, mmap=self.mmap)
        return entry_value(ckpt, i, self.map_location, self.dtype, self.mmap)


def _meta_of_tensor(v: torch.Tensor) -> TensorMeta:
    return TensorMeta(v.shape, v.dtype, tuple(v.stride()), v.storage_offset(), v.numel() * v.element_size(),
                      v.requires_grad, isinstance(v, torch.nn.Parameter), str(v.device), None)


def entry_value(ckpt: "Checkpoint", row: int, map_location: Any, dtype: torch.dtype | None,
                mmap: bool = True) -> Any:
    """Materialise an index row as plain Python / torch objects (containers recursively)."""
    index = ckpt.index
    i = index.resolve(row)
    kind = index.kinds[i]
    if kind == TENSOR or kind == COMPOSITE:
        node = index.nodes[i]
        if node.kind == "numpy" and "device" not in (node.extra or {}):  # type: ignore[attr-defined]
            return ckpt.numpy(index.keys[i]).copy()  # a numpy array pickled in the checkpoint stays one
        return build_tensor(ckpt, index.keys[i], map_location, dtype, mmap)
    if kind == LEAF:
        return to_plain(ckpt, index.nodes[i], map_location, dtype)
    children = index.children(i)
    if kind == DICT:
        out: Any = OrderedDict() if isinstance(index.nodes[i], PickledOrderedDict) else {}
        for c in children:
            out[index.names[c]] = entry_value(ckpt, c, map_location, dtype, mmap)
        return out
    if kind in (LIST, TUPLE, SET):
        vals = [entry_value(ckpt, c, map_location, dtype, mmap) for c in children]
        return tuple(vals) if kind == TUPLE else (set(vals) if kind == SET else vals)
    if kind == OPAQUE:
        return to_plain(ckpt, index.nodes[i], map_location, dtype)
    raise CkptfsError(f"cannot materialise a {kind}", file=ckpt.name, record=index.keys[i])


def to_plain(ckpt: "Checkpoint", v: Any, map_location: Any, dtype: torch.dtype | None, depth: int = 0) -> Any:
    """Inert pickle objects as plain values: dtype/device markers as torch objects, opaque objects as
    :class:`OpaqueValue`, containers recursively (bounded by the index's depth limit)."""
    if depth > ckpt.limits.max_depth:
        raise CkptfsError("value nests too deeply to materialise", file=ckpt.name)
    if isinstance(v, (Call, NumpyArray, NumpyScalar, StorageRef)):  # recorded calls and pickled data
        _kind, v = classify(v, ckpt.converter)
    if isinstance(v, TorchDType):
        return torch_dtype(v.dtype.name)
    if isinstance(v, TorchDevice):
        return torch.device(v.spec)
    if isinstance(v, TorchGlobal):
        attr = getattr(torch, v.qualname.rsplit(".", 1)[-1], None) if v.qualname.startswith("torch.") else None
        return attr if attr is not None else v.qualname
    if isinstance(v, TensorNode):
        row = next((i for i, n in enumerate(ckpt.index.nodes) if n is v), None)
        if row is not None:  # the same node is a row (composites, numpy arrays): as entry_value makes it
            return entry_value(ckpt, row, map_location, dtype)
        reader = ckpt.node_reader(v)
        if v.kind == "numpy" and "device" not in (v.extra or {}):  # a numpy array stays one (as entry_value)
            import numpy as np

            from ..dtypes import numpy_dtype

            arr = np.frombuffer(reader.read(), dtype=numpy_dtype(v.dtype, (v.extra or {}).get("byteorder", "little")))
            return arr.reshape(v.shape).copy()  # read() gives the logical C-order bytes
        return build_tensor_from_reader(ckpt, reader, map_location, dtype)
    if isinstance(v, OpaqueObject):
        f = lambda x: to_plain(ckpt, x, map_location, dtype, depth + 1)  # noqa: E731
        return OpaqueValue(type(v).qualname, tuple(f(a) for a in v.args), {k: f(x) for k, x in v.kwargs.items()},
                           f(v.state), None if v.items is None else {k: f(x) for k, x in v.items.items()},
                           None if v.list_items is None else [f(x) for x in v.list_items])
    if isinstance(v, type) and issubclass(v, OpaqueObject):
        return OpaqueValue(v.qualname)
    if isinstance(v, PickledOrderedDict):
        return OrderedDict((k, to_plain(ckpt, x, map_location, dtype, depth + 1)) for k, x in v.items())
    if type(v) is dict:
        return {k: to_plain(ckpt, x, map_location, dtype, depth + 1) for k, x in v.items()}
    if type(v) in (list, tuple, set, frozenset):
        return type(v)(to_plain(ckpt, x, map_location, dtype, depth + 1) for x in v)
    return v


def load(path: Any, map_location: Any = "cpu", dtype: torch.dtype | None = None, cache_tensors: bool = False,
         debug: bool = False, *, strict: bool = False, mmap: bool = True) -> Any:
    from ..model.checkpoint import Checkpoint

    ckpt = Checkpoint(path, strict=strict)
    if ckpt.index.kinds[0] == DICT:
        return LazyStateDict(ckpt, 0, map_location=map_location, dtype=dtype, cache_tensors=cache_tensors,
                             debug=debug, mmap=mmap)
    try:
        return entry_value(ckpt, 0, map_location, dtype, mmap)
    finally:
        ckpt.close()
