"""A fuzzer: valid checkpoints, mutated (bit flips, overwrites, truncation, splices, zip header fields, pickle
opcodes, legacy streams), must each end in a valid index whose every tensor reads, or a CkptfsError.

Never another exception type, a hang or a crash. Where torch.load(weights_only=True) also loads the mutated
file, every tensor both return (matched by exact key path) must have the same bytes.

    CKPTFS_FUZZ_EXAMPLES=N pytest tests/test_fuzz.py      # N examples in all (default: a CI-sized run)
    make fuzz                                            # 20,000

The campaign tests are ``slow``; ``pytest -m "not slow"`` keeps the seeds and the summary, which then runs
a small campaign of its own.
"""

from __future__ import annotations

import contextlib
import faulthandler
import hashlib
import io
import json
import os
import pickletools
import signal
import struct
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ckptfs
from ckptfs.cli import main as cli_main
from helpers import lookup, torch_bytes, torch_load_byteorder
from hostile.craft import P, Entry, legacy_stream, legacy_tensor, write_zip

TOTAL = int(os.environ.get("CKPTFS_FUZZ_EXAMPLES", "3000"))
PER = max(int(TOTAL / 6.25), 10)  # six mutation families get PER examples each, the CLI one PER / 4
STATS = {"examples": 0, "mutated": 0, "indexed": 0, "refused": 0, "tensors_read": 0, "torch_loaded": 0,
         "torch_compared": 0, "torch_self_disagrees": 0}
FINDINGS: list[str] = []  # non-ckptfs exceptions would fail the test; this collects notable outcomes
WORK = Path(tempfile.mkdtemp(prefix="ckptfs-fuzz-"))
EXAMPLE = WORK / "example.pt"
TIME_LIMIT = 20  # seconds per example before it counts as a hang


# --- seeds ----------------------------------------------------------------------------------------------------


def _torch_seed(obj: object, **kw: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf, **kw)
    return buf.getvalue()


def _seeds() -> dict[str, bytes]:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(4, 6, generator=g)
    sd = {
        "a": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "b": torch.arange(5, dtype=torch.int64),
        "t": base.t(),  # transposed view
        "s": base[1:3, ::2],  # sliced view sharing base's storage
        "h": torch.linspace(-2, 2, 7).half(),
        "bf": torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16),
        "m": torch.tensor([True, False, True]),
        "e": torch.zeros(3, 1).expand(3, 4),
        "p": torch.nn.Parameter(torch.ones(2, 2)),
    }
    train = {"model": {"w": base.clone(), "b": torch.zeros(3)}, "epoch": 3,
             "opt": {"state": {0: {"step": torch.tensor(5.0), "exp_avg": torch.ones(4, 6)}},
                     "param_groups": [{"lr": 0.1, "params": [0]}]}}
    w = np.arange(6, dtype="<f4").tobytes()
    pk = bytes(P().ordered_dict().mark().str("w").tensor("0", 6, (2, 3), (3, 1)).str("v")
               .tensor("0", 6, (3,), (2,), offset=1).setitems().stop())
    deflated = write_zip([Entry(b"archive/data.pkl", pk, method=8), Entry(b"archive/byteorder", b"little"),
                          Entry(b"archive/data/0", w, method=8), Entry(b"archive/version", b"3\n")]).data
    legacy_pk = bytes(legacy_tensor(P().empty_dict().mark().str("w"), "k1", 6, (2, 3), (3, 1))
                      .str("v").value(7).setitems().stop())
    return {
        "state_dict": _torch_seed(sd),
        "training": _torch_seed(train),
        "proto4": _torch_seed({"a": sd["a"], "t": sd["t"]}, pickle_protocol=4),
        "deflated": deflated,
        "legacy": _torch_seed({"a": sd["a"], "s": sd["s"], "n": 3}, _use_new_zipfile_serialization=False),
        "legacy_crafted": legacy_stream(legacy_pk, [("k1", 6, w)]),
    }


