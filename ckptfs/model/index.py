"""The index: an object graph (unpickled, or built by a container) flattened into typed rows.

One iterative walk over the graph (never recursive: 10^6-deep nesting fails with a LimitError, not a
crash); recorded calls become nodes on the way (:mod:`ckptfs.model.convert`). Shared objects are visited
once: a container reached a second time becomes a ``link`` row to its first path (a memo "billion
laughs" DAG costs its size, not its expansion). Keys join path components with "." (a state_dict key
"a.b" stays "a.b"; ``{'model': {'fc.w': t}}`` gives "model.fc.w"); each row also keeps its parent, so the
exact path of original keys is recoverable. Tensors are checked against their storages later, on first
use (:mod:`ckptfs.model.tensors`). :meth:`Index.merged` indexes several files' graphs as one tree.
"""

from __future__ import annotations

import sys
from array import array
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Iterable, Iterator, Sequence, Union

from ..errors import LimitError, brief
from ..limits import DEFAULT_LIMITS, Limits, MemoryGuard
from ..pickle.allowlist import TENSOR_CALLS
from ..pickle.nodes import (
    Call,
    Inert,
    NumpyArray,
    NumpyScalar,
    OpaqueObject,
    PickledOrderedDict,
    StorageRef,
    TensorNode,
)
from .convert import Converter, numpy_scalar_value, storage_as_tensor
from .table import TensorTable

TENSOR, LEAF, DICT, LIST, TUPLE, SET, OPAQUE, LINK = ("tensor", "leaf", "dict", "list", "tuple", "set",
                                                      "opaque", "link")
#: A tensor made of other tensors (sparse, nested, per-channel quantized): a container row whose node is
#: the TensorNode (dense shape, dtype, layout ... for its metadata) and whose children are the parts.
COMPOSITE = "composite"
CONTAINERS = (DICT, LIST, TUPLE, SET, OPAQUE, COMPOSITE)
LEAF_TYPES = (int, float, bool, str, bytes, bytearray, type(None), complex)
V2_CALL = TENSOR_CALLS[("torch._utils", "_rebuild_tensor_v2")]


class Entry:
    """A view of one index row (made on demand; the index itself is columnar)."""

    __slots__ = ("index", "i")

    def __init__(self, index: Index, i: int) -> None:
        self.index = index
        self.i = i

    key = property(lambda self: self.index.keys[self.i], doc="dotted key, unique within the index")
    name = property(lambda self: self.index.names[self.i], doc="original key/index in the parent container")
    parent = property(lambda self: self.index.parents[self.i], doc="parent row, -1 for the root")
    kind = property(lambda self: self.index.kinds[self.i], doc="tensor/leaf/dict/list/tuple/set/opaque/link")
    node = property(lambda self: self.index.nodes[self.i],
                    doc="TensorNode, leaf value, container info (see _container_info), or a link's target row")

    def __repr__(self) -> str:
        return f"Entry({self.key!r}, {self.kind})"


def component(name: object) -> str:
    """A path component as text: strings as they are, ints as digits, anything else by repr."""
    if type(name) is str:
        return name
    if type(name) is int:
        return str(name)
    return _safe_repr(name)


def _safe_repr(v: object) -> str:
    if isinstance(v, (Inert, OpaqueObject)) or type(v) in (tuple, frozenset) and len(v) > 16:  # type: ignore[arg-type]
        return f"<{type(v).__name__}>"
    return brief(v, 256)  # bounded time: a tuple key may be a memo DAG


def opaque_children(obj: OpaqueObject) -> list[tuple[object, object]]:
    """What an opaque object carries, as (name, value) pairs: SETITEMS items and APPENDS items by their
    key/index, a dict BUILD state by attribute name, then anything else under __args__ / __kwargs__ /
    __state__ (a name that would collide also goes under its group)."""
    out: list[tuple[object, object]] = []
    taken: set[object] = set()

    def add(name: object, value: object) -> None:
        try:
            hash(name)
        except TypeError:
            name = _safe_repr(name)
        if name in taken:
            return
        taken.add(name)
        out.append((name, value))

    group: dict[str, object] = {}
    if obj.items:
        for k, v in obj.items.items():
            add(k, v)
    if obj.list_items:
        for i, v in enumerate(obj.list_items):
            add(i, v)
    state = obj.state
    slots = None
    if isinstance(state, tuple) and len(state) == 2 and (state[0] is None or isinstance(state[0], dict)) \
            and isinstance(state[1], dict):
        state, slots = state
    for part in (state, slots):
        if isinstance(part, dict):
            for k, v in part.items():
                if k in taken:
                    group.setdefault("__state__", {})[k] = v  # type: ignore[index]
                else:
                    add(k, v)
        elif part is not None:
            group["__state__"] = part
    if obj.args:
        group["__args__"] = list(obj.args)
    if obj.kwargs:
        group["__kwargs__"] = dict(obj.kwargs)
    for name, value in group.items():
        if name in taken:
            name = f"_{name}"
        add(name, value)
    return out


