"""``ckptfs diff`` / ``ckptfs.diff`` compared with torch: one element changed in every dtype (found, with the
difference torch computes), NaN / -0.0 / byte-order semantics, views and tied tensors, dtype changes (a float8
decoding check over all 256 values), tolerances, tensors many chunks long, the same-storage fast path, renames,
prefixes, broken tensors, and the command's output and exit statuses (0 identical, 1 different, 2 trouble)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from craft import to_big_endian
from helpers import ALL_DTYPES, make, torch_values, views

import ckptfs
from ckptfs.source.local import LocalFile

CKPTFS = [sys.executable, "-m", "ckptfs.cli"]
AT = (3, 4)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CKPTFS, *args], capture_output=True, text=True, timeout=120)


def changed(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` with element AT changed (asserted changed as torch sees it)."""
    u = t.clone()
    if t.is_quantized:
        r = t.int_repr().clone()
        r[AT] = r[AT] + 1 if r[AT] < 100 else r[AT] - 1
        return torch._make_per_tensor_quantized_tensor(r, t.q_scale(), t.q_zero_point())
    if t.dtype == torch.bool:
        u[AT] = not bool(t[AT])
    elif t.is_complex():
        u[AT] = (t[AT].to(torch.complex64) + complex(0.5, -0.25)).to(t.dtype)
    elif t.is_floating_point():
        v = float(t[AT])
        u[AT] = torch.tensor(v * 2 if t.dtype == torch.float8_e8m0fnu else v + 0.5 + abs(v) * 0.3).to(t.dtype)
    else:
        u[AT] = (t[AT].to(torch.int64) + 1 if int(t[AT].to(torch.int64)) < 100 else t[AT].to(torch.int64) - 1).to(t.dtype)
    assert not torch.equal(torch_values(u), torch_values(t)), t.dtype
    return u


def expected_difference(a: torch.Tensor, b: torch.Tensor) -> dict:
    """n_different, max_abs, its index and max_rel as torch computes them (NaN equals NaN at the same place)."""
    if not a.is_floating_point() and not a.is_complex() and not a.is_quantized:  # ints, bool: exact
        xa, xb = [int(v) for v in a.reshape(-1).tolist()], [int(v) for v in b.reshape(-1).tolist()]
        d = [abs(p - q) for p, q in zip(xa, xb, strict=True)]
        i = max(range(len(d)), key=lambda k: d[k])
        rel = max((di / abs(q) if q else math.inf) for di, q in zip(d, xb, strict=True) if di)
        return {"n": sum(1 for x in d if x), "max_abs": d[i], "at": i, "max_rel": rel}
    va, vb = torch_values(a).reshape(-1), torch_values(b).reshape(-1)
    both_nan = torch.isnan(va) & torch.isnan(vb)
    ne = (va != vb) & ~both_nan
    numeric = ne & ~torch.isnan(va) & ~torch.isnan(vb)  # a NaN on one side is counted, has no size
    d = torch.where(numeric, (va - vb).abs(), torch.zeros((), dtype=torch.float64))
    i = int(d.argmax())
    rel = torch.where(numeric, d / vb.abs(), torch.zeros((), dtype=torch.float64))
    return {"n": int(ne.sum()), "max_abs": float(d[i]), "at": i, "max_rel": float(rel.max())}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict, dict]:
    d = tmp_path_factory.mktemp("diff")
    sd = {name: make(name, (7, 13)) for name in ALL_DTYPES}
    sd["q_int8"] = torch.quantize_per_tensor(torch.randn(7, 13) * 3, 0.05, -3, torch.qint8)
    sd["transposed"] = torch.randn(13, 7).t()  # strided
    other = {k: changed(v) for k, v in sd.items()}
    a, b = d / "a.pth", d / "b.pth"
    torch.save(sd, a)
    torch.save(other, b)
    return a, b, torch.load(a), torch.load(b)


@pytest.mark.parametrize("chunk", [8 * 5, None], ids=["5-element-chunks", "default-chunks"])
def test_one_element_changed_in_every_dtype(pair, chunk):
    a, b, ra, rb = pair
    with ckptfs.open(a) as ca, ckptfs.open(b) as cb:
        from ckptfs.api.diff import DiffOptions, diff_catalogs

        entries, summary = diff_catalogs(ca.catalog, cb.catalog, DiffOptions(**({"chunk_bytes": chunk} if chunk else {})))
    by_key = {e.key: e for e in entries}
    assert set(by_key) == set(ra)
    for key, e in by_key.items():
        want = expected_difference(ra[key], rb[key])
        assert e.status == "different", (key, e)
        assert e.n_different == want["n"] == 1, (key, e)
        assert e.at == list(AT), (key, e)
        if ra[key].is_complex():
            assert e.max_abs == pytest.approx(want["max_abs"], rel=1e-15) and e.max_rel == pytest.approx(want["max_rel"], rel=1e-15)
        else:
            assert (e.max_abs, e.max_rel) == (want["max_abs"], want["max_rel"]), (key, e, want)
    assert not summary.identical and summary.counts["different"] == len(ra)


