"""A directory as one catalog: a DCP checkpoint, a Hugging Face sharded checkpoint, or checkpoint files.

What a directory is, decided from its listing (docs/layout.md, section 8, is the contract):

1. ``.metadata`` and ``*.distcp`` files: a **DCP checkpoint**; its state_dict is the tree.
2. ``*.safetensors.index.json`` or ``*.bin.index.json``: a **sharded checkpoint**; the shards the index
   names are united into one tree (:mod:`ckptfs.model.sharded` checks the index against them). If both
   kinds are there, the safetensors index is used (as transformers does) and the other files are
   other files. Several indexes of the chosen kind: each is a subtree named by its prefix.
3. Otherwise its **checkpoint files** (``.pt .pth .pth.tar .bin .ckpt .safetensors .tar``) and its
   subdirectories that hold checkpoints (recursively, up to ``MAX_DEPTH`` levels): each a subtree named by
   the file's name without its checkpoint extension (``epoch_1.pt`` -> ``epoch_1``) or by the
   subdirectory's name. A directory whose only checkpoint is one file shows that file's tree itself.
   A file that is not a checkpoint after all, or is damaged, is left out of the tree and listed in
   ``Catalog.problems``; its bytes stay reachable as an other file.

Every other file (config.json, tokenizer files, README, the index itself ...) is an *other file*: served
read-only and byte-exact (Attachments of group "file", at their path relative to the directory).
Everything goes through a :class:`~ckptfs.source.Directory`: local today, remote alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..container import Container, open_container
from ..container.base import Attachment
from ..container.dcp import DcpCheckpoint, is_dcp_directory
from ..container.dcp.checkpoint import metadata_files
from ..errors import CkptfsError, FormatError, LimitError
from ..limits import DEFAULT_LIMITS, Limits
from ..source import Directory, DirEntry
from .catalog import Catalog
from .index import Group
from .sharded import INDEX_SUFFIXES, SAFETENSORS_INDEX, ShardIndex, cross_check, read_index

#: File name endings of checkpoint files (longest first: ".pth.tar" before ".tar").
CHECKPOINT_SUFFIXES = (".safetensors", ".pth.tar", ".ckpt", ".pth", ".pt", ".bin", ".tar")
MAX_DEPTH = 8
FILE_GROUP = "file"


def member_key(file_name: str) -> str:
    """The key a checkpoint file's subtree has: its name without the checkpoint extension."""
    for suffix in CHECKPOINT_SUFFIXES:
        if file_name.endswith(suffix) and len(file_name) > len(suffix):
            return file_name[: -len(suffix)]
    return file_name


@dataclass
class _Plan:
    directory: Directory
    limits: Limits
    openers: list[tuple[str, Callable[[], Container]]] = field(default_factory=list)
    files: list[DirEntry] = field(default_factory=list)
    indexes: list[ShardIndex] = field(default_factory=list)
    entries: dict[str, DirEntry] = field(default_factory=dict)  # member files, by path
    refused: list[DirEntry] = field(default_factory=list)  # symlinks out, dangling symlinks, devices ...
    counted: int = 0

    def add_file_member(self, entry: DirEntry) -> int:
        directory, limits = self.directory, self.limits

        def open_file() -> Container:
            source = directory.open(entry.path)
            try:
                return open_container(source, limits)
            except BaseException as e:
                source.close()
                if isinstance(e, CkptfsError):
                    raise e.at(file=source.name) from None
                raise

        self.openers.append((entry.path, open_file))
        self.entries[entry.path] = entry
        return len(self.openers) - 1

    def add_dcp_member(self, path: str) -> int:
        directory, limits = self.directory, self.limits
        self.openers.append((path, lambda: DcpCheckpoint(directory, limits, path)))
        return len(self.openers) - 1

    def listing(self, path: str) -> list[DirEntry]:
        """The entries of ``path`` that may be opened (the others are kept in ``refused``)."""
        entries = self.directory.list(path)
        self.counted += len(entries)
        if self.counted > self.limits.max_records:
            raise LimitError(f"more than {self.limits.max_records} files in the directory",
                             file=self.directory.name)
        self.refused += [e for e in entries if e.refused]
        return [e for e in entries if not e.refused]


def open_directory(directory: Directory, *, strict: bool = False, limits: Limits = DEFAULT_LIMITS) -> Catalog:
    """Index the directory as the module doc says (FormatError when nothing in it is a checkpoint)."""
    plan = _Plan(directory, limits)
    group, layout = _walk(plan, "", 0)
    if group is None or not plan.openers:
        top = [e.name for e in directory.list("") if not e.is_dir]
        if metadata_files(top):
            raise FormatError(f"a DCP {metadata_files(top)[0]} with no *.distcp data file beside it (an incomplete "
                              "DCP checkpoint)", file=directory.name)
        raise FormatError("no checkpoint in this directory (no DCP .metadata, no *.index.json, no "
                          f"{', '.join(CHECKPOINT_SUFFIXES)} files)", file=directory.name)
    tolerant = layout["format"] == "directory"
    catalog = Catalog.assemble(plan.openers, group, name=directory.name, strict=strict, limits=limits,
                               layout=layout, tolerant=tolerant, concurrency=directory.concurrency)
    try:
        for index in plan.indexes:
            cross_check(catalog, index, directory.display(index.path))
    except BaseException:
        catalog.close()
        raise
    catalog.problems += [(e.path, FormatError(f"refused: {e.refused}", file=directory.display(e.path)))
                         for e in plan.refused]
    failed = [plan.entries[name] for name, _ in catalog.problems if name in plan.entries]
    other = plan.files + failed
    catalog.files = [_attachment(directory, e) for e in sorted(other, key=lambda e: e.path)]
    catalog.layout["files"] = len(catalog.files)
    if catalog.problems:
        catalog.layout["problems"] = [f"{name}: {e.reason}" for name, e in catalog.problems]
    return catalog


