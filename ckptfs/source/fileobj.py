"""Any source as a read-only, seekable binary file (``torch.load`` of a remote checkpoint in ``ckptfs check``)."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from .base import ByteSource

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer


class SourceFile(io.RawIOBase):
    """``open(...)``-like access to a source: read, readinto, seek, tell. Wrap in ``io.BufferedReader`` for
    small reads."""

    def __init__(self, source: ByteSource) -> None:
        super().__init__()
        self.source = source
        self.name = source.name
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            offset += self.pos
        elif whence == io.SEEK_END:
            offset += self.source.size
        if offset < 0:
            raise ValueError("negative seek position")
        self.pos = offset
        return self.pos

    def readinto(self, b: WriteableBuffer) -> int:
        view = memoryview(b).cast("B")
        got = self.source.preadinto(view, self.pos)
        self.pos += got
        return got
