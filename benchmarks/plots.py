"""The report's pictures (matplotlib, PNG): the scale curves (index time and memory against tensor count for
ckptfs and its peers) and the read throughput of every read case for ckptfs, ratarmount and the plain file.
Made from the results alone, so ``--render`` draws them again from a --json file."""

from __future__ import annotations

import os
import re
from typing import Any

from .core import CaseResult

# series of the scale curve (benchmarks/cases_scale.py row.series) -> (label, colour, marker)
SCALE_SERIES = {"ckptfs": ("ckptfs", "#d62728", "o"), "torch_mmap": ("torch.load(mmap=True)", "#1f77b4", "s"),
                "zipslicer": ("zipslicer", "#2ca02c", "^"), "safetensors": ("safetensors safe_open", "#9467bd", "D")}
# series of the read cases (benchmarks/cases_mount.py row.series), in bar order
READ_SERIES = {"ckptfs": "#d62728", "ratarmount": "#7f7f7f", "ratarmount -o kernel_cache": "#bcbd22",
               "plain file": "#1f77b4"}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _count(row_impl: str) -> int | None:
    m = re.search(r", ([\d,]+) tensors$", row_impl)
    return int(m.group(1).replace(",", "")) if m else None


def scale_figure(res: CaseResult, path: str) -> bool:
    """Two panels, log-log: index time and RssAnon growth against tensor count, one line per implementation."""
    plt = _pyplot()
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    drawn = False
    for series, (label, colour, marker) in SCALE_SERIES.items():
        pts = []
        for row in res.rows:
            n = _count(row.impl)
            if row.series != series or n is None or row.median is None:
                continue
            anon = row.extra_median("anon_delta")
            pts.append((n, row.median, anon))
        if not pts:
            continue
        pts.sort()
        ns = [p[0] for p in pts]
        ax_t.plot(ns, [p[1] for p in pts], marker=marker, color=colour, label=label)
        mem = [(p[0], p[2] / 1e6) for p in pts if p[2] is not None and p[2] > 0]
        if mem:
            ax_m.plot([m[0] for m in mem], [m[1] for m in mem], marker=marker, color=colour, label=label)
        drawn = True
    if not drawn:
        plt.close(fig)
        return False
    for ax, title, unit in ((ax_t, "index time: keys + shapes", "seconds"),
                            (ax_m, "memory held by the index (RssAnon growth)", "MB")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("tensors in the checkpoint")
        ax.set_ylabel(unit)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    ax_t.legend(fontsize=8)
    fig.suptitle("Scale: 8-element float32 tensors in a flat state_dict (median of the runs)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def reads_figure(results: list[CaseResult], path: str) -> bool:
    """Grouped horizontal bars: each read case's median throughput for every series it measured."""
    cases = []
    for res in results:
        if res.unit != "GB/s":
            continue
        bars = {}
        for row in res.rows:
            if row.series in READ_SERIES and row.median is not None and row.series not in bars:
                bars[row.series] = row.median * res.scale
        if bars:
            cases.append((res.id, bars))
    if not cases:
        return False
    plt = _pyplot()
    series = [s for s in READ_SERIES if any(s in bars for _, bars in cases)]
    height = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(cases) * max(2, len(series)) / 2 + 1.2))
    for j, s in enumerate(series):
        ys, xs = [], []
        for i, (_, bars) in enumerate(cases):
            if s in bars:
                ys.append(i + (j - (len(series) - 1) / 2) * height)
                xs.append(bars[s])
        ax.barh(ys, xs, height=height * 0.95, color=READ_SERIES[s], label=s)
        for y, x in zip(ys, xs, strict=True):
            ax.text(x, y, f" {x:.2g}", va="center", fontsize=7)
    ax.set_yticks(range(len(cases)))
    ax.set_yticklabels([c[0] for c in cases])
    ax.invert_yaxis()
    ax.set_xlabel("GB/s (median; higher is better)")
    ax.set_title("Read throughput per case: ckptfs, ratarmount and the plain file, same run", fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def render(results: list[CaseResult], report_path: str) -> list[tuple[str, str]]:
    """Draw every figure the results allow, next to the report (``<report>-img/``); (caption, relative path)
    of each, or a note when matplotlib is missing."""
    out_dir = os.path.splitext(os.path.abspath(report_path))[0] + "-img"
    rel = os.path.basename(out_dir)
    try:
        _pyplot()
    except ImportError:
        return [("(no figures: matplotlib is not installed; pip install matplotlib)", "")]
    os.makedirs(out_dir, exist_ok=True)
    made = []
    scale = next((r for r in results if r.id == "scale-curve"), None)
    if scale is not None and scale_figure(scale, os.path.join(out_dir, "scale.png")):
        made.append(("Scale curves: index time and memory against tensor count", f"{rel}/scale.png"))
    if reads_figure(results, os.path.join(out_dir, "reads.png")):
        made.append(("Read throughput per case", f"{rel}/reads.png"))
    return made
