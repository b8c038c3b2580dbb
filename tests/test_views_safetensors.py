"""The safetensors view and .npy files, without a mount: every file checked by the safetensors library itself
(safe_open, load_file, the writer's own bytes) and numpy (np.save / np.load), against torch.load."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import safetensors
import safetensors.torch as st
import torch
from craft import throwaway_module, to_big_endian
from helpers import ALL_DTYPES, USER_CLASSES, make, save, views
from safetensors import safe_open

import ckptfs
from ckptfs.model.catalog import Catalog
from ckptfs.source import LocalFile
from ckptfs.views.npy import npy_content
from ckptfs.views.safetensors import SafetensorsFile, plan_by_size, plan_members, select


def view_bytes(ckpt_path: Path | Catalog) -> bytes:
    """The single safetensors file the view makes of a checkpoint."""
    cat = ckpt_path if isinstance(ckpt_path, Catalog) else ckptfs.open(ckpt_path).catalog
    sel = select(cat)
    return SafetensorsFile(sel.tensors, sel.metadata()).content().read()


def write_view(ckpt_path: Path, out: Path) -> Path:
    out.write_bytes(view_bytes(ckpt_path))
    return out


def header(path: Path) -> dict:
    """The JSON header of a safetensors file, parsed here by the format's one-page spec."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n])


def safetensors_accepts(t: torch.Tensor) -> bool:
    """Whether the safetensors writer itself can store this tensor."""
    try:
        st.save({"x": t.contiguous()})
    except Exception:  # noqa: BLE001 - its refusal is the answer
        return False
    return True


def resolved(t: torch.Tensor) -> torch.Tensor:
    """A tensor's values as torch computes them (conj / neg bits applied)."""
    return t.resolve_conj().resolve_neg().contiguous()


# --- every dtype and view kind ---------------------------------------------------------------------------------


def test_every_dtype_and_view_through_safe_open(tmp_path):
    sd = {}
    for name in ALL_DTYPES:
        sd[f"{name}.contig"] = make(name)
        sd[f"{name}.t"] = make(name, (4, 6)).t()
        if not name.startswith("complex"):
            sd[f"{name}.scalar"] = make(name, ())
    for name, v in views().items():
        sd[f"views.{name}"] = v
    p = save(tmp_path / "all.pth", sd)
    out = write_view(p, tmp_path / "all.safetensors")
    ref = torch.load(p, weights_only=True)
    held = 0
    with safe_open(out, "pt") as f:
        keys = set(f.keys())
        omitted = json.loads(f.metadata()["ckptfs.omitted"])
        for key, t in ref.items():
            if safetensors_accepts(t):
                assert key in keys, key
                got = f.get_tensor(key)
                assert got.dtype == t.dtype and got.shape == t.shape, key
                if got.dtype == torch.float4_e2m1fn_x2:  # torch has no equality for it: compare the bits
                    got, t = got.view(torch.uint8), t.view(torch.uint8)
                assert torch.equal(got, t.contiguous()), key
                held += 1
            else:
                assert key not in keys and key in omitted, key
    assert held == len(keys) and held > 60
    assert set(omitted) == {k for k in ref if not safetensors_accepts(ref[k])}
    assert "complex128" in omitted["complex128.contig"]
    st.load_file(out)  # the library's other loader (reads the whole file, validates the header)


def test_bytes_are_what_save_file_writes(tmp_path):
    """Contiguous tensors of every dtype safetensors has, and no other values: the view's bytes are the writer's
    bytes (same layout, alignment, header)."""
    sd = {}
    for i, name in enumerate(ALL_DTYPES):
        t = make(name, (3, 1 + i % 4))
        if safetensors_accepts(t):
            sd[f"layer.{i}.{name}"] = t
    sd["empty"] = torch.zeros(0, 3)
    p = save(tmp_path / "c.pth", sd)
    expected = tmp_path / "expected.safetensors"
    st.save_file(torch.load(p, weights_only=True), expected, metadata={"format": "pt"})
    assert view_bytes(p) == expected.read_bytes()


