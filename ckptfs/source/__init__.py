"""Byte sources: where a checkpoint's bytes come from (local files, ranges of other sources, memory)."""

from .local import ByteSource, BytesSource, Identity, LocalFile, open_source

__all__ = ["ByteSource", "BytesSource", "Identity", "LocalFile", "open_source"]
