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
        assert getattr(got, name) == want[name], (what, name, getattr(got, name), want[name])
        assert type(getattr(got, name)) is type(want[name]), (what, name, getattr(got, name), want[name])
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
