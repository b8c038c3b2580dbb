"""The mount's tree as a "mount source": names, kinds, sizes, contents and xattrs of every node.

Built from a :class:`~ckptfs.model.catalog.Catalog` (names by :mod:`ckptfs.views.namespace`); the FUSE
adapter (:mod:`ckptfs.mount.fuse_ops`) sees only the methods of its ``MountSource`` protocol, which
:class:`TreeView` implements, and knows nothing of formats. Every file is a
:class:`~ckptfs.model.extents.Content` (pieces) opened as one :class:`~ckptfs.model.extents.ContentHandle`.
Nodes are ints (0 is the root directory). What each kind of node holds (docs/layout.md):

* a tensor: a file of exactly its logical C-contiguous bytes (``TensorReader``), read on demand;
* ``<name>.json`` next to tensors, links, opaque objects and non-plain values: the sidecar, ``Meta.to_dict()``
  plus where the entry is in the mount;
* a plain value (str, int, float, bool, None, bytes): a small file holding it (str as UTF-8, bytes raw,
  the others as JSON), no sidecar;
* a container: a directory; a container met twice: a symlink to the first one;
* ``/.ckptfs/index.json``: every key with its path, kind, dtype, shape and nbytes;
* ``/.ckptfs/code/<path>``: a TorchScript archive's sources; ``/.ckptfs/files/<path>``: the other files of
  a checkpoint directory (config.json ...), byte-exact, each top-level one also reachable from the root by
  a symlink of its own name when that name is free (``/config.json -> .ckptfs/files/config.json``).
* with ``npy=True`` (``-o npy``), ``<name>.npy`` next to each tensor file: a numpy header and the same
  bytes (:mod:`ckptfs.views.npy`), so ``np.load(path, mmap_mode="r")`` is the tensor.

Only the index and small rendered metadata live in memory: tensor bytes are always read from the file.
"""

from __future__ import annotations

import json
import math
import os
from functools import lru_cache
from typing import Any, Iterator, Literal, cast

from ..container.base import Attachment
from ..dtypes import DTYPES, numpy_dtype
from ..errors import CkptfsError, RemoteError, StaleSourceError, UnsupportedError
from ..model.catalog import Catalog
from ..model.extents import Content, ContentHandle, source_range
from ..model.index import COMPOSITE, CONTAINERS, LEAF, LINK, OPAQUE, TENSOR, NodeColumn
from ..model.meta import Meta, _jsonable
from ..model.reader import TensorData
from ..model.tensors import NO_DATA_KINDS, nbytes
from ..pickle.nodes import TensorNode
from ..source import ByteSource
from .namespace import DIR, FILE, SIDECAR_SUFFIX, build_tree, escape, shorten
from .namespace import LINK as NS_LINK
from .npy import npy_content

__all__ = ["TreeView", "memmap_from_sidecar", "DIR", "FILE", "NS_LINK"]

PLAIN_LEAVES = (str, int, float, bool, type(None), bytes, bytearray)
SIDECAR_KINDS = (TENSOR, COMPOSITE, OPAQUE, LINK)  # and values of other types (dtype, device, complex ...)
RESERVED_DIR = ".ckptfs"
INDEX_JSON = "index.json"
XATTR_PREFIX = "user.ckptfs."
XATTR_MAX = 64 * 1024  # the kernel's limit for one value

# what a node holds, for nodes that are not an index row's own file / directory
_INDEX, _INFO, _ATTACHED, _FILE_LINK = 2, 3, 4, 5
CODE_DIR = "code"  # /.ckptfs/code/: a TorchScript archive's sources, as text
FILES_DIR = "files"  # /.ckptfs/files/: a checkpoint directory's other files (config.json ...)
#: Sidecars are not nodes of the tree (half the nodes of a state_dict): the sidecar of node n is n + SIDECAR.
SIDECAR = 1 << 40
#: With ``npy``: the .npy file of tensor node n is n + NPY (NPY is a multiple of SIDECAR: parent() holds).
NPY = 1 << 41
NPY_SUFFIX = ".npy"


