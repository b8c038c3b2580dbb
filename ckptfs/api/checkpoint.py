"""``Checkpoint``: the Python API's facade over a catalog. Reads tensors by key; never imports torch unless
a torch tensor is asked for."""

from __future__ import annotations

import mmap
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Iterator

from ..container import Container
from ..dtypes import numpy_dtype
from ..errors import CkptfsError, LimitError, UnsupportedError
from ..limits import DEFAULT_LIMITS, Limits
from ..model.catalog import Catalog
from ..model.convert import Converter
from ..model.index import COMPOSITE, CONTAINERS, LEAF, LINK
from ..model.meta import Meta
from ..model.opener import Target, open_catalog
from ..model.reader import TensorData
from ..model.tensors import NO_DATA_KINDS, nbytes, numel, validate_all
from ..pickle.nodes import TensorNode
from ..source import ByteSource
from ..source.options import RemoteOptions

if TYPE_CHECKING:
    import numpy as np

    from .slicing import TensorSlice
    from .stats import Histogram, TensorStats

Key = str | tuple[object, ...]


class Checkpoint:
    """A checkpoint, indexed: keys, metadata and bytes of every tensor, read on demand.

    A facade over a :class:`~ckptfs.model.catalog.Catalog` (one file is its one-member case)."""

    def __init__(self, path: Target | Catalog, *, strict: bool = False, limits: Limits = DEFAULT_LIMITS,
                 storage_options: Mapping[str, object] | None = None, remote: RemoteOptions | None = None) -> None:
        self.catalog = path if isinstance(path, Catalog) else open_catalog(
            path, strict=strict, limits=limits, storage_options=storage_options, remote=remote)
        self.index = self.catalog.index
        self.name = self.catalog.name
        self.limits = self.catalog.limits
        self.strict = strict

    # --- the file ----------------------------------------------------------------------------------
    @property
    def source(self) -> ByteSource:
        """The file's source (the first file's, for a catalog of several)."""
        return self.catalog.members[0].source

    @property
    def container(self) -> Container:
        return self.catalog.members[0].container

    @property
    def format(self) -> str:
        """"zip", "legacy", "torchscript", "safetensors" for a file; "hf-sharded", "dcp" or "directory" for a
        directory (docs/formats.md)."""
        return self.catalog.format

    @property
    def byteorder(self) -> str:
        """Byte order of the stored tensor data (of the first file, for a catalog of several)."""
        return self.container.byteorder

    @property
    def unknown_globals(self) -> dict[str, int]:
        return self.catalog.unknown_globals()

    # --- context manager ---------------------------------------------------------------------------
    def close(self) -> None:
        self.catalog.close()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ckptfs.Checkpoint {self.name!r}: {self.index.n_tensors} tensors, {self.format}>"

    # --- keys ----------------------------------------------------------------------------------------
    def keys(self) -> list[str]:
        """Dotted keys of every tensor and leaf value, in checkpoint order."""
        keys = self.index.keys
        return [keys[i] for i in self.index.leaves()]

    def tensor_keys(self) -> list[str]:
        keys = self.index.keys
        return [keys[i] for i in self.index.tensors()]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.index.leaves())

    def __contains__(self, key: object) -> bool:
        try:
            self.row(key)  # type: ignore[arg-type]
        except KeyError:
            return False
        return True

    def row(self, key: Key) -> int:
        """The index row of a key (dotted string, or the tuple of original keys), links followed."""
        return self.catalog.row(key)

    def code_files(self) -> dict[str, bytes]:
        """A TorchScript archive's sources (``code/**.py``, relative paths -> text bytes); {} otherwise.
        Read as text only: ckptfs never compiles or runs them."""
        out = {}
        limit = self.limits.max_pickle_bytes
        for member, a in self.catalog.attachments():
            if a.group == "code":
                if a.size > limit:
                    raise LimitError(f"code file of {a.size} bytes is over the limit of {limit}",
                                     file=member.source.name if member else self.name, record=a.path)
                out[a.path] = a.open().pread(0, a.size)
        return out

    def other_files(self) -> dict[str, int]:
        """A checkpoint directory's other files (config.json, tokenizer files, the index ...): path relative
        to the directory -> size. {} for a single file."""
        return {a.path: a.size for a in self.catalog.files}

    def read_other_file(self, path: str, offset: int = 0, size: int = -1) -> bytes:
        """Bytes of one of :meth:`other_files`, as stored (read when asked, never kept)."""
        for a in self.catalog.files:
            if a.path == path:
                source = a.open()
                try:
                    n = a.size - offset if size < 0 else min(size, max(0, a.size - offset))
                    return source.pread(offset, n)
                finally:
                    source.close()
        raise KeyError(path)

    # --- metadata --------------------------------------------------------------------------------------
    def meta(self, key: Key) -> Meta:
        return self.catalog.meta_of(key)

    def info(self) -> dict[str, Any]:
        """Format facts and totals (what ``ckptfs info`` prints)."""
        validate_all(self.index, self.limits)
        per_dtype: Counter[str] = Counter()
        per_dtype_count: Counter[str] = Counter()
        kinds: Counter[str] = Counter()
        n_elems = 0
        errors = 0
        unsupported = 0
        storages = set()
        nodes = self.index.nodes
        for i in self.index.tensors():
            t: TensorNode = nodes[i]  # type: ignore[assignment]
            kinds[t.kind] += 1
            if t.storage is not None:
                storages.add((id(t.storage.owner), t.storage.key))
            if t.error:
                errors += 1
                continue
            if t.unsupported:
                unsupported += 1
            n_elems += numel(t.shape)
            per_dtype[t.dtype.name] += nbytes(t)
            per_dtype_count[t.dtype.name] += 1
        index_kinds = Counter(self.index.kinds)
        composite = Counter(nodes[i].kind for i in range(len(nodes)) if self.index.kinds[i] == COMPOSITE)  # type: ignore[attr-defined]
        catalog = self.catalog
        out = {
            "file": self.name,
            "size": sum(_member_bytes(m.container) for m in catalog.members) + sum(a.size for a in catalog.files),
            "format": self.format,
            "container": dict(self.container.info),
            "byteorder": self.byteorder,
            "tensors": self.index.n_tensors,
            "tensor_kinds": dict(kinds),
            "composite_tensors": dict(composite),  # sparse / nested / per-channel quantized: made of tensors above
            "storages": len(storages),
            "elements": n_elems,
            "tensor_bytes": sum(per_dtype.values()),
            "bytes_per_dtype": dict(per_dtype.most_common()),
            "tensors_per_dtype": dict(per_dtype_count.most_common()),
            "leaves": index_kinds[LEAF],
            "containers": sum(index_kinds[k] for k in CONTAINERS),
            "links": index_kinds[LINK],
            "errors": errors,
            "unsupported": unsupported,
            "unknown_globals": self.unknown_globals,
            "torch_version_hint": _version_hint(self.container.kind, self.container.info),
        }
        if catalog.layout:  # a directory: what it is, its members and other files
            out["layout"] = dict(catalog.layout)
            out["members"] = [{"name": m.name, "format": m.container.kind, "size": _member_bytes(m.container)}
                              for m in catalog.members]
            out["files"] = [{"path": a.path, "size": a.size} for a in catalog.files]
            out["problems"] = [f"{name}: {e.reason}" for name, e in catalog.problems]
        metadata = self.metadata()
        if metadata is not None:
            out["metadata"] = metadata
        return out

    def metadata(self) -> dict[str, str] | None:
        """What safetensors' ``metadata()`` gives: the free-form string metadata a file carries (a
        safetensors ``__metadata__``), or None. For several files (shards), their union in file order.
        Torch checkpoints carry none; :meth:`info` gives the format facts."""
        return self.catalog.user_metadata()

    # --- bytes -----------------------------------------------------------------------------------------
    def reader(self, key: Key) -> TensorData:
        """The tensor's bytes (:class:`~ckptfs.model.reader.TensorData`: ``read``, ``readinto``, ``content``);
        raises TensorError / UnsupportedError for entries whose bytes are not served."""
        return self.catalog.data(self.row(key))

    def node_reader(self, t: TensorNode, key: str = "") -> TensorData:
        """The bytes of any tensor node (one inside an opaque object's state, say)."""
        return self.catalog.node_data(t, key)

    def read(self, key: Key, offset: int = 0, size: int = -1) -> bytes:
        """Bytes [offset, offset+size) of the tensor's C-contiguous content in the file's byte order."""
        return self.reader(key).read(offset, size)

    def numpy(self, key: Key) -> np.ndarray:
        """The tensor as a read-only numpy array: a zero-copy view of the file (page cache) when the
        tensor is a contiguous range of a stored record, else a gathered copy."""
        import numpy as np

        r = self.reader(key)
        t = r.t
        if t.kind in NO_DATA_KINDS:  # meta / storage-less wrapper tensors: a shape and a dtype, no data
            raise UnsupportedError(f"a {t.kind} tensor has no data (its metadata is all there is)", file=self.name,
                                   record=r.key)
        try:
            dt = numpy_dtype(t.dtype, self.catalog.byteorder_of(t))
        except CkptfsError as e:
            raise e.at(file=self.name, record=key if isinstance(key, str) else None) from None
        mapped = self.catalog.mapped(r)
        if mapped is not None:
            buf, offset = mapped
            arr = np.frombuffer(buf, dtype=dt, count=numel(t.shape), offset=offset)
            arr.flags.writeable = False
            return arr.reshape(t.shape)
        arr = np.frombuffer(r.read(), dtype=dt)
        return arr.reshape(t.shape)  # read() gathers any strided layout (a Fortran-ordered array too) in C order

    def mapped(self, r: TensorData) -> tuple[mmap.mmap, int] | None:
        """The file's private map and the tensor's offset in it, when the tensor is one stored range."""
        return self.catalog.mapped(r)

    def converter_of(self, row: int) -> Converter:
        return self.catalog.converter_of(row)

    def tensor(self, key: Key, map_location: Any = "cpu", *, mmap: bool = True) -> Any:
        """The tensor as torch.load returns it (dtype, shape, requires_grad, Parameter-ness; laid out
        contiguously). Imports torch.

        With ``mmap=True`` (default) a tensor stored as one uncompressed range in the file's byte order
        is a copy-on-write view of the file (like ``torch.load(mmap=True)``): no read, no copy until its
        pages are touched; writes stay private. Otherwise (or ``mmap=False``) its bytes are read.
        """
        from ..torchio.tensors import build_tensor

        return build_tensor(self.catalog, self.row(key), map_location, mmap=mmap)

    def slice(self, key: Key, framework: str = "numpy") -> TensorSlice:
        """``ckpt.slice(key)[a:b, ...]``: read only the bytes a slice needs."""
        from .slicing import TensorSlice

        return TensorSlice(self.catalog, self.row(key), framework)

    # safetensors-style names
    def get_tensor(self, key: str) -> Any:
        return self.tensor(key)

    def get_slice(self, key: str) -> TensorSlice:
        return self.slice(key, framework="pt")

    # --- statistics ------------------------------------------------------------------------------------
    def stats(self, key: Key, *, chunk_bytes: int | None = None) -> TensorStats:
        """min, max, mean, std, abs max and NaN / Inf / zero counts of a tensor, read in chunks (bounded
        memory); see :mod:`ckptfs.api.stats` for what each number means."""
        from ..model.numeric import CHUNK_BYTES
        from .stats import tensor_stats

        return tensor_stats(self.catalog, self.row(key), chunk_bytes=chunk_bytes or CHUNK_BYTES)

    def histogram(self, key: Key, bins: int = 50, value_range: tuple[float, float] | None = None) -> Histogram:
        """Counts of a real tensor's finite values in ``bins`` equal bins (numpy.histogram's edges)."""
        from .stats import histogram

        return histogram(self.catalog, self.row(key), bins=bins, value_range=value_range)

    # --- values ----------------------------------------------------------------------------------------
    def value(self, key: Key) -> Any:
        """A leaf's Python value (dtype/device markers and opaque classes as inert objects)."""
        i = self.row(key)
        if self.index.kinds[i] != LEAF:
            raise TypeError(f"{self.index.keys[i]!r} is a {self.index.kinds[i]}, not a leaf value")
        return self.index.nodes[i]


def _member_bytes(container: Container) -> int:
    """Bytes of a member's files (a DCP checkpoint is its .metadata and data files)."""
    n = container.info.get("bytes")
    return n if isinstance(n, int) else container.source.size


def _version_hint(kind: str, info: dict[str, Any]) -> str:
    """What the records present say about the writer (torch.save added records over versions)."""
    if kind == "safetensors":
        return "safetensors (safetensors.torch.save_file, huggingface_hub, transformers ...)"
    if kind == "dcp":
        return f"torch.distributed.checkpoint (metadata version {info.get('version') or '?'})"
    if info.get("kind") == "torchscript":
        return f"torch.jit.save (TorchScript archive, version record {info.get('version', '?')})"
    if info.get("kind") == "legacy":
        return "torch < 1.6, or _use_new_zipfile_serialization=False"
    if ".storage_alignment" in info or ".format_version" in info:
        return "torch >= 2.4 (.format_version / .storage_alignment records)"
    if info.get("byteorder_record"):
        return "torch 2.1 - 2.3 (byteorder record, no .format_version)"
    return "torch 1.6 - 2.0 (no byteorder record)"
