"""``Checkpoint.slice(key)[...]``: a basic-indexing view of a tensor that reads only the bytes it needs.

A selection of ints, slices (step >= 1) and one Ellipsis is turned into a new strided view of the same
storage (offset, shape, stride), whose bytes are then read like any tensor: a contiguous row range is one
pread, anything else a gather of just the touched storage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..pickle.nodes import TensorNode
from .reader import TensorReader
from .tensors import STRIDED_KINDS

if TYPE_CHECKING:
    from .checkpoint import Checkpoint


class TensorSlice:
    def __init__(self, ckpt: "Checkpoint", key: Any, framework: str = "numpy") -> None:
        if framework not in ("numpy", "np", "pt", "torch"):
            raise ValueError(f"framework must be 'numpy' or 'pt', not {framework!r}")
        self.ckpt = ckpt
        self.key = key
        self.framework = framework
        self.base = ckpt.reader(key)  # validates: raises for tensors that cannot be served
        self.t: TensorNode = self.base.t

    # safetensors' PySafeSlice-style accessors
    def get_shape(self) -> list[int]:
        return list(self.t.shape)

    def get_dtype(self) -> str:
        return self.t.dtype.name

    @property
    def shape(self) -> tuple:
        return tuple(self.t.shape)

    def __getitem__(self, index: Any) -> Any:
        view = self.view(index)
        if self.framework in ("pt", "torch"):
            import torch

            from ..torchio.tensors import torch_dtype

            out = torch.empty(view.shape, dtype=torch_dtype(view.dtype.name))
            r = TensorReader(view, file_name=self.ckpt.name, key=str(self.key))
            import sys

            from ..torchio.tensors import _byteswap, _read_into_tensor

            _read_into_tensor(r, out)
            if self.ckpt.byteorder != sys.byteorder:
                _byteswap(out, view.dtype.itemsize, view.dtype.name.startswith("complex"))
            return out
        import numpy as np

        from ..dtypes import numpy_dtype

        r = TensorReader(view, file_name=self.ckpt.name, key=str(self.key))
        return np.frombuffer(r.read(), dtype=numpy_dtype(view.dtype, self.ckpt.byteorder)).reshape(view.shape)

    def view(self, index: Any) -> TensorNode:
        """The TensorNode for ``tensor[index]`` (same storage, new offset/shape/stride)."""
        t = self.t
        if t.kind not in STRIDED_KINDS or t.stride is None:
            raise TypeError(f"{t.kind} tensors cannot be sliced")
        if not isinstance(index, tuple):
            index = (index,)
        if sum(1 for i in index if i is Ellipsis) > 1:
            raise IndexError("an index can only have a single ellipsis")
        n_real = sum(1 for i in index if i is not Ellipsis)
        if n_real > len(t.shape):
            raise IndexError(f"too many indices: tensor has {len(t.shape)} dimensions, {n_real} given")
        if Ellipsis in index:
            pos = index.index(Ellipsis)
            index = index[:pos] + (slice(None),) * (len(t.shape) - n_real) + index[pos + 1:]
        index = index + (slice(None),) * (len(t.shape) - len(index))
        offset = t.storage_offset
        shape: list[int] = []
        stride: list[int] = []
        for dim, (i, size, st) in enumerate(zip(index, t.shape, t.stride)):
            if isinstance(i, slice):
                start, stop, step = i.indices(size)
                if step < 1:
                    raise ValueError("slice steps must be positive (torch has no negative strides)")
                n = len(range(start, stop, step))
                if n:
                    offset += start * st
                shape.append(n)
                stride.append(st * step)
            elif isinstance(i, int) and not isinstance(i, bool) or hasattr(i, "__index__") and not isinstance(i, bool):
                k = i.__index__()
                if k < 0:
                    k += size
                if not 0 <= k < size:
                    raise IndexError(f"index {i} is out of bounds for dimension {dim} with size {size}")
                offset += k * st
            else:
                raise TypeError(f"unsupported index {i!r}: use ints, slices and ...")
        v = TensorNode(t.kind, t.storage, t.dtype, tuple(shape), tuple(stride), offset, t.requires_grad, t.metadata)
        v.extra = t.extra
        return v