@dataclass
class Group:
    """Where members' trees go in a merged index: a dict made by ckptfs, not by any file.

    ``flat`` members have their top-level dict's items spread here, in order (the shards of one state_dict;
    a member whose root is not a dict is placed under its name instead); ``named`` entries are placed under
    a name: a member (by its number) or another group (a subdirectory of checkpoints)."""

    flat: list[int] = field(default_factory=list)
    named: list[tuple[str, Union[int, Group]]] = field(default_factory=list)


def classify(v: object, conv: Converter) -> tuple[str, object]:
    """(kind, node) for one value; recorded calls and pickle-data values are converted here."""
    if isinstance(v, Call):
        v = conv.convert(v)
    t = type(v)
    if t is TensorNode:
        return (TENSOR if v.parts is None else COMPOSITE), v  # type: ignore[attr-defined]
    if t in LEAF_TYPES:
        return LEAF, v
    if t is dict or t is PickledOrderedDict or t is Group:
        return DICT, v
    if t is list:
        return LIST, v
    if t is tuple:
        return TUPLE, v
    if t is set or t is frozenset:
        return SET, v
    if isinstance(v, OpaqueObject):
        return OPAQUE, v
    if t is NumpyArray:
        node = conv.numpy_array(v)  # type: ignore[arg-type]
        return (TENSOR if type(node) is TensorNode else OPAQUE), node
    if t is NumpyScalar:
        return LEAF, numpy_scalar_value(v)  # type: ignore[arg-type]
    if t is StorageRef:
        return TENSOR, storage_as_tensor(v)  # type: ignore[arg-type]
    return LEAF, v  # dtype/device/layout markers, classes referenced as values, ...


class _Pending:
    """The node of a table row not looked at yet."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<pending>"


PENDING = _Pending()


class NodeColumn(list[object]):
    """The nodes of an index built from a :class:`TensorTable`: a tensor row holds PENDING until it is read,
    then the TensorNode made from the table (kept: the same node every time)."""

    table: TensorTable

    def __getitem__(self, i: Any) -> Any:
        v = list.__getitem__(self, i)
        if v is PENDING:
            if i < 0:
                i += len(self)
            table = self.table
            t = i - 1 if table.tensor_of is None else table.tensor_of[i - 1]
            v = table.node(t)
            list.__setitem__(self, i, v)
        return v

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self[i]

    def shape(self, i: int) -> tuple[int, ...] | None:
        """Row ``i``'s tensor shape (None for other rows), without making its node."""
        v = list.__getitem__(self, i)
        if v is PENDING:
            table = self.table
            t = i - 1 if table.tensor_of is None else table.tensor_of[i - 1]
            return table.shapes[table.shape[t]]
        return v.shape if type(v) is TensorNode else None

    def dtype_name(self, i: int) -> str | None:
        v = list.__getitem__(self, i)
        if v is PENDING:
            table = self.table
            t = i - 1 if table.tensor_of is None else table.tensor_of[i - 1]
            dtype = table.storage_dtype(table.storage[t])
            return dtype.name if dtype is not None else "uint8"
        return v.dtype.name if type(v) is TensorNode else None

    def row_of(self, obj: object) -> int | None:
        """The row holding ``obj`` itself, among the nodes made so far."""
        for i, v in enumerate(list.__iter__(self)):
            if v is obj:
                return i
        return None


