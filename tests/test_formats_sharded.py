"""Hugging Face sharded checkpoints (huggingface_hub's ``save_torch_state_dict``, transformers'
``save_pretrained``): one tree of every key, each key's bytes as the writer's own loader gives them, and the
index cross-checked against the shards (every inconsistency a one-line error naming files and key)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from helpers import MODEL_FILES, run_ckptfs, sharded_reference, torch_bytes
from safetensors import safe_open
from safetensors.torch import save_file

import ckptfs
from ckptfs.errors import FormatError


@pytest.mark.parametrize("kind", ["safetensors", "bin"])
def test_one_tree_of_every_shard(hf_sharded: dict[str, Path], kind: str) -> None:
    d = hf_sharded[kind]
    want = sharded_reference(d)
    shards = sorted(p.name for p in d.iterdir() if p.suffix in (".safetensors", ".bin"))
    assert len(shards) >= 5, shards  # the fixture is sharded for real
    with ckptfs.open(d) as ckpt:
        assert ckpt.format == "hf-sharded"
        assert sorted(ckpt.tensor_keys()) == sorted(want)
        for k, t in want.items():
            m = ckpt.meta(k)
            assert (m.dtype, m.shape) == (str(t.dtype).removeprefix("torch."), tuple(t.shape)), k
            assert ckpt.read(k) == torch_bytes(t), k
        info = ckpt.info()
        assert info["layout"]["shards"] == len(shards) and info["layout"]["index_kind"] == kind
        assert sorted(m["name"] for m in info["members"]) == shards
        # the model directory's other files: byte-exact, the index among them
        files = ckpt.other_files()
        assert set(MODEL_FILES) | {next(d.glob("*.index.json")).name} == set(files)
        for name, data in MODEL_FILES.items():
            assert files[name] == len(data) and ckpt.read_other_file(name) == data
        if kind == "safetensors":
            with safe_open(d / shards[0], framework="pt") as f:
                assert ckpt.metadata() == f.metadata()


@pytest.mark.parametrize("kind", ["safetensors", "bin"])
def test_load_and_check_of_a_sharded_directory(hf_sharded: dict[str, Path], kind: str) -> None:
    d = hf_sharded[kind]
    want = sharded_reference(d)
    sd = ckptfs.load(d)
    assert sorted(sd) == sorted(want)
    for k, t in want.items():
        assert sd[k].dtype == t.dtype and torch_bytes(sd[k]) == torch_bytes(t), k
    r = run_ckptfs("check", str(d))
    assert r.returncode == 0 and f"{len(want)} tensors identical, 0 mismatched" in r.stdout, r.stdout + r.stderr
    r = run_ckptfs("info", str(d))
    assert r.returncode == 0 and "format      hf-sharded" in r.stdout and f"{kind} shards" in r.stdout


def test_transformers_save_pretrained(tmp_path: Path) -> None:
    """A real model directory: a tiny Llama built from its config (offline) and saved by transformers."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path, max_shard_size="3KB")
    want = sharded_reference(tmp_path)
    assert len(list(tmp_path.glob("*.safetensors"))) > 3
    with ckptfs.open(tmp_path) as ckpt:
        assert sorted(ckpt.tensor_keys()) == sorted(want)
        for k, t in want.items():
            assert ckpt.read(k) == torch_bytes(t), k
        assert json.loads(ckpt.read_other_file("config.json"))["hidden_size"] == 16


# --- the index cross-checked ----------------------------------------------------------------------------------


def copy(src: Path, dst: Path) -> tuple[Path, dict]:
    shutil.copytree(src, dst)
    index = next(dst.glob("*.index.json"))
    return index, json.loads(index.read_text())


def save_index(index: Path, doc: dict) -> None:
    index.write_text(json.dumps(doc, indent=2))


