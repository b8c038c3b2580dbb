"""Checkpoints written by other torch versions (tests/data/torch-*/, made by scripts/make_fixtures.py with
Debian's torch 1.13.1, torch 2.13 and torch 2.14.1): every tensor equals what the writing torch recorded
in the manifest, and what this torch's torch.load returns."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

import ckptfs
from helpers import lookup, torch_bytes

DATA = Path(__file__).parent / "data"
SETS = sorted(p for p in DATA.glob("torch-*") if (p / "manifest.json").exists())
CASES = [(s, name) for s in SETS for name in json.loads((s / "manifest.json").read_text())["files"]]


def _path(p: list) -> tuple:
    return tuple(v for _kind, v in p)


def test_fixture_sets_cover_several_writers():
    versions = {json.loads((s / "manifest.json").read_text())["torch"].split("+")[0] for s in SETS}
    assert {"1.13.0a0", "2.13.0", "2.14.1"} <= versions, versions  # 1.13.0a0: Debian's 1.13.1 build


@pytest.mark.parametrize("fixture,name", CASES, ids=[f"{s.name}/{n}" for s, n in CASES])
def test_every_tensor_matches_the_writer(fixture, name):
    spec = json.loads((fixture / "manifest.json").read_text())["files"][name]
    path = fixture / name
    with ckptfs.open(path) as ckpt:
        assert ckpt.format == spec["format"]
        assert spec["tensors"]
        for e in spec["tensors"]:
            row = ckpt.index.find_path(_path(e["path"]))
            assert row is not None, e["path"]
            key = ckpt.index.keys[row]
            m = ckpt.meta(key)
            assert m.error is None, (key, m.error)
            assert m.dtype == e["dtype"] and list(m.shape) == e["shape"], key
            if e.get("composite"):
                assert m.kind == "composite", key
                continue
            data = ckpt.read(key)
            assert len(data) == e["nbytes"] == m.nbytes, key
            assert hashlib.sha256(data).hexdigest() == e["sha256"], key
            if "qscale" in e:
                assert (m.extra["scale"], m.extra["zero_point"]) == (e["qscale"], e["qzero_point"])
            if e["device"] == "meta":
                assert m.tensor_kind == "meta" and m.location == "meta"


@pytest.mark.parametrize("fixture,name", CASES, ids=[f"{s.name}/{n}" for s, n in CASES])
def test_against_this_torch(fixture, name):
    """torch 2.13's own loader agrees on every file of every writer (its tensors, as torch tensors)."""
    path = fixture / name
    manifest = json.loads((fixture / "manifest.json").read_text())["files"][name]
    if name == "scripted.pt":
        ref = torch.jit.load(path, map_location="cpu")
    elif fixture.name.startswith("torch-1.13") and any(e["path"] == [["s", "csr"]] for e in manifest["tensors"]):
        # torch 1.13 wrote CSR tensors with _rebuild_sparse_csr_tensor, which torch 2 no longer has: it cannot
        # load the file at all (weights_only or not); ckptfs serves it (checked against the manifest above)
        with pytest.raises(Exception, match="_rebuild_sparse_csr_tensor"):
            torch.load(path, weights_only=True, map_location="cpu")
        with pytest.raises(AttributeError, match="_rebuild_sparse_csr_tensor"):
            torch.load(path, weights_only=False, map_location="cpu")
        with ckptfs.open(path) as ckpt:
            csr = ckpt.tensor("csr")
            assert csr.layout == torch.sparse_csr and ckpt.meta("csr").extra["layout"] == "sparse_csr"
            assert torch.equal(csr.to_dense(), ckpt.tensor("coo").to_dense())  # both made from one dense x
        return
    else:
        ref = torch.load(path, weights_only=True, map_location="cpu")
    with ckptfs.open(path) as ckpt:
        n = 0
        for i in ckpt.index.order():
            if ckpt.index.kinds[i] not in ("tensor", "composite"):
                continue
            key = ckpt.index.keys[i]
            want = lookup(ref, ckpt.index.path(i))
            got = ckpt.tensor(key)
            if want.is_quantized:
                assert torch.equal(got.int_repr(), want.int_repr()) and got.qscheme() == want.qscheme(), key
            elif want.is_meta:
                assert got.is_meta and got.shape == want.shape, key
            elif want.layout != torch.strided:
                assert got.layout == want.layout and torch.equal(got.to_dense(), want.to_dense()), key
            elif getattr(want, "is_nested", False):
                assert all(torch.equal(a, b) for a, b in zip(got.unbind(), want.unbind())), key
            else:
                assert torch.equal(got, want.detach()), key
                assert ckpt.read(key) == torch_bytes(want), key
            n += 1
        assert n > 0


def test_writer_hints():
    """What `ckptfs info` says about the writer follows the records each torch writes."""
    for s in SETS:
        version = json.loads((s / "manifest.json").read_text())["torch"]
        with ckptfs.open(s / "state_dict.pt") as ckpt:
            hint = ckpt.info()["torch_version_hint"]
            info = ckpt.info()["container"]
        if version.startswith("1.13"):
            assert "byteorder" not in info or not info["byteorder_record"]
            assert hint.startswith("torch 1.6 - 2.0"), hint
        else:
            assert info[".format_version"] == "1" and info[".storage_alignment"] == "64"
            assert hint.startswith("torch >= 2.4"), hint
        with ckptfs.open(s / "legacy.pt") as ckpt:
            assert ckpt.format == "legacy" and "1.6" in ckpt.info()["torch_version_hint"]
        with ckptfs.open(s / "scripted.pt") as ckpt:
            assert ckpt.format == "torchscript" and ckpt.code_files()
