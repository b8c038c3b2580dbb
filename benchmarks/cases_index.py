"""Index cases: keys + shapes of every tensor, in-process after imports; and index memory."""

from __future__ import annotations

import os
from typing import Callable

from .core import CaseResult, Context, Row, judge, repeat, run_worker

IMPLS = [
    ("ckptfs", "ckptfs.open + meta", True),
    ("torch_mmap", "torch.load(mmap=True, weights_only=True)", False),
    ("torch", "torch.load (plain, weights_only=True)", False),
    ("zipslicer", "zipslicer.load + get_meta", False),
    ("safetensors", "safetensors safe_open + get_slice().get_shape()", False),
]
CKPTFS, TORCH_MMAP, ZIPSLICER = IMPLS[0][1], IMPLS[1][1], IMPLS[3][1]


def _index_case(ctx: Context, cid: str, dataset: str, title: str, target: str,
                checks: Callable[[CaseResult], list]) -> CaseResult:
    res = CaseResult(cid, title, "time from call to keys+shapes in hand (imports excluded)", "ms", 1e3, "lower",
                     target, extra_cols=[("rss_delta", "RSS +MB", 1e-6), ("import_seconds", "import s", 1.0)])
    pth = ctx.data.get(dataset)
    st = ctx.data.get(dataset + ".st")
    runs = []
    for impl, label, is_ck in IMPLS:
        path = st if impl == "safetensors" else pth
        row = Row(label, is_ckptfs=is_ck)
        res.rows.append(row)
        spec = {"op": "index", "impl": impl, "path": path}
        runs.append((row, (lambda s=spec: run_worker(ctx, s)), "seconds", None))
    repeat(ctx, res, runs)
    judge(res, checks(res))
    if res.met is False and ctx.profile:
        res.profile = profile_index(ctx, pth, res.id)
    return res


def _ratio_to(res: CaseResult, peer: str) -> float | None:
    r = res.row(peer)
    return None if r is None else res.ratio(r)


def index_tiny(ctx: Context) -> CaseResult:
    n = ctx.cfg.tiny_n
    return _index_case(
        ctx, "index-tiny", "tiny", f"index: keys + shapes of {n:,} tiny tensors",
        "≥ 25× faster than torch mmap (ratio ≤ 0.04)",
        lambda r: [("ckptfs/torch mmap", lambda: _ratio_to(r, TORCH_MMAP), lambda v: v <= 1 / 25, "≤ 0.04")])


def _le_peers(r: CaseResult) -> list:
    return [("ckptfs/zipslicer", lambda: _ratio_to(r, ZIPSLICER), lambda v: v <= 1.0, "≤ 1"),
            ("ckptfs/torch mmap", lambda: _ratio_to(r, TORCH_MMAP), lambda v: v <= 1.0, "≤ 1")]


def index_big(ctx: Context) -> CaseResult:
    cfg = ctx.cfg
    return _index_case(ctx, "index-1gb", "big",
                       f"index: {cfg.big_bytes / 1e9:.2f} GB, {cfg.big_n} tensors", "≤ zipslicer and ≤ torch mmap",
                       _le_peers)


def index_train(ctx: Context) -> CaseResult:
    res = _index_case(ctx, "index-train", "train",
                      f"index: {ctx.data.size('train') / 1e6:.0f} MB training checkpoint with Adam state",
                      "≤ zipslicer and ≤ torch mmap", _le_peers)
    return res


def index_memory(ctx: Context) -> CaseResult:
    """Index memory for many tensors: RSS growth (gc'd, objects alive) and, for ckptfs, tracemalloc's count."""
    n = ctx.cfg.huge_n
    pth = ctx.data.get("huge")
    res = CaseResult("index-memory", f"index memory for {n:,} tensors", "anonymous RSS growth (RssAnon) per tensor "
                     "while the opened index (ckptfs.open / the torch.load result) is alive, after gc.collect() and "
                     "malloc_trim(0); imports excluded", "B/tensor", 1.0, "lower", "report; ≤ 1 KB per tensor",
                     extra_cols=[("anon_delta", "RssAnon +MB", 1e-6), ("rss_delta", "RSS +MB", 1e-6),
                                 ("seconds", "index s", 1.0)])
    runs = []
    for impl, label in (("ckptfs", CKPTFS), ("torch_mmap", TORCH_MMAP)):
        row = Row(label, is_ckptfs=impl == "ckptfs")
        res.rows.append(row)
        spec = {"op": "index", "impl": impl, "path": pth, "index_only": True}

        def fn(s=spec) -> dict:
            out = run_worker(ctx, s)
            out["per_tensor"] = out["anon_delta"] / max(1, out["n_tensors"])
            return out
        runs.append((row, fn, "per_tensor", None))
    repeat(ctx, res, runs, warmup=0, reps=min(3, ctx.cfg.reps))
    # tracemalloc (Python-level allocations, numpy included) for ckptfs: one extra run, separately
    try:
        out = run_worker(ctx, {"op": "index", "impl": "ckptfs", "path": pth, "tracemalloc": True,
                                "index_only": True})
        res.notes.append(f"ckptfs tracemalloc: {out['trace_current'] / out['n_tensors']:.0f} B/tensor retained "
                         f"({out['trace_current'] / 1e6:.1f} MB), peak {out['trace_peak'] / 1e6:.1f} MB while indexing "
                         f"({out['trace_peak'] / out['n_tensors']:.0f} B/tensor); file {os.path.getsize(pth) / 1e6:.1f} MB")
    except Exception as e:  # noqa: BLE001
        res.notes.append(f"ckptfs tracemalloc run failed: {e}")
    judge(res, [("ckptfs B/tensor", lambda: res.med(CKPTFS), lambda v: v <= 1024, "≤ 1024")])
    if res.met is False and ctx.profile:
        res.profile = profile_index_memory(ctx, pth, n)
    return res


def profile_index_memory(ctx: Context, path: str, n: int) -> str:
    """tracemalloc: the source lines holding the most memory once the index is built."""
    try:
        out = run_worker(ctx, {"op": "index", "impl": "ckptfs", "path": path, "tracemalloc": True,
                               "index_only": True, "tracemalloc_top": 15})
    except Exception as e:  # noqa: BLE001
        return f"(profiling failed: {e})"
    lines = [f"tracemalloc, memory retained by ckptfs.open() ({out['trace_current'] / n:.0f} B/tensor in all; "
             f"peak while indexing {out['trace_peak'] / n:.0f} B/tensor), top lines:",
             "  B/tensor    blocks  allocated at"]
    for where, size, count in out.get("trace_top", []):
        lines.append(f"  {size / n:8.1f}  {count:8d}  {where}")
    return "\n".join(lines)


def profile_index(ctx: Context, path: str, cid: str) -> str | None:
    out = os.path.join(ctx.work, f"profile-{cid}.txt")
    try:
        run_worker(ctx, {"op": "index", "impl": "ckptfs", "path": path, "profile": out})
    except Exception as e:  # noqa: BLE001
        return f"(profiling failed: {e})"
    from .profiles import trim_pyinstrument

    return trim_pyinstrument(out)


CASES = {"index-tiny": index_tiny, "index-1gb": index_big, "index-train": index_train, "index-memory": index_memory}
