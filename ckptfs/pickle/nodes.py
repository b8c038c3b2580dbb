"""The inert objects the safe unpickler builds: tensors, storage references and opaque objects.

Nothing here runs code from a checkpoint. Each class that a pickle can reach either stores what the
pickle gives it as data or refuses it; every one defines ``__setstate__`` so a pickle's BUILD can never
fall back to setting attributes or touching ``__dict__``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast

from ..dtypes import DType
from ..errors import UnsafePickleError

if TYPE_CHECKING:
    from ..source import ByteSource


class StorageOwner(Protocol):
    """Whoever serves a storage's bytes: the container it was read from (:class:`ckptfs.container.Container`)."""

    byteorder: str

    def storage_size(self, key: str) -> int: ...

    def storage_source(self, key: str) -> ByteSource: ...

    def record_name(self, key: str) -> str: ...

    def storage_layout(self, key: str) -> dict[str, Any] | None:
        """Where storage ``key``'s bytes are, in the format's own terms (a safetensors entry's
        ``data_offsets``, the chunks of a DCP tensor), merged into the entry's ``extra``; None when
        :meth:`record_name` says it all."""
        ...


class Inert:
    """Base for objects handed to the unpickler: BUILD is refused unless a subclass accepts it."""

    __slots__ = ()

    def __setstate__(self, state: object) -> None:
        raise UnsafePickleError(f"BUILD applied to {type(self).__name__}, which takes no state")

    def __reduce__(self) -> Any:  # never let our nodes be pickled back out by accident
        raise TypeError(f"{type(self).__name__} is not picklable")


class Call(BaseException):
    """A call the pickle asked for, recorded instead of made: ``args`` holds its arguments.

    Subclasses stand for torch's rebuild functions (``_rebuild_tensor_v2`` ...) and for persistent ids.
    Deriving from BaseException is an implementation trick: ``BaseException.__new__`` stores ``*args``
    in C, so REDUCE / NEWOBJ on these classes run no Python code at all (4x faster on 20k-tensor files).
    They are only ever data: never raised. BUILD on one is refused.
    """

    __slots__ = ()
    call: ClassVar[str] = "?"

    def __setstate__(self, state: object) -> None:
        raise UnsafePickleError(f"BUILD applied to the result of {self.call}")

    def __reduce__(self) -> Any:
        raise TypeError("recorded calls are not picklable")

    def __repr__(self) -> str:
        return f"<call {self.call}>"

    __str__ = __repr__


def call_class(qualname: str) -> type[Call]:
    return type(qualname.rsplit(".", 1)[-1], (Call,), {"__slots__": (), "call": qualname, "__module__": __name__})


#: First element of a :class:`BuiltCall`'s ``args`` once the pickle has BUILT it: ``(BUILT, args, state)``.
BUILT = ("ckptfs-built",)


class BuiltCall(Call):
    """A recorded constructor call that the pickle may then BUILD once, as old torch pickled tensors:
    ``torch.FloatTensor()`` + BUILD ``(storage, offset, size, stride)`` (Tensor.__setstate__ then runs
    ``set_``). BUILD only rewrites ``args`` to ``(BUILT, args, state)``: no attribute is ever set."""

    __slots__ = ()
    qualname: ClassVar[str] = "?"

    def __setstate__(self, state: object) -> None:
        a = self.args
        if a and a[0] is BUILT:
            raise UnsafePickleError(f"BUILD applied twice to {self.call}")
        self.args = (BUILT, a, state)


def built_call_class(qualname: str) -> type[BuiltCall]:
    return type(qualname.rsplit(".", 1)[-1], (BuiltCall,),
                {"__slots__": (), "call": qualname, "qualname": qualname, "__module__": __name__})


class PersistentId(Call):
    """What ``persistent_load`` returns: ``args[0]`` is the persistent id as pickled."""

    __slots__ = ()
    call = "persistent_load"


