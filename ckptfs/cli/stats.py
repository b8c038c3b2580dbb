"""``ckptfs stats``: per-tensor statistics (min, max, mean, std, abs max, NaN / Inf / zero counts) and value
histograms, streamed in chunks. Never imports torch."""

from __future__ import annotations

import argparse
import fnmatch
import math
import sys
from typing import Any

from ..errors import CkptfsError, oneline
from .common import (
    EXIT_ERROR,
    EXIT_OK,
    add_checkpoint_args,
    add_progress_arg,
    count_text,
    examples,
    json_text,
    number,
    open_checkpoint,
    plural,
    print_table,
    shape_text,
    size_arg,
)
from .progress import bar

BAR_WIDTH = 40


def register(sub: Any) -> None:
    sp = sub.add_parser(
        "stats", help="per-tensor min, max, mean, std, abs max and NaN/Inf/zero counts (streamed)",
        description="Statistics of every tensor (or those matching PATTERNs), read in chunks: memory stays "
                    "bounded whatever a tensor's size. min/max/abs max are over every value but NaN; mean and std "
                    "(Bessel-corrected, as torch.std) over the finite values; NaN, +Inf/-Inf and zeros are counted.",
        **examples("ckptfs stats model.pth                        # every tensor",
                   "ckptfs stats model.pth 'encoder.*' --json     # JSON lines, one object per tensor",
                   "ckptfs stats model.pth --nonfinite            # where are the NaNs and Infs?",
                   "ckptfs stats model.pth --hist fc.weight       # a text histogram of one tensor's values",
                   "ckptfs stats model.pth --hist fc.weight --png fc.png --log   # drawn (pip install 'ckptfs[plot]')"))
    add_checkpoint_args(sp, limits=True)
    sp.add_argument("pattern", nargs="*", default=[], help="only keys matching these globs (e.g. 'encoder.*')")
    sp.add_argument("--json", action="store_true", help="one JSON object per tensor (non-finite numbers as strings)")
    sp.add_argument("--nonfinite", action="store_true", help="only tensors holding a NaN or an infinity")
    sp.add_argument("--hist", metavar="KEY", help="the histogram of one tensor's finite values")
    sp.add_argument("--bins", type=int, default=None, metavar="N", help="histogram bins (default 20; 100 with --png)")
    sp.add_argument("--range", type=float, nargs=2, metavar=("LO", "HI"), dest="value_range",
                    help="histogram range (default: the finite values' min and max)")
    sp.add_argument("--png", metavar="FILE", help="draw the histogram into a PNG file (needs matplotlib)")
    sp.add_argument("--log", action="store_true", help="logarithmic counts in the drawn histogram")
    sp.add_argument("--chunk-size", type=size_arg, default=None, metavar="SIZE",
                    help="bytes of float64 values decoded at a time (default 8M); memory is a few times this")
    add_progress_arg(sp)
    sp.set_defaults(func=cmd_stats)


def _check_histogram_args(args: argparse.Namespace) -> None:
    """--bins and --range: one-line errors for what numpy.histogram would refuse (or take silently)."""
    if args.hist is None and (args.bins is not None or args.value_range is not None):
        raise CkptfsError("--bins and --range shape the histogram of --hist KEY: give the key")
    if args.bins is not None and args.bins < 1:
        raise CkptfsError(f"--bins {args.bins}: a histogram needs at least 1 bin")
    if args.value_range is not None:
        lo, hi = args.value_range
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise CkptfsError(f"--range {lo:g} {hi:g}: LO and HI must be finite numbers")
        if lo > hi:
            raise CkptfsError(f"--range {lo:g} {hi:g}: LO must not be greater than HI")


def _chunk(args: argparse.Namespace) -> dict[str, Any]:
    return {"chunk_bytes": args.chunk_size} if args.chunk_size else {}


def cmd_stats(args: argparse.Namespace) -> int:
    from ..api.stats import stats
    from ..model.index import TENSOR

    if args.png and not args.hist:
        raise CkptfsError("--png draws the histogram of --hist KEY: give the key")
    _check_histogram_args(args)
    with open_checkpoint(args.checkpoint, args) as ckpt:
        if args.hist is not None:
            return _histogram(ckpt, args)
        index = ckpt.index
        rows = [i for i in index.tensors()
                if not args.pattern or any(fnmatch.fnmatchcase(index.keys[i], p) for p in args.pattern)]
        if args.pattern and not rows:
            raise CkptfsError(f"no tensor matches {' '.join(args.pattern)} (see `ckptfs ls {args.checkpoint}`)",
                              file=ckpt.name)
        total = sum(ckpt.catalog.meta(i).nbytes or 0 for i in rows if index.kinds[i] == TENSOR)
        results = []
        with bar(total, "stats", disable=args.no_progress) as progress:
            for s in stats(ckpt.catalog, rows, progress=progress.update, **_chunk(args)):
                if args.nonfinite and not (s.nonfinite or s.error):
                    continue
                if args.json:
                    print(json_text(s.to_dict()))
                results.append(s)
        problems = list(ckpt.catalog.problems)  # files of a directory that could not be opened: not in the stats
    if not args.json:
        _table(results)
    _summary(results, args)
    for name, e in problems:
        print(f"ckptfs: left out {oneline(name)} (cannot be opened, no statistics): {oneline(e.reason)}",
              file=sys.stderr)
    return EXIT_ERROR if problems or any(s.error for s in results) else EXIT_OK


