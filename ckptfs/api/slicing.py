"""``Checkpoint.slice(key)[...]``: a basic-indexing view of a tensor that reads only the bytes it needs."""

from __future__ import annotations

from typing import Any

from ..dtypes import numpy_dtype
from ..model.catalog import Catalog
from ..model.reader import TensorData
from ..model.slicing import slice_node
from ..pickle.nodes import TensorNode


class TensorSlice:
    """``slice[index]`` reads ``tensor[index]``: a numpy array, or a torch tensor with ``framework="pt"``."""

    def __init__(self, catalog: Catalog, row: int, framework: str = "numpy") -> None:
        if framework not in ("numpy", "np", "pt", "torch"):
            raise ValueError(f"framework must be 'numpy' or 'pt', not {framework!r}")
        self.catalog = catalog
        self.row = row
        self.framework = framework
        self.base = catalog.data(row)  # validates: raises for tensors that cannot be served
        self.t: TensorNode = self.base.t

    # safetensors' PySafeSlice-style accessors
    def get_shape(self) -> list[int]:
        return list(self.t.shape)

    def get_dtype(self) -> str:
        return self.t.dtype.name

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.t.shape)

    def view(self, index: Any) -> TensorNode:
        """The TensorNode for ``tensor[index]`` (same storage, new offset/shape/stride)."""
        return slice_node(self.t, index)

    def __getitem__(self, index: Any) -> Any:
        view = slice_node(self.t, index)
        data = TensorData(view, self.base.storage, file_name=self.catalog.name, key=self.base.key)
        order = self.catalog.byteorder_of(self.t, self.row)
        if self.framework in ("pt", "torch"):
            from ..torchio.tensors import tensor_from_data

            return tensor_from_data(data, order)
        import numpy as np

        return np.frombuffer(data.read(), dtype=numpy_dtype(view.dtype, order)).reshape(view.shape)
