"""What a conversion view or an export starts from: a catalog, how it maps to safetensors files, and the
other files of a model directory (passed through byte-exact).

* a file (or a remote object, a byte source): ``name.ext`` becomes ``name.safetensors``;
* a DCP directory (``.metadata``): one ``model.safetensors``;
* an HF directory of safetensors shards (``model.safetensors.index.json``): one output file per shard,
  ``model-0000i-of-0000n.safetensors`` plus ``model.safetensors.index.json`` (the prefix is the index's);
* an HF directory of PyTorch weights — ``pytorch_model.bin``, or shards listed by
  ``pytorch_model.bin.index.json`` (also variants such as ``pytorch_model.bin.index.fp16.json`` and
  other prefixes such as ``adapter_model``): ``model.safetensors`` or ``model-0000i-of-0000n.safetensors``
  plus ``model.safetensors.index.json``, one output file per input shard; an HF directory whose weights
  are one ``model.safetensors`` (or ``adapter_model.safetensors``) likewise;
* any other directory ckptfs opens (:func:`ckptfs.model.opener.open_catalog`): its only checkpoint
  ``name.ext`` becomes ``name.safetensors``; a directory of several (unrelated) checkpoints becomes one
  ``<name>.safetensors`` per checkpoint file, at its place (``run1/epoch_2.pt`` ->
  ``run1/epoch_2.safetensors``; a DCP checkpoint in ``step_100/`` -> ``step_100/model.safetensors``), its
  tensors named as in that file alone.

Every other file of a directory (config.json, tokenizer files, sub-directories, the other checkpoint files
of an HF model directory such as ``optimizer.pt``) is passed through. HF weights found by name are opened
here with :meth:`~ckptfs.model.catalog.Catalog.merge` of the shards the index names (``flat``: one key
space), the other directories by :func:`~ckptfs.model.opener.open_catalog` (index cross-checks, DCP
assembly, a directory of checkpoints: :mod:`ckptfs.model.directory`); only the naming is decided here.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial

from ..container.dcp.checkpoint import is_dcp_directory
from ..errors import CkptfsError, FormatError, LimitError
from ..limits import DEFAULT_LIMITS, Limits
from ..model.catalog import Catalog
from ..model.directory import member_key, open_directory
from ..model.index import DICT, Group
from ..model.opener import Target, resolve
from ..model.sharded import BIN_INDEX, SAFETENSORS_INDEX, ShardIndex, cross_check, read_index
from ..source import ByteSource, Directory, DirEntry
from ..source.options import RemoteOptions
from .safetensors import FORMAT_KEY, RESERVED_PREFIX, SafetensorsFile, Selection, relative_key, select

#: index files of sharded PyTorch weights: <prefix>.bin.index[.<variant>].json
_INDEX_RE = re.compile(r"^(?P<prefix>.+)\.bin\.index(?:\.(?P<variant>[^./]+))?\.json$")
#: single-file PyTorch weights of a model directory: <prefix>[.<variant>].bin
_WEIGHTS_RE = re.compile(r"^(?P<prefix>pytorch_model|adapter_model)(?:\.(?P<variant>[^./]+))?\.bin$")
#: single-file safetensors weights of a model directory: <prefix>[.<variant>].safetensors
_ST_WEIGHTS_RE = re.compile(r"^(?P<prefix>model|adapter_model)(?:\.(?P<variant>[^./]+))?\.safetensors$")
#: Entries a model directory's pass-through may hold (files and directories), and how deep.
MAX_PASSTHROUGH = 100_000
MAX_PASSTHROUGH_DEPTH = 32
RESERVED = ".ckptfs"
log = logging.getLogger("ckptfs.views")
#: Catalog.layout formats of directories (a one-file catalog has no format there)
_DIRECTORY_FORMATS = ("dcp", "hf-sharded", "directory")


@dataclass(frozen=True)
class PassThrough:
    """A file of a model directory shown (or copied) as it is: opened through its directory (which refuses
    a path that leaves it), its size as listed (a file that changed size since is refused when opened)."""

    path: str  # relative, '/'-separated
    size: int
    open: Callable[[], ByteSource]


@dataclass(frozen=True)
class Part:
    """One output file of a directory of checkpoints (kind ``"members"``): the index rows it holds, and the
    key its names are relative to (``base``: "" for none; the row whose key is ``base`` itself is the
    file's root, ``%root``)."""

    path: str  # relative, '/'-separated: run1/epoch_2.safetensors
    roots: list[int]
    base: str


@dataclass
class ModelSource:
    """A checkpoint to present or write as safetensors.

    ``kind`` is ``"file"`` (one checkpoint: ``<stem>.safetensors``), ``"hf"`` (an HF directory, or a
    directory of one checkpoint: one output shard per member, named after ``prefix`` / ``variant``),
    ``"dcp"`` (one ``model.safetensors``) or ``"members"`` (a directory of several checkpoints: one file
    per member, ``parts``)."""

    catalog: Catalog
    path: str
    kind: str
    stem: str = "model"  # "file": the output is <stem>.safetensors
    prefix: str = "model"  # "hf": model-00001-of-00002.safetensors, model.safetensors.index.json
    variant: str | None = None
    passthrough: list[PassThrough] = field(default_factory=list)
    hidden: list[str] = field(default_factory=list)  # the directory's files that the view replaces
    parts: list[Part] = field(default_factory=list)  # "members": the output files

    @property
    def is_directory(self) -> bool:
        return self.kind != "file"

    def close(self) -> None:
        self.catalog.close()


def open_model(target: Target | Catalog, *, strict: bool = False, limits: Limits = DEFAULT_LIMITS,
               storage_options: Mapping[str, object] | None = None,
               remote: RemoteOptions | None = None) -> ModelSource:
    """Open ``target`` (a checkpoint file, a model directory local or remote, a URL, a source or a catalog)."""
    if isinstance(target, Catalog):
        if target.layout.get("format") in _DIRECTORY_FORMATS:
            return _model_of_catalog(target)  # a directory ckptfs.open opened: named as if opened here
        return ModelSource(target, target.name, "file", stem=output_stem(target.name))
    what = resolve(target, storage_options=storage_options, remote=remote)
    if isinstance(what, Directory):
        return _open_directory(what, strict=strict, limits=limits)
    catalog = Catalog.open(what, strict=strict, limits=limits)
    return ModelSource(catalog, catalog.name, "file", stem=output_stem(catalog.name))


def output_stem(name: str) -> str:
    """``model.pth`` -> ``model``; a URL's last path component likewise; ``model`` when nothing is left."""
    base = name.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0]
    stem = base.rsplit(".", 1)[0] if "." in base.lstrip(".") else base
    return stem if stem not in ("", ".", "..") else "model"


