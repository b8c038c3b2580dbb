"""The harness's core: running workers, repeating and interleaving measurements, results and targets."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from .config import Config
from .util import first_line, fmt_num

PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = "BENCH_RESULT "


class MeasureError(Exception):
    pass


@dataclass
class Context:
    cfg: Config
    data: Any                       # data.DataDir
    work: str                       # scratch dir (mount points, profiles)
    log: Callable[[str], None]
    profile: bool = True
    timeout: float = 3600.0
    facts: dict = field(default_factory=dict)   # things cases learn that the report prints (options used, ...)


def run_worker(ctx: Context, spec: dict, timeout: float | None = None) -> dict:
    """Run one measurement in a fresh interpreter; its JSON result (raises MeasureError on failure)."""
    cmd = [sys.executable, "-m", "benchmarks._worker", json.dumps(spec)]
    try:
        r = subprocess.run(cmd, cwd=PKG_PARENT, capture_output=True, text=True, timeout=timeout or ctx.timeout)
    except subprocess.TimeoutExpired:
        raise MeasureError(f"timed out after {timeout or ctx.timeout:.0f} s") from None
    result = None
    for line in r.stdout.splitlines():
        if line.startswith(MARK):
            result = json.loads(line[len(MARK):])
    if result is None:
        raise MeasureError(f"worker exited {r.returncode}: {first_line(r.stderr) or 'no result'}")
    if "error" in result:
        raise MeasureError(result["error"])
    return result


def time_command(cmd: list[str], timeout: float = 600.0, env: dict | None = None) -> float:
    """Wall-clock seconds of a whole command (interpreter start included); raises on non-zero exit."""
    t0 = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=timeout,
                       cwd=PKG_PARENT, env=env)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise MeasureError(f"{os.path.basename(cmd[0])} exited {r.returncode}: {first_line(r.stderr)}")
    return dt


# --- results --------------------------------------------------------------------------------------------------


@dataclass
class Row:
    impl: str                         # display name, e.g. "ckptfs", "torch.load(mmap=True)"
    values: list[float] = field(default_factory=list)
    extras: dict[str, list[float]] = field(default_factory=dict)   # other per-run numbers (median shown)
    error: str | None = None
    note: str = ""
    is_ckptfs: bool = False
    raw: list[dict] = field(default_factory=list)
    # which bar of the read-throughput plot this row is ("ckptfs", "ratarmount", "ratarmount -o kernel_cache",
    # "plain file"); empty: not plotted
    series: str = ""

    @property
    def median(self) -> float | None:
        return statistics.median(self.values) if self.values else None

    def extra_median(self, name: str) -> float | None:
        v = self.extras.get(name)
        return statistics.median(v) if v else None


@dataclass
class CaseResult:
    id: str
    title: str
    metric: str                      # e.g. "time to keys+shapes"
    unit: str                        # display unit, e.g. "ms", "GB/s"
    scale: float                     # display value = value * scale
    better: str                      # "lower" or "higher"
    target: str                      # the target, as text
    rows: list[Row] = field(default_factory=list)
    extra_cols: list[tuple[str, str, float]] = field(default_factory=list)  # (extra key, header, scale)
    met: bool | None = None
    verdict: str = ""
    notes: list[str] = field(default_factory=list)
    profile: str | None = None
    seconds: float = 0.0

    def row(self, impl: str) -> Row | None:
        for r in self.rows:
            if r.impl == impl:
                return r
        return None

    def med(self, impl: str) -> float | None:
        r = self.row(impl)
        return None if r is None else r.median

    @property
    def ckptfs(self) -> Row | None:
        for r in self.rows:
            if r.is_ckptfs:
                return r
        return None

    def ratio(self, peer: Row) -> float | None:
        c = self.ckptfs
        if c is None or c.median is None or peer.median is None or peer.is_ckptfs or peer.median == 0:
            return None
        return c.median / peer.median

    def show(self, v: float | None) -> str:
        return "-" if v is None else fmt_num(v * self.scale)


def repeat(ctx: Context, res: CaseResult, runs: list[tuple[Row, Callable[[], dict], str, int | None]],
           warmup: int | None = None, reps: int | None = None) -> None:
    """Run each (row, fn, metric key, reps override) warmup + reps times, interleaved: every repetition runs
    every implementation once, in a rotated order, so that slow drifts of a noisy machine hit all alike."""
    cfg = ctx.cfg
    warmup = cfg.warmup if warmup is None else warmup
    reps = cfg.reps if reps is None else reps
    total = warmup + reps
    for rnd in range(total):
        order = runs[rnd % len(runs):] + runs[: rnd % len(runs)] if runs else []
        for row, fn, key, override in order:
            if row.error is not None:
                continue
            n_reps = reps if override is None else min(override, reps)
            # a peer limited to fewer repetitions (minutes per run) skips the warm-up
            skip_warm = override is not None and override < reps
            if rnd < warmup and skip_warm:
                continue
            if rnd >= warmup and rnd - warmup >= n_reps:
                continue
            try:
                out = fn()
            except MeasureError as e:
                row.error = str(e)
                ctx.log(f"    {row.impl}: ERROR {e}")
                continue
            except Exception as e:  # noqa: BLE001 - a harness problem in one row must not stop the run
                row.error = f"{type(e).__name__}: {e}"
                ctx.log(f"    {row.impl}: ERROR {row.error}")
                continue
            if rnd < warmup:
                continue
            row.values.append(float(out[key]))
            row.raw.append(out)
            for k, v in out.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k != key:
                    row.extras.setdefault(k, []).append(float(v))
            ctx.log(f"    {row.impl}: {res.show(out[key])} {res.unit}")


# --- targets ------------------------------------------------------------------------------------------------------


def judge(res: CaseResult, checks: list[tuple[str, Callable[[], float | None], Callable[[float], bool], str]]) -> None:
    """Each check: (label, value getter, predicate, what is required). met = all checks with values pass;
    None if ckptfs has no measurement."""
    parts = []
    oks = []
    for label, get, pred, need in checks:
        try:
            v = get()
        except Exception:  # noqa: BLE001
            v = None
        if v is None:
            parts.append(f"{label}: n/a")
            continue
        ok = bool(pred(v))
        oks.append(ok)
        parts.append(f"{label} = {fmt_num(v)} ({'ok' if ok else 'MISSED'}, need {need})")
    c = res.ckptfs
    if c is None or c.median is None:
        res.met = None
        res.verdict = "not measured" + (f": {c.error}" if c is not None and c.error else "")
        return
    res.met = all(oks) if oks else None
    res.verdict = "; ".join(parts)