class StorageRef(Inert):
    """A persistent id ``('storage', StorageType, key, location, numel)``: where a storage's bytes live.

    ``owner`` is the container that serves storage ``key`` (set when the reference is made: in a catalog
    of several files, storage keys repeat from file to file)."""

    __slots__ = ("key", "dtype", "numel", "location", "typename", "owner", "error", "data", "checked")

    def __init__(self, key: str, dtype: DType | None, numel: int, location: str, typename: str,
                 owner: StorageOwner | None = None) -> None:
        self.key = key
        self.dtype = dtype  # None: UntypedStorage, numel counts bytes
        self.numel = numel
        self.location = location
        self.typename = typename
        self.owner = owner
        self.error: str | None = None  # why tensors on this storage cannot be served
        self.data: ByteSource | None = None  # the storage's bytes, bound on first read
        self.checked = False  # record existence and size verified (ckptfs.model.tensors.check_storage)

    @property
    def itemsize(self) -> int:
        return 1 if self.dtype is None else self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    def __repr__(self) -> str:
        return f"StorageRef({self.key!r}, {self.typename}, numel={self.numel}, {self.location!r})"


class StorageViewRef(StorageRef):
    """A legacy storage view: ``numel`` elements of ``root`` from element ``view_offset``."""

    __slots__ = ("root", "view_offset")

    def __init__(self, key: str, dtype: DType | None, numel: int, location: str, typename: str,
                 owner: StorageOwner | None = None) -> None:
        super().__init__(key, dtype, numel, location, typename, owner)
        self.root: StorageRef | None = None
        self.view_offset = 0


#: Keys of ``TensorNode.extra`` that ckptfs itself sets and reads (device, byte order, inline data ...). A
#: pickle's tensor metadata (torch's conj/neg flags) is copied into ``extra`` only under other names, so a
#: crafted file cannot make ckptfs serve other bytes, or claim another byte order or device.
RESERVED_EXTRA = frozenset({
    "device", "byteorder", "inline", "fortran_order", "numpy_dtype", "subclass", "python_state", "layout",
    "qscheme", "scale", "zero_point", "axis", "nnz", "sparse_dim", "dense_dim", "is_coalesced", "blocksize",
    "tensors", "ndim", "data", "call", "args", "storage",
})


def metadata_extra(metadata: dict[object, object]) -> dict[str, object]:
    """The part of a pickle's tensor metadata shown in ``extra``: string keys ckptfs does not reserve."""
    return {k: v for k, v in metadata.items() if type(k) is str and k not in RESERVED_EXTRA}


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """C-contiguous strides as torch makes them: a size-0 dimension counts as 1 (``torch.empty(3, 0, 2)``
    has strides (2, 2, 1))."""
    out = [0] * len(shape)
    acc = 1
    for d in range(len(shape) - 1, -1, -1):
        out[d] = acc
        acc *= max(shape[d], 1)
    return tuple(out)


