"""The columnar index of flat state_dicts (model/table.py): the same answers as the general path, with no
Python object per tensor until one is looked at."""

from __future__ import annotations

import io
import json
import zipfile
from collections import OrderedDict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import torch
from helpers import run_ckptfs, torch_bytes

import ckptfs
from ckptfs.container.zip import ZipArchive
from ckptfs.errors import FormatError
from ckptfs.model import table
from ckptfs.model.index import PENDING, NodeColumn
from ckptfs.source import BytesSource

NO_PROBE = ckptfs.Limits(unpickle_probe=False)


def _state_dicts() -> dict[str, object]:
    w = torch.randn(6, 4)
    base = torch.arange(24, dtype=torch.float64)
    sd = OrderedDict([("fc.weight", w), ("fc.bias", torch.zeros(4, dtype=torch.bfloat16)),
                      ("tied", w), ("view", base[2:10]), ("view2", base.view(4, 6)[1:, ::2]),
                      ("t", w.t()), ("scalar", torch.tensor(3, dtype=torch.int64)), ("empty", torch.empty(0, 5)),
                      ("bool", torch.tensor([True, False])), ("grad", torch.ones(2, requires_grad=True)),
                      ("", torch.ones(1)), ("key.with..dots", torch.ones(3, dtype=torch.uint8))])
    sd._metadata = OrderedDict([("", {"version": 1}), ("fc", {"version": 2})])  # type: ignore[attr-defined]
    return {
        "module_state": sd,
        "plain_dict": {f"layer.{i}.w": torch.full((i + 1,), float(i)) for i in range(50)},
        "with_values": {"w": torch.ones(2), "epoch": 3, "lr": 0.5, "name": "run", "flag": True, "none": None},
    }


def _general(monkeypatch: pytest.MonkeyPatch) -> None:
    """Force the general (object per tensor) path."""
    def declined(obj: object) -> table.TensorTable:
        raise table.Declined("forced")

    monkeypatch.setattr(table, "tabulate", declined)
    monkeypatch.setattr(table, "digest", lambda obj: None)
    monkeypatch.setattr(table, "scan", lambda data, key_prefix=None, limits=None: None)


@pytest.mark.parametrize("name", list(_state_dicts()))
@pytest.mark.parametrize("how", ["scan", "probe", "in-process"])
def test_table_index_answers_as_the_general_path(tmp_path, monkeypatch, name, how):
    """The table, read from the pickle (scan), made in the probe's child or in this process, answers as the
    general path does; tensors' bytes and the state_dict's _metadata as torch.load gives them."""
    obj = _state_dicts()[name]
    p = tmp_path / "m.pth"
    torch.save(obj, p)
    ref = torch.load(p, weights_only=True)
    limits = NO_PROBE if how == "in-process" else ckptfs.Limits()
    if how != "scan":
        monkeypatch.setattr(table, "scan", lambda data, key_prefix=None, limits=None: None)
    with ckptfs.open(p, limits=limits) as fast:
        assert type(fast.index.nodes) is NodeColumn  # the table path was taken
        got = {k: fast.meta(k).to_dict() for k in fast.keys()}
        order = list(fast.keys())
        for k in fast.tensor_keys():
            path = fast.meta(k).path
            assert fast.read(k) == torch_bytes(ref[path[0]]), k
        meta = ckptfs.load(p, limits=limits)._metadata
    with monkeypatch.context() as m:
        _general(m)
        with ckptfs.open(p, limits=limits) as slow:
            assert type(slow.index.nodes) is not NodeColumn
            assert list(slow.keys()) == order
            assert {k: slow.meta(k).to_dict() for k in slow.keys()} == got
    assert meta == getattr(ref, "_metadata", None)


def test_total_bytes_without_a_node_per_tensor(tmp_path):
    """statfs of a mount (TreeView.total_bytes) sums the tensors' bytes from the table's columns: the same
    total as torch's tensors, and no TensorNode is made."""
    for name, obj in _state_dicts().items():
        p = tmp_path / f"{name}.pth"
        torch.save(obj, p)
        ref = torch.load(p, weights_only=True)
        want = sum(v.nelement() * v.element_size() for v in ref.values() if isinstance(v, torch.Tensor))
        with ckptfs.open(p) as ck:
            nodes = ck.index.nodes
            assert type(nodes) is NodeColumn
            assert nodes.table.total_nbytes() == want, name
            assert all(list.__getitem__(nodes, i) is PENDING for i in ck.index.tensors())


