"""``mount.fuse.ckptfs``: the helper mount(8) runs for ``mount -t fuse.ckptfs`` and /etc/fstab lines.

How a ``fuse.ckptfs`` mount reaches ckptfs (util-linux mount 2.38, fuse3 3.14):

* mount(8) looks for ``/sbin/mount.fuse.ckptfs`` and runs it as ``mount.fuse.ckptfs SOURCE MOUNTPOINT
  [-sfnv] [-N NS] -o OPTIONS``, with its own options (noauto, x-*, comment=) removed, ``user`` expanded to
  ``user,noexec,nosuid,nodev``, PATH reset and, for a ``user`` fstab line run by a user, privileges
  dropped to that user;
* without that helper, mount(8) runs fuse3's ``mount.fuse3`` (``mount.fuse``), which drops user / users /
  nofail / auto / noauto / _netdev, handles setuid=USER itself, adds dev,suid unless told nodev,nosuid, and
  runs ``/bin/sh -c "ckptfs SOURCE MOUNTPOINT -o OPTIONS"`` with PATH as mount(8) left it: ``ckptfs`` must
  be in /usr/local/bin or /usr/bin. ``ckptfs SOURCE MOUNTPOINT -o OPTIONS`` is therefore this helper too.

Either way the checkpoint is mounted as ``ckptfs mount`` would (options: :mod:`ckptfs.mount.options`) and the
helper returns once the mount answers. mount(8) passes ``rw`` whenever no option says ``ro`` (no options,
``defaults``): the helper mounts read-only anyway, with a warning, as mount(8) does for a write-protected
device; ``ckptfs mount -o rw`` itself is refused. Exit statuses are mount(8)'s: 0 mounted, 1 wrong usage, 32 the mount
failed (the reason on stderr, one line).
"""

from __future__ import annotations

import sys
from typing import Sequence

from ..errors import CkptfsError, brief, oneline

MNT_EX_SUCCESS, MNT_EX_USAGE, MNT_EX_FAIL = 0, 1, 32
TYPES = ("fuse.ckptfs", "ckptfs", "fuse")
USAGE = "usage: mount.fuse.ckptfs CHECKPOINT MOUNTPOINT [-sfnv] [-o OPTION[,OPTION...]]"
HELP = f"""{USAGE}

The helper mount(8) runs for `mount -t fuse.ckptfs` and /etc/fstab lines: mounts CHECKPOINT read-only at
MOUNTPOINT as `ckptfs mount` does and returns once the mount answers. Options as `ckptfs mount -o`
(docs/cli.md, "Mount options"); -f checks them and mounts nothing.

examples:
  mount -t fuse.ckptfs /data/model.pth /mnt/model -o ro,allow_other
  /data/model.pth  /mnt/model  fuse.ckptfs  ro,allow_other,nofail  0 0      # an /etc/fstab line
  umount /mnt/model

exit status: 0 mounted, 1 wrong usage, 32 the mount failed (the reason on stderr, one line)"""


class UsageError(Exception):
    pass


def parse(argv: Sequence[str]) -> tuple[str, str, list[str], bool]:
    """(checkpoint, mountpoint, -o groups, fake) from mount(8)'s helper arguments."""
    positional: list[str] = []
    groups: list[str] = []
    fake = False
    args = list(argv)
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-o", "-t", "-N"):
            if i + 1 == len(args):
                raise UsageError(f"option {a} needs a value")
            value = args[i + 1]
            if a == "-o":
                groups.append(value)
            elif a == "-t" and value not in TYPES:
                raise UsageError(f"-t {value}: this helper mounts fuse.ckptfs")
            elif a == "-N":
                raise UsageError("-N (another mount namespace) is not supported")
            i += 2
            continue
        if a.startswith("-o") and len(a) > 2:
            groups.append(a[2:])
        elif a.startswith("-") and len(a) > 1:
            for flag in a[1:]:
                if flag == "f":
                    fake = True
                elif flag in "snvrw":  # sloppy, no mtab, verbose: nothing to do; -r/-w as ro / rw
                    if flag == "w":
                        groups.append("rw")
                else:
                    raise UsageError(f"unknown option -{flag}")
        else:
            positional.append(a)
        i += 1
    if len(positional) != 2:
        raise UsageError("expected a checkpoint and a mountpoint")
    return positional[0], positional[1], groups, fake


def main(argv: Sequence[str] | None = None, own: bool | None = None) -> int:
    """``own``: ``argv`` are this process's own arguments (so are None's): credentials in them are taken out
    of the process list once parsed, as every ckptfs command does (the daemon is a fork of this process)."""
    from ..mount.daemon import MountRequest, mount, parse_options
    from ..mount.options import split_options
    from .proctitle import scrub_if_needed

    own = argv is None if own is None else own
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(HELP)
        return MNT_EX_SUCCESS
    try:
        source, mountpoint, groups, fake = parse(argv)
    except UsageError as e:
        print(f"ckptfs: {e}\n{USAGE}", file=sys.stderr)
        return MNT_EX_USAGE
    try:
        options = parse_options(groups)
        if options.pop("rw", None):  # mount(8) says rw when no option says ro (also for "defaults")
            print("ckptfs: warning: mounted read-only (a ckptfs mount is always read-only; say ro to silence this)",
                  file=sys.stderr)
            options = {"ro": True, **options}
        split_options(options)  # every value checked before anything is done (and for mount -f)
        if own:
            scrub_if_needed()
        if fake:
            return MNT_EX_SUCCESS
        mount(MountRequest(source, mountpoint, options))
    except CkptfsError as e:
        print(f"ckptfs: {e}", file=sys.stderr)
        return MNT_EX_FAIL
    except OSError as e:
        where = f"{oneline(str(e.filename))}: " if e.filename else ""
        print(f"ckptfs: {where}{oneline(str(e.strerror or e))}", file=sys.stderr)
        return MNT_EX_FAIL
    except KeyboardInterrupt:
        return MNT_EX_FAIL
    except Exception as e:  # noqa: BLE001 - a bug: one line for mount(8)'s user
        print(f"ckptfs: internal error ({type(e).__name__}: {oneline(brief(str(e), 300))})", file=sys.stderr)
        return MNT_EX_FAIL
    return MNT_EX_SUCCESS


def looks_like_helper_call(argv: Sequence[str], commands: Sequence[str]) -> bool:
    """``ckptfs SOURCE MOUNTPOINT -o OPTIONS`` (how mount.fuse3 runs a ``fuse.ckptfs`` type): two arguments
    that are not a command, then ``-o`` (mount.fuse3 always passes options)."""
    return (len(argv) >= 4 and argv[0] not in commands and not argv[0].startswith("-")
            and not argv[1].startswith("-") and any(a == "-o" or a.startswith("-o") for a in argv[2:]))


if __name__ == "__main__":
    sys.exit(main())
