"""``ckptfs mount`` / ``ckptfs umount`` (and the mount(8) helper form, :mod:`ckptfs.cli.mounthelper`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .common import EXIT_OK, LIMIT_HELP, add_remote_args, examples, limits_from, remote_from
from .progress import activity

OPTIONS_HELP = ("mount options: allow_other, allow_root, uid=, gid=, umask= (e.g. 027), strict, threads, log=FILE, "
                "setuid=USER (as root), FUSE options; mount(8)'s own (noauto, nofail, user, _netdev, x-*) are ignored "
                "(docs/cli.md)")


def register(sub: Any) -> None:
    sp = sub.add_parser(
        "mount", help="mount a checkpoint as a read-only directory tree",
        description="Mount CHECKPOINT read-only at MOUNTPOINT (an empty directory you can write to). Returns once the "
                    "mount answers; the daemon serves until `ckptfs umount` (or umount / fusermount3 -u). The same "
                    "mount from /etc/fstab: `CHECKPOINT MOUNTPOINT fuse.ckptfs ro,OPTIONS 0 0` (docs/cli.md).",
        **examples("ckptfs mount model.pth /mnt/model",
                   "ckptfs mount -o allow_other,umask=022 model.pth /mnt/model   # other users may read it",
                   "ckptfs mount -f -d model.pth /mnt/model     # foreground, every FUSE call logged",
                   "sudo mount -t fuse.ckptfs /data/model.pth /mnt/model -o ro,allow_other   # through mount(8)"))
    sp.add_argument("checkpoint", help="a checkpoint file or directory, or its URL (https://, s3://, any fsspec "
                                       "protocol)")
    sp.add_argument("mountpoint")
    sp.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground (Ctrl-C unmounts)")
    sp.add_argument("-o", dest="options", action="append", default=[], metavar="OPT[,OPT...]", help=OPTIONS_HELP)
    sp.add_argument("--strict", action="store_true", help="refuse classes outside ckptfs's allowlist")
    sp.add_argument("-d", "--debug", action="store_true", default=argparse.SUPPRESS,
                    help="log FUSE calls (implies -f unless --log is given)")
    sp.add_argument("--threads", action="store_true",
                    help="serve requests from several threads (always, for a URL: a read waiting on the network "
                         "must not hold up the others)")
    sp.add_argument("--view", choices=("tree", "safetensors"), default="tree",
                    help="tree: every key a file (default; -o npy adds <tensor>.npy files); safetensors: the "
                         "checkpoint (or an HF model directory) as safetensors files (docs/views.md)")
    sp.add_argument("--log", metavar="FILE", help="the daemon's log (read errors, -d traces); default: syslog")
    sp.add_argument("--limit", action="append", metavar="NAME=VALUE", help=LIMIT_HELP)
    add_remote_args(sp)
    sp.add_argument("--no-progress", action="store_true", help="no progress line while indexing")
    sp.set_defaults(func=cmd_mount)

    sp = sub.add_parser("umount", help="unmount (also clears a stale mount left by a killed daemon)",
                        description="Unmount a ckptfs (or any FUSE) mount: fusermount3 -u, or lazily when it is busy "
                                    "or its daemon died (the output says which).",
                        **examples("ckptfs umount /mnt/model", "umount /mnt/model          # the same, as root",
                                   "fusermount3 -u /mnt/model  # the same, as the user who mounted it"))
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
                       log=args.log, storage_options=storage_options, remote=remote, view=args.view,
                       limits=limits_from(args),
                       indexing=lambda src: activity(f"indexing {src}", disable=args.no_progress)))
    return EXIT_OK


def cmd_umount(args: argparse.Namespace) -> int:
    from ..mount.daemon import umount

    print(f"ckptfs: {umount(args.mountpoint)}")
    return EXIT_OK
