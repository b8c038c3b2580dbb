"""Interpreting the calls the unpickler recorded: torch's rebuild functions become typed nodes.

This is the one place that knows what ``_rebuild_tensor_v2(storage, offset, size, stride, ...)`` and its
relatives mean. Each call is turned into a :class:`TensorNode` (validated against its storage record)
or another inert value; a malformed call yields a tensor with ``error`` set, never an exception, so
one bad tensor does not stop a checkpoint from indexing. (Checking tensors against their records is
:func:`ckptfs.tensors.validate`, run once every storage is known.)
"""

from __future__ import annotations

import re

from ..dtypes import DTYPES, UINT8, DType
from ..errors import LimitError, brief
from ..limits import DEFAULT_LIMITS, Limits
from ..pickle.allowlist import LEGACY_TENSOR_CALLS, LEGACY_TENSOR_DTYPES
from ..pickle.nodes import (
    BUILT,
    Call,
    NumpyArray,
    NumpyDType,
    NumpyScalar,
    OpaqueObject,
    PersistentId,
    StorageRef,
    StorageType,
    StorageViewRef,
    TensorNode,
    TorchDevice,
    TorchDType,
    TorchGlobal,
)

U = "torch._utils."
MAX_CALL_NESTING = 32
#: Longest size/stride tuple looked at (torch's own limit is 64 dimensions; Limits.max_ndim applies later).
MAX_DIMS = 1024


def _show(v: object, n: int = 80) -> str:
    return brief(v, n)  # bounded: a pickled value may be a memo DAG whose full repr never ends


def _ascii(v: object) -> object:
    return v.decode("ascii", "backslashreplace") if isinstance(v, bytes) else v


