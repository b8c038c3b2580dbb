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
    what = resolve(target, storage_options=storage_options, remote=remote)
    if isinstance(what, Directory):
        from .directory import open_directory

        return open_directory(what, strict=strict, limits=limits)
    return Catalog.open(what, strict=strict, limits=limits)


def resolve(target: Target, *, storage_options: Mapping[str, object] | None = None,
            remote: RemoteOptions | None = None) -> ByteSource | Directory | str | os.PathLike[str]:
    """What ``target`` names: a directory (local or remote), a source (a remote object), or a local file's
    path (opened by the caller)."""
    if isinstance(target, str) and is_url(target):
        return _resolve_url(target, storage_options=storage_options, remote=remote)
    if isinstance(target, str):
        target = local_path(target)
    if isinstance(target, (str, os.PathLike)) and os.path.isdir(target):
        return LocalDirectory(target)
    return target


def _resolve_url(url: str, *, storage_options: Mapping[str, object] | None,
                 remote: RemoteOptions | None) -> ByteSource | Directory:
    from ..source.remote import NotAFile, NotFound, open_url
    from ..source.remote_directory import RemoteDirectory

    if url.endswith("/"):
        return RemoteDirectory(url, storage_options, remote)
    try:
        return open_url(url, storage_options, remote)
    except (NotFound, NotAFile) as e:
        try:
            directory = RemoteDirectory(url, storage_options, remote)
            listed = directory.list()
        except CkptfsError as listing:
            raise (listing if isinstance(e, NotAFile) else e) from None  # a directory: why it cannot be listed
        if not listed:
            raise
        return directory
