"""``ckptfs stats`` / ``Checkpoint.stats`` compared with torch: every dtype (NaN, +/-Inf, -0.0, bf16, float8,
complex, bool, ints, quantized), views, tied tensors, big-endian files, tensors many chunks long; histograms
against numpy.histogram of torch's values; the command's table, JSON, filters and errors."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from craft import to_big_endian
from helpers import ALL_DTYPES, expected_stats, make, torch_values, views

import ckptfs

CKPTFS = [sys.executable, "-m", "ckptfs.cli"]
FLOATS = [d for d in ALL_DTYPES if getattr(torch, d).is_floating_point]
COMPLEX = [d for d in ALL_DTYPES if getattr(torch, d).is_complex]


def with_specials(name: str) -> torch.Tensor:
    """A 7x13 tensor of the dtype with NaN, +Inf, -Inf, -0.0 and 0.0 where the dtype can hold them (whatever
    torch's conversion makes of them is the truth: the expected values come from the saved tensor)."""
    dt = getattr(torch, name)
    t = make(name, (7, 13))
    if dt.is_floating_point:
        base = t.to(torch.float32)
        for (i, j), v in {(0, 0): math.nan, (1, 3): math.inf, (2, 5): -math.inf, (3, 7): -0.0, (4, 9): 0.0,
                          (6, 12): math.nan}.items():
            base[i, j] = v
        t = base.to(dt)
    elif dt.is_complex:
        base = t.to(torch.complex64)
        base[0, 0] = complex(math.nan, 1.0)
        base[1, 1] = complex(math.inf, 0.0)
        base[2, 2] = complex(0.0, -math.inf)
        base[3, 3] = complex(-0.0, 0.0)
        base[4, 4] = complex(math.nan, math.inf)
        t = base.to(dt)
    return t


def assert_stats(got: ckptfs.api.stats.TensorStats, t: torch.Tensor, what: str = "") -> None:
    want = expected_stats(t)
    assert got.error is None and got.note is None, (what, got)
    for name in ("numel", "nan", "posinf", "neginf", "inf", "zeros", "finite", "min", "max", "abs_max"):
        g, w = getattr(got, name), want[name]
        assert type(g) is type(w), (what, name, g, w)
        if name == "abs_max" and t.is_complex() and w is not None and math.isfinite(w):
            # |a+bi| is a hypot: torch's and numpy's may differ in the last bit
            assert math.isclose(g, w, rel_tol=4 * 2.0**-52, abs_tol=0.0), (what, name, g, w)
        else:
            assert g == w, (what, name, g, w)
    scale = want["abs_max"] if isinstance(want["abs_max"], (int, float)) and math.isfinite(want["abs_max"]) else 1.0
    for name in ("mean", "std"):
        g, w = getattr(got, name), want[name]
        if w is None:
            assert g is None, (what, name, g)
        else:
            assert abs(g - w) <= 1e-12 * max(abs(w), 1.0, float(scale)), (what, name, g, w)


@pytest.fixture(scope="module")
def dtypes_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    sd = {name: with_specials(name) for name in ALL_DTYPES}
    for q in (torch.qint8, torch.quint8, torch.qint32):
        sd[f"q_{q}"] = torch.quantize_per_tensor(torch.randn(6, 5) * 3, 0.05, 7 if q != torch.qint8 else -3, q)
    c = torch.randn(5, 4, dtype=torch.complex64)
    sd["conj_view"] = c.conj()
    sd["neg_view"] = torch.randn(9)._neg_view()
    sd["empty"] = torch.zeros(0, 3)
    sd["scalar"] = torch.tensor(-2.5)
    sd["all_nan"] = torch.full((4,), math.nan)
    sd["one_value"] = torch.tensor([3.0])
    sd["only_inf"] = torch.tensor([math.inf, -math.inf, math.inf])
    sd["int64_extremes"] = torch.tensor([-(2**63), 2**63 - 1, 0, 5])
    p = tmp_path_factory.mktemp("stats") / "dtypes.pth"
    torch.save(sd, p)
    return p, torch.load(p)


@pytest.mark.parametrize("chunk", [64, None], ids=["8-element-chunks", "default-chunks"])
def test_every_dtype_against_torch(dtypes_file, chunk):
    p, ref = dtypes_file
    with ckptfs.open(p) as ckpt:
        assert set(ckpt.tensor_keys()) == set(ref)
        for key, t in ref.items():
            assert_stats(ckpt.stats(key, chunk_bytes=chunk), t, key)


def test_specials_are_counted(dtypes_file):
    """The special values really are in the file (the comparison above is not vacuous)."""
    p, ref = dtypes_file
    with ckptfs.open(p) as ckpt:
        s = ckpt.stats("float32")
        assert (s.nan, s.posinf, s.neginf, s.min, s.max) == (2, 1, 1, -math.inf, math.inf)
        assert s.zeros == 2 and s.finite == 7 * 13 - 4
        assert ckpt.stats("complex64").nan == 2 and ckpt.stats("complex64").inf == 3
        assert ckpt.stats("bfloat16").posinf == 1
        e = ckpt.stats("empty")
        assert (e.numel, e.min, e.mean, e.std, e.finite) == (0, None, None, None, 0)
        assert ckpt.stats("int64_extremes").min == -(2**63) and ckpt.stats("int64_extremes").max == 2**63 - 1
        q = ckpt.stats("q_torch.qint8")
        assert q.kind == "float" and q.min == float(ref["q_torch.qint8"].dequantize().min())


def test_views_and_tied_tensors(tmp_path):
    base = torch.randn(64, 33)
    sd = dict(views())
    sd["tied_a"] = base
    sd["tied_b"] = base  # the same tensor twice
    sd["row_of_tied"] = base[5]  # a view into the same storage
    sd["t_of_tied"] = base.t()
    p = tmp_path / "views.pth"
    torch.save(sd, p)
    ref = torch.load(p)
    with ckptfs.open(p) as ckpt:
        assert not ckpt.meta("transposed").contiguous  # really strided
        for key, t in ref.items():
            for chunk in (8 * 3, None):
                assert_stats(ckpt.stats(key, chunk_bytes=chunk), t, f"{key} chunk={chunk}")


def test_tensor_many_chunks_long(tmp_path):
    """100,003 values read 1,000 at a time (101 chunks): NaNs and Infs in several chunks, the extremes in the
    last, partial one, and a mean far from zero (a naive one-pass variance would lose digits)."""
    g = torch.Generator().manual_seed(3)
    t = torch.randn(100_003, generator=g, dtype=torch.float64) * 1e-3 + 1e6
    t[[17, 40_000, 99_999]] = math.nan
    t[[5_000, 70_001]] = math.inf
    t[100_002] = -1e9
    t[100_001] = 2e9
    p = tmp_path / "long.pth"
    torch.save({"w": t, "w32": t.to(torch.float32)[:100_002].reshape(2, -1)[:, ::3]}, p)
    ref = torch.load(p)
    with ckptfs.open(p) as ckpt:
        for key in ref:
            assert_stats(ckpt.stats(key, chunk_bytes=8 * 1000), ref[key], key)
            assert_stats(ckpt.stats(key), ref[key], key)


def test_big_endian_file(tmp_path):
    sd = {"f32": with_specials("float32"), "bf16": with_specials("bfloat16"), "c64": with_specials("complex64"),
          "i32": make("int32"), "f64": make("float64"), "u16": make("uint16")}
    little = tmp_path / "little.pth"
    torch.save(sd, little)
    big = tmp_path / "big.pth"
    itemsizes = {}
    import zipfile

    with zipfile.ZipFile(little) as z:  # storage key -> element size, as torch wrote them (in key order)
        keys = sorted(int(n.rsplit("/", 1)[1]) for n in z.namelist() if "/data/" in n)
    for k, t in zip(keys, sd.values(), strict=True):
        itemsizes[str(k)] = t.element_size() // (2 if t.is_complex() else 1)
    to_big_endian(little, big, itemsizes)
    ref = torch.load(little)  # the same values (torch.load of the big file would swap uint16 wrongly: not ours)
    with ckptfs.open(big) as ckpt:
        assert ckpt.byteorder == "big"
        for key, t in ref.items():
            assert_stats(ckpt.stats(key, chunk_bytes=16), t, key)


def test_histogram_against_numpy_of_torch_values(dtypes_file):
    p, ref = dtypes_file
    with ckptfs.open(p) as ckpt:
        for key in ("float32", "bfloat16", "int16", "float8_e4m3fn", "bool", "scalar"):
            x = torch_values(ref[key]).reshape(-1)
            fin = x[torch.isfinite(x)].numpy()
            counts, edges = np.histogram(fin, bins=17)
            h = ckpt.histogram(key, bins=17)
            assert h.counts == counts.tolist(), key
            assert np.allclose(h.edges, edges, rtol=0, atol=0), key
            assert h.nan == int(torch.isnan(x).sum()) and h.inf == int(torch.isinf(x).sum())
        h = ckpt.histogram("float32", bins=4, value_range=(-1.0, 1.0))
        x = torch_values(ref["float32"]).reshape(-1)
        assert h.counts == np.histogram(x[torch.isfinite(x)].numpy(), bins=4, range=(-1, 1))[0].tolist()
        with pytest.raises(ckptfs.UnsupportedError, match="complex"):
            ckpt.histogram("complex64")


def test_packed_dtypes_have_a_note_not_numbers(tmp_path):
    t = torch.randint(0, 255, (4, 3), dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    p = tmp_path / "packed.pth"
    torch.save({"fp4": t, "ok": torch.ones(2)}, p)
    with ckptfs.open(p) as ckpt:
        s = ckpt.stats("fp4")
        assert s.kind is None and s.min is None and "float4_e2m1fn_x2" in s.note and s.error is None


# --- the command ------------------------------------------------------------------------------------------------


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CKPTFS, *args], capture_output=True, text=True, timeout=120)


