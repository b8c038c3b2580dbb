r"""The catalog: one key space over the indexes of one or more files.

A *member* is one file: its source, its container, the converter that turned its recorded calls into
nodes (its storage references point back at its container). The catalog indexes the members' object
graphs as one tree:

* one file: the tree is the file's own (``Checkpoint`` on a ``.pth`` is the one-member case);
* several files, ``flat``: their top-level dicts are united into one dict (shards of one state_dict).
  **Collision rule**: members are taken in the order given; a key that an earlier member already has is
  kept, renamed ``key#2`` (``#3`` ...: the index's rule for duplicate dotted keys), and reported in
  :attr:`Catalog.conflicts` naming both files. Nothing is dropped. A member whose top-level object is
  not a dict is placed under its name;
* several files, not ``flat``: each file is a subtree named by its member name;
* any mix of these (a directory of checkpoints, :mod:`ckptfs.model.directory`): :meth:`Catalog.assemble`
  lays members out by an :class:`~ckptfs.model.index.Group` (members spread into a dict, placed under
  names, groups in groups). A member is whatever opens as a container: one file, or a DCP directory.

A catalog may also carry *files*: other files of a model directory (config.json, tokenizer files), served
read-only and byte-exact as :class:`~ckptfs.container.base.Attachment`\ s of group ``"file"``; and
``layout``: what was opened (format, shards, index file ...) for ``ckptfs info``.

Members' containers are opened concurrently when their reads are round trips (a thread each, up to
``MAX_OPENERS``: remote files, ``Directory.concurrency``): their latencies overlap instead of adding up.
Local files are opened one after the other (page-cache reads cost less than handing work to threads). The
pickles of all members are then probed together, in one forked child (``probed_together``).
"""

from __future__ import annotations

import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ..container import Container, open_container
from ..container.base import Attachment, ObjectGraph
from ..errors import CkptfsError, FormatError, TensorError, UnsupportedError
from ..limits import DEFAULT_LIMITS, Limits
from ..pickle.nodes import TensorNode
from ..pickle.unpickler import gc_paused, probed_together
from ..source import ByteSource, open_source
from . import table
from .convert import Converter
from .index import COMPOSITE, LINK, TENSOR, Group, Index
from .meta import Meta
from .reader import TensorData
from .tensors import ensure_valid

MAX_OPENERS = 8


@dataclass
class Member:
    """One file of a catalog."""

    name: str
    source: ByteSource
    container: Container
    converter: Converter
    unknown_globals: dict[str, int]


@dataclass(frozen=True)
class Conflict:
    """A key two members both have (flat catalogs): the later one's entry was renamed ``renamed``."""

    key: str
    first: str  # member names
    second: str
    renamed: str

    def __str__(self) -> str:
        return f"key {self.key!r} is in {self.first} and in {self.second}; the second is {self.renamed!r}"


def _index_of(graph: ObjectGraph, container: Container, converter: Converter, limits: Limits) -> Index:
    """The index of one file's graph: from the columns read from its pickle or sent by the unpickling child, or
    from the objects (in bulk when they are a plain flat state_dict, row by row otherwise)."""
    if isinstance(graph.digest, table.TensorTable):
        found = graph.digest
    elif isinstance(graph.digest, bytes):
        found = table.decode(graph.digest)
    else:
        root = graph.take()
        try:
            found = table.tabulate(root)
        except table.Declined:
            return Index([root], limits=limits, converter=converter, owned=True)
        del root
    found.owner = container
    return Index.from_table(found, limits=limits)


def _root_of(graph: ObjectGraph, container: Container) -> object:
    """A member's root object for an index of several files: the graph, or the graph its columns stand for."""
    found = graph.digest
    if isinstance(found, bytes):
        found = table.decode(found)
    if isinstance(found, table.TensorTable):
        found.owner = container
        return table.graph_of(found)
    return graph.take()


