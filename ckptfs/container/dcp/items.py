"""The items of a DCP checkpoint's ``.distcp`` files: each a complete ``torch.save`` zip at an offset.

An item is ``length`` bytes at ``offset`` of its file (a :class:`~ckptfs.source.SubRange`), decompressed
first when its transforms say ``stream.zstd/1``. A tensor item holds one tensor (the chunk), pickled as
``torch.save`` pickles any tensor; only that narrow form is accepted here (``_rebuild_tensor_v2`` / ``_v3``,
possibly inside ``_rebuild_parameter``, on one storage of the item), checked against the chunk the metadata
declares: dtype, sizes, every element inside its storage record, the record exactly the declared size.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...dtypes import DType
from ...errors import CkptfsError, TensorError, UnsupportedError
from ...limits import Limits
from ...pickle.allowlist import TENSOR_CALLS
from ...pickle.nodes import Call, PersistentId, StorageType, TorchDType
from ...source import ByteSource, SubRange
from ..torchzip import TorchZip
from .metadata import StorageInfo

ZSTD = "stream.zstd"
V2 = TENSOR_CALLS[("torch._utils", "_rebuild_tensor_v2")]
V3 = TENSOR_CALLS[("torch._utils", "_rebuild_tensor_v3")]
PARAMETER = TENSOR_CALLS[("torch._utils", "_rebuild_parameter")]


def item_source(file: ByteSource, info: StorageInfo, record: str) -> ByteSource:
    """The item's bytes (decompressed if it says so); TensorError when it lies outside its file or needs a
    transform ckptfs does not know."""
    if info.offset + info.length > file.size:
        raise TensorError(f"item [{info.offset}, {info.offset + info.length}) runs past the end of "
                          f"{info.relative_path} ({file.size} bytes)", file=file.name, record=record)
    src: ByteSource = SubRange(file, info.offset, info.length, info.where())
    for desc in info.transforms:
        name, _, version = desc.partition("/")
        if name != ZSTD or version.partition(".")[0] != "1":
            raise UnsupportedError(f"item transform {desc!r} is not supported (only {ZSTD}/1)", file=file.name,
                                   record=record)
        from ...source.zstd import ZstdFrame

        src = ZstdFrame(src, info.where())
    return src


@dataclass
class ItemTensor:
    """The tensor an item holds: a strided view of the storage record ``source``."""

    source: ByteSource
    dtype: DType
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int  # elements


def item_tensor(item: ByteSource, limits: Limits, where: str) -> ItemTensor:
    """Open the torch zip ``item`` and read the one tensor it holds (TensorError naming ``where``)."""

    def bad(msg: str) -> TensorError:
        return TensorError(f"item {where}: {msg}", file=item.name)

    try:
        z = TorchZip(item, limits)
        if z.byteorder != "little":
            raise bad("stored big-endian (not supported in DCP checkpoints)")
        obj = z.object_graph(strict=True).take()
    except TensorError:
        raise
    except CkptfsError as e:
        raise bad(e.reason) from None
    if isinstance(obj, Call) and type(obj) is PARAMETER:
        obj = obj.args[0] if obj.args else None
    if not isinstance(obj, Call) or type(obj) not in (V2, V3):
        name = type(obj).call if isinstance(obj, Call) else type(obj).__name__
        raise bad(f"holds {name}, not a plain tensor")
    a = obj.args
    if type(obj) is V3:
        if len(a) not in (7, 8) or not isinstance(a[6], TorchDType):
            raise bad("malformed _rebuild_tensor_v3 call")
        metadata = a[7] if len(a) == 8 else None
    else:
        if len(a) not in (6, 7):
            raise bad("malformed _rebuild_tensor_v2 call")
        metadata = a[6] if len(a) == 7 else None
    if metadata:
        raise UnsupportedError(f"item {where}: tensor metadata {sorted(map(str, metadata))} (conj/neg bits) is "
                               "not supported", file=item.name)
    pid, offset, size, stride = a[0], a[1], a[2], a[3]
    if type(pid) is not PersistentId or type(pid.args[0]) is not tuple or len(pid.args[0]) != 5:
        raise bad("the tensor's storage is not a storage reference")
    tag, stype, key, _location, numel = pid.args[0]
    if tag != "storage" or type(stype) is not StorageType or type(key) is not str or type(numel) is not int:
        raise bad("malformed storage reference")
    dtype = a[6].dtype if type(obj) is V3 else stype.dtype
    if dtype is None:
        raise bad("an untyped storage without a dtype")
    storage_bytes = numel * (1 if stype.dtype is None else stype.dtype.itemsize)
    if type(offset) is not int or offset < 0 or not _ints(size) or not _ints(stride) or len(size) != len(stride):
        raise bad(f"geometry offset {offset!r}, size {size!r}, stride {stride!r}")
    try:
        record_size = z.storage_size(key)
        source = z.storage_source(key)
    except CkptfsError as e:
        raise bad(e.reason) from None
    if record_size != storage_bytes:
        raise bad(f"record data/{key} holds {record_size} bytes, the pickle declares {storage_bytes}")
    n = 1
    last = offset
    for s, st in zip(size, stride, strict=True):
        n *= s
        last += (s - 1) * st
    if n and (last + 1) * dtype.itemsize > storage_bytes:
        raise bad(f"elements reach byte {(last + 1) * dtype.itemsize}, past its {storage_bytes}-byte storage")
    return ItemTensor(source, dtype, tuple(size), tuple(stride), offset)


def _ints(v: object) -> bool:
    return type(v) is tuple and len(v) <= 64 and all(type(x) is int and x >= 0 for x in v)
