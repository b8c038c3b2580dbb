"""Whole-command and Python API cases: `ckptfs ls` vs python -c torch.load; every tensor via the API;
model.load_state_dict peak RSS."""

from __future__ import annotations

import os
import sys

from .core import CaseResult, Context, MeasureError, Row, judge, repeat, run_worker, time_command
from .util import script, warm_file

TORCH_MMAP = "torch.load(mmap=True, weights_only=True)"


# --- ckptfs ls, whole command ----------------------------------------------------------------------------------


def ls_cli(ctx: Context) -> CaseResult:
    n = ctx.cfg.tiny_n
    pth = ctx.data.get("tiny")
    res = CaseResult("ls-cli", f"`ckptfs ls` whole command incl. interpreter start ({n:,} tiny tensors)",
                     "wall time of the command (stdout to /dev/null)", "ms", 1e3, "lower",
                     "≥ 5× faster than python -c 'import torch; torch.load(...)' (ratio ≤ 0.2)")
    exe = script("ckptfs")
    warm_file(pth)
    rows = []
    if exe is None:
        r = Row("ckptfs ls", is_ckptfs=True, error="the ckptfs command is not installed")
        res.rows.append(r)
    else:
        r = Row("ckptfs ls", is_ckptfs=True)
        res.rows.append(r)
        rows.append((r, lambda: {"seconds": time_command([exe, "ls", pth])}, "seconds", None))
    for label, code in (
        ("python -c torch.load(mmap=True, weights_only=True)",
         f"import torch; torch.load({pth!r}, mmap=True, weights_only=True)"),
        ("python -c torch.load (plain)", f"import torch; torch.load({pth!r})"),
    ):
        r = Row(label)
        res.rows.append(r)
        rows.append((r, (lambda c=code: {"seconds": time_command([sys.executable, "-c", c])}), "seconds", None))
    r = Row("python -c 'import torch' (floor)", note="interpreter + import torch only, for reference")
    res.rows.append(r)
    rows.append((r, lambda: {"seconds": time_command([sys.executable, "-c", "import torch"])}, "seconds", None))
    repeat(ctx, res, rows)
    peer = res.rows[1]
    judge(res, [("ckptfs/torch mmap", lambda: res.ratio(peer), lambda v: v <= 0.2, "≤ 0.2")])
    if res.met is False and ctx.profile and exe is not None:
        res.profile = _profile_cli(ctx, exe, pth)
    return res


