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