SEEDS = _seeds()
SEED_BYTES = set(SEEDS.values())
ZIP_SEEDS = [k for k, v in SEEDS.items() if v[:4] == b"PK\x03\x04"]
NAMES = sorted(SEEDS)


# --- running one example ------------------------------------------------------------------------------------


class Hang(Exception):
    pass


def _alarm(_sig: int, _frame: object) -> None:
    raise Hang(f"one example ran for more than {TIME_LIMIT} s")


@contextlib.contextmanager
def time_limit():
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(TIME_LIMIT)
    faulthandler.dump_traceback_later(TIME_LIMIT + 30, exit=True)  # a hang in C: dump and stop the run
    try:
        yield
    finally:
        signal.alarm(0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, old)


def check(data: bytes, compare_torch: bool = True, cli: bool = False) -> None:
    """The required outcome for one mutated file (any other exception fails the test)."""
    STATS["examples"] += 1
    STATS["mutated"] += data not in SEED_BYTES
    EXAMPLE.write_bytes(data)
    with time_limit():
        try:
            ck = ckptfs.open(EXAMPLE)
        except ckptfs.CkptfsError as e:
            STATS["refused"] += 1
            assert "\n" not in str(e) and str(EXAMPLE) in str(e)
            return
        mine: dict[str, tuple[str, str]] = {}
        with ck:
            STATS["indexed"] += 1
            json.dumps(ck.info(), ensure_ascii=False)
            index = ck.index
            for i in index.order():
                if index.kinds[i] == "link":
                    continue
                key = index.keys[i]
                json.dumps(ck.meta(key).to_dict(), ensure_ascii=False)
                if index.kinds[i] != "tensor":
                    continue
                try:
                    r = ck.reader(key)
                    if r.size > (16 << 20):
                        for off in (0, r.size // 2, r.size - 1):
                            ck.read(key, off, 4096)
                        continue
                    raw = ck.read(key)
                    assert len(raw) == r.size
                    try:
                        arr = ck.numpy(key)
                        assert arr.tobytes() == raw
                    except ckptfs.UnsupportedError:
                        pass
                    STATS["tensors_read"] += 1
                    m = ck.meta(key)
                    mine[repr(index.path(i))] = (hashlib.sha256(raw).hexdigest(), m.byteorder)
                except ckptfs.CkptfsError as e:
                    assert "\n" not in str(e)
        if cli:
            for argv in (["ls", str(EXAMPLE)], ["info", str(EXAMPLE)]):
                out, err = io.StringIO(), io.StringIO()
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    code = cli_main(argv)
                assert code in (0, 1) and "internal error" not in err.getvalue(), err.getvalue()
        if compare_torch and mine:
            _compare_with_torch(mine)


def _compare_with_torch(mine: dict[str, tuple[str, str | None]]) -> None:
    """Every tensor both return has the same bytes, as the file stores them: torch's in the byte order torch
    read the file in (found by torch, not taken from ckptfs), which is the order ckptfs reports."""
    try:
        obj = torch.load(EXAMPLE, weights_only=True, map_location="cpu")
    except Exception:  # noqa: BLE001 - torch refusing a mutated file is fine
        return
    STATS["torch_loaded"] += 1
    order = torch_load_byteorder(EXAMPLE)
    mapped: list = []  # torch.load(mmap=True), loaded at the first disagreement
    stack: list = [((), obj)]
    seen = 0
    while stack and seen < 2000:
        path, v = stack.pop()
        seen += 1
        if isinstance(v, torch.Tensor):
            got = mine.get(repr(path))
            if got is None or v.is_sparse or v.is_quantized or v.is_nested:
                continue
            try:
                theirs = hashlib.sha256(torch_bytes(v, order)).hexdigest()
            except Exception:  # noqa: BLE001 - e.g. a dtype numpy cannot view
                continue
            STATS["torch_compared"] += 1
            if theirs != got[0] and _torch_mmap_agrees(mapped, path, order, got[0]):
                continue
            assert theirs == got[0], f"{path}: bytes differ from torch's"
            assert got[1] in (None, order), f"{path}: byteorder {got[1]}, torch read the file as {order}"
        elif isinstance(v, dict):
            stack.extend((path + (k,), x) for k, x in v.items())
        elif isinstance(v, (list, tuple)):
            stack.extend((path + (i,), x) for i, x in enumerate(v))


def _torch_mmap_agrees(mapped: list, path: tuple, order: str, digest: str) -> bool:
    """Whether torch's other loader (mmap=True) returns ckptfs's bytes where the default one did not.

    torch's two loaders can disagree with each other on a mutated file: a storage record whose central-
    directory entry carries the MS-DOS directory attribute (0x10) is read by torch.load() as uninitialised
    memory (its zip reader treats the entry as a directory), by torch.load(mmap=True) and zipfile as the
    stored bytes, which is what ckptfs serves (test_api.test_directory_attribute_on_a_storage_record). Only
    then is the difference torch's, and recorded; the bytes must still be exactly torch's mmap ones."""
    if not mapped:
        try:
            mapped.append(torch.load(EXAMPLE, weights_only=True, map_location="cpu", mmap=True))
        except Exception:  # noqa: BLE001
            mapped.append(None)
    if mapped[0] is None:
        return False
    try:
        v = lookup(mapped[0], path)
        if hashlib.sha256(torch_bytes(v, order)).hexdigest() != digest:
            return False
    except Exception:  # noqa: BLE001 - not there, or not a tensor numpy can view
        return False
    STATS["torch_self_disagrees"] += 1
    FINDINGS.append(f"{path}: torch.load and torch.load(mmap=True) disagree; ckptfs matches the mmap load")
    return True


# --- mutations ---------------------------------------------------------------------------------------------------

INTERESTING = [0, 1, 2, 3, 7, 8, 0x7F, 0x80, 0xFF, 0x100, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]


def zip_fields(blob: bytes) -> list[tuple[int, int]]:
    """(offset, width) of every header field of a zip a mutation may set: local headers, directory entries,
    end records."""
    out: list[tuple[int, int]] = []
    eocd = blob.rfind(b"PK\x05\x06")
    if eocd < 0:
        return out
    out += [(eocd + o, w) for o, w in ((8, 2), (10, 2), (12, 4), (16, 4), (20, 2))]
    loc = blob.rfind(b"PK\x06\x07", 0, eocd)
    if loc >= 0:
        out += [(loc + 8, 8)]
        e64 = struct.unpack_from("<Q", blob, loc + 8)[0]
        if e64 < len(blob):
            out += [(e64 + o, 8) for o in (24, 32, 40, 48)]
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        infos = z.infolist()
    cd_start = struct.unpack_from("<L", blob, eocd + 16)[0]
    if cd_start == 0xFFFFFFFF and loc >= 0:
        e64 = struct.unpack_from("<Q", blob, loc + 8)[0]
        cd_start = struct.unpack_from("<Q", blob, e64 + 48)[0]
    pos = cd_start
    for info in infos:
        if blob[pos:pos + 4] != b"PK\x01\x02":
            break
        out += [(pos + o, w) for o, w in ((6, 2), (8, 2), (10, 2), (16, 4), (20, 4), (24, 4), (28, 2), (30, 2),
                                          (34, 2), (42, 4))]
        nl, xl, cl = struct.unpack_from("<3H", blob, pos + 28)
        h = info.header_offset
        out += [(h + o, w) for o, w in ((6, 2), (8, 2), (14, 4), (18, 4), (22, 4), (26, 2), (28, 2))]
        pos += 46 + nl + xl + cl
    return out


def rezip(seed: bytes, pickle_bytes: bytes) -> bytes:
    """The seed archive with data.pkl replaced, laid out again (sizes and CRCs right)."""
    with zipfile.ZipFile(io.BytesIO(seed)) as z:
        entries = [Entry(i.filename.encode(), pickle_bytes if i.filename.endswith("/data.pkl") else z.read(i),
                         method=i.compress_type) for i in z.infolist()]
    return write_zip(entries).data


def pickle_of(seed_name: str) -> tuple[bytes, object]:
    """The main pickle of a seed and how to put a new one back."""
    seed = SEEDS[seed_name]
    if seed[:4] == b"PK\x03\x04":
        with zipfile.ZipFile(io.BytesIO(seed)) as z:
            name = next(n for n in z.namelist() if n.endswith("/data.pkl"))
            return z.read(name), lambda pk: rezip(seed, pk)
    # legacy: three header pickles, the object pickle, then the rest
    f = io.BytesIO(seed)
    import pickle

    for _ in range(3):
        pickle.load(f)
    start = f.tell()
    ops = list(pickletools.genops(seed[start:]))
    end = start + ops[-1][2] + 1
    return seed[start:end], lambda pk: seed[:start] + pk + seed[end:]


STRINGS = ["", "0", "1", "2", "../data.pkl", "0/", "x" * 300, "\x00", "cpu", "storage", "data.pkl", "a.b", "\udcff",
           "cuda:0", "version"]
GLOBALS = [("os", "system"), ("torch", "FloatStorage"), ("torch", "IntStorage"), ("torch", "HalfStorage"),
           ("torch", "BoolStorage"), ("torch", "DoubleStorage"), ("torch.storage", "UntypedStorage"),
           ("torch._utils", "_rebuild_tensor_v3"), ("torch._utils", "_rebuild_parameter"),
           ("torch._utils", "_rebuild_meta_tensor_no_storage"), ("collections", "OrderedDict"), ("builtins", "eval"),
           ("numpy.core.multiarray", "_reconstruct"), ("torch", "float16"), ("torch", "Size"),
           ("torch._tensor", "_rebuild_from_type_v2"), ("_codecs", "encode"), ("builtins", "set")]
INSERTS = [b"(", b"0", b"2", b"N", b"}", b"]", b")", b"t", b"\x85", b"R", b"b", b"s", b"u", b"a", b"e", b"Q", b".",
           b"h\x00", b"h\x05", b"q\x00", b"\x88", b"K\x00", b"J\xff\xff\xff\xff", b"\x81", b"\x93", b"\x94", b"1",
           b"ctorch\nFloatStorage\n", b"cos\nsystem\n", b"\x82\x01", b"X\xff\xff\xff\x7f"]


@st.composite
def pickle_edit(draw: st.DrawFn) -> bytes:
    seed_name = draw(st.sampled_from(NAMES))
    pk, put_back = pickle_of(seed_name)
    ops = list(pickletools.genops(pk))
    bounds = [pos for _, _, pos in ops] + [len(pk)]
    n_edits = draw(st.integers(1, 3))
    for _ in range(n_edits):
        ops = list(pickletools.genops(pk)) if _ else ops
        bounds = [pos for _, _, pos in ops] + [len(pk)]
        i = draw(st.integers(0, len(ops) - 1))
        op, arg, pos = ops[i]
        end = bounds[i + 1]
        kind = draw(st.sampled_from(["delete", "dup", "swap", "insert", "arg", "arg", "arg"]))
        if kind == "delete":
            pk = pk[:pos] + pk[end:]
        elif kind == "dup":
            pk = pk[:end] + pk[pos:end] + pk[end:]
        elif kind == "swap" and i + 1 < len(ops):
            end2 = bounds[i + 2]
            pk = pk[:pos] + pk[end:end2] + pk[pos:end] + pk[end2:]
        elif kind == "insert":
            pk = pk[:pos] + draw(st.sampled_from(INSERTS)) + pk[pos:]
        else:
            new = _new_arg(draw, op.name, arg)
            if new is not None:
                pk = pk[:pos] + new + pk[end:]
        try:
            list(pickletools.genops(pk))
        except Exception:  # noqa: BLE001 - no longer parseable: that is a mutation too; stop editing
            break
    return put_back(pk)


def _new_arg(draw: st.DrawFn, name: str, arg: object) -> bytes | None:
    if name in ("BININT1", "BININT2", "BININT", "LONG1", "LONG4", "INT", "LONG"):
        v = draw(st.one_of(st.sampled_from([0, 1, -1, 2, 5, 6, 7, 24, 255, 256, 2**31 - 1, 2**31, 2**32, 2**62,
                                            2**63, -(2**31), 10**30]),
                           st.integers(-(2**70), 2**70)))
        return bytes(P(None).int(v))
    if name in ("BINUNICODE", "SHORT_BINUNICODE", "UNICODE", "BINUNICODE8"):
        return bytes(P(None).str(draw(st.one_of(st.sampled_from(STRINGS), st.text(max_size=20)))))
    if name in ("GLOBAL", "STACK_GLOBAL"):
        mod, fn = draw(st.sampled_from(GLOBALS))
        return bytes(P(None).global_(mod, fn))
    if name in ("BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET", "PUT", "GET"):
        idx = draw(st.sampled_from([0, 1, 2, 3, 5, 8, 13, 200, 255, 256, 1 << 20]))
        return bytes(P(None).put(idx) if "PUT" in name else P(None).get(idx))
    if name in ("NEWFALSE", "NEWTRUE", "NONE"):
        return draw(st.sampled_from([b"\x88", b"\x89", b"N", b"K\x02"]))
    return None


@st.composite
def bit_flips(draw: st.DrawFn) -> bytes:
    data = bytearray(SEEDS[draw(st.sampled_from(NAMES))])
    for _ in range(draw(st.integers(1, 8))):
        i = draw(st.integers(0, len(data) - 1))
        data[i] ^= 1 << draw(st.integers(0, 7))
    return bytes(data)


@st.composite
def overwrites(draw: st.DrawFn) -> bytes:
    data = bytearray(SEEDS[draw(st.sampled_from(NAMES))])
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(data) - 1))
        chunk = draw(st.binary(min_size=1, max_size=16))
        data[i:i + len(chunk)] = chunk
    return bytes(data)


