"""A DCP checkpoint's ``.metadata``: read without torch and without running anything.

The file is a plain ``pickle.dump`` of ``torch.distributed.checkpoint.metadata.Metadata``. It is read by
ckptfs's safe unpickler with an allowlist of its own, strictly: the DCP metadata classes (each an inert
record of what the pickle gave it: NEWOBJ with no arguments, then one BUILD), ``torch.Size``, dtypes,
``torch.serialization._get_layout``, the memory-format enum and ``pathlib`` paths. Any other global, any
persistent id, and any of these classes called with arguments is refused: the whole file is then a
FormatError naming ``.metadata`` (torch itself still reads it with a raw ``pickle.load``).

The records are then checked field by field and turned into plain data (:class:`DcpMetadata`); a field of
the wrong type is a FormatError naming the entry.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ...dtypes import DTYPES, DType
from ...errors import CkptfsError, FormatError, UnsafePickleError, brief
from ...limits import Limits
from ...pickle.allowlist import Builder
from ...pickle.nodes import Inert, TorchDType
from ...pickle.unpickler import unpickle
from ...source import ByteSource, read_exact

METADATA_FILE = ".metadata"
MODULE = "torch.distributed.checkpoint.metadata"
FILESYSTEM = "torch.distributed.checkpoint.filesystem"
#: where torch 2.0 - 2.2 kept TensorProperties and its enum
SHARD_MODULE = "torch.distributed._shard.sharded_tensor.metadata"
REFUSAL = "is not one of the DCP metadata classes (the .metadata allowlist)"
MAX_DIMS = 64


class Record(Inert):
    """An instance of one of DCP's metadata classes, as data: what BUILD gave it, in ``state``.

    Made by ``object.__new__`` (NEWOBJ) in C: a record made with arguments is a TypeError, which refuses
    the pickle; read ``state`` with ``getattr(r, "state", None)`` (unset until BUILT)."""

    __slots__ = ("state",)
    qualname: ClassVar[str] = "?"
    state: object

    def __setstate__(self, state: object) -> None:
        self.state = state

    def __repr__(self) -> str:
        return f"<{self.qualname}>"


def _record(qualname: str) -> type[Record]:
    return type(qualname.rsplit(".", 1)[-1], (Record,), {"__slots__": (), "qualname": qualname,
                                                           "__module__": __name__})


Metadata = _record(f"{MODULE}.Metadata")
TensorStorageMetadata = _record(f"{MODULE}.TensorStorageMetadata")
BytesStorageMetadata = _record(f"{MODULE}.BytesStorageMetadata")
ChunkStorageMetadata = _record(f"{MODULE}.ChunkStorageMetadata")
TensorProperties = _record(f"{MODULE}.TensorProperties")
StorageMeta = _record(f"{MODULE}.StorageMeta")
MetadataIndex = _record(f"{MODULE}.MetadataIndex")
StorageInfoRecord = _record(f"{FILESYSTEM}._StorageInfo")


def _layout(*args: object) -> str:
    if len(args) == 1 and type(args[0]) is str:
        return args[0]
    raise UnsafePickleError(f"torch.serialization._get_layout of {brief(args, 60)}")


def _path(*args: object) -> str:
    parts = [a for a in args if isinstance(a, str)]
    if args and len(parts) == len(args):
        return posixpath.join(*parts)
    raise UnsafePickleError(f"pathlib path of {brief(args, 60)}")


def _allowlist() -> dict[tuple[str, str], object]:
    allowed: dict[tuple[str, str], object] = {}
    for cls in (Metadata, TensorStorageMetadata, BytesStorageMetadata, ChunkStorageMetadata, TensorProperties,
                StorageMeta, MetadataIndex, StorageInfoRecord):
        mod, _, name = cls.qualname.rpartition(".")
        allowed[(mod, name)] = cls
    allowed[(SHARD_MODULE, "TensorProperties")] = TensorProperties
    # (called once per tensor or chunk: C types, not Python builders; what they make is checked afterwards)
    for mod, name in ((MODULE, "_MEM_FORMAT_ENCODING"), (SHARD_MODULE, "MEM_FORMAT_ENCODING")):
        allowed[(mod, name)] = int
    allowed[("torch", "Size")] = tuple
    allowed[("torch.serialization", "_get_layout")] = Builder("torch.serialization._get_layout", _layout)
    for mod in ("pathlib", "pathlib._local"):
        for name in ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path"):
            allowed[(mod, name)] = Builder(f"{mod}.{name}", _path)
    for name, dt in DTYPES.items():
        allowed[("torch", name)] = TorchDType(dt)
    return allowed


ALLOWED = _allowlist()


# --- plain data ------------------------------------------------------------------------------------------


@dataclass(slots=True)
class StorageInfo:
    """Where an item lies: ``length`` bytes at ``offset`` of ``relative_path``, through ``transforms``."""

    relative_path: str
    offset: int
    length: int
    transforms: tuple[str, ...] = ()

    def where(self) -> str:
        return f"{self.relative_path}@{self.offset}"


@dataclass(slots=True)
class Chunk:
    """One saved piece of a tensor: its place in the tensor, and the item holding it."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    storage: StorageInfo | None = None