class Catalog:
    """Members and the index of their merged key space."""

    def __init__(self, members: list[Member], index: Index, limits: Limits, name: str) -> None:
        self.members = members
        self.index = index
        self.limits = limits
        self.name = name
        self.conflicts = [Conflict(k, members[a].name, members[b].name, new) for k, a, b, new in index.conflicts]
        #: other files of a directory (group "file"), served byte-exact
        self.files: list[Attachment] = []
        #: what was opened, for ``ckptfs info``: {"format": ..., "members": ..., ...}; {} for one file
        self.layout: dict[str, Any] = {}
        #: members left out of a tolerant catalog (a directory of unrelated checkpoints): (name, error)
        self.problems: list[tuple[str, CkptfsError]] = []
        #: how several members are laid out (None for one file)
        self.group: Group | None = None
        self._data: dict[int, TensorData] = {}
        max_ndim = limits.max_ndim
        index.validator = lambda t: ensure_valid(t, max_ndim)

    # --- opening ----------------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike[str] | ByteSource, *, strict: bool = False,
             limits: Limits = DEFAULT_LIMITS) -> Catalog:
        """A catalog of one file."""
        source = open_source(path)
        try:
            container = open_container(source, limits)
            member = Member("", source, container, Converter(limits, owner=container), {})
            with gc_paused():  # one pause for everything that builds the index (see gc_paused)
                graph = container.object_graph(strict, digest=table.DIGEST)
                member.unknown_globals = graph.unknown_globals
                index = _index_of(graph, container, member.converter, limits)
                del graph
                container.bind(member.converter.refs)
        except CkptfsError as e:
            source.close()
            raise e.at(file=source.name) from None
        except BaseException:
            source.close()
            raise
        return cls([member], index, limits, source.name)

    @classmethod
    def merge(cls, sources: Sequence[tuple[str, ByteSource]], *, name: str, flat: bool, strict: bool = False,
              limits: Limits = DEFAULT_LIMITS) -> Catalog:
        """A catalog of several files ``(member name, source)``, in that order (see the module doc)."""
        if not sources:
            raise FormatError("no checkpoint files to open", file=name)
        n = len(sources)
        group = Group(flat=list(range(n))) if flat else Group(named=[(m, i) for i, (m, _) in enumerate(sources)])
        openers = [(m, _file_opener(src, limits)) for m, src in sources]
        local = all(src.region() is not None for _, src in sources)  # page-cache reads: threads only cost
        return cls.assemble(openers, group, name=name, strict=strict, limits=limits, owned=[s for _, s in sources],
                            concurrency=1 if local else MAX_OPENERS)

    @classmethod
    def assemble(cls, openers: Sequence[tuple[str, Callable[[], Container]]], group: Group, *, name: str,
                 strict: bool = False, limits: Limits = DEFAULT_LIMITS, owned: Sequence[ByteSource] = (),
                 files: Sequence[Attachment] = (), layout: Mapping[str, Any] | None = None,
                 tolerant: bool = False, concurrency: int = MAX_OPENERS) -> Catalog:
        """A catalog of members ``(member name, opener)`` laid out by ``group``. Each opener returns the
        member's container (they run concurrently); ``owned`` sources are closed if this fails (the
        containers that opened are closed too). ``tolerant``: a member that fails to open or index is left
        out and its error listed in :attr:`problems` (as ``(member name, error)``), instead of failing all.
        ``concurrency``: how many openers run at once (1: in this thread, one after the other)."""
        if not openers:
            raise FormatError("no checkpoint files to open", file=name)
        containers: list[Container | None] = [None] * len(openers)
        failed: dict[int, CkptfsError] = {}

        pickles: list[bytes] = []

        def open_one(i: int) -> None:
            try:
                containers[i] = c = openers[i][1]()
                pickles.extend(c.pickles())  # read now, in this thread; checked together below
            except CkptfsError as e:
                if not tolerant:
                    raise
                failed[i] = e

        try:
            # the containers' I/O (end records, directories, headers) concurrently; unpickling stays in this
            # thread (the unpickling probe forks, which a process must not do while other threads run)
            if len(openers) == 1 or concurrency <= 1:
                for i in range(len(openers)):
                    open_one(i)
            else:
                with ThreadPoolExecutor(min(concurrency, len(openers)), thread_name_prefix="ckptfs-open") as pool:
                    for future in [pool.submit(open_one, i) for i in range(len(openers))]:
                        future.result()  # the first failure, in member order
            members: list[Member] = []
            roots: list[tuple[str, object, Converter]] = []
            kept: dict[int, int] = {}  # opener number -> member number
            digest = table.TableDigest()  # plain state_dicts are read from their bytes; the rest probed together
            with gc_paused(), probed_together(digest.read_ahead(pickles, limits), limits):
                for i, ((member_name, _), container) in enumerate(zip(openers, containers, strict=False)):
                    if container is None:
                        continue
                    source = container.source
                    member = Member(member_name, source, container, Converter(limits, owner=container), {})
                    try:
                        graph = container.object_graph(strict, digest=digest)
                    except CkptfsError as e:
                        e.at(file=source.name)
                        if not tolerant:
                            raise e from None
                        failed[i] = e
                        container.close()
                        containers[i] = None
                        continue
                    member.unknown_globals = graph.unknown_globals
                    kept[i] = len(members)
                    members.append(member)
                    roots.append((member_name, _root_of(graph, container), member.converter))
                    del graph
                if not members:
                    first = failed[min(failed)]
                    raise first.at(file=name)
                index = Index.placed(roots, _renumbered(group, kept), limits=limits)
                del roots
                for m in members:
                    m.container.bind(m.converter.refs)
        except BaseException:
            for c in containers:
                if c is not None:
                    c.close()
            for source in owned:
                source.close()
            raise
        catalog = cls(members, index, limits, name)
        catalog.group = _renumbered(group, kept)
        catalog.files = list(files)
        catalog.layout = dict(layout or {})
        catalog.problems = [(openers[i][0], failed[i]) for i in sorted(failed)]
        return catalog

    # --- members ----------------------------------------------------------------------------------------
    def member_of(self, row: int) -> Member:
        """The file a row comes from (the only member for a one-file catalog, and for a merged root)."""
        owners = self.index.owners
        if owners is None:
            return self.members[0]
        m = owners[row]
        return self.members[m if m > 0 else 0]

    def converter_of(self, row: int) -> Converter:
        """The converter of the file a row comes from (turns recorded calls in values into nodes)."""
        return self.member_of(row).converter

    def unknown_globals(self) -> dict[str, int]:
        """Classes the files' pickles named and ckptfs did not import, with how often each was named."""
        out: dict[str, int] = {}
        for m in self.members:
            for k, n in m.unknown_globals.items():
                out[k] = out.get(k, 0) + n
        return dict(sorted(out.items()))

    def attachments(self) -> list[tuple[Member | None, Attachment]]:
        """Files served besides the tree: the members' (TorchScript code ...) and the catalog's own (a model
        directory's other files: group "file", member None)."""
        out: list[tuple[Member | None, Attachment]] = [(m, a) for m in self.members for a in m.container.attachments()]
        out += [(None, a) for a in self.files]
        return out

    @property
    def format(self) -> str:
        """What was opened: the container kind of a single file ("zip", "safetensors" ...), or the layout of
        a directory ("hf-sharded", "dcp", "directory")."""
        fmt = self.layout.get("format")
        return fmt if isinstance(fmt, str) else self.members[0].container.kind

    def user_metadata(self) -> dict[str, str] | None:
        """The files' free-form string metadata (safetensors ``__metadata__``): one file's as it is; for
        several, their union in member order (a key two files give differently keeps the first file's
        value). None when no file carries any."""
        out: dict[str, str] | None = None
        for m in self.members:
            meta = m.container.user_metadata()
            if meta is not None:
                out = {} if out is None else out
                for k, v in meta.items():
                    out.setdefault(k, v)
        return out

    # --- keys and metadata ------------------------------------------------------------------------------
    def row(self, key: str | tuple[object, ...]) -> int:
        """The index row of a key (dotted string, or the tuple of original keys), links followed."""
        index = self.index
        i = index.by_key.get(key) if type(key) is str else index.find_path(key) if isinstance(key, tuple) else None
        if i is None:
            raise KeyError(key)
        return i if index.kinds[i] != LINK else index.resolve(i)

    def meta(self, row: int) -> Meta:
        """Metadata of a row (links not followed)."""
        if self.index.owners is None:
            return Meta(self.index, row, self.members[0].container.byteorder)
        return Meta(self.index, row, self.member_of(row).container.byteorder)

    def meta_of(self, key: str | tuple[object, ...]) -> Meta:
        """``meta(row(key))``, with the common case (a dotted key of a one-file catalog, no link) in one call:
        listing the shapes of a million keys is this call a million times."""
        index = self.index
        i = index.by_key.get(key) if type(key) is str else None
        if i is None or index.owners is not None or index.kinds[i] == LINK:
            return self.meta(self.row(key))
        return Meta(index, i, self.members[0].container.byteorder)

    # --- bytes -------------------------------------------------------------------------------------------
    def storage_source(self, t: TensorNode) -> ByteSource | None:
        """The bytes of a tensor's storage (bound once per storage), or None when it has no storage."""
        ref = t.storage
        if ref is None or ref.owner is None or t.error is not None:
            return None
        if ref.data is None:
            ref.data = ref.owner.storage_source(ref.key)
        return ref.data

    def data(self, row: int) -> TensorData:
        """A tensor row's bytes, planned (made once per row): raises TensorError / UnsupportedError for
        entries whose bytes are not served."""
        d = self._data.get(row)
        if d is None:
            index = self.index
            kind = index.kinds[row]
            if kind != TENSOR:
                if kind == COMPOSITE:  # sparse, nested, per-channel quantized: its bytes are its parts'
                    parts = ", ".join(index.keys[c] for c in index.children(row))
                    raise UnsupportedError(f"a {index.nodes[row].kind} tensor is stored as parts: read {parts}",  # type: ignore[attr-defined]
                                           file=self.name, record=index.keys[row])
                raise TensorError(f"is a {kind}, not a tensor", file=self.name, record=index.keys[row])
            d = self.node_data(index.nodes[row], index.keys[row])  # type: ignore[arg-type]
            self._data[row] = d  # (a race makes two equal plans: harmless)
        return d

    def node_data(self, t: TensorNode, key: str = "") -> TensorData:
        """The bytes of any tensor node (validated, its storage bound); ``key`` names it in errors."""
        ensure_valid(t, self.limits.max_ndim)
        try:
            storage = self.storage_source(t)
        except CkptfsError as e:
            raise e.at(file=self.name, record=key or None) from None
        return TensorData(t, storage, file_name=self.name, key=key)

    def mapped(self, d: TensorData) -> tuple[mmap.mmap, int] | None:
        """A tensor stored as one range of a local file: the file's private map and the tensor's offset in
        it (zero-copy numpy arrays and torch tensors view it); else None. Checks the file is unchanged."""
        if not d.size:
            return None
        region = d.region()
        if region is None:
            return None
        region.file.check_unchanged()
        return region.mapping()

    def byteorder_of(self, t: TensorNode, row: int = 0) -> str:
        """The byte order a tensor's bytes are stored in."""
        order = (t.extra or {}).get("byteorder")
        if isinstance(order, str):
            return order
        ref = t.storage
        if ref is not None and ref.owner is not None:
            return ref.owner.byteorder
        return self.member_of(row).container.byteorder

    def close(self) -> None:
        for m in self.members:
            m.container.close()


def _renumbered(group: Group, kept: Mapping[int, int]) -> Group:
    """``group`` with members renumbered (``kept``: old -> new) and the members not kept left out."""
    named: list[tuple[str, int | Group]] = []
    for n, what in group.named:
        if isinstance(what, Group):
            named.append((n, _renumbered(what, kept)))
        elif what in kept:
            named.append((n, kept[what]))
    return Group([kept[m] for m in group.flat if m in kept], named)


def _file_opener(source: ByteSource, limits: Limits) -> Callable[[], Container]:
    def open_file() -> Container:
        try:
            return open_container(source, limits)
        except CkptfsError as e:
            raise e.at(file=source.name) from None

    return open_file
