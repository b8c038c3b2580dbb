"""What a conversion view or an export starts from: a catalog, how it maps to safetensors files, and the
other files of a model directory (passed through byte-exact).

* a file (or a remote object, a byte source): ``name.ext`` becomes ``name.safetensors``;
* an HF directory of PyTorch weights — ``pytorch_model.bin``, or shards listed by
  ``pytorch_model.bin.index.json`` (also variants such as ``pytorch_model.bin.index.fp16.json`` and
  other prefixes such as ``adapter_model``): ``model.safetensors`` or ``model-0000i-of-0000n.safetensors``
  plus ``model.safetensors.index.json``, one output file per input shard; every other file of the
  directory (config.json, tokenizer files, sub-directories) is passed through;
* a DCP directory (``.metadata``): one ``model.safetensors``.

Directories are opened here with :meth:`~ckptfs.model.catalog.Catalog.merge` of the shards the index
names (``flat``: one key space); a DCP directory is opened by :func:`ckptfs.model.opener.open_catalog`
(its directory support assembles the chunks into one key space).
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..container.dcp.checkpoint import is_dcp_directory
from ..errors import CkptfsError, FormatError, LimitError
from ..limits import DEFAULT_LIMITS, Limits
from ..model.catalog import Catalog
from ..model.opener import Target, open_catalog
from ..source import ByteSource, Directory, LocalFile
from ..source.options import RemoteOptions

#: index files of sharded PyTorch weights: <prefix>.bin.index[.<variant>].json
_INDEX_RE = re.compile(r"^(?P<prefix>.+)\.bin\.index(?:\.(?P<variant>[^./]+))?\.json$")
#: single-file PyTorch weights of a model directory: <prefix>[.<variant>].bin
_WEIGHTS_RE = re.compile(r"^(?P<prefix>pytorch_model|adapter_model)(?:\.(?P<variant>[^./]+))?\.bin$")
#: Entries a model directory's pass-through may hold (files and directories), and how deep.
MAX_PASSTHROUGH = 100_000
MAX_PASSTHROUGH_DEPTH = 32
RESERVED = ".ckptfs"


@dataclass(frozen=True)
class PassThrough:
    """A file of a model directory shown (or copied) as it is."""

    path: str  # relative, '/'-separated
    source: str  # absolute path (symlinks followed when scanned)
    size: int
    mtime_ns: int
    ino: tuple[int, int]  # (st_dev, st_ino) when scanned: a file replaced since is refused when opened


@dataclass
class ModelSource:
    """A checkpoint to present or write as safetensors.

    ``kind`` is ``"file"`` (one checkpoint: ``<stem>.safetensors``), ``"hf"`` (an HF directory: one output
    shard per member, named after ``prefix`` / ``variant``) or ``"dcp"`` (one ``model.safetensors``)."""

    catalog: Catalog
    path: str
    kind: str
    stem: str = "model"  # "file": the output is <stem>.safetensors
    prefix: str = "model"  # "hf": model-00001-of-00002.safetensors, model.safetensors.index.json
    variant: str | None = None
    passthrough: list[PassThrough] = field(default_factory=list)
    hidden: list[str] = field(default_factory=list)  # the directory's files that the view replaces

    @property
    def is_directory(self) -> bool:
        return self.kind != "file"

    def close(self) -> None:
        self.catalog.close()


def open_model(target: Target | Catalog, *, strict: bool = False, limits: Limits = DEFAULT_LIMITS,
               storage_options: Mapping[str, object] | None = None,
               remote: RemoteOptions | None = None) -> ModelSource:
    """Open ``target`` (a checkpoint file, a model directory, a URL, a source or a catalog)."""
    if isinstance(target, Catalog):
        return ModelSource(target, target.name, "file", stem=output_stem(target.name))
    if not isinstance(target, (ByteSource, Directory)):
        path = os.fspath(target)
        if os.path.isdir(path):
            return _open_directory(path, strict=strict, limits=limits)
    catalog = open_catalog(target, strict=strict, limits=limits, storage_options=storage_options, remote=remote)
    return ModelSource(catalog, catalog.name, "file", stem=output_stem(catalog.name))


def output_stem(name: str) -> str:
    """``model.pth`` -> ``model``; a URL's last path component likewise; ``model`` when nothing is left."""
    base = name.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0]
    stem = base.rsplit(".", 1)[0] if "." in base.lstrip(".") else base
    return stem if stem not in ("", ".", "..") else "model"


# --- model directories -------------------------------------------------------------------------------------------