def test_identical_copies_are_compared_byte_by_byte(tmp_path):
    sd = {name: make(name, (7, 13)) for name in ALL_DTYPES} | {"epoch": 3, "nested": {"lr": 0.1}}
    a, b = tmp_path / "a.pth", tmp_path / "b.pth"
    torch.save(sd, a)
    torch.save(sd, b)
    entries, summary = ckptfs.diff(a, b)
    assert summary.identical and {e.status for e in entries} == {"identical"}
    assert {e.how for e in entries if e.kind_a == "tensor"} == {"compared"}
    total = sum(t.numel() * t.element_size() for t in sd.values() if isinstance(t, torch.Tensor))
    assert summary.bytes_compared == 2 * total
    r = run("diff", str(a), str(b))
    assert r.returncode == 0 and r.stdout == "", r.stdout
    assert "identical" in r.stderr


def test_the_same_storage_is_not_read(tmp_path, monkeypatch):
    """A file against itself (or a hard link to it): every tensor is the same range of the same file, known
    without reading a byte of tensor data."""
    sd = {"w": torch.randn(300, 300), "t": torch.randn(50, 40).t(), "i": torch.arange(10)}
    a = tmp_path / "a.pth"
    torch.save(sd, a)
    link = tmp_path / "link.pth"
    os.link(a, link)
    for other in (a, link):
        with ckptfs.open(a) as ca, ckptfs.open(other) as cb:
            reads = []
            real = LocalFile.preadinto
            monkeypatch.setattr(LocalFile, "preadinto",
                                lambda self, buf, off, reads=reads, real=real: reads.append(off) or real(self, buf, off))
            from ckptfs.api.diff import diff_catalogs

            entries, summary = diff_catalogs(ca.catalog, cb.catalog)
            monkeypatch.undo()
        assert summary.identical and reads == [] and summary.bytes_compared == 0
        assert {e.how for e in entries} == {"same storage"}


def test_nan_signed_zero_and_exact(tmp_path):
    a, b, c = tmp_path / "a.pth", tmp_path / "b.pth", tmp_path / "c.pth"
    torch.save({"x": torch.tensor([math.nan, 1.0, -0.0, math.inf])}, a)
    torch.save({"x": torch.tensor([math.nan, 1.0, 0.0, math.inf])}, b)
    torch.save({"x": torch.tensor([2.0, 1.0, 0.0, math.inf])}, c)
    (e,), s = ckptfs.diff(a, b)
    assert e.status == "equal" and "signed zeros" in e.how and s.identical
    (e,), s = ckptfs.diff(a, b, exact=True)
    assert not s.identical
    assert run("diff", str(a), str(b)).returncode == 0
    assert run("diff", "--exact", str(a), str(b)).returncode == 1
    (e,), s = ckptfs.diff(a, c)
    assert e.status == "different" and e.nan_mismatch == 1 and e.n_different == 1 and e.max_abs is None


