"""A flat state_dict as columns: the fast, compact form of the commonest checkpoint.

Most checkpoints are one dict (or OrderedDict) of string keys to plain ``_rebuild_tensor_v2`` calls. For
those, the index does not need a Python object per tensor: a :class:`TensorTable` holds arrays (storage,
offset, shape and stride ids, requires_grad) and the keys; a ``TensorNode`` is made only when a tensor is
looked at (:class:`ckptfs.model.index.NodeColumn`).

The table is read straight from the pickle's bytes when it can be (:func:`scan`: a small pickle machine in
C, ``_tablescan.c``, that knows only what such a state_dict is made of, and declines anything else); else it
is made where the pickle is unpickled. With the unpickling probe (the default) that is the forked child: it
unpickles, recognises the plain form, and sends the columns back (:func:`encode`), so this process never
builds the pickle's object graph at all. Anything not plainly of that form — another root type, a key that
is not a str, a value that is not a plain tensor or a simple value, tensor metadata, a storage referenced
with two dtypes — is declined and indexed by the general path.

Every tensor accepted here is exactly what :meth:`Converter.v2`'s fast path makes of it (tested on every
fixture, and with arbitrary arguments); what :func:`scan` accepts, :func:`tabulate` accepts too, with the
same columns (tested on every fixture and on mutated pickles).
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass, field
from itertools import chain, count, repeat
from operator import is_, itemgetter
from typing import Any, Iterable

import numpy as np

from ..dtypes import UINT8, DType
from ..limits import Limits
from ..pickle.allowlist import ALLOWED, TENSOR_CALLS
from ..pickle.nodes import PersistentId, PickledOrderedDict, StorageOwner, StorageRef, StorageType, TensorNode
from .convert.common import MAX_DIMS

try:
    from . import _tablescan
except ImportError:  # built without a C compiler: the unpickling path does it all
    _tablescan = None  # type: ignore[assignment]

V2_CALL = TENSOR_CALLS[("torch._utils", "_rebuild_tensor_v2")]
FORMAT = 1
#: Plain values a table row may hold besides tensors, and plain data of an OrderedDict's state.
_LEAVES = (int, float, bool, str, bytes, type(None), complex)
_MAX_STATE_DEPTH = 64


class Declined(Exception):
    """Not the plain form: index it the general way."""


@dataclass
class TensorTable:
    """Rows of a flat dict: ``keys[i]``; tensor rows are those with ``tensor_of[i] >= 0``."""

    keys: list[str]
    ordered: bool  # the root was an OrderedDict
    root_state: object  # its BUILD state (plain data: dicts, lists, tuples, OrderedDicts, leaves), if any
    leaves: dict[int, object]  # row -> value, for rows that are not tensors
    tensor_of: array[int] | None  # row -> tensor number (None: every row is a tensor, row i is tensor i)
    storage: array[int]  # tensor -> storage number
    offset: array[int]
    shape: array[int]  # tensor -> shape number
    stride: array[int]
    requires_grad: bytes
    shapes: list[tuple[int, ...]]
    st_keys: list[str] | array[int]  # storage keys; as ints when all are canonical decimal (torch's "0", "1", ...)
    st_numel: array[int]
    st_type: array[int]  # storage -> index in stypes
    st_location: array[int]  # storage -> index in locations
    stypes: list[str]  # StorageType qualnames
    locations: list[str]
    owner: StorageOwner | None = None
    _types: list[StorageType] = field(default_factory=list)
    _refs: dict[int, StorageRef] = field(default_factory=dict)

    @property
    def n_tensors(self) -> int:
        return len(self.storage)

    def total_nbytes(self) -> int:
        """The sum of the tensors' ``tensors.nbytes`` (numel x itemsize: every tensor here is dense), without a
        node per tensor: counted per (shape, storage class), exactly (Python ints)."""
        if not self.n_tensors:
            return 0
        types = self.storage_types()
        itemsize = [(st.dtype or UINT8).itemsize for st in types]
        combo = (np.asarray(self.shape, dtype=np.int64) * len(types)
                 + np.asarray(self.st_type, dtype=np.int64)[np.asarray(self.storage, dtype=np.int64)])
        found, counts = np.unique(combo, return_counts=True)
        total = 0
        for k, c in zip(found.tolist(), counts.tolist(), strict=True):
            size = 1
            for d in self.shapes[k // len(types)]:
                size *= d
            total += c * size * itemsize[k % len(types)]
        return total

    def plain(self) -> dict[str, object]:
        """The columns as plain data (arrays as lists, storage keys as text): what two tables made by different
        paths (scan, tabulate, decode) are compared by."""
        out = {k: v for k, v in vars(self).items() if k not in ("owner", "_types", "_refs")}
        for k, v in out.items():
            if isinstance(v, array):
                out[k] = v.tolist()
        out["st_keys"] = [str(k) for k in self.st_keys]
        return out

    def storage_types(self) -> list[StorageType]:
        """The storage classes by number (looked up once)."""
        if not self._types:
            from ..pickle.allowlist import ALLOWED

            for q in self.stypes:
                mod, _, name = q.rpartition(".")
                st = ALLOWED[(mod, name)]
                assert isinstance(st, StorageType)
                self._types.append(st)
        return self._types

    def storage_dtype(self, s: int) -> DType | None:
        return self.storage_types()[self.st_type[s]].dtype

    def storage_ref(self, s: int) -> StorageRef:
        """Storage ``s`` as a StorageRef, made once (tensors on one storage share it)."""
        ref = self._refs.get(s)
        if ref is None:
            stype = self.storage_types()[self.st_type[s]]
            key = self.st_keys[s]
            ref = StorageRef(key if type(key) is str else str(key), stype.dtype, self.st_numel[s], self.locations[self.st_location[s]],
                             stype.name, self.owner)
            self._refs[s] = ref
        return ref

    def node(self, t: int) -> TensorNode:
        """Tensor ``t`` as the node Converter.v2 makes of it."""
        ref = self.storage_ref(self.storage[t])
        shapes = self.shapes
        return TensorNode("dense", ref, ref.dtype or UINT8, shapes[self.shape[t]], shapes[self.stride[t]],
                          self.offset[t], self.requires_grad[t] == 1, None)


# --- made in the unpickling child (or in process): the graph -> columns ----------------------------------------


def digest(obj: object) -> bytes | None:
    """The columns of a plain flat state_dict, encoded; None when ``obj`` is not of that form."""
    try:
        return encode(tabulate(obj))
    except Declined:
        return None


def tabulate(obj: object) -> TensorTable:
    """Recognise the plain form; raises Declined otherwise. Checks run a column at a time, and every value
    is type-checked before anything hashes it (a hostile tuple is never hashed here)."""
    t = type(obj)
    if t is not dict and t is not PickledOrderedDict:
        raise Declined("root")
    d: dict[Any, Any] = obj  # type: ignore[assignment]
    keys = list(d)
    if not _types_are(keys, str):
        raise Declined("keys")
    values = list(d.values())
    n = len(values)
    is_tensor = [type(v) is V2_CALL for v in values]
    leaves: dict[int, object] = {}
    if not all(is_tensor):
        for i in range(n):
            if not is_tensor[i]:
                v = values[i]
                if type(v) not in _LEAVES:
                    raise Declined("value")
                leaves[i] = v
        values = [values[i] for i in range(n) if is_tensor[i]]
    args = [c.args for c in values]
    del values
    arities = set(map(len, args))
    if not arities <= {6, 7}:
        raise Declined("arguments")
    if 7 in arities:
        for a in args:
            if len(a) == 7 and not (a[6] is None or type(a[6]) is dict and not a[6]):
                raise Declined("metadata")
    ids = list(map(_first, args))
    if not _types_are(ids, PersistentId):
        raise Declined("storage")
    pargs = [p.args for p in ids]
    if set(map(len, pargs)) != {1}:
        raise Declined("storage")
    pids = list(map(_first, pargs))
    if not _types_are(pids, tuple) or set(map(len, pids)) != {5}:
        raise Declined("storage")
    tags, stypes, st_keys_all, locs, numels = (list(col) for col in zip(*pids, strict=True)) if pids else ([], [], [], [], [])
    if not (_types_are(tags, str) and set(tags) <= {"storage"} and _types_are(stypes, StorageType)
            and _types_are(st_keys_all, str) and _types_are(locs, str) and _types_are(numels, int)
            and (not numels or min(numels) >= 0)):
        raise Declined("storage")
    offsets = list(map(_item1, args))
    sizes = list(map(_item2, args))
    strides = list(map(_item3, args))
    if not (_types_are(offsets, int) and _types_are(sizes, tuple) and _types_are(strides, tuple)):
        raise Declined("geometry")
    ndims = list(map(len, sizes))
    if ndims != list(map(len, strides)) or (ndims and max(ndims) > min(MAX_DIMS, 254)):
        raise Declined("geometry")
    if not (_types_are(chain.from_iterable(sizes), int) and _types_are(chain.from_iterable(strides), int)):
        raise Declined("geometry")
    # storages, numbered by first reference; a key referenced with another dtype or size is not plain
    seen: dict[str, int] = {}
    first_of = np.fromiter(map(seen.setdefault, st_keys_all, count()), dtype=np.int64, count=len(st_keys_all))
    st_first = np.fromiter(seen.values(), dtype=np.int64, count=len(seen))  # tensors, increasing
    del seen
    type_index = {st: i for i, st in enumerate(dict.fromkeys(stypes))}  # StorageTypes are a few singletons
    location_index = {loc: i for i, loc in enumerate(dict.fromkeys(locs))}
    dtypes = list(dict.fromkeys(st.dtype for st in type_index))
    dtype_code = {st: dtypes.index(st.dtype) for st in type_index}
    shape_ids = {s: i for i, s in enumerate(dict.fromkeys(chain(sizes, strides)))}
    try:
        numel = np.array(numels, dtype=np.int64)
        codes = np.fromiter(map(dtype_code.__getitem__, stypes), dtype=np.int64, count=len(stypes))
        if not (np.array_equal(numel[first_of], numel) and np.array_equal(codes[first_of], codes)):
            raise Declined("storage twice")
        if len(st_first) == len(first_of):  # every tensor on a storage of its own
            storage = array("l", range(len(first_of)))
        else:
            dense = np.empty(len(first_of), dtype=np.int64)
            dense[st_first] = np.arange(len(st_first))
            storage = array("l", dense[first_of].tobytes())
        firsts = st_first.tolist()
        st_type = array("H", map(type_index.__getitem__, map(stypes.__getitem__, firsts)))
        st_location = array("H", map(location_index.__getitem__, map(locs.__getitem__, firsts)))
        st_numel = array("q", numel[st_first].tobytes())
        offset = array("q", offsets)
        shape = array("l", map(shape_ids.__getitem__, sizes))
        stride = array("l", map(shape_ids.__getitem__, strides))
        array("q", chain.from_iterable(shape_ids))  # every dimension fits an int64 (else: the general path)
    except OverflowError:
        raise Declined("too large") from None
    root_state = None
    if t is PickledOrderedDict:
        root_state = d.state  # type: ignore[attr-defined]
        _plain(root_state, 0)  # (plain data only)
    return TensorTable(
        keys=keys, ordered=t is PickledOrderedDict, root_state=root_state, leaves=leaves,
        tensor_of=None if not leaves else array("l", _tensor_numbers(is_tensor)),
        storage=storage, offset=offset, shape=shape, stride=stride,
        requires_grad=bytes(map(is_, map(_item4, args), repeat(True))), shapes=list(shape_ids),
        st_keys=list(map(st_keys_all.__getitem__, firsts)), st_numel=st_numel, st_type=st_type,
        st_location=st_location, stypes=[st.qualname for st in type_index], locations=list(location_index))


_first, _item1, _item2, _item3, _item4 = (itemgetter(k) for k in range(5))


def _types_are(values: Iterable[object], kind: type) -> bool:
    """Every value's type is exactly ``kind`` (no subclass)."""
    return set(map(type, values)) <= {kind}


