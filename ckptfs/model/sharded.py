"""Hugging Face sharded checkpoints: ``*.safetensors.index.json`` / ``*.bin.index.json`` and their shards.

The index is ``{"metadata": {"total_size": ..., ...}, "weight_map": {key: shard file}}`` (written by
huggingface_hub's ``save_torch_state_dict`` and transformers' ``save_pretrained``). It is read strictly —
at most ``Limits.max_pickle_bytes`` of JSON, a key given twice refused, every shard a relative path
inside the directory with the index's extension (a ``.safetensors`` index naming a ``.bin`` file is
refused, as huggingface_hub refuses it) — and, once the shards are indexed, cross-checked with them:

* a shard the index names is missing: FormatError naming the index, the shard and a key mapped to it;
* a key the index maps to a shard that does not hold it;
* a key held by two shards;
* a key a shard holds that the index does not map.

Each of these is a FormatError naming the files and the key (and how many more there are): which bytes a
key means would otherwise depend on the reader. The shards themselves must be of the index's format
(by content, not name).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..errors import FormatError, LimitError
from ..limits import Limits
from ..source import Directory, check_relative, read_exact
from .catalog import Catalog
from .index import TENSOR

SAFETENSORS_INDEX = ".safetensors.index.json"
BIN_INDEX = ".bin.index.json"
INDEX_SUFFIXES = (SAFETENSORS_INDEX, BIN_INDEX)


@dataclass
class ShardIndex:
    """A parsed index file: ``path`` (relative), key -> shard, the shards in name order."""

    path: str
    kind: str  # "safetensors" or "bin"
    weight_map: dict[str, str]
    shards: list[str]
    metadata: dict[str, Any]

    @property
    def prefix(self) -> str:
        """The index file's name without its suffix (``model`` for ``model.safetensors.index.json``)."""
        name = self.path.rsplit("/", 1)[-1]
        return name[: -len(SAFETENSORS_INDEX if self.kind == "safetensors" else BIN_INDEX)]


class _Duplicate(Exception):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        raise _Duplicate(next(k for k, _ in pairs if k in seen or seen.add(k)))  # type: ignore[func-returns-value]
    return out


def read_index(directory: Directory, path: str, limits: Limits) -> ShardIndex:
    """Read and check an index file (FormatError naming it)."""
    name = directory.display(path)
    kind = "safetensors" if path.endswith(SAFETENSORS_INDEX) else "bin"
    source = directory.open(path)
    try:
        if source.size > limits.max_pickle_bytes:
            raise LimitError(f"index of {source.size} bytes is over the limit of {limits.max_pickle_bytes} (raise "
                             "Limits.max_pickle_bytes to read it)", file=name)
        raw = read_exact(source, 0, source.size, "the index")
    finally:
        source.close()
    try:
        doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_pairs)
    except _Duplicate as e:
        raise FormatError(f"{e.args[0]!r} appears twice in one object of the index", file=name) from None
    except RecursionError:
        raise FormatError("index JSON nests too deeply", file=name) from None
    except ValueError as e:  # UnicodeDecodeError too
        raise FormatError(f"index is not valid UTF-8 JSON ({e})", file=name) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("weight_map"), dict):
        raise FormatError("index is not a JSON object with a 'weight_map' object", file=name)
    weight_map: dict[str, str] = doc["weight_map"]
    metadata = doc.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise FormatError("the index's 'metadata' is not an object", file=name)
    base = path.rsplit("/", 1)[0] + "/" if "/" in path else ""
    checked: dict[str, str] = {}
    for key, shard in weight_map.items():
        if type(shard) is not str:
            raise FormatError(f"maps the key to {shard!r}, not a file name", file=name, record=key)
        if shard not in checked:
            try:
                rel = check_relative(shard, "shard path")
            except ValueError as e:
                raise FormatError(f"refused: {e} ({shard!r})", file=name, record=key) from None
            suffix = ".safetensors" if kind == "safetensors" else ".bin"
            if not rel.endswith(suffix):
                raise FormatError(f"refused: shard {shard!r} of a {kind} index does not end in {suffix}",
                                  file=name, record=key)
            checked[shard] = base + rel
        weight_map[key] = checked[shard]
    return ShardIndex(path, kind, weight_map, sorted(set(weight_map.values())), metadata or {})


def cross_check(catalog: Catalog, index: ShardIndex, name: str) -> None:
    """The shards' keys against the index (the module doc's rules); ``name`` names the index in messages."""
    numbers = {m.name: i for i, m in enumerate(catalog.members)}
    members = {shard: numbers[shard] for shard in index.shards if shard in numbers}
    want = "safetensors" if index.kind == "safetensors" else None
    for shard, m in members.items():
        kind = catalog.members[m].container.kind
        if want is not None and kind != want or want is None and kind == "safetensors":
            raise FormatError(f"shard {shard} is a {kind} file, not what a {index.kind} index names", file=name)
    ix = catalog.index
    owners = ix.owners
    assert owners is not None
    # the rows each shard put at the top of its tree (a flat group: the root, or a named subgroup)
    held: dict[str, tuple[str, int]] = {}  # key -> (shard, row)
    problems: list[tuple[str, str]] = []
    by_member = {m: shard for shard, m in members.items()}
    for conflict in catalog.conflicts:
        if conflict.first in members and conflict.second in members:
            problems.append((conflict.key, f"is in {conflict.first} and in {conflict.second}"))
    for row in range(len(ix.keys)):
        m = owners[row]
        parent = ix.parents[row]
        if m < 0 or m not in by_member or parent < 0 or owners[parent] >= 0:
            continue  # not a shard's top-level entry
        top = ix.names[row]
        held.setdefault(top if isinstance(top, str) else str(top), (by_member[m], row))
    for key, shard in index.weight_map.items():
        got = held.get(key)
        if got is None:
            problems.append((key, f"is mapped to {shard}, which does not hold it"))
        elif got[0] != shard:
            problems.append((key, f"is mapped to {shard} but is in {got[0]}"))
    for key, (shard, row) in held.items():
        if key not in index.weight_map:
            what = "tensor" if ix.kinds[row] == TENSOR else ix.kinds[row]
            problems.append((key, f"is a {what} of {shard} that the index does not map"))
    if problems:
        key, why = problems[0]
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise FormatError(f"the index and the shards disagree: the key {why}{more}", file=name, record=key)