class Index:
    """The checkpoint tree as columns (one row per node; a container's children are consecutive rows).

    Rows are added breadth-first: expanding a container appends all its children at once, so
    ``children(i)`` is a range and no per-row objects are made (20k tensors index in tens of ms).
    ``order()`` gives depth-first (checkpoint) order for listings.
    """

    def __init__(self, root: object, *, limits: Limits = DEFAULT_LIMITS, converter: Converter | None = None,
                 owned: bool = False) -> None:
        """``owned=True``: ``root`` is a one-item list holding the unpickled object, which nothing else
        refers to. Dicts that only the index holds are then emptied as their items become rows, so the
        unpickled graph is freed while the index grows instead of after it (a lower peak, and less memory
        the allocator keeps afterwards)."""
        self._init_columns(limits)
        conv = converter or Converter(limits)
        self._build(root.pop() if owned else root, [conv], None, owned)  # type: ignore[attr-defined]

    @classmethod
    def merged(cls, members: Sequence[tuple[str, object, Converter]], *, flat: bool,
               limits: Limits = DEFAULT_LIMITS) -> Index:
        """One index over several files' object graphs ``(name, root, converter)``.

        ``flat``: the members' top-level dicts are united into one (a sharded state_dict); a key an earlier
        member already has is kept under ``key#2`` (the index's duplicate rule) and listed in
        ``conflicts``. A member whose root is not a dict, and every member when not ``flat``, is placed
        under its name instead. ``owners[row]`` is the member a row comes from (-1 for the root)."""
        n = len(members)
        group = Group(flat=list(range(n))) if flat else Group(named=[(m[0], i) for i, m in enumerate(members)])
        return cls.placed(members, group, limits=limits)

    @classmethod
    def placed(cls, members: Sequence[tuple[str, object, Converter]], group: Group, *,
               limits: Limits = DEFAULT_LIMITS) -> Index:
        """One index over several files' object graphs ``(name, root, converter)``, laid out by ``group``
        (the root): members spread into a group (the same collision rule as :meth:`merged`: the later key
        is renamed ``key#2`` and listed in ``conflicts``), placed under names, and groups nested in groups.
        ``owners[row]`` is the member a row comes from (-1 for the groups)."""
        self = cls.__new__(cls)
        self._init_columns(limits)
        self._build(group, [m[2] for m in members], list(members), False)
        return self

    @classmethod
    def from_table(cls, table: TensorTable, *, limits: Limits = DEFAULT_LIMITS) -> Index:
        """The index of a flat state_dict given as columns (:mod:`ckptfs.model.table`): rows are made in bulk
        and tensor nodes only when looked at."""
        self = cls.__new__(cls)
        self._init_columns(limits)
        n = len(table.keys)
        if n + 1 > limits.max_nodes:
            raise LimitError(f"more than {limits.max_nodes} objects in the checkpoint (--limit max_nodes=N raises it)")
        if table.n_tensors > limits.max_tensors:
            raise LimitError(f"more than {limits.max_tensors} tensors in the checkpoint (--limit max_tensors=N raises it)")
        if sum(map(len, table.keys)) > limits.max_key_bytes:
            raise LimitError(f"dotted keys longer than {limits.max_key_bytes} bytes in all")
        keys = [""]
        keys += table.keys
        by_key = dict(zip(keys, range(n + 1), strict=True))
        names: list[object] = keys  # type: ignore[assignment]  # a flat dict's keys are its names (row 0's name is never read)
        if len(by_key) != n + 1:  # the key "" is the root's: the entry is renamed as _build renames it
            names = [None, *table.keys]
            keys = list(keys)
            row = keys.index("", 1)
            by_key[""] = 0
            keys[row] = _dedupe("", by_key, {})
            by_key[keys[row]] = row
        self.keys, self.names, self.by_key = keys, names, by_key
        self.parents = [0] * (n + 1)
        self.parents[0] = -1
        if table.tensor_of is None:
            self.kinds = [TENSOR] * (n + 1)
        else:
            self.kinds = [TENSOR if t >= 0 else LEAF for t in table.tensor_of]
            self.kinds.insert(0, DICT)
        self.kinds[0] = DICT
        info: object = None
        if table.ordered:
            info = PickledOrderedDict()
            info.state = table.root_state
        nodes = NodeColumn([info])
        nodes.extend([PENDING] * n)
        for r, v in table.leaves.items():
            nodes[r + 1] = v
        nodes.table = table
        self.nodes = nodes
        if n:
            self._spans[0] = (1, n)
        self._order = range(n + 1)
        self.n_tensors = table.n_tensors
        return self

    def _init_columns(self, limits: Limits) -> None:
        self.limits = limits
        self.keys: list[str] = []
        self.names: list[object] = []
        self.parents: list[int] = []
        self.kinds: list[str] = []
        self.nodes: list[object] = []
        self.by_key: dict[str, int] = {}
        self._spans: dict[int, tuple[int, int]] = {}  # container row -> (first child row, count)
        self.n_tensors = 0
        self._order: Sequence[int] | None = None
        #: per row, the member it came from (merged indexes only)
        self.owners: list[int] | None = None
        #: merged indexes: (key, first member, member whose key was renamed, the new key)
        self.conflicts: list[tuple[str, int, int, str]] = []
        #: checks a TensorNode against its record on first use (set by the catalog that owns the index)
        self.validator: Callable[[TensorNode], None] | None = None

    # --- building -------------------------------------------------------------------------------------
    def _build(self, root: object, convs: list[Converter], members: list[tuple[str, object, Converter]] | None,
               drain: bool = False) -> None:
        limits = self.limits
        keys, names, parents, kinds, nodes = self.keys, self.names, self.parents, self.kinds, self.nodes
        by_key, spans = self.by_key, self._spans
        seen: dict[int, int] = {}  # id(container) -> its row: a container met again becomes a link
        keep_alive: list[object] = []  # containers whose id() is in `seen` (ids must not be reused)
        depth: dict[int, int] = {}
        max_depth, max_nodes, max_tensors = limits.max_depth, limits.max_nodes, limits.max_tensors
        max_key_bytes = limits.max_key_bytes
        key_bytes = 0
        n_tensors = 0
        guard = MemoryGuard(limits.max_memory, "indexing")
        dups: dict[str, int] = {}  # key -> next "#n" suffix to try (dedupe stays linear)
        owners = self.owners = [-1] if members is not None else None
        groups: set[int] = set()  # rows made by ckptfs (Group): keys spread into them may collide
        v2 = V2_CALL

        def expand(i: int, items: Iterable[tuple[object, object]], n_items: int, m: int,
                   batch: Callable[[], set[str]]) -> None:
            """Append the rows of ``items`` (children of row ``i``, from member ``m``). ``batch`` gives the
            keys every item of this expansion would have unrenamed: a renamed key never takes one."""
            nonlocal key_bytes, n_tensors
            # locals, not closure cells, in the loop below (it runs once per row)
            keys_, names_, parents_, kinds_, nodes_, by_key_ = keys, names, parents, kinds, nodes, by_key
            seen_, keep_alive_, classify_ = seen, keep_alive, classify
            conv = convs[m] if m >= 0 else convs[0]  # (a group's items are groups and members' roots)
            v2_convert = conv.v2
            kind: str
            node: object
            prefix = keys[i] + "." if i else ""
            first = len(keys)
            reserved: set[str] | None = None  # batch(), computed at the first collision only
            d1 = depth[i] + 1
            if first + n_items > max_nodes:
                raise LimitError(f"more than {max_nodes} objects in the checkpoint (--limit max_nodes=N raises it)")
            # dotted keys repeat their parent's key: a long key over many children (or nested, memo-shared
            # long keys) would cost far more memory than the pickle holds
            if key_bytes + len(prefix) * n_items > max_key_bytes:
                raise LimitError(f"dotted keys longer than {max_key_bytes} bytes in all (long keys under "
                                 f"{n_items} children of {prefix[:60]!r}...)")
            for name, v in items:
                if type(v) is v2:  # the common case first: a plain tensor
                    kind, node = TENSOR, v2_convert(v)
                else:
                    kind, node = classify_(v, conv)
                key = prefix + (name if type(name) is str else component(name))
                row = len(keys_)
                if by_key_.setdefault(key, row) != row:
                    old = key
                    if reserved is None:
                        reserved = batch()
                    key = _dedupe(key, by_key_, dups, reserved)
                    by_key_[key] = row
                    holder = by_key_[old]  # a row of this expansion (row >= first) is member m's own
                    if owners is not None and i in groups and holder < first and owners[holder] != m:
                        self.conflicts.append((old, owners[holder], m, key))
                if kind == TENSOR:
                    n_tensors += 1
                    if n_tensors > max_tensors:
                        raise LimitError(f"more than {max_tensors} tensors in the checkpoint (--limit max_tensors=N raises it)")
                elif kind in CONTAINERS:
                    oid = id(node)
                    target = seen_.get(oid)
                    if target is not None:
                        kind, node = LINK, target
                    else:
                        if d1 > max_depth:
                            raise LimitError(f"containers nest deeper than {max_depth} levels (at {key[:80]!r})")
                        seen_[oid] = row
                        keep_alive_.append(node)
                        depth[row] = d1
                keys_.append(key)
                names_.append(name)
                parents_.append(i)
                kinds_.append(kind)
                nodes_.append(node)
            if owners is not None:
                owners.extend([m] * (len(keys) - first))
            key_bytes += sum(map(len, keys[first:]))
            if key_bytes > max_key_bytes:
                raise LimitError(f"dotted keys longer than {max_key_bytes} bytes in all")

        def expand_group(i: int, group: Group) -> None:
            """A group's rows: spread members' items, members and groups under their names."""
            assert members is not None
            groups.add(i)
            first = len(keys)
            prefix = keys[i] + "." if i else ""
            memo: list[set[str]] = []

            def batch() -> set[str]:  # every member's keys: a renamed duplicate never takes a later file's key
                if not memo:
                    names: list[object] = [name for name, _ in group.named]
                    for m in group.flat:
                        name, obj, _conv = members[m]
                        names.extend(obj if isinstance(obj, dict) and type(obj) in PLAIN_DICTS else [name])
                    memo.append(_natural_keys(prefix, names))
                return memo[0]

            for m in group.flat:
                name, obj, _conv = members[m]
                if isinstance(obj, dict) and type(obj) in PLAIN_DICTS:
                    expand(i, obj.items(), len(obj), m, batch)
                else:
                    expand(i, [(name, obj)], 1, m, batch)
            for name, what in group.named:
                if isinstance(what, Group):
                    expand(i, [(name, what)], 1, -1, batch)
                else:
                    expand(i, [(name, members[what][1])], 1, what, batch)
            spans[i] = (first, len(keys) - first)

        if members is None:
            kind, node = classify(root, convs[0])
        else:
            kind, node = DICT, root
        keys.append("")
        names.append(None)
        parents.append(-1)
        kinds.append(kind)
        nodes.append(node)
        by_key[""] = 0
        n_tensors = 1 if kind == TENSOR else 0
        if kind in CONTAINERS:
            seen[id(node)] = 0
            keep_alive.append(node)
            depth[0] = 0
        del root  # from here the rows (and keep_alive) hold it, as they hold every container
        node = None
        sole = SOLE_HOLDERS
        next_check = 1 << 16  # rows; the memory guard is consulted every 64k new rows
        i = 0
        while i < len(keys):
            k_i = kinds[i]
            if k_i not in CONTAINERS or i in spans:
                i += 1
                continue
            obj = nodes[i]
            items: Iterable[tuple[object, object]]
            if type(obj) is Group:  # a merged index's root, or a directory of checkpoints inside it
                expand_group(i, obj)
                nodes[i] = None
                i += 1
                continue
            if k_i == DICT:
                if drain and sys.getrefcount(obj) == sole and type(obj) in PLAIN_DICTS:
                    # only this index holds it (not an opaque object's state, not a shared value):
                    # let each unpickled value go once it is a row
                    items = _draining(obj)  # type: ignore[arg-type]
                else:
                    items = obj.items()  # type: ignore[attr-defined]
            elif k_i == OPAQUE:
                items = opaque_children(obj)  # type: ignore[arg-type]
            elif k_i == COMPOSITE:
                items = obj.parts  # type: ignore[attr-defined]
            else:
                items = enumerate(obj)  # type: ignore[arg-type]
            first = len(keys)
            n_items = len(items) if k_i == OPAQUE or k_i == COMPOSITE else len(obj)  # type: ignore[arg-type]
            batch = _batch_of(keys[i] + "." if i else "", k_i, obj, items)
            expand(i, items, n_items, owners[i] if owners is not None else 0, batch)
            items = None  # type: ignore[assignment]  # no reference to the last child outlives this expansion (see `sole`)
            del batch  # (it holds obj and items too)
            spans[i] = (first, len(keys) - first)
            nodes[i] = _container_info(obj)  # the children are rows now; drop the pickled object
            if len(keys) >= next_check:
                guard.check()
                next_check = len(keys) + (1 << 16)
            i += 1
        self.n_tensors = n_tensors

    # --- queries --------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.keys)

    def entry(self, i: int) -> Entry:
        return Entry(self, i)

    def get(self, key: str) -> int | None:
        return self.by_key.get(key)

    def children(self, i: int) -> range:
        first, count = self._spans.get(i, (0, 0))
        return range(first, first + count)

    def path(self, i: int) -> tuple[object, ...]:
        """The original keys/indices from the root to row ``i``."""
        out: list[object] = []
        names, parents = self.names, self.parents
        while parents[i] >= 0:
            out.append(names[i])
            i = parents[i]
        return tuple(reversed(out))

    def find_path(self, path: tuple[object, ...]) -> int | None:
        """The row at a path of original keys (reaches keys whose dotted form is ambiguous)."""
        i = 0
        for part in path:
            for c in self.children(i):
                n = self.names[c]
                if type(n) is type(part) and n == part:
                    i = c
                    break
            else:
                return None
        return i

    def resolve(self, i: int) -> int:
        """Follow links to the row they point to."""
        while self.kinds[i] == LINK:
            i = self.nodes[i]  # type: ignore[assignment]
        return i

    def order(self) -> Sequence[int]:
        """All rows in depth-first pre-order: the order of the checkpoint itself."""
        if self._order is None:
            if len(self._spans) <= 1 and self._spans.get(0, (1, 0))[0] == 1:  # one container: rows in order
                self._order = range(len(self.keys))
                return self._order
            out = array("l")
            stack = [0]
            spans = self._spans
            while stack:
                i = stack.pop()
                out.append(i)
                sp = spans.get(i)
                if sp is not None and sp[1]:
                    stack.extend(range(sp[0] + sp[1] - 1, sp[0] - 1, -1))
            self._order = out
        return self._order

    def tensors(self) -> list[int]:
        kinds = self.kinds
        return [i for i in self.order() if kinds[i] == TENSOR]

    def leaves(self) -> list[int]:
        """Rows of tensors and leaf values, in checkpoint order (what ``Checkpoint.keys()`` lists)."""
        kinds = self.kinds
        return [i for i in self.order() if kinds[i] == TENSOR or kinds[i] == LEAF]