def _open_directory(path: str, *, strict: bool, limits: Limits) -> ModelSource:
    root = os.path.abspath(path)
    try:
        names = sorted(os.listdir(root))
    except OSError as e:
        raise CkptfsError(e.strerror or str(e), file=root) from None
    if is_dcp_directory(names):  # the directory support of open_catalog assembles its one key space
        catalog = open_catalog(root, strict=strict, limits=limits)
        return ModelSource(catalog, root, "dcp", stem="model")
    indexes = [n for n in names if _INDEX_RE.match(n) and os.path.isfile(os.path.join(root, n))]
    if indexes:
        # the plain index first (pytorch_model.bin.index.json), then variants: the others are passed through
        indexes.sort(key=lambda n: (_INDEX_RE.match(n).group("variant") is not None, n))  # type: ignore[union-attr]
        chosen = indexes[0]
        m = _INDEX_RE.match(chosen)
        assert m is not None
        shards = _shards_of_index(root, chosen, limits)
        hidden = [chosen, *shards]
        prefix, variant = _hf_prefix(m.group("prefix")), m.group("variant")
    else:
        singles = [n for n in names if _WEIGHTS_RE.match(n) and os.path.isfile(os.path.join(root, n))]
        if not singles:
            raise FormatError("no PyTorch weights in this directory (pytorch_model.bin, or shards listed by "
                              "pytorch_model.bin.index.json)", file=root)
        singles.sort(key=lambda n: (_WEIGHTS_RE.match(n).group("variant") is not None, n))  # type: ignore[union-attr]
        m = _WEIGHTS_RE.match(singles[0])
        assert m is not None
        shards = [singles[0]]
        hidden = [singles[0]]
        prefix, variant = _hf_prefix(m.group("prefix")), m.group("variant")
    sources: list[tuple[str, ByteSource]] = []
    try:
        for name in shards:
            sources.append((name, LocalFile(os.path.join(root, name))))
    except BaseException:
        for _, s in sources:
            s.close()
        raise
    catalog = Catalog.merge(sources, name=root, flat=True, strict=strict, limits=limits)
    return ModelSource(catalog, root, "hf", prefix=prefix, variant=variant,
                       passthrough=scan_passthrough(root, exclude=set(hidden)), hidden=hidden)


def _hf_prefix(prefix: str) -> str:
    """The safetensors name transformers uses for a .bin prefix: pytorch_model -> model."""
    return "model" + prefix[len("pytorch_model"):] if prefix.startswith("pytorch_model") else prefix


def _shards_of_index(root: str, name: str, limits: Limits) -> list[str]:
    """The shard files an HF index names, sorted (as transformers loads them); each must be a plain file
    name of this directory."""
    path = os.path.join(root, name)
    try:
        with open(path, "rb") as f:
            raw = f.read(limits.max_pickle_bytes + 1)
    except OSError as e:
        raise CkptfsError(e.strerror or str(e), file=path) from None
    if len(raw) > limits.max_pickle_bytes:
        raise LimitError(f"index over {limits.max_pickle_bytes} bytes", file=path)
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise FormatError(f"not valid JSON ({e})", file=path) from None
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise FormatError("no weight_map in the index", file=path)
    shards = sorted({v for v in weight_map.values() if isinstance(v, str)})
    if len(shards) != len(set(weight_map.values())):
        raise FormatError("weight_map values must be file names", file=path)
    for s in shards:
        if s in ("", ".", "..") or "/" in s or "\\" in s or "\0" in s:
            raise FormatError(f"names a shard outside this directory: {s!r}", file=path)
        if not os.path.isfile(os.path.join(root, s)):
            raise FormatError(f"names shard {s!r}, which is missing", file=path)
    return shards


def scan_passthrough(root: str, exclude: set[str]) -> list[PassThrough]:
    """Every regular file under ``root`` (symlinks followed, each directory once), but the names in
    ``exclude`` (top level) and ckptfs's reserved ``.ckptfs``; sorted by path."""
    out: list[PassThrough] = []
    seen_dirs: set[tuple[int, int]] = set()
    stack = [("", root, 0)]
    count = 0
    while stack:
        rel, path, depth = stack.pop()
        st = os.stat(path)
        if (st.st_dev, st.st_ino) in seen_dirs:
            continue
        seen_dirs.add((st.st_dev, st.st_ino))
        try:
            names = sorted(os.listdir(path))
        except OSError:
            continue
        for name in names:
            if not rel and (name in exclude or name == RESERVED):
                continue
            count += 1
            if count > MAX_PASSTHROUGH:
                raise LimitError(f"more than {MAX_PASSTHROUGH} files in the model directory", file=root)
            full = os.path.join(path, name)
            try:
                s = os.stat(full)
            except OSError:  # a dangling symlink
                continue
            sub = f"{rel}/{name}" if rel else name
            if stat.S_ISDIR(s.st_mode):
                if depth + 1 < MAX_PASSTHROUGH_DEPTH:
                    stack.append((sub, full, depth + 1))
            elif stat.S_ISREG(s.st_mode):
                out.append(PassThrough(sub, os.path.realpath(full), s.st_size, s.st_mtime_ns, (s.st_dev, s.st_ino)))
    out.sort(key=lambda p: p.path)
    return out


def open_passthrough(p: PassThrough) -> LocalFile:
    """Open a pass-through file, refusing one that changed since the directory was scanned."""
    f = LocalFile(p.source)
    st = os.fstat(f.fd)
    if (st.st_dev, st.st_ino) != p.ino or st.st_size != p.size or st.st_mtime_ns != p.mtime_ns:
        f.close()
        raise CkptfsError("the file changed since the model directory was opened", file=p.source)
    return f
