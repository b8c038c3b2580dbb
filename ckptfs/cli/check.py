"""``ckptfs check``: compare every tensor with what torch.load gives (imports torch)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import oneline
from .common import EXIT_MISMATCH, EXIT_OK, add_checkpoint_args, add_progress_arg, examples, open_checkpoint
from .progress import activity, bar

GREEN, RED, YELLOW, RESET = "\033[32m", "\033[31m", "\033[33m", "\033[0m"


def register(sub: Any) -> None:
    sp = sub.add_parser(
        "check", help="compare every tensor with torch.load (imports torch); exit 1 on a mismatch",
        description="Load the checkpoint with torch.load (weights_only=True unless --trust) and compare every tensor "
                    "ckptfs serves with torch's: dtype, shape, requires_grad, Parameter-ness and bytes. Exit status: "
                    "0 every tensor agrees, 1 a mismatch, 2 trouble (torch or ckptfs cannot read the file).",
        **examples("ckptfs check model.pth", "ckptfs check -v model.pth          # a line per tensor",
                   "ckptfs check --trust scripted.pt   # a TorchScript archive: lets torch run it",
                   "ckptfs check --trust step_100/     # a DCP checkpoint: torch's reader unpickles it"))
    add_checkpoint_args(sp)
    sp.add_argument("-v", "--verbose", action="store_true", help="a line per key, not only mismatches")
    sp.add_argument("--trust", action="store_true",
                    help="let torch.load run the pickle (weights_only=False); only for files you trust")
    add_progress_arg(sp)
    sp.set_defaults(func=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    from ..torchio.check import compare, count_compared, load_reference

    color = sys.stdout.isatty()

    def paint(c: str, s: str) -> str:
        return f"{c}{s}{RESET}" if color else s

    with open_checkpoint(args.checkpoint, args) as ckpt:
        with activity(f"torch.load {oneline(args.checkpoint)}", disable=args.no_progress):
            reference = load_reference(ckpt.catalog, args.checkpoint, args.trust)
        total = count_compared(ckpt.catalog)
        ok = bad = skipped = 0
        with bar(total, "check", unit="tensor", disable=args.no_progress) as progress:
            for out in compare(ckpt.catalog, reference):
                progress.update(1)
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
        for name, e in ckpt.catalog.problems:  # files of a directory ckptfs could not index: not compared
            bad += 1
            print(paint(RED, "FAIL ") + f"{oneline(name)}: left out: {e.reason}")
    summary = f"{ok} tensors identical, {bad} mismatched, {skipped} not compared (kinds ckptfs does not serve)"
    print(paint(GREEN if not bad else RED, summary))
    return EXIT_MISMATCH if bad else EXIT_OK