def _dtype(stype: StorageType) -> object:
    return stype.dtype


def _tensor_numbers(is_tensor: list[bool]) -> list[int]:
    out, k = [], 0
    for flag in is_tensor:
        out.append(k if flag else -1)
        k += flag
    return out


def _plain(v: object, depth: int) -> object:
    """Plain data (an OrderedDict's BUILD state: the module versions of ``_metadata``) as tagged tuples that
    the wire format (:func:`_pack`) can carry; anything else is declined."""
    if depth > _MAX_STATE_DEPTH:
        raise Declined("state depth")
    t = type(v)
    if t in _LEAVES:
        return ("v", v)
    if t is dict:
        return ("d", [(_plain(k, depth + 1), _plain(x, depth + 1)) for k, x in v.items()])  # type: ignore[attr-defined]
    if t is PickledOrderedDict:
        return ("o", [(_plain(k, depth + 1), _plain(x, depth + 1)) for k, x in v.items()],  # type: ignore[attr-defined]
                _plain(v.state, depth + 1))  # type: ignore[attr-defined]
    if t is list or t is tuple:
        return ("l" if t is list else "t", [_plain(x, depth + 1) for x in v])  # type: ignore[attr-defined]
    raise Declined("state")


def _unplain(v: Any) -> object:
    tag = v[0]
    if tag == "v":
        return v[1]
    if tag == "d":
        return {_unplain(k): _unplain(x) for k, x in v[1]}
    if tag == "o":
        od = PickledOrderedDict()
        for k, x in v[1]:
            dict.__setitem__(od, _unplain(k), _unplain(x))
        od.state = _unplain(v[2])
        return od
    items = [_unplain(x) for x in v[1]]
    return items if tag == "l" else tuple(items)