def test_views_are_gathered_and_tied_tensors_are_two_ranges(tmp_path):
    emb = torch.nn.Embedding(50, 8)
    base = torch.arange(60.0).reshape(6, 10)
    sd = {"emb.weight": emb.weight, "lm_head.weight": emb.weight, "tail": base[2:], "t": base.t(),
          "expanded": torch.arange(4.0).reshape(4, 1).expand(4, 5), "cl": torch.randn(2, 3, 4, 5).to(
              memory_format=torch.channels_last)}
    p = save(tmp_path / "tied.pth", sd)
    out = write_view(p, tmp_path / "tied.safetensors")
    ref = torch.load(p, weights_only=True)
    loaded = st.load_file(out)
    assert set(loaded) == set(ref)
    for k in ref:
        assert torch.equal(loaded[k], ref[k].contiguous()), k
    h = header(out)
    a, b = h["emb.weight"]["data_offsets"], h["lm_head.weight"]["data_offsets"]
    assert a != b and a[1] - a[0] == b[1] - b[0] == 50 * 8 * 4  # both in the file, each its own range
    # the view is ranges of the checkpoint for the contiguous ones (no copy), gathered pieces for the others
    with ckptfs.open(p) as ckpt:
        kinds = {e.name: type(e.pieces()[0]).__name__ for e in select(ckpt.catalog).tensors}
    assert kinds["emb.weight"] == kinds["lm_head.weight"] == kinds["tail"] == "SourceRange"
    assert kinds["t"] == kinds["expanded"] == kinds["cl"] == "Computed"


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int64", "int16", "complex64",
                                   "uint8", "bool", "int32"])
def test_big_endian_checkpoints_become_little_endian(tmp_path, dtype):
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6) * 1.25 - 3
    dt = getattr(torch, dtype)
    t = torch.complex(base, -base).to(dt) if dt.is_complex else (base > 0 if dt == torch.bool else base.to(dt))
    little = save(tmp_path / "little.pt", {"w": t, "view": t.t()[1:], "f": base.float()})
    unit = t.element_size() // (2 if dt.is_complex else 1)
    big = tmp_path / "big.pt"
    to_big_endian(little, big, {"0": unit, "1": 4})  # storages numbered in pickling order: w (and view), f
    ref = torch.load(big, weights_only=True)
    assert torch.equal(ref["w"], t)  # torch byte-swaps to native
    out = write_view(big, tmp_path / "big.safetensors")
    with safe_open(out, "pt") as f:
        for k in ("w", "view", "f"):
            assert torch.equal(f.get_tensor(k), ref[k].contiguous()), k


def test_conj_and_neg_bits_are_applied(tmp_path):
    c = torch.complex(torch.randn(3, 4), torch.randn(3, 4))
    sd = {"conj": c.conj(), "neg": torch.randn(5)._neg_view(), "conj_t": c.conj().t(),
          "neg_int": torch.arange(-3, 3, dtype=torch.int32)._neg_view()}
    p = save(tmp_path / "bits.pth", sd)
    ref = torch.load(p, weights_only=True)
    assert ref["conj"].is_conj() and ref["neg"].is_neg()  # the premise: torch.load sets the bits
    out = write_view(p, tmp_path / "bits.safetensors")
    with safe_open(out, "pt") as f:
        for k in sd:
            assert torch.equal(f.get_tensor(k), resolved(ref[k])), k


# --- what is not a tensor ----------------------------------------------------------------------------------------


