"""Byte sources: where a checkpoint's bytes come from (local files, ranges of other sources, memory)."""

from __future__ import annotations

import os

from .base import ByteSource, FileRegion, Identity, read_exact
from .directory import Directory, DirEntry, LocalDirectory, check_relative
from .local import LocalFile
from .memory import BytesSource
from .subrange import SubRange

__all__ = ["ByteSource", "BytesSource", "DirEntry", "Directory", "FileRegion", "Identity", "LocalDirectory",
           "LocalFile", "SubRange", "check_relative", "open_source", "read_exact"]


def open_source(path_or_source: str | os.PathLike[str] | ByteSource) -> ByteSource:
    """A path opened as a :class:`LocalFile`; a source is returned as it is."""
    if isinstance(path_or_source, (str, os.PathLike)):
        return LocalFile(path_or_source)
    if isinstance(path_or_source, ByteSource):
        return path_or_source
    raise TypeError(f"expected a path or a ByteSource, got {type(path_or_source).__name__}")