def test_a_missing_shard_is_named(hf_sharded: dict[str, Path], tmp_path: Path) -> None:
    index, doc = copy(hf_sharded["safetensors"], tmp_path / "m")
    key, shard = next(iter(doc["weight_map"].items()))
    (index.parent / shard).unlink()
    with pytest.raises(FormatError) as e:
        ckptfs.open(index.parent)
    msg = str(e.value)
    assert index.name in msg and f"the shard {shard} that the index maps keys to is missing" in msg


def test_a_key_mapped_to_a_shard_that_lacks_it(hf_sharded: dict[str, Path], tmp_path: Path) -> None:
    index, doc = copy(hf_sharded["bin"], tmp_path / "m")
    wm = doc["weight_map"]
    key = next(k for k in wm if sum(s == wm[k] for s in wm.values()) > 1)  # its shard stays named
    wrong = next(s for s in wm.values() if s != wm[key])
    right = wm[key]
    wm[key] = wrong
    save_index(index, doc)
    with pytest.raises(FormatError) as e:
        ckptfs.open(index.parent)
    assert f"{index.name}: {key}: " in str(e.value) and f"is mapped to {wrong} but is in {right}" in str(e.value)


def test_a_key_in_two_shards(hf_sharded: dict[str, Path], tmp_path: Path) -> None:
    index, doc = copy(hf_sharded["safetensors"], tmp_path / "m")
    key, first = next(iter(doc["weight_map"].items()))
    save_file({key: torch.zeros(2), "extra.weight": torch.ones(2)}, index.parent / "model-extra.safetensors")
    doc["weight_map"]["extra.weight"] = "model-extra.safetensors"
    save_index(index, doc)
    with pytest.raises(FormatError) as e:
        ckptfs.open(index.parent)
    assert f"is in {first} and in model-extra.safetensors" in str(e.value) and key in str(e.value)


def test_a_shard_key_the_index_does_not_map(hf_sharded: dict[str, Path], tmp_path: Path) -> None:
    index, doc = copy(hf_sharded["bin"], tmp_path / "m")
    key, shard = sorted(doc["weight_map"].items())[-1]
    keep = {k: s for k, s in doc["weight_map"].items() if s == shard and k != key}
    assert keep, "the shard must keep a mapped key (else it is no longer named)"
    del doc["weight_map"][key]
    save_index(index, doc)
    with pytest.raises(FormatError) as e:
        ckptfs.open(index.parent)
    assert f": {key}: " in str(e.value) and f"is a tensor of {shard} that the index does not map" in str(e.value)


@pytest.mark.parametrize("path, said", [
    ("../outside.safetensors", "climbs out of the directory"),
    ("/etc/outside.safetensors", "is absolute"),
    ("sub\\..\\..\\x.safetensors", "backslash"),
    ("model.bin", "does not end in .safetensors"),
    ("", "empty"),
], ids=["dotdot", "absolute", "backslash", "extension", "empty"])
def test_shard_paths_that_leave_the_directory_are_refused(hf_sharded: dict[str, Path], tmp_path: Path,
                                                          path: str, said: str) -> None:
    index, doc = copy(hf_sharded["safetensors"], tmp_path / "m")
    key = next(iter(doc["weight_map"]))
    shutil.copy(next(index.parent.glob("*.safetensors")), tmp_path / "outside.safetensors")
    doc["weight_map"][key] = path
    save_index(index, doc)
    with pytest.raises(FormatError) as e:
        ckptfs.open(index.parent)
    assert said in str(e.value) and index.name in str(e.value)


def test_a_shard_symlinked_out_of_the_directory_is_refused(hf_sharded: dict[str, Path], tmp_path: Path) -> None:
    index, doc = copy(hf_sharded["safetensors"], tmp_path / "m")
    shard = sorted(set(doc["weight_map"].values()))[0]
    outside = tmp_path / "elsewhere.safetensors"
    (index.parent / shard).rename(outside)
    os.symlink(outside, index.parent / shard)
    with pytest.raises(FormatError) as e:
        ckptfs.open(index.parent)
    assert f"the shard {shard}: a symlink leads outside the directory" in str(e.value)