class TensorNode(Inert):
    """A tensor as the pickle describes it. ``kind`` is "dense" for plain strided tensors (served);
    other kinds (quantized, sparse, nested, meta, wrapper, ...) carry what they are in ``extra``."""

    __slots__ = ("kind", "storage", "dtype", "shape", "stride", "storage_offset", "requires_grad",
                 "is_parameter", "metadata", "extra", "error", "unsupported", "parts", "validated")

    def __init__(self, kind: str, storage: StorageRef | None, dtype: DType, shape: tuple[int, ...],
                 stride: tuple[int, ...] | None, storage_offset: int, requires_grad: bool = False,
                 metadata: dict[Any, Any] | None = None) -> None:
        self.kind = kind
        self.storage = storage
        self.dtype = dtype
        self.shape = shape
        self.stride = stride
        self.storage_offset = storage_offset
        self.requires_grad = requires_grad
        self.is_parameter = False
        self.metadata = metadata
        self.extra: dict[str, Any] | None = None
        self.error: str | None = None  # why this tensor cannot be served (bad shape, record, ...)
        self.unsupported: str | None = None  # why this kind's bytes are not served
        self.validated = False  # checked against its storage record (ckptfs.tensors.ensure_valid)
        # A composite tensor (sparse, nested, per-channel quantized): its component tensors as
        # ((name, value), ...). The index makes it a "composite" row whose children are the components.
        self.parts: tuple[tuple[str, TensorNode], ...] | None = None

    def copy(self) -> TensorNode:
        t = TensorNode(self.kind, self.storage, self.dtype, self.shape, self.stride, self.storage_offset,
                       self.requires_grad, self.metadata)
        t.is_parameter = self.is_parameter
        t.extra = dict(self.extra) if self.extra else None
        t.error = self.error
        t.unsupported = self.unsupported
        t.parts = self.parts
        return t

    def __repr__(self) -> str:
        return f"TensorNode({self.kind}, {self.dtype.name}, shape={self.shape}, stride={self.stride})"


class OpaqueObject(Inert):
    """An instance of a class ckptfs does not know, kept as data: how it was made and what it was given.

    Subclasses are made per qualified name by :func:`opaque_class`, so NEWOBJ (which needs a real type)
    works; ``__new__``/``__init__`` store the arguments, ``__setstate__`` the BUILD state, ``__setitem__``
    / ``append`` / ``extend`` the SETITEMS / APPENDS contents, and calling one records the call.
    """

    __slots__ = ("args", "kwargs", "state", "items", "list_items", "how")
    qualname: ClassVar[str] = "?"
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    state: object
    items: dict[object, object] | None
    list_items: list[object] | None
    how: str

    def __new__(cls, *args: Any, **kwargs: Any) -> OpaqueObject:
        self = object.__new__(cls)
        self.args = args
        self.kwargs = kwargs
        self.state = None
        self.items = None
        self.list_items = None
        self.how = "new"
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: object) -> None:
        self.state = state

    def __setitem__(self, key: object, value: object) -> None:
        if self.items is None:
            self.items = {}
        self.items[key] = value

    def append(self, value: object) -> None:
        if self.list_items is None:
            self.list_items = []
        self.list_items.append(value)

    def extend(self, values: Any) -> None:
        if self.list_items is None:
            self.list_items = []
        self.list_items.extend(values)

    def __call__(self, *args: Any, **kwargs: Any) -> OpaqueObject:
        """Calling an opaque object (a gadget chain) only records the call."""
        cls = opaque_class(f"{self.qualname}()")
        res = cls.__new__(cls, *args, **kwargs)
        res.how = "call"
        return res

    def __repr__(self) -> str:
        return f"<opaque {self.qualname}>"


_OPAQUE_CACHE: dict[str, type[OpaqueObject]] = {}


def opaque_class(qualname: str) -> type[OpaqueObject]:
    """A subclass of OpaqueObject standing for the global ``qualname`` (cached; classes are inert)."""
    cls = _OPAQUE_CACHE.get(qualname)
    if cls is None:
        if len(_OPAQUE_CACHE) > 50_000:  # a process indexing many hostile files: do not grow forever
            _OPAQUE_CACHE.clear()
        cls = cast("type[OpaqueObject]",
                   type("Opaque", (OpaqueObject,), {"__slots__": (), "qualname": qualname, "__module__": __name__}))
        cls.__qualname__ = f"Opaque[{qualname}]"
        _OPAQUE_CACHE[qualname] = cls
    return cls