@dataclass(slots=True)
class TensorEntry:
    fqn: str
    dtype: DType
    size: tuple[int, ...]
    chunks: list[Chunk]
    requires_grad: bool = False
    error: str | None = None  # why its bytes cannot be served (found from the metadata alone)


@dataclass(slots=True)
class BytesEntry:
    fqn: str
    storage: StorageInfo | None = None


@dataclass
class DcpMetadata:
    entries: dict[str, TensorEntry | BytesEntry]
    #: fqn -> the path of original keys (planner_data): where the entry sits in the state_dict
    paths: dict[str, tuple[str | int, ...]]
    version: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)


# --- reading ---------------------------------------------------------------------------------------------


def _sizes(v: object) -> bool:
    """A tuple of at most MAX_DIMS non-negative ints (a plain loop: called for every size and offset)."""
    if type(v) is not tuple or len(v) > MAX_DIMS:
        return False
    for x in v:
        if type(x) is not int or x < 0:
            return False
    return True


def read_bytes(source: ByteSource, limits: Limits) -> bytes:
    """The ``.metadata`` file's bytes (LimitError over ``Limits.max_pickle_bytes``)."""
    if source.size > limits.max_pickle_bytes:
        from ...errors import LimitError

        raise LimitError(f"{source.size} bytes is over the pickle limit of {limits.max_pickle_bytes} (raise "
                         "Limits.max_pickle_bytes to index it)", file=source.name)
    return read_exact(source, 0, source.size, "the metadata")


def read_metadata(source: ByteSource, limits: Limits, data: bytes | None = None) -> DcpMetadata:
    """Unpickle and check a ``.metadata`` file, or its bytes ``data`` read already (FormatError /
    UnsafePickleError / LimitError naming it)."""
    if data is None:
        data = read_bytes(source, limits)
    obj, up, _ = unpickle(data, strict=True, limits=limits, file=source.name, record=None, allowlist=ALLOWED,
                       refusal=REFUSAL, persistent_ids=False)
    del up
    try:
        return _Reader(source.name).metadata(obj)
    except CkptfsError as e:
        raise e.at(file=source.name) from None


