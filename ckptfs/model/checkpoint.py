"""``Checkpoint``: an opened, indexed checkpoint. Reads tensors by key; never imports torch unless a
torch tensor is asked for."""

from __future__ import annotations

import os
import threading
from collections import Counter
from typing import TYPE_CHECKING, Any, Iterator

from ..container import open_container
from ..dtypes import numpy_dtype
from ..errors import CkptfsError, TensorError, UnsupportedError
from ..limits import DEFAULT_LIMITS, Limits
from ..pickle.nodes import TensorNode
from ..pickle.unpickler import gc_paused, unpickle
from ..source import ByteSource, open_source
from .convert import Converter
from .index import COMPOSITE, CONTAINERS, LEAF, LINK, TENSOR, Index
from .meta import Meta
from .reader import TensorReader
from .tensors import NO_DATA_KINDS, ensure_valid, nbytes, numel, validate_all

if TYPE_CHECKING:
    import numpy as np

    from .slicing import TensorSlice

Key = "str | tuple"


class Checkpoint:
    """A checkpoint file, indexed: keys, metadata and bytes of every tensor, read on demand."""

    def __init__(self, path: "str | os.PathLike[str] | ByteSource", *, strict: bool = False,
                 limits: Limits = DEFAULT_LIMITS) -> None:
        self.source = open_source(path)
        self.name = self.source.name
        self.limits = limits
        self.strict = strict
        self._readers: dict[int, TensorReader] = {}
        self._lock = threading.Lock()
        try:
            self.container = open_container(self.source, limits)
            data = self.container.pickle_bytes()
            record = self.container.info.get("root", "")
            record = f"{record}/data.pkl" if self.container.kind in ("zip", "torchscript") else "pickle"
            converter = self.converter = Converter(limits)  # kept: values outside the index (opaque state)
            with gc_paused():  # one pause for everything that builds the index (see gc_paused)
                obj, up = unpickle(data, strict=strict, limits=limits, file=self.name, record=record)
                del data
                self.unknown_globals = dict(up.unknown_globals)
                del up  # its memo would keep every unpickled object alive while the index is built
                owned = [obj]
                del obj
                self.index = Index(owned, limits=limits, converter=converter, owned=True)
                bind = getattr(self.container, "bind", None)
                if bind is not None:  # legacy streams locate storages once their dtypes are known
                    bind(converter.refs)
            container, max_ndim = self.container, limits.max_ndim
            self.index.validator = lambda t: ensure_valid(t, container, max_ndim)
        except CkptfsError as e:
            self.source.close()
            raise e.at(file=self.name) from None
        except BaseException:
            self.source.close()
            raise

    # --- context manager ---------------------------------------------------------------------------
    def close(self) -> None:
        self.source.close()

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ckptfs.Checkpoint {self.name!r}: {self.index.n_tensors} tensors, {self.format}>"

    # --- keys ----------------------------------------------------------------------------------------
    @property
    def format(self) -> str:
        return self.container.kind

    @property
    def byteorder(self) -> str:
        return self.container.byteorder

    def keys(self) -> list[str]:
        """Dotted keys of every tensor and leaf value, in checkpoint order."""
        keys = self.index.keys
        return [keys[i] for i in self.index.leaves()]

    def code_files(self) -> dict[str, bytes]:
        """A TorchScript archive's sources (``code/**.py``, relative paths -> text bytes); {} otherwise.
        Read as text only: ckptfs never compiles or runs them."""
        names = getattr(self.container, "code_files", None)
        return {n: self.container.read_code(n) for n in names()} if names is not None else {}  # type: ignore[attr-defined]

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

    def row(self, key: "str | tuple") -> int:
        """The index row of a key (dotted string, or the tuple of original keys), links followed."""
        index = self.index
        i = index.by_key.get(key) if type(key) is str else index.find_path(key) if isinstance(key, tuple) else None
        if i is None:
            raise KeyError(key)
        return i if index.kinds[i] != LINK else index.resolve(i)

    # --- metadata --------------------------------------------------------------------------------------
    def meta(self, key: "str | tuple") -> Meta:
        return Meta(self.index, self.row(key), self.byteorder, self.container.record_name)

    def info(self) -> dict[str, Any]:
        """Format facts and totals (what ``ckptfs info`` prints)."""
        validate_all(self.index, self.container, self.limits)
        per_dtype: Counter = Counter()
        per_dtype_count: Counter = Counter()
        kinds: Counter = Counter()
        n_elems = 0
        errors = 0
        unsupported = 0
        storages = set()
        nodes = self.index.nodes
        for i in self.index.tensors():
            t: TensorNode = nodes[i]  # type: ignore[assignment]
            kinds[t.kind] += 1
            if t.storage is not None:
                storages.add(t.storage.key)
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
        return {
            "file": self.name,
            "size": self.source.size,
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
            "unknown_globals": dict(sorted(self.unknown_globals.items())),
            "torch_version_hint": _version_hint(self.container.info),
        }

    # --- bytes -----------------------------------------------------------------------------------------
    def reader(self, key: "str | tuple") -> TensorReader:
        i = self.row(key)
        r = self._readers.get(i)
        if r is None:
            index = self.index
            if index.kinds[i] != TENSOR:
                if index.kinds[i] == COMPOSITE:  # sparse, nested, per-channel quantized: bytes are its parts'
                    parts = ", ".join(index.keys[c] for c in index.children(i))
                    raise UnsupportedError(f"a {index.nodes[i].kind} tensor is stored as parts: read {parts}",  # type: ignore[attr-defined]
                                           file=self.name, record=index.keys[i])
                raise TensorError(f"is a {index.kinds[i]}, not a tensor", file=self.name, record=index.keys[i])
            r = self.node_reader(index.nodes[i], index.keys[i])  # type: ignore[arg-type]
            with self._lock:
                self._readers[i] = r
        return r

    def node_reader(self, t: TensorNode, key: str = "") -> TensorReader:
        """A reader for a tensor node (validated, its record bound); ``key`` names it in errors."""
        ensure_valid(t, self.container, self.limits.max_ndim)
        ref = t.storage
        if ref is not None and ref.record is None and t.error is None:
            try:
                ref.record = self.container.storage_record(ref.key)
            except CkptfsError as e:
                raise e.at(file=self.name, record=key or None) from None
        return TensorReader(t, file_name=self.name, key=key)

    def read(self, key: "str | tuple", offset: int = 0, size: int = -1) -> bytes:
        """Bytes [offset, offset+size) of the tensor's C-contiguous content in the file's byte order."""
        return self.reader(key).read(offset, size)

    def numpy(self, key: "str | tuple") -> "np.ndarray":
        """The tensor as a read-only numpy array: a zero-copy view of the file (page cache) when the
        tensor is a contiguous range of a stored record, else a gathered copy."""
        import numpy as np

        r = self.reader(key)
        t = r.t
        if t.kind in NO_DATA_KINDS:  # meta / storage-less wrapper tensors: a shape and a dtype, no data
            raise UnsupportedError(f"a {t.kind} tensor has no data (its metadata is all there is)", file=self.name,
                                   record=r.key)
        order = (t.extra or {}).get("byteorder", self.byteorder)
        try:
            dt = numpy_dtype(t.dtype, order)
        except CkptfsError as e:
            raise e.at(file=self.name, record=key if isinstance(key, str) else None) from None
        offset = self.file_offset(r)
        if offset is not None:
            arr = np.frombuffer(self.source.mmap(), dtype=dt, count=numel(t.shape), offset=offset)  # type: ignore[attr-defined]
            arr.flags.writeable = False
            return arr.reshape(t.shape)
        data = r.read()
        arr = np.frombuffer(data, dtype=dt)
        return arr.reshape(t.shape)  # read() gathers any strided layout (a Fortran-ordered array too) in C order

    def file_offset(self, r: TensorReader) -> int | None:
        """Where a tensor's bytes start in the local file when they are one stored range (zero-copy
        views are possible), else None."""
        if not (r.contiguous and r.inline is None and r.size) or not hasattr(self.source, "mmap"):
            return None
        span = r.record.file_span()  # type: ignore[union-attr]
        if span is None:
            return None
        self.source.check_unchanged()
        return span[0] + r.base

    def tensor(self, key: "str | tuple", map_location: Any = "cpu", *, mmap: bool = True) -> Any:
        """The tensor as torch.load returns it (dtype, shape, requires_grad, Parameter-ness; laid out
        contiguously). Imports torch.

        With ``mmap=True`` (default) a tensor stored as one uncompressed range in the file's byte order
        is a copy-on-write view of the file (like ``torch.load(mmap=True)``): no read, no copy until its
        pages are touched; writes stay private. Otherwise (or ``mmap=False``) its bytes are read.
        """
        from ..torchio.tensors import build_tensor

        return build_tensor(self, key, map_location, mmap=mmap)

    def slice(self, key: "str | tuple", framework: str = "numpy") -> "TensorSlice":
        """``ckpt.slice(key)[a:b, ...]``: read only the bytes a slice needs."""
        from .slicing import TensorSlice

        return TensorSlice(self, key, framework)

    # safetensors-style names
    def get_tensor(self, key: str) -> Any:
        return self.tensor(key)

    def get_slice(self, key: str) -> "TensorSlice":
        return self.slice(key, framework="pt")

    def metadata(self) -> dict[str, Any]:
        return self.info()

    # --- values ----------------------------------------------------------------------------------------
    def value(self, key: "str | tuple") -> Any:
        """A leaf's Python value (dtype/device markers and opaque classes as inert objects)."""
        i = self.row(key)
        if self.index.kinds[i] != LEAF:
            raise TypeError(f"{self.index.keys[i]!r} is a {self.index.kinds[i]}, not a leaf value")
        return self.index.nodes[i]


def _version_hint(info: dict) -> str:
    """What the records present say about the writer (torch.save added records over versions)."""
    if info.get("kind") == "torchscript":
        return f"torch.jit.save (TorchScript archive, version record {info.get('version', '?')})"
    if info.get("kind") == "legacy":
        return "torch < 1.6, or _use_new_zipfile_serialization=False"
    if ".storage_alignment" in info or ".format_version" in info:
        return "torch >= 2.4 (.format_version / .storage_alignment records)"
    if info.get("byteorder_record"):
        return "torch 2.1 - 2.3 (byteorder record, no .format_version)"
    return "torch 1.6 - 2.0 (no byteorder record)"