def test_json_lines_match_torch(dtypes_file):
    p, ref = dtypes_file
    r = run("stats", "--json", str(p), "float*", "bool", "complex64", "--chunk-size", "256")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert {row["key"] for row in rows} == {k for k in ref if k.startswith("float") or k in ("bool", "complex64")}
    for row in rows:
        want = expected_stats(ref[row["key"]])
        for name in ("nan", "posinf", "neginf", "zeros", "finite", "numel"):
            assert row[name] == want[name], (row["key"], name)
        for name in ("min", "max", "abs_max"):
            w = want[name]
            assert row[name] == (repr(w) if isinstance(w, float) and not math.isfinite(w) else w), (row["key"], name)
        if row["key"] == "complex64":
            assert row["mean"] == pytest.approx([want["mean"].real, want["mean"].imag], rel=1e-12)
        elif want["mean"] is not None:
            assert row["mean"] == pytest.approx(want["mean"], rel=1e-12, abs=1e-12)
    assert "with NaN" in r.stderr


def test_table_nonfinite_filter_and_summary(dtypes_file):
    p, ref = dtypes_file
    r = run("stats", str(p), "--nonfinite")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["KEY", "DTYPE", "SHAPE", "MIN", "MAX", "MEAN", "STD", "ABSMAX", "ZEROS", "NAN", "INF"]
    keys = {ln.split()[0] for ln in lines[1:]}
    want = {k for k, t in ref.items() if (lambda s: s["nan"] + s["inf"])(expected_stats(t))}
    assert keys == want and "int8" not in keys and "float32" in keys
    cells = re.split(r"\s{2,}", next(ln for ln in lines if ln.startswith("float32 ")).strip())
    assert cells[:6] == ["float32", "float32", "[7, 13]", "-inf", "inf",
                         format(expected_stats(ref["float32"])["mean"], ".6g")]
    assert cells[-3:] == ["2", "2", "+1 -1"]  # zeros, NaN, infinities
    assert f"{len(want)} tensors with NaN or Inf" in r.stderr


