"""What ckptfs opens, from what a user names: the one place that maps a target to a catalog.

Every front end (``ckptfs.open``, ``ckptfs.load``, the CLI, the mount) goes through :func:`open_catalog`.
A target is a local file, a :class:`~ckptfs.source.ByteSource`, a local directory or a
:class:`~ckptfs.source.Directory` (:mod:`ckptfs.model.directory`), or a URL (``https://``, ``s3://``, any
installed fsspec protocol: :mod:`ckptfs.source.remote`); each new kind of target is one branch here.

A URL is a remote directory (:class:`~ckptfs.source.remote_directory.RemoteDirectory`) when it ends with
``/``, or when it is not an object (not found, or a directory of the store) but listing it with a ``/``
appended finds entries: ``s3://bucket/run-7`` opens the prefix ``run-7/`` if there is no object ``run-7``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..errors import CkptfsError
from ..limits import DEFAULT_LIMITS, Limits
from ..source import ByteSource, Directory, LocalDirectory
from ..source.options import RemoteOptions
from ..source.urls import is_url, local_path
from .catalog import Catalog

Target = str | os.PathLike[str] | ByteSource | Directory


def open_catalog(target: Target, *, strict: bool = False, limits: Limits = DEFAULT_LIMITS,
                 storage_options: Mapping[str, object] | None = None, remote: RemoteOptions | None = None) -> Catalog:
    """Open and index ``target``. ``storage_options`` configure remote targets (credentials, endpoints: passed
    to the backend), ``remote`` how they are read (timeout, caches)."""
    if isinstance(target, str) and is_url(target):
        return _open_url(target, strict=strict, limits=limits, storage_options=storage_options, remote=remote)
    if isinstance(target, str):
        target = local_path(target)
    if isinstance(target, (str, os.PathLike)) and os.path.isdir(target):
        target = LocalDirectory(target)
    if isinstance(target, Directory):
        from .directory import open_directory

        return open_directory(target, strict=strict, limits=limits)
    return Catalog.open(target, strict=strict, limits=limits)


def _open_url(url: str, *, strict: bool, limits: Limits, storage_options: Mapping[str, object] | None,
              remote: RemoteOptions | None) -> Catalog:
    from ..source.remote import NotAFile, NotFound, open_url
    from ..source.remote_directory import RemoteDirectory
    from .directory import open_directory

    if url.endswith("/"):
        return open_directory(RemoteDirectory(url, storage_options, remote), strict=strict, limits=limits)
    try:
        source = open_url(url, storage_options, remote)
    except (NotFound, NotAFile) as e:
        try:
            directory = RemoteDirectory(url, storage_options, remote)
            listed = directory.list()
        except CkptfsError:
            raise e from None
        if not listed:
            raise
        return open_directory(directory, strict=strict, limits=limits)
    return Catalog.open(source, strict=strict, limits=limits)
