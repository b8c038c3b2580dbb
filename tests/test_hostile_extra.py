"""Hostile inputs found by hand beyond the corpus (tests/hostile/): each a defect that was fixed."""

from __future__ import annotations

from pathlib import Path

from helpers import run_ckptfs
from hostile.craft import state_dict, torch_zip


def test_ls_total_leaves_out_tensors_that_are_not_served(tmp_path: Path) -> None:
    """A tensor declaring 2^31 x 2^31 elements over a 24-element record is refused, but `ls` added its
    declared 16 EiB to "of tensor data" (a DCP size of 2^62 x 2^62 made it 77371252455336267181195264.0 TiB);
    `info` leaves it out. Both now count served tensors only."""
    pickle = state_dict([("ok", lambda p: p.tensor("0", 6, (6,), (1,))),
                         ("huge", lambda p: p.tensor("1", 24, (1 << 31, 1 << 31), (1 << 31, 1)))])
    path = tmp_path / "lie.pt"
    path.write_bytes(torch_zip(pickle, {"0": bytes(24), "1": bytes(96)}).data)
    r = run_ckptfs("ls", "-b", str(path))
    assert r.returncode == 0, r.stderr
    assert "error:" in r.stdout
    assert "2 tensors, 0 other values, 24 of tensor data" in r.stderr, r.stderr


def test_ls_tree_keeps_keys_that_are_prefixes_and_deep_keys(tmp_path: Path) -> None:
    """`ls --tree` dropped a key that is also the prefix of others (`a` and `a.b`: whichever came second
    was lost, and its bytes left out of the totals), and a key of 5,000 dots was an internal error
    (RecursionError). Both are shown; a key is at most MAX_PIECES levels, as in the mount."""
    tiny = lambda key: lambda p: p.tensor(key, 1, (1,), (1,))  # noqa: E731
    deep = ".".join(["x"] * 5000)
    pickle = state_dict([("a", tiny("0")), ("a.b", tiny("1")), ("c.d", tiny("2")), ("c", tiny("3")),
                         (deep, tiny("4"))])
    path = tmp_path / "tree.pt"
    path.write_bytes(torch_zip(pickle, {str(i): bytes(4) for i in range(5)}).data)
    r = run_ckptfs("ls", "--tree", "-b", str(path))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "tree.pt  (20)"
    assert lines[1:7] == ["├── a  float32 [1]  4", "├── a/  (4)", "│   └── b  float32 [1]  4",
                          "├── c  float32 [1]  4", "├── c/  (4)", "│   └── d  float32 [1]  4"]
    assert len(lines) == 7 + 64 and lines[-1].endswith("x" + ".x" * (5000 - 64) + "  float32 [1]  4")


def test_stats_summary_counts_values_of_tensors_read(tmp_path: Path) -> None:
    """`stats` on a file with a tensor refused for its 2^62 declared elements said "4611686.0T values" in its
    summary: it counted the refused tensor's claim. Only the values of tensors read are counted."""
    pickle = state_dict([("ok", lambda p: p.tensor("0", 6, (6,), (1,))),
                         ("huge", lambda p: p.tensor("1", 24, (1 << 31, 1 << 31), (1 << 31, 1)))])
    path = tmp_path / "lie.pt"
    path.write_bytes(torch_zip(pickle, {"0": bytes(24), "1": bytes(96)}).data)
    r = run_ckptfs("stats", str(path))
    assert r.returncode == 2  # a tensor could not be read
    assert r.stderr.splitlines()[-1] == "2 tensors, 6 values, no NaN, no Inf, 1 could not be read", r.stderr


def test_stats_of_expanded_views_cost_their_stored_elements(tmp_path: Path) -> None:
    """`ckptfs stats` on a 1-element storage expanded to 2^20 x 2^20 (a 1 KiB file, 4 TiB of view) ran for
    hours (killed after 20 s). Broadcast dimensions are read once, their counts multiplied: the same
    numbers as for the tensor made contiguous, in no time."""
    import math
    import time

    import torch

    import ckptfs

    g = torch.Generator().manual_seed(0)
    base = torch.randn(3, 1, 5, generator=g)
    base[0, 0, 1] = float("nan")
    base[1, 0, 2] = float("inf")
    base[2, 0, 3] = 0.0
    torch.save({"x": base.expand(3, 40, 5), "h": torch.tensor([2.0]).expand(1 << 20, 1 << 20)}, tmp_path / "e.pt")
    torch.save({"x": base.expand(3, 40, 5).contiguous()}, tmp_path / "c.pt")
    with ckptfs.open(tmp_path / "e.pt") as e, ckptfs.open(tmp_path / "c.pt") as c:
        got, want = e.stats("x"), c.stats("x")
        for f in ("numel", "min", "max", "abs_max", "nan", "posinf", "neginf", "inf", "zeros", "finite"):
            assert getattr(got, f) == getattr(want, f), f
        assert math.isclose(got.mean, want.mean) and math.isclose(got.std, want.std)
        hist_got, hist_want = e.histogram("x", bins=7), c.histogram("x", bins=7)
        assert hist_got.to_dict() == hist_want.to_dict()
        start = time.monotonic()
        huge = e.stats("h")
        assert time.monotonic() - start < 5
        assert (huge.numel, huge.finite, huge.min, huge.max, huge.std) == (1 << 40, 1 << 40, 2.0, 2.0, 0.0)


def test_export_of_expanded_views_gathers_in_bounded_boxes(tmp_path: Path, monkeypatch) -> None:
    """`ckptfs export` of a 1-element storage expanded to 2^20 x 2^20 was an internal error (MemoryError:
    one 4 TiB gather buffer): boxes were bounded by the storage they span, not by the elements they hold.
    Both are bounded now, and the file's bytes are the contiguous tensor's."""
    import math

    import safetensors.torch
    import torch

    import ckptfs
    from ckptfs.api import export as export_mod

    boxes = list(export_mod.split_boxes((1 << 20, 1 << 20), (0, 0), 1 << 23))
    assert max(math.prod(hi - lo for lo, hi in b) for b in boxes) <= 1 << 23
    assert sum(math.prod(hi - lo for lo, hi in b) for b in boxes) == 1 << 40
    monkeypatch.setattr(export_mod, "BOX_BYTES", 4096)  # many boxes for a small tensor
    g = torch.Generator().manual_seed(0)
    src = {"e": torch.randn(3, 1, 5, generator=g).expand(3, 700, 5), "t": torch.randn(40, 30, generator=g).t()}
    torch.save(src, tmp_path / "e.pt")
    ckptfs.export(tmp_path / "e.pt", tmp_path / "e.safetensors", verify=True)
    got = safetensors.torch.load_file(tmp_path / "e.safetensors")
    assert all(torch.equal(got[k], v.contiguous()) for k, v in src.items())
