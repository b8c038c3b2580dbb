"""The mount of ``ckptfs mount --view safetensors``: a checkpoint (or a model directory) as safetensors files.

A mount source (:class:`ckptfs.mount.fuse_ops.MountSource`) with a small fixed tree, built when mounted:

* a checkpoint ``name.ext``: ``/name.safetensors``;
* an HF directory (.bin or safetensors weights): ``/model.safetensors`` or
  ``/model-0000i-of-0000n.safetensors`` and ``/model.safetensors.index.json`` (one file per input shard);
* a DCP directory: ``/model.safetensors``; a directory of several checkpoints: one
  ``<name>.safetensors`` per checkpoint file, at its place (:mod:`ckptfs.views.model_dir`);
* every other file and directory of a model directory as it is (config.json, tokenizer files ...), so the
  mount of an HF directory is a safetensors model directory ``from_pretrained`` loads;
* ``/.ckptfs/`` (mount.json, like the tree view's).

Each safetensors file is a :class:`~ckptfs.model.extents.Content` made by :mod:`ckptfs.views.safetensors`
(the header from the index; the tensors' own bytes as ranges of the checkpoint, converted pieces where
needed), served by one :class:`~ckptfs.model.extents.ContentHandle` per open file.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from ..model.extents import Content, ContentHandle, source_range
from ..source import ByteSource
from .model_dir import RESERVED, ModelSource, PassThrough, member_files, open_passthrough
from .namespace import DIR, FILE
from .safetensors import SafetensorsFile, index_name, plan_members, select

log = logging.getLogger("ckptfs.mount")


@dataclass
class _File:
    size: int
    open: Callable[[], ContentHandle]


class _OwnedHandle(ContentHandle):
    """A pass-through file's handle: it owns the file it opened (closed on release)."""

    __slots__ = ("file",)

    def __init__(self, content: Content, file: ByteSource, verify: bool) -> None:
        super().__init__(content, verify)
        self.file = file

    def close(self) -> None:
        super().close()
        self.file.close()


def _bytes_opener(data: bytes) -> Callable[[], ContentHandle]:
    def open_() -> ContentHandle:
        return ContentHandle(Content.of_bytes(data), verify=False)

    return open_


def safetensors_files(model: ModelSource) -> tuple[list[tuple[str, SafetensorsFile]], bytes | None, str | None]:
    """The safetensors files a model is shown as: [(name, file)], the index.json and its name (or None)."""
    if model.kind == "hf":
        files, index, _ = plan_members(model.catalog, model.prefix, model.variant)
        return files, index, (index_name(model.prefix, model.variant) if index is not None else None)
    if model.kind == "members":
        return member_files(model)[0], None, None
    sel = select(model.catalog)
    name = "model.safetensors" if model.kind == "dcp" else model.stem + ".safetensors"
    return [(name, SafetensorsFile(sel.tensors, sel.metadata(), name=name))], None, None


class SafetensorsTree:
    """The mount source of the safetensors view (the nodes: 0 is the root directory)."""

    def __init__(self, model: ModelSource, *, verify_reads: bool = True) -> None:
        self.model = model
        self.catalog = model.catalog
        self.verify_reads = verify_reads
        self.mtime_ns = model.catalog.members[0].source.identity().modified_ns
        self.names: list[str] = [""]
        self.parents: list[int] = [-1]
        self.types: list[int] = [DIR]
        self.entries: dict[int, dict[str, int]] = {0: {}}
        self.files: dict[int, _File] = {}
        self._data = 0
        files, index, index_file = safetensors_files(model)
        self.plans = files
        for name, st in files:
            self._add_file(name, _File(st.size, self._opener(st)))
            self._data += st.size
        if index is not None and index_file is not None:
            self._add_file(index_file, _File(len(index), _bytes_opener(index)))
        self.info_dir = self._mkdirs([RESERVED])
        for p in model.passthrough:
            self._add_file(p.path, _File(p.size, self._passthrough_opener(p)))

    # --- building ----------------------------------------------------------------------------------------
    def _mkdirs(self, parts: list[str]) -> int:
        node = 0
        for part in parts:
            child = self.entries[node].get(part)
            if child is None:
                child = self._new(node, part, DIR)
                self.entries[child] = {}
            node = child
        return node

    def _new(self, parent: int, name: str, typ: int) -> int:
        node = len(self.names)
        self.names.append(name)
        self.parents.append(parent)
        self.types.append(typ)
        self.entries[parent][name] = node
        return node

    def _add_file(self, path: str, f: _File) -> int | None:
        parts = path.split("/")
        parent = self._mkdirs(parts[:-1])
        if parts[-1] in self.entries[parent] or self.types[parent] != DIR:
            log.info("%s: a file of the same name is shown already; not shown twice", path)
            return None
        node = self._new(parent, parts[-1], FILE)
        self.files[node] = f
        return node

    def _opener(self, st: SafetensorsFile) -> Callable[[], ContentHandle]:
        made: list[Content] = []  # the content, planned at the first open (binds every tensor's storage)

        def open_() -> ContentHandle:
            if not made:
                made.append(st.content())
            content = made[0]
            sources = content.sources()
            for s in sources:
                s.check_unchanged()
            return ContentHandle(content, verify=self.verify_reads and bool(sources))

        return open_

    def _passthrough_opener(self, p: PassThrough) -> Callable[[], ContentHandle]:
        def open_() -> ContentHandle:
            f = open_passthrough(p)
            return _OwnedHandle(Content([source_range(f, 0, p.size)]), f, self.verify_reads)

        return open_

    def add_info_file(self, name: str, data: bytes) -> int:
        """A file under /.ckptfs/ (the mount adds ``mount.json``)."""
        node = self._new(self.info_dir, name, FILE)
        self.files[node] = _File(len(data), _bytes_opener(data))
        return node

    # --- the MountSource protocol ----------------------------------------------------------------------------
    def lookup(self, path: str) -> int | None:
        node = 0
        for part in path.split("/"):
            if not part:
                continue
            entries = self.entries.get(node)
            if entries is None:
                return None
            child = entries.get(part)
            if child is None:
                return None
            node = child
        return node

    def node_type(self, node: int) -> int:
        return self.types[node]

    def inode(self, node: int) -> int:
        return node + 1

    def parent(self, node: int) -> int:
        return max(self.parents[node], 0)

    def nlink(self, node: int) -> int:
        if self.types[node] != DIR:
            return 1
        return 2 + sum(1 for c in self.entries[node].values() if self.types[c] == DIR)

    def size(self, node: int) -> int:
        f = self.files.get(node)
        return 0 if f is None else f.size

    def listdir(self, node: int) -> list[tuple[str, int]]:
        return list(self.entries[node].items())

    def readlink(self, node: int) -> str:
        raise OSError("not a symlink")

    def open(self, node: int) -> ContentHandle:
        f = self.files.get(node)
        if f is None:
            raise IsADirectoryError(self.names[node])
        return f.open()

    def xattrs(self, node: int) -> dict[str, bytes]:
        return {}

    def total_bytes(self) -> int:
        return self._data

    def __len__(self) -> int:
        return len(self.names)