# --- read from the pickle's bytes (C) ----------------------------------------------------------------------

#: The scan's memory: at most this many bytes per byte of pickle (a million tensors took 4.6), plus a floor.
SCAN_BYTES_PER_PICKLE_BYTE = 32
_SCAN_FLOOR = 16 << 20
#: The scan's first arena (tuple items; collected when full, grown when half stays full). Tests make it tiny, so
#: that its collector runs all the time.
SCAN_ARENA = 1 << 14
_scan_tables: list[tuple[dict[bytes, int], list[int], list[StorageType]]] = []


def _globals() -> tuple[dict[bytes, int], list[int], list[StorageType]]:
    """What the scan may name: ``b"module\\nname"`` -> -1 (OrderedDict), -2 (_rebuild_tensor_v2) or a storage
    class's number; each storage class's dtype as a number (equal dtypes, equal numbers); the classes."""
    if not _scan_tables:
        codes: dict[bytes, int] = {b"collections\nOrderedDict": -1, b"torch._utils\n_rebuild_tensor_v2": -2}
        stypes: list[StorageType] = []
        dtype_numbers: dict[DType | None, int] = {}
        for (mod, name), found in ALLOWED.items():
            if isinstance(found, StorageType):
                codes[f"{mod}\n{name}".encode()] = len(stypes)
                stypes.append(found)
        dtype_of = [dtype_numbers.setdefault(st.dtype, len(dtype_numbers)) for st in stypes]
        _scan_tables.append((codes, dtype_of, stypes))
    return _scan_tables[0]


