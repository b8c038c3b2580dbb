"""``ckptfs.load``: a lazy state_dict (a drop-in for ``zipslicer.load``). Imports torch."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..limits import DEFAULT_LIMITS, Limits
from ..model.index import DICT
from ..source.options import RemoteOptions
from .checkpoint import Checkpoint


def load(path: str | os.PathLike[str], map_location: Any = "cpu", dtype: Any = None, cache_tensors: bool = False,
         debug: bool = False, *, strict: bool = False, mmap: bool = True, limits: Limits = DEFAULT_LIMITS,
         storage_options: Mapping[str, object] | None = None, remote: RemoteOptions | None = None) -> Any:
    """A Mapping whose tensors are made on access (``debug`` is accepted for zipslicer's signature and
    ignored). A checkpoint whose top-level object is not a dict is returned materialised."""
    from ..torchio.state_dict import LazyStateDict
    from ..torchio.tensors import entry_value

    ckpt = Checkpoint(path, strict=strict, limits=limits, storage_options=storage_options, remote=remote)
    if ckpt.index.kinds[0] == DICT:
        return LazyStateDict(ckpt.catalog, 0, map_location=map_location, dtype=dtype, cache_tensors=cache_tensors,
                             mmap=mmap, checkpoint=ckpt)
    try:
        return entry_value(ckpt.catalog, 0, map_location, dtype, mmap)
    finally:
        ckpt.close()
