"""The benchmark harness in --quick mode (small sizes): it runs end to end and its report has every case.

No timing assertions: this only keeps `make bench` from rotting. It mounts (ckptfs and ratarmount), so it
needs FUSE; it takes a few minutes, hence `slow` (CI runs it with `make test`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import require_fuse

ROOT = Path(__file__).resolve().parents[1]


def _fuse_mounts() -> set[str]:
    with open("/proc/mounts") as f:
        return {ln.split()[1] for ln in f if "fuse" in ln.split()[2]}


@pytest.mark.slow
@pytest.mark.mount
def test_bench_quick(tmp_path):
    require_fuse()  # skips without FUSE, fails instead when CKPTFS_REQUIRE_FUSE is set (CI)
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks.cli import ORDER
    finally:
        sys.path.remove(str(ROOT))
    before = _fuse_mounts()
    out, raw = tmp_path / "bench.md", tmp_path / "bench.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--output", str(out), "--json", str(raw)],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    text = out.read_text()
    for head in ("## Machine", "## Method", "## Summary", "## Results", "libfuse", "kernel"):
        assert head in text
    saved = json.loads(raw.read_text())
    assert saved["run"]["quick"] and saved["run"]["facts"]
    results = {c["id"]: c for c in saved["results"]}
    assert list(results) == ORDER
    for cid in ORDER:
        assert f"### {cid}" in text, cid
        assert f"[{cid}](#{cid})" in text, cid  # its summary row
        case = results[cid]
        ck = [row for row in case["rows"] if row["is_ckptfs"]]
        peers = [row for row in case["rows"] if not row["is_ckptfs"]]
        assert ck, f"{cid}: no ckptfs row"
        # ckptfs itself must have been measured in every case (a harness that silently measures nothing rots)
        assert ck[0]["values"], f"{cid}: ckptfs not measured: {ck[0]['error']}"
        assert peers or cid == "daemon-rss", f"{cid}: no peer rows"
        assert case["met"] in (True, False), f"{cid}: target not judged: {case['verdict']}"
    assert _fuse_mounts() <= before, "the harness left something mounted"
    # the pictures: the scale curves and the read throughput, as PNGs next to the report, linked from it
    for name in ("scale.png", "reads.png"):
        png = tmp_path / "bench-img" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert f"(bench-img/{name})" in text, name
    # the report can be written again from the saved results alone
    again = tmp_path / "again.md"
    r = subprocess.run([sys.executable, "-m", "benchmarks", "--render", str(raw), "--output", str(again)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert again.read_text().replace("again-img/", "bench-img/") == text
    assert (tmp_path / "again-img" / "scale.png").stat().st_size > 0