@st.composite
def truncations(draw: st.DrawFn) -> bytes:
    data = SEEDS[draw(st.sampled_from(NAMES))]
    cut = draw(st.integers(0, len(data) - 1))
    tail = draw(st.sampled_from([b"", b"", data[-22:], data[-100:]]))  # sometimes keep a plausible end record
    return data[:cut] + tail


@st.composite
def splices(draw: st.DrawFn) -> bytes:
    a = SEEDS[draw(st.sampled_from(NAMES))]
    b = SEEDS[draw(st.sampled_from(NAMES))]
    i = draw(st.integers(0, len(a)))
    j = draw(st.integers(0, len(b)))
    k = draw(st.integers(j, min(len(b), j + 400)))
    replace = draw(st.booleans())
    return a[:i] + b[j:k] + (a[i + (k - j):] if replace else a[i:])


@st.composite
def zip_field_edits(draw: st.DrawFn) -> bytes:
    seed = SEEDS[draw(st.sampled_from(ZIP_SEEDS))]
    fields = zip_fields(seed)
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 3))):
        off, width = draw(st.sampled_from(fields))
        old = int.from_bytes(data[off:off + width], "little")
        mx = (1 << (8 * width)) - 1
        v = draw(st.one_of(st.sampled_from([v for v in INTERESTING if v <= mx]),
                           st.sampled_from([max(old - 1, 0), min(old + 1, mx), min(old * 2, mx), old ^ 0x8]),
                           st.integers(0, mx)))
        data[off:off + width] = v.to_bytes(width, "little")
    return bytes(data)