def test_nodes_are_made_when_looked_at_and_kept(tmp_path):
    p = tmp_path / "m.pth"
    torch.save({f"w{i}": torch.ones(i + 1) for i in range(100)}, p)
    with ckptfs.open(p) as ckpt:
        nodes = ckpt.index.nodes
        assert all(list.__getitem__(nodes, i) is PENDING for i in range(1, 101))
        assert ckpt.meta("w7").shape == (8,) and ckpt.meta("w7").dtype == "float32"
        assert list.__getitem__(nodes, ckpt.row("w7")) is PENDING  # shape and dtype need no node
        first = nodes[ckpt.row("w7")]
        assert nodes[ckpt.row("w7")] is first  # made once
        assert ckpt.read("w9") == torch_bytes(torch.ones(10))


def test_digest_round_trip_and_what_is_declined():
    w = torch.ones(3)
    buf = io.BytesIO()
    torch.save({"a": w, "b": w[1:], "c": 7}, buf)
    with zipfile.ZipFile(buf) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    from ckptfs.pickle.unpickler import unpickle

    obj, _, _ = unpickle(data, limits=NO_PROBE)
    t = table.tabulate(obj)
    back = table.decode(table.encode(t))
    assert [back.node(i).shape for i in range(2)] == [(3,), (2,)]
    assert back.keys == ["a", "b", "c"] and back.leaves == {2: 7}
    assert list(back.offset) == [0, 1] and list(back.storage) == [0, 0]
    for bad in ({1: t}, [w], {"a": {"nested": 1}}, {"a": object()}):
        with pytest.raises(table.Declined):
            table.tabulate(bad)


def test_tensor_metadata_and_two_dtypes_on_a_storage_take_the_general_path(tmp_path):
    p = tmp_path / "conj.pth"
    z = torch.randn(3, dtype=torch.complex64)
    torch.save({"z": z.conj(), "w": torch.ones(2)}, p)
    ref = torch.load(p, weights_only=True)
    with ckptfs.open(p) as ckpt:
        assert type(ckpt.index.nodes) is not NodeColumn
        assert ckpt.meta("z").extra.get("conj") is True
        assert torch.equal(ckpt.tensor("z"), ref["z"])


def test_entry_names_lookup_and_duplicates():
    def archive(names: list[str]) -> bytes:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            for n in names:
                z.writestr("arch/" + n, n.encode())
        return buf.getvalue()

    names = ["data.pkl"] + [f"data/{i}" for i in range(3000)] + ["data/007", "data/x", "version"]
    arch = ZipArchive(BytesSource(archive(names), "a.zip"))
    assert arch.names() == names and len(arch) == len(names)
    for n in ("data/0", "data/2999", "data/007", "data/x", "version", "data.pkl"):
        assert arch.get(n).data().pread(0, 100) == n.encode()
    assert arch.get("data/7").data().pread(0, 100) == b"data/7"
    assert arch.get("data/3000") is None and not arch.has("data/07")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate it is asked to write
        dup = archive(["data.pkl", "data/1", "data/2", "data/1"])
    with pytest.raises(FormatError, match="duplicate"):
        ZipArchive(BytesSource(dup, "d.zip"))


_plain_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(),
                        st.binary(), st.complex_numbers(allow_nan=False))
_plain = st.recursive(_plain_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.lists(inner, max_size=4).map(tuple),
    st.dictionaries(st.one_of(st.text(), st.integers()), inner, max_size=4)), max_leaves=20)


@given(_plain)
def test_the_wire_format_gives_back_what_it_was_given(value):
    out: list[bytes] = []
    table._pack(value, out)
    got = table._Unpacker(b"".join(out)).whole()
    assert got == value and type(got) is type(value)


@given(st.binary(max_size=64))
def test_the_wire_format_refuses_junk_with_a_value_error(data):
    try:
        table._Unpacker(data).whole()
    except ValueError:
        pass


