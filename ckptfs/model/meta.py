"""What ckptfs tells about an entry: one object, used by the API, the CLI, sidecars and index.json.

``Meta`` is a view over the index row: fields are computed when read, so ``ckpt.meta(k).shape`` on
every key of a 200k-tensor checkpoint costs little. ``to_dict()`` gives the JSON form (the sidecar).
"""

from __future__ import annotations

from itertools import islice
from typing import Any, cast

from ..errors import CkptfsError, brief
from ..pickle.nodes import (
    Inert,
    OpaqueObject,
    PickledOrderedDict,
    StorageRef,
    TensorNode,
    TorchDevice,
    TorchDType,
    TorchGlobal,
)
from .index import LEAF, LINK, TENSOR, Index, NodeColumn
from .tensors import STRIDED_KINDS, is_contiguous, nbytes

#: Fields a tensor's sidecar always has (docs/layout.md).
TENSOR_FIELDS = ("key", "dtype", "shape", "numpy_dtype", "nbytes", "stride", "storage_offset", "byteorder", "record",
                 "requires_grad")
#: All fields, in the order to_dict() writes them.
FIELDS = ("key", "kind", "path", "dtype", "shape", "stride", "storage_offset", "nbytes", "numpy_dtype",
          "numpy_dtype_reason", "byteorder", "record", "storage_key", "storage_nbytes", "contiguous",
          "requires_grad", "is_parameter", "location", "tensor_kind", "error", "unsupported", "extra", "type",
          "length", "target")


