"""The allowlist of the safe unpickler: what each (module, name) a pickle may name stands for.

torch's rebuild functions map to :class:`Call` subclasses (the call is recorded, interpreted later by
:mod:`ckptfs.convert`); ``collections.OrderedDict`` to :class:`PickledOrderedDict`; dtype, storage-type,
layout and qscheme globals to inert markers; a few builtins (``_codecs.encode``, ``set``, ...) to small
:class:`Builder` functions that only accept plain data. Builders are objects, not functions, so a
pickle's BUILD cannot set attributes such as ``__defaults__`` on them. Everything else is opaque.
"""

from __future__ import annotations

from typing import Any, Callable, cast

from ..dtypes import DTYPES, STORAGE_DTYPES, STORAGE_MODULES, UNTYPED_STORAGE
from .nodes import (
    Inert,
    NumpyArray,
    NumpyDType,
    NumpyScalar,
    OpaqueObject,
    PickledOrderedDict,
    StorageType,
    TorchDType,
    TorchGlobal,
    built_call_class,
    call_class,
    opaque_class,
)


class Builder(Inert):
    """A named, inert callable the pickle may REDUCE. BUILD on it is refused (Inert.__setstate__)."""

    __slots__ = ("qualname", "fn")

    def __init__(self, qualname: str, fn: Callable[..., Any]) -> None:
        self.qualname = qualname
        self.fn = fn

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)

    def __repr__(self) -> str:
        return f"<builder {self.qualname}>"


def opaque_call(qualname: str, args: tuple[object, ...]) -> OpaqueObject:
    """The record of a call ckptfs will not make (wrong argument types for a safe builder)."""
    cls = opaque_class(qualname + "()")
    obj = cls.__new__(cls, *args)
    obj.how = "call"
    return obj


# --- recorded torch calls --------------------------------------------------------------------------------
UTILS = "torch._utils"
TENSOR_CALLS = {  # (module, name) -> Call subclass; interpreted by ckptfs.convert
    (UTILS, name): call_class(f"{UTILS}.{name}")
    for name in (
        "_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_parameter",
        "_rebuild_parameter_with_state", "_rebuild_qtensor", "_rebuild_sparse_tensor", "_rebuild_sparse_csr",
        "_rebuild_sparse_csr_tensor",  # torch 1.10 - 1.13
        "_rebuild_nested_tensor", "_rebuild_meta_tensor_no_storage", "_rebuild_wrapper_subclass",
        "_rebuild_device_tensor_from_numpy", "_rebuild_device_tensor_from_cpu_tensor", "_rebuild_xla_tensor",
        "_rebuild_mkldnn_tensor",
    )
}
for _name in ("_rebuild_from_type_v2", "_rebuild_from_type"):
    TENSOR_CALLS[("torch._tensor", _name)] = call_class(f"torch._tensor.{_name}")
# Old torch (< 0.4) pickled a tensor as its class, called with no arguments, then BUILD (storage, offset,
# size, stride); Tensor.__setstate__ ran set_(). Recorded as BuiltCall, interpreted by ckptfs.convert.
LEGACY_TENSOR_DTYPES = {  # class name -> dtype name
    "DoubleTensor": "float64", "FloatTensor": "float32", "HalfTensor": "float16", "BFloat16Tensor": "bfloat16",
    "LongTensor": "int64", "IntTensor": "int32", "ShortTensor": "int16", "CharTensor": "int8",
    "ByteTensor": "uint8", "BoolTensor": "bool", "Tensor": "float32",  # torch.Tensor: the default dtype
}
LEGACY_TENSOR_CALLS = {}
for _mod in ("torch", "torch.cuda"):
    for _name in LEGACY_TENSOR_DTYPES:
        if _mod == "torch.cuda" and _name == "Tensor":
            continue
        LEGACY_TENSOR_CALLS[(_mod, _name)] = built_call_class(f"{_mod}.{_name}")
LEGACY_TENSOR_CALLS[("torch._tensor", "Tensor")] = built_call_class("torch._tensor.Tensor")
TENSOR_CALLS.update(LEGACY_TENSOR_CALLS)
for _name in ("Size", "device"):
    TENSOR_CALLS[("torch", _name)] = call_class(f"torch.{_name}")
TENSOR_CALLS[("torch.serialization", "_get_layout")] = call_class("torch.serialization._get_layout")


# --- small builders for plain data -----------------------------------------------------------------------
_SAFE_CODECS = {"latin1": "latin-1", "latin-1": "latin-1", "iso-8859-1": "latin-1", "utf-8": "utf-8",
                "utf8": "utf-8", "ascii": "ascii"}