def _profile_cli(ctx: Context, exe: str, pth: str) -> str | None:
    """python -X importtime (imports) and pyinstrument over the whole command."""
    out = os.path.join(ctx.work, "profile-ls-cli.txt")
    import subprocess

    from .profiles import trim_pyinstrument

    pyi = script("pyinstrument")
    if pyi is None:
        return None
    subprocess.run([pyi, "-r", "text", "--no-color", "-o", out, exe, "ls", pth],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return trim_pyinstrument(out, max_depth=5)


# --- every tensor through the Python API -------------------------------------------------------------------------


def _api_case(ctx: Context, cid: str, dataset: str, what: str, ck_impl: str) -> CaseResult:
    path = ctx.data.get(dataset)
    st = ctx.data.get(dataset + ".st")
    warm_file(path)
    warm_file(st)
    n_desc = f"{ctx.cfg.tiny_n:,} tiny tensors" if dataset == "tiny" else f"{ctx.data.size(dataset) / 1e9:.2f} GB"
    api = "tensor()" if ck_impl == "ckptfs_tensor" else "numpy()"
    res = CaseResult(cid, f"every tensor via the Python API, ckptfs `{api}`: {n_desc}",
                     "open + get every tensor + .sum() of each (file warm in the page cache; imports excluded)",
                     "s", 1.0, "lower", "≤ 2× torch mmap (ratio ≤ 2)",
                     extra_cols=[("maxrss_total", "max RSS MB", 1e-6)])
    impls = [(ck_impl, f"ckptfs Checkpoint.{api}", True, path, None),
             ("torch_mmap", TORCH_MMAP, False, path, None),
             ("torch", "torch.load (plain)", False, path, None),
             ("zipslicer", "zipslicer.load, sd[k]", False, path, ctx.cfg.slow_reps if dataset == "tiny" else None),
             ("safetensors_pt" if ck_impl == "ckptfs_tensor" else "safetensors_np",
              "safetensors get_tensor (" + ("pt" if ck_impl == "ckptfs_tensor" else "np") + ")", False, st, None)]
    runs = []
    for impl, label, is_ck, p, override in impls:
        row = Row(label, is_ckptfs=is_ck)
        if override is not None and override < ctx.cfg.reps:
            row.note = f"{override} run(s), no warm-up (minutes per run)"
        res.rows.append(row)
        spec = {"op": "api_all", "impl": impl, "path": p}
        runs.append((row, (lambda s=spec: run_worker(ctx, s)), "seconds", override))
    repeat(ctx, res, runs)
    peer = res.row(TORCH_MMAP)
    judge(res, [("ckptfs/torch mmap", lambda: res.ratio(peer), lambda v: v <= 2.0, "≤ 2")])
    if res.met is False and ctx.profile:
        out = os.path.join(ctx.work, f"profile-{cid}.txt")
        try:
            run_worker(ctx, {"op": "api_all", "impl": ck_impl, "path": path, "profile": out})
            from .profiles import trim_pyinstrument

            res.profile = trim_pyinstrument(out)
        except MeasureError as e:
            res.profile = f"(profiling failed: {e})"
    return res


def api_tensor_tiny(ctx: Context) -> CaseResult:
    return _api_case(ctx, "api-tensor-tiny", "tiny", "tensor()", "ckptfs_tensor")


def api_numpy_tiny(ctx: Context) -> CaseResult:
    return _api_case(ctx, "api-numpy-tiny", "tiny", "numpy()", "ckptfs_numpy")


def api_tensor_big(ctx: Context) -> CaseResult:
    return _api_case(ctx, "api-tensor-1gb", "big", "tensor()", "ckptfs_tensor")


def api_numpy_big(ctx: Context) -> CaseResult:
    return _api_case(ctx, "api-numpy-1gb", "big", "numpy()", "ckptfs_numpy")


# --- model.load_state_dict peak RSS --------------------------------------------------------------------------------


def load_state_dict(ctx: Context) -> CaseResult:
    cfg = ctx.cfg
    path = ctx.data.get("model")
    warm_file(path)
    model_mb = cfg.model_layers * (cfg.model_width ** 2 + cfg.model_width) * 4 / 1e6
    res = CaseResult("load-state-dict", f"model.load_state_dict(...) peak RSS, {model_mb:,.0f} MB model",
                     "peak RSS (ru_maxrss) minus RSS before loading (imports done, parameters allocated but "
                     "untouched)", "MB", 1e-6, "lower", "≤ model size + 10% (no second copy)",
                     extra_cols=[("anon_growth", "peak RssAnon growth MB", 1e-6),
                                 ("file_growth", "peak RssFile growth MB", 1e-6), ("maxrss", "ru_maxrss MB", 1e-6),
                                 ("seconds", "time s", 1.0)])
    runs = []
    for impl, label, is_ck in (("ckptfs_load", "model.load_state_dict(ckptfs.load(p))", True),
                               ("torch", "torch.load (plain)", False),
                               ("torch_mmap", TORCH_MMAP, False),
                               ("zipslicer", "zipslicer.load", False)):
        row = Row(label, is_ckptfs=is_ck)
        res.rows.append(row)
        spec = {"op": "load_state_dict", "impl": impl, "path": path, "width": cfg.model_width,
                "layers": cfg.model_layers}

        def fn(s=spec) -> dict:
            out = run_worker(ctx, s)
            out["growth"] = out["maxrss"] - out["rss_base"]
            return out
        runs.append((row, fn, "growth", None))
    repeat(ctx, res, runs, warmup=0, reps=min(ctx.cfg.reps, 3))
    model_bytes = model_mb * 1e6
    res.notes.append(f"model size {model_bytes / 1e6:,.1f} MB; target: growth ≤ {1.1 * model_bytes / 1e6:,.1f} MB. "
                     "RssAnon/RssFile growth: peaks of anonymous and file-backed (page cache mapped by the process) "
                     "memory seen by a 5 ms sampler thread; file-backed pages are reclaimable but count in RSS.")
    for row in res.rows:
        if row.raw:
            d = row.raw[-1]
            res.notes.append(
                f"{row.impl}: sampled peak RSS {d['sampled_peak'] / 1e6:,.0f} MB (anon "
                f"{d['sampled_detail'].get('RssAnon', 0) / 1e6:,.0f} MB, file-backed "
                f"{d['sampled_detail'].get('RssFile', 0) / 1e6:,.0f} MB), reached in {d.get('peak_where', '?')}")
    res.notes.append("anonymous memory only (peak RssAnon growth / model size): " + ", ".join(
        f"{r.impl} {r.extra_median('anon_growth') / model_bytes:.2f}" for r in res.rows if r.values))
    ck = res.ckptfs
    judge(res, [("ckptfs growth / model size", lambda: None if ck.median is None else ck.median / model_bytes,
                 lambda v: v <= 1.10, "≤ 1.10")])
    if res.met is False and ctx.profile and ck.raw:
        lines = ["memory profile of model.load_state_dict(ckptfs.load(p)) (last run): RSS growth by the Python "
                 "frames running when it happened (5 ms samples)", "   anon MB   file MB  where (innermost first)"]
        for where, anon, file_ in ck.raw[-1].get("growth_by_frame", []):
            lines.append(f"  {anon / 1e6:8.0f}  {file_ / 1e6:8.0f}  {where}")
        res.profile = "\n".join(lines)
    return res


CASES = {
    "ls-cli": ls_cli,
    "api-tensor-tiny": api_tensor_tiny, "api-numpy-tiny": api_numpy_tiny,
    "api-tensor-1gb": api_tensor_big, "api-numpy-1gb": api_numpy_big,
    "load-state-dict": load_state_dict,
}
