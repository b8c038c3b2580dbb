"""``ckptfs check``: compare every tensor with what torch.load gives (imports torch)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from ..errors import oneline
from .common import EXIT_MISMATCH, EXIT_OK, add_checkpoint_args, remote_from

GREEN, RED, YELLOW, RESET = "\033[32m", "\033[31m", "\033[33m", "\033[0m"


def register(sub: Any) -> None:
    sp = sub.add_parser("check", help="compare every tensor with torch.load (imports torch)")
    add_checkpoint_args(sp)
    sp.add_argument("-v", "--verbose", action="store_true", help="a line per key, not only mismatches")
    sp.add_argument("--trust", action="store_true",
                    help="let torch.load run the pickle (weights_only=False); only for files you trust")
    sp.add_argument("--no-progress", action="store_true")
    sp.set_defaults(func=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    from .. import open as ckpt_open
    from ..torchio.check import compare, count_compared, load_reference

    color = sys.stdout.isatty()

    def paint(c: str, s: str) -> str:
        return f"{c}{s}{RESET}" if color else s

    storage_options, remote = remote_from(args)
    with ckpt_open(args.checkpoint, strict=args.strict, storage_options=storage_options, remote=remote) as ckpt:
        reference = load_reference(ckpt.catalog, args.checkpoint, args.trust)
        total = count_compared(ckpt.catalog)
        show_progress = not args.no_progress and sys.stderr.isatty() and total > 200
        ok = bad = skipped = 0
        start = time.monotonic()
        for n, out in enumerate(compare(ckpt.catalog, reference), 1):
            if out.status == "skip":
                skipped += 1
                if args.verbose:
                    print(paint(YELLOW, "SKIP ") + f"{oneline(out.key)}: {oneline(out.problem)}")
            elif out.status == "fail":
                bad += 1
                print(paint(RED, "FAIL ") + f"{oneline(out.key)}: {oneline(out.problem)}")
            else:
                ok += 1
                if args.verbose:
                    print(paint(GREEN, "OK   ") + f"{oneline(out.key)}  {out.dtype} {list(out.shape)}")
            if show_progress and n <= total and (n % 100 == 0 or n == total):
                sys.stderr.write(f"\r  {n}/{total} tensors checked ({time.monotonic() - start:.0f} s)")
                sys.stderr.flush()
                if n == total:
                    sys.stderr.write("\n")
        for name, e in ckpt.catalog.problems:  # files of a directory ckptfs could not index: not compared
            bad += 1
            print(paint(RED, "FAIL ") + f"{oneline(name)}: left out: {e.reason}")
    summary = f"{ok} tensors identical, {bad} mismatched, {skipped} not compared (kinds ckptfs does not serve)"
    print(paint(GREEN if not bad else RED, summary))
    return EXIT_MISMATCH if bad else EXIT_OK