class Converter:
    """Turns recorded calls into nodes; shared calls (pickle memo) convert once, to one node."""

    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        self.limits = limits
        self.refs: dict[str, StorageRef] = {}
        self._shapes: dict[tuple, tuple] = {}
        self.done: dict[int, object] = {}
        self._keep: list[object] = []  # converted calls stay alive so their id() is not reused
        self._depth = 0
        self.handlers = {
            U + "_rebuild_tensor_v2": self._v2,
            U + "_rebuild_tensor_v3": self._v3,
            U + "_rebuild_tensor": self._v1,
            U + "_rebuild_parameter": self._parameter,
            U + "_rebuild_parameter_with_state": self._parameter,
            U + "_rebuild_qtensor": self._qtensor,
            U + "_rebuild_meta_tensor_no_storage": self._meta,
            U + "_rebuild_sparse_tensor": self._sparse,
            U + "_rebuild_sparse_csr": self._sparse,
            U + "_rebuild_sparse_csr_tensor": self._sparse,  # torch 1.10 - 1.13 CSR tensors (gone from torch 2)
            U + "_rebuild_nested_tensor": self._nested,
            U + "_rebuild_wrapper_subclass": self._wrapper,
            U + "_rebuild_device_tensor_from_numpy": self._from_numpy,
            U + "_rebuild_xla_tensor": self._from_numpy,
            U + "_rebuild_device_tensor_from_cpu_tensor": self._from_cpu,
            "torch._tensor._rebuild_from_type_v2": self._from_type,
            "torch._tensor._rebuild_from_type": self._from_type,
            "torch.Size": self._size,
            "torch.device": self._device,
            "torch.serialization._get_layout": self._layout,
            "persistent_load": self._storage,
        }
        for cls in LEGACY_TENSOR_CALLS.values():
            self.handlers[cls.call] = self._legacy_tensor

    # --- entry point ------------------------------------------------------------------------------------
    def convert(self, call: Call) -> object:
        cid = id(call)
        done = self.done.get(cid)
        if done is not None:
            return done
        if self._depth >= MAX_CALL_NESTING:
            raise LimitError(f"rebuild calls nest deeper than {MAX_CALL_NESTING} levels")
        self._depth += 1
        try:
            name = type(call).call
            out = self.handlers.get(name, self._exotic)(call.args, name)
        finally:
            self._depth -= 1
        self.done[cid] = out
        self._keep.append(call)
        return out

    def numpy_array(self, arr: NumpyArray) -> "TensorNode | OpaqueObject":
        """A pickled numpy array as a node, once per array object (a memo may reference one many times)."""
        aid = id(arr)
        node = self.done.get(aid)
        if node is None:
            node = self.done[aid] = numpy_array_value(arr)
            self._keep.append(arr)
        return node  # type: ignore[return-value]

    def value(self, v: object) -> object:
        return self.convert(v) if isinstance(v, Call) else v

    # --- storages ------------------------------------------------------------------------------------
    def _storage(self, args: tuple, _name: str = "") -> StorageRef:
        """``('storage', StorageType, key, location, numel)`` (zip) or the legacy 6-tuple with a view slot."""
        pid = args[0] if len(args) == 1 else args
        if type(pid) is tuple and (len(pid) == 5 or len(pid) == 6 and pid[5] is None):  # the common case
            tag, stype, key, location, numel = pid[:5]
            if tag == "storage" and type(stype) is StorageType and type(key) is str and type(location) is str \
                    and type(numel) is int and numel >= 0:
                ref = self.refs.get(key)
                if ref is None:
                    ref = self.refs[key] = StorageRef(key, stype.dtype, numel, location, stype.name)
                    return ref
                if ref.dtype is stype.dtype and ref.numel == numel:
                    return ref
        return self._storage_slow(pid)

    def _storage_slow(self, pid: object) -> StorageRef:
        bad = _bad_pid(pid)
        if bad is not None:
            ref = StorageRef("?", None, 0, "?", "?")
            ref.error = bad
            return ref
        stype, key, location, numel = pid[1:5]  # type: ignore[index]
        key = _ascii(key)
        if type(key) is int:
            key = str(key)
        location = _ascii(location)
        ref = self.refs.get(key)
        if ref is None:
            ref = self.refs[key] = StorageRef(key, stype.dtype, numel, location, stype.name)
        elif not (ref.dtype is stype.dtype and ref.numel == numel):
            ref = None
        if ref is not None:
            if len(pid) == 6 and pid[5] is not None:  # type: ignore[arg-type]
                return self._storage_view(ref, pid[5], stype)  # type: ignore[index]
            return ref
        ref = self.refs[key]
        # torch.save refuses to write two dtypes viewing one storage; torch.load silently reinterprets
        # the first. Here the later references fail, each with the reason.
        other = StorageRef(key, stype.dtype, numel, location, stype.name)
        other.error = (f"storage {key!r} is referenced as {ref.typename}(numel={ref.numel}) and as "
                       f"{stype.name}(numel={numel})")
        return other

    def _storage_view(self, root: StorageRef, view: object, stype: StorageType) -> StorageRef:
        """Legacy view metadata ``(view_key, offset, size)`` (elements of the root's dtype): a storage that
        is a slice of ``root`` (old torch's storage views). The container resolves its record."""
        vkey = _ascii(view[0]) if type(view) is tuple and len(view) == 3 else None  # type: ignore[index]
        if type(vkey) is int:
            vkey = str(vkey)
        offset, size = (view[1], view[2]) if vkey is not None else (None, None)  # type: ignore[index]
        if type(vkey) is not str or type(offset) is not int or type(size) is not int or offset < 0 or size < 0:
            bad = StorageRef("?", root.dtype, 0, root.location, root.typename)
            bad.error = f"malformed legacy storage view {_show(view)}"
            return bad
        ref = self.refs.get(vkey)
        if ref is not None:
            if getattr(ref, "root", None) is root and ref.view_offset == offset and ref.numel == size:  # type: ignore[attr-defined]
                return ref
            bad = StorageRef(vkey, root.dtype, size, root.location, root.typename)
            bad.error = f"storage view {vkey!r} is declared twice, differently"
            return bad
        ref = self.refs[vkey] = StorageViewRef(vkey, root.dtype, size, root.location, stype.name)
        ref.root = root
        ref.view_offset = offset
        if root.error is not None:
            ref.error = root.error
        return ref

    # --- tensors -------------------------------------------------------------------------------------
    def _tensor(self, kind: str, storage: object, dtype: DType | None, offset: object, size: object,
                stride: object, requires_grad: object, metadata: object = None) -> TensorNode:
        if type(storage) is PersistentId:
            storage = self._storage(storage.args, "")
        else:
            storage = self.value(storage)
        error = None
        ref = storage if isinstance(storage, StorageRef) else None
        if ref is None:
            error = f"storage argument is {_show(storage)}, not a storage reference"
        elif dtype is None:
            dtype = ref.dtype or UINT8
        shape = _ints(self.value(size))
        strides = _ints(self.value(stride))
        if shape is None:
            size = self.value(size)
            too_many = type(size) in (tuple, list) and len(size) > MAX_DIMS  # type: ignore[arg-type]
            error = error or (f"{len(size)} dimensions (limit {MAX_DIMS})" if too_many  # type: ignore[arg-type]
                              else f"size is {_show(size)}, not a tuple of ints")
            shape = ()
        if strides is None:
            error = error or f"stride is {_show(stride)}, not a tuple of ints"
        elif len(strides) != len(shape):
            error = error or f"{len(shape)} sizes but {len(strides)} strides"
        if type(offset) is not int:
            error = error or f"storage offset is {_show(offset)}"
            offset = 0
        t = TensorNode(kind, ref, dtype or UINT8, shape, strides, offset, requires_grad is True,
                       metadata if type(metadata) is dict and metadata else None)
        if t.metadata:
            t.extra = {k: v for k, v in t.metadata.items() if isinstance(k, str)}
        t.error = error
        return t

    def v2(self, call: Call) -> TensorNode:
        """``_rebuild_tensor_v2`` with plain arguments, inlined: most tensors of every checkpoint.
        (Not memoised: a tensor call the pickle shares converts to equal nodes, one per reference.)"""
        a = call.args
        n = len(a)
        if n == 6 or n == 7:
            storage, offset, size, stride, requires_grad = a[0], a[1], a[2], a[3], a[4]
            if type(storage) is PersistentId and type(offset) is int and type(size) is tuple \
                    and type(stride) is tuple and len(size) == len(stride) and len(size) <= MAX_DIMS:
                for x in size:
                    if type(x) is not int:
                        break
                else:
                    for x in stride:
                        if type(x) is not int:
                            break
                    else:
                        ref = self._storage(storage.args)
                        metadata = a[6] if n == 7 else None
                        if metadata is not None and not (type(metadata) is dict and metadata):
                            metadata = None
                        # equal shapes/strides share one tuple (models repeat a few shapes many times;
                        # 112 bytes per tensor). Safe to hash: they hold only ints.
                        shapes = self._shapes
                        size = shapes.setdefault(size, size)
                        stride = shapes.setdefault(stride, stride)
                        t = TensorNode("dense", ref, ref.dtype or UINT8, size, stride, offset, requires_grad is True,
                                       metadata)
                        if metadata:
                            t.extra = {k: v for k, v in metadata.items() if isinstance(k, str)}
                        if ref.error is not None:
                            t.error = ref.error
                        return t
        return self.convert(call)  # type: ignore[return-value]

    def _v2(self, a: tuple, name: str) -> TensorNode:
        # (storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
        if 4 <= len(a) <= 7:
            return self._tensor("dense", a[0], None, a[1], a[2], a[3], a[4] if len(a) > 4 else False,
                                a[6] if len(a) > 6 else None)
        return self._bad_call(name, a)

    def _v3(self, a: tuple, name: str) -> TensorNode:
        # (storage, storage_offset, size, stride, requires_grad, backward_hooks, dtype[, metadata])
        if len(a) in (7, 8):
            dt = a[6]
            if not isinstance(dt, TorchDType):
                t = self._tensor("dense", a[0], None, a[1], a[2], a[3], a[4])
                t.error = t.error or f"dtype argument is {_show(dt)}"
                return t
            return self._tensor("dense", a[0], dt.dtype, a[1], a[2], a[3], a[4], a[7] if len(a) > 7 else None)
        return self._bad_call(name, a)

    def _v1(self, a: tuple, name: str) -> TensorNode:
        if len(a) == 4:
            return self._tensor("dense", a[0], None, a[1], a[2], a[3], False)
        return self._bad_call(name, a)

    def _legacy_tensor(self, a: tuple, name: str) -> TensorNode:
        """``torch.FloatTensor()`` + BUILD state, as torch < 0.4 pickled tensors (Tensor.__setstate__):
        4 items ``(storage, offset, size, stride)`` -> ``set_``; 5 items (a legacy Variable) -> its data
        ``state[0]`` with ``requires_grad = state[3]``."""
        if not (len(a) == 3 and a[0] is BUILT):
            return self._bad_call(name, a, f"{name}({_show(a)}) without the state old torch pickled with it")
        args, state = a[1], a[2]
        if args != ():
            return self._bad_call(name, a, f"{name} called with arguments {_show(args)}")
        if type(state) is tuple and len(state) == 4:
            storage, offset, size, stride = state
            want = LEGACY_TENSOR_DTYPES.get(name.rsplit(".", 1)[-1])
            t = self._tensor("dense", storage, None, offset, size, stride, False)
            if want is not None and t.error is None and t.dtype is not DTYPES[want]:
                t.error = f"{name} built on a {t.storage.typename}: set_() refuses a storage of another dtype"  # type: ignore[union-attr]
            return t
        if type(state) is tuple and len(state) == 5:
            data = self.value(state[0])
            if not isinstance(data, TensorNode):
                return self._bad_call(name, a, f"legacy Variable state holds {_show(data)}, not a tensor")
            t = data.copy()
            t.requires_grad = state[3] is True
            return t
        return self._bad_call(name, a, f"{name} BUILT with {_show(state)}: no storage to read")

    def _parameter(self, a: tuple, name: str) -> object:
        # (data, requires_grad, backward_hooks[, state])
        if len(a) < 2:
            return self._bad_call(name, a)
        data = self.value(a[0])
        if not isinstance(data, TensorNode):
            return self._bad_call(name, a, f"parameter data is {_show(data)}, not a tensor")
        t = data.copy()
        t.is_parameter = True
        t.requires_grad = a[1] is True
        state = a[3] if len(a) > 3 else None
        if state not in (None, {}, (None, None)):
            t.extra = dict(t.extra or {})
            t.extra["python_state"] = state  # kept as data; never set as attributes
        return t

    def _qtensor(self, a: tuple, name: str) -> TensorNode:
        """(storage, storage_offset, size, stride, quantizer_params, requires_grad, backward_hooks).

        Per-tensor: a strided tensor of the raw integers (qint8/quint8/qint32 as stored) with qscheme,
        scale and zero_point in ``extra``. Per-channel: a composite whose parts are ``int_repr`` (the raw
        integers), ``scales`` and ``zero_points`` (tensors of their own), with qscheme and axis in ``extra``."""
        if len(a) != 7:
            return self._bad_call(name, a)
        t = self._tensor("quantized", a[0], None, a[1], a[2], a[3], a[5])
        q = a[4]
        q = tuple(self.value(x) for x in q) if type(q) is tuple else q
        extra = t.extra = dict(t.extra or {})
        scheme = q[0] if type(q) is tuple and q else None
        scheme_name = scheme.qualname.removeprefix("torch.") if isinstance(scheme, TorchGlobal) else None
        extra["qscheme"] = scheme_name or _show(scheme)
        if t.error is None and not (t.dtype.quantized or t.storage is None):
            t.error = f"quantized tensor on a {t.storage.typename} (not a quantized storage)"  # type: ignore[union-attr]
        if scheme_name in ("per_tensor_affine", "per_tensor_symmetric") and len(q) == 3:
            scale, zero_point = q[1], q[2]
            if type(scale) in (float, int) and type(zero_point) is int:
                extra["scale"] = float(scale)
                extra["zero_point"] = zero_point
                return t
        elif scheme_name in ("per_channel_affine", "per_channel_symmetric", "per_channel_affine_float_qparams") \
                and len(q) == 4:
            scales, zero_points, axis = q[1], q[2], q[3]
            if isinstance(scales, TensorNode) and isinstance(zero_points, TensorNode) and type(axis) is int:
                extra["axis"] = axis
                return self._per_channel(t, scales, zero_points, axis)
        t.error = t.error or f"quantizer parameters {_show(q)} are not ones torch writes"
        return t

    def _per_channel(self, t: TensorNode, scales: TensorNode, zero_points: TensorNode, axis: int) -> TensorNode:
        ints = t.copy()
        ints.kind, ints.extra = "dense", None
        int_dtype = _QUANT_INT.get(t.dtype.name)
        if int_dtype is None:  # quint4x2 / quint2x4 pack several values per byte: keep them as stored
            ints.kind = "quantized"
        else:
            ints.dtype = DTYPES[int_dtype]
        comp = TensorNode("quantized", None, t.dtype, t.shape, None, 0, t.requires_grad)
        comp.extra = dict(t.extra or {})
        comp.extra["device"] = t.storage.location if t.storage is not None else None
        comp.parts = (("int_repr", ints), ("scales", scales), ("zero_points", zero_points))
        n = t.shape[axis] if 0 <= axis < len(t.shape) else None
        if n is None:
            comp.error = f"per-channel axis {axis} is out of range for shape {t.shape}"
        elif scales.shape != (n,) or zero_points.shape != (n,):
            comp.error = (f"per-channel scales {scales.shape} / zero points {zero_points.shape} do not match "
                          f"the {n} channels of axis {axis}")
        comp.error = comp.error or t.error
        return comp

    def _meta(self, a: tuple, name: str) -> TensorNode:
        # (dtype, size, stride, requires_grad)
        if len(a) != 4:
            return self._bad_call(name, a)
        dt, size, stride, rg = a
        shape, strides = _ints(self.value(size)), _ints(self.value(stride))
        t = TensorNode("meta", None, dt.dtype if isinstance(dt, TorchDType) else UINT8, shape or (), strides, 0,
                       rg is True)
        if not isinstance(dt, TorchDType) or shape is None or strides is None \
                or len(strides) != len(shape) or any(x < 0 for x in shape):
            t.error = f"malformed meta tensor {_show(a)}"
        t.extra = {"device": "meta", "data": "none: a meta tensor has a shape and a dtype but no data"}
        return t

    def _sparse(self, a: tuple, name: str) -> TensorNode:
        """``_rebuild_sparse_tensor(layout, data)``: COO ``(indices, values, size[, is_coalesced])``,
        compressed (CSR/CSC/BSR/BSC) ``(compressed_indices, plain_indices, values, size)``. A composite
        whose parts are the component tensors, named as torch's accessors (indices(), crow_indices(), ...)."""
        if len(a) != 2 or type(a[1]) is not tuple:
            return self._bad_call(name, a)
        layout = self.value(a[0])
        lname = layout.qualname.removeprefix("torch.") if isinstance(layout, TorchGlobal) else None
        data = tuple(self.value(x) for x in a[1])
        names = _SPARSE_PARTS.get(lname or "")
        t = TensorNode("sparse", None, UINT8, (), None, 0)
        t.extra = {"layout": lname or _show(layout)}
        if names is None:
            t.error = f"sparse layout {_show(layout)} is not one torch writes"
            return t
        n = len(names)
        if not (len(data) == n + 1 or lname == "sparse_coo" and len(data) == n + 2):
            t.error = f"{lname} tensor data has {len(data)} items"
            return t
        parts, size = data[:n], data[n]
        if not all(isinstance(p, TensorNode) for p in parts):
            t.error = f"{lname} components are not all tensors: {_show(parts)}"
            return t
        shape = _ints(size)
        values: TensorNode = parts[-1]  # type: ignore[assignment]
        t.dtype, t.shape = values.dtype, shape or ()
        t.requires_grad = values.requires_grad
        t.parts = tuple(zip(names, parts))
        t.extra["nnz"] = values.shape[0] if values.shape else 0
        t.extra["device"] = values.storage.location if values.storage is not None else None
        if lname == "sparse_coo":
            idx: TensorNode = parts[0]  # type: ignore[assignment]
            t.extra["sparse_dim"] = idx.shape[0] if len(idx.shape) == 2 else None
            t.extra["dense_dim"] = len(values.shape) - 1
            t.extra["is_coalesced"] = data[3] if len(data) == 4 and type(data[3]) is bool else None
        elif lname in ("sparse_bsr", "sparse_bsc") and len(values.shape) >= 3:
            t.extra["blocksize"] = list(values.shape[1:3])
        if shape is None:
            t.error = f"dense size {_show(size)} is not a tuple of ints"
        else:
            t.error = _sparse_problem(lname, parts, shape)  # type: ignore[arg-type]
        return t

    def _nested(self, a: tuple, name: str) -> TensorNode:
        """``_rebuild_nested_tensor(buffer, sizes, strides, storage_offsets)``: a composite of the flat buffer
        and three int64 tensors (one row per constituent tensor)."""
        if len(a) != 4:
            return self._bad_call(name, a)
        buffer, sizes, strides, offsets = (self.value(x) for x in a)
        t = TensorNode("nested", None, UINT8, (), None, 0)
        t.extra = {"layout": "strided"}
        if not all(isinstance(p, TensorNode) for p in (buffer, sizes, strides, offsets)):
            t.error = f"nested tensor components are not all tensors: {_show(a)}"
            return t
        t.dtype = buffer.dtype
        t.requires_grad = buffer.requires_grad
        n = sizes.shape[0] if len(sizes.shape) >= 1 else 0
        t.shape = (n,)
        t.extra.update({"tensors": n, "ndim": 1 + (sizes.shape[1] if len(sizes.shape) == 2 else 0),
                        "device": buffer.storage.location if buffer.storage is not None else None})
        t.parts = (("buffer", buffer), ("sizes", sizes), ("strides", strides), ("offsets", offsets))
        if len(buffer.shape) != 1 or len(sizes.shape) != 2 or strides.shape != sizes.shape \
                or offsets.shape != (n,):
            t.error = (f"nested tensor parts have shapes buffer {buffer.shape}, sizes {sizes.shape}, "
                       f"strides {strides.shape}, offsets {offsets.shape}")
        return t

    def _wrapper(self, a: tuple, name: str) -> TensorNode:
        """``_rebuild_wrapper_subclass(cls, dtype, size, stride, storage_offset, layout, device,
        requires_grad)``: a tensor subclass with no storage of its own: metadata only."""
        if len(a) != 8:
            return self._bad_call(name, a)
        cls, dt, size, stride, offset, layout, device, rg = (self.value(x) for x in a)
        shape, strides = _ints(size), _ints(stride)
        t = TensorNode("wrapper", None, dt.dtype if isinstance(dt, TorchDType) else UINT8, shape or (), strides,
                       offset if type(offset) is int else 0, rg is True)
        t.extra = {"subclass": getattr(cls, "qualname", _show(cls)),
                   "layout": layout.qualname.removeprefix("torch.") if isinstance(layout, TorchGlobal) else _show(layout),
                   "device": device.spec if isinstance(device, TorchDevice) else _show(device),
                   "data": "none: a wrapper subclass without storage (metadata only)"}
        if not isinstance(dt, TorchDType) or shape is None or strides is None or len(shape) != len(strides):
            t.error = f"malformed wrapper subclass {_show(a)}"
        return t

    def _from_numpy(self, a: tuple, name: str) -> TensorNode:
        """``_rebuild_device_tensor_from_numpy(data, dtype, device, requires_grad)`` (XLA / MTIA tensors of
        torch < 2.1, and ``_rebuild_xla_tensor``): the data is a numpy array inside the pickle."""
        if len(a) != 4:
            return self._bad_call(name, a)
        data, dt, device, rg = a[0], self.value(a[1]), self.value(a[2]), a[3]
        if type(data) is not NumpyArray:
            return self._bad_call(name, a, f"device tensor data is {_show(data)}, not a numpy array")
        t = self.numpy_array(data)
        if not isinstance(t, TensorNode):
            return self._bad_call(name, a, "device tensor data is a numpy object array")
        t = t.copy()
        t.requires_grad = rg is True
        t.extra = dict(t.extra or {})
        t.extra["device"] = device.spec if isinstance(device, TorchDevice) else _ascii(device)
        if isinstance(dt, TorchDType) and dt.dtype is not t.dtype and t.error is None and t.unsupported is None:
            t.unsupported = f"numpy data of dtype {t.dtype.name} that torch converts to {dt.dtype.name} when loading"
        return t

    def _from_cpu(self, a: tuple, name: str) -> object:
        """``_rebuild_device_tensor_from_cpu_tensor(data, dtype, device, requires_grad)`` (XLA / MTIA /
        PrivateUse1 tensors): a CPU tensor moved to ``device`` when loading: served from the CPU tensor."""
        if len(a) != 4:
            return self._bad_call(name, a)
        data, dt, device, rg = self.value(a[0]), self.value(a[1]), self.value(a[2]), a[3]
        if not isinstance(data, TensorNode):
            return self._bad_call(name, a, f"device tensor data is {_show(data)}, not a tensor")
        t = data.copy()
        t.requires_grad = rg is True
        t.extra = dict(t.extra or {})
        t.extra["device"] = device.spec if isinstance(device, TorchDevice) else _ascii(device)
        if isinstance(dt, TorchDType) and dt.dtype is not t.dtype and t.error is None:
            t.unsupported = f"data of dtype {t.dtype.name} that torch converts to {dt.dtype.name} when loading"
        return t

    def _from_type(self, a: tuple, name: str) -> object:
        # (func, new_type, args, state): a tensor subclass; func is itself a recorded rebuild call class
        if len(a) != 4 or not isinstance(a[2], tuple):
            return self._bad_call(name, a)
        func, new_type, args, state = a
        if not (isinstance(func, type) and issubclass(func, Call)):
            return self._bad_call(name, a, f"rebuild function is {_show(func)}")
        inner = self.convert(func(*args))
        if not isinstance(inner, TensorNode):
            return inner
        t = inner.copy()
        t.extra = dict(t.extra or {})
        qual = getattr(new_type, "qualname", None)
        if qual not in (None, "torch.Tensor", "torch._tensor.Tensor", "torch.nn.parameter.Parameter"):
            t.extra["subclass"] = qual
        if qual == "torch.nn.parameter.Parameter":
            t.is_parameter = True
        if state not in (None, {}):
            t.extra["python_state"] = state
        return t

    def _exotic(self, a: tuple, name: str) -> TensorNode:
        """Rebuild calls ckptfs does not interpret (mkldnn, unknown future ones): indexed, with why."""
        kind = "mkldnn" if name == U + "_rebuild_mkldnn_tensor" else "unknown"
        t = TensorNode(kind, None, UINT8, (), None, 0)
        t.extra = {"call": name, "args": tuple(self.value(x) for x in a)}
        t.unsupported = f"{name} tensors are indexed but their bytes are not served"
        return t

    def _bad_call(self, name: str, a: tuple, why: str | None = None) -> TensorNode:
        t = TensorNode("dense", None, UINT8, (), None, 0)
        t.error = why or f"{name} called with {len(a)} arguments: {_show(a)}"
        return t

    # --- small values --------------------------------------------------------------------------------
    def _size(self, a: tuple, name: str) -> object:
        if len(a) == 1 and _ints(a[0]) is not None:
            return tuple(a[0])
        return _opaque_value(name, a)

    def _device(self, a: tuple, name: str) -> object:
        if len(a) == 1 and isinstance(a[0], str):
            return TorchDevice(a[0])
        if len(a) == 2 and isinstance(a[0], str) and type(a[1]) is int:
            return TorchDevice(f"{a[0]}:{a[1]}")
        return _opaque_value(name, a)

    def _layout(self, a: tuple, name: str) -> object:
        if len(a) == 1 and isinstance(a[0], str) and a[0].startswith("torch."):
            return TorchGlobal(a[0])
        return _opaque_value(name, a)


