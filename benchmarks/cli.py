"""``python -m benchmarks [--quick] [--only CASE ...] [--output FILE] [--reps N]``."""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict

from . import (
    cases_api,
    cases_formats,
    cases_index,
    cases_mount,
    cases_remote,
    cases_scale,
    cases_tools,
    cases_views,
    config,
    report,
)
from .core import PKG_PARENT, CaseResult, Context, Row
from .data import DataDir

# report order
CASES = {}
for family in (cases_index.CASES, cases_api.CASES, cases_mount.CASES, cases_scale.CASES, cases_formats.CASES,
               cases_remote.CASES, cases_views.CASES, cases_tools.CASES):
    CASES.update(family)
ORDER = ["index-tiny", "index-1gb", "index-train", "ls-cli", "mount-ready", "seq-read-cold", "seq-read-fresh",
         "seq-read-warm", "random-4k", "memmap-cold", "memmap-warm", "readers-8", "memmap-threads", "transposed",
         "api-tensor-tiny", "api-numpy-tiny", "api-tensor-1gb", "api-numpy-1gb", "load-state-dict", "daemon-rss",
         "index-memory", "scale-curve", "scale-1m", "index-100gb", "mount-100gb",
         "index-shards-st", "index-shards-bin", "mount-ready-30-shards", "index-dcp", "mount-ready-dcp",
         "remote-ls-1gb", "remote-seq", "remote-random-4k", "remote-seq-20ms", "remote-random-20ms",
         "export-1gb", "view-first-tensor", "view-hf-load", "stats-1gb", "diff-1gb"]
assert sorted(ORDER) == sorted(CASES), "every case must have a place in the report"
# the datasets each case uses (generated before the first case runs)
NEEDS = {
    "index-tiny": ["tiny", "tiny.st"], "index-1gb": ["big", "big.st"], "index-train": ["train", "train.st"],
    "ls-cli": ["tiny"], "mount-ready": ["tiny"], "seq-read-cold": ["mount"], "seq-read-fresh": ["mount"],
    "seq-read-warm": ["mount"], "random-4k": ["mount"], "memmap-cold": ["mount"], "memmap-warm": ["mount"],
    "readers-8": ["readers"], "memmap-threads": ["mount"], "transposed": ["mount"],
    "api-tensor-tiny": ["tiny", "tiny.st"], "api-numpy-tiny": ["tiny", "tiny.st"], "api-tensor-1gb": ["big", "big.st"],
    "api-numpy-1gb": ["big", "big.st"], "load-state-dict": ["model"], "daemon-rss": ["big", "daemon"],
    "index-shards-st": ["shards_st"], "index-shards-bin": ["shards_bin"],
    "mount-ready-30-shards": ["shards_st", "shards_bin"], "index-dcp": ["dcp"], "mount-ready-dcp": ["dcp"],
    "remote-ls-1gb": ["big"], "remote-seq": ["mount"], "remote-random-4k": ["mount"],
    "remote-seq-20ms": ["mount"], "remote-random-20ms": ["mount"],
    "export-1gb": ["big"], "view-first-tensor": ["big"], "view-hf-load": [],
    "index-memory": ["huge"], "index-100gb": ["sparse-small", "sparse-large"],
    "mount-100gb": ["sparse-small", "sparse-large"],
    # the scale curve's datasets depend on the configuration (--quick: smaller sizes): see needs()
    "scale-curve": [],
    "scale-1m": ["flat", "flat.st"],
    "stats-1gb": ["big"], "diff-1gb": ["big", "bigchanged"],
}


def needs(cid: str, cfg: config.Config) -> list[str]:
    """The datasets a case uses."""
    if cid == "scale-curve":
        return [f"scale{n}{ext}" for n in cfg.scale_sizes for ext in ("", ".st")]
    return NEEDS[cid]
assert sorted(NEEDS) == sorted(CASES)


def select(patterns: list[str] | None) -> list[str]:
    if not patterns:
        return list(ORDER)
    chosen = []
    for p in patterns:
        hits = [c for c in ORDER if fnmatch.fnmatchcase(c, p) or c.startswith(p)]
        if not hits:
            raise SystemExit(f"benchmarks: no case matches {p!r}; cases: {', '.join(ORDER)}")
        chosen += [h for h in hits if h not in chosen]
    return [c for c in ORDER if c in chosen]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    p.add_argument("--quick", action="store_true", help="small sizes, 1 repetition (CI: keeps the harness alive)")
    p.add_argument("--only", nargs="+", metavar="CASE", help="case ids, prefixes or globs (see --list)")
    p.add_argument("--output", help="report path (default docs/benchmarks.md; --quick: /tmp/ckptfs-bench-quick.md)")
    p.add_argument("--reps", type=int, help="timed repetitions per implementation")
    p.add_argument("--warmup", type=int, help="warm-up runs per implementation")
    p.add_argument("--data-dir", help="keep generated checkpoints here and reuse them across runs")
    p.add_argument("--keep-data", action="store_true", help="do not delete the temporary data directory")
    p.add_argument("--no-profile", action="store_true", help="do not profile cases that miss their target")
    p.add_argument("--json", help="also write raw results as JSON here")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument("--render", metavar="JSON", help="only write the report again from a --json file (no measuring)")
    p.add_argument("--merge", metavar="JSON", nargs="+",
                   help="with --render: later --json files of some cases, whose results replace those cases' "
                        "(the report says which cases were measured again, when, at which commit)")
    return p


