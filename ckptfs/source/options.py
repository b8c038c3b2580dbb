"""How remote checkpoints are read: :class:`RemoteOptions` (kept apart from :mod:`.remote`, which is
imported only when a URL is opened)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CkptfsError


@dataclass(frozen=True)
class RemoteOptions:
    """How remote checkpoints are read (``ckptfs.open(url, remote=RemoteOptions(...))``; CLI options of the
    same names)."""

    #: seconds a read may take, retries included, before it fails (RemoteError; EIO through a mount)
    timeout: float = 30.0
    #: an on-disk cache of fetched blocks, shared by processes (None: memory only)
    cache_dir: str | None = None
    #: bytes the on-disk cache may hold (least recently used blocks go first)
    cache_size: int = 10 << 30
    #: bytes of fetched blocks kept in memory per remote object (read-ahead included)
    memory_cache: int = 256 << 20
    #: requests in flight at once per object for read-ahead and large reads
    max_concurrency: int = 8
    #: an object's identity is checked again (one small request) when a file is opened this many seconds
    #: after the last response that confirmed it
    revalidate_after: float = 30.0

    def __post_init__(self) -> None:
        if not self.timeout > 0:
            raise CkptfsError(f"timeout must be positive, not {self.timeout!r}")
        if self.max_concurrency < 1:
            raise CkptfsError(f"max_concurrency must be at least 1, not {self.max_concurrency!r}")
