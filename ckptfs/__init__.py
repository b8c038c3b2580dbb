"""ckptfs: read PyTorch checkpoints without loading them — as a library, a CLI and a FUSE mount.

    import ckptfs
    with ckptfs.open("model.pth") as ckpt:
        for key in ckpt.keys():
            print(key, ckpt.meta(key).shape)
        w = ckpt.numpy("fc.weight")          # zero-copy when the bytes are stored contiguously
    sd = ckptfs.load("model.pth")            # lazy state_dict: model.load_state_dict(sd)
    ckptfs.export("model.pth", "model.safetensors")  # safetensors, streamed with bounded memory

Importing ckptfs never imports torch; only ``Checkpoint.tensor`` and ``ckptfs.load`` do.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._version import __version__ as __version__
from .api.checkpoint import Checkpoint
from .errors import (
    CkptfsError,
    FormatError,
    LimitError,
    RemoteError,
    StaleSourceError,
    TensorError,
    UnsafePickleError,
    UnsupportedError,
)
from .limits import DEFAULT_LIMITS, Limits
from .model.catalog import Catalog
from .model.meta import Meta
from .source import ByteSource, LocalFile
from .source.options import RemoteOptions

if TYPE_CHECKING:
    from .api.diff import DiffEntry, DiffSummary
    from .views.tree import MemmapMode

__all__ = [
    "ByteSource", "Catalog", "Checkpoint", "CkptfsError", "FormatError", "LimitError", "Limits", "LocalFile", "Meta",
    "RemoteError", "RemoteOptions", "StaleSourceError", "TensorError", "UnsafePickleError", "UnsupportedError",
    "diff", "export", "load", "memmap", "open",
]


def open(path: str | os.PathLike[str] | ByteSource, *, strict: bool = False,  # noqa: A001
         limits: Limits = DEFAULT_LIMITS, storage_options: Mapping[str, object] | None = None,
         remote: RemoteOptions | None = None) -> Checkpoint:
    """Index a checkpoint (zip or legacy torch.save file) without running its pickle or importing torch.

    ``path`` may be a URL (``https://``, ``s3://``, any installed fsspec protocol): ``storage_options`` go to
    its backend (credentials, endpoint), ``remote`` says how it is read (timeout, caches: docs/remote.md).
    ``strict=True`` refuses any global outside ckptfs's allowlist instead of indexing it as opaque data.
    """
    return Checkpoint(path, strict=strict, limits=limits, storage_options=storage_options, remote=remote)


def load(path: str | os.PathLike[str], map_location: Any = "cpu", dtype: Any = None, cache_tensors: bool = False,
         debug: bool = False, *, strict: bool = False, mmap: bool = True, limits: Limits = DEFAULT_LIMITS,
         storage_options: Mapping[str, object] | None = None, remote: RemoteOptions | None = None) -> Any:
    """A lazy state_dict (drop-in for ``zipslicer.load``): a Mapping whose tensors are made on access.

    With ``mmap=True`` (default) tensors stored uncompressed are copy-on-write views of the file, so
    ``model.load_state_dict(ckptfs.load(p))`` copies from the page cache with no second copy in memory.
    A URL works as in :func:`open` (its tensors are read by range when accessed). Imports torch. Non-dict
    checkpoints are returned materialised. ``limits`` as for :func:`open` (a checkpoint over a default limit
    needs them raised).
    """
    from .api.load import load as _load

    return _load(path, map_location=map_location, dtype=dtype, cache_tensors=cache_tensors, debug=debug,
                 strict=strict, mmap=mmap, limits=limits, storage_options=storage_options, remote=remote)


def export(src: str | os.PathLike[str] | ByteSource | Checkpoint, dst: str | os.PathLike[str], **kwargs: Any) -> Any:
    """Write a checkpoint (file, HF model directory, URL, open Checkpoint) as safetensors: one file when
    ``dst`` ends with ``.safetensors``, else an HF sharded directory. Streams tensor by tensor with
    bounded memory; keyword arguments and the result: :func:`ckptfs.api.export.export` (docs/views.md)."""
    from .api.export import export as _export

    return _export(src, dst, **kwargs)


def diff(a: str | os.PathLike[str] | ByteSource | Checkpoint, b: str | os.PathLike[str] | ByteSource | Checkpoint, *,
         atol: float = 0.0, rtol: float = 0.0, exact: bool = False, renames: bool = True,
         tensors_only: bool = False, strict: bool = False) -> tuple[list[DiffEntry], DiffSummary]:
    """Compare two checkpoints key by key (what ``ckptfs diff`` prints): ``(entries, summary)``;
    ``summary.identical`` is the verdict. Entries of keys that are the same are included (status
    "identical", "equal" or "close"). ``tensors_only`` leaves values (epoch, lr ...) and links out of the
    comparison. See :mod:`ckptfs.api.diff`."""
    from .api.diff import DiffOptions, diff_catalogs

    opened = [x if isinstance(x, Checkpoint) else Checkpoint(x, strict=strict) for x in (a, b)]
    try:
        return diff_catalogs(opened[0].catalog, opened[1].catalog,
                             DiffOptions(atol=atol, rtol=rtol, exact=exact, renames=renames,
                                         tensors_only=tensors_only))
    finally:
        for given, ckpt in zip((a, b), opened, strict=True):
            if ckpt is not given:
                ckpt.close()


def memmap(path: str | os.PathLike[str], mode: MemmapMode = "r") -> Any:
    """``np.memmap`` of a tensor file in a ckptfs mount, with dtype and shape from its sidecar."""
    from .views.tree import memmap_from_sidecar

    return memmap_from_sidecar(os.fspath(path), mode)