def _table(results: list[Any]) -> None:
    table = [("KEY", "DTYPE", "SHAPE", "MIN", "MAX", "MEAN", "STD", "ABSMAX", "ZEROS", "NAN", "INF", "")]
    for s in results:
        if s.error or s.kind is None:
            note = f"error: {s.error}" if s.error else f"({s.note})"
            table.append((oneline(s.key), s.dtype, shape_text(s.shape), *("-",) * 8, oneline(note)))
            continue
        if s.posinf is None:
            inf = str(s.inf)
        else:
            inf = " ".join(p for p in (f"+{s.posinf}" if s.posinf else "", f"-{s.neginf}" if s.neginf else "") if p)
        table.append((oneline(s.key), s.dtype, shape_text(s.shape), number(s.min), number(s.max), number(s.mean),
                      number(s.std), number(s.abs_max), str(s.zeros), str(s.nan), inf or "0", ""))
    if len(table) > 1:
        print_table(table)


def _summary(results: list[Any], args: argparse.Namespace) -> None:
    n = len(results)
    elements = sum(s.numel for s in results if not s.error)  # (values looked at: not a refused tensor's claim)
    with_nan = [s for s in results if s.nan]
    with_inf = [s for s in results if s.inf]
    parts = [f"{plural(n, 'tensor')}{' with NaN or Inf' if args.nonfinite else ''}, {count_text(elements)} values"]
    parts.append(f"{len(with_nan)} with NaN ({plural(sum(s.nan for s in with_nan), 'value')})" if with_nan else "no NaN")
    parts.append(f"{len(with_inf)} with Inf ({plural(sum(s.inf for s in with_inf), 'value')})" if with_inf else "no Inf")
    errors = sum(1 for s in results if s.error)
    if errors:
        parts.append(f"{errors} could not be read")
    print(", ".join(parts), file=sys.stderr)


# --- histograms ------------------------------------------------------------------------------------------------


def _histogram(ckpt: Any, args: argparse.Namespace) -> int:
    from ..api.stats import histogram
    from ..model.index import TENSOR

    key = args.hist
    try:
        row = ckpt.row(key)
    except KeyError:
        left_out = [oneline(name) for name, _ in ckpt.catalog.problems]
        also = f"; left out, cannot be opened: {', '.join(left_out)}" if left_out else ""
        raise CkptfsError(f"no key {key!r} (see `ckptfs ls {args.checkpoint}`){also}", file=ckpt.name) from None
    if ckpt.index.kinds[row] != TENSOR:
        raise CkptfsError(f"is a {ckpt.index.kinds[row]}, not a tensor", file=ckpt.name, record=key)
    bins = args.bins or (100 if args.png else 20)
    meta = ckpt.catalog.meta(row)
    passes = 1 if args.value_range else 2
    with bar((meta.nbytes or 0) * passes, "histogram", disable=args.no_progress) as progress:
        h = histogram(ckpt.catalog, row, bins=bins, value_range=tuple(args.value_range) if args.value_range else None,
                      progress=progress.update, **_chunk(args))
    finite = sum(h.counts)
    title = f"{oneline(key)}  {meta.dtype} {shape_text(meta.shape)}"
    if args.json:
        print(json_text(h.to_dict()))
    elif args.png:
        _draw(h, title, args.png, args.log)
        print(f"{args.png}: histogram of {finite:,} finite values of {title} in {bins} bins")
    else:
        print(f"{title}: {finite:,} finite values in {bins} bins" + (f", {h.nan:,} NaN" if h.nan else "")
              + (f", {h.inf:,} infinite" if h.inf else ""))
        top = max(h.counts) if h.counts else 0
        labels = [f"[{number(lo, 4)}, {number(hi, 4)}{']' if i == bins - 1 else ')'}"
                  for i, (lo, hi) in enumerate(zip(h.edges[:-1], h.edges[1:], strict=True))]
        width = max(len(x) for x in labels)
        cw = max(len(f"{c:,}") for c in h.counts)
        for label, c in zip(labels, h.counts, strict=True):
            n = round(BAR_WIDTH * c / top) if top else 0
            print(f"  {label.ljust(width)}  {c:>{cw},}  {'█' * n if n or not c else '▏'}")
    return EXIT_OK


def _draw(h: Any, title: str, path: str, log: bool) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CkptfsError("--png needs matplotlib: pip install 'ckptfs[plot]' (or pip install matplotlib)") from None
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    try:
        ax.stairs(h.counts, h.edges, fill=True)
        ax.set_title(title)
        ax.set_xlabel("value")
        ax.set_ylabel("count (log)" if log else "count")
        if log:
            ax.set_yscale("log")
        notes = [f"{h.nan:,} NaN" if h.nan else "", f"{h.inf:,} infinite" if h.inf else ""]
        if any(notes):
            ax.text(0.99, 0.97, ", ".join(n for n in notes if n) + " (not drawn)", transform=ax.transAxes,
                    ha="right", va="top")
        fig.tight_layout()
        try:
            fig.savefig(path, format="png")
        except OSError as e:
            raise CkptfsError(e.strerror or str(e), file=path) from None
    finally:
        plt.close(fig)
