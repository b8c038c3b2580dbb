"""The hostile corpus against torch.load(weights_only=True): wherever torch accepts a file that ckptfs
indexes, every tensor both return has the same bytes (no wrong byte, in either direction of trust).

torch runs in its own jailed child too (a server that imported torch once; 4 GiB, 20 s): some of these
files crash or hang torch itself, which is recorded, not a failure here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import hostile_corpus
from hostile.make_corpus import Case
from hostile.sandbox import Sandbox

CASES, MARKERS = hostile_corpus()

TORCH_CASES = [c for c in CASES if c.torch_ok and c.expect in ("index", "any") and c.limits is None]


@pytest.fixture(scope="module")
def sandboxes(tmp_path_factory: pytest.TempPathFactory):
    ck = Sandbox(tmp_path_factory.mktemp("ck"))
    th = Sandbox(tmp_path_factory.mktemp("torch"), torch=True)
    yield ck, th
    ck.close()
    th.close()


def compare(case: Case, ck_res: dict, torch_res: dict) -> tuple[int, list[str]]:
    """(tensors compared, mismatches) between ckptfs's and torch's results. ckptfs serves the bytes as the
    file stores them: torch's tensors in the byte order torch read the file in (found by torch, not taken
    from what ckptfs reports)."""
    mism: list[str] = []
    n = 0
    theirs = torch_res.get("tensors", {})
    order = torch_res["byteorder"]
    for key, rec in (ck_res.get("tensors") or {}).items():
        if "sha256" not in rec or key not in theirs or "error" in theirs[key]:
            continue
        n += 1
        if theirs[key][order] != rec["sha256"]:
            mism.append(key)
        elif (rec.get("byteorder") or order) != order:
            mism.append(f"{key} (byteorder {rec['byteorder']}, torch read {order})")
    return n, mism


def test_bytes_agree_with_torch(sandboxes: tuple[Sandbox, Sandbox], tmp_path: Path) -> None:
    ck, th = sandboxes
    compared = 0
    accepted = 0
    problems = []
    for case in TORCH_CASES:
        path = case.materialise(tmp_path)
        mine = ck.run("api", path, timeout=case.timeout)
        assert mine.result is not None, mine.describe()
        theirs = th.run("torch", path, timeout=20.0, mem=4 << 30, hang_after=20.0)  # informational: no waiting
        if theirs.result is None or theirs.result["status"] != "accepted" or not mine.result["ok"]:
            path.unlink()
            continue
        accepted += 1
        n, mism = compare(case, mine.result, theirs.result)
        compared += n
        if mism:
            problems.append(f"{case.name}: {mism}")
        path.unlink()
    assert not problems, "bytes differ from torch's:\n" + "\n".join(problems)
    assert not any(MARKERS.iterdir())
    # the comparison must actually happen on a good part of the corpus
    print(f"torch accepted {accepted} of {len(TORCH_CASES)} files ckptfs indexes; {compared} tensors compared")
    assert accepted >= 30, accepted
    assert compared >= 45, compared