def nan_with_payload(dtype: torch.dtype) -> torch.Tensor:
    """A quiet NaN whose bits are not torch's default NaN (another payload: other bytes, the same value)."""
    if dtype == torch.float32:
        t = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    else:
        t = torch.tensor([0x7FC1], dtype=torch.int16).view(torch.bfloat16)
    assert torch.isnan(t).all() and t.view(torch.uint8).tolist() != torch.tensor([math.nan], dtype=dtype).view(
        torch.uint8).tolist()
    return t


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("chunk", [2 * 8, None], ids=["2-element-chunks", "default-chunks"])
def test_nan_inf_and_signed_zero_differences_as_torch_counts_them(tmp_path, dtype, chunk):
    """Two different files (no same-storage shortcut: every byte is read) whose values differ by NaN on one side,
    NaN against another NaN payload, -0.0 against 0.0, an infinity against the other one and against a finite
    value, and ordinary numbers: what differs, by how much and where, as torch computes it."""
    nan, inf = math.nan, math.inf
    va = torch.tensor([nan, nan, 1.0, -0.0, 0.0, inf, -inf, inf, 2.0, 0.0, 3.0, -4.0], dtype=dtype)
    vb = torch.tensor([nan, 1.0, nan, 0.0, -0.0, inf, inf, 5.0, 2.0, 0.0, 3.5, -4.0], dtype=dtype)
    va[9], vb[9] = math.nan, nan_with_payload(dtype)[0]  # NaN against another NaN payload: equal values
    a, b = tmp_path / "a.pth", tmp_path / "b.pth"
    torch.save({"x": va}, a)
    torch.save({"x": vb}, b)
    ra, rb = torch.load(a)["x"], torch.load(b)["x"]
    assert ra.view(torch.uint8).tolist() != rb.view(torch.uint8).tolist()
    with ckptfs.open(a) as ca, ckptfs.open(b) as cb:
        from ckptfs.api.diff import DiffOptions, diff_catalogs

        (e,), s = diff_catalogs(ca.catalog, cb.catalog, DiffOptions(**({"chunk_bytes": chunk} if chunk else {})))
    x, y = torch_values(ra), torch_values(rb)
    nan_a, nan_b = torch.isnan(x), torch.isnan(y)
    differ = (x != y) & ~(nan_a & nan_b)  # torch: -0.0 == 0.0, NaN != NaN (but NaN at the same place is equal)
    numeric = differ & ~nan_a & ~nan_b
    d = torch.where(numeric, (x - y).abs(), torch.zeros((), dtype=torch.float64))
    rel = torch.where(numeric, d / y.abs(), torch.zeros((), dtype=torch.float64))
    rel = torch.where(torch.isnan(rel), torch.tensor(inf, dtype=torch.float64), rel)  # inf/inf: -inf vs inf
    one_nan = (nan_a ^ nan_b).nonzero().reshape(-1).tolist()
    assert (e.status, e.n_different) == ("different", int(differ.sum())) == ("different", 5)
    assert (e.max_abs, e.at) == (float(d.max()), [int(d.argmax())]) == (inf, [6])
    assert e.max_rel == float(rel.max()) == inf
    assert (e.nan_mismatch, e.nan_at) == (len(one_nan), one_nan[:1]) == (2, [1])
    assert not s.identical and s.bytes_compared == 2 * ra.numel() * ra.element_size()
    # without the infinities, the largest relative difference is the finite one torch computes (|3 - 3.5| / 3.5)
    finite_b = vb.clone()
    finite_b[6], finite_b[7] = -inf, inf
    torch.save({"x": finite_b}, b)
    (e,), _ = ckptfs.diff(a, b)
    y = torch_values(torch.load(b)["x"])
    numeric = (x != y) & ~torch.isnan(x) & ~torch.isnan(y)
    want = torch.where(numeric, (x - y).abs() / y.abs(), torch.zeros((), dtype=torch.float64))
    assert (e.n_different, e.max_abs, e.at) == (3, float((x[10] - y[10]).abs()), [10])
    assert e.max_rel == float(want.max()) and e.nan_mismatch == 2
    r = run("diff", str(a), str(b))
    assert r.returncode == 1 and "NaN on one side at 2 elements (first at [1])" in r.stdout, r.stdout


def test_other_byte_order_is_equal_values(tmp_path):
    sd = {"f32": make("float32"), "c64": make("complex64"), "bf16": make("bfloat16"), "i16": make("int16")}
    little, big = tmp_path / "little.pth", tmp_path / "big.pth"
    torch.save(sd, little)
    with zipfile.ZipFile(little) as z:
        keys = sorted(int(n.rsplit("/", 1)[1]) for n in z.namelist() if "/data/" in n)
    to_big_endian(little, big, {str(k): t.element_size() // (2 if t.is_complex() else 1)
                                for k, t in zip(keys, sd.values(), strict=True)})
    entries, s = ckptfs.diff(little, big)
    assert s.identical and {e.status for e in entries} == {"equal"}
    assert all("byte order little vs big" in e.how for e in entries)
    assert run("diff", "--exact", str(little), str(big)).returncode == 1


def test_views_tied_and_contiguous_copies(tmp_path):
    base = torch.randn(40, 30)
    va = dict(views()) | {"tied_a": base, "tied_b": base, "tied_row": base[3]}
    vb = {k: v.contiguous().clone() for k, v in va.items()}  # no views, nothing shared
    a, b = tmp_path / "a.pth", tmp_path / "b.pth"
    torch.save(va, a)
    torch.save(vb, b)
    entries, s = ckptfs.diff(a, b)
    assert s.identical and {e.status for e in entries} == {"identical"}, [e for e in entries if e.status != "identical"]
    vb["tied_b"] = vb["tied_b"].clone()
    vb["tied_b"][7, 9] += 1.0
    torch.save(vb, b)
    entries, s = ckptfs.diff(a, b)
    bad = [e for e in entries if e.status != "identical"]
    assert [(e.key, e.at, e.n_different) for e in bad] == [("tied_b", [7, 9], 1)]
    assert bad[0].max_abs == float((va["tied_b"].double() - vb["tied_b"].double()).abs().max())