# --- model directories -------------------------------------------------------------------------------------------


def _open_directory(directory: Directory, *, strict: bool, limits: Limits) -> ModelSource:
    entries = directory.list("")
    names = [e.name for e in entries if not e.is_dir]
    files = [e.name for e in entries if not e.is_dir and not e.refused]
    if not is_dcp_directory(names) and not any(n.endswith(SAFETENSORS_INDEX) for n in files):
        found = _hf_weights(directory, entries, limits)
        if found is not None:
            return _open_hf_weights(directory, found, strict=strict, limits=limits)
    # DCP, safetensors shards (index cross-checked), a directory of checkpoints: ckptfs.open's own reading
    catalog = open_directory(directory, strict=strict, limits=limits)
    try:
        return _model_of_catalog(catalog)
    except BaseException:
        catalog.close()
        raise


@dataclass
class _Weights:
    """An HF model directory's weights found by name: the files the view replaces (the index first, if
    any), the shards, the parsed index, the output prefix and variant."""

    hidden: list[str]
    shards: list[str]
    index: ShardIndex | None
    prefix: str
    variant: str | None


def _hf_weights(directory: Directory, entries: list[DirEntry], limits: Limits) -> _Weights | None:
    """An HF model directory's weights found by name (as transformers looks for them), or None. Shards a
    ``.bin`` index lists (the plain index before variants: the others are passed through), read and checked
    as ``ckptfs.open`` reads them (:mod:`ckptfs.model.sharded`); else one weights file (plain before
    variants, safetensors before .bin)."""
    files = [e.name for e in entries if not e.is_dir and not e.refused]
    refused = {e.path: e.refused for e in entries if e.refused}
    indexes = [n for n in files if _INDEX_RE.match(n)]
    if indexes:
        indexes.sort(key=lambda n: (_INDEX_RE.match(n).group("variant") is not None, n))  # type: ignore[union-attr]
        m = _INDEX_RE.match(indexes[0])
        assert m is not None
        index = read_index(directory, indexes[0], limits)
        shown = directory.display(index.path)
        for shard in index.shards:
            if shard in refused:
                raise FormatError(f"refused: the shard {shard}: {refused[shard]}", file=shown)
            if "/" not in shard and shard not in files:
                key = next(k for k, v in index.weight_map.items() if v == shard)
                raise FormatError(f"the shard {shard} that the index maps keys to is missing", file=shown,
                                  record=key)
        return _Weights([indexes[0], *index.shards], index.shards, index, _hf_prefix(m.group("prefix")),
                        m.group("variant"))
    singles = [(n, m) for n in files if (m := _WEIGHTS_RE.match(n) or _ST_WEIGHTS_RE.match(n)) is not None]
    if not singles:
        return None
    singles.sort(key=lambda nm: (nm[1].group("variant") is not None, not nm[0].endswith(".safetensors"), nm[0]))
    name, m = singles[0]
    return _Weights([name], [name], None, _hf_prefix(m.group("prefix")), m.group("variant"))


