"""``ckptfs ls``, ``ckptfs info``, ``ckptfs code``: what a checkpoint holds. Never imports torch."""

from __future__ import annotations

import argparse
import fnmatch
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from ..errors import CkptfsError, oneline
from ..views.namespace import MAX_PIECES
from ..views.safetensors import omitted_notes  # (imported with the module: ls imports nothing while it reads)
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
    sp.add_argument("pattern", nargs="*", default=[], help="only keys matching these globs (e.g. 'encoder.*')")
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
            not_held = omitted_notes(ckpt.catalog)
            for m in rows:
                d = m.to_dict()
                why = not_held.get(ckpt.row(m.key)) if m.kind == "tensor" else None
                if why:
                    d["not_in_safetensors"] = why
                print(json_text(d))
            return EXIT_OK
        if args.tree:
            print_tree(ckpt, rows, args)
            return EXIT_OK
        size = (lambda n: str(n)) if args.bytes else human
        not_held = omitted_notes(ckpt.catalog)  # what a safetensors view / export leaves out, and why
        table = [("KEY", "DTYPE", "SHAPE", "SIZE", "")]
        n_t = total = 0
        for m in rows:
            if m.kind == "tensor":
                t = m.tensor_node
                assert t is not None  # a tensor row's meta
                nb = nbytes(t)
                n_t += 1
                total += 0 if t.error else nb  # (as info: a tensor that is not served holds no data)
                note = t.error and f"error: {t.error}" or t.unsupported and f"({t.kind}: not served)" or ""
                why = not_held.get(ckpt.row(m.key)) if not t.error else None
                if why:
                    note = (note + "; " if note else "") + f"(not in safetensors: {why})"
                table.append((oneline(m.key), t.dtype.name, shape_text(t.shape), size(nb), oneline(note) if note else ""))
            else:
                table.append((oneline(m.key), oneline(m.type or m.kind), "-", "-", leaf_preview(ckpt.value(m.key))))
        print_table(table)
        print(f"{n_t} tensors, {len(rows) - n_t} other values, {size(total)} of tensor data", file=sys.stderr)
        for name, e in ckpt.catalog.problems:  # files of a directory that could not be indexed
            print(f"ckptfs: left out {oneline(name)}: {e.reason}", file=sys.stderr)
    return EXIT_OK


@dataclass
class _Branch:
    """A level of ``ls --tree``: the keys that end here (a key can also be a prefix of others, and two
    keys can dot alike) and the levels below, with the bytes of the served tensors under it."""

    leaves: list[Any] = field(default_factory=list)
    children: dict[str, _Branch] = field(default_factory=dict)
    total: int = 0