def test_a_big_state_dict_s_graph_may_be_built_in_the_probe_in_proportion_to_its_pickle(tmp_path):
    """A million tensors are a ~100 MB pickle whose unpickled graph (~7 bytes per pickle byte) is over the
    default max_memory: the probe child may build up to 10 bytes per pickle byte (scaled down here: 20,000
    tensors, a 2 MB pickle, max_memory 4 MiB). Expected values from torch.load; a pickle that builds far more
    per byte than that (EMPTY_DICT floods) is still refused (tests/hostile)."""
    g = torch.Generator().manual_seed(5)
    sd = {f"layers.{i}.w": torch.randn(4, generator=g) for i in range(20_000)}
    p = tmp_path / "many.pth"
    torch.save(sd, p)
    with zipfile.ZipFile(p) as z:
        size = z.getinfo("many/data.pkl").file_size
    assert 4 << 20 < 10 * size  # the premise: the rule, not max_memory, lets it through
    # (a fresh process: one that has just freed memory lets a child grow without growing its address space)
    r = run_ckptfs("ls", "--json", "--limit", "max_memory=4M", str(p), "layers.1999?.w")
    assert r.returncode == 0, r.stderr
    ref = torch.load(p, weights_only=True)
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [m["key"] for m in rows] == [f"layers.{i}.w" for i in range(19990, 20000)]
    assert all(m["shape"] == list(ref[m["key"]].shape) and m["dtype"] == "float32" for m in rows)


# --- the scan: the table read straight from the pickle's bytes (model/_tablescan.c) ----------------------------
#
# What the scan accepts must be exactly what the unpickling path makes of the same bytes (the two are separate
# implementations: the C unpickler plus table.tabulate, and the scan's own pickle machine); what both make is
# checked against torch.load above and below.


def _pickle_of(path: object) -> bytes:
    with zipfile.ZipFile(path) as z:  # type: ignore[arg-type]
        return z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))


def _unpickled(data: bytes, key_prefix: str | None = None) -> object:
    """The unpickling path's table of a pickle (unpickled in the probe's child when it is probed), or the
    Declined / CkptfsError it ends in."""
    from ckptfs.pickle.unpickler import unpickle

    try:
        obj, _, sent = unpickle(data, limits=ckptfs.Limits(max_unpickle_seconds=20), key_prefix=key_prefix,
                                digest=table.digest)
        if sent is not None:
            return table.decode(sent)
        return table.tabulate(obj)
    except (table.Declined, ckptfs.CkptfsError) as e:
        return e


def _columns(t: object) -> object:
    """A table as plain comparable data; anything else (Declined, an error) as itself."""
    return t.plain() if isinstance(t, table.TensorTable) else t


def test_the_c_scanner_is_built():
    """`make setup` / pip install build it (setup.py); without a C compiler ckptfs still works, slower."""
    assert table._tablescan is not None, "ckptfs.model._tablescan was not built (no C compiler at install?)"


def _writers() -> dict[str, tuple[object, dict[str, object]]]:
    """state_dicts as torch.save writes them: modules' (with _metadata), other pickle protocols, shared and
    viewed storages, every plain leaf, keys of any text."""
    g = torch.Generator().manual_seed(7)
    net = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.BatchNorm2d(3), torch.nn.ReLU(),
                              torch.nn.Flatten(), torch.nn.LSTM(4, 4), torch.nn.LayerNorm(4), torch.nn.Embedding(5, 4))
    w = torch.randn(6, 4, generator=g)
    views = {"w": w, "tied": w, "rows": w[1:3], "t": w.t(), "col": w[:, 1], "x": torch.zeros(3, 1).expand(3, 4),
             "scalar": torch.tensor(2.5), "empty": torch.empty(0, 3), "bf16": w.bfloat16(), "bool": w > 0,
             "i64": torch.arange(7), "u8": torch.arange(3, dtype=torch.uint8), "grad": torch.ones(2, requires_grad=True),
             "c64": torch.randn(2, dtype=torch.complex64, generator=g)}
    leaves = {"w": torch.ones(2), "epoch": 3, "big": 2**40, "neg": -7, "lr": 1e-3, "name": "run", "none": None,
              "flag": False, "ré.ü 中": torch.ones(1), "\udcff\udcfe": torch.zeros(1)}
    return {
        "module": (net.state_dict(), {}),
        "module-protocol-4": (net.state_dict(), {"pickle_protocol": 4}),
        "module-protocol-5": (net.state_dict(), {"pickle_protocol": 5}),
        "views": (views, {}),
        "leaves": (leaves, {}),
        "ordered-leaves": (OrderedDict(leaves), {"pickle_protocol": 4}),
    }