class _Reader:
    def __init__(self, name: str) -> None:
        self.name = name

    def fail(self, msg: str, record: str | None = None) -> FormatError:
        return FormatError(msg, file=self.name, record=record)

    def state(self, obj: object, cls: type[Record], what: str, record: str | None = None) -> dict[str, Any]:
        if type(obj) is not cls:
            raise self.fail(f"{what} is {brief(obj, 60)}, not a {cls.qualname.rsplit('.', 1)[-1]}", record)
        st = getattr(obj, "state", None)
        if type(st) is dict:
            return st
        if st is None:
            return {}
        if type(st) is tuple and len(st) == 2 and (st[0] is None or type(st[0]) is dict) and type(st[1]) is dict:
            return {**(st[0] or {}), **st[1]}  # (dict state, slot state): a slotted or frozen dataclass
        raise self.fail(f"{what} holds {brief(st, 60)}, not its fields", record)

    def ints(self, v: object, what: str, record: str) -> tuple[int, ...]:
        if type(v) is not tuple or len(v) > MAX_DIMS or not all(type(x) is int and x >= 0 for x in v):
            raise self.fail(f"{what} is {brief(v, 60)}, not a tuple of non-negative ints", record)
        return v

    def metadata(self, obj: object) -> DcpMetadata:
        st = self.state(obj, Metadata, "the pickle")
        sdm = st.get("state_dict_metadata")
        if type(sdm) is not dict:
            raise self.fail(f"state_dict_metadata is {brief(sdm, 60)}, not a dict")
        entries: dict[str, TensorEntry | BytesEntry] = {}
        for fqn, md in sdm.items():
            if type(fqn) is not str:
                raise self.fail(f"a key of state_dict_metadata is {brief(fqn, 60)}, not a string")
            entries[fqn] = self.entry(fqn, md)
        self.storages(st.get("storage_data"), entries)
        paths = self.paths(st.get("planner_data"), entries)
        version = st.get("version")
        facts: dict[str, Any] = {"version": version if type(version) is str else None}
        meta = st.get("storage_meta")
        if meta is not None:
            ms = self.state(meta, StorageMeta, "storage_meta")
            for k in ("checkpoint_id", "save_id", "load_id"):
                if type(ms.get(k)) is str:
                    facts[k] = ms[k]
            mods = ms.get("modules")
            if type(mods) is list and all(type(m) is str for m in mods):
                facts["modules"] = mods
        return DcpMetadata(entries, paths, facts["version"], facts)

    def entry(self, fqn: str, md: object) -> TensorEntry | BytesEntry:
        t = type(md)
        if t is BytesStorageMetadata:
            return BytesEntry(fqn)
        st = getattr(md, "state", None) if t is TensorStorageMetadata else None
        if type(st) is not dict:
            st = self.state(md, TensorStorageMetadata, "the entry", fqn)
        dtype, requires_grad = self.properties(st.get("properties"), fqn)
        size = st.get("size")
        if not _sizes(size):
            self.ints(size, "size", fqn)
        chunks_md = st.get("chunks")
        if type(chunks_md) is not list:
            raise self.fail(f"chunks is {brief(chunks_md, 60)}, not a list", fqn)
        chunks = []
        for c in chunks_md:
            cs = getattr(c, "state", None) if type(c) is ChunkStorageMetadata else None
            if type(cs) is not dict:
                cs = self.state(c, ChunkStorageMetadata, "a chunk", fqn)
            offsets, sizes = cs.get("offsets"), cs.get("sizes")
            if not (_sizes(offsets) and _sizes(sizes)):
                self.ints(offsets, "a chunk's offsets", fqn)
                self.ints(sizes, "a chunk's sizes", fqn)
            chunks.append(Chunk(offsets, sizes))  # type: ignore[arg-type]
        return TensorEntry(fqn, dtype, size, chunks, requires_grad)  # type: ignore[arg-type]

    def properties(self, p: object, fqn: str) -> tuple[DType, bool]:
        if type(p) is not TensorProperties:
            raise self.fail(f"properties is {brief(p, 60)}, not TensorProperties", fqn)
        st = getattr(p, "state", None)
        if type(st) is tuple and len(st) == 5:  # __getstate__: (dtype, layout, requires_grad, mem format, pin)
            dtype, layout, requires_grad = st[0], st[1], st[2]
        elif type(st) is dict:  # torch before TensorProperties had a __getstate__
            dtype, layout, requires_grad = st.get("dtype"), st.get("layout", "torch.strided"), st.get("requires_grad")
        else:
            raise self.fail(f"properties hold {brief(st, 60)}", fqn)
        if type(dtype) is not TorchDType:
            raise self.fail(f"dtype is {brief(dtype, 60)}", fqn)
        if layout != "torch.strided" and layout is not None:
            raise self.fail(f"layout {brief(layout, 40)} (only strided tensors are saved by DCP)", fqn)
        return dtype.dtype, requires_grad is True

    def storage_info(self, v: object, fqn: str) -> StorageInfo:
        st = getattr(v, "state", None) if type(v) is StorageInfoRecord else None
        if type(st) is not dict:
            st = self.state(v, StorageInfoRecord, "a storage entry", fqn)
        path, offset, length = st.get("relative_path"), st.get("offset"), st.get("length")
        transforms = st.get("transform_descriptors") or ()
        if type(path) is not str or type(offset) is not int or type(length) is not int or offset < 0 or length < 0:
            raise self.fail(f"storage entry {brief(st, 100)} is not a file, an offset and a length", fqn)
        if transforms and (type(transforms) not in (list, tuple) or not all(type(t) is str for t in transforms)):
            raise self.fail(f"transform_descriptors {brief(transforms, 60)}", fqn)
        return StorageInfo(path, offset, length, tuple(transforms))

    def storages(self, sd: object, entries: dict[str, TensorEntry | BytesEntry]) -> None:
        if type(sd) is not dict:
            raise self.fail(f"storage_data is {brief(sd, 60)}, not a dict")
        by_offsets: dict[str, dict[tuple[int, ...], Chunk]] = {}
        for mi, info in sd.items():
            ms = getattr(mi, "state", None) if type(mi) is MetadataIndex else None
            if type(ms) is not dict:
                ms = self.state(mi, MetadataIndex, "a storage_data key")
            fqn, offset = ms.get("fqn"), ms.get("offset")
            if type(fqn) is not str:
                raise self.fail(f"a storage_data key names {brief(fqn, 60)}")
            entry = entries.get(fqn)
            if entry is None:
                continue  # storage of nothing the state_dict has: never read
            storage = self.storage_info(info, fqn)
            if type(entry) is BytesEntry:
                if entry.storage is not None:
                    raise self.fail("two storage entries for one value", fqn)
                entry.storage = storage
                continue
            assert isinstance(entry, TensorEntry)
            if len(entry.chunks) == 1:
                chunk: Chunk | None = entry.chunks[0] if offset == entry.chunks[0].offsets else None
            else:
                chunks = by_offsets.get(fqn)
                if chunks is None:
                    chunks = by_offsets[fqn] = {c.offsets: c for c in entry.chunks}
                chunk = chunks.get(offset) if type(offset) is tuple else None
            if chunk is None:
                continue
            if chunk.storage is not None:
                entry.error = entry.error or f"two storage entries for the chunk at offsets {list(chunk.offsets)}"
            chunk.storage = storage

    def paths(self, pd: object, entries: dict[str, TensorEntry | BytesEntry]) -> dict[str, tuple[str | int, ...]]:
        """planner_data: fqn -> the keys from the state_dict's root (ints for list items); an fqn without
        one stays a key of the root, as torch's own loader does."""
        out: dict[str, tuple[str | int, ...]] = {}
        if type(pd) is not dict:
            return out
        for fqn, path in pd.items():
            if fqn not in entries:
                continue
            if type(path) not in (tuple, list) or not path or not all(type(p) in (str, int) for p in path):
                raise self.fail(f"planner_data path {brief(path, 60)} is not a tuple of keys", str(fqn))
            out[fqn] = tuple(path)
        return out
