"""A torch.distributed.checkpoint (DCP) directory as one container.

``.metadata`` (read by :mod:`.metadata`) lists every entry of the saved state_dict with where it lies;
``__<rank>_<n>.distcp`` files hold the items. The object graph is the state_dict as torch's own loader
rebuilds it (``dcp_to_torch_save``): nested dicts (and lists, for int keys) along each entry's
``planner_data`` path, whose leaves are

* tensors: one :class:`TensorNode` per entry, however many chunks it was saved in, whose storage (key: the
  entry's fqn) is served by :meth:`DcpCheckpoint.storage_source`: a range of the item's record when the
  tensor is one contiguous chunk (zero-copy), else a :class:`~.chunks.ChunkedTensor` assembling it. Chunk
  items are opened lazily, on the tensor's first read; the tiling of its chunks is checked when indexing;
* values (``BytesStorageMetadata``): each item is a ``torch.save`` of a Python object, unpickled here with
  the usual allowlist; storage keys inside it are prefixed with ``<n>:`` so they never meet another item's.

A problem with one entry (chunks that overlap or leave holes, an item past the end of its file, an item
that is not the tensor the metadata says) is an error on that entry alone.
"""

from __future__ import annotations

import re
import threading
from typing import Any, Mapping, Sequence

from ...errors import CkptfsError, FormatError, LimitError, TensorError
from ...limits import DEFAULT_LIMITS, Limits
from ...pickle.allowlist import opaque_call
from ...pickle.nodes import StorageRef, TensorNode, contiguous_strides
from ...pickle.unpickler import probed_together
from ...source import ByteSource, Directory, SubRange
from ..base import Attachment, GraphDigest, ObjectGraph
from ..torchzip import TorchZip
from .chunks import ChunkData, ChunkedTensor, check_tiling
from .items import item_source, item_tensor
from .metadata import METADATA_FILE, BytesEntry, DcpMetadata, TensorEntry, read_bytes, read_metadata

DISTCP = ".distcp"
#: the value standing for a value item that cannot be read (an opaque object whose __args__ say why)
UNREADABLE = "ckptfs.unreadable_value"


RANK_METADATA = re.compile(r"__(\d{1,9})\.metadata")


def metadata_files(names: Sequence[str]) -> list[str]:
    """The metadata files of a DCP listing: ``.metadata``, or else (a save without rank coordination,
    ``use_collectives=False``) every rank's ``__<rank>.metadata``, in rank order."""
    if METADATA_FILE in names:
        return [METADATA_FILE]
    ranked = [(int(m.group(1)), n) for n in names if (m := RANK_METADATA.fullmatch(n))]
    return [n for _, n in sorted(ranked)]


def is_dcp_directory(names: Sequence[str]) -> bool:
    """A listing (file names) is a DCP checkpoint: metadata and at least one ``.distcp`` file."""
    return bool(metadata_files(names)) and any(n.endswith(DISTCP) for n in names)


def _merged(metas: list[DcpMetadata], name: str) -> DcpMetadata:
    """Every rank's metadata (a save without coordination) as one: entries united in rank order; a tensor's
    chunks from every rank, a chunk two ranks wrote (a replicated tensor) kept once, from the first; two
    ranks disagreeing on a tensor's dtype or shape, or on what an entry is, make it an error (in either rank
    order); ranks placing an entry at two paths refuse the checkpoint (``name``: the first metadata file)."""
    out = DcpMetadata({}, {}, metas[0].version, dict(metas[0].facts))
    for meta in metas:
        for fqn, entry in meta.entries.items():
            have = out.entries.get(fqn)
            if have is None:
                out.entries[fqn] = entry
                continue
            if isinstance(have, TensorEntry) and isinstance(entry, TensorEntry):
                if (have.dtype, have.size) != (entry.dtype, entry.size):
                    have.error = have.error or (f"ranks disagree on its dtype and shape ({have.dtype.name} "
                                                f"{list(have.size)} vs {entry.dtype.name} {list(entry.size)})")
                    continue
                seen = {(c.offsets, c.sizes) for c in have.chunks}
                have.chunks += [c for c in entry.chunks if (c.offsets, c.sizes) not in seen]
                have.error = have.error or entry.error
            elif type(have) is not type(entry):  # the tensor kept (in the first one's place), with the error
                tensor = have if isinstance(have, TensorEntry) else entry
                assert isinstance(tensor, TensorEntry)
                tensor.error = tensor.error or "a tensor on one rank, a value on another"
                out.entries[fqn] = tensor
        for fqn, path in meta.paths.items():
            if out.paths.setdefault(fqn, path) != path:
                raise FormatError(f"ranks disagree on where it goes in the state_dict ({list(out.paths[fqn])} vs "
                                  f"{list(path)})", file=name, record=fqn)
    return out


