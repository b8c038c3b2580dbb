"""Everything that needs torch: building torch tensors and the lazy state_dict (``ckptfs.load``).

Imported only when a torch object is asked for; the index, the CLI's ls/info and the mount never
import this module.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from ..dtypes import numpy_dtype
from ..errors import CkptfsError, UnsupportedError, brief
from ..model.catalog import Catalog
from ..model.index import COMPOSITE, DICT, LEAF, LIST, OPAQUE, SET, TENSOR, TUPLE, classify
from ..model.reader import TensorData
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


def _read_into_tensor(r: TensorData, out: torch.Tensor) -> None:
    """Fill a contiguous tensor with the reader's bytes (straight into its memory, no extra copy)."""
    if r.size == 0:
        return
    flat = out.reshape(-1).view(torch.uint8)
    buf = flat.numpy().data
    r.readinto(buf, 0)


def _byteswap(out: torch.Tensor, itemsize: int, is_complex: bool) -> None:
    unit = itemsize // 2 if is_complex else itemsize
    if unit <= 1 or out.numel() == 0:
        return
    arr = out.reshape(-1).view(torch.uint8).numpy().reshape(-1, unit)
    arr[...] = arr[:, ::-1].copy()


def build_tensor(catalog: Catalog, row: int, map_location: Any = "cpu", dtype: torch.dtype | None = None,
                 mmap: bool = True) -> torch.Tensor:
    """The tensor at ``row`` as torch.load returns it."""
    if catalog.index.kinds[row] == COMPOSITE:
        return build_composite(catalog, row, map_location, dtype, mmap)
    return tensor_of(catalog, catalog.data(row), row, map_location, dtype, mmap)


#: torch dtype of the raw integers of each quantized dtype (what ``int_repr()`` returns)
_QUANT_INT = {"qint8": torch.int8, "quint8": torch.uint8, "qint32": torch.int32}


def build_composite(catalog: Catalog, row: int, map_location: Any = "cpu", dtype: torch.dtype | None = None,
                    mmap: bool = True) -> torch.Tensor:
    """A sparse, nested or per-channel quantized tensor from its parts, as torch.load rebuilds it."""
    index = catalog.index
    t: TensorNode = index.nodes[row]  # type: ignore[assignment]
    key = index.keys[row]
    if t.error:
        raise CkptfsError(t.error, file=catalog.name, record=key)
    parts = {index.names[c]: build_tensor(catalog, index.resolve(c), map_location, None, mmap)
             for c in index.children(row)}
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
    elif t.kind == "nested" and extra.get("layout") == "jagged":
        out = torch.nested.nested_tensor_from_jagged(parts["values"], parts["offsets"], lengths=parts.get("lengths"),
                                                     jagged_dim=extra["ragged_idx"])
    elif t.kind == "nested":
        out = torch._nested_view_from_buffer(parts["buffer"].contiguous(), parts["sizes"], parts["strides"],
                                             parts["offsets"])
    elif t.kind == "quantized":
        out = torch._make_per_channel_quantized_tensor(parts["int_repr"], parts["scales"], parts["zero_points"],
                                                       extra["axis"])
    else:
        raise UnsupportedError(f"{t.kind} composite tensors cannot be built", file=catalog.name, record=key)
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
    if tensor.is_nested and tensor.layout == torch.jagged:
        # the tensors the pickle holds (values() would be a view that requires grad with the NestedTensor)
        return getattr(tensor, {"values": "_values", "offsets": "_offsets", "lengths": "_lengths"}[name])
    if tensor.is_nested:
        return {"buffer": tensor.values, "sizes": tensor._nested_tensor_size,
                "strides": tensor._nested_tensor_strides, "offsets": tensor._nested_tensor_storage_offsets}[name]()
    if tensor.layout == torch.sparse_coo:
        return {"indices": tensor._indices, "values": tensor._values}[name]()
    return getattr(tensor, name)()  # crow_indices, col_indices, ccol_indices, row_indices, values


