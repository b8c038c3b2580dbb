"""Every hostile case through ckptfs and through torch.load(weights_only=True) (and mmap=True), side by side.

    python tests/hostile/torch_table.py OUT.json [--md OUT.md]

Both run in jailed children (tests/hostile/sandbox.py); torch gets 4 GiB and 20 s. The markdown is the
per-case table behind docs/security.md's attack-family table.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hostile.make_corpus import all_cases  # noqa: E402
from hostile.sandbox import Sandbox  # noqa: E402


def ckptfs_outcome(run) -> str:  # noqa: ANN001
    if run.violations:
        return "VIOLATION " + run.violations[:80]
    if run.timed_out:
        return "hang"
    if run.signal:
        return f"crash ({signal.Signals(run.signal).name})"
    res = run.result
    if res is None:
        return "no result"
    if not res["ok"]:
        return f"refuses ({res['type']})"
    bad = sum(1 for t in res["tensors"].values() if "error" in t)
    return "indexes" + (f", {bad} tensor(s) refused" if bad else "")


def torch_outcome(run, markers: Path) -> str:  # noqa: ANN001
    if any(markers.iterdir()):
        return "RAN CODE"
    if run.timed_out:
        return "hang (>20 s, killed)"
    if run.signal:
        return f"crash ({signal.Signals(run.signal).name})"
    res = run.result
    if res is None:
        return f"died (exit {run.exit})"
    if res["status"] == "memory":
        return "MemoryError"
    if res["status"] == "refused":
        return "refuses (" + res["error"].split(":", 1)[0] + ")"
    return "loads"


def agree(ck: dict | None, th: dict | None) -> str:
    if not ck or not ck.get("ok") or not th or th.get("status") != "accepted":
        return ""
    same = diff = 0
    for key, rec in ck["tensors"].items():
        t = th["tensors"].get(key)
        if "sha256" not in rec or not t or "error" in t:
            continue
        if t[rec.get("byteorder") or "little"] == rec["sha256"]:
            same += 1
        else:
            diff += 1
    return f"{same} same, {diff} differ" if same or diff else ""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--md")
    ap.add_argument("-k", default="")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ckptfs-table-"))
    markers = work / "markers"
    markers.mkdir()
    cases = [c for c in all_cases(markers) if args.k in c.name]
    ck = Sandbox(work / "ck")
    th = Sandbox(work / "torch", torch=True)
    rows = []
    try:
        for c in cases:
            path = c.materialise(work)
            r1 = ck.run("api", path, limits=c.limits, timeout=max(c.timeout, 5.0), max_read=c.max_read)
            r2 = th.run("torch", path, timeout=20.0, mem=4 << 30, hang_after=20.0)
            t_out = torch_outcome(r2, markers)
            for m in markers.iterdir():
                m.unlink()
            r3 = th.run("torch", path, timeout=20.0, mem=4 << 30, mmap=True, hang_after=20.0) if c.family in ("zip", "lies") else None
            row = {"case": c.name, "family": c.family, "what": c.what, "ckptfs": ckptfs_outcome(r1),
                   "ckptfs_error": (r1.result or {}).get("error", "") if r1.result and not r1.result["ok"] else "",
                   "torch": t_out, "torch_error": (r2.result or {}).get("error", ""),
                   "torch_mmap": torch_outcome(r3, markers) if r3 else "",
                   "agree": agree(r1.result, r2.result),
                   "agree_mmap": agree(r1.result, r3.result) if r3 else "",
                   "ckptfs_seconds": round(r1.elapsed, 2), "ckptfs_maxrss_mb": (r1.maxrss_kb or 0) >> 10}
            rows.append(row)
            print(f"{c.name:40s} ckptfs: {row['ckptfs']:32s} torch: {row['torch']:30s} {row['agree']}", flush=True)
            path.unlink(missing_ok=True)
    finally:
        ck.close()
        th.close()
    Path(args.out).write_text(json.dumps(rows, indent=1))
    if args.md:
        lines = []
        fam: dict = defaultdict(Counter)
        for r in rows:
            fam[r["family"]][(r["ckptfs"].split(",")[0].split(" (")[0], r["torch"].split(" (")[0])] += 1
        lines.append("| family | ckptfs | torch.load(weights_only=True) | cases |\n|---|---|---|---|")
        for f, cnt in fam.items():
            for (a, b), n in sorted(cnt.items(), key=lambda kv: -kv[1]):
                lines.append(f"| {f} | {a} | {b} | {n} |")
        lines.append("\n| case | attack | ckptfs | torch.load(weights_only=True) | torch mmap=True | bytes |\n"
                     "|---|---|---|---|---|---|")
        for r in rows:
            lines.append(f"| {r['case']} | {r['what']} | {r['ckptfs']} | {r['torch']} | {r['torch_mmap']} | "
                         f"{r['agree']} |")
        Path(args.md).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