class PickledOrderedDict(dict[object, object]):
    """``collections.OrderedDict`` as data. BUILD stores its state (e.g. a state_dict's ``_metadata``)
    in ``state`` instead of setting attributes."""

    __slots__ = ("state",)
    state: object

    def __init__(self, *args: Any) -> None:
        self.state = None
        if args:
            init = args[0]
            if isinstance(init, (list, tuple)):
                for pair in init:  # OrderedDict([(k, v), ...])
                    if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                        raise UnsafePickleError("OrderedDict initialiser is not a list of pairs")
                    dict.__setitem__(self, pair[0], pair[1])
            elif isinstance(init, dict):
                dict.update(self, init)
            else:
                raise UnsafePickleError(f"OrderedDict initialised from {type(init).__name__}")

    def __setstate__(self, state: object) -> None:
        self.state = state

    def __reduce__(self) -> Any:
        raise TypeError("PickledOrderedDict is not picklable")

    @property
    def metadata(self) -> object:
        """The ``_metadata`` a module's state_dict carries (via BUILD), or None."""
        st = self.state
        if isinstance(st, tuple) and len(st) == 2:  # (dict state, slot state)
            st = st[0]
        if isinstance(st, dict):
            return st.get("_metadata")
        return None


class TorchDType(Inert):
    """A dtype global (``torch.float16``) used as a value."""

    __slots__ = ("dtype",)

    def __init__(self, dtype: DType) -> None:
        self.dtype = dtype

    def __repr__(self) -> str:
        return f"torch.{self.dtype.name}"


class StorageType(Inert):
    """A storage class global (``torch.FloatStorage``, ``torch.storage.UntypedStorage``, ...)."""

    __slots__ = ("qualname", "name", "dtype")

    def __init__(self, qualname: str, dtype: DType | None) -> None:
        self.qualname = qualname
        self.name = qualname.rsplit(".", 1)[-1]
        self.dtype = dtype  # element type; None for UntypedStorage (sizes count bytes)

    def __repr__(self) -> str:
        return self.qualname


class TorchGlobal(Inert):
    """Another known torch constant used as a value: a layout, a qscheme, a memory format."""

    __slots__ = ("qualname",)

    def __init__(self, qualname: str) -> None:
        self.qualname = qualname

    def __repr__(self) -> str:
        return self.qualname

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TorchGlobal) and other.qualname == self.qualname

    def __hash__(self) -> int:
        return hash(self.qualname)


class TorchDevice(Inert):
    """``torch.device(...)`` as a value: the device string."""

    __slots__ = ("spec",)

    def __init__(self, spec: str) -> None:
        self.spec = spec

    def __repr__(self) -> str:
        return f"device({self.spec!r})"


class NumpyDType(Inert):
    """``numpy.dtype(code, align, copy)`` + BUILD state: kept as the dtype string and its state."""

    __slots__ = ("code", "state")
    state: object

    def __init__(self, code: object, *_args: object) -> None:
        self.code = code
        self.state = None

    def __setstate__(self, state: object) -> None:
        self.state = state

    @property
    def byteorder(self) -> str:
        """'<', '>' or '|' from the state tuple (version, byteorder, ...)."""
        st = self.state
        if isinstance(st, tuple) and len(st) > 1 and st[1] in ("<", ">", "|", "="):
            return "<" if st[1] == "=" else st[1]
        return "<"

    def __repr__(self) -> str:
        return f"numpy.dtype({self.code!r})"


class NumpyArray(Inert):
    """``numpy.core.multiarray._reconstruct(ndarray, (0,), b'b')`` + BUILD state
    ``(version, shape, dtype, is_fortran, rawdata)``: an array whose bytes live inside the pickle."""

    __slots__ = ("state",)
    state: object

    def __init__(self) -> None:
        self.state = None

    def __setstate__(self, state: object) -> None:
        self.state = state

    def __repr__(self) -> str:
        return "<numpy array>"


class NumpyScalar(Inert):
    """``numpy.core.multiarray.scalar(dtype, bytes)``."""

    __slots__ = ("dtype", "raw")

    def __init__(self, dtype: object, raw: object) -> None:
        self.dtype = dtype
        self.raw = raw

    def __repr__(self) -> str:
        return f"<numpy scalar {self.dtype!r}>"