class TreeView:
    """The mount source of a checkpoint (a catalog of one file or several): its tree of names and files."""

    def __init__(self, catalog: Catalog, *, verify_reads: bool = True, npy: bool = False) -> None:
        self.catalog = catalog
        self.index = index = catalog.index
        self.verify_reads = verify_reads
        kinds = index.kinds
        type_of = {TENSOR: FILE, LEAF: FILE, LINK: NS_LINK}
        types = [type_of.get(k, DIR) for k in kinds]
        self.tree = tree = build_tree(index.parents, index.names, types, index.order())
        nodes, row_node = index.nodes, tree.row_node
        self.role: dict[int, int] = {}  # the reserved files
        self.has_sidecar = {row_node[r] for r, k in enumerate(kinds)  # nodes with a <name>.json
                            if k in SIDECAR_KINDS or k == LEAF and type(nodes[r]) not in PLAIN_LEAVES}
        #: tensor files with a <name>.npy beside them (``npy``)
        self.has_npy = {row_node[r] for r, k in enumerate(kinds) if k == TENSOR and row_node[r] > 0} if npy else set()
        reserved = tree.add(0, RESERVED_DIR, DIR)
        self.index_json_node = tree.add(reserved, INDEX_JSON, FILE)
        self.role[self.index_json_node] = _INDEX
        self._index_json: bytes | None = None
        self._info: dict[int, bytes] = {}
        self._sizes: dict[int, int] = {}
        self._nlinks: dict[int, int] = {}
        self._unserved: dict[int, str] = {}  # tensor row -> why its bytes are not served
        self._total: int | None = None
        self.mtime_ns = catalog.members[0].source.identity().modified_ns
        self._render_sidecar = lru_cache(maxsize=4096)(self._sidecar_bytes)
        self._attached: dict[int, Attachment] = {}  # node -> a TorchScript source, a directory's other file
        self._link_targets: dict[int, str] = {}  # node -> target of a root symlink to an other file
        self._attached_sources: dict[int, ByteSource] = {}
        self.show_member = bool(catalog.layout)  # a directory: sidecars say which file an entry is from
        attachments = catalog.attachments()
        code = [a for _, a in attachments if a.group == "code"]
        if code:
            self._add_attachment_tree(reserved, CODE_DIR, code)
        files = [a for _, a in attachments if a.group == "file"]
        if files:
            placed = self._add_attachment_tree(reserved, FILES_DIR, files)
            self._add_root_links(placed)

    def _add_attachment_tree(self, reserved: int, dirname: str, files: list[Attachment]) -> dict[str, int]:
        """``/.ckptfs/<dirname>/<path>`` for each attachment (TorchScript sources, other files); read (or
        inflated) only when opened. The paths come from the file: each component is kept when it is a plain
        file name, escaped (namespace.escape) otherwise, so nothing can climb out or collide with ckptfs's
        names; one over namespace.LONG_NAME bytes is shortened as keys' names are. Returns {path: node} of
        the files placed."""
        tree = self.tree
        top = tree.add(reserved, dirname, DIR)
        placed: dict[str, int] = {}
        for attachment in files:
            parent = top
            parts = attachment.path.split("/")
            for i, part in enumerate(parts):
                name = shorten(part if part not in ("", ".", "..") and part.isprintable() and "%" not in part
                               else escape(part) or "%%''")  # (a long one: within NAME_MAX, as keys' names)
                child = tree.entries[parent].get(name)
                last = i == len(parts) - 1
                if child is None:
                    child = tree.add(parent, name, FILE if last else DIR)
                elif last or tree.types[child] != DIR:
                    break  # a name both file and directory in a hostile archive: the later one is dropped
                parent = child
            else:
                self.role[parent] = _ATTACHED
                self._attached[parent] = attachment
                placed[attachment.path] = parent
        return placed

    def _add_root_links(self, placed: dict[str, int]) -> None:
        """A symlink at the root for each top-level other file whose name cannot be a key's (it has a dot),
        does not start with one, and is not taken (by an entry, or the sidecar of one)."""
        tree = self.tree
        root = tree.entries[0]
        sidecars = {name + SIDECAR_SUFFIX for name, child in root.items() if child in self.has_sidecar}
        for path, node in placed.items():
            name = tree.names[node]
            if "/" in path or name != path or "." not in name or name.startswith(".") or name in root \
                    or name in sidecars:
                continue
            link = tree.add(0, name, NS_LINK)
            self.role[link] = _FILE_LINK
            self._link_targets[link] = tree.path(node)

    # --- structure ----------------------------------------------------------------------------------
    def lookup(self, path: str) -> int | None:
        """The node at a '/'-separated path relative to the mount root, or None."""
        parts = path.split("/")
        tree = self.tree
        node = tree.lookup(parts)
        if node is None and parts[-1].endswith(SIDECAR_SUFFIX):
            main = tree.lookup(parts[:-1] + [parts[-1][: -len(SIDECAR_SUFFIX)]])
            if main is not None and main in self.has_sidecar:
                return main + SIDECAR
        if node is None and self.has_npy and parts[-1].endswith(NPY_SUFFIX):
            main = tree.lookup(parts[:-1] + [parts[-1][: -len(NPY_SUFFIX)]])
            if main is not None and main in self.has_npy:
                return main + NPY
        return node

    def node_type(self, node: int) -> int:
        return FILE if node >= SIDECAR else self.tree.types[node]

    def inode(self, node: int) -> int:
        return node + 1

    def listdir(self, node: int) -> Iterator[tuple[str, int]]:
        """(name, node) of a directory's entries, in checkpoint order (a sidecar after its entry), made as
        they are read."""
        has, npy = self.has_sidecar, self.has_npy
        for name, child in self.tree.entries[node].items():
            yield name, child
            if child in has:
                yield name + SIDECAR_SUFFIX, child + SIDECAR
            if child in npy:
                yield name + NPY_SUFFIX, child + NPY

    def parent(self, node: int) -> int:
        return self.tree.parents[node % SIDECAR]

    def nlink(self, node: int) -> int:
        """2 + subdirectories for a directory (what find and du expect), 1 otherwise."""
        tree = self.tree
        if node >= SIDECAR or tree.types[node] != DIR:
            return 1
        n = self._nlinks.get(node)
        if n is None:
            types = tree.types
            n = 2 + sum(1 for c in tree.entries[node].values() if types[c] == DIR)
            self._nlinks[node] = n
        return n

    def readlink(self, node: int) -> str:
        target = self._link_targets.get(node)
        if target is not None:
            return target
        tree = self.tree
        target_row = self.index.resolve(tree.rows[node])
        target = tree.path(tree.row_node[target_row])
        here = tree.path(tree.parents[node])
        return os.path.relpath(target or ".", here or ".")

    def __len__(self) -> int:
        return len(self.tree) + len(self.has_sidecar) + len(self.has_npy)

    def total_bytes(self) -> int:
        """Bytes of tensor data (for statfs)."""
        if self._total is None:
            nodes = self.index.nodes
            if type(nodes) is NodeColumn:  # a flat state_dict's columns: no node made per tensor
                self._total = nodes.table.total_nbytes()
            else:
                self._total = sum(nbytes(cast(TensorNode, nodes[r])) for r in self.index.tensors())  # tensor rows
        return self._total

    # --- content ------------------------------------------------------------------------------------
    def size(self, node: int) -> int:
        s = self._sizes.get(node)
        if s is None:
            s = self._size(node)
            self._sizes[node] = s
        return s

    def _size(self, node: int) -> int:
        if node >= NPY:
            return self._npy(node - NPY).size
        tree = self.tree
        if node < SIDECAR and tree.types[node] == DIR:
            return 0
        if node < SIDECAR and tree.types[node] == NS_LINK:
            return len(self.readlink(node).encode())
        if self.role.get(node) == _ATTACHED:
            return self._attached[node].size
        data = self._rendered(node)
        if data is not None:
            return len(data)
        reader = self._reader(tree.rows[node])
        return 0 if reader is None else reader.size

    def _rendered(self, node: int) -> bytes | None:
        """The content of every file that is not tensor data (None for tensor files)."""
        if node >= SIDECAR:
            return self._render_sidecar(node - SIDECAR)
        role = self.role.get(node)
        if role == _INDEX:
            return self.index_json()
        if role == _INFO:
            return self._info[node]
        if role == _ATTACHED:
            return None
        row = self.tree.rows[node]
        return None if self.index.kinds[row] == TENSOR else self.leaf_bytes(row)

    def _reader(self, row: int) -> TensorData | None:
        """The row's bytes, or None when they are not served (the sidecar says why)."""
        try:
            return self.catalog.data(self.index.resolve(row))
        except (StaleSourceError, RemoteError):
            raise  # the checkpoint cannot be read now: the open fails (EIO), the file is not made empty
        except CkptfsError as e:
            self._unserved[row] = e.reason
            return None

    def content(self, node: int) -> Content:
        """What a file node holds, as pieces."""
        if node >= NPY:
            return self._npy(node - NPY)
        data = self._rendered(node)
        if data is not None:
            return Content.of_bytes(data)
        if self.role.get(node) == _ATTACHED:
            attached = self._attached[node]
            source = self._attached_sources.get(node)
            if source is None:  # opened once (a file of a directory: one descriptor for every open of it)
                source = attached.open()
                if source.size != attached.size:  # changed since it was listed
                    size = source.size
                    source.close()
                    raise StaleSourceError(f"changed size since it was listed ({attached.size} -> {size} bytes)",
                                           file=source.name)
                kept = self._attached_sources.setdefault(node, source)
                if kept is not source:  # another thread opened it first
                    source.close()
                    source = kept
            return Content([source_range(source, 0, attached.size)])
        reader = self._reader(self.tree.rows[node])
        return reader.content if reader is not None else Content(())

    def _npy(self, main: int) -> Content:
        """The .npy file of tensor node ``main``: empty when the tensor's bytes are not served or it has no
        data (a meta tensor), like the tensor file itself (its sidecar says why)."""
        row = self.index.resolve(self.tree.rows[main])
        reader = self._reader(row)
        if reader is None or reader.t.kind in NO_DATA_KINDS:
            return Content(())
        return npy_content(reader, self.catalog.byteorder_of(reader.t, row))

    def open(self, node: int) -> ContentHandle:
        """A handle with ``readinto(buf, offset)``. Checks that the checkpoint is unchanged (raises
        StaleSourceError) before serving bytes read from it, and (``verify_reads``) before every read."""
        if self.node_type(node) != FILE:
            raise IsADirectoryError(self.tree.path(node))
        content = self.content(node)
        sources = content.sources()
        for source in sources:
            source.check_unchanged()
        return ContentHandle(content, verify=self.verify_reads and bool(sources))

    def leaf_bytes(self, row: int) -> bytes:
        """A value's file content: str as UTF-8, bytes raw, anything else as JSON."""
        v = self.index.nodes[row]
        if type(v) is str:
            return v.encode("utf-8", "surrogatepass")
        if isinstance(v, (bytes, bytearray)):
            return bytes(v)
        if type(v) in PLAIN_LEAVES:  # int, float (NaN/Infinity as Python's json writes them), bool, None
            return _json_bytes(v)
        return _json_bytes(_jsonable(v))

    # --- metadata -----------------------------------------------------------------------------------
    def meta(self, row: int) -> Meta:
        """Meta of the row itself (links not followed)."""
        return self.catalog.meta(row)

    def meta_dict(self, row: int) -> dict[str, Any]:
        """The sidecar's fields for a row: Meta.to_dict() plus its place in the mount."""
        kind = self.index.kinds[row]
        d = self.meta(row).to_dict()
        tree = self.tree
        d["file"] = tree.path(tree.row_node[row])
        d["path_repr"] = repr(self.index.path(row))
        if self.show_member and self.index.owners is not None and self.index.owners[row] >= 0:
            member = self.catalog.member_of(row).name
            if member:  # ("" for a DCP checkpoint that is the directory itself)
                d["member"] = member
        if kind == TENSOR:
            d["served"] = served = self._reader(row) is not None
            if not served and not (d.get("error") or d.get("unsupported")):
                d["error"] = self._unserved.get(row)
        elif kind == LINK:
            d["link"] = self.readlink(tree.row_node[row])
        return d

    def _sidecar_bytes(self, main: int) -> bytes:
        """The sidecar of node ``main``: one field per line (readable with cat, parsable as JSON)."""
        d = self.meta_dict(self.tree.rows[main])
        lines = [b'  "' + k.encode() + b'": ' + _json_bytes(v) for k, v in d.items()]
        return b"{\n" + b",\n".join(lines) + b"\n}\n"

    def add_info_file(self, name: str, data: bytes) -> int:
        """A file under /.ckptfs/ (the mount adds ``mount.json``: daemon pid, options, libfuse)."""
        tree = self.tree
        node = tree.add(tree.parents[self.index_json_node], name, FILE)
        self.role[node] = _INFO
        self._info[node] = data
        return node

    def xattrs(self, node: int) -> dict[str, bytes]:
        """``user.ckptfs.<field>`` for every sidecar field of the node's entry (none for sidecars,
        split-made directories and the reserved files)."""
        tree = self.tree
        if node >= SIDECAR or node in self.role or tree.rows[node] < 0:
            return {}
        out = {}
        for k, v in self.meta_dict(tree.rows[node]).items():
            data = v.encode("utf-8", "surrogatepass") if isinstance(v, str) else _json_bytes(v)
            if len(data) <= XATTR_MAX:
                out[XATTR_PREFIX + k] = data
        return out

    def index_json(self) -> bytes:
        """Every index row (but a container root) with its mount path: key, path, kind, dtype, shape, nbytes
        (of the tensor's logical content), size (of its file: 0 when its bytes are not served)."""
        if self._index_json is None:
            index, tree = self.index, self.tree
            entries = []
            has_sidecar = self.has_sidecar
            for r in index.order():
                node = tree.row_node[r]
                if node <= 0:
                    continue
                m = self.meta(r)
                kind = index.kinds[r]
                e: dict[str, Any] = {"key": index.keys[r], "path": tree.path(node), "kind": kind}
                if kind == TENSOR or kind == COMPOSITE:
                    e.update(dtype=m.dtype, shape=None if m.shape is None else list(m.shape), nbytes=m.nbytes)
                if kind == TENSOR or kind == LEAF:
                    e["size"] = self.size(node)
                if kind == LEAF:
                    e["type"] = m.type
                elif kind in CONTAINERS:
                    e.update(type=m.type or kind, length=m.length)
                elif kind == LINK:
                    e.update(target=m.target, link=self.readlink(node))
                if node in has_sidecar:
                    e["sidecar"] = e["path"] + SIDECAR_SUFFIX
                e["original"] = [_jsonable(p) for p in index.path(r)]
                e["original_repr"] = repr(index.path(r))
                entries.append(e)
            doc: dict[str, Any] = {"format": "ckptfs-index", "version": 1, "checkpoint": self.catalog.name,
                                   "checkpoint_format": self.catalog.format,
                                   "byteorder": self.catalog.members[0].container.byteorder, "entries": entries}
            files = [(node, a) for node, a in self._attached.items() if a.group == "file"]
            if files:
                doc["files"] = [{"path": a.path, "file": tree.path(node), "size": a.size} for node, a in files]
            self._index_json = _json_bytes(doc, compact=True) + b"\n"
        return self._index_json