def test_values_and_what_safetensors_cannot_hold_are_in_metadata(tmp_path):
    x = torch.randn(4, 6)
    with throwaway_module("ckptfs_user_classes_views", USER_CLASSES, tmp_path) as mod:
        obj = {
            "model": {"fc.weight": x, "fc.bias": torch.zeros(4)},
            "epoch": 7, "loss": 0.25, "name": "run/1", "flag": True, "nothing": None, "blob": b"\x00\xff",
            "cplx": 1 + 2j, "hparams": {"lr": 0.001, "betas": (0.9, 0.99), "layers": [64, 64], "nested": {"a": 1}},
            "c128": torch.randn(3, dtype=torch.complex128),
            "c32": torch.randn(2, dtype=torch.complex64).to(torch.complex32),
            "q": torch.quantize_per_tensor(x, 0.1, 3, torch.quint8),
            "qc": torch.quantize_per_channel(x, torch.rand(4, dtype=torch.float64) + 0.1,
                                             torch.zeros(4, dtype=torch.long), 0, torch.qint8),
            "sparse": x.to_sparse(), "csr": x.to_sparse_csr(), "meta": torch.empty(3, 4, device="meta"),
            "nested_t": torch.nested.nested_tensor([torch.randn(2), torch.randn(3)]),
            "config": mod.TrainConfig(lr=0.1, betas=(0.9, 0.99), schedule=[1, 2], init=torch.ones(2)),
            "opt": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(4)}},
                    "param_groups": [{"lr": 0.1, "params": [0]}]},
        }
        p = save(tmp_path / "train.pth", obj)
        ref = torch.load(p, weights_only=False)
    out = write_view(p, tmp_path / "train.safetensors")
    want = {"model.fc.weight": ref["model"]["fc.weight"], "model.fc.bias": ref["model"]["fc.bias"],
            "opt.state.0.step": ref["opt"]["state"][0]["step"], "opt.state.0.exp_avg": ref["opt"]["state"][0]["exp_avg"],
            "config.init": ref["config"].init}  # (a tensor inside an object of a class ckptfs never imports)
    with safe_open(out, "pt") as f:
        md = f.metadata()
        keys = set(f.keys())
        assert keys == set(want)
        for k, t in want.items():
            assert torch.equal(f.get_tensor(k), t), k
    assert md["format"] == "pt"
    for k in ("epoch", "loss", "name", "flag", "nothing"):
        assert json.loads(md[k]) == ref[k], k
    assert json.loads(md["blob"]) == {"$bytes": "AP8="} and json.loads(md["cplx"]) == {"$complex": [1.0, 2.0]}
    assert json.loads(md["hparams"]) == {"lr": 0.001, "betas": [0.9, 0.99], "layers": [64, 64], "nested": {"a": 1}}
    assert json.loads(md["opt.param_groups"]) == [{"lr": 0.1, "params": [0]}]
    assert json.loads(md["config.lr"]) == 0.1 and json.loads(md["config.schedule"]) == [1, 2]
    omitted = json.loads(md["ckptfs.omitted"])
    assert set(omitted) == {"c128", "c32", "q", "qc", "sparse", "csr", "meta", "nested_t", "config"}, omitted
    assert "TrainConfig" in omitted["config"] and "meta" in omitted["meta"] and "sparse" in omitted["csr"]
    assert not keys & set(omitted)
    assert not any(k.startswith(("sparse.", "qc.", "nested_t.", "csr.")) for k in keys)  # parts go with them


def test_ls_notes_what_safetensors_cannot_hold(tmp_path):
    from helpers import run_ckptfs

    p = save(tmp_path / "n.pth", {"ok": torch.ones(2), "c128": torch.ones(2, dtype=torch.complex128),
                                  "sp": torch.ones(2, 2).to_sparse(), "epoch": 3})
    r = run_ckptfs("ls", str(p))
    assert r.returncode == 0, r.stderr
    lines = {ln.split()[0]: ln for ln in r.stdout.splitlines()[1:]}
    assert "not in safetensors" not in lines["ok"]
    assert "not in safetensors" in lines["c128"] and "complex128" in lines["c128"]
    assert "not in safetensors" in lines["sp.indices"] and "not in safetensors" in lines["sp.values"]
    r = run_ckptfs("ls", "--json", str(p))
    rows = {d["key"]: d for d in map(json.loads, r.stdout.splitlines())}
    assert "not_in_safetensors" in rows["c128"] and "not_in_safetensors" not in rows["ok"]