PLAIN_DICTS = (dict, PickledOrderedDict)


def _sole_holders() -> int:
    """sys.getrefcount() of a container held only by the index: the rows list, keep_alive, the loop's
    local and getrefcount's own argument (measured, not assumed: interpreters count differently)."""
    obj: dict[object, object] = {}
    rows, keep_alive = [obj], [obj]  # noqa: F841 - they hold it, as the index's lists do
    return sys.getrefcount(obj)


SOLE_HOLDERS = _sole_holders()


def _natural_keys(prefix: str, names: Iterable[object]) -> set[str]:
    """The keys ``names`` get under ``prefix``: the expression ``expand`` writes inline for each row (as a call
    it cost 0.03 s more per million rows); the two must stay the same."""
    return {prefix + (n if type(n) is str else component(n)) for n in names}


def _batch_of(prefix: str, kind: str, obj: object, items: object) -> Callable[[], set[str]]:
    """The unrenamed keys of a container's children, computed only if one of them collides (a list's
    indices, a dict's keys: still all present while ``_draining`` hands its values out)."""
    if kind == DICT:
        return lambda: _natural_keys(prefix, obj)  # type: ignore[arg-type]
    if kind == OPAQUE or kind == COMPOSITE:
        return lambda: _natural_keys(prefix, [name for name, _ in items])  # type: ignore[attr-defined]
    return lambda: _natural_keys(prefix, range(len(obj)))  # type: ignore[arg-type]