_QUANT_INT = {"qint8": "int8", "quint8": "uint8", "qint32": "int32"}
_SPARSE_PARTS = {
    "sparse_coo": ("indices", "values"),
    "sparse_csr": ("crow_indices", "col_indices", "values"),
    "sparse_bsr": ("crow_indices", "col_indices", "values"),
    "sparse_csc": ("ccol_indices", "row_indices", "values"),
    "sparse_bsc": ("ccol_indices", "row_indices", "values"),
}


def _sparse_problem(layout: str, parts: tuple, shape: tuple) -> str | None:
    """The shape invariants torch checks when it validates a loaded sparse tensor (the cheap ones: no
    index values are read at index time)."""
    values: TensorNode = parts[-1]
    if layout == "sparse_coo":
        idx: TensorNode = parts[0]
        if len(idx.shape) != 2 or not values.shape or idx.shape[1] != values.shape[0]:
            return f"indices {idx.shape} and values {values.shape} do not agree on the number of entries"
        if idx.shape[0] + len(values.shape) - 1 != len(shape):
            return f"{idx.shape[0]} sparse + {len(values.shape) - 1} dense dims for a size of {len(shape)} dims"
        return None
    ci, pi = parts[0], parts[1]
    if len(ci.shape) < 1 or len(pi.shape) < 1 or not values.shape or pi.shape[-1] != values.shape[0]:
        return f"compressed {ci.shape}, plain {pi.shape} and values {values.shape} indices do not agree"
    return None


