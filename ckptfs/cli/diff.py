"""``ckptfs diff A B``: what changed between two checkpoints. Exit 0 identical, 1 different, 2 trouble (as
diff(1)). Never imports torch."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import CkptfsError, oneline
from .common import (
    EXIT_DIFFERENT,
    EXIT_ERROR,
    EXIT_OK,
    LIMIT_HELP,
    add_progress_arg,
    add_remote_args,
    examples,
    human,
    json_text,
    number,
    open_checkpoint,
    shape_text,
    size_arg,
)
from .progress import bar

GREEN, RED, YELLOW, RESET = "\033[32m", "\033[31m", "\033[33m", "\033[0m"
KEY_WIDTH = 48  # at most: longer keys push their line's other columns
WHAT_WIDTH = 20


def register(sub: Any) -> None:
    sp = sub.add_parser(
        "diff", help="what changed between two checkpoints (keys, dtypes, shapes, values); exit 1 if any",
        description="Compare two checkpoints key by key: keys only in A or only in B, dtype / shape / kind changes, "
                    "changed values, and for tensors in both: identical bytes, or how many elements differ with the "
                    "largest absolute and relative difference (|a - b| / |b|). Equal bytes are never decoded; a "
                    "tensor stored at the same place of the same file is not even read. Exit status: 0 identical, "
                    "1 different, 2 trouble.",
        **examples("ckptfs diff before.pth after.pth                  # what training changed",
                   "ckptfs diff model.pth model.safetensors            # did the conversion keep every weight?",
                   "ckptfs diff train.ckpt train.safetensors --tensors-only   # an export: epoch ... are not tensors",
                   "ckptfs diff a.pth b.pth --atol 1e-6 --rtol 1e-3    # small float differences count as equal",
                   "ckptfs diff a.pth b.pth 'encoder.*' --json         # JSON lines, one object per key",
                   "ckptfs diff train.ckpt model.pth --a-prefix state_dict   # A's keys under state_dict.",
                   "ckptfs diff -q a.pth b.pth && echo same            # exit status only"))
    sp.add_argument("a", metavar="A", help="a checkpoint (the old one, or the reference)")
    sp.add_argument("b", metavar="B", help="another checkpoint (the new one, or the copy to check)")
    sp.add_argument("pattern", nargs="*", default=[], help="only keys matching these globs (e.g. 'encoder.*')")
    sp.add_argument("--json", action="store_true", help="one JSON object per key that differs (all with -v)")
    sp.add_argument("-v", "--verbose", action="store_true", help="also list keys that are the same")
    sp.add_argument("-q", "--quiet", action="store_true", help="print nothing: the exit status says it all")
    sp.add_argument("--atol", type=float, default=0.0, metavar="X",
                    help="float values within |a - b| <= atol + rtol * |b| count as equal (default 0)")
    sp.add_argument("--rtol", type=float, default=0.0, metavar="X", help="relative tolerance (default 0)")
    sp.add_argument("--exact", action="store_true",
                    help="equal values stored as other bytes (-0.0 vs 0.0, NaN payloads, byte order) are a difference")
    sp.add_argument("--tensors-only", action="store_true",
                    help="compare tensors only: values that are not tensors (epoch, lr, config ...) are left out "
                         "(a checkpoint against its `ckptfs export` safetensors copy)")
    sp.add_argument("--no-renames", action="store_true", help="do not pair keys only in A with keys only in B "
                    "holding the same bytes")
    sp.add_argument("--a-prefix", default="", metavar="PREFIX", help="compare A's keys under PREFIX, without it")
    sp.add_argument("--b-prefix", default="", metavar="PREFIX", help="compare B's keys under PREFIX, without it")
    sp.add_argument("--chunk-size", type=size_arg, default=None, metavar="SIZE",
                    help="bytes of float64 values compared at a time (default 8M); memory is a few times this")
    sp.add_argument("--strict", action="store_true", help="refuse classes outside ckptfs's allowlist")
    sp.add_argument("--limit", action="append", metavar="NAME=VALUE", help=LIMIT_HELP)
    sp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    add_progress_arg(sp)
    add_remote_args(sp)
    sp.set_defaults(func=cmd_diff)


def cmd_diff(args: argparse.Namespace) -> int:
    from ..api.diff import Comparison, DiffOptions, is_difference

    if args.atol < 0 or args.rtol < 0:
        raise CkptfsError("--atol and --rtol must not be negative")
    options = DiffOptions(atol=args.atol, rtol=args.rtol, exact=args.exact, renames=not args.no_renames,
                          patterns=tuple(args.pattern), a_prefix=args.a_prefix, b_prefix=args.b_prefix,
                          tensors_only=args.tensors_only,
                          **({"chunk_bytes": args.chunk_size} if args.chunk_size else {}))
    color = sys.stdout.isatty() and not args.json
    names = (oneline(args.a), oneline(args.b))
    with open_checkpoint(args.a, args) as a, open_checkpoint(args.b, args) as b:
        comparison = Comparison(a.catalog, b.catalog, options)
        if args.pattern and comparison.selected() == (0, 0):
            raise CkptfsError(f"no key of either checkpoint matches {' '.join(oneline(p) for p in args.pattern)} "
                              f"(see `ckptfs ls {oneline(args.a)}`)")
        width = min(KEY_WIDTH, comparison.key_width())
        with bar(comparison.total_bytes(), "diff", disable=args.no_progress or args.quiet) as progress:
            comparison.progress = progress.update
            for e in comparison:
                if args.quiet:
                    continue
                shown = args.verbose or is_difference(e, args.exact) or e.status == "error"
                if not shown:
                    continue
                if args.json:
                    print(json_text(e.to_dict()))
                else:
                    print(_line(e, names, color, args.exact, width))
        summary = comparison.summary
    if not args.quiet:
        print(_summary(summary, names), file=sys.stderr)
    if summary.errors:
        return EXIT_ERROR
    return EXIT_DIFFERENT if summary.differences else EXIT_OK


def _describe(dtype: str | None, shape: Any) -> str:
    return f"{dtype} {shape_text(shape)}" if dtype is not None else "-"


def _values(e: Any) -> str:
    """The value differences of a tensor: '3 of 5,120 elements differ: max abs 0.5 at [3, 17], max rel 0.03'."""
    if not e.n_different:
        return "values equal" if e.n_different == 0 else ""
    parts = [f"{e.n_different:,} of {e.numel:,} elements differ"]
    detail = []
    if e.max_abs is not None:
        at = f" at {shape_text(e.at)}" if e.at is not None and e.at != [] else ""
        detail.append(f"max abs {number(e.max_abs, 4)}{at}")
    if e.max_rel is not None:
        detail.append(f"max rel {number(e.max_rel, 4)}")
    if e.nan_mismatch:
        where = shape_text(e.nan_at) if e.nan_at else "[]"
        detail.append(f"NaN on one side at {where}" if e.nan_mismatch == 1 else
                      f"NaN on one side at {e.nan_mismatch:,} elements (first at {where})")
    return parts[0] + (": " + ", ".join(detail) if detail else "")


def _line(e: Any, names: tuple[str, str], color: bool, exact: bool = False, width: int = KEY_WIDTH) -> str:
    def paint(c: str, s: str) -> str:
        return f"{c}{s}{RESET}" if color else s

    key = oneline(e.key) or "(root)"
    st = e.status
    if st == "only_a":
        mark, c, what = "-", YELLOW, _describe(e.dtype_a, e.shape_a) if e.dtype_a else oneline(e.value_a or e.kind_a)
        detail = f"only in {names[0]}"
    elif st == "only_b":
        mark, c, what = "+", YELLOW, _describe(e.dtype_b, e.shape_b) if e.dtype_b else oneline(e.value_b or e.kind_b)
        detail = f"only in {names[1]}"
    elif st == "renamed":
        mark, c, what = "R", YELLOW, _describe(e.dtype_b, e.shape_b)
        key = f"{oneline(e.renamed_from)} -> {key}"
        detail = "renamed (same bytes)"
    elif st == "dtype":
        mark, c = "~", RED
        what = f"{e.dtype_a} -> {e.dtype_b} {shape_text(e.shape_a)}"
        values = _values(e)
        if e.values == "close":
            values = f"values close: {values} (within --atol/--rtol)"
        detail = "dtype changed" + (f"; {values}" if values else "") + (f" ({e.how})" if e.how else "")
    elif st == "shape":
        mark, c, what, detail = "~", RED, f"{e.dtype_a} {shape_text(e.shape_a)} -> {shape_text(e.shape_b)}", \
            "shape changed" + (f" (and dtype -> {e.dtype_b})" if e.dtype_b != e.dtype_a else "")
    elif st == "kind":
        mark, c = "~", RED
        what = f"{e.kind_a} -> {e.kind_b}"
        detail = "kind changed" + (f" ({oneline(e.how)})" if e.how else "")
    elif st == "value":
        mark, c, what, detail = "~", RED, f"{oneline(e.value_a or '')} -> {oneline(e.value_b or '')}", "value changed"
    elif st == "different":
        mark, c, what, detail = "~", RED, _describe(e.dtype_a, e.shape_a), _values(e)
    elif st == "error" and e.left_out:  # a file of a directory that could not be opened: its keys are unknown
        side = names[0] if e.left_out == "a" else names[1]
        mark, c, what, detail = "!", RED, "file", f"cannot be opened, left out of {side}: {oneline(e.error or '')}"
    elif st == "error":
        mark, c, what, detail = "!", RED, _describe(e.dtype_a, e.shape_a), f"cannot compare: {oneline(e.error or '')}"
    elif st == "skipped":
        mark, c, what, detail = "?", YELLOW, _describe(e.dtype_a, e.shape_a), \
            f"not compared ({oneline(e.error or '')})"
    else:  # identical, equal, close
        mark, c = ("~", RED) if st == "equal" and exact else ("=", GREEN)
        what = _describe(e.dtype_a, e.shape_a) if e.kind_a != "value" else oneline(e.value_a or "")
        if st == "identical":
            detail = "identical" + (f" ({e.how})" if e.how and e.how != "compared" else "")
        elif st == "equal":
            detail = oneline(e.how or "equal values")
        else:
            detail = "close: " + _values(e) + " (within --atol/--rtol)"
    return paint(c, f"{mark} {key.ljust(width)}  {what.ljust(WHAT_WIDTH)}  {detail}".rstrip())


def _summary(s: Any, names: tuple[str, str]) -> str:
    c = s.counts
    labels = [("identical", "identical"), ("equal", "equal values, other bytes"), ("close", "close"),
              ("different", "different"), ("dtype", "dtype changed"), ("shape", "shape changed"),
              ("kind", "kind changed"), ("value", "values changed"), ("renamed", "renamed"),
              ("only_a", f"only in {names[0]}"), ("only_b", f"only in {names[1]}"),
              ("skipped", "not compared"), ("error", "errors")]
    parts = [f"{c[k]:,} {label if c[k] != 1 or k != 'error' else 'error'}" for k, label in labels if c[k]]
    verdict = "identical" if s.identical else ("trouble" if s.errors else "different")
    return f"{names[0]} vs {names[1]}: {verdict}: " + (", ".join(parts) or "nothing to compare") + \
        f" ({human(s.bytes_compared)} compared)"