def test_hostile_names(tmp_path):
    t = torch.arange(3.0)
    p = save(tmp_path / "h.pth", {"__metadata__": t, "lone\ud800": t + 1, "a\"b\\c\n": t + 2, "\u202eevil": t + 3,
                                  "format": "mine", "ckptfs.omitted": "mine too"})
    out = write_view(p, tmp_path / "h.safetensors")
    with safe_open(out, "pt") as f:
        keys = set(f.keys())
        md = f.metadata()
        assert torch.equal(f.get_tensor("a\"b\\c\n"), t + 2) and torch.equal(f.get_tensor("\u202eevil"), t + 3)
    assert keys == {"a\"b\\c\n", "\u202eevil"}
    omitted = json.loads(md["ckptfs.omitted"])
    assert "__metadata__" in omitted and "lone\ud800" in omitted
    assert md["format"] == "pt" and json.loads(md["format#2"]) == "mine"  # the checkpoint's own keys, renamed
    assert json.loads(md["ckptfs.omitted#2"]) == "mine too"


def test_a_checkpoint_that_is_one_tensor(tmp_path):
    t = torch.randn(3, 4)
    p = save(tmp_path / "one.pth", t)
    out = write_view(p, tmp_path / "one.safetensors")
    assert torch.equal(st.load_file(out)["%root"], t)


# --- several files: HF's layout ----------------------------------------------------------------------------------


def test_shards_follow_the_members_of_a_merged_catalog(tmp_path):
    from helpers import write_hf_bin_shards

    torch.manual_seed(0)
    sd = {f"layers.{i}.weight": torch.randn(64, 32) for i in range(6)} | {"head.bias": torch.randn(7)}
    files = write_hf_bin_shards(tmp_path, sd, max_shard_size=20_000)
    assert len(files) > 2  # the premise: huggingface_hub split it into several shards
    sources = [(name, LocalFile(tmp_path / name)) for name in files]
    cat = Catalog.merge(sources, name=str(tmp_path), flat=True)
    planned, index, omitted = plan_members(cat)
    assert not omitted
    assert [n for n, _ in planned] == [f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i in range(len(files))]
    doc = json.loads(index)
    for (name, f), src in zip(planned, files, strict=True):
        (tmp_path / name).write_bytes(f.content().read())
        shard_ref = torch.load(tmp_path / src, weights_only=True)
        got = st.load_file(tmp_path / name)
        assert set(got) == set(shard_ref)
        for k in got:
            assert torch.equal(got[k], shard_ref[k]) and doc["weight_map"][k] == name
    assert doc["metadata"]["total_size"] == sum(t.numel() * 4 for t in sd.values())


def test_split_by_size_is_huggingface_hubs_split(tmp_path):
    from huggingface_hub import split_torch_state_dict_into_shards

    torch.manual_seed(1)
    sd = {f"w{i}": torch.randn(n) for i, n in enumerate([300, 1200, 50, 800, 800, 20, 3000, 10, 400])}
    p = save(tmp_path / "s.pth", sd)
    with ckptfs.open(p) as ckpt:
        sel = select(ckpt.catalog)
        files, index = plan_by_size(sel, 4000)
    split = split_torch_state_dict_into_shards(sd, filename_pattern="model{suffix}.safetensors", max_shard_size=4000)
    assert {name: sorted(e.name for e in f.tensors) for name, f in files} == \
        {name: sorted(keys) for name, keys in split.filename_to_tensors.items()}
    assert json.loads(index)["weight_map"] == split.tensor_to_filename


# --- .npy ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_DTYPES)
def test_npy_files_are_what_np_save_writes(tmp_path, name):
    t = make(name, (3, 5))
    p = save(tmp_path / "t.pth", {"w": t, "wt": t.t()})
    with ckptfs.open(p) as ckpt:
        files = {k: npy_content(ckpt.reader(k), "little").read() for k in ("w", "wt")}
    for k, ref in (("w", t), ("wt", t.t())):
        ref = ref.contiguous()
        if name in ("bfloat16",) or name.startswith(("float8", "float4")):
            arr = ref.view(torch.uint16 if ref.element_size() == 2 else torch.uint8).numpy()
        elif name == "complex32":
            arr = torch.view_as_real(ref).numpy()  # (real, imaginary) float16 pairs, a last axis of 2
        else:
            arr = ref.numpy()
        expected = tmp_path / f"{k}.npy"
        np.save(expected, arr)
        assert files[k] == expected.read_bytes(), k


def test_safetensors_version_is_the_pinned_one():
    """The byte-for-byte expectations above hold for the writer pinned in setup.cfg's test extra."""
    assert safetensors.__version__ == "0.8.0"