def test_hist_text_png_and_errors(dtypes_file, tmp_path):
    p, ref = dtypes_file
    r = run("stats", str(p), "--hist", "float64", "--bins", "5")
    assert r.returncode == 0, r.stderr
    x = torch_values(ref["float64"]).reshape(-1)
    counts = np.histogram(x[torch.isfinite(x)].numpy(), bins=5)[0]
    body = r.stdout.splitlines()[1:]
    assert [int(ln.split()[2].replace(",", "")) for ln in body] == counts.tolist()
    assert "2 NaN" in r.stdout.splitlines()[0] and "2 infinite" in r.stdout.splitlines()[0]
    png = tmp_path / "h.png"
    r = run("stats", str(p), "--hist", "float32", "--png", str(png), "--log")
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 2000
    for args, msg in ((("--hist", "nope"), "no key 'nope'"), (("--png", str(png)), "--png draws the histogram"),
                      (("zzz*",), "no tensor matches zzz*"), (("--hist", "complex64"), "complex")):
        r = run("stats", str(p), *args)
        assert r.returncode == 2 and r.stdout == "", (args, r.stdout)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ckptfs: ") and msg in lines[0], (args, r.stderr)


def test_a_broken_tensor_is_an_error_row_and_the_rest_is_computed(tmp_path):
    """A storage record whose size disagrees with the pickle: that tensor's row says why, the others have their
    numbers, and the exit status is 2."""
    import zipfile

    good = torch.arange(10.0)
    p = tmp_path / "ok.pth"
    torch.save({"good": good, "bad": torch.ones(4)}, p)
    q = tmp_path / "bad.pth"
    with zipfile.ZipFile(p) as zin, zipfile.ZipFile(q, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith("data/1"):
                data = data[:8]
            zout.writestr(info, data)
    r = run("stats", str(q))
    assert r.returncode == 2, r.stderr
    rows = {ln.split()[0]: ln for ln in r.stdout.splitlines()[1:]}
    assert rows["good"].split()[3:5] == ["0", "9"]
    assert "error:" in rows["bad"] and "could not be read" in r.stderr


@pytest.mark.parametrize("args, msg", [
    (("--range", "1", "0"), "--range 1 0: LO must not be greater than HI"),
    (("--range", "nan", "1"), "--range nan 1: LO and HI must be finite numbers"),
    (("--range", "0", "inf"), "--range 0 inf: LO and HI must be finite numbers"),
    (("--bins", "0"), "--bins 0: a histogram needs at least 1 bin"),
], ids=["reversed", "nan", "inf", "no-bins"])
def test_a_bad_histogram_range_or_bin_count_is_one_line(dtypes_file, args, msg):
    p, _ = dtypes_file
    r = run("stats", str(p), "--hist", "float32", *args)
    assert (r.returncode, r.stdout) == (2, ""), r.stdout
    assert r.stderr.strip() == f"ckptfs: {msg}", r.stderr
    r = run("stats", str(p), *args)  # without --hist there is no histogram to shape
    assert r.returncode == 2 and r.stderr.strip() == "ckptfs: --bins and --range shape the histogram of --hist KEY: " \
                                                     "give the key", r.stderr


def test_a_range_of_one_value_is_numpys(dtypes_file):
    p, ref = dtypes_file
    r = run("stats", str(p), "--hist", "float32", "--range", "1", "1", "--bins", "2", "--json")
    x = torch_values(ref["float32"]).reshape(-1)
    counts, edges = np.histogram(x[torch.isfinite(x)].numpy(), bins=2, range=(1, 1))
    got = json.loads(r.stdout)
    assert r.returncode == 0 and got["counts"] == counts.tolist() and got["edges"] == edges.tolist()


def test_a_file_of_a_directory_left_out_is_an_error(tmp_path):
    """A member of a directory of checkpoints that cannot be opened has no statistics: one line naming it, exit
    status 2; the other members' tensors are still there."""
    g = torch.Generator().manual_seed(4)
    ref = {f"epoch_{i}": {"w": torch.randn(5, 3, generator=g), "epoch": i} for i in (1, 2)}
    for name, sd in ref.items():
        torch.save(sd, tmp_path / f"{name}.pt")
    (tmp_path / "epoch_3.pt").write_bytes(b"PK\x03\x04 not a checkpoint after all")
    for json_flag in ((), ("--json",)):
        r = run("stats", str(tmp_path), *json_flag)
        assert r.returncode == 2, r.stdout + r.stderr
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("ckptfs: ")]
        assert len(errors) == 1 and errors[0].startswith("ckptfs: left out epoch_3.pt (cannot be opened"), r.stderr
        assert "epoch_1.w" in r.stdout and "epoch_2.w" in r.stdout
    with ckptfs.open(tmp_path) as ckpt:
        for name, sd in ref.items():
            assert_stats(ckpt.stats(f"{name}.w"), sd["w"], name)
    r = run("stats", str(tmp_path), "--hist", "epoch_3.w")
    assert r.returncode == 2 and "left out, cannot be opened: epoch_3.pt" in r.stderr


