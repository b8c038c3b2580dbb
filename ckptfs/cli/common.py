"""What every command shares: sizes, tables, JSON for terminals, ``--limit``, the common arguments."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from ..errors import CkptfsError, brief, oneline
from .progress import activity

#: Exit statuses, the same for every command (docs/cli.md), as diff(1) and cmp(1) have them: 0 success (for
#: diff and check: identical / every tensor agrees), 1 the answer is "no" (diff: differences; check:
#: mismatches), 2 trouble (an error; wrong usage, which argparse reports with 2 too).
EXIT_OK, EXIT_DIFFERENT, EXIT_ERROR = 0, 1, 2
EXIT_USAGE = EXIT_ERROR
EXIT_MISMATCH = EXIT_DIFFERENT

LIMIT_HELP = ("raise or lower a resource limit for this file, e.g. --limit max_tensors=2000000 "
              "--limit max_memory=2G (see docs/security.md)")


def examples(*lines: str) -> dict[str, Any]:
    """``add_parser`` keywords for a command whose ``--help`` ends with examples (kept as written)."""
    return {"epilog": "examples:\n" + "\n".join(f"  {line}" for line in lines),
            "formatter_class": argparse.RawDescriptionHelpFormatter}


def add_progress_arg(sp: argparse.ArgumentParser) -> None:
    """``--no-progress`` (once: commands that take a checkpoint have it from :func:`add_checkpoint_args`)."""
    if "--no-progress" in sp._option_string_actions:
        return
    sp.add_argument("--no-progress", action="store_true",
                    help="no progress bar or 'indexing ...' line (shown only when stderr is a terminal)")


def open_checkpoint(path: str, args: argparse.Namespace, *, limits: Any = None) -> Any:
    """``ckptfs.open(path)`` with the command's --strict / --limit / remote options, showing what takes time on
    a terminal."""
    from .. import open as ckpt_open

    storage_options, remote = remote_from(args)
    with activity(f"indexing {oneline(path)}", disable=bool(getattr(args, "no_progress", False))):
        return ckpt_open(path, strict=bool(getattr(args, "strict", False)),
                         limits=limits if limits is not None else limits_from(args),
                         storage_options=storage_options, remote=remote)


def add_checkpoint_args(sp: argparse.ArgumentParser, limits: bool = False) -> None:
    """The checkpoint argument and the options that go with it."""
    sp.add_argument("checkpoint", help="a .pth/.pt/.ckpt file written by torch.save, or its URL (https://, s3://, "
                                       "any fsspec protocol)")
    sp.add_argument("--strict", action="store_true", help="refuse classes outside ckptfs's allowlist")
    sp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    if limits:
        sp.add_argument("--limit", action="append", metavar="NAME=VALUE", help=LIMIT_HELP)
    add_progress_arg(sp)  # opening a large or remote checkpoint shows an 'indexing ...' line on a terminal
    add_remote_args(sp)


def add_remote_args(sp: argparse.ArgumentParser) -> None:
    """Options for checkpoints given as URLs (docs/remote.md)."""
    from ..source.options import RemoteOptions

    g = sp.add_argument_group("remote checkpoints (URLs; see docs/remote.md)")
    g.add_argument("--storage-option", action="append", metavar="KEY=VALUE",
                   help="an option for the URL's backend, repeatable: endpoint_url=http://host:9000, anon=true, "
                        "headers.Authorization='Bearer ...' (a dotted key sets a nested option). Prefer the "
                        "AWS_* environment variables for secrets: command lines are visible to other users")
    g.add_argument("--timeout", type=float, metavar="SECONDS",
                   help=f"a read that cannot be served within this time fails (EIO through a mount); "
                        f"default {RemoteOptions.timeout:g}")
    g.add_argument("--cache-dir", metavar="DIR", help="keep fetched bytes on disk here, shared by processes and "
                                                       "mounts (keyed by URL and ETag)")
    g.add_argument("--cache-size", metavar="SIZE",
                   help=f"most bytes --cache-dir may hold (K/M/G suffixes); default {RemoteOptions.cache_size >> 30}G")
    g.add_argument("--memory-cache", metavar="SIZE",
                   help=f"fetched bytes kept in memory per object; default {RemoteOptions.memory_cache >> 20}M")


def remote_from(args: argparse.Namespace) -> tuple[dict[str, Any] | None, Any]:
    """``(storage_options, RemoteOptions)`` from the remote options (None, None when none was given)."""
    from ..source.options import RemoteOptions, parse_size, set_storage_option

    options: dict[str, Any] | None = None
    for item in getattr(args, "storage_option", None) or []:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise CkptfsError(f"--storage-option {key or item!r}: expected KEY=VALUE")
        options = {} if options is None else options
        set_storage_option(options, key, value, f"--storage-option {key}")
    fields: dict[str, Any] = {}
    if getattr(args, "timeout", None) is not None:
        fields["timeout"] = args.timeout
    if getattr(args, "cache_dir", None):
        fields["cache_dir"] = args.cache_dir
    if getattr(args, "cache_size", None):
        fields["cache_size"] = parse_size(args.cache_size, "--cache-size")
    if getattr(args, "memory_cache", None):
        fields["memory_cache"] = parse_size(args.memory_cache, "--memory-cache")
    return options, RemoteOptions(**fields) if fields else None


def size_arg(text: str) -> int:
    """An argparse type: a byte count with an optional K/M/G suffix (``64M``)."""
    t = text.strip()
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(t[-1:].lower(), 1)
    try:
        n = int(t[:-1] if mult > 1 else t, 0) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 8M, 65536)") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a size must be positive")
    return n


def number(v: Any, digits: int = 6) -> str:
    """A statistic for a table: ints exactly, floats with ``digits`` significant digits, complex as a+bj."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return str(v) if abs(v) < 10**15 else f"{v:.{digits}g}"
    if isinstance(v, complex):
        return f"{v.real:.{digits - 2}g}{v.imag:+.{digits - 2}g}j"
    return f"{v:.{digits}g}"