def test_dtype_change_reports_the_values_too(tmp_path):
    w = torch.randn(64, 32)
    a, b = tmp_path / "a.pth", tmp_path / "b.pth"
    torch.save({"w": w, "same": w}, a)
    torch.save({"w": w.bfloat16(), "same": w.double()}, b)
    by_key = {e.key: e for e in ckptfs.diff(a, b)[0]}
    e = by_key["w"]
    d = (w.double() - w.bfloat16().double()).abs()
    assert (e.status, e.dtype_a, e.dtype_b) == ("dtype", "float32", "bfloat16")
    assert e.max_abs == float(d.max()) and e.n_different == int((d > 0).sum())
    assert e.max_rel == float((d / w.bfloat16().double().abs()).max())
    assert (by_key["same"].status, by_key["same"].n_different) == ("dtype", 0)  # float32 -> float64: lossless


def test_a_dtype_change_with_tolerances_says_whether_the_values_are_close(tmp_path):
    """"Did my conversion keep every weight?": a bf16 copy is a dtype change whatever the values, and its
    values are told close (within --atol) or not as an unchanged dtype's are, counted beyond the tolerance."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(1000, generator=g)
    bad = w.bfloat16().clone()
    bad[7] = 5.0
    a, good_b, bad_b = tmp_path / "a.pth", tmp_path / "good.pth", tmp_path / "bad.pth"
    torch.save({"w": w}, a)
    torch.save({"w": w.bfloat16()}, good_b)
    torch.save({"w": bad}, bad_b)
    atol = 0.01
    for b, copy in ((good_b, w.bfloat16()), (bad_b, bad)):
        (e,), s = ckptfs.diff(a, b, atol=atol)
        wide, cb = w.double(), copy.double()
        not_close = int((~torch.isclose(wide, cb, rtol=0.0, atol=atol)).sum())
        assert e.status == "dtype" and not s.identical
        assert e.values == ("close" if not_close == 0 else "different")
        assert e.n_different == (not_close or int((wide != cb).sum()))
        assert e.max_abs == float((wide - cb).abs().max())
        line = run("diff", "--atol", str(atol), str(a), str(b)).stdout
        if not_close == 0:
            assert "dtype changed; values close: " in line and "within --atol/--rtol" in line, line
        else:
            assert not_close == 1 and "dtype changed; 1 of 1,000 elements differ" in line, line
    (e,), _ = ckptfs.diff(a, good_b)
    assert e.values == "different"  # no tolerance: every rounded value differs


def test_a_pattern_that_matches_nothing_is_trouble(tmp_path):
    a = tmp_path / "a.pth"
    torch.save({"w": torch.ones(3)}, a)
    r = run("diff", str(a), str(a), "nomatch*")
    assert r.returncode == 2 and "no key of either checkpoint matches nomatch*" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert run("diff", str(a), str(a), "w").returncode == 0


def test_signalling_nans_compare_without_warnings(tmp_path):
    """bf16 bit patterns of signalling NaNs against their float32 copies: numpy's cast to float64 would warn
    ('invalid value encountered in cast') on stderr, two lines in the middle of the output."""
    raw = torch.tensor([0x7F81, 0xFF81, 0x7FC0, 0x3F80], dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    a, b = tmp_path / "a.pth", tmp_path / "b.pth"
    torch.save({"v": raw}, a)
    torch.save({"v": raw.float()}, b)
    r = run("diff", str(a), str(b))
    assert r.returncode == 1 and "Warning" not in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert "values equal" in r.stdout  # (the summary line is the only one on stderr)


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                                  "float8_e8m0fnu", "bfloat16", "float16"])
def test_every_bit_pattern_decodes_as_torch_converts_it(tmp_path, name):
    """All 256 (float8) or 65536 (16-bit) bit patterns against torch's own conversion to float64: the dtype
    changes, every value is equal (NaNs at the same places)."""
    bits = torch.arange(256 if name.startswith("float8") else 65536, dtype=torch.int32)
    raw = bits.to(torch.uint8) if name.startswith("float8") else bits.to(torch.int16)
    t = raw.view(getattr(torch, name))
    a, b = tmp_path / "a.pth", tmp_path / "b.pth"
    torch.save({"v": t}, a)
    torch.save({"v": t.to(torch.float64)}, b)
    (e,), _ = ckptfs.diff(a, b)
    assert (e.status, e.n_different) == ("dtype", 0), e


def test_shape_kind_value_only_and_renames(tmp_path):
    t = torch.randn(4, 8)
    a, b = tmp_path / "a.pth", tmp_path / "b.pth"
    torch.save({"emb": torch.zeros(10, 4), "old.w": t, "gone": torch.ones(2), "epoch": 3, "k": torch.ones(3),
                "name": "x"}, a)
    torch.save({"emb": torch.zeros(12, 4), "new.w": t.clone(), "added": torch.ones(5), "epoch": 4, "k": 7,
                "name": "x"}, b)
    by_key = {e.key: e for e in ckptfs.diff(a, b)[0]}
    assert by_key["emb"].status == "shape" and by_key["emb"].shape_b == (12, 4)
    assert (by_key["new.w"].status, by_key["new.w"].renamed_from) == ("renamed", "old.w")
    assert "old.w" not in by_key
    assert by_key["gone"].status == "only_a" and by_key["added"].status == "only_b"
    assert (by_key["epoch"].status, by_key["epoch"].value_a, by_key["epoch"].value_b) == ("value", "3", "4")
    assert (by_key["k"].status, by_key["k"].kind_a, by_key["k"].kind_b) == ("kind", "tensor", "value")
    assert by_key["name"].status == "identical"
    no_renames = {e.key: e.status for e in ckptfs.diff(a, b, renames=False)[0]}
    assert no_renames["old.w"] == "only_a" and no_renames["new.w"] == "only_b"
    r = run("diff", str(a), str(b))
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert any(ln.startswith("~ emb ") and "[10, 4] -> [12, 4]" in ln and "shape changed" in ln for ln in lines)
    assert any(ln.startswith("R old.w -> new.w ") for ln in lines)
    assert any(ln.startswith("- gone ") and ln.endswith(f"only in {a}") for ln in lines)
    assert any(ln.startswith("+ added ") and ln.endswith(f"only in {b}") for ln in lines)
    assert any(ln.startswith("~ epoch ") and "3 -> 4" in ln for ln in lines)


def test_tolerances(tmp_path):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(1000, generator=g, dtype=torch.float64)
    noisy = w + torch.randn(1000, generator=g, dtype=torch.float64) * 1e-6
    noisy[10] += 1.0
    a, b = tmp_path / "a.pth", tmp_path / "b.pth"
    torch.save({"w": w}, a)
    torch.save({"w": noisy}, b)
    for atol, rtol in ((0.0, 0.0), (1e-5, 0.0), (0.0, 1e-4), (1e-7, 1e-6), (2.0, 0.0)):
        (e,), s = ckptfs.diff(a, b, atol=atol, rtol=rtol)
        not_close = int((~torch.isclose(w, noisy, rtol=rtol, atol=atol)).sum())
        if not_close:
            assert (e.status, e.n_different) == ("different", not_close), (atol, rtol, e)
        else:
            assert e.status == "close" and e.n_different == int((w != noisy).sum()) and s.identical
        assert e.max_abs == float((w - noisy).abs().max()) and e.at == [10]
    assert run("diff", "--atol", "2", str(a), str(b)).returncode == 0
    assert run("diff", "--atol", "1e-5", str(a), str(b)).returncode == 1


def test_tensor_many_chunks_long(tmp_path):
    g = torch.Generator().manual_seed(5)
    w = torch.randn(100_003, generator=g)
    v = w.clone()
    for i, delta in ((17, 0.25), (55_555, -3.0), (100_002, 1e-3)):
        v[i] += delta
    v[99_000] = math.nan
    a, b = tmp_path / "a.pth", tmp_path / "b.pth"
    torch.save({"w": w}, a)
    torch.save({"w": v}, b)
    with ckptfs.open(a) as ca, ckptfs.open(b) as cb:
        from ckptfs.api.diff import DiffOptions, diff_catalogs

        (e,), _ = diff_catalogs(ca.catalog, cb.catalog, DiffOptions(chunk_bytes=8 * 1000))
    want = expected_difference(w, v)
    assert (e.n_different, e.max_abs, e.at, e.max_rel) == (want["n"], want["max_abs"], [want["at"]], want["max_rel"])
    assert e.at == [55_555] and e.nan_mismatch == 1 and e.n_different == 4


def test_prefixes_patterns_and_cross_format(tmp_path):
    """A training checkpoint's model against the bare state_dict saved in torch's legacy format."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.LayerNorm(4))
    train, bare = tmp_path / "train.ckpt", tmp_path / "bare.pth"
    torch.save({"state_dict": model.state_dict(), "epoch": 2}, train)
    torch.save(model.state_dict(), bare, _use_new_zipfile_serialization=False)
    with ckptfs.open(bare) as c:
        assert c.format == "legacy"
    r = run("diff", "--a-prefix", "state_dict", str(train), str(bare))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4 identical" in r.stderr
    r = run("diff", str(train), str(bare), "-v", "--json")  # without the prefix: the same bytes under other keys
    rows = [json.loads(ln) for ln in r.stdout.splitlines()]
    assert r.returncode == 1 and sorted((x["status"], x.get("renamed_from")) for x in rows) == [
        ("only_a", None), *sorted(("renamed", f"state_dict.{k}") for k in model.state_dict())]
    r = run("diff", "--a-prefix", "state_dict", str(train), str(bare), "1.*", "--json", "-v")
    assert [json.loads(ln)["key"] for ln in r.stdout.splitlines()] == ["1.weight", "1.bias"]