@pytest.mark.parametrize("name", list(_writers()))
def test_scan_reads_torch_s_state_dicts_as_torch_load_does(tmp_path, name, monkeypatch):
    obj, kw = _writers()[name]
    p = tmp_path / "sd.pth"
    torch.save(obj, p, **kw)
    data = _pickle_of(p)
    scanned = table.scan(data)
    assert scanned is not None, "the scan declined a state_dict torch wrote"
    assert _columns(scanned) == _columns(_unpickled(data))
    prefixed = table.scan(data, "shard-1/")
    assert prefixed is not None and _columns(prefixed) == _columns(_unpickled(data, "shard-1/"))
    assert prefixed.st_keys == [f"shard-1/{k}" for k in scanned.st_keys]
    # and what ckptfs serves from it, against torch.load (weights_only=False: its restricted unpickler knows
    # only protocol 2's opcodes, and these files are the test's own)
    ref = torch.load(p, weights_only=False)
    taken: list[object] = []
    scan = table.scan
    monkeypatch.setattr(table, "scan", lambda *a, **k: taken.append(scan(*a, **k)) or taken[-1])
    with ckptfs.open(p) as ck:
        assert taken and taken[0] is not None  # the index came from the scan
        assert list(ck.keys()) == list(ref)
        for k, v in ref.items():
            m = ck.meta(k)
            if not isinstance(v, torch.Tensor):
                assert ck.value(k) == v and type(ck.value(k)) is type(v), k
                continue
            assert (m.shape, m.stride, m.storage_offset, m.dtype, m.requires_grad) == (
                tuple(v.shape), v.stride(), v.storage_offset(), str(v.dtype).removeprefix("torch."), v.requires_grad), k
            assert ck.read(k) == torch_bytes(v), k
        assert ckptfs.load(p)._metadata == getattr(ref, "_metadata", None)


# Mutated pickles: the scan must never fail (no exception, no crash), and whatever it accepts the unpickling path
# accepts too, with the same columns.

def _seed_pickles() -> list[bytes]:
    out = []
    for obj, kw in _writers().values():
        buf = io.BytesIO()
        torch.save(obj, buf, **kw)
        out.append(_pickle_of(buf))
    return out


SEED_PICKLES = _seed_pickles()
#: opcodes a mutation may insert: each is complete, so the pickle stays parsable more often than with random bytes
_SNIPPETS = [b"0", b"1", b"2", b"(", b")", b"N", b"\x88", b"\x89", b"K\x05", b"J\xff\xff\xff\xff", b"\x8a\x09" + b"\x01" * 9,
             b"t", b"\x85", b"\x86", b"]", b"a", b"e", b"}", b"s", b"u", b"d", b"q\x03", b"h\x00", b"h\x03", b"\x94",
             b"R", b"b", b"Q", b"X\x01\x00\x00\x00a", b"\x8c\x01b", b"G" + b"\x3f\xf0" + b"\x00" * 6, b"C\x01z", b"."]
_edit = st.tuples(st.sampled_from(["flip", "set", "insert", "delete", "snippet", "copy"]), st.integers(0, 1 << 30),
                  st.integers(0, 255), st.integers(0, 1 << 30))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, len(SEED_PICKLES) - 1), edits=st.lists(_edit, min_size=1, max_size=6),
       arena=st.sampled_from([1, 3, table.SCAN_ARENA]))