class Meta:
    """Metadata of one entry. Tensor fields are None for other kinds; see docs/api.md for each field."""

    __slots__ = ("_index", "_row", "_byteorder")

    def __init__(self, index: Index, row: int, byteorder: str = "little") -> None:
        self._index = index
        self._row = row
        self._byteorder = byteorder  # of the file, for tensors without a storage of their own

    # --- every kind ---
    @property
    def key(self) -> str:
        return self._index.keys[self._row]

    @property
    def kind(self) -> str:
        """tensor / leaf / dict / list / tuple / set / opaque / link"""
        return self._index.kinds[self._row]

    @property
    def path(self) -> tuple[object, ...]:
        """The original keys from the root (ints, strs, ... as pickled)."""
        return self._index.path(self._row)

    @property
    def _t(self) -> TensorNode | None:
        node = self._index.nodes[self._row]
        return node if type(node) is TensorNode else None

    @property
    def tensor_node(self) -> TensorNode | None:
        """The index's node for a tensor (validated against its record), else None."""
        return self._checked

    @property
    def _checked(self) -> TensorNode | None:
        """The tensor, validated against its record (for fields that depend on it)."""
        t = self._t
        if t is not None and not t.validated and self._index.validator is not None:
            self._index.validator(t)
        return t

    # --- tensors ---
    @property
    def dtype(self) -> str | None:
        """torch's dtype name: "float32", "bfloat16", ..."""
        nodes = self._index.nodes
        if type(nodes) is NodeColumn:  # a table row not looked at yet: no node is made for this
            return nodes.dtype_name(self._row)
        node = nodes[self._row]
        return node.dtype.name if type(node) is TensorNode else None

    @property
    def shape(self) -> tuple[int, ...] | None:
        nodes = self._index.nodes
        if type(nodes) is NodeColumn:
            return nodes.shape(self._row)
        node = nodes[self._row]
        return node.shape if type(node) is TensorNode else None

    @property
    def stride(self) -> tuple[int, ...] | None:
        t = self._t
        return t.stride if t else None

    @property
    def storage_offset(self) -> int | None:
        t = self._t
        return t.storage_offset if t else None

    @property
    def numel(self) -> int | None:
        t = self._t
        if t is None:
            return None
        n = 1
        for s in t.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int | None:
        """Bytes of the logical C-contiguous content (the size of the tensor's file in a mount)."""
        t = self._t
        return nbytes(t) if t else None

    @property
    def byteorder(self) -> str | None:
        t = self._t
        if t is None:
            return None
        ref = t.storage
        default = ref.owner.byteorder if ref is not None and ref.owner is not None else self._byteorder
        order: str = (t.extra or {}).get("byteorder", default)
        return order

    @property
    def numpy_dtype(self) -> str | None:
        """'<f4', '|b1', 'bfloat16' (an ml_dtypes name), '>i8' ...; None when numpy has no such type."""
        t = self._t
        return t.dtype.numpy_str(self.byteorder or "little") if t else None

    @property
    def numpy_dtype_reason(self) -> str | None:
        t = self._t
        return t.dtype.no_numpy_reason if t and t.dtype.numpy is None else None

    @property
    def _ref(self) -> StorageRef | None:
        t = self._t
        return t.storage if t else None

    @property
    def record(self) -> str | None:
        """The container record holding the storage, e.g. "archive/data/0"."""
        ref = self._ref
        if ref is None:
            return None
        return ref.owner.record_name(ref.key) if ref.owner is not None else f"data/{ref.key}"

    @property
    def storage_key(self) -> str | None:
        ref = self._ref
        return ref.key if ref else None

    @property
    def storage_nbytes(self) -> int | None:
        ref = self._ref
        return ref.nbytes if ref else None

    @property
    def contiguous(self) -> bool | None:
        """True when the tensor's bytes are one range of its record (reads are one pread)."""
        t = self._checked
        if t is None:
            return None
        if t.kind in STRIDED_KINDS and t.stride is not None and t.error is None:
            return is_contiguous(t.shape, t.stride)
        if t.extra and "inline" in t.extra:
            return not t.extra.get("fortran_order", False)
        return None

    @property
    def requires_grad(self) -> bool | None:
        t = self._t
        return t.requires_grad if t else None

    @property
    def is_parameter(self) -> bool | None:
        t = self._t
        return t.is_parameter if t else None

    @property
    def location(self) -> str | None:
        """Device the tensor was saved from ("cpu", "cuda:0", "xla:0", "meta" ...): metadata only."""
        t = self._t
        if t is None:
            return None
        device: str | None = t.extra.get("device") if t.extra else None  # set where the storage's location is not it
        if device is not None:
            return device
        return t.storage.location if t.storage is not None else None

    @property
    def tensor_kind(self) -> str | None:
        """dense / quantized / sparse / nested / meta / wrapper / numpy"""
        t = self._t
        return t.kind if t else None

    @property
    def error(self) -> str | None:
        """Why this tensor's bytes cannot be served (bad geometry, missing record, ...)."""
        t = self._checked
        return t.error if t else None

    @property
    def unsupported(self) -> str | None:
        t = self._t
        return t.unsupported if t else None

    @property
    def extra(self) -> dict[str, Any]:
        """Kind-specific facts: conj/neg flags, qparams, subclass, python_state, ...; and where the bytes are
        in the format's own terms (a safetensors entry, the chunks of a DCP tensor)."""
        t = self._t
        if t is None:
            return {}
        out = {k: v for k, v in t.extra.items() if k != "inline"} if t.extra else {}
        ref = t.storage
        if ref is not None and ref.owner is not None and ref.error is None:
            try:
                layout = ref.owner.storage_layout(ref.key)
            except CkptfsError:
                layout = None
            if layout:
                out.update(layout)
        return out

    # --- leaves, containers, links ---
    @property
    def type(self) -> str | None:
        """Python type of a leaf, or the qualified class name of an opaque object."""
        node = self._index.nodes[self._row]
        kind = self.kind
        if kind == LEAF:
            return leaf_type(node)
        if isinstance(node, OpaqueObject):
            return type(node).qualname
        if isinstance(node, PickledOrderedDict):
            return "collections.OrderedDict"
        return None

    @property
    def length(self) -> int | None:
        """Number of children of a container."""
        if self.kind in (TENSOR, LEAF, LINK):
            return None
        return len(self._index.children(self._row))

    @property
    def target(self) -> str | None:
        """For a link: the key of the object this entry shares (a container met twice)."""
        if self.kind != LINK:
            return None
        return self._index.keys[cast(int, self._index.nodes[self._row])]  # a link's node is its target row

    # --- forms ---
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: the fields that apply (documented tensor fields always present)."""
        out: dict[str, Any] = {}
        is_tensor = self.kind == TENSOR
        for name in FIELDS:
            v = getattr(self, name)
            if name == "path":
                v = [_jsonable(p) for p in v]
            elif name in ("shape", "stride") and v is not None:
                v = list(v)
            elif name == "extra":
                if not v:
                    continue
                v = _jsonable(v)
            if v is None and not (is_tensor and name in TENSOR_FIELDS):
                continue
            out[name] = v
        return out

    def __repr__(self) -> str:
        if self.kind == TENSOR:
            return f"Meta({self.key!r}, {self.dtype}, shape={self.shape})"
        return f"Meta({self.key!r}, {self.kind})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Meta) and other.to_dict() == self.to_dict()

    __hash__ = None  # type: ignore[assignment]


def leaf_type(v: object) -> str:
    if isinstance(v, TorchDType):
        return "torch.dtype"
    if isinstance(v, TorchDevice):
        return "torch.device"
    if isinstance(v, TorchGlobal):
        return "torch.constant"
    if isinstance(v, type) and issubclass(v, OpaqueObject):
        return "global"
    return type(v).__name__


def _jsonable(v: object, depth: int = 0, budget: list[int] | None = None) -> Any:
    """Best-effort JSON form of metadata values (qparams, flags, python state). Bounded: at most 20 levels
    and ~10,000 values in all (a pickled memo DAG would otherwise expand to 3^59 of them)."""
    if budget is None:
        budget = [10_000]
    budget[0] -= 1
    if depth > 20 or budget[0] < 0:
        return "..."
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else repr(v)
    if isinstance(v, (bytes, bytearray)):
        return {"bytes": len(v)}
    if isinstance(v, dict):
        return {k if isinstance(k, str) else brief(k, 200): _jsonable(x, depth + 1, budget)
                for k, x in islice(v.items(), 1000)}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_jsonable(x, depth + 1, budget) for x in islice(v, 1000)]
    if isinstance(v, TensorNode):
        return {"tensor": v.dtype.name, "shape": list(v.shape)}
    if isinstance(v, TorchDType):
        return f"torch.{v.dtype.name}"
    if isinstance(v, TorchDevice):
        return v.spec
    if isinstance(v, (TorchGlobal, Inert)) and hasattr(v, "qualname"):
        return getattr(v, "qualname")  # noqa: B009 - Inert declares no qualname; hasattr() says it has one
    if isinstance(v, OpaqueObject):
        return {"opaque": type(v).qualname}
    if isinstance(v, type) and issubclass(v, OpaqueObject):
        return {"global": v.qualname}
    return brief(v, 200)
