"""``ckptfs mount`` / ``ckptfs umount``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .common import EXIT_OK, add_remote_args, remote_from


def register(sub: Any) -> None:
    sp = sub.add_parser("mount", help="mount a checkpoint as a read-only directory tree")
    sp.add_argument("checkpoint", help="a checkpoint file, or its URL (https://, s3://, any fsspec protocol)")
    sp.add_argument("mountpoint")
    sp.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground (Ctrl-C unmounts)")
    sp.add_argument("-o", dest="options", action="append", default=[], metavar="OPT[,OPT...]",
                    help="FUSE mount options (allow_other, ...)")
    sp.add_argument("--strict", action="store_true")
    sp.add_argument("-d", "--debug", action="store_true", default=argparse.SUPPRESS,
                    help="log FUSE calls (implies -f unless --log is given)")
    sp.add_argument("--threads", action="store_true",
                    help="serve requests from several threads (always, for a URL: a read waiting on the network "
                         "must not hold up the others)")
    sp.add_argument("--view", choices=("tree", "safetensors"), default="tree",
                    help="tree: every key a file (default; -o npy adds <tensor>.npy files); safetensors: the "
                         "checkpoint (or an HF model directory) as safetensors files (docs/views.md)")
    sp.add_argument("--log", metavar="FILE", help="the daemon's log (read errors, -d traces); default: syslog")
    add_remote_args(sp)
    sp.set_defaults(func=cmd_mount)

    sp = sub.add_parser("umount", help="unmount (also clears a stale mount left by a killed daemon)")
    sp.add_argument("mountpoint")
    sp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sp.set_defaults(func=cmd_umount)


def cmd_mount(args: argparse.Namespace) -> int:
    from ..mount.daemon import MountRequest, mount, parse_options, warnings_for

    options = parse_options(args.options)
    for warning in warnings_for(options):
        print(f"ckptfs: warning: {warning}", file=sys.stderr)
    storage_options, remote = remote_from(args)
    mount(MountRequest(args.checkpoint, args.mountpoint, options, foreground=args.foreground,
                       debug=bool(getattr(args, "debug", False)), strict=args.strict, threads=args.threads,
                       log=args.log, storage_options=storage_options, remote=remote, view=args.view))
    return EXIT_OK


def cmd_umount(args: argparse.Namespace) -> int:
    from ..mount.daemon import umount

    print(f"ckptfs: {umount(args.mountpoint)}")
    return EXIT_OK