def _open_hf_weights(directory: Directory, weights: _Weights, *, strict: bool, limits: Limits) -> ModelSource:
    """The weights merged into one key space, the index (if any) cross-checked with the shards."""
    sources: list[tuple[str, ByteSource]] = []
    try:
        for name in weights.shards:
            sources.append((name, directory.open(name)))
    except BaseException:
        for _, s in sources:
            s.close()
        raise
    catalog = Catalog.merge(sources, name=directory.name, flat=True, strict=strict, limits=limits)
    try:
        if weights.index is not None:
            cross_check(catalog, weights.index, directory.display(weights.index.path))
        hidden = set(weights.hidden)
        passthrough = scan_passthrough(directory, exclude=hidden)
    except BaseException:
        catalog.close()
        raise
    return ModelSource(catalog, directory.name, "hf", prefix=weights.prefix, variant=weights.variant,
                       passthrough=passthrough, hidden=weights.hidden)


def _model_of_catalog(catalog: Catalog) -> ModelSource:
    """How a directory catalog (:func:`ckptfs.model.directory.open_directory`) maps to safetensors files;
    its other files are passed through."""
    layout, group = catalog.layout, catalog.group
    fmt = layout.get("format")
    root = catalog.name
    exclude: set[str] = set()
    if fmt == "dcp":
        model = ModelSource(catalog, root, "dcp")
    elif fmt == "hf-sharded" and len(layout.get("index", ())) == 1:
        index = layout["index"][0]
        name = index.rsplit("/", 1)[-1]
        if layout.get("index_kind") == "safetensors":
            prefix = name[: -len(SAFETENSORS_INDEX)]
        else:
            prefix = _hf_prefix(name[: -len(BIN_INDEX)])
        exclude.add(index)  # the view writes its own
        model = ModelSource(catalog, root, "hf", prefix=prefix or "model")
    elif fmt == "directory" and group is not None and len(group.flat) == 1 and not group.named:
        name = catalog.members[0].name  # the directory's only checkpoint (a file at its top)
        m = _WEIGHTS_RE.match(name) or _ST_WEIGHTS_RE.match(name)
        prefix, variant = (_hf_prefix(m.group("prefix")), m.group("variant")) if m else (member_key(name), None)
        model = ModelSource(catalog, root, "hf", prefix=prefix, variant=variant)
    else:
        model = ModelSource(catalog, root, "members", parts=member_parts(catalog))
    model.hidden = [m.name for m in catalog.members if m.name]
    model.passthrough = _files_passthrough(catalog, exclude)
    return model


def _files_passthrough(catalog: Catalog, exclude: set[str]) -> list[PassThrough]:
    """The catalog's other files (``Catalog.files``: every file of the directory that is no member, the
    bytes of members that failed to open included) as pass-through files."""
    out = [PassThrough(a.path, a.size, a.open) for a in catalog.files
           if a.path not in exclude and a.path.split("/", 1)[0] != RESERVED]
    if len(out) > MAX_PASSTHROUGH:
        raise LimitError(f"more than {MAX_PASSTHROUGH} files in the model directory", file=catalog.name)
    out.sort(key=lambda p: p.path)
    return out


# --- a directory of checkpoints: one file per member -------------------------------------------------------------


def member_parts(catalog: Catalog) -> list[Part]:
    """One output file per member of a directory catalog, at the member's place: ``run1/epoch_2.pt`` ->
    ``run1/epoch_2.safetensors``, a DCP checkpoint ``step_100/`` -> ``step_100/model.safetensors``
    (a name taken twice: ``epoch_2.pt.safetensors``)."""
    index = catalog.index
    owners, keys, kinds, names = index.owners, index.keys, index.kinds, index.names
    assert owners is not None
    named = _named_members(catalog.group)
    tops: dict[int, list[int]] = {}  # member -> its rows just below the groups (ckptfs's own rows)
    stack = [0]
    while stack:
        g = stack.pop()
        for c in index.children(g):
            if owners[c] < 0:
                stack.append(c)
            else:
                tops.setdefault(owners[c], []).append(c)
    parts: list[Part] = []
    taken: set[str] = set()
    for m, member in enumerate(catalog.members):
        rows = sorted(tops.get(m, []))
        if len(rows) == 1 and (m in named or names[rows[0]] == member.name):  # placed under its name
            r = rows[0]
            base = keys[r]
            roots = list(index.children(r)) if kinds[r] == DICT else [r]
        else:  # its top-level dict spread into a group: names below the group's key
            parent = index.parents[rows[0]] if rows else 0
            base = keys[parent] if parent > 0 else ""
            roots = rows
        if member.container.kind == "dcp":
            path = f"{member.name}/model.safetensors" if member.name else "model.safetensors"
        else:
            folder, _, file = member.name.rpartition("/")
            path = (f"{folder}/" if folder else "") + member_key(file) + ".safetensors"
        if path in taken:
            path = (member.name.rstrip("/") or "model") + ".safetensors"
            n = 2
            while path in taken:
                path = f"{member.name.rstrip('/') or 'model'}#{n}.safetensors"
                n += 1
        taken.add(path)
        parts.append(Part(path, roots, base))
    return parts