def check_json_rows(stdout: str, ref: dict[str, torch.Tensor]) -> None:
    rows = {row["key"]: row for row in map(json.loads, stdout.splitlines())}
    assert rows.keys() == ref.keys()
    for key, t in ref.items():
        want = expected_stats(t)
        row = rows[key]
        for name in ("numel", "nan", "posinf", "neginf", "inf", "zeros", "finite", "min", "max", "abs_max"):
            w = want[name]  # JSON: non-finite numbers as strings
            if name == "abs_max" and t.is_complex() and w is not None and math.isfinite(w):  # hypot: see above
                assert math.isclose(row[name], w, rel_tol=4 * 2.0**-52, abs_tol=0.0), (key, name)
                continue
            assert row[name] == (repr(w) if isinstance(w, float) and not math.isfinite(w) else w), (key, name)
        for name in ("mean", "std"):
            if want[name] is None:
                assert row[name] is None, (key, name)
            else:
                assert row[name] == pytest.approx(want[name], rel=1e-12, abs=1e-15), (key, name)


def test_a_sharded_hf_directory(hf_sharded):
    """Both kinds of shards (safetensors, .bin) against torch's values of the shards."""
    from safetensors.torch import load_file

    for kind, pattern, load in (("safetensors", "*.safetensors", load_file), ("bin", "*.bin", torch.load)):
        d = hf_sharded[kind]
        ref: dict[str, torch.Tensor] = {}
        for shard in sorted(d.glob(pattern)):
            ref |= load(shard)
        assert len(ref) > 10
        r = run("stats", "--json", str(d), "--chunk-size", "64")
        assert r.returncode == 0, r.stderr
        check_json_rows(r.stdout, ref)
        with ckptfs.open(d) as ckpt:
            for key, t in ref.items():
                assert_stats(ckpt.stats(key, chunk_bytes=32), t, f"{kind} {key}")


