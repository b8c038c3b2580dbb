"""Every format and tensor kind through a real FUSE mount: file bytes equal torch.load's, composites are
directories of their parts with their metadata in the sidecar."""

from __future__ import annotations

import json
import os
import stat
import sys

import numpy as np
import pytest
import torch

import ckptfs
from craft import LegacyTensor, RebuildV1, throwaway_module, to_big_endian
from helpers import USER_CLASSES, lookup, torch_bytes

DATA = os.path.join(os.path.dirname(__file__), "data")


#: the numpy arrays saved below, by key, with the dtype they were saved in (numpy may unpickle a big-endian
#: array to native order: the file stores it as saved)
NUMPY_SAVED = {"np": np.dtype(">f8")}


def _expected(want, order: str, key: str) -> bytes:
    """The bytes the file stores for torch's ``want``: tensors in the file's byte order (``order``, known
    to the writer), numpy arrays in the dtype they were saved in."""
    if isinstance(want, np.ndarray):
        return np.ascontiguousarray(want, dtype=NUMPY_SAVED[key]).tobytes()
    if want.is_meta:
        return b""
    return torch_bytes(want, order)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("formats")
    out = {}
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    legacy = {"w": base, "t": base.t(), "half": base.half()[1:], "old": LegacyTensor(base[::2]), "v1": RebuildV1(base)}
    torch.save(legacy, d / "legacy.pt", _use_new_zipfile_serialization=False)
    out["legacy"] = (d / "legacy.pt", torch.load(d / "legacy.pt", weights_only=False))
    x = torch.randn(4, 6)
    exotic = {"q": torch.quantize_per_tensor(x, 0.1, 3, torch.quint8),
              "qc": torch.quantize_per_channel(x, torch.rand(4, dtype=torch.float64) + 0.1, torch.zeros(4, dtype=torch.long),
                                               0, torch.qint8),
              "coo": x.relu().to_sparse(), "csr": x.relu().to_sparse_csr(), "bsr": x.relu().to_sparse_bsr((2, 3)),
              "nt": torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)]),
              "meta": torch.empty(3, 4, device="meta"), "conj": torch.randn(3, dtype=torch.complex64).conj(),
              "np": np.arange(6, dtype=">f8").reshape(2, 3)}
    torch.save(exotic, d / "exotic.pt")
    out["exotic"] = (d / "exotic.pt", torch.load(d / "exotic.pt", weights_only=False))
    with throwaway_module("ckptfs_test_userclasses", USER_CLASSES, d) as mod:
        opt = torch.optim.Adam([torch.nn.Parameter(torch.randn(3))])
        opt.step()
        lightning = {"state_dict": {"w": torch.randn(2, 2)}, "optimizer_states": [opt.state_dict()],
                     "hyper_parameters": mod.AttributeDict(cfg=mod.DictConfig({"scale": torch.tensor([1.5])})),
                     "epoch": 2}
        torch.save(lightning, d / "lightning.ckpt")
        out["lightning"] = (d / "lightning.ckpt", torch.load(d / "lightning.ckpt", weights_only=False))
    torch.save({"w": base.double(), "v": base.t()[2:]}, d / "little.pt")
    to_big_endian(d / "little.pt", d / "big.pt", {"0": 8, "1": 4})
    out["big"] = (d / "big.pt", torch.load(d / "big.pt", weights_only=True))
    ts = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)).eval())
    torch.jit.save(ts, d / "scripted.pt")
    out["torchscript"] = (d / "scripted.pt", torch.jit.load(d / "scripted.pt"))
    for version in ("torch-1.13.0a0", "torch-2.14.1"):
        for name in ("legacy.pt", "training.pt"):
            p = os.path.join(DATA, version, name)
            out[f"{version}/{name}"] = (p, torch.load(p, weights_only=True))
    return out


CASES = ["legacy", "exotic", "lightning", "big", "torchscript", "torch-1.13.0a0/legacy.pt",
         "torch-1.13.0a0/training.pt", "torch-2.14.1/legacy.pt", "torch-2.14.1/training.pt"]


@pytest.mark.mount
@pytest.mark.parametrize("case", CASES)
def test_through_the_mount(files, module_mount, case):
    path, ref = files[case]
    m = module_mount(path)
    entries = m.index()["entries"]
    n_tensors = n_composite = 0
    order = "big" if case == "big" else sys.byteorder  # big.pt is rewritten as a big-endian machine writes
    with ckptfs.open(path) as ckpt:
        for e in entries:
            f = m.path / e["path"]
            if e["kind"] == "tensor":
                meta = ckpt.meta(e["key"])
                want = _expected(lookup(ref, meta.path), order, e["key"])
                st = os.stat(f)
                assert stat.S_ISREG(st.st_mode) and st.st_size == len(want), e["key"]
                assert f.read_bytes() == want == ckpt.read(e["key"]), e["key"]
                sidecar = json.loads((m.path / e["sidecar"]).read_bytes())
                assert sidecar["dtype"] == meta.dtype and sidecar["shape"] == list(meta.shape)
                n_tensors += 1
            elif e["kind"] == "composite":
                assert f.is_dir(), e["key"]
                sidecar = json.loads((m.path / e["sidecar"]).read_bytes())
                meta = ckpt.meta(e["key"])
                assert sidecar["tensor_kind"] == meta.tensor_kind and sidecar["shape"] == list(meta.shape)
                parts = {os.path.basename(x["path"]) for x in entries if x["path"].startswith(e["path"] + "/")
                         and "/" not in x["path"][len(e["path"]) + 1 :]}
                listed = set(os.listdir(f))
                assert len(parts) == meta.length and parts <= listed, e["key"]  # the parts (and their sidecars)
                n_composite += 1
    assert n_tensors > 0
    if case == "exotic":
        assert n_composite == 5  # qc, coo, csr, bsr, nt
        by_key = {e["key"]: e for e in entries}
        meta_sidecar = json.loads((m.path / by_key["meta"]["sidecar"]).read_bytes())
        assert (m.path / "meta").stat().st_size == 0  # a meta tensor: no data, and its sidecar says so
        assert meta_sidecar["tensor_kind"] == "meta" and "no data" in meta_sidecar["extra"]["data"]
        coo = json.loads((m.path / by_key["coo"]["sidecar"]).read_bytes())
        assert coo["extra"]["layout"] == "sparse_coo" and coo["shape"] == [4, 6]  # the dense shape
        assert np.array_equal(ckptfs.memmap(m.path / "np"), ref["np"])


@pytest.mark.mount
def test_torchscript_sources_under_reserved_dir(files, module_mount):
    path, _ref = files["torchscript"]
    m = module_mount(path)
    with ckptfs.open(path) as ckpt:
        sources = ckpt.code_files()
    assert sources
    code = m.path / ".ckptfs" / "code"
    found = {str(p.relative_to(code)): p for p in code.rglob("*") if p.is_file()}
    assert set(found) == set(sources)
    for rel, p in found.items():
        st = p.stat()
        assert stat.S_IMODE(st.st_mode) == 0o444 and st.st_size == len(sources[rel])
        assert p.read_bytes() == sources[rel]
    with pytest.raises(OSError):
        (code / "new.py").write_text("x")