# --- the tests ----------------------------------------------------------------------------------------------------

SETTINGS = dict(max_examples=PER, deadline=None, derandomize=False, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])


def test_seeds_are_valid() -> None:
    """Every seed indexes, reads, and matches torch: the mutations start from correct files."""
    for name, data in SEEDS.items():
        before = STATS["torch_compared"]
        check(data)
        if name != "proto4":  # torch's weights_only unpickler has no FRAME opcode: it refuses protocol 4 files
            assert STATS["torch_compared"] > before, f"seed {name}: nothing compared with torch"


@pytest.mark.slow
@settings(**SETTINGS)
@given(pickle_edit())
def test_fuzz_pickle_opcodes(data: bytes) -> None:
    check(data)


@pytest.mark.slow
@settings(**SETTINGS)
@given(bit_flips())
def test_fuzz_bit_flips(data: bytes) -> None:
    check(data)


@pytest.mark.slow
@settings(**SETTINGS)
@given(overwrites())
def test_fuzz_overwrites(data: bytes) -> None:
    check(data, cli=True)


@pytest.mark.slow
@settings(**SETTINGS)
@given(truncations())
def test_fuzz_truncation(data: bytes) -> None:
    check(data, compare_torch=False)


@pytest.mark.slow
@settings(**SETTINGS)
@given(splices())
def test_fuzz_splices(data: bytes) -> None:
    check(data)