_UTF8_JSON = json.JSONEncoder(ensure_ascii=False)  # made once: json.dumps with options makes one per call
_COMPACT_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _json_bytes(obj: Any, compact: bool = False) -> bytes:
    """UTF-8 JSON; strings with lone surrogates (legal in pickles) fall back to \\u escapes."""
    try:
        return (_COMPACT_JSON if compact else _UTF8_JSON).encode(obj).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(obj, separators=(",", ":") if compact else None).encode("ascii")
    except ValueError:  # an int with more digits than str() allows: hexadecimal, as a JSON string
        return json.dumps(hex(obj) if type(obj) is int else repr(type(obj))).encode("ascii")


#: np.memmap's modes
MemmapMode = Literal["r", "readonly", "c", "copyonwrite", "r+", "readwrite", "w+", "write"]


def memmap_from_sidecar(path: str, mode: MemmapMode = "r") -> Any:
    """``np.memmap`` of a tensor file with dtype, byte order and shape from its sidecar ``<path>.json``.

    bfloat16 / float8 map through ml_dtypes. Tensors with no elements give an empty (non-mapped) array,
    since nothing can be mapped from an empty file; meta tensors (no data) raise UnsupportedError."""
    import numpy as np

    with open(path + ".json", "rb") as f:
        meta = json.load(f)
    if meta.get("kind") != "tensor":
        raise ValueError(f"{path}: not a tensor (its sidecar says kind {meta.get('kind')!r})")
    if not meta.get("served", True):
        raise UnsupportedError(meta.get("error") or meta.get("unsupported") or "bytes not served", file=path)
    dt = DTYPES.get(meta.get("dtype", ""))
    if dt is None or meta.get("numpy_dtype") is None:
        raise UnsupportedError(meta.get("numpy_dtype_reason") or f"no numpy dtype for {meta.get('dtype')}",
                               file=path)
    dtype = numpy_dtype(dt, meta.get("byteorder") or "little")
    shape = tuple(meta["shape"])
    if os.path.getsize(path) == 0:
        if math.prod(shape):  # a meta tensor: a shape but no data
            raise UnsupportedError((meta.get("extra") or {}).get("data") or "the tensor has no data", file=path)
        arr = np.empty(shape, dtype=dtype)
        arr.flags.writeable = False
        return arr
    return np.memmap(path, dtype=dtype, mode=mode, shape=shape)
