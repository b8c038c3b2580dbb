"""``ckptfs ls``, ``ckptfs info``, ``ckptfs code``: what a checkpoint holds. Never imports torch."""

from __future__ import annotations

import argparse
import fnmatch
import os
import sys
from typing import Any

from ..errors import CkptfsError, oneline
from .common import (
    EXIT_OK,
    add_checkpoint_args,
    count_text,
    examples,
    human,
    json_text,
    leaf_preview,
    open_checkpoint,
    print_table,
    shape_text,
)


def register(sub: Any) -> None:
    sp = sub.add_parser("ls", help="list keys with dtype, shape and size",
                        **examples("ckptfs ls model.pth", "ckptfs ls model.pth 'encoder.*' -b   # sizes in bytes",
                                   "ckptfs ls --tree model.pth            # like du", "ckptfs ls --json model.pth | jq ."))
    add_checkpoint_args(sp, limits=True)
    sp.add_argument("pattern", nargs="*", help="only keys matching these globs (e.g. 'encoder.*')")
    sp.add_argument("-t", "--tree", action="store_true", help="show a tree split on '.', with subtree sizes")
    sp.add_argument("--json", action="store_true", help="one JSON object per key (the sidecar fields)")
    sp.add_argument("-b", "--bytes", action="store_true", help="sizes in bytes")
    sp.set_defaults(func=cmd_ls)

    sp = sub.add_parser("info", help="format, writer hints, counts and bytes per dtype",
                        **examples("ckptfs info model.pth", "ckptfs info --json model.pth"))
    add_checkpoint_args(sp, limits=True)
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_info)

    sp = sub.add_parser("code", help="list or print a TorchScript archive's code/ sources (never run)",
                        **examples("ckptfs code scripted.pt                  # the list",
                                   "ckptfs code scripted.pt __torch__.py     # one file's text"))
    add_checkpoint_args(sp)
    sp.add_argument("path", nargs="?", help="a file from the list, e.g. __torch__.py")
    sp.set_defaults(func=cmd_code)


def cmd_ls(args: argparse.Namespace) -> int:
    from ..model.tensors import nbytes, validate_all

    with open_checkpoint(args.checkpoint, args) as ckpt:
        index = ckpt.index
        validate_all(index, ckpt.limits)  # the error column needs every tensor checked
        rows = []
        for i in index.leaves():
            key = index.keys[i]
            if args.pattern and not any(fnmatch.fnmatchcase(key, p) for p in args.pattern):
                continue
            rows.append(ckpt.meta(key))
        if args.json:
            for m in rows:
                print(json_text(m.to_dict()))
            return EXIT_OK
        if args.tree:
            print_tree(ckpt, rows, args)
            return EXIT_OK
        size = (lambda n: str(n)) if args.bytes else human
        table = [("KEY", "DTYPE", "SHAPE", "SIZE", "")]
        n_t = total = 0
        for m in rows:
            if m.kind == "tensor":
                t = m.tensor_node
                assert t is not None  # a tensor row's meta
                nb = nbytes(t)
                n_t += 1
                total += nb
                note = t.error and f"error: {t.error}" or t.unsupported and f"({t.kind}: not served)" or ""
                table.append((oneline(m.key), t.dtype.name, shape_text(t.shape), size(nb), oneline(note) if note else ""))
            else:
                table.append((oneline(m.key), oneline(m.type or m.kind), "-", "-", leaf_preview(ckpt.value(m.key))))
        print_table(table)
        print(f"{n_t} tensors, {len(rows) - n_t} other values, {size(total)} of tensor data", file=sys.stderr)
    return EXIT_OK


def print_tree(ckpt: Any, rows: list[Any], args: argparse.Namespace) -> None:
    """Keys split on '.', subtrees with their total size (like du)."""
    size = (lambda n: str(n)) if args.bytes else human
    tree: dict[str, Any] = {}
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

    def walk(node: dict[str, Any], indent: str) -> None:
        items = list(node.items())
        for n, (name, child) in enumerate(items):
            last = n == len(items) - 1
            branch = "└── " if last else "├── "
            if isinstance(child, dict):
                print(f"{indent}{branch}{oneline(name)}/  ({size(total(child))})")
                walk(child, indent + ("    " if last else "│   "))
            elif child.kind == "tensor":
                print(f"{indent}{branch}{oneline(name)}  {child.dtype} {shape_text(child.shape)}  {size(child.nbytes)}")
            else:
                print(f"{indent}{branch}{oneline(name)}  = {leaf_preview(ckpt.value(child.key))}")

    print(f"{oneline(os.path.basename(ckpt.name))}  ({size(total(tree))})")
    walk(tree, "")


# --- info ---------------------------------------------------------------------------------------------


def cmd_info(args: argparse.Namespace) -> int:
    with open_checkpoint(args.checkpoint, args) as ckpt:
        info = ckpt.info()
    if args.json:
        print(json_text(info, indent=2))
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
    print(f"elements    {n:,}" + (f" ({count_text(n)})" if n >= 1000 else ""))
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


def cmd_code(args: argparse.Namespace) -> int:
    """A TorchScript archive's sources: the list, or one file's text (read only, never compiled)."""
    with open_checkpoint(args.checkpoint, args) as ckpt:
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
