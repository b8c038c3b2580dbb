"""The ``ckptfs`` command: ls / info / check / mount / umount.

ls and info never import torch; check does (it compares with torch.load). Errors are one line on
stderr, naming the file and record, with a non-zero exit; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
from typing import Any, Sequence

from .. import __version__
from ..errors import CkptfsError, brief, oneline

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_MISMATCH = 0, 1, 2, 3


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


# --- ls ---------------------------------------------------------------------------------------------------


def cmd_ls(args: argparse.Namespace) -> int:
    from .. import open as ckpt_open
    from ..model.tensors import nbytes, validate_all

    with ckpt_open(args.checkpoint, strict=args.strict, limits=_limits(args)) as ckpt:
        index = ckpt.index
        validate_all(index, ckpt.container, ckpt.limits)  # the error column needs every tensor checked
        rows = []
        for i in index.leaves():
            key = index.keys[i]
            if args.pattern and not any(fnmatch.fnmatchcase(key, p) for p in args.pattern):
                continue
            rows.append(ckpt.meta(key))
        if args.json:
            for m in rows:
                print(_json(m.to_dict()))
            return EXIT_OK
        if args.tree:
            _print_tree(ckpt, rows, args)
            return EXIT_OK
        size = (lambda n: str(n)) if args.bytes else human
        table = [("KEY", "DTYPE", "SHAPE", "SIZE", "")]
        n_t = total = 0
        for m in rows:
            if m.kind == "tensor":
                t = m.tensor_node
                nb = nbytes(t)
                n_t += 1
                total += nb
                note = t.error and f"error: {t.error}" or t.unsupported and f"({t.kind}: not served)" or ""
                table.append((oneline(m.key), t.dtype.name, _shape(t.shape), size(nb), oneline(note) if note else ""))
            else:
                table.append((oneline(m.key), oneline(m.type or m.kind), "-", "-", _leaf_preview(ckpt.value(m.key))))
        _print_table(table)
        print(f"{n_t} tensors, {len(rows) - n_t} other values, {size(total)} of tensor data", file=sys.stderr)
    return EXIT_OK


def _limits(args: argparse.Namespace) -> Any:
    """``--limit NAME=VALUE`` options as a ckptfs.Limits (sizes accept K/M/G suffixes: 256M)."""
    from ..limits import DEFAULT_LIMITS, Limits

    values: dict[str, Any] = {}
    for item in getattr(args, "limit", None) or []:
        name, eq, text = item.partition("=")
        name = name.strip().replace("-", "_")
        if not eq or name not in Limits.__dataclass_fields__:
            known = ", ".join(Limits.__dataclass_fields__)
            raise CkptfsError(f"--limit {item!r}: expected NAME=VALUE with NAME one of {known}")
        kind = type(getattr(DEFAULT_LIMITS, name))
        text = text.strip()
        try:
            if kind is bool:
                values[name] = text.lower() in ("1", "true", "yes", "on")
            elif kind is float:
                values[name] = float(text)
            else:
                mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(text[-1:].lower(), 1)
                values[name] = int(text[:-1] if mult > 1 else text, 0) * mult
        except ValueError:
            raise CkptfsError(f"--limit {item!r}: {text!r} is not a {kind.__name__}") from None
    return Limits(**values) if values else DEFAULT_LIMITS


def _leaf_preview(v: Any, n: int = 40) -> str:
    return oneline(brief(v, n))


def _json(obj: Any, indent: int | None = None) -> str:
    """JSON for a terminal: readable Unicode, unless a string holds something a terminal would act on
    or cannot encode (bidi overrides, lone surrogates): then every non-ASCII character is escaped."""
    s = json.dumps(obj, ensure_ascii=False, indent=indent)
    if not s.replace("\n", "").isprintable():
        s = json.dumps(obj, ensure_ascii=True, indent=indent)
    return s


def _print_table(table: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[c]) for r in table) for c in range(len(table[0]) - 1)]
    out = sys.stdout
    for r in table:
        cells = [r[c].ljust(widths[c]) for c in range(len(widths))] + [r[-1]]
        out.write("  ".join(cells).rstrip() + "\n")


def _print_tree(ckpt: Any, rows: list, args: argparse.Namespace) -> None:
    """Keys split on '.', subtrees with their total size (like du)."""
    size = (lambda n: str(n)) if args.bytes else human
    tree: dict = {}
    for m in rows:
        node = tree
        parts = m.key.split(".") if m.key else ["<root>"]
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                break
        else:
            node[parts[-1]] = m

    def total(node: Any) -> int:
        if isinstance(node, dict):
            return sum(total(v) for v in node.values())
        return node.nbytes or 0 if node.kind == "tensor" else 0

    def walk(node: dict, indent: str) -> None:
        items = list(node.items())
        for n, (name, child) in enumerate(items):
            last = n == len(items) - 1
            branch = "└── " if last else "├── "
            if isinstance(child, dict):
                print(f"{indent}{branch}{oneline(name)}/  ({size(total(child))})")
                walk(child, indent + ("    " if last else "│   "))
            elif child.kind == "tensor":
                print(f"{indent}{branch}{oneline(name)}  {child.dtype} {_shape(child.shape)}  {size(child.nbytes)}")
            else:
                print(f"{indent}{branch}{oneline(name)}  = {_leaf_preview(ckpt.value(child.key))}")

    print(f"{oneline(os.path.basename(ckpt.name))}  ({size(total(tree))})")
    walk(tree, "")


# --- info -------------------------------------------------------------------------------------------------


def cmd_info(args: argparse.Namespace) -> int:
    from .. import open as ckpt_open

    with ckpt_open(args.checkpoint, strict=args.strict, limits=_limits(args)) as ckpt:
        info = ckpt.info()
    if args.json:
        print(_json(info, indent=2))
        return EXIT_OK
    c = info["container"]
    print(f"file        {oneline(info['file'])} ({human(info['size'])})")
    fmt = info["format"]
    if fmt == "zip":
        fmt += f" (root {c.get('root')!r}, {c.get('records')} records"
        fmt += f", {c['compressed_records']} compressed" if c.get("compressed_records") else ""
        fmt += ", zip64)" if c.get("zip64") else ")"
    elif fmt == "legacy":  # the format's own facts (formats.md)
        fmt += f" stream (torch < 1.6 layout: {c.get('storage_keys', 0)} storages after the pickle)"
    elif fmt == "torchscript":
        fmt += f" archive (torch.jit.save; root {c.get('root')!r}, {c.get('code_files', 0)} code files)"
    print(f"format      {fmt}")
    print(f"writer      {info['torch_version_hint']}")
    for name in (".format_version", ".storage_alignment", "version"):
        if name in c:
            print(f"  {name:<20}{oneline(str(c[name]))}")
    print(f"byteorder   {info['byteorder']}")
    kinds = ", ".join(f"{n} {k}" for k, n in info["tensor_kinds"].items())
    print(f"tensors     {info['tensors']} ({kinds or 'none'}) on {info['storages']} storages")
    if info.get("composite_tensors"):
        parts = ", ".join(f"{n} {k}" for k, n in info["composite_tensors"].items())
        print(f"composite   {parts} (tensors made of the tensors above: sparse, nested, per-channel quantized)")
    n = info["elements"]
    print(f"elements    {n:,}" + (f" ({_count(n)})" if n >= 1000 else ""))
    print(f"data        {human(info['tensor_bytes'])}")
    for dt, nb in info["bytes_per_dtype"].items():
        print(f"  {dt:<16}{info['tensors_per_dtype'][dt]:>7} tensors  {human(nb):>10}")
    print(f"other       {info['leaves']} values, {info['containers']} containers, {info['links']} shared")
    if info["unknown_globals"]:
        print(f"opaque      {len(info['unknown_globals'])} classes not imported (shown as data):")
        for q, n in info["unknown_globals"].items():
            print(f"  {oneline(q)} ({n}x)")
    if info["errors"] or info["unsupported"]:
        print(f"problems    {info['errors']} tensors with errors, {info['unsupported']} not served "
              "(see `ckptfs ls`)")
    return EXIT_OK


# --- code -------------------------------------------------------------------------------------------------


def cmd_code(args: argparse.Namespace) -> int:
    """A TorchScript archive's sources: the list, or one file's text (read only, never compiled)."""
    from .. import open as ckpt_open

    with ckpt_open(args.checkpoint, strict=args.strict) as ckpt:
        files = ckpt.code_files()
    if not files:
        raise CkptfsError(f"a {ckpt.format} checkpoint has no TorchScript code", file=ckpt.name)
    if args.path is None:
        for name in files:
            print(name)
        return EXIT_OK
    if args.path not in files:
        raise CkptfsError(f"no code file {args.path!r} (see `ckptfs code {args.checkpoint}`)", file=ckpt.name)
    sys.stdout.write(files[args.path].decode("utf-8", "replace"))
    return EXIT_OK


# --- check ------------------------------------------------------------------------------------------------


def cmd_check(args: argparse.Namespace) -> int:
    from ..torchio.check import run_check

    return run_check(args)


# --- mount / umount -----------------------------------------------------------------------------------------


def cmd_mount(args: argparse.Namespace) -> int:
    from ..mount.daemon import mount_command

    return mount_command(args)


def cmd_umount(args: argparse.Namespace) -> int:
    from ..mount.daemon import umount_command

    return umount_command(args)


# --- main -------------------------------------------------------------------------------------------------


def _count(n: int) -> str:
    """12,345,678 -> '12.3M' (K, M, B, T)."""
    for div, unit in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ckptfs", description="Look inside PyTorch checkpoints without loading them.")
    p.add_argument("--version", action="version", version=f"ckptfs {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks (and FUSE calls for mount)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("checkpoint", help="a .pth/.pt/.ckpt file written by torch.save")
        sp.add_argument("--strict", action="store_true", help="refuse classes outside ckptfs's allowlist")
        sp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    limit_help = ("raise or lower a resource limit for this file, e.g. --limit max_tensors=2000000 "
                  "--limit max_memory=2G (see docs/security.md)")
    sp = sub.add_parser("ls", help="list keys with dtype, shape and size")
    common(sp)
    sp.add_argument("--limit", action="append", metavar="NAME=VALUE", help=limit_help)
    sp.add_argument("pattern", nargs="*", help="only keys matching these globs (e.g. 'encoder.*')")
    sp.add_argument("-t", "--tree", action="store_true", help="show a tree split on '.', with subtree sizes")
    sp.add_argument("--json", action="store_true", help="one JSON object per key (the sidecar fields)")
    sp.add_argument("-b", "--bytes", action="store_true", help="sizes in bytes")
    sp.set_defaults(func=cmd_ls)

    sp = sub.add_parser("info", help="format, writer hints, counts and bytes per dtype")
    common(sp)
    sp.add_argument("--limit", action="append", metavar="NAME=VALUE", help=limit_help)
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_info)

    sp = sub.add_parser("code", help="list or print a TorchScript archive's code/ sources (never run)")
    common(sp)
    sp.add_argument("path", nargs="?", help="a file from the list, e.g. __torch__.py")
    sp.set_defaults(func=cmd_code)

    sp = sub.add_parser("check", help="compare every tensor with torch.load (imports torch)")
    common(sp)
    sp.add_argument("-v", "--verbose", action="store_true", help="a line per key, not only mismatches")
    sp.add_argument("--trust", action="store_true",
                    help="let torch.load run the pickle (weights_only=False); only for files you trust")
    sp.add_argument("--no-progress", action="store_true")
    sp.set_defaults(func=cmd_check)

    sp = sub.add_parser("mount", help="mount a checkpoint as a read-only directory tree")
    sp.add_argument("checkpoint")
    sp.add_argument("mountpoint")
    sp.add_argument("-f", "--foreground", action="store_true", help="stay in the foreground (Ctrl-C unmounts)")
    sp.add_argument("-o", dest="options", action="append", default=[], metavar="OPT[,OPT...]",
                    help="FUSE mount options (allow_other, ...)")
    sp.add_argument("--strict", action="store_true")
    sp.add_argument("-d", "--debug", action="store_true", default=argparse.SUPPRESS,
                    help="log FUSE calls (implies -f unless --log is given)")
    sp.add_argument("--threads", action="store_true", help="serve requests from several threads")
    sp.add_argument("--log", metavar="FILE", help="the daemon's log (read errors, -d traces); default: syslog")
    sp.set_defaults(func=cmd_mount)

    sp = sub.add_parser("umount", help="unmount (also clears a stale mount left by a killed daemon)")
    sp.add_argument("mountpoint")
    sp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sp.set_defaults(func=cmd_umount)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
