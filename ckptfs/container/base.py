"""What every container reader (zip, legacy stream) offers to the index and the readers above it."""

from __future__ import annotations

from typing import Protocol

from ..source import ByteSource


class Record(Protocol):
    """One stored blob (a storage's bytes, data.pkl, ...), read by offsets relative to its start."""

    name: str  # container-relative name, e.g. "data/0"
    size: int  # uncompressed size in bytes

    def pread(self, offset: int, n: int) -> bytes: ...

    def preadinto(self, buf: memoryview, offset: int) -> int: ...

    def file_span(self) -> tuple[int, int] | None:
        """(absolute offset in the source, size) when the bytes are stored verbatim, else None."""


class Container(Protocol):
    kind: str  # "zip", "legacy"
    source: ByteSource
    byteorder: str  # "little" / "big": byte order of storage data
    info: dict  # format facts for `ckptfs info` (root, records, versions ...)

    def pickle_bytes(self) -> bytes:
        """The main pickle (``data.pkl`` in a zip)."""

    def storage_record(self, key: str) -> Record:
        """The record holding storage ``key`` (raises FormatError / TensorError)."""

    def storage_size(self, key: str) -> int:
        """Size in bytes of storage ``key``'s record, refusing as storage_record does (cheap: no record object)."""

    def record_name(self, key: str) -> str:
        """How the container names storage ``key``'s record, for messages and sidecars."""

    def close(self) -> None: ...
