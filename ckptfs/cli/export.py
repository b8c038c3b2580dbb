"""``ckptfs export SRC DST``: write a checkpoint (or a model directory) as safetensors. Never imports torch."""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
from typing import Any

from ..errors import oneline
from .common import (
    EXIT_OK,
    LIMIT_HELP,
    add_progress_arg,
    add_remote_args,
    examples,
    human,
    json_text,
    limits_from,
    remote_from,
)
from .progress import bar

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40, "k": 1 << 10, "m": 1 << 20,
          "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """``5GB`` (10^9, as transformers counts), ``500MiB`` (2^20), ``1e9`` or a plain byte count."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 5GB, 500MB, 2GiB)")
    n = int(float(m.group(1)) * _UNITS[unit])
    if n <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a shard size must be positive")
    return n


def register(sub: Any) -> None:
    sp = sub.add_parser("export", help="write a checkpoint as safetensors (one file, or an HF sharded directory)",
                        description="Write SRC (a checkpoint file; a directory: HF weights, DCP, several checkpoints; a URL) "
                                    "as safetensors: DST ending in .safetensors is one file, anything else a "
                                    "directory in the HF layout (model.safetensors or model-0000i-of-0000n shards "
                                    "plus model.safetensors.index.json; a model directory's other files are "
                                    "copied along). Streams tensor by tensor with bounded memory; writes to a "
                                    "temporary name and renames when complete.",
                        **examples("ckptfs export model.pth model.safetensors",
                                   "ckptfs export ./llama-bin ./llama-st               # an HF directory of .bin",
                                   "ckptfs export --max-shard-size 2GB model.pth out/  # HF shards + index",
                                   "ckptfs export --verify s3://bucket/run/ckpt.pt ckpt.safetensors"))
    sp.add_argument("checkpoint", metavar="SRC")
    sp.add_argument("destination", metavar="DST")
    sp.add_argument("--max-shard-size", type=parse_size, default=None, metavar="SIZE",
                    help="directory output: tensor bytes per shard (default 5GB, as transformers)")
    sp.add_argument("--keep-shards", action="store_true",
                    help="directory output from a sharded source: one shard per source file (the files the "
                         "safetensors view shows), not --max-shard-size")
    sp.add_argument("--force", action="store_true", help="replace DST if it exists")
    sp.add_argument("--verify", action="store_true",
                    help="read the written files back (from the disk, not the cache) and compare with SRC")
    sp.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no summary")
    add_progress_arg(sp)
    sp.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    sp.add_argument("--strict", action="store_true", help="refuse classes outside ckptfs's allowlist")
    sp.add_argument("--limit", action="append", metavar="NAME=VALUE", help=LIMIT_HELP)
    sp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    add_remote_args(sp)
    sp.set_defaults(func=cmd_export)


class _Bar:
    """The export's progress (api.export.Progress) as the shared progress bar (cli/progress.py): on a terminal
    only, after CKPTFS_PROGRESS_DELAY, not with --no-progress, -q or CKPTFS_PROGRESS=0; erased when done."""

    def __init__(self, label: str, disable: bool) -> None:
        self.label = label
        self.disable = disable
        self._cm: Any = None
        self.bar: Any = None

    def start(self, total: int) -> None:
        self._cm = bar(total, self.label, disable=self.disable)
        self.bar = self._cm.__enter__()

    def update(self, n: int, what: str) -> None:
        if self.bar is not None:
            self.bar.update(n)
            self.bar.set_postfix_str(oneline(what)[-40:], refresh=False)

    def close(self) -> None:
        cm, self._cm, self.bar = self._cm, None, None
        if cm is not None:
            cm.__exit__(None, None, None)


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # the export removes its temporary files on the way out


def cmd_export(args: argparse.Namespace) -> int:
    from ..api.export import DEFAULT_MAX_SHARD, export

    storage_options, remote = remote_from(args)

    progress = _Bar(os.path.basename(args.destination.rstrip("/")) or args.destination,
                    disable=args.quiet or args.no_progress)
    old = {s: signal.signal(s, _terminate) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        result = export(args.checkpoint, args.destination,
                        max_shard_size=args.max_shard_size or DEFAULT_MAX_SHARD, keep_shards=args.keep_shards,
                        force=args.force, verify=args.verify, progress=progress, strict=args.strict,
                        limits=limits_from(args), storage_options=storage_options, remote=remote)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if args.json:
        print(json_text({"destination": result.destination, "files": [{"path": p, "bytes": n} for p, n in result.files],
                         "tensors": result.tensors, "tensor_bytes": result.data_bytes, "omitted": result.omitted,
                         "seconds": round(result.seconds, 3), "verified": result.verified,
                         "kernel_copied": result.kernel_copied, "holes": result.holes}))
    if not args.quiet:
        total = sum(n for _, n in result.files)
        rate = f" ({human(int(total / result.seconds))}/s)" if result.seconds > 0 else ""
        what = f"{len(result.files)} files" if len(result.files) > 1 else "1 file"
        print(f"ckptfs: wrote {oneline(result.destination)}: {result.tensors} tensors, {what}, {human(total)} in "
              f"{result.seconds:.1f} s{rate}{', verified' if result.verified else ''}", file=sys.stderr)
        if result.omitted:
            print(f"ckptfs: {len(result.omitted)} entries are not tensors safetensors can hold; listed in "
                  "__metadata__['ckptfs.omitted']:", file=sys.stderr)
            for i, (key, why) in enumerate(result.omitted.items()):
                if i == 20:
                    print(f"  ... and {len(result.omitted) - 20} more", file=sys.stderr)
                    break
                print(f"  {oneline(key)}: {oneline(why)}", file=sys.stderr)
    return EXIT_OK

