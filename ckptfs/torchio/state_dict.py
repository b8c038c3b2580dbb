"""The lazy state_dict (``ckptfs.load``): a Mapping whose tensors are built when accessed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from ..model.catalog import Catalog
from ..model.index import DICT, TENSOR
from ..pickle.nodes import PickledOrderedDict
from .tensors import entry_value, to_plain, torch_dtype

# --- metadata objects (zipslicer's get_meta) ---------------------------------------------------------------


@dataclass(frozen=True)
class TensorMeta:
    """What ``LazyStateDict.get_meta(key)`` returns: shape/dtype without reading the tensor."""

    shape: torch.Size
    dtype: torch.dtype
    stride: tuple[int, ...]
    storage_offset: int
    nbytes: int
    requires_grad: bool
    is_parameter: bool
    device: str
    record: str | None
    extra: dict[str, Any] = field(default_factory=dict)

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def numel(self) -> int:
        return self.shape.numel()

    def dim(self) -> int:
        return len(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)


# --- the lazy state_dict ----------------------------------------------------------------------------------


class LazyStateDict(Mapping):
    """A read-on-access view of a dict in the checkpoint (a drop-in for zipslicer's LazyStateDict).

    Tensors are read when accessed (and not kept unless ``cache_tensors``); nested dicts are lazy too;
    other values are returned as plain Python data. Assigning or deleting keys changes only this view.
    """

    def __init__(self, catalog: Catalog, entry_idx: int = 0, *, map_location: Any = "cpu",
                 dtype: torch.dtype | None = None, cache_tensors: bool = False, mmap: bool = True,
                 checkpoint: Any = None) -> None:
        self._catalog = catalog
        self._checkpoint = checkpoint  # the ckptfs.Checkpoint this view came from (checkpoint())
        self.mmap = mmap
        self._idx = entry_idx
        self.map_location = map_location
        self.dtype = dtype
        self.cache_tensors = cache_tensors
        index = catalog.index
        names = index.names
        self._children: dict[Any, int] = {names[c]: c for c in index.children(entry_idx)}
        self._overrides: dict[Any, Any] = {}
        self._deleted: set[Any] = set()
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
        return f"<ckptfs.LazyStateDict of {self._catalog.name!r}: {len(self)} keys>"

    # extras
    @property
    def _metadata(self) -> Any:
        node = self._catalog.index.nodes[self._idx]
        if isinstance(node, PickledOrderedDict) and node.metadata is not None:
            return to_plain(self._catalog, self._idx, node.metadata, self.map_location, self.dtype)
        return None

    def get_meta(self, key: Any) -> TensorMeta | None:
        """Shape and dtype of a tensor without reading it; None for non-tensor values."""
        if key not in self._children or key in self._deleted:
            if key in self._overrides:
                v = self._overrides[key]
                return None if not isinstance(v, torch.Tensor) else _meta_of_tensor(v)
            raise KeyError(key)
        index = self._catalog.index
        i = index.resolve(self._children[key])
        if index.kinds[i] != TENSOR:
            return None
        m = self._catalog.meta(i)
        return TensorMeta(torch.Size(m.shape or ()), torch_dtype(m.dtype or "uint8"), tuple(m.stride or ()),
                          m.storage_offset or 0, m.nbytes or 0, bool(m.requires_grad), bool(m.is_parameter),
                          m.location or "cpu", m.record, dict(m.extra))

    def checkpoint(self) -> Any:
        """The ``ckptfs.Checkpoint`` this state_dict reads from."""
        return self._checkpoint

    def close(self) -> None:
        self._catalog.close()

    def _value(self, idx: int) -> Any:
        catalog = self._catalog
        i = catalog.index.resolve(idx)
        if catalog.index.kinds[i] == DICT:
            return LazyStateDict(catalog, i, map_location=self.map_location, dtype=self.dtype,
                                 cache_tensors=self.cache_tensors, mmap=self.mmap, checkpoint=self._checkpoint)
        return entry_value(catalog, i, self.map_location, self.dtype, self.mmap)


def _meta_of_tensor(v: torch.Tensor) -> TensorMeta:
    return TensorMeta(v.shape, v.dtype, tuple(v.stride()), int(v.storage_offset()), v.numel() * v.element_size(),
                      v.requires_grad, isinstance(v, torch.nn.Parameter), str(v.device), None)