def _lists(made: list[tuple[dict[object, object], object, dict[object, object]]]) -> None:
    """Dicts made along paths whose keys are exactly 0 .. n-1 become lists, as torch's loader makes them
    (innermost first, so that a parent turned into a list holds its children's final form)."""
    for parent, key, d in reversed(made):
        n = len(d)
        if n and all(type(k) is int for k in d) and set(d) == set(range(n)):
            parent[key] = [d[i] for i in range(n)]


class DcpCheckpoint:
    """A DCP directory: its ``.metadata`` read when opened, items read when needed."""

    kind = "dcp"
    byteorder = "little"

    def __init__(self, directory: Directory, limits: Limits = DEFAULT_LIMITS, path: str = "") -> None:
        """``path``: the DCP directory inside ``directory`` ("" for the directory itself)."""
        self.directory = directory
        self.limits = limits
        self.prefix = path.rstrip("/") + "/" if path else ""
        self.name = directory.display(path)
        listing = directory.list(path)
        self.file_sizes = {e.name: e.size for e in listing if not e.is_dir and not e.refused}
        self.refused = {e.name: e.refused for e in listing if not e.is_dir and e.refused}  # name -> why
        names = metadata_files(list(self.file_sizes))
        if not names:
            raise FormatError("no .metadata file (not a DCP checkpoint)", file=self.name)
        self.metadata_names = names
        self.sources: list[ByteSource] = []
        self._metadata: list[bytes] | None = []
        try:
            for n in names:
                self.sources.append(directory.open(self.prefix + n))
                self._metadata.append(read_bytes(self.sources[-1], limits))  # read now: probed with the others
        except BaseException:
            for s in self.sources:
                s.close()
            raise
        self.source = self.sources[0]
        self._files: dict[str, ByteSource] = {}
        self._lock = threading.Lock()
        self.meta: DcpMetadata | None = None
        self.tensors: dict[str, TensorEntry] = {}
        self._storages: dict[str, ByteSource] = {}
        self._value_items: dict[str, TorchZip] = {}  # key prefix -> the value item's zip
        data_files = [n for n in self.file_sizes if n.endswith(DISTCP)]
        meta_bytes = sum(s.size for s in self.sources)
        self.info: dict[str, Any] = {"metadata_bytes": meta_bytes, "files": len(data_files),
                                     "bytes": meta_bytes + sum(self.file_sizes[n] for n in data_files)}
        if names != [METADATA_FILE]:
            self.info["rank_metadata_files"] = len(names)

    def _fail(self, msg: str, record: str | None = None) -> FormatError:
        return FormatError(msg, file=self.source.name, record=record)

    # --- files and items ----------------------------------------------------------------------------
    def file(self, relative_path: str) -> ByteSource:
        """A data file of the checkpoint (opened once, on first use)."""
        f = self._files.get(relative_path)
        if f is None:
            with self._lock:
                f = self._files.get(relative_path)
                if f is None:
                    f = self._files[relative_path] = self.directory.open(self.prefix + relative_path)
        return f

    def _storage_problem(self, entry: TensorEntry) -> str | None:
        """What the metadata alone says is wrong with a tensor's chunks (tiling, items outside files)."""
        why = check_tiling(entry.size, [(c.offsets, c.sizes) for c in entry.chunks])
        if why is not None:
            return why
        for c in entry.chunks:
            info = c.storage
            if info is None:
                return f"the chunk at offsets {list(c.offsets)} has no storage entry"
            size = self.file_sizes.get(info.relative_path)
            refused = self.refused.get(info.relative_path)
            if refused is not None:
                return f"the chunk at offsets {list(c.offsets)} is in {info.relative_path}, refused: {refused}"
            if size is None or "/" in info.relative_path:
                return f"the chunk at offsets {list(c.offsets)} is in {info.relative_path!r}, which is not a file here"
            if info.offset + info.length > size:
                return (f"the chunk at offsets {list(c.offsets)} lies at [{info.offset}, {info.offset + info.length}) "
                        f"of {info.relative_path}, past its end ({size} bytes)")
        return None

    # --- the object graph ---------------------------------------------------------------------------
    def object_graph(self, strict: bool, digest: GraphDigest | None = None) -> ObjectGraph:
        # (``digest`` is for pickles unpickled in the probe's child: there is none here)
        datas = self._metadata or [None] * len(self.sources)  # type: ignore[list-item]
        self._metadata = None
        metas = []
        for source, data in zip(self.sources, datas, strict=True):
            metas.append(read_metadata(source, self.limits, data))
        meta = self.meta = metas[0] if len(metas) == 1 else _merged(metas, self.sources[0].name)
        n_tensors = sum(1 for e in meta.entries.values() if isinstance(e, TensorEntry))
        if n_tensors > self.limits.max_tensors:
            raise LimitError(f"{n_tensors} tensors is over the limit of {self.limits.max_tensors}",
                             file=self.source.name)
        root: dict[object, object] = {}
        made: list[tuple[dict[object, object], object, dict[object, object]]] = []
        made_ids: set[int] = set()
        unknown: dict[str, int] = {}
        chunks = compressed = 0
        items = self._value_zips(meta)
        with probed_together([z.pickles()[0] for z in items.values() if isinstance(z, TorchZip)], self.limits):
            for n, (fqn, entry) in enumerate(meta.entries.items()):
                if isinstance(entry, TensorEntry):
                    value: object = self._tensor_node(entry)
                    chunks += len(entry.chunks)
                    compressed += any(c.storage is not None and c.storage.transforms for c in entry.chunks)
                else:
                    value = self._value(entry, n, items[fqn], strict, unknown)
                    compressed += bool(entry.storage is not None and entry.storage.transforms)
                self._place(root, meta.paths.get(fqn, (fqn,)), value, fqn, made, made_ids)
        _lists(made)
        self.info.update(entries=len(meta.entries), tensors=n_tensors, values=len(meta.entries) - n_tensors,
                         chunks=chunks, compressed_entries=compressed,
                         **{k: v for k, v in meta.facts.items() if v is not None})
        return ObjectGraph([root], METADATA_FILE, unknown)

    def _tensor_node(self, entry: TensorEntry) -> TensorNode:
        numel = 1
        for s in entry.size:
            numel *= s
        ref = StorageRef(entry.fqn, entry.dtype, numel, "cpu", "dcp", self)
        # not requires_grad even when the metadata's TensorProperties say so: torch's loaders (dcp_to_torch_save,
        # dcp.load into an empty state_dict) make plain torch.empty tensors (the flag is in extra)
        t = TensorNode("dense", ref, entry.dtype, entry.size, contiguous_strides(entry.size), 0, False)
        why = entry.error or self._storage_problem(entry)
        if why is not None:
            ref.error = t.error = why
        self.tensors[entry.fqn] = entry
        return t

    def _value_zips(self, meta: DcpMetadata) -> dict[str, TorchZip | CkptfsError]:
        """Each value entry's item opened as a torch zip, its pickle read (or why it cannot be)."""
        out: dict[str, TorchZip | CkptfsError] = {}
        for fqn, entry in meta.entries.items():
            if isinstance(entry, TensorEntry):
                continue
            info = entry.storage
            try:
                if info is None:
                    raise self._fail("the value has no storage entry", record=fqn)
                if info.relative_path in self.refused:
                    raise self._fail(f"the value is in {info.relative_path}, refused: "
                                     f"{self.refused[info.relative_path]}", record=fqn)
                if info.relative_path not in self.file_sizes:
                    raise self._fail(f"the value is in {info.relative_path!r}, which is not a file here", record=fqn)
                z = TorchZip(item_source(self.file(info.relative_path), info, fqn), self.limits)
                z.pickles()
                out[fqn] = z
            except LimitError:
                raise
            except CkptfsError as e:
                out[fqn] = e
        return out

    def _value(self, entry: BytesEntry, n: int, item: TorchZip | CkptfsError, strict: bool,
               unknown: dict[str, int]) -> object:
        """A value entry's object (its item unpickled); an unreadable one stands as an opaque
        ``ckptfs.unreadable_value`` whose ``__args__`` say why."""
        info = entry.storage
        try:
            if isinstance(item, CkptfsError):
                raise item
            z = item
            prefix = f"{n}:"
            graph = z.object_graph(strict, key_prefix=prefix)
            self._value_items[prefix] = z
            for k, c in graph.unknown_globals.items():
                unknown[k] = unknown.get(k, 0) + c
            return graph.take()
        except LimitError:
            raise
        except CkptfsError as e:
            where = f"{info.where()}: " if info is not None else ""
            return opaque_call(UNREADABLE, (f"{where}{e.reason}",))

    def _place(self, root: dict[object, object], path: tuple[str | int, ...], value: object, fqn: str,
               made: list[tuple[dict[object, object], object, dict[object, object]]], made_ids: set[int]) -> None:
        """``value`` at ``path`` from the root, making dicts on the way (``made``: (parent, key, dict))."""
        node = root
        for key in path[:-1]:
            nxt = node.get(key)
            if nxt is None:
                nxt = {}
                node[key] = nxt
                made.append((node, key, nxt))
                made_ids.add(id(nxt))
            elif id(nxt) not in made_ids:
                raise self._fail(f"planner_data path {list(path)} runs through a value", record=fqn)
            node = nxt  # type: ignore[assignment]
        if path[-1] in node:
            raise self._fail(f"two entries at {list(path)}", record=fqn)
        node[path[-1]] = value

    # --- storages -----------------------------------------------------------------------------------
    def pickles(self) -> Sequence[bytes]:
        return self._metadata or ()

    def bind(self, refs: Mapping[str, StorageRef]) -> None:
        return None

    def _value_item(self, key: str) -> tuple[TorchZip, str] | None:
        head, sep, rest = key.partition(":")
        z = self._value_items.get(head + sep) if sep and head.isdigit() else None
        return None if z is None else (z, rest)

    def storage_size(self, key: str) -> int:
        entry = self.tensors.get(key)
        if entry is None:
            item = self._value_item(key)
            if item is None:
                raise TensorError("no such entry", file=self.source.name, record=key)
            return item[0].storage_size(item[1])
        n = entry.dtype.itemsize
        for s in entry.size:
            n *= s
        return n

    def storage_source(self, key: str) -> ByteSource:
        src = self._storages.get(key)
        if src is not None:
            return src
        entry = self.tensors.get(key)
        if entry is None:
            item = self._value_item(key)
            if item is None:
                raise TensorError("no such entry", file=self.source.name, record=key)
            return item[0].storage_source(item[1])
        src = self._assemble(entry)
        self._storages[key] = src
        return src

    def _assemble(self, entry: TensorEntry) -> ByteSource:
        why = entry.error or self._storage_problem(entry)
        if why is not None:
            raise TensorError(why, file=self.source.name, record=entry.fqn)
        itemsize = entry.dtype.itemsize
        parts = []
        for c in entry.chunks:
            info = c.storage
            assert info is not None  # _storage_problem
            where = info.where()
            item = item_source(self.file(info.relative_path), info, entry.fqn)
            t = item_tensor(item, self.limits, where)
            if t.dtype is not entry.dtype:
                raise TensorError(f"item {where} holds {t.dtype.name}, the metadata says {entry.dtype.name}",
                                  file=self.source.name, record=entry.fqn)
            if t.shape != c.sizes:
                raise TensorError(f"item {where} holds shape {list(t.shape)}, the metadata says the chunk at "
                                  f"offsets {list(c.offsets)} has sizes {list(c.sizes)}", file=self.source.name,
                                  record=entry.fqn)
            parts.append(ChunkData(c.offsets, c.sizes, t.source, t.offset * itemsize, t.stride, where))
        nbytes = itemsize
        for s in entry.size:
            nbytes *= s
        if len(parts) == 1 and parts[0].contiguous:  # one chunk, stored as it is read: a range, zero-copy
            p = parts[0]
            return SubRange(p.source, p.base, nbytes, p.label)
        return ChunkedTensor(self.source.name, entry.fqn, entry.size, itemsize, parts)

    def record_name(self, key: str) -> str:
        entry = self.tensors.get(key)
        if entry is None:
            item = self._value_item(key)
            return item[0].record_name(item[1]) if item is not None else key
        if len(entry.chunks) == 1 and entry.chunks[0].storage is not None:
            return entry.chunks[0].storage.where()
        files = sorted({c.storage.relative_path for c in entry.chunks if c.storage is not None})
        if len(files) > 4:  # (a tensor sharded over hundreds of ranks: the sidecar's extra lists them all)
            return f"{len(entry.chunks)} chunks in {len(files)} files ({files[0]} ... {files[-1]})"
        return f"{len(entry.chunks)} chunks in {', '.join(files)}"

    def storage_layout(self, key: str) -> dict[str, Any] | None:
        entry = self.tensors.get(key)
        if entry is None:
            return None
        out = []
        for c in entry.chunks:
            d: dict[str, Any] = {"offsets": list(c.offsets), "sizes": list(c.sizes)}
            if c.storage is not None:
                d.update(file=c.storage.relative_path, offset=c.storage.offset, length=c.storage.length)
                if c.storage.transforms:
                    d["transforms"] = list(c.storage.transforms)
            out.append(d)
        layout: dict[str, Any] = {"chunks": out}
        if entry.requires_grad:
            layout["saved_requires_grad"] = True
        src = self._storages.get(key)
        if isinstance(src, ChunkedTensor):
            layout["assembly"] = src.assembly
        return layout

    def attachments(self) -> Sequence[Attachment]:
        return ()

    def user_metadata(self) -> Mapping[str, str] | None:
        return None

    def close(self) -> None:
        for s in self.sources:
            s.close()
        for f in self._files.values():
            f.close()