def print_tree(ckpt: Any, rows: list[Any], args: argparse.Namespace) -> None:
    """Keys split on '.' (at most MAX_PIECES levels, as in the mount), subtrees with their total size (like
    du). Built and printed without recursion: a key of 10^5 dots is 64 levels."""
    size = (lambda n: str(n)) if args.bytes else human
    root = _Branch()
    for m in rows:
        nb = (m.nbytes or 0) if m.kind == "tensor" and not m.error else 0
        node = root
        for p in m.key.split(".", MAX_PIECES - 1) if m.key else ["<root>"]:
            node.total += nb  # (the levels above the key: a key that is also a prefix is not its own subtree)
            node = node.children.setdefault(p, _Branch())
        node.leaves.append(m)

    def items(b: _Branch) -> list[tuple[str, Any]]:
        return [(name, x) for name, c in b.children.items() for x in [*c.leaves, *([c] if c.children else [])]]

    print(f"{oneline(os.path.basename(ckpt.name))}  ({size(root.total)})")
    stack = [(iter(items(root)), "", len(items(root)))]
    counts = [0]
    while stack:
        it, indent, n = stack[-1]
        item = next(it, None)
        if item is None:
            stack.pop()
            counts.pop()
            continue
        counts[-1] += 1
        last = counts[-1] == n
        branch = "└── " if last else "├── "
        name, child = item
        if isinstance(child, _Branch):
            print(f"{indent}{branch}{oneline(name)}/  ({size(child.total)})")
            sub = items(child)
            stack.append((iter(sub), indent + ("    " if last else "│   "), len(sub)))
            counts.append(0)
        elif child.kind == "tensor":
            print(f"{indent}{branch}{oneline(name)}  {child.dtype} {shape_text(child.shape)}  {size(child.nbytes)}")
        else:
            print(f"{indent}{branch}{oneline(name)}  = {leaf_preview(ckpt.value(child.key))}")


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
    elif fmt == "safetensors":
        fmt += f" (header {human(c.get('header_bytes'))}, {c.get('tensors', 0)} tensors)"
    elif fmt == "dcp":
        fmt += f" (torch.distributed.checkpoint: {_dcp_counts(c)})"
    elif fmt == "hf-sharded":
        lay = info["layout"]
        fmt += (f" ({lay.get('shards')} {lay.get('index_kind')} shards; index "
                f"{', '.join(oneline(str(i)) for i in lay.get('index', []))})")
    elif fmt == "directory":
        fmt += f" ({len(info['members'])} checkpoints, {len(info['files'])} other files)"
    print(f"format      {fmt}")
    members = info.get("members", []) if fmt.startswith("directory") else []
    width = max([40] + [len(oneline(m["name"] or ".")) + 2 for m in members])  # a long name keeps its column gap
    for m in members:
        print(f"  {oneline(m['name'] or '.'):<{width}}{m['format']:<13}{human(m['size']):>10}")
    if info.get("format") == "directory" and info["members"] and info["members"][0]["format"] == "dcp":
        print(f"  dcp         {_dcp_counts(c)}")
    for name, value in list((info.get("metadata") or {}).items())[:20]:
        print(f"  metadata    {oneline(name)} = {oneline(value[:100])}")
    if info["torch_version_hint"] and info["format"] in ("zip", "legacy", "torchscript", "safetensors", "dcp"):
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
    if info.get("files"):
        shown = ", ".join(oneline(f["path"]) for f in info["files"][:8])
        more = f" and {len(info['files']) - 8} more" if len(info["files"]) > 8 else ""
        print(f"files       {len(info['files'])} other files: {shown}{more}")
    if info["errors"] or info["unsupported"]:
        print(f"problems    {info['errors']} tensors with errors, {info['unsupported']} not served "
              "(see `ckptfs ls`)")
    for problem in info.get("problems", []):
        print(f"left out   {oneline(problem)}")
    return EXIT_OK


def _dcp_counts(c: dict[str, Any]) -> str:
    out = (f"{c.get('entries', 0)} entries: {c.get('tensors', 0)} tensors in {c.get('chunks', 0)} chunks, "
           f"{c.get('values', 0)} values; {c.get('files', 0)} .distcp files")
    if c.get("compressed_entries"):
        out += f", {c['compressed_entries']} entries zstd-compressed"
    return out


def cmd_code(args: argparse.Namespace) -> int:
    """A TorchScript archive's sources: the list, or one file's text (read only, never compiled)."""
    with open_checkpoint(args.checkpoint, args) as ckpt:
        files = ckpt.code_files()
    if not files:
        raise CkptfsError(f"a {ckpt.format} checkpoint has no TorchScript code", file=ckpt.name)
    if args.path is None:  # names escaped as ls escapes keys (a name may hold ESC sequences, newlines)
        for name in files:
            print(oneline(name))
        return EXIT_OK
    shown = {oneline(name): name for name in files}  # a name as the list shows it works too
    path = args.path if args.path in files else shown.get(args.path)
    if path is None:
        raise CkptfsError(f"no code file {args.path!r} (see `ckptfs code {args.checkpoint}`)", file=ckpt.name)
    sys.stdout.write(files[path].decode("utf-8", "replace"))
    return EXIT_OK