def test_scan_of_mutated_pickles_never_fails_and_agrees_with_unpickling(seed, edits, arena, monkeypatch):
    """(``arena``: the scan's first arena; tiny, its collector runs at nearly every tuple)"""
    monkeypatch.setattr(table, "SCAN_ARENA", arena)
    data = bytearray(SEED_PICKLES[seed])
    for kind, at, byte, other in edits:
        i = at % (len(data) + 1)
        if kind == "flip" and i < len(data):
            data[i] ^= 1 << (byte % 8)
        elif kind == "set" and i < len(data):
            data[i] = byte
        elif kind == "insert":
            data[i:i] = bytes([byte])
        elif kind == "delete":
            del data[i : i + 1 + byte % 8]
        elif kind == "snippet":
            data[i:i] = _SNIPPETS[byte % len(_SNIPPETS)]
        elif kind == "copy" and data:  # a piece of the pickle again elsewhere (opcodes repeated)
            j = other % len(data)
            data[i:i] = data[j : j + 1 + byte]
    scanned = table.scan(bytes(data))
    if scanned is not None:
        assert _columns(scanned) == _columns(_unpickled(bytes(data)))


# Generated state_dict pickles (tests/hostile/craft.py's assembler): every shape the plain form may take and
# the ways out of it. The scan and the unpickling path must agree on each, and where the pickle uses only
# what the scan knows (supported), they must also agree on whether it is plain.

_STORAGES = ["FloatStorage", "HalfStorage", "LongStorage", "BoolStorage", "UntypedStorage", "BFloat16Storage"]


@st.composite
def _state_dict_pickles(draw: st.DrawFn) -> tuple[bytes, bool]:
    from hostile.craft import P, Emit

    supported = True
    proto = draw(st.sampled_from([2, 2, 4]))
    p = P(proto)
    root = draw(st.sampled_from(["dict", "odict", "DICT"]))
    p.ordered_dict() if root == "odict" else p.mark() if root == "DICT" else p.empty_dict()
    if root != "DICT":
        p.put(0)
        p.mark()
    small = st.integers(-3, 40)
    wide = st.one_of(small, st.integers(-(2**63), 2**63 - 1))
    n = draw(st.integers(0, 8))
    for _ in range(n):
        key = draw(st.one_of(st.sampled_from(["a", "b", "a.b", "", "ré"]), st.text(max_size=6), st.integers(0, 3)))
        if not isinstance(key, str):
            p.value(key)
        else:
            p.str(key)
        kind = draw(st.sampled_from(["tensor", "tensor", "tensor", "leaf", "nested", "big"]))
        if kind == "tensor":
            ndim = draw(st.integers(0, 3))
            size = tuple(draw(st.lists(wide, min_size=ndim, max_size=ndim)))
            stride = tuple(draw(st.lists(wide, min_size=ndim, max_size=ndim)))
            if draw(st.integers(0, 9)) == 0:
                stride = stride + (1,)  # ranks differ
            p.tensor(draw(st.sampled_from(["0", "1", "2", "07", "x"])), draw(st.integers(-1, 30)), size, stride,
                     offset=draw(wide), storage=draw(st.sampled_from(_STORAGES)),
                     requires_grad=draw(st.booleans()))
        elif kind == "leaf":
            p.value(draw(st.one_of(st.none(), st.booleans(), wide, st.floats(allow_nan=False), st.text(max_size=5))))
        elif kind == "nested":
            p.value({"x": 1})
        else:
            p.int(2**70)  # an int wider than 64 bits: the scan leaves it to the general path
            supported = False
    if root == "DICT":
        p.dict_op()
    else:
        p.setitems()
    if root == "odict" and draw(st.booleans()):
        state = draw(st.recursive(st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=3)),
                                  lambda inner: st.one_of(st.lists(inner, max_size=3), st.tuples(inner, inner),
                                                          st.dictionaries(st.text(max_size=2), inner, max_size=3)),
                                  max_leaves=8))
        p.value(state).build()
    if draw(st.integers(0, 7)) == 0:  # an object put aside and fetched back from the memo
        p.raw(b"h\x00")
    del Emit
    return bytes(p.stop()), supported


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=_state_dict_pickles(), arena=st.sampled_from([1, 2, table.SCAN_ARENA]))
def test_scan_and_unpickling_agree_on_generated_state_dicts(case, arena, monkeypatch):
    monkeypatch.setattr(table, "SCAN_ARENA", arena)
    data, supported = case
    scanned = table.scan(data)
    ref = _unpickled(data)
    if scanned is not None:
        assert _columns(scanned) == _columns(ref)
    elif supported:
        assert not isinstance(ref, table.TensorTable), "the scan declined a plain state_dict it knows how to read"