def test_a_shard_in_a_subdirectory_symlinked_out_is_refused_not_missing(tmp_path: Path) -> None:
    d, outside = tmp_path / "m", tmp_path / "outside"
    d.mkdir()
    outside.mkdir()
    save_file({"a": torch.ones(2)}, outside / "s1.safetensors")
    (d / "sub").symlink_to(outside)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "sub/s1.safetensors"}}))
    with pytest.raises(FormatError) as e:
        ckptfs.open(d)
    assert "the shard sub/s1.safetensors that the index maps keys to is refused: a symlink leads outside" \
        in str(e.value)
    (d / "sub").unlink()
    with pytest.raises(FormatError, match="the shard sub/s1.safetensors that the index maps keys to is missing"):
        ckptfs.open(d)


def test_a_safetensors_index_naming_a_pickle_is_refused(hf_sharded: dict[str, Path], tmp_path: Path) -> None:
    """A shard named .safetensors that is a torch.save pickle (an index's extension confusion)."""
    index, doc = copy(hf_sharded["safetensors"], tmp_path / "m")
    shard = sorted(set(doc["weight_map"].values()))[0]
    with safe_open(index.parent / shard, framework="pt") as f:
        tensors = {k: f.get_tensor(k).clone() for k in f.keys()}  # (not views of the file rewritten below)
    (index.parent / shard).unlink()
    torch.save(tensors, index.parent / shard)
    with pytest.raises(FormatError, match=f"shard {shard} is a zip file, not what a safetensors index names"):
        ckptfs.open(index.parent)


def test_a_key_given_twice_in_the_index_is_refused(hf_sharded: dict[str, Path], tmp_path: Path) -> None:
    index, doc = copy(hf_sharded["bin"], tmp_path / "m")
    key, shard = next(iter(doc["weight_map"].items()))
    text = index.read_text().replace('"weight_map": {', f'"weight_map": {{\n    "{key}": "{shard}",', 1)
    index.write_text(text)
    with pytest.raises(FormatError, match=f"'{key}' appears twice"):
        ckptfs.open(index.parent)


def test_both_index_kinds_the_safetensors_one_wins(hf_sharded: dict[str, Path], tmp_path: Path) -> None:
    d = tmp_path / "both"
    shutil.copytree(hf_sharded["safetensors"], d)
    for p in hf_sharded["bin"].iterdir():
        if not (d / p.name).exists():
            shutil.copy(p, d / p.name)
    with ckptfs.open(d) as ckpt:
        assert ckpt.info()["layout"]["index_kind"] == "safetensors"
        assert all(m.container.kind == "safetensors" for m in ckpt.catalog.members)
        assert "pytorch_model.bin.index.json" in ckpt.other_files()
        assert any(name.endswith(".bin") for name in ckpt.other_files())


def test_a_hugging_face_cache_snapshot(hf_sharded: dict[str, Path], tmp_path: Path) -> None:
    """The hub cache's layout: snapshot files are symlinks to ../../blobs/<hash> (outside the snapshot,
    inside the repository): followed, and only those."""
    repo = tmp_path / "hub" / "models--org--tiny"
    snap = repo / "snapshots" / "0123abcd"
    blobs = repo / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for i, p in enumerate(sorted(hf_sharded["safetensors"].iterdir())):
        blob = blobs / f"{i:064x}"
        shutil.copy(p, blob)
        os.symlink(os.path.relpath(blob, snap), snap / p.name)
    want = sharded_reference(hf_sharded["safetensors"])
    with ckptfs.open(snap) as ckpt:
        assert sorted(ckpt.tensor_keys()) == sorted(want)
        k = next(iter(want))
        assert ckpt.read(k) == torch_bytes(want[k])
        assert ckpt.read_other_file("config.json") == MODEL_FILES["config.json"]
