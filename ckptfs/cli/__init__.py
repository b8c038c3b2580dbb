"""The ``ckptfs`` command: one module per family of subcommands, each with a ``register(sub)``.

ls / info / code never import torch; check does (it compares with torch.load). Errors are one line on
stderr, naming the file and record, with a non-zero exit; ``--debug`` adds the traceback. Only this
package knows argparse and exit codes: the commands call functions that return results or raise.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .._version import __version__
from ..errors import CkptfsError, brief, oneline
from . import check, diff, export, inspect, mount, mounthelper, stats
from .common import EXIT_DIFFERENT, EXIT_ERROR, EXIT_MISMATCH, EXIT_OK, EXIT_USAGE
from .mounthelper import looks_like_helper_call
from .proctitle import scrub_if_needed

__all__ = ["EXIT_DIFFERENT", "EXIT_ERROR", "EXIT_MISMATCH", "EXIT_OK", "EXIT_USAGE", "build_parser", "main"]

COMMANDS = (inspect, stats, diff, check, mount, export)
COMMAND_NAMES: list[str] = []  # filled by build_parser


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ckptfs", description="Look inside PyTorch checkpoints without loading them.")
    p.add_argument("--version", action="version", version=f"ckptfs {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks (and FUSE calls for mount)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for family in COMMANDS:
        family.register(sub)
    COMMAND_NAMES[:] = sub.choices
    return p


def main(argv: Sequence[str] | None = None) -> int:
    own_argv = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if looks_like_helper_call(argv, COMMAND_NAMES):  # mount.fuse3 runs `ckptfs SRC MNT -o OPTS`
        return mounthelper.main(argv, own=own_argv)
    args, extra = parser.parse_known_args(argv)
    if extra:  # patterns after options (`ckptfs ls CKPT --json 'enc.*'`) are patterns; anything else is an error
        if isinstance(getattr(args, "pattern", None), list) and not any(x.startswith("-") for x in extra):
            args.pattern += extra
        else:
            parser.parse_args(argv)  # argparse's own message, exit 2
    if own_argv:  # our own process's arguments: credentials out of the process list (cli/proctitle.py)
        scrub_if_needed()
    debug = getattr(args, "debug", False)
    try:
        return int(args.func(args) or 0)
    except CkptfsError as e:
        if debug:
            raise
        print(f"ckptfs: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("ckptfs: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        try:
            sys.stdout.close()
        except Exception:  # noqa: BLE001
            pass
        return EXIT_OK
    except OSError as e:
        if debug:
            raise
        where = f": {oneline(str(e.filename))}" if e.filename else ""
        print(f"ckptfs{where}: {oneline(str(e.strerror or e))}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as e:  # noqa: BLE001 - a bug: still one line unless --debug
        if debug:
            raise
        print(f"ckptfs: internal error ({type(e).__name__}: {oneline(brief(str(e), 300))}); re-run with --debug "
              "for the traceback", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
