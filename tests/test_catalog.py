"""The catalog: one key space over several files, with its written collision rule (model/catalog.py)."""

from __future__ import annotations

import pytest
import torch

import ckptfs
from ckptfs.errors import FormatError
from ckptfs.model.catalog import Catalog
from ckptfs.source import LocalFile
from helpers import torch_bytes


def _shards(tmp_path, parts: list[dict]) -> list[tuple[str, LocalFile]]:
    out = []
    for i, sd in enumerate(parts):
        p = tmp_path / f"shard-{i}.bin"
        torch.save(sd, p)
        out.append((p.name, LocalFile(p)))
    return out


def test_flat_catalog_unites_shards_and_reads_each_from_its_own_file(tmp_path):
    # storage keys are "0", "1", ... in every file: each tensor must still read its own file's record
    a = {"enc.w": torch.randn(8, 4), "enc.b": torch.randn(4)}
    b = {"dec.w": torch.randn(4, 8), "dec.b": torch.arange(8, dtype=torch.int64)}
    c = {"head": torch.ones(3, dtype=torch.bfloat16), "step": 11}
    sources = _shards(tmp_path, [a, b, c])
    refs = [torch.load(tmp_path / name, weights_only=True) for name, _ in sources]
    cat = Catalog.merge(sources, name=str(tmp_path), flat=True)
    with ckptfs.Checkpoint(cat) as ckpt:
        assert ckpt.keys() == ["enc.w", "enc.b", "dec.w", "dec.b", "head", "step"]
        for ref in refs:
            for key, want in ref.items():
                if isinstance(want, torch.Tensor):
                    assert ckpt.read(key) == torch_bytes(want), key
                    assert ckpt.meta(key).shape == tuple(want.shape)
                else:
                    assert ckpt.value(key) == want
        assert [cat.member_of(ckpt.row(k)).name for k in ("enc.w", "dec.b", "head")] == \
               ["shard-0.bin", "shard-1.bin", "shard-2.bin"]
        assert cat.conflicts == []
        assert torch.equal(ckptfs.Checkpoint(cat).tensor("dec.b"), b["dec.b"])
        assert ckpt.meta("dec.w").record == "shard-1/data/0"


def test_collision_rule_keeps_both_and_reports_the_files(tmp_path):
    first, second = torch.zeros(3), torch.ones(3)
    sources = _shards(tmp_path, [{"w": first, "x": torch.ones(1)}, {"w": second}])
    cat = Catalog.merge(sources, name=str(tmp_path), flat=True)
    with ckptfs.Checkpoint(cat) as ckpt:
        assert ckpt.keys() == ["w", "x", "w#2"]
        assert ckpt.read("w") == torch_bytes(first)  # the earlier file keeps the key
        assert ckpt.read("w#2") == torch_bytes(second)
        (conflict,) = cat.conflicts
        assert (conflict.key, conflict.first, conflict.second, conflict.renamed) == \
               ("w", "shard-0.bin", "shard-1.bin", "w#2")
        assert "shard-0.bin" in str(conflict) and "shard-1.bin" in str(conflict)


def test_nested_catalog_names_each_file_and_non_dict_members_go_under_their_name(tmp_path):
    t = torch.randn(5)
    sources = _shards(tmp_path, [{"model": {"w": t}, "epoch": 1}, {"model": {"w": t * 2}, "epoch": 2}])
    cat = Catalog.merge(sources, name=str(tmp_path), flat=False)
    with ckptfs.Checkpoint(cat) as ckpt:
        assert ckpt.row(("shard-0.bin", "model", "w")) != ckpt.row(("shard-1.bin", "model", "w"))
        assert ckpt.read(("shard-1.bin", "model", "w")) == torch_bytes(t * 2)
        assert ckpt.value(("shard-0.bin", "epoch")) == 1
    lone = tmp_path / "lone.pt"
    torch.save(torch.arange(4), lone)
    sources = _shards(tmp_path, [{"a": torch.zeros(2)}]) + [("lone.pt", LocalFile(lone))]
    cat = Catalog.merge(sources, name="mixed", flat=True)
    with ckptfs.Checkpoint(cat) as ckpt:
        assert ckpt.read(("lone.pt",)) == torch_bytes(torch.arange(4))
        assert ckpt.read("a") == torch_bytes(torch.zeros(2))


def test_one_file_is_the_one_member_case(tmp_path):
    p = tmp_path / "m.pth"
    torch.save({"w": torch.randn(2, 2)}, p)
    with ckptfs.open(p) as ckpt:
        assert len(ckpt.catalog.members) == 1 and ckpt.catalog.index.owners is None
        assert ckpt.catalog.member_of(ckpt.row("w")).source.name == str(p)


def test_a_bad_member_fails_the_merge_naming_its_file_and_closes_the_rest(tmp_path):
    good = _shards(tmp_path, [{"w": torch.zeros(1)}])
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"not a checkpoint at all")
    sources = good + [("bad.bin", LocalFile(bad))]
    with pytest.raises(FormatError, match="bad.bin"):
        Catalog.merge(sources, name="dir", flat=True)
    with pytest.raises(OSError):
        import os

        os.fstat(good[0][1].fd)  # closed on failure
    with pytest.raises(FormatError, match="no checkpoint files"):
        Catalog.merge([], name="empty", flat=True)


def test_renamed_key_never_takes_a_real_key_of_a_later_file(tmp_path):
    # shard-1 has its own "w#2": the duplicate "w" must not take that name from it
    first, second, real = torch.zeros(3), torch.ones(3), torch.full((3,), 7.0)
    sources = _shards(tmp_path, [{"w": first}, {"w": second, "w#2": real}])
    cat = Catalog.merge(sources, name=str(tmp_path), flat=True)
    with ckptfs.Checkpoint(cat) as ckpt:
        assert sorted(ckpt.keys()) == ["w", "w#2", "w#3"]
        assert ckpt.read("w#2") == torch_bytes(real)
        assert ckpt.read("w#3") == torch_bytes(second)
        (conflict,) = cat.conflicts
        assert (conflict.key, conflict.renamed) == ("w", "w#3")


def test_dotted_key_colliding_with_a_nested_one_keeps_the_real_suffixed_key(tmp_path):
    # {"a": {"b": x}} and the literal key "a.b" both read "a.b"; the nested dict's own "b#2" keeps "a.b#2"
    x, y, z = torch.zeros(2), torch.ones(2), torch.full((2,), 5.0)
    path = tmp_path / "dotted.pt"
    torch.save({"a": {"b": x, "b#2": z}, "a.b": y}, path)
    ref = torch.load(path, weights_only=True)
    with ckptfs.open(path) as ckpt:
        assert sorted(ckpt.keys()) == ["a.b", "a.b#2", "a.b#3"]
        assert ckpt.read("a.b") == torch_bytes(ref["a.b"])  # the shallower key is a row first
        assert ckpt.read("a.b#2") == torch_bytes(ref["a"]["b#2"])
        assert ckpt.read("a.b#3") == torch_bytes(ref["a"]["b"])
        assert ckpt.row("a.b#3") == ckpt.row(("a", "b"))
