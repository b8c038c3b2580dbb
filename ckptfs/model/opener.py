"""What ckptfs opens, from what a user names: the one place that maps a target to a catalog.

Every front end (``ckptfs.open``, ``ckptfs.load``, the CLI, the mount) goes through :func:`open_catalog`.
Today a target is a local file or a :class:`~ckptfs.source.ByteSource`; each new kind of target (a
directory of shards, a URL) is one branch here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..limits import DEFAULT_LIMITS, Limits
from ..source import ByteSource
from .catalog import Catalog

Target = str | os.PathLike[str] | ByteSource


def open_catalog(target: Target, *, strict: bool = False, limits: Limits = DEFAULT_LIMITS,
                 storage_options: Mapping[str, str] | None = None) -> Catalog:
    """Open and index ``target``. ``storage_options`` configure remote targets (credentials, endpoints)."""
    return Catalog.open(target, strict=strict, limits=limits)