def _named_members(group: Group | None) -> set[int]:
    out: set[int] = set()
    stack = [group] if group is not None else []
    while stack:
        g = stack.pop()
        for _, what in g.named:
            if isinstance(what, Group):
                stack.append(what)
            else:
                out.add(what)
    return out


def member_files(model: ModelSource) -> tuple[list[tuple[str, SafetensorsFile]], dict[str, str]]:
    """The safetensors files of a ``"members"`` model, one per part, each named and keyed as its checkpoint
    file alone would be; and everything omitted (by its key in the directory's tree)."""
    files: list[tuple[str, SafetensorsFile]] = []
    omitted: dict[str, str] = {}
    for part in model.parts:
        sel = select(model.catalog, part.roots, part.base)
        omitted.update(sel.omitted)
        metadata = _relative(sel, part.base, omitted)
        files.append((part.path, SafetensorsFile(sel.tensors, metadata, name=part.path)))
    return files, omitted


def _relative(sel: Selection, base: str, omitted: dict[str, str]) -> dict[str, str]:
    """Rename a selection's tensors, values and omitted entries relative to ``base`` (its metadata, then)."""
    if not base:
        return sel.metadata()

    def local(key: str) -> str:
        return relative_key(key, base)

    tensors = []
    for e in sel.tensors:
        name = local(e.name)
        if name == "__metadata__":
            why = "its name is the one safetensors reserves for the metadata"
            sel.omitted[e.name] = omitted[e.name] = why
            continue
        e.name = name
        tensors.append(e)
    sel.tensors = tensors
    values: dict[str, str] = {}
    for key, text in sel.values.items():
        k = local(key)
        if k == FORMAT_KEY or k.startswith(RESERVED_PREFIX):  # ckptfs's own metadata keys win
            n = 2
            while f"{k}#{n}" in values or f"{k}#{n}" in sel.values:
                n += 1
            k = f"{k}#{n}"
        values[k] = text
    sel.values = values
    sel.omitted = {local(k): why for k, why in sel.omitted.items()}
    return sel.metadata()


def _hf_prefix(prefix: str) -> str:
    """The safetensors name transformers uses for a .bin prefix: pytorch_model -> model."""
    return "model" + prefix[len("pytorch_model"):] if prefix.startswith("pytorch_model") else prefix


def scan_passthrough(directory: Directory, exclude: set[str]) -> list[PassThrough]:
    """Every file under the directory as its listings give it (entries it refuses, such as symlinks out of
    it, are left out and logged), but the names in ``exclude`` (top level) and ckptfs's reserved
    ``.ckptfs``; sorted by path."""
    out: list[PassThrough] = []
    stack = [("", 0)]
    count = 0
    while stack:
        path, depth = stack.pop()
        for e in directory.list(path):
            if not path and (e.name in exclude or e.name == RESERVED):
                continue
            count += 1
            if count > MAX_PASSTHROUGH:
                raise LimitError(f"more than {MAX_PASSTHROUGH} files in the model directory", file=directory.name)
            if e.refused:
                log.info("%s: not passed through: %s", directory.display(e.path), e.refused)
            elif e.is_dir:
                if depth + 1 < MAX_PASSTHROUGH_DEPTH:
                    stack.append((e.path, depth + 1))
            else:
                out.append(PassThrough(e.path, e.size, partial(directory.open, e.path)))
    out.sort(key=lambda p: p.path)
    return out


def open_passthrough(p: PassThrough) -> ByteSource:
    """Open a pass-through file, refusing one whose size changed since the directory was listed."""
    f = p.open()
    if f.size != p.size:
        f.close()
        raise CkptfsError(f"the file changed since the model directory was opened ({p.size} bytes then, "
                          f"{f.size} now)", file=f.name)
    return f