def _opaque_value(name: str, args: tuple) -> OpaqueObject:
    from ..pickle.allowlist import opaque_call

    return opaque_call(name, args)


def _ints(v: object) -> tuple | None:
    """A tuple of ints (sizes, strides), or None. Sequences longer than MAX_DIMS are not looked at: one
    memo-shared 10^5-item tuple given to 10^4 tensors would otherwise cost 10^9 steps."""
    if (type(v) is tuple or type(v) is list) and len(v) <= MAX_DIMS:  # type: ignore[arg-type]
        for x in v:  # type: ignore[attr-defined]
            if type(x) is not int:
                return None
        return tuple(v)  # type: ignore[arg-type]
    return None



def _bad_pid(pid: object) -> str | None:
    if type(pid) is not tuple or len(pid) not in (5, 6):  # type: ignore[arg-type]
        return f"persistent id {_show(pid)} is not a storage reference"
    if _ascii(pid[0]) != "storage":  # type: ignore[index]
        return f"persistent id of type {_show(pid[0])} is not a storage"  # type: ignore[index]
    stype, key, location, numel = pid[1:5]  # type: ignore[index]
    if type(stype) is not StorageType:
        return f"persistent id names {_show(stype)} as its storage type"
    key = _ascii(key)
    if not (type(key) is str or type(key) is int) or not isinstance(_ascii(location), str):
        return f"malformed storage reference {_show(pid)}"
    if type(numel) is not int or numel < 0:
        return f"storage {key!r} declares {_show(numel)} elements"
    return None