def _draining(d: dict[object, object]) -> Iterator[tuple[object, object]]:
    """``d.items()``, each value replaced by None in ``d`` as it is handed out (same size: iterating stays
    valid; the key's hash is cached or was computed by the unpickler already), then ``d`` emptied."""
    setitem = dict.__setitem__
    for key, value in d.items():
        setitem(d, key, None)
        yield key, value
    d.clear()


def _container_info(obj: object) -> object:
    """What a container row keeps once its children are rows: nothing for plain containers, the BUILD
    state (``_metadata``) for an OrderedDict, the object itself for opaque objects (their class name and
    how they were made). Dropping the rest frees the unpickled graph (most of the memory) early."""
    if type(obj) is PickledOrderedDict:
        info = PickledOrderedDict()
        info.state = getattr(obj, "state", None)
        return info
    if isinstance(obj, (OpaqueObject, TensorNode)):  # a composite tensor keeps its node (its metadata)
        return obj
    return None


def _dedupe(key: str, by_key: dict[str, int], dups: dict[str, int], reserved: Collection[str] = ()) -> str:
    """``key#2``, ``key#3``, ...: the first suffix neither taken nor ``reserved`` (the keys of rows still
    to come in this expansion); remembered per key: 10^5 equal keys, e.g. unknown objects used as dict keys,
    all named alike, stay linear."""
    n = dups.get(key, 2)
    while f"{key}#{n}" in by_key or f"{key}#{n}" in reserved:
        n += 1
    dups[key] = n + 1
    return f"{key}#{n}"