def test_broken_tensor_is_an_error_and_the_rest_compared(tmp_path):
    a, b = tmp_path / "a.pth", tmp_path / "ok.pth"
    torch.save({"good": torch.arange(10.0), "bad": torch.ones(4)}, a)
    torch.save({"good": torch.arange(10.0) * 2, "bad": torch.ones(4)}, b)
    broken = tmp_path / "broken.pth"
    with zipfile.ZipFile(b) as zin, zipfile.ZipFile(broken, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            zout.writestr(info, data[:8] if info.filename.endswith("data/1") else data)
    r = run("diff", str(a), str(broken))
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert any(ln.startswith("! bad ") and "cannot compare" in ln and "broken.pth" in ln for ln in lines)
    assert any(ln.startswith("~ good ") and "9 of 10 elements differ" in ln for ln in lines)
    assert "trouble" in r.stderr


def test_command_output_quiet_json_and_errors(pair, tmp_path):
    a, b, ra, rb = pair
    r = run("diff", "-q", str(a), str(b))
    assert r.returncode == 1 and r.stdout == "" and r.stderr == ""
    r = run("diff", "--json", str(a), str(b), "float32", "int8")
    rows = [json.loads(ln) for ln in r.stdout.splitlines()]
    assert r.returncode == 1 and [x["key"] for x in rows] == ["float32", "int8"]
    want = expected_difference(ra["float32"], rb["float32"])
    assert rows[0]["max_abs"] == want["max_abs"] and rows[0]["at"] == list(AT) and rows[0]["status"] == "different"
    r = run("diff", str(a), str(b), "float32")
    line = r.stdout.strip()
    assert line.startswith("~ float32 ") and f"1 of 91 elements differ: max abs {want['max_abs']:.4g} at [3, 4]" in line
    for args, msg in (((str(a), str(tmp_path / "missing.pth")), "missing.pth"),
                      (("--atol", "-1", str(a), str(b)), "must not be negative")):
        r = run("diff", *args)
        assert r.returncode == 2 and r.stdout == "", r.stdout
        assert len(r.stderr.strip().splitlines()) == 1 and msg in r.stderr and r.stderr.startswith("ckptfs: ")
    assert run("diff", str(a)).returncode == 2  # usage


def test_a_shared_remote_style_identity_is_not_taken_for_the_same_bytes(tmp_path):
    """Two objects may share an ETag-like identity (an nginx ETag is mtime-size) without sharing bytes: only a
    posix identity (device, inode, mtime) names the same bytes across sources; other identities count together
    with the source's name, so these two are read and compared."""
    from ckptfs.source import Identity
    from ckptfs.source.memory import BytesSource

    class Remote(BytesSource):
        def identity(self) -> Identity:
            return Identity("etag", ("5e1f-400",), self.size)

    a, b = tmp_path / "a.pth", tmp_path / "b.pth"
    torch.save({"w": torch.zeros(64)}, a)
    torch.save({"w": torch.ones(64)}, b)
    assert a.stat().st_size == b.stat().st_size
    (e,), s = ckptfs.diff(Remote(a.read_bytes(), "http://one/m.pth"), Remote(b.read_bytes(), "http://two/m.pth"))
    assert e.status == "different" and e.n_different == 64 and s.bytes_compared == 2 * 64 * 4
    same = Remote(a.read_bytes(), "http://one/m.pth")
    (e,), s = ckptfs.diff(same, Remote(a.read_bytes(), "http://one/m.pth"))  # the same object: not read
    assert e.how == "same storage" and s.bytes_compared == 0


# --- directories with a file left out, exports, sharded and DCP directories ------------------------------------


def runs_directory(d: Path, damaged: bool) -> Path:
    """A directory of loose checkpoints (each a subtree), epoch_2.pt cut in half if ``damaged``."""
    d.mkdir()
    torch.save({"w": torch.ones(3), "epoch": 1}, d / "epoch_1.pt")
    torch.save({"w": torch.ones(3) * 2, "epoch": 2}, d / "epoch_2.pt")
    if damaged:
        data = (d / "epoch_2.pt").read_bytes()
        (d / "epoch_2.pt").write_bytes(data[: len(data) // 2])
    return d


def test_a_file_of_a_directory_left_out_is_trouble_not_a_difference(tmp_path):
    """A member that cannot be opened is left out of its directory's tree (Catalog.problems): its keys are
    unknown, so the comparison is incomplete: an error line naming it, and exit status 2 (not 'only in B' and 1;
    with the same damaged file on both sides, not 'identical' and 0)."""
    a, b = runs_directory(tmp_path / "a", damaged=True), runs_directory(tmp_path / "b", damaged=False)
    r = run("diff", str(a), str(b))
    assert r.returncode == 2, r.stdout + r.stderr
    errors = [ln for ln in r.stdout.splitlines() if ln.startswith("! ")]
    assert len(errors) == 1 and errors[0].startswith("! epoch_2.pt "), r.stdout
    assert f"cannot be opened, left out of {a}: " in errors[0] and "end-of-central-directory" in errors[0]
    assert "trouble" in r.stderr and "1 error" in r.stderr
    r = run("diff", "-q", str(a), str(b))
    assert (r.returncode, r.stdout, r.stderr) == (2, "", "")
    c = runs_directory(tmp_path / "c", damaged=True)  # the same damaged file on both sides
    entries, s = ckptfs.diff(a, c)
    assert not s.identical and s.errors == 2
    assert sorted((e.key, e.left_out) for e in entries if e.status == "error") == [("epoch_2.pt", "a"),
                                                                                    ("epoch_2.pt", "b")]
    r = run("diff", "--json", str(a), str(c))
    rows = [json.loads(ln) for ln in r.stdout.splitlines()]
    assert r.returncode == 2 and [(x["key"], x["status"], x["left_out"]) for x in rows] == [
        ("epoch_2.pt", "error", "a"), ("epoch_2.pt", "error", "b")]
    assert all("end-of-central-directory" in x["error"] for x in rows)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A training checkpoint (tensors, a strided view, values) and its `ckptfs export` safetensors copy."""
    d = tmp_path_factory.mktemp("export")
    g = torch.Generator().manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.LayerNorm(8))
    sd = {"state_dict": {**model.state_dict(), "emb": torch.randn(10, 4, generator=g).to(torch.bfloat16),
                         "t": torch.randn(6, 5, generator=g).t(), "steps": torch.arange(7)},
          "epoch": 4, "lr": 0.01, "name": "run-3"}
    src, dst = d / "train.ckpt", d / "train.safetensors"
    torch.save(sd, src)
    r = run("export", str(src), str(dst))
    assert r.returncode == 0, r.stderr
    return src, dst


def test_a_checkpoint_against_its_exported_safetensors_copy(exported, tmp_path):
    from safetensors.torch import load_file, save_file

    src, dst = exported
    ref = {f"state_dict.{k}": v for k, v in torch.load(src)["state_dict"].items()}
    r = run("diff", str(src), str(dst))  # the values went to __metadata__: keys only in A
    assert r.returncode == 1
    assert sorted((ln.split()[0], ln.split()[1]) for ln in r.stdout.splitlines()) == [
        ("-", "epoch"), ("-", "lr"), ("-", "name")], r.stdout
    r = run("diff", "--tensors-only", str(src), str(dst))
    assert (r.returncode, r.stdout) == (0, ""), r.stdout + r.stderr
    assert f"{len(ref)} identical" in r.stderr
    with ckptfs.open(src) as ca, ckptfs.open(dst) as cb:
        from ckptfs.api.diff import DiffOptions, diff_catalogs

        entries, s = diff_catalogs(ca.catalog, cb.catalog, DiffOptions(tensors_only=True))
    assert s.identical and {e.key: e.status for e in entries} == dict.fromkeys(ref, "identical")
    # one element changed, written by safetensors' own writer
    copy = {k: v.clone() for k, v in load_file(dst).items()}
    assert copy.keys() == ref.keys()
    copy["state_dict.0.weight"][2, 5] += 0.125
    copy["state_dict.emb"][7, 1] = -copy["state_dict.emb"][7, 1] * 3
    changed_file = tmp_path / "changed.safetensors"
    save_file(copy, changed_file, metadata={"format": "pt"})
    r = run("diff", "--tensors-only", "--json", str(src), str(changed_file))
    rows = {x["key"]: x for x in map(json.loads, r.stdout.splitlines())}
    assert r.returncode == 1 and sorted(rows) == ["state_dict.0.weight", "state_dict.emb"], r.stdout
    for key, at in (("state_dict.0.weight", [2, 5]), ("state_dict.emb", [7, 1])):
        want = expected_difference(ref[key], copy[key])
        assert (rows[key]["status"], rows[key]["n_different"], rows[key]["at"]) == ("different", 1, at)
        assert (rows[key]["max_abs"], rows[key]["max_rel"]) == (want["max_abs"], want["max_rel"]), (key, want)
    assert "1 of 128 elements differ" in run("diff", "--tensors-only", str(src), str(changed_file)).stdout


def test_a_sharded_hf_directory(hf_sharded, tmp_path):
    """The safetensors shards against the .bin shards, against one torch.save file of the same state_dict, and
    against a copy with one shard rewritten by safetensors with an element changed."""
    import shutil

    from safetensors.torch import load_file, save_file

    st, bins = hf_sharded["safetensors"], hf_sharded["bin"]
    ref: dict[str, torch.Tensor] = {}
    for shard in sorted(bins.glob("*.bin")):
        ref |= torch.load(shard)
    single = tmp_path / "single.pth"
    torch.save(ref, single)
    for a, b in ((st, bins), (bins, single), (single, st)):
        r = run("diff", str(a), str(b))
        assert (r.returncode, r.stdout) == (0, ""), (a, b, r.stdout + r.stderr)
        assert f"{len(ref)} identical" in r.stderr
    copy = tmp_path / "copy"
    shutil.copytree(st, copy)
    key = "model.layers.1.mlp.up_proj.weight"
    shard = next(p for p in sorted(copy.glob("*.safetensors")) if key in load_file(p))
    tensors = {k: v.clone() for k, v in load_file(shard).items()}
    tensors[key][30, 2] += 1.5
    save_file(tensors, shard, metadata={"format": "pt"})
    entries, s = ckptfs.diff(bins, copy)
    bad = [e for e in entries if e.status != "identical"]
    want = expected_difference(ref[key], tensors[key])
    assert [(e.key, e.status, e.n_different, e.at) for e in bad] == [(key, "different", 1, [30, 2])]
    assert (bad[0].max_abs, bad[0].max_rel) == (want["max_abs"], want["max_rel"])
    assert run("diff", "-q", str(st), str(copy)).returncode == 1


def flat(obj: object, path: tuple = ()) -> dict[tuple, object]:
    """{path: leaf} of a nested state_dict (dicts and lists); ckptfs's key is the path joined with dots."""
    if isinstance(obj, dict):
        return {k: v for key, x in obj.items() for k, v in flat(x, (*path, key)).items()}
    if isinstance(obj, (list, tuple)):
        return {k: v for i, x in enumerate(obj) for k, v in flat(x, (*path, i)).items()}
    return {path: obj}


@pytest.mark.parametrize("name", ["w1", "w4", "fsdp"])
def test_a_dcp_directory_against_dcp_to_torch_save(dcp_checkpoints, tmp_path, name):
    """A DCP checkpoint against torch's own conversion of it (dcp_to_torch_save): identical; then against that
    file with one element of a sharded tensor changed: found, with torch's difference."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    ref_file = tmp_path / "ref.pt"
    dcp_to_torch_save(dcp_checkpoints / name, ref_file)
    r = run("diff", str(dcp_checkpoints / name), str(ref_file))
    assert (r.returncode, r.stdout) == (0, ""), r.stdout + r.stderr
    ref = torch.load(ref_file, weights_only=False)
    tensors = {k: v for k, v in flat(ref).items() if isinstance(v, torch.Tensor) and v.is_floating_point()
               and v.numel() > 4}
    path = sorted(tensors, key=str)[0]
    key, t = ".".join(map(str, path)), tensors[path]
    changed_t = t.clone()
    changed_t.view(-1)[3] = float(t.view(-1)[3]) * -2 + 1
    node = ref
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = changed_t
    torch.save(ref, ref_file)
    entries, s = ckptfs.diff(dcp_checkpoints / name, ref_file)
    bad = [e for e in entries if e.status != "identical"]
    want = expected_difference(t, changed_t)
    assert [(e.key, e.status, e.n_different) for e in bad] == [(key, "different", 1)], bad
    assert (bad[0].max_abs, bad[0].max_rel, bad[0].at) == (want["max_abs"], want["max_rel"],
                                                           list(torch.unravel_index(torch.tensor(3), t.shape)))
