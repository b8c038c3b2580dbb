"""Directories and safetensors files through a real FUSE mount: the tree of every key, sidecars naming the file
each entry comes from and the chunks a DCP tensor was saved in, np.memmap of assembled tensors, the model
directory's other files byte-exact under /.ckptfs/files/ (and at the root, by symlink)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import MODEL_FILES, lookup, torch_bytes
from safetensors import safe_open
from safetensors.torch import save_file
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

import ckptfs

pytestmark = pytest.mark.mount


def sidecar(p: Path) -> dict:
    return json.loads(Path(str(p) + ".json").read_bytes())


def test_sharded_safetensors_directory(hf_sharded: dict[str, Path], module_mount) -> None:
    d = hf_sharded["safetensors"]
    m = module_mount(d)
    index = json.loads(next(d.glob("*.index.json")).read_text())["weight_map"]
    for key, shard in index.items():
        with safe_open(d / shard, framework="pt") as f:
            want = f.get_tensor(key)
        f_path = m.path / key.replace(".", "/")
        assert f_path.read_bytes() == torch_bytes(want), key
        sc = sidecar(f_path)
        assert sc["key"] == key and sc["member"] == shard and sc["shape"] == list(want.shape)
        assert sc["extra"]["safetensors"]["dtype"] in ("F32", "BF16", "F16", "F64", "I64")
    arr = ckptfs.memmap(m.path / "model" / "embed_tokens" / "weight")
    with safe_open(d / index["model.embed_tokens.weight"], framework="pt") as f:
        assert np.array_equal(arr, f.get_tensor("model.embed_tokens.weight").numpy())
    # the other files: byte-exact, read-only, under /.ckptfs/files/, and at the root by symlink
    files = m.path / ".ckptfs" / "files"
    for name, data in MODEL_FILES.items():
        st = (files / name).stat()
        assert stat.S_IMODE(st.st_mode) == 0o444 and st.st_size == len(data)
        assert (files / name).read_bytes() == data
        link = m.path / name
        assert link.is_symlink() and os.readlink(link) == f".ckptfs/files/{name}" and link.read_bytes() == data
    assert not (m.path / "tokenizer").exists()  # names with no dot never stand at the root as files
    doc = m.index()
    assert doc["checkpoint_format"] == "hf-sharded"
    assert {f["path"] for f in doc["files"]} == set(MODEL_FILES) | {"model.safetensors.index.json"}
    with pytest.raises(OSError):
        (files / "config.json").write_text("{}")


def test_dcp_directory_with_chunked_tensors(dcp_checkpoints: Path, module_mount, tmp_path: Path) -> None:
    d = dcp_checkpoints / "w4z"
    out = tmp_path / "ref.pt"
    dcp_to_torch_save(d, out)
    want = torch.load(out, weights_only=False)
    md = FileSystemReader(d).read_metadata()
    m = module_mount(d)
    for key in ("model.rows", "model.cols", "model.grid", "model.uneven", "model.few", "model.cube", "model.rep",
                "optim.state.rows.exp_avg"):
        full = lookup(want, tuple(key.split(".")))
        f_path = m.path / key.replace(".", "/")
        assert f_path.read_bytes() == torch_bytes(full), key
        sc = sidecar(f_path)
        assert sc["shape"] == list(full.shape) and sc["served"] is True
        assert [c["offsets"] for c in sc["extra"]["chunks"]] == \
            [list(c.offsets) for c in md.state_dict_metadata[key].chunks]
        if full.dtype != torch.bfloat16:
            assert np.array_equal(ckptfs.memmap(f_path), full.numpy()), key
    # np.memmap of a Shard(1) tensor (assembled by a gather on each read), and reads in odd pieces
    cols = lookup(want, ("model", "cols"))
    mm = ckptfs.memmap(m.path / "model" / "cols")
    assert mm.shape == (6, 8) and np.array_equal(mm.astype(np.float32), cols.float().numpy())
    data = torch_bytes(cols)
    fd = os.open(m.path / "model" / "cols", os.O_RDONLY)
    try:
        got = b"".join(os.pread(fd, 7, off) for off in range(0, len(data), 7))
    finally:
        os.close(fd)
    assert got == data
    assert (m.path / "optim" / "param_groups" / "0" / "lr").read_bytes() == b"0.01"
    assert (m.path / "step").read_bytes() == b"11"


def test_safetensors_file_and_unrelated_checkpoints(tmp_path: Path, module_mount) -> None:
    st_file = tmp_path / "w.safetensors"
    t = {"a.b": torch.randn(3, 4), "c": torch.arange(5, dtype=torch.int16)}
    save_file(t, st_file, metadata={"format": "pt"})
    m = module_mount(st_file)
    assert (m.path / "a" / "b").read_bytes() == torch_bytes(t["a.b"])
    assert np.array_equal(ckptfs.memmap(m.path / "c"), t["c"].numpy())
    assert m.index()["checkpoint_format"] == "safetensors"

    runs = tmp_path / "runs"
    runs.mkdir()
    for i in (1, 2):
        torch.save({"model": {"w": torch.full((2, 2), float(i))}, "epoch": i}, runs / f"epoch_{i}.pt")
    (runs / "notes.txt").write_text("notes")
    m2 = module_mount(runs)
    assert sorted(os.listdir(m2.path)) == [".ckptfs", "epoch_1", "epoch_2", "notes.txt"]
    assert (m2.path / "epoch_2" / "epoch").read_bytes() == b"2"
    assert (m2.path / "epoch_1" / "model" / "w").read_bytes() == torch_bytes(torch.full((2, 2), 1.0))
    assert sidecar(m2.path / "epoch_1" / "model" / "w")["member"] == "epoch_1.pt"
    assert (m2.path / "notes.txt").read_text() == "notes"