# --- values whose data lives in the pickle ---------------------------------------------------------------

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
        acc *= shape[d]
    t.stride = tuple(stride)
    t.extra["inline"] = bytes(raw)
    return t


def numpy_array_value(arr: NumpyArray) -> "TensorNode | OpaqueObject":
    """A pickled numpy array: a tensor served from its inline bytes, or, for an object array (whose items
    are Python objects, perhaps tensors), an opaque ``numpy.ndarray`` whose children are its items."""
    st = getattr(arr, "state", None)
    if isinstance(st, tuple) and len(st) == 5 and isinstance(st[4], list):
        from ..pickle.nodes import opaque_class

        cls = opaque_class("numpy.ndarray")
        obj = cls.__new__(cls)
        obj.how = "numpy._reconstruct"
        dt = st[2]
        obj.state = {"shape": st[1], "dtype": _numpy_dtype_fields(dt)[0] or _show(dt),
                     "fortran_order": bool(st[3])}
        obj.list_items = st[4]
        return obj
    return numpy_array_node(arr)


def storage_as_tensor(ref: StorageRef) -> TensorNode:
    """A storage saved on its own (``torch.save(t.untyped_storage())``): served as a 1-D tensor of it."""
    dtype = ref.dtype or DTYPES["uint8"]
    t = TensorNode("dense", ref, dtype, (ref.numel,), (1,), 0)
    t.extra = {"storage": ref.typename}
    t.error = ref.error
    return t


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

    from ..dtypes import numpy_dtype

    return np.frombuffer(raw, dtype=numpy_dtype(dtype, order))[0].item()


def _numpy_dtype_fields(dt: object) -> tuple[object, bool]:
    """(type code, big-endian?) of a pickled numpy dtype; slots NEWOBJ left unset read as missing."""
    if not isinstance(dt, NumpyDType):
        return None, False
    st = getattr(dt, "state", None)
    big = isinstance(st, tuple) and len(st) > 1 and st[1] == ">"
    return getattr(dt, "code", None), big