@pytest.mark.slow
@settings(**SETTINGS)
@given(zip_field_edits())
def test_fuzz_zip_fields(data: bytes) -> None:
    check(data, cli=True)


@pytest.mark.slow
@settings(**{**SETTINGS, "max_examples": max(PER // 4, 10)})
@given(st.sampled_from(NAMES), st.data())
def test_fuzz_cli(seed_name: str, data: st.DataObject) -> None:
    """The CLI on mutated files: exit 0 or 1, never an internal error."""
    blob = data.draw(st.one_of(bit_flips(), pickle_edit(), zip_field_edits()))
    check(blob, compare_torch=False, cli=True)


#: the examples per mutation family of the summary's own campaign, when the campaign tests did not run
#: (e.g. `pytest -m "not slow"`, or the summary selected alone)
MINI = 25

FAMILIES = [(pickle_edit, {}), (bit_flips, {}), (overwrites, {"cli": True}), (truncations, {"compare_torch": False}),
            (splices, {}), (zip_field_edits, {"cli": True})]


def _mini_run(strategy: object, kwargs: dict) -> None:
    @settings(**{**SETTINGS, "max_examples": MINI, "derandomize": True})
    @given(strategy())
    def run(data: bytes) -> None:
        check(data, **kwargs)

    run()


def _mini_campaign() -> None:
    """A small, derandomized run of every mutation family through check()."""
    for strategy, kwargs in FAMILIES:
        _mini_run(strategy, kwargs)


def test_fuzz_summary() -> None:
    """Runs last: the campaign did what it says (and prints its figures). When the campaign tests did not
    run (deselected), it runs a small campaign of its own first: these assertions always see real data."""
    if STATS["examples"] < 6 * PER:
        before = STATS["examples"]
        _mini_campaign()
        assert STATS["examples"] - before >= 6 * MINI, "the mini campaign ran fewer examples than asked"
    print("fuzz:", json.dumps(STATS))
    if FINDINGS:
        print("findings:", *FINDINGS[:20], sep="\n  ")
    report = os.environ.get("CKPTFS_FUZZ_REPORT")
    if report:
        Path(report).write_text(json.dumps(STATS))
    # the mutations changed the files, and the outcomes are varied: some files index and read, some are
    # refused, and some torch also loads and was compared with, tensor by tensor
    assert STATS["mutated"] >= STATS["examples"] // 2, STATS
    assert STATS["indexed"] > 0 and STATS["refused"] > 0, STATS
    assert STATS["indexed"] + STATS["refused"] == STATS["examples"], STATS  # every example reached an outcome
    assert STATS["tensors_read"] > 0 and STATS["torch_loaded"] > 0 and STATS["torch_compared"] > 0, STATS