def scan(data: bytes, key_prefix: str | None = None, limits: Limits | None = None) -> TensorTable | None:
    """The table of a plain flat state_dict read straight from its pickle, without unpickling it (C); None when
    the pickle is not plainly of that form or ckptfs was built without its C extension. ``key_prefix`` goes
    before every storage key, as the unpickler's ``key_prefix`` does."""
    if _tablescan is None:
        return None
    codes, dtype_of, stypes = _globals()
    budget = SCAN_BYTES_PER_PICKLE_BYTE * len(data) + _SCAN_FLOOR
    if limits is not None:
        budget = min(budget, limits.max_memory)
    prefix = None if key_prefix is None else key_prefix.encode("utf-8", "surrogatepass")
    found = _tablescan.scan(data, codes, dtype_of, budget, min(MAX_DIMS, 254), prefix, PickledOrderedDict, SCAN_ARENA)
    if found is None:
        return None
    (keys, ordered, root_state, leaves, tensor_of, storage, offset, shape, stride, requires_grad, shapes, st_keys,
     st_numel, st_type, st_location, type_codes, locations) = found
    return TensorTable(
        keys=keys, ordered=ordered, root_state=root_state, leaves=dict(leaves),
        tensor_of=None if tensor_of is None else _longs(tensor_of), storage=_longs(storage),
        offset=_array("q", offset), shape=_longs(shape), stride=_longs(stride), requires_grad=requires_grad,
        shapes=shapes, st_keys=_array("q", st_keys) if isinstance(st_keys, bytes) else st_keys,
        st_numel=_array("q", st_numel), st_type=_array("H", st_type), st_location=_array("H", st_location),
        stypes=[stypes[c].qualname for c in type_codes], locations=locations)


def _longs(data: bytes) -> array[int]:
    """array("l") of the scan's int64s ("l" is 8 bytes on LP64 Linux; converted where it is not)."""
    return _array("l", data) if array("l").itemsize == 8 else array("l", _array("q", data))


