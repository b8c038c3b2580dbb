"""What ckptfs opens, from what a user names: the one place that maps a target to a catalog.

Every front end (``ckptfs.open``, ``ckptfs.load``, the CLI, the mount) goes through :func:`open_catalog`.
A target is a local file, a :class:`~ckptfs.source.ByteSource`, a local directory or a
:class:`~ckptfs.source.Directory` (:mod:`ckptfs.model.directory`); each new kind of target (a URL) is one
branch here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..limits import DEFAULT_LIMITS, Limits
from ..source import ByteSource, Directory, LocalDirectory
from .catalog import Catalog

Target = str | os.PathLike[str] | ByteSource | Directory


def open_catalog(target: Target, *, strict: bool = False, limits: Limits = DEFAULT_LIMITS,
                 storage_options: Mapping[str, str] | None = None) -> Catalog:
    """Open and index ``target``. ``storage_options`` configure remote targets (credentials, endpoints)."""
    if isinstance(target, (str, os.PathLike)) and os.path.isdir(target):
        target = LocalDirectory(target)
    if isinstance(target, Directory):
        from .directory import open_directory

        return open_directory(target, strict=strict, limits=limits)
    return Catalog.open(target, strict=strict, limits=limits)