def flat_tensors(obj: object, path: tuple = ()) -> dict[str, torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return {".".join(map(str, path)): obj}
    if isinstance(obj, dict):
        return {k: v for key, x in obj.items() for k, v in flat_tensors(x, (*path, key)).items()}
    if isinstance(obj, (list, tuple)):
        return {k: v for i, x in enumerate(obj) for k, v in flat_tensors(x, (*path, i)).items()}
    return {}


@pytest.mark.parametrize("name", ["w4", "w4z", "fsdp"])
def test_a_dcp_directory(dcp_checkpoints, tmp_path, name):
    """Tensors saved in chunks by several ranks (DTensor shards, FSDP2, zstd) against torch's own conversion of
    the checkpoint (dcp_to_torch_save)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(dcp_checkpoints / name, tmp_path / "ref.pt")
    ref = flat_tensors(torch.load(tmp_path / "ref.pt", weights_only=False))
    r = run("stats", "--json", str(dcp_checkpoints / name), "--chunk-size", "40")
    assert r.returncode == 0, r.stderr
    check_json_rows(r.stdout, ref)
    with ckptfs.open(dcp_checkpoints / name) as ckpt:
        for key, t in ref.items():
            assert_stats(ckpt.stats(key, chunk_bytes=24), t, key)


def test_over_http(nginx, tmp_path):
    """A checkpoint served by nginx: the same statistics as torch's of the file, and a histogram."""
    g = torch.Generator().manual_seed(6)
    sd = {"w": torch.randn(300, 40, generator=g), "b": with_specials("bfloat16"), "i": torch.arange(-5, 50),
          "step": 3}
    path = nginx.root / "stats-http.pth"
    torch.save(sd, path)
    ref = {k: v for k, v in torch.load(path).items() if isinstance(v, torch.Tensor)}
    r = run("stats", "--json", nginx.url("stats-http.pth"))
    assert r.returncode == 0, r.stderr
    check_json_rows(r.stdout, ref)
    r = run("stats", nginx.url("stats-http.pth"), "--hist", "w", "--bins", "7", "--json")
    x = torch_values(ref["w"]).reshape(-1).numpy()
    assert r.returncode == 0 and json.loads(r.stdout)["counts"] == np.histogram(x, bins=7)[0].tolist()