class TableDigest:
    """The plain form as a :class:`~ckptfs.container.base.GraphDigest`: read from a pickle's bytes
    (:func:`scan`), or made of the unpickled graph where it is unpickled (:func:`digest`).

    ``read_ahead`` scans pickles before their containers ask (a catalog of several files probes the pickles the
    scan declines together, in one fork): ``of_pickle`` then hands back what was read, once."""

    def __init__(self) -> None:
        self._read: dict[int, tuple[bytes, TensorTable | None]] = {}

    def read_ahead(self, datas: Iterable[bytes], limits: Limits) -> list[bytes]:
        """Scan ``datas`` now; the ones that are not plainly state_dicts (for the probe)."""
        declined = []
        for data in datas:
            found = scan(data, None, limits)
            self._read[id(data)] = (data, found)
            if found is None:
                declined.append(data)
        return declined

    def of_graph(self, obj: object) -> bytes | None:
        return digest(obj)

    def of_pickle(self, data: bytes, key_prefix: str | None, limits: Limits) -> TensorTable | None:
        known = self._read.pop(id(data), None) if key_prefix is None else None
        if known is not None and known[0] is data:
            return known[1]
        return scan(data, key_prefix, limits)


DIGEST = TableDigest()


def graph_of(t: TensorTable) -> dict[object, object]:
    """The object graph a table stands for, with the nodes of its tensors (for indexes built from graphs: a
    catalog of several files). An OrderedDict keeps its state."""
    root: dict[object, object] = PickledOrderedDict() if t.ordered else {}
    if t.ordered:
        root.state = t.root_state  # type: ignore[attr-defined]
    tensor_of, leaves = t.tensor_of, t.leaves
    for r, key in enumerate(t.keys):
        n = r if tensor_of is None else tensor_of[r]
        dict.__setitem__(root, key, t.node(n) if n >= 0 else leaves[r])
    return root


# --- the wire format between the child and this process -----------------------------------------------------


def encode(t: TensorTable) -> bytes:
    keys = "\x00".join(t.keys)
    if keys.count("\x00") != max(len(t.keys) - 1, 0):
        raise Declined("NUL in a key")
    st_keys: str | bytes
    if isinstance(t.st_keys, list) and all(_decimal(k) for k in t.st_keys):
        st_keys = array("q", map(int, t.st_keys)).tobytes()
    else:
        st_keys = "\x00".join(map(str, t.st_keys))
        if st_keys.count("\x00") != max(len(t.st_keys) - 1, 0):
            raise Declined("NUL in a storage key")
    dims = array("q", chain.from_iterable(t.shapes))
    ndim = bytes(map(len, t.shapes))  # tabulate keeps dimensions under 255
    out: list[bytes] = []
    _pack({
        "format": FORMAT, "n": len(t.keys), "keys": keys, "ordered": t.ordered,
        "root_state": None if t.root_state is None else _plain(t.root_state, 0),
        "leaves": [(r, v) for r, v in t.leaves.items()],
        "tensor_of": None if t.tensor_of is None else t.tensor_of.tobytes(),
        "storage": t.storage.tobytes(), "offset": t.offset.tobytes(), "shape": t.shape.tobytes(),
        "stride": t.stride.tobytes(), "requires_grad": t.requires_grad, "ndim": bytes(ndim), "dims": dims.tobytes(),
        "st_keys": st_keys, "st_numel": t.st_numel.tobytes(), "st_type": t.st_type.tobytes(),
        "st_location": t.st_location.tobytes(), "stypes": t.stypes, "locations": t.locations,
    }, out)
    return b"".join(out)


# Plain values on the wire: a tag byte, then the value. Lengths and counts are 8-byte little-endian. Written
# here (not marshal or pickle) so that reading what the child sent can only ever build these types.
_LEN = struct.Struct("<Q")
_FLOAT = struct.Struct("<d")
_COMPLEX = struct.Struct("<dd")


def _pack(v: object, out: list[bytes]) -> None:
    t = type(v)
    if v is None:
        out.append(b"N")
    elif t is bool:
        out.append(b"T" if v else b"F")
    elif t is int:
        digits = str(v).encode()
        out += (b"i", _LEN.pack(len(digits)), digits)
    elif t is float:
        out += (b"f", _FLOAT.pack(v))
    elif t is complex:
        out += (b"c", _COMPLEX.pack(v.real, v.imag))  # type: ignore[attr-defined]
    elif t is str:
        data = v.encode("utf-8", "surrogatepass")  # type: ignore[attr-defined]
        out += (b"s", _LEN.pack(len(data)), data)
    elif t is bytes:
        out += (b"b", _LEN.pack(len(v)), v)  # type: ignore[arg-type]
    elif t is list or t is tuple:
        out += (b"l" if t is list else b"t", _LEN.pack(len(v)))  # type: ignore[arg-type]
        for x in v:  # type: ignore[attr-defined]
            _pack(x, out)
    elif t is dict:
        out += (b"d", _LEN.pack(len(v)))  # type: ignore[arg-type]
        for k, x in v.items():  # type: ignore[attr-defined]
            _pack(k, out)
            _pack(x, out)
    else:
        raise Declined(f"a {t.__name__} on the wire")


