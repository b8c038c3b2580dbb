"""Dense tensors: the calls that rebuild a strided view of one storage (nearly every tensor of a checkpoint)."""

from __future__ import annotations

from typing import Any

from ...dtypes import DTYPES, UINT8, DType
from ...pickle.allowlist import LEGACY_TENSOR_DTYPES
from ...pickle.nodes import (
    BUILT,
    Call,
    PersistentId,
    StorageRef,
    TensorNode,
    TorchDType,
    metadata_extra,
)
from .common import MAX_DIMS, int_tuple, show
from .storages import StorageConverter


class DenseConverter(StorageConverter):
    """Dense strided tensors: ``_rebuild_tensor`` v1/v2/v3, parameters, subclasses, pre-0.4 tensor classes."""

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
            error = f"storage argument is {show(storage)}, not a storage reference"
        elif dtype is None:
            dtype = ref.dtype or UINT8
        shape = int_tuple(self.value(size))
        strides = int_tuple(self.value(stride))
        if shape is None:
            size = self.value(size)
            too_many = type(size) in (tuple, list) and len(size) > MAX_DIMS  # type: ignore[arg-type]
            error = error or (f"{len(size)} dimensions (limit {MAX_DIMS})" if too_many  # type: ignore[arg-type]
                              else f"size is {show(size)}, not a tuple of ints")
            shape = ()
        if strides is None:
            error = error or f"stride is {show(stride)}, not a tuple of ints"
        elif len(strides) != len(shape):
            error = error or f"{len(shape)} sizes but {len(strides)} strides"
        if type(offset) is not int:
            error = error or f"storage offset is {show(offset)}"
            offset = 0
        t = TensorNode(kind, ref, dtype or UINT8, shape, strides, offset, requires_grad is True,
                       metadata if type(metadata) is dict and metadata else None)
        if t.metadata:
            t.extra = metadata_extra(t.metadata)
        t.error = error or (ref.error if ref is not None else None)  # as v2's fast path records it
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
                            t.extra = metadata_extra(metadata)
                        if ref.error is not None:
                            t.error = ref.error
                        return t
        return self.convert(call)  # type: ignore[return-value]

    def _v2(self, a: tuple[Any, ...], name: str) -> TensorNode:
        # (storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
        if 4 <= len(a) <= 7:
            return self._tensor("dense", a[0], None, a[1], a[2], a[3], a[4] if len(a) > 4 else False,
                                a[6] if len(a) > 6 else None)
        return self._bad_call(name, a)

    def _v3(self, a: tuple[Any, ...], name: str) -> TensorNode:
        # (storage, storage_offset, size, stride, requires_grad, backward_hooks, dtype[, metadata])
        if len(a) in (7, 8):
            dt = a[6]
            if not isinstance(dt, TorchDType):
                t = self._tensor("dense", a[0], None, a[1], a[2], a[3], a[4])
                t.error = t.error or f"dtype argument is {show(dt)}"
                return t
            return self._tensor("dense", a[0], dt.dtype, a[1], a[2], a[3], a[4], a[7] if len(a) > 7 else None)
        return self._bad_call(name, a)

    def _v1(self, a: tuple[Any, ...], name: str) -> TensorNode:
        if len(a) == 4:
            return self._tensor("dense", a[0], None, a[1], a[2], a[3], False)
        return self._bad_call(name, a)

    def _legacy_tensor(self, a: tuple[Any, ...], name: str) -> TensorNode:
        """``torch.FloatTensor()`` + BUILD state, as torch < 0.4 pickled tensors (Tensor.__setstate__):
        4 items ``(storage, offset, size, stride)`` -> ``set_``; 5 items (a legacy Variable) -> its data
        ``state[0]`` with ``requires_grad = state[3]``."""
        if not (len(a) == 3 and a[0] is BUILT):
            return self._bad_call(name, a, f"{name}({show(a)}) without the state old torch pickled with it")
        args, state = a[1], a[2]
        if args != ():
            return self._bad_call(name, a, f"{name} called with arguments {show(args)}")
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
                return self._bad_call(name, a, f"legacy Variable state holds {show(data)}, not a tensor")
            t = data.copy()
            t.requires_grad = state[3] is True
            return t
        return self._bad_call(name, a, f"{name} BUILT with {show(state)}: no storage to read")

    def _parameter(self, a: tuple[Any, ...], name: str) -> object:
        # (data, requires_grad, backward_hooks[, state])
        if len(a) < 2:
            return self._bad_call(name, a)
        data = self.value(a[0])
        if not isinstance(data, TensorNode):
            return self._bad_call(name, a, f"parameter data is {show(data)}, not a tensor")
        t = data.copy()
        t.is_parameter = True
        t.requires_grad = a[1] is True
        state = a[3] if len(a) > 3 else None
        if state not in (None, {}, (None, None)):
            t.extra = dict(t.extra or {})
            t.extra["python_state"] = state  # kept as data; never set as attributes
        return t

    def _from_type(self, a: tuple[Any, ...], name: str) -> object:
        # (func, new_type, args, state): a tensor subclass; func is itself a recorded rebuild call class
        if len(a) != 4 or not isinstance(a[2], tuple):
            return self._bad_call(name, a)
        func, new_type, args, state = a
        if not (isinstance(func, type) and issubclass(func, Call)):
            return self._bad_call(name, a, f"rebuild function is {show(func)}")
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
