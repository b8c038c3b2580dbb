"""A directory of unrelated checkpoints (epoch_1.pt, epoch_2.pt ...) and of checkpoint directories: each a
subtree named by its file, every tensor as torch.load gives it, the other files byte-exact, a damaged file
left out on its own."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from helpers import lookup, run_ckptfs, torch_bytes
from safetensors import safe_open
from safetensors.torch import save_file

import ckptfs
from ckptfs.errors import FormatError
from ckptfs.model.directory import member_key


def training_checkpoint(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"model": {"fc.weight": torch.randn(4, 3, generator=g), "fc.bias": torch.randn(4, generator=g)},
            "optimizer": {"state": {0: {"step": torch.tensor(float(seed))}}, "param_groups": [{"lr": 0.1}]},
            "epoch": seed}


@pytest.fixture()
def runs(tmp_path: Path) -> Path:
    d = tmp_path / "runs"
    d.mkdir()
    for i in (1, 2):
        torch.save(training_checkpoint(i), d / f"epoch_{i}.pt")
    torch.save({"w": torch.arange(3)}, d / "my.model.v1.pth", _use_new_zipfile_serialization=False)
    save_file({"emb": torch.ones(2, 2)}, d / "ema.safetensors")
    (d / "notes.txt").write_text("lr 0.1\n")
    (d / "logs").mkdir()
    (d / "logs" / "train.log").write_bytes(b"step 1\nstep 2\n")
    return d


def test_each_file_is_a_subtree_named_by_its_file(runs: Path) -> None:
    with ckptfs.open(runs) as ckpt:
        assert ckpt.format == "directory"
        for name in ("epoch_1.pt", "epoch_2.pt", "my.model.v1.pth"):
            want = torch.load(runs / name, weights_only=True)
            stem = member_key(name)
            for path in _tensor_paths(want):
                row = ckpt.row((stem,) + path)
                assert ckpt.catalog.data(row).read() == torch_bytes(lookup(want, path)), (name, path)
        assert ckpt.value(("epoch_2", "epoch")) == 2
        assert ckpt.meta("epoch_1.model.fc.weight").shape == (4, 3)  # a file's keys under its stem
        with safe_open(runs / "ema.safetensors", framework="pt") as f:
            assert ckpt.read("ema.emb") == torch_bytes(f.get_tensor("emb"))
        # "my.model.v1.pth" has dots of its own: its stem splits like any key (docs/layout.md)
        assert ckpt.index.path(ckpt.row(("my.model.v1", "w"))) == ("my.model.v1", "w")
        assert ckpt.other_files() == {"notes.txt": 7, "logs/train.log": 14}
        assert ckpt.read_other_file("logs/train.log") == b"step 1\nstep 2\n"
        assert ckpt.read_other_file("notes.txt", 3, 3) == b"0.1"
        info = ckpt.info()
        assert sorted(m["name"] for m in info["members"]) == ["ema.safetensors", "epoch_1.pt", "epoch_2.pt",
                                                               "my.model.v1.pth"]


def _tensor_paths(obj: object, path: tuple = ()) -> list[tuple]:
    if isinstance(obj, torch.Tensor):
        return [path]
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in _tensor_paths(v, path + (k,))]
    if isinstance(obj, (list, tuple)):
        return [p for i, v in enumerate(obj) for p in _tensor_paths(v, path + (i,))]
    return []


def test_a_damaged_file_is_left_out_alone(runs: Path) -> None:
    data = (runs / "epoch_2.pt").read_bytes()
    (runs / "epoch_2.pt").write_bytes(data[: len(data) // 2])
    (runs / "weights.bin").write_bytes(b"not a checkpoint at all")
    with ckptfs.open(runs) as ckpt:
        problems = dict(ckpt.catalog.problems)
        assert set(problems) == {"epoch_2.pt", "weights.bin"}
        assert "end-of-central-directory" in problems["epoch_2.pt"].reason
        assert ckpt.value(("epoch_1", "epoch")) == 1
        assert ("epoch_2", "epoch") not in ckpt
        assert ckpt.read_other_file("epoch_2.pt") == data[: len(data) // 2]  # still reachable, byte-exact
    r = run_ckptfs("info", str(runs))
    assert r.returncode == 0 and "left out   epoch_2.pt: " in r.stdout and "weights.bin" in r.stdout, r.stderr
    r = run_ckptfs("ls", str(runs))
    assert r.returncode == 0 and "epoch_1.model.fc.weight" in r.stdout and "left out epoch_2.pt: " in r.stderr
    r = run_ckptfs("check", str(runs))  # the other files compared with torch.load; the damaged one a failure
    assert r.returncode == 1 and "FAIL epoch_2.pt: left out: " in r.stdout, r.stdout + r.stderr
    assert "tensors identical, 2 mismatched" in r.stdout


def test_info_keeps_long_member_names_apart_from_their_format(tmp_path: Path) -> None:
    """A member path longer than the name column (a model directory inside a runs directory) is still
    followed by a space before its format."""
    long = tmp_path / "checkpoint-12000-of-a-long-run" / "model-00001-of-00002.safetensors"
    long.parent.mkdir()
    save_file({"w": torch.ones(2)}, long)
    torch.save({"x": torch.zeros(1)}, tmp_path / "epoch_1.pt")
    r = run_ckptfs("info", str(tmp_path))
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if "model-00001-of-00002.safetensors" in x)
    assert line.split()[:2] == ["checkpoint-12000-of-a-long-run/model-00001-of-00002.safetensors", "safetensors"]
    assert next(x for x in r.stdout.splitlines() if "epoch_1.pt" in x).split()[:2] == ["epoch_1.pt", "zip"]


def test_one_checkpoint_file_is_the_tree_itself(tmp_path: Path) -> None:
    torch.save(training_checkpoint(5), tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text("{}")
    with ckptfs.open(tmp_path) as ckpt:
        assert ckpt.value("epoch") == 5 and ckpt.meta("model.fc.bias").shape == (4,)
        assert ckpt.other_files() == {"config.json": 2}


def test_subdirectories_of_checkpoints(runs: Path, dcp_checkpoints: Path) -> None:
    """Subdirectories holding checkpoints (DCP steps, a sharded model) are subtrees named by the directory."""
    shutil.copytree(dcp_checkpoints / "w2", runs / "step_100")
    shutil.copytree(dcp_checkpoints / "w1", runs / "dcp" / "step_200")
    with ckptfs.open(runs) as ckpt:
        assert ckpt.value(("step_100", "meta", "epoch")) == 2
        assert ckpt.meta("step_100.rows").shape == (8, 6)
        assert ckpt.value(("dcp", "step_200", "epoch")) == 3
        assert "step_100/" in ckpt.info()["layout"]["members"]


def test_symlinks_out_of_the_directory_are_never_followed(runs: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.pt"
    torch.save({"key": torch.ones(3)}, secret)
    (tmp_path / "secret.txt").write_text("password")
    os.symlink(secret, runs / "linked.pt")
    os.symlink(tmp_path / "secret.txt", runs / "linked.txt")
    os.symlink(tmp_path, runs / "up")
    with ckptfs.open(runs) as ckpt:
        problems = {name: e.reason for name, e in ckpt.catalog.problems}
        assert problems == {name: "refused: a symlink leads outside the directory"
                            for name in ("linked.pt", "linked.txt", "up")}
        assert "linked" not in ckpt and "linked.txt" not in ckpt.other_files()
        assert not any(k.startswith("up.") for k in ckpt.keys())


def test_symlink_loops_are_refused(runs: Path) -> None:
    """Symlinks back to a directory that holds them (to ``.``, to a parent, two directories linking each other)
    are refused, each once: followed, six links to ``.`` took over 60 s (6^8 paths) and three indexed 9,841
    copies of each file. Links to a sibling directory (``latest -> step_100``) are still followed."""
    (runs / "a").mkdir()
    (runs / "b").mkdir()
    torch.save({"w": torch.ones(2)}, runs / "a" / "x.pt")
    for i in range(6):
        os.symlink(".", runs / f"self{i}")
    os.symlink("..", runs / "logs" / "up")
    os.symlink("../b", runs / "a" / "to_b")
    os.symlink("../a", runs / "b" / "to_a")
    os.symlink("a", runs / "latest")
    with ckptfs.open(runs) as ckpt:
        problems = {name: e.reason for name, e in ckpt.catalog.problems}
        loop = "refused: a symlink loop (it leads back to a directory that holds it)"
        assert problems == {**{f"self{i}": loop for i in range(6)}, "logs/up": loop, "a/to_b/to_a": loop,
                            "b/to_a/to_b": loop, "latest/to_b/to_a": loop}
        assert {"a.w", "latest.w", "b.to_a.w"} <= set(ckpt.keys())
        assert not any(k.startswith("self") for k in ckpt.keys())


def test_nothing_to_open(tmp_path: Path) -> None:
    (tmp_path / "readme.md").write_text("hi")
    with pytest.raises(FormatError, match="no checkpoint in this directory"):
        ckptfs.open(tmp_path)
    r = run_ckptfs("ls", str(tmp_path))
    assert r.returncode == 2 and "no checkpoint in this directory" in r.stderr


def test_member_keys() -> None:
    assert member_key("epoch_1.pt") == "epoch_1"
    assert member_key("model_best.pth.tar") == "model_best"
    assert member_key("model-00001-of-00002.safetensors") == "model-00001-of-00002"
    assert member_key("my.model.v1.ckpt") == "my.model.v1"
    assert member_key(".pt") == ".pt"