def human(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _shape(shape: Sequence[int] | None) -> str:
    return "-" if shape is None else "[" + ", ".join(str(s) for s in shape) + "]"


def shape_text(shape: Sequence[int] | None) -> str:
    return "-" if shape is None else "[" + ", ".join(str(s) for s in shape) + "]"


def limits_from(args: argparse.Namespace) -> Any:
    """``--limit NAME=VALUE`` options as a ckptfs.Limits (sizes accept K/M/G suffixes: 256M)."""
    from ..limits import Limits, limits_with

    values: dict[str, str] = {}
    for item in getattr(args, "limit", None) or []:
        name, eq, text = item.partition("=")
        if not eq:
            known = ", ".join(Limits.__dataclass_fields__)
            raise CkptfsError(f"--limit {item!r}: expected NAME=VALUE with NAME one of {known}")
        values[name] = text
    try:
        return limits_with(values)
    except ValueError as e:
        raise CkptfsError(str(e)) from None


def leaf_preview(v: Any, n: int = 40) -> str:
    return oneline(brief(v, n))


def json_text(obj: Any, indent: int | None = None) -> str:
    """JSON for a terminal: readable Unicode, unless a string holds something a terminal would act on
    or cannot encode (bidi overrides, lone surrogates): then every non-ASCII character is escaped."""
    s = json.dumps(obj, ensure_ascii=False, indent=indent)
    if not s.replace("\n", "").isprintable():
        s = json.dumps(obj, ensure_ascii=True, indent=indent)
    return s


def print_table(table: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(r[c]) for r in table) for c in range(len(table[0]) - 1)]
    out = sys.stdout
    for r in table:
        cells = [r[c].ljust(widths[c]) for c in range(len(widths))] + [r[-1]]
        out.write("  ".join(cells).rstrip() + "\n")


def plural(n: int, word: str) -> str:
    """'1 value', '2 values', '1,234 values'."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def count_text(n: int) -> str:
    """12,345,678 -> '12.3M' (K, M, B, T)."""
    for div, unit in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