def _mapped(catalog: Catalog, r: TensorData, tdt: torch.dtype) -> torch.Tensor | None:
    """A copy-on-write view of the file for a tensor stored as one range in native byte order."""
    mapped = catalog.mapped(r)
    if mapped is None:
        return None
    buf, offset = mapped
    try:
        flat = torch.frombuffer(buf, dtype=tdt, count=r.size // r.t.dtype.itemsize, offset=offset)
    except (ValueError, TypeError, RuntimeError):  # a dtype frombuffer does not take
        return None
    return flat.reshape(r.t.shape)


def tensor_from_data(r: TensorData, byteorder: str) -> torch.Tensor:
    """A new contiguous torch tensor holding ``r``'s bytes (a slice's, say), in native byte order."""
    out = torch.empty(r.t.shape, dtype=torch_dtype(r.t.dtype.name))
    _read_into_tensor(r, out)
    if byteorder != sys.byteorder:
        _byteswap(out, r.t.dtype.itemsize, r.t.dtype.name.startswith("complex"))
    return out


def tensor_of(catalog: Catalog, r: TensorData, row: int = 0, map_location: Any = "cpu",
              dtype: torch.dtype | None = None, mmap: bool = False) -> torch.Tensor:
    """The torch tensor for a tensor's bytes ``r`` (row ``row``: its file's byte order), as torch.load
    would build it: Parameter-ness, requires_grad, conj/neg bits, device."""
    t: TensorNode = r.t
    name = catalog.name
    extra = t.extra or {}
    if t.kind == "meta":  # torch.load makes it on the meta device whatever map_location says
        assert t.stride is not None  # (a meta tensor without strides has an error: TensorData refused it)
        return torch.empty_strided(t.shape, t.stride, dtype=torch_dtype(t.dtype.name), device="meta",
                                   requires_grad=t.requires_grad)
    if t.kind == "wrapper":
        raise UnsupportedError(f"a {extra.get('subclass')} wrapper subclass has no storage and ckptfs does not "
                               "import its class: metadata only (see Checkpoint.meta)", file=name, record=r.key)
    if t.kind == "quantized" and t.unsupported is None:
        int_dtype = _QUANT_INT.get(t.dtype.name)
        if int_dtype is None or "scale" not in extra:
            raise UnsupportedError(f"{t.dtype.name} tensors ({extra.get('qscheme')}) cannot be built as torch tensors",
                                   file=name, record=r.key)
        ints = torch.empty(t.shape, dtype=int_dtype)
        _read_into_tensor(r, ints)
        if catalog.byteorder_of(t, row) != sys.byteorder and t.dtype.itemsize > 1:
            _byteswap(ints, t.dtype.itemsize, False)
        return torch._make_per_tensor_quantized_tensor(ints, extra["scale"], extra["zero_point"])
    if t.unsupported is not None:
        raise UnsupportedError(t.unsupported, file=name, record=r.key)
    if t.kind not in ("dense", "numpy"):
        raise UnsupportedError(f"{t.kind} tensors cannot be built as torch tensors", file=name, record=r.key)
    tdt = torch_dtype(t.dtype.name)
    order = catalog.byteorder_of(t, row)
    native = order == sys.byteorder or t.dtype.itemsize == 1
    out = _mapped(catalog, r, tdt) if mmap and native else None
    if out is None:
        out = torch.empty(t.shape, dtype=tdt)
        _read_into_tensor(r, out)
        if not native:
            _byteswap(out, t.dtype.itemsize, t.dtype.name.startswith("complex"))
    if t.metadata:
        try:  # conj / neg bits, as torch.load sets them
            torch._utils.set_tensor_metadata(out, dict(t.metadata))
        except (TypeError, RuntimeError) as e:  # what torch.load would refuse too
            raise UnsupportedError(f"tensor metadata {brief(t.metadata)} is refused by torch "
                                   f"({type(e).__name__})", file=name, record=r.key) from None
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
        _set_state(catalog, row, out, extra["python_state"], map_location, dtype)
    return out


def _set_state(catalog: Catalog, row: int, out: torch.Tensor, state: Any, map_location: Any, dtype: Any) -> None:
    """Python attributes a Parameter / tensor subclass carried (``_rebuild_parameter_with_state``,
    ``_rebuild_from_type_v2``), set as torch.load sets them, as plain data only; names that are not plain
    identifiers, dunders, or that torch.Tensor itself has (``data``, ``grad`` ...) are not set."""
    if isinstance(state, tuple) and len(state) == 2:  # (dict state, slots state)
        merged: dict[Any, Any] = {}
        for part in state:
            if isinstance(part, dict):
                merged.update(part)
        state = merged
    if not isinstance(state, dict):
        return
    for name, value in state.items():
        if isinstance(name, str) and name.isidentifier() and not name.startswith("__") \
                and not hasattr(torch.Tensor, name):
            setattr(out, name, to_plain(catalog, row, value, map_location, dtype))


@dataclass(frozen=True)
class OpaqueValue:
    """An object of a class ckptfs did not import: its qualified name and the data it was built from."""

    qualname: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    state: Any = None
    items: dict[Any, Any] | None = None
    list_items: list[Any] | None = None


def entry_value(catalog: Catalog, row: int, map_location: Any, dtype: torch.dtype | None,
                mmap: bool = True) -> Any:
    """Materialise an index row as plain Python / torch objects (containers recursively)."""
    index = catalog.index
    i = index.resolve(row)
    kind = index.kinds[i]
    if kind == TENSOR or kind == COMPOSITE:
        node = index.nodes[i]
        if node.kind == "numpy" and "device" not in (node.extra or {}):  # type: ignore[attr-defined]
            return _numpy_value(catalog, catalog.data(i), i)  # a numpy array pickled in the checkpoint stays one
        return build_tensor(catalog, i, map_location, dtype, mmap)
    if kind == LEAF or kind == OPAQUE:
        return to_plain(catalog, i, index.nodes[i], map_location, dtype)
    children = index.children(i)
    if kind == DICT:
        out: Any = OrderedDict() if isinstance(index.nodes[i], PickledOrderedDict) else {}
        for c in children:
            out[index.names[c]] = entry_value(catalog, c, map_location, dtype, mmap)
        return out
    if kind in (LIST, TUPLE, SET):
        vals = [entry_value(catalog, c, map_location, dtype, mmap) for c in children]
        return tuple(vals) if kind == TUPLE else (set(vals) if kind == SET else vals)
    raise CkptfsError(f"cannot materialise a {kind}", file=catalog.name, record=index.keys[i])


def _numpy_value(catalog: Catalog, r: TensorData, row: int) -> Any:
    """A numpy array pickled in the checkpoint, as a writable numpy array (as torch.load gives it)."""
    import numpy as np

    arr = np.frombuffer(r.read(), dtype=numpy_dtype(r.t.dtype, catalog.byteorder_of(r.t, row)))
    return arr.reshape(r.t.shape).copy()  # read() gives the logical C-order bytes


def to_plain(catalog: Catalog, row: int, v: Any, map_location: Any, dtype: torch.dtype | None, depth: int = 0) -> Any:
    """Inert pickle objects (found under row ``row``) as plain values: dtype/device markers as torch objects,
    opaque objects as :class:`OpaqueValue`, containers recursively (bounded by the index's depth limit)."""
    if depth > catalog.limits.max_depth:
        raise CkptfsError("value nests too deeply to materialise", file=catalog.name)
    if isinstance(v, (Call, NumpyArray, NumpyScalar, StorageRef)):  # recorded calls and pickled data
        _kind, v = classify(v, catalog.converter_of(row))
    if isinstance(v, TorchDType):
        return torch_dtype(v.dtype.name)
    if isinstance(v, TorchDevice):
        return torch.device(v.spec)
    if isinstance(v, TorchGlobal):
        attr = getattr(torch, v.qualname.rsplit(".", 1)[-1], None) if v.qualname.startswith("torch.") else None
        return attr if attr is not None else v.qualname
    if isinstance(v, TensorNode):
        node_row = next((i for i, n in enumerate(catalog.index.nodes) if n is v), None)
        if node_row is not None:  # the same node is a row (composites, numpy arrays): as entry_value makes it
            return entry_value(catalog, node_row, map_location, dtype)
        r = catalog.node_data(v)
        if v.kind == "numpy" and "device" not in (v.extra or {}):  # a numpy array stays one (as entry_value)
            return _numpy_value(catalog, r, row)
        return tensor_of(catalog, r, row, map_location, dtype)

    def f(x: Any) -> Any:
        return to_plain(catalog, row, x, map_location, dtype, depth + 1)

    if isinstance(v, OpaqueObject):
        return OpaqueValue(type(v).qualname, tuple(f(a) for a in v.args), {k: f(x) for k, x in v.kwargs.items()},
                           f(v.state), None if v.items is None else {k: f(x) for k, x in v.items.items()},
                           None if v.list_items is None else [f(x) for x in v.list_items])
    if isinstance(v, type) and issubclass(v, OpaqueObject):
        return OpaqueValue(v.qualname)
    if isinstance(v, PickledOrderedDict):
        return OrderedDict((k, f(x)) for k, x in v.items())
    if type(v) is dict:
        return {k: f(x) for k, x in v.items()}
    if type(v) in (list, tuple, set, frozenset):
        return type(v)(f(x) for x in v)
    return v