class _Unpacker:
    """Reads what :func:`_pack` wrote; anything else is a ValueError."""

    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)
        self.pos = 0

    def whole(self) -> Any:
        try:
            v = self.value(0)
        except (TypeError, struct.error) as e:  # an unhashable dict key; a short number
            raise ValueError(f"malformed ckptfs table: {e}") from None
        if self.pos != len(self.data):
            raise ValueError("trailing bytes after a ckptfs table")
        return v

    def _take(self, n: int) -> memoryview:
        end = self.pos + n
        if n < 0 or end > len(self.data):
            raise ValueError("truncated ckptfs table")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def _len(self) -> int:
        return int(_LEN.unpack(self._take(8))[0])

    def value(self, depth: int) -> Any:
        if depth > _MAX_STATE_DEPTH + 8:
            raise ValueError("ckptfs table nested too deep")
        tag = bytes(self._take(1))
        if tag == b"N":
            return None
        if tag in (b"T", b"F"):
            return tag == b"T"
        if tag == b"i":
            return int(bytes(self._take(self._len())))
        if tag == b"f":
            return _FLOAT.unpack(self._take(8))[0]
        if tag == b"c":
            return complex(*_COMPLEX.unpack(self._take(16)))
        if tag == b"s":
            return str(self._take(self._len()), "utf-8", "surrogatepass")
        if tag == b"b":
            return bytes(self._take(self._len()))
        if tag in (b"l", b"t"):
            items = [self.value(depth + 1) for _ in range(self._len())]
            return items if tag == b"l" else tuple(items)
        if tag == b"d":
            out = {}
            for _ in range(self._len()):
                k = self.value(depth + 1)
                out[k] = self.value(depth + 1)
            return out
        raise ValueError(f"unknown tag {tag!r} in a ckptfs table")


def _decimal(key: str) -> bool:
    """A storage key torch writes: a canonical decimal that int() and str() give back unchanged."""
    return key.isascii() and key.isdigit() and (key[0] != "0" or key == "0") and len(key) < 19


def _array(code: str, data: bytes) -> array[int]:
    a = array(code)
    a.frombytes(data)
    return a


def decode(blob: bytes) -> TensorTable:
    """The table the child sent (made by :func:`encode` in this very program)."""
    m = _Unpacker(blob).whole()
    if type(m) is not dict or m.get("format") != FORMAT:
        raise ValueError("not a ckptfs table")
    n = m["n"]
    keys = m["keys"].split("\x00") if n else []
    st_numel = _array("q", m["st_numel"])
    raw_keys = m["st_keys"]
    st_keys: list[str] | array[int]
    if type(raw_keys) is bytes:
        st_keys = _array("q", raw_keys)
    else:
        st_keys = raw_keys.split("\x00") if st_numel else []
    ndim = m["ndim"]
    dims = _array("q", m["dims"])
    shapes = []
    pos = 0
    for k in ndim:
        shapes.append(tuple(dims[pos : pos + k]))
        pos += k
    storage = _array("l", m["storage"])
    if len(keys) != n or pos != len(dims) or len(st_numel) != len(st_keys):
        raise ValueError("inconsistent ckptfs table")
    state = m["root_state"]
    return TensorTable(
        keys=keys, ordered=m["ordered"], root_state=None if state is None else _unplain(state),
        leaves={r: v for r, v in m["leaves"]},
        tensor_of=None if m["tensor_of"] is None else _array("l", m["tensor_of"]),
        storage=storage, offset=_array("q", m["offset"]), shape=_array("l", m["shape"]),
        stride=_array("l", m["stride"]), requires_grad=m["requires_grad"], shapes=shapes, st_keys=st_keys,
        st_numel=st_numel, st_type=_array("H", m["st_type"]),
        st_location=_array("H", m["st_location"]), stypes=m["stypes"], locations=m["locations"])