def _codecs_encode(obj: object = None, encoding: object = "utf-8", errors: object = "strict") -> object:
    """``_codecs.encode(str, 'latin1')`` is how protocol-2 pickles spell bytes. Only a few fixed codecs
    are honoured: looking a codec up by an arbitrary name would import modules."""
    codec = _SAFE_CODECS.get(encoding.lower() if isinstance(encoding, str) else "")
    if isinstance(obj, str) and codec and errors == "strict":
        try:
            return obj.encode(codec)
        except UnicodeEncodeError:
            pass
    return opaque_call("_codecs.encode", (obj, encoding, errors))


def _bytearray(*args: object) -> object:
    if not args:
        return bytearray()
    if len(args) == 1 and isinstance(args[0], (bytes, bytearray, list)):
        try:
            return bytearray(args[0])  # a list must hold ints 0..255
        except (TypeError, ValueError):
            pass
    if len(args) == 2 and isinstance(args[0], str):
        enc = _codecs_encode(args[0], args[1])
        if isinstance(enc, bytes):
            return bytearray(enc)
    return opaque_call("builtins.bytearray", args)


def _container(kind: type) -> Callable[..., object]:
    def build(*args: object) -> object:
        if not args:
            return kind()
        if len(args) == 1 and type(args[0]) in (list, tuple, set, frozenset):
            try:
                return kind(args[0])
            except TypeError:  # unhashable members
                pass
        return opaque_call(f"builtins.{kind.__name__}", args)

    return build


def _complex(*args: object) -> object:
    if len(args) <= 2 and all(type(a) in (int, float) for a in args):
        return complex(*cast("tuple[float, ...]", args))  # ints and floats only, checked just above
    return opaque_call("builtins.complex", args)


def _reconstructor(cls: object = None, base: object = None, state: object = None) -> object:
    """``copyreg._reconstructor(cls, base, state)``: protocol 0/1 object creation."""
    if isinstance(cls, type) and issubclass(cls, OpaqueObject):
        obj = cls.__new__(cls)
        obj.how = "reconstructor"
        if state is not None:
            obj.args = (state,)
        return obj
    if cls is PickledOrderedDict:
        return PickledOrderedDict()
    return opaque_call("copyreg._reconstructor", (cls, base, state))


def _newobj(cls: object = None, *args: object) -> object:
    if isinstance(cls, type):
        if issubclass(cls, OpaqueObject):
            return cls.__new__(cls, *args)
        if issubclass(cls, PickledOrderedDict):
            return cls.__new__(cls, *args)
    return opaque_call("copyreg.__newobj__", (cls,) + args)


NUMPY_NDARRAY = TorchGlobal("numpy.ndarray")


def _numpy_reconstruct(cls: object = None, shape: object = None, code: object = None) -> object:
    if cls is NUMPY_NDARRAY:
        return NumpyArray()
    return opaque_call("numpy.core.multiarray._reconstruct", (cls, shape, code))


def _build() -> dict[tuple[str, str], object]:
    allowed: dict[tuple[str, str], object] = dict(TENSOR_CALLS)
    for name, dt in DTYPES.items():
        allowed[("torch", name)] = TorchDType(dt)
    for mod in STORAGE_MODULES:
        for name, dt in STORAGE_DTYPES.items():
            allowed[(mod, name)] = StorageType(f"{mod}.{name}", dt)
        allowed[(mod, UNTYPED_STORAGE)] = StorageType(f"{mod}.{UNTYPED_STORAGE}", None)
    for name in ("per_tensor_affine", "per_channel_affine", "per_tensor_symmetric", "per_channel_symmetric",
                 "per_channel_affine_float_qparams", "contiguous_format", "channels_last", "channels_last_3d",
                 "preserve_format", "strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr",
                 "sparse_bsc", "jagged", "_mkldnn"):
        allowed[("torch", name)] = TorchGlobal(f"torch.{name}")
    allowed[("collections", "OrderedDict")] = PickledOrderedDict
    builders: dict[tuple[str, str], Callable[..., object]] = {
        ("_codecs", "encode"): _codecs_encode,
        ("builtins", "bytearray"): _bytearray,
        ("builtins", "complex"): _complex,
        ("copyreg", "_reconstructor"): _reconstructor,
        ("copyreg", "__newobj__"): _newobj,
    }
    for kind in (set, frozenset, list, tuple):
        builders[("builtins", kind.__name__)] = _container(kind)
    for mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
        builders[(mod, "_reconstruct")] = _numpy_reconstruct
        allowed[(mod, "scalar")] = NumpyScalar
    for (mod, name), fn in builders.items():
        allowed[(mod, name)] = Builder(f"{mod}.{name}", fn)
    allowed[("numpy", "ndarray")] = NUMPY_NDARRAY
    allowed[("numpy", "dtype")] = NumpyDType
    return allowed


ALLOWED = _build()

# Python 2 module names, and torch's own renames (torch.load applies "torch.tensor" -> "torch._tensor").
MODULE_ALIASES = {"__builtin__": "builtins", "copy_reg": "copyreg", "torch.tensor": "torch._tensor"}
