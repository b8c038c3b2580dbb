"""Interpreting the calls the unpickler recorded: torch's rebuild functions become typed nodes.

This is the one place that knows what ``_rebuild_tensor_v2(storage, offset, size, stride, ...)`` and its
relatives mean. Each call becomes a :class:`TensorNode` or another inert value; a malformed call yields a
tensor with ``error`` set, never an exception, so one bad tensor does not stop a checkpoint from
indexing. Tensors are checked against their storages later, lazily (:mod:`ckptfs.model.tensors`).

One module per concern, each a step of one class chain: :mod:`.base` (memoised dispatch),
:mod:`.storages` (persistent ids), :mod:`.dense` (strided tensors, the fast path :meth:`Converter.v2`),
:mod:`.exotic` (quantized, sparse, nested, meta, wrapper, device tensors), :mod:`.values` (numpy arrays and
scalars pickled inline).
"""

from __future__ import annotations

from typing import Any

from ...limits import DEFAULT_LIMITS, Limits
from ...pickle.allowlist import LEGACY_TENSOR_CALLS
from ...pickle.nodes import StorageOwner, TorchDevice, TorchGlobal
from .common import U, int_tuple, opaque_value
from .exotic import ExoticConverter
from .storages import storage_as_tensor
from .values import numpy_array_node, numpy_array_value, numpy_code_dtype, numpy_scalar_value

__all__ = ["Converter", "numpy_array_node", "numpy_array_value", "numpy_code_dtype", "numpy_scalar_value",
           "storage_as_tensor"]


class Converter(ExoticConverter):
    """Turns recorded calls into nodes; shared calls (pickle memo) convert once, to one node."""

    def __init__(self, limits: Limits = DEFAULT_LIMITS, owner: StorageOwner | None = None) -> None:
        super().__init__(limits, owner)
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

    def _unknown(self, a: tuple[Any, ...], name: str) -> object:
        return self._exotic(a, name)

    # --- small torch values ----------------------------------------------------------------------------
    # --- small values --------------------------------------------------------------------------------
    def _size(self, a: tuple[Any, ...], name: str) -> object:
        if len(a) == 1 and int_tuple(a[0]) is not None:
            return tuple(a[0])
        return opaque_value(name, a)

    def _device(self, a: tuple[Any, ...], name: str) -> object:
        if len(a) == 1 and isinstance(a[0], str):
            return TorchDevice(a[0])
        if len(a) == 2 and isinstance(a[0], str) and type(a[1]) is int:
            return TorchDevice(f"{a[0]}:{a[1]}")
        return opaque_value(name, a)

    def _layout(self, a: tuple[Any, ...], name: str) -> object:
        if len(a) == 1 and isinstance(a[0], str) and a[0].startswith("torch."):
            return TorchGlobal(a[0])
        return opaque_value(name, a)