def _byte_compile_ckptfs() -> None:
    """Write ckptfs's .pyc files, as ``pip install`` does for the peers: an editable install run with
    PYTHONDONTWRITEBYTECODE=1 (set on this machine) would otherwise compile every ckptfs module from source in
    every measured process (~40 ms per start here), which no pip-installed package pays."""
    import compileall

    import ckptfs

    try:
        compileall.compile_dir(os.path.dirname(ckptfs.__file__), quiet=1)
    except OSError:  # an installed, read-only copy: pip compiled it already
        pass


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    if args.list:
        for c in ORDER:
            print(c)
        return 0
    if args.render:
        return render(args.render, args.output or os.path.join(PKG_PARENT, "docs", "benchmarks.md"), args.merge or [])
    cfg = config.get(args.quick, args.reps, args.warmup)
    chosen = select(args.only)
    output = args.output or ("/tmp/ckptfs-bench-quick.md" if args.quick else os.path.join(PKG_PARENT, "docs",
                                                                                         "benchmarks.md"))

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    t_start = time.perf_counter()
    _byte_compile_ckptfs()
    facts = report.machine_facts()
    if args.data_dir:
        data_root = os.path.abspath(args.data_dir)
        os.makedirs(data_root, exist_ok=True)
        own_data = False
    else:
        data_root = tempfile.mkdtemp(prefix="ckptfs-bench-data-")
        own_data = not args.keep_data
    work = tempfile.mkdtemp(prefix="ckptfs-bench-work-")
    data = DataDir(data_root, cfg, log)
    ctx = Context(cfg=cfg, data=data, work=work, log=log, profile=not args.no_profile)
    log(f"{'quick' if cfg.quick else 'full'} run of {len(chosen)} case(s); data in {data_root}; scratch in {work}")
    results: list[CaseResult] = []
    try:
        # every checkpoint the chosen cases use, made up front in one process
        data.prepare(sorted({d for c in chosen for d in needs(c, cfg)}))
        for cid in chosen:
            log(f"case {cid}")
            t0 = time.perf_counter()
            load0 = _load1()
            try:
                res = CASES[cid](ctx)
            except Exception as e:  # noqa: BLE001 - one broken case must not lose the others' results
                import traceback

                traceback.print_exc()
                res = CaseResult(cid, cid, "", "", 1.0, "lower", "")
                res.rows.append(Row("ckptfs", is_ckptfs=True, error=f"{type(e).__name__}: {e}"))
                res.verdict = f"the case failed: {type(e).__name__}: {e}"
            res.seconds = time.perf_counter() - t0
            res.notes.append(f"machine load (1-min load average, {os.cpu_count()} cores) at the case's start / end: "
                             f"{load0} / {_load1()}; the case took {res.seconds:.0f} s")
            log(f"  {cid}: met={res.met} ({res.seconds:.0f} s) {res.verdict}")
            results.append(res)
            # write as we go: a long run that dies late still leaves a report
            _write(output, ctx, results, facts, args, t_start, data)
    finally:
        leftover = [m for m in cases_mount.mounted_paths() if m.startswith(work)]
        for m in leftover:
            cases_mount.Mount(ctx, "ckptfs", "/", m).stop()
        shutil.rmtree(work, ignore_errors=True)
        if own_data:
            shutil.rmtree(data_root, ignore_errors=True)
        elif not args.data_dir:
            log(f"kept the generated checkpoints in {data_root}")
    run = _write(output, ctx, results, facts, args, t_start, data)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"run": run, "results": [asdict(r) for r in results]}, f, indent=1, default=str)
    log(f"wrote {output} ({time.perf_counter() - t_start:.0f} s)")
    missed = [r.id for r in results if r.met is False]
    if missed:
        log(f"targets missed: {', '.join(missed)}")
    return 0


def _load1() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "?"


def _write(output: str, ctx: Context, results: list[CaseResult], facts: dict, args, t_start: float,
           data: DataDir) -> dict:
    sets = []
    for name, entry in data.manifest.items():
        ds = data.sets.get(name)
        if ds is None or entry.get("key") != ds.key():
            continue
        sets.append((os.path.basename(data.path(name)), ds.description, entry["size"], data.gen_seconds.get(name)))
    run = report.run_info(ctx, facts, args.argv, time.perf_counter() - t_start, sets)
    report.write(output, run, results)
    return run


def render(path: str, output: str, merge: list[str] | None = None) -> int:
    """Write the report again from a --json file (e.g. after editing benchmarks/findings.md): no measuring.
    ``merge``: --json files of later runs of some cases; their results replace those cases', in place."""
    with open(path) as f:
        saved = json.load(f)
    results = saved["results"]
    for later_path in merge or []:
        with open(later_path) as f:
            later = json.load(f)
        by_id = {r["id"]: r for r in later["results"]}
        results = [by_id.get(r["id"], r) for r in results]
        saved["run"].setdefault("remeasured", []).append(
            {"when": later["run"]["when"], "git": later["run"]["git"], "seconds": later["run"]["seconds"],
             "cases": [r["id"] for r in later["results"]]})
    report.write(output, saved["run"], report.results_from_json(results))
    print(f"wrote {output} from {path}{' and ' + ', '.join(merge) if merge else ''}", file=sys.stderr)
    return 0
