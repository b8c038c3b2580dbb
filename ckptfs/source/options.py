"""How remote checkpoints are read: :class:`RemoteOptions` (kept apart from :mod:`.remote`, which is
imported only when a URL is opened)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

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


#: RemoteOptions fields given as text (``--cache-size 20G``, ``-o cache_size=20G``) and how to read them
_TEXT_FIELDS = {"timeout": "seconds", "cache_dir": "path", "cache_size": "size", "memory_cache": "size",
                "max_concurrency": "count", "revalidate_after": "seconds"}


def parse_size(text: str, what: str) -> int:
    """``256M`` -> 268435456 (K/M/G/T suffixes, powers of 1024)."""
    t = text.strip()
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}.get(t[-1:].lower(), 1)
    try:
        value = int(float(t[:-1] if mult > 1 else t) * mult)
    except ValueError:
        raise CkptfsError(f"{what} {text!r}: expected a size such as 512M or 10G") from None
    if value < 0:
        raise CkptfsError(f"{what} {text!r}: a size cannot be negative")
    return value


def remote_field(name: str, text: str, what: str) -> Any:
    """The value of RemoteOptions field ``name`` written as ``text`` (``what`` names it in errors)."""
    kind = _TEXT_FIELDS.get(name)
    if kind == "size":
        return parse_size(text, what)
    if kind == "path":
        if not text:
            raise CkptfsError(f"{what}: give the directory")
        return text
    try:
        return int(text) if kind == "count" else float(text)
    except ValueError:
        raise CkptfsError(f"{what} {text!r}: expected a number") from None


def with_fields(base: RemoteOptions | None, values: dict[str, Any]) -> RemoteOptions:
    """``base`` (the defaults when None) with ``values`` replacing its fields."""
    known = {f.name for f in fields(RemoteOptions)}
    current = {f.name: getattr(base, f.name) for f in fields(RemoteOptions)} if base is not None else {}
    return RemoteOptions(**{**current, **{k: v for k, v in values.items() if k in known}})


def set_storage_option(options: dict[str, Any], key: str, value: str, what: str) -> None:
    """``options[key] = value``; a dotted key sets a nested option; "true"/"false" are booleans."""
    node = options
    *parents, last = key.split(".")
    for p in parents:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise CkptfsError(f"{what}: {p} is already set to a value")
        node = child
    node[last] = {"true": True, "false": False}.get(value.strip().lower(), value)


REMOTE_TEXT_FIELDS = tuple(_TEXT_FIELDS)
