"""Tensors that are not one dense strided view: quantized, sparse, nested, meta, wrapper subclasses, device
tensors. Each becomes a node that says what it is; those made of other tensors are composites of parts."""

from __future__ import annotations

from typing import Any, cast

from ...dtypes import DTYPES, UINT8
from ...pickle.nodes import (
    NumpyArray,
    TensorNode,
    TorchDevice,
    TorchDType,
    TorchGlobal,
)
from .common import U, ascii_text, int_tuple, show
from .dense import DenseConverter


class ExoticConverter(DenseConverter):
    """Quantized, sparse, nested, meta, wrapper-subclass and device (XLA / MTIA) tensors, and unknown calls."""

    def _qtensor(self, a: tuple[Any, ...], name: str) -> TensorNode:
        """(storage, storage_offset, size, stride, quantizer_params, requires_grad, backward_hooks).

        Per-tensor: a strided tensor of the raw integers (qint8/quint8/qint32 as stored) with qscheme,
        scale and zero_point in ``extra``. Per-channel: a composite whose parts are ``int_repr`` (the raw
        integers), ``scales`` and ``zero_points`` (tensors of their own), with qscheme and axis in ``extra``."""
        if len(a) != 7:
            return self._bad_call(name, a)
        t = self._tensor("quantized", a[0], None, a[1], a[2], a[3], a[5])
        per_byte = _PACKED.get(t.dtype.name)
        if per_byte is not None and t.error is None:
            # torch pads each row to whole bytes (shape [r, c] holds r * ceil(c / per_byte) bytes): no strided view
            t.unsupported = (f"{t.dtype.name} packs {per_byte} values per byte (rows padded to whole bytes): "
                             "indexed, but its bytes are not served")
        q = a[4]
        q = tuple(self.value(x) for x in q) if type(q) is tuple else q
        extra = t.extra = dict(t.extra or {})
        scheme = q[0] if type(q) is tuple and q else None
        scheme_name = scheme.qualname.removeprefix("torch.") if isinstance(scheme, TorchGlobal) else None
        extra["qscheme"] = scheme_name or show(scheme)
        if t.error is None and not (t.dtype.quantized or t.storage is None):
            t.error = f"quantized tensor on a {t.storage.typename} (not a quantized storage)"
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
        t.error = t.error or f"quantizer parameters {show(q)} are not ones torch writes"
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

    def _meta(self, a: tuple[Any, ...], name: str) -> TensorNode:
        # (dtype, size, stride, requires_grad)
        if len(a) != 4:
            return self._bad_call(name, a)
        dt, size, stride, rg = a
        shape, strides = int_tuple(self.value(size)), int_tuple(self.value(stride))
        t = TensorNode("meta", None, dt.dtype if isinstance(dt, TorchDType) else UINT8, shape or (), strides, 0,
                       rg is True)
        if not isinstance(dt, TorchDType) or shape is None or strides is None \
                or len(strides) != len(shape) or any(x < 0 for x in shape):
            t.error = f"malformed meta tensor {show(a)}"
        t.extra = {"device": "meta", "data": "none: a meta tensor has a shape and a dtype but no data"}
        return t

    def _sparse(self, a: tuple[Any, ...], name: str) -> TensorNode:
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
        t.extra = {"layout": lname or show(layout)}
        if names is None or lname is None:  # (lname None: names None too)
            t.error = f"sparse layout {show(layout)} is not one torch writes"
            return t
        n = len(names)
        if not (len(data) == n + 1 or lname == "sparse_coo" and len(data) == n + 2):
            t.error = f"{lname} tensor data has {len(data)} items"
            return t
        parts, size = data[:n], data[n]
        if not all(isinstance(p, TensorNode) for p in parts):
            t.error = f"{lname} components are not all tensors: {show(parts)}"
            return t
        parts = cast("tuple[TensorNode, ...]", parts)  # all tensors, checked just above
        shape = int_tuple(size)
        values = parts[-1]
        t.dtype, t.shape = values.dtype, shape or ()
        t.requires_grad = values.requires_grad
        t.parts = tuple(zip(names, parts, strict=False))
        t.extra["nnz"] = values.shape[0] if values.shape else 0
        t.extra["device"] = values.storage.location if values.storage is not None else None
        if lname == "sparse_coo":
            idx = parts[0]
            t.extra["sparse_dim"] = idx.shape[0] if len(idx.shape) == 2 else None
            t.extra["dense_dim"] = len(values.shape) - 1
            t.extra["is_coalesced"] = data[3] if len(data) == 4 and type(data[3]) is bool else None
        elif lname in ("sparse_bsr", "sparse_bsc") and len(values.shape) >= 3:
            t.extra["blocksize"] = list(values.shape[1:3])
        if shape is None:
            t.error = f"dense size {show(size)} is not a tuple of ints"
        else:
            t.error = _sparse_problem(lname, parts, shape)
        return t

    def _nested(self, a: tuple[Any, ...], name: str) -> TensorNode:
        """``_rebuild_nested_tensor(buffer, sizes, strides, storage_offsets)``: a composite of the flat buffer
        and three int64 tensors (one row per constituent tensor)."""
        if len(a) != 4:
            return self._bad_call(name, a)
        buffer, sizes, strides, offsets = (self.value(x) for x in a)
        t = TensorNode("nested", None, UINT8, (), None, 0)
        t.extra = {"layout": "strided"}
        if not (isinstance(buffer, TensorNode) and isinstance(sizes, TensorNode) and isinstance(strides, TensorNode)
                and isinstance(offsets, TensorNode)):
            t.error = f"nested tensor components are not all tensors: {show(a)}"
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

    def _from_type(self, a: tuple[Any, ...], name: str) -> object:
        if len(a) == 4 and getattr(a[0], "qualname", None) == _NJT_REBUILD and isinstance(a[2], tuple) \
                and len(a[2]) == 1 and type(a[2][0]) is dict:
            return self._jagged(a[2][0])
        return super()._from_type(a, name)

    def _jagged(self, kwargs: dict[Any, Any]) -> TensorNode:
        """A jagged-layout nested tensor (``torch.nested.nested_tensor(..., layout=torch.jagged)``), pickled
        as ``_rebuild_from_type_v2(_rebuild_njt, NestedTensor, ({values, offsets, lengths, _ragged_idx, ...},),
        state)``: a composite of ``values`` (the constituents joined along the ragged dimension), ``offsets``
        and, when saved, ``lengths``; ``_rebuild_njt`` itself is never called."""
        values, offsets, lengths = (self.value(kwargs.get(k)) for k in ("values", "offsets", "lengths"))
        ragged = kwargs.get("_ragged_idx")
        t = TensorNode("nested", None, UINT8, (), None, 0, kwargs.get("requires_grad") is True)
        t.extra = {"layout": "jagged", "ragged_idx": ragged}
        if not (isinstance(values, TensorNode) and isinstance(offsets, TensorNode)
                and (lengths is None or isinstance(lengths, TensorNode)) and type(ragged) is int):
            t.error = f"jagged nested tensor components are not all tensors: {show(kwargs)}"
            return t
        t.dtype = values.dtype
        n = offsets.shape[0] - 1 if len(offsets.shape) == 1 and offsets.shape[0] > 0 else 0
        t.shape = (n,)
        t.extra.update({"tensors": n, "ndim": len(values.shape) + 1,
                        "device": values.storage.location if values.storage is not None else None})
        t.parts = (("values", values), ("offsets", offsets)) + ((("lengths", lengths),) if lengths is not None else ())
        if len(offsets.shape) != 1 or not values.shape or not 1 <= ragged <= len(values.shape):
            t.error = (f"jagged nested tensor parts have shapes values {values.shape}, offsets {offsets.shape} "
                       f"(ragged dimension {ragged})")
        return t

    def _wrapper(self, a: tuple[Any, ...], name: str) -> TensorNode:
        """``_rebuild_wrapper_subclass(cls, dtype, size, stride, storage_offset, layout, device,
        requires_grad)``: a tensor subclass with no storage of its own: metadata only."""
        if len(a) != 8:
            return self._bad_call(name, a)
        cls, dt, size, stride, offset, layout, device, rg = (self.value(x) for x in a)
        shape, strides = int_tuple(size), int_tuple(stride)
        t = TensorNode("wrapper", None, dt.dtype if isinstance(dt, TorchDType) else UINT8, shape or (), strides,
                       offset if type(offset) is int else 0, rg is True)
        t.extra = {"subclass": getattr(cls, "qualname", show(cls)),
                   "layout": layout.qualname.removeprefix("torch.") if isinstance(layout, TorchGlobal) else show(layout),
                   "device": device.spec if isinstance(device, TorchDevice) else show(device),
                   "data": "none: a wrapper subclass without storage (metadata only)"}
        if not isinstance(dt, TorchDType) or shape is None or strides is None or len(shape) != len(strides):
            t.error = f"malformed wrapper subclass {show(a)}"
        return t

    def _from_numpy(self, a: tuple[Any, ...], name: str) -> TensorNode:
        """``_rebuild_device_tensor_from_numpy(data, dtype, device, requires_grad)`` (XLA / MTIA tensors of
        torch < 2.1, and ``_rebuild_xla_tensor``): the data is a numpy array inside the pickle."""
        if len(a) != 4:
            return self._bad_call(name, a)
        data, dt, device, rg = a[0], self.value(a[1]), self.value(a[2]), a[3]
        if type(data) is not NumpyArray:
            return self._bad_call(name, a, f"device tensor data is {show(data)}, not a numpy array")
        t = self.numpy_array(data)
        if not isinstance(t, TensorNode):
            return self._bad_call(name, a, "device tensor data is a numpy object array")
        t = t.copy()
        t.requires_grad = rg is True
        t.extra = dict(t.extra or {})
        t.extra["device"] = device.spec if isinstance(device, TorchDevice) else ascii_text(device)
        if isinstance(dt, TorchDType) and dt.dtype is not t.dtype and t.error is None and t.unsupported is None:
            t.unsupported = f"numpy data of dtype {t.dtype.name} that torch converts to {dt.dtype.name} when loading"
        return t

    def _from_cpu(self, a: tuple[Any, ...], name: str) -> object:
        """``_rebuild_device_tensor_from_cpu_tensor(data, dtype, device, requires_grad)`` (XLA / MTIA /
        PrivateUse1 tensors): a CPU tensor moved to ``device`` when loading: served from the CPU tensor."""
        if len(a) != 4:
            return self._bad_call(name, a)
        data, dt, device, rg = self.value(a[0]), self.value(a[1]), self.value(a[2]), a[3]
        if not isinstance(data, TensorNode):
            return self._bad_call(name, a, f"device tensor data is {show(data)}, not a tensor")
        t = data.copy()
        t.requires_grad = rg is True
        t.extra = dict(t.extra or {})
        t.extra["device"] = device.spec if isinstance(device, TorchDevice) else ascii_text(device)
        if isinstance(dt, TorchDType) and dt.dtype is not t.dtype and t.error is None:
            t.unsupported = f"data of dtype {t.dtype.name} that torch converts to {dt.dtype.name} when loading"
        return t

    def _exotic(self, a: tuple[Any, ...], name: str) -> TensorNode:
        """Rebuild calls ckptfs does not interpret (mkldnn, unknown future ones): indexed, with why."""
        kind = "mkldnn" if name == U + "_rebuild_mkldnn_tensor" else "unknown"
        t = TensorNode(kind, None, UINT8, (), None, 0)
        t.extra = {"call": name, "args": tuple(self.value(x) for x in a)}
        t.unsupported = f"{name} tensors are indexed but their bytes are not served"
        return t


_QUANT_INT = {"qint8": "int8", "quint8": "uint8", "qint32": "int32"}
_NJT_REBUILD = "torch.nested._internal.nested_tensor._rebuild_njt"
#: quantized dtypes of sub-byte values: how many a byte holds
_PACKED = {"quint4x2": 2, "quint2x4": 4}
_SPARSE_PARTS = {
    "sparse_coo": ("indices", "values"),
    "sparse_csr": ("crow_indices", "col_indices", "values"),
    "sparse_bsr": ("crow_indices", "col_indices", "values"),
    "sparse_csc": ("ccol_indices", "row_indices", "values"),
    "sparse_bsc": ("ccol_indices", "row_indices", "values"),
}


def _sparse_problem(layout: str, parts: tuple[TensorNode, ...], shape: tuple[int, ...]) -> str | None:
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