def _attachment(directory: Directory, entry: DirEntry) -> Attachment:
    return Attachment(FILE_GROUP, entry.path, entry.size, lambda: directory.open(entry.path))


def _walk(plan: _Plan, path: str, depth: int) -> tuple[Group | None, dict[str, Any]]:
    """The group of directory ``path`` (None when nothing in it is a checkpoint: its files are then other
    files) and what it is (its layout)."""
    entries = plan.listing(path)
    files = [e for e in entries if not e.is_dir]
    names = [e.name for e in files]
    where = path or "."
    refused_here = [e.name for e in plan.refused if e.path == (f"{path}/{e.name}" if path else e.name)]
    if is_dcp_directory(names + refused_here):  # (a refused .distcp: its chunks say why they cannot be read)
        m = plan.add_dcp_member(path)
        dcp_files = set(metadata_files(names))
        plan.files += [e for e in files if e.name not in dcp_files and not e.name.endswith(".distcp")]
        plan.files += _all_files(plan, [e for e in entries if e.is_dir], depth)
        return Group(flat=[m]), {"format": "dcp", "directory": where}
    index_files = [e for e in files if e.name.endswith(INDEX_SUFFIXES)]
    if index_files:
        return _sharded(plan, path, entries, index_files, depth)
    group = Group()
    subtrees: list[str] = []
    consumed: set[str] = set()
    for e in files:
        if e.name.endswith(CHECKPOINT_SUFFIXES):
            group.named.append((member_key(e.name), plan.add_file_member(e)))
            subtrees.append(e.path)
            consumed.add(e.path)
    for e in entries:
        if not e.is_dir:
            continue
        sub = None
        if depth < MAX_DEPTH:
            sub, _ = _walk(plan, e.path, depth + 1)
        if sub is None:
            if depth >= MAX_DEPTH:
                plan.files += _all_files(plan, [e], MAX_DEPTH)
            continue
        group.named.append((e.name, sub))
        subtrees.append(e.path + "/")
    plan.files += [e for e in files if e.path not in consumed]
    if not group.named:
        return None, {}
    if len(group.named) == 1 and not isinstance(group.named[0][1], Group):  # one checkpoint: its own tree
        group = Group(flat=[group.named[0][1]])
    return group, {"format": "directory", "directory": where, "members": subtrees}


def _sharded(plan: _Plan, path: str, entries: list[DirEntry], index_files: list[DirEntry],
             depth: int) -> tuple[Group, dict[str, Any]]:
    safetensors = [e for e in index_files if e.name.endswith(SAFETENSORS_INDEX)]
    chosen = safetensors or index_files
    sizes = {e.path: e.size for e in entries if not e.is_dir}
    available = set(sizes)
    group = Group()
    consumed: set[str] = set()
    shards = 0
    refused = {e.path: e.refused for e in plan.refused}
    for e in chosen:
        index = read_index(plan.directory, e.path, plan.limits)
        sub = Group()
        for shard in index.shards:
            if shard in refused:
                raise FormatError(f"refused: the shard {shard}: {refused[shard]}", file=plan.directory.display(e.path))
            if shard not in available:
                why = _cannot_open(plan.directory, shard)
                if why is not None:
                    key = next(k for k, s in index.weight_map.items() if s == shard)
                    raise FormatError(f"the shard {shard} that the index maps keys to {why}",
                                      file=plan.directory.display(e.path), record=key)
            sub.flat.append(plan.add_file_member(DirEntry(shard, sizes.get(shard, 0), False)))
            consumed.add(shard)
        plan.indexes.append(index)
        shards += len(index.shards)
        if len(chosen) == 1:
            group = sub
        else:
            group.named.append((index.prefix, sub))
    plan.files += [e for e in entries if not e.is_dir and e.path not in consumed]
    plan.files += _all_files(plan, [e for e in entries if e.is_dir], depth)
    layout = {"format": "hf-sharded", "directory": path or ".", "index": [e.path for e in chosen],
              "index_kind": "safetensors" if safetensors else "bin", "shards": shards}
    return group, layout


def _cannot_open(directory: Directory, path: str) -> str | None:
    """A shard not in the top listing (in a subdirectory): None if it opens, else why not ("is missing", or
    the directory's refusal: a symlink out of it ...)."""
    if "/" not in path:
        return "is missing"
    try:
        directory.open(path).close()
    except FormatError as e:
        return f"is {e.reason}" if e.reason.startswith("refused") else "is missing"
    except CkptfsError:
        return "is missing"
    return None


def _all_files(plan: _Plan, dirs: list[DirEntry], depth: int) -> list[DirEntry]:
    """Every file under ``dirs`` (other files of a checkpoint directory's subdirectories)."""
    out: list[DirEntry] = []
    stack = [(d, depth) for d in dirs]
    while stack:
        d, level = stack.pop()
        if level > MAX_DEPTH:
            continue
        for e in plan.listing(d.path):
            if e.is_dir:
                stack.append((e, level + 1))
            else:
                out.append(e)
    return out

