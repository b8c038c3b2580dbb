"""Resource limits applied while indexing untrusted checkpoints (see docs/security.md)."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Limits:
    #: Largest main pickle (data.pkl) read into memory. Unpickling costs at most ~10x this in the worst
    #: case (tiny opcodes building pointers), so the default keeps a hostile file under 1 GB.
    max_pickle_bytes: int = 64 << 20
    #: Deepest container nesting below the root (real checkpoints use < 20).
    max_depth: int = 256
    #: Objects (containers, leaves, tensors, opaque objects) visited while indexing (each index row costs
    #: ~250 bytes and ~2 us: 2 M rows stay under ~600 MB and a few seconds).
    max_nodes: int = 2_000_000
    #: Total length of all dotted keys (each key repeats its parent's: nested, memo-shared long keys
    #: would cost far more memory than the pickle holds).
    max_key_bytes: int = 128 << 20
    #: Tensors in one checkpoint (the largest real ones hold ~200 k; each costs ~4 us to index).
    max_tensors: int = 500_000
    #: Entries in a zip central directory (torch writes one per storage plus ~7; reading the directory
    #: costs ~1 us and ~150 bytes per entry).
    max_records: int = 1_000_000
    #: Dimensions of one tensor (torch allows 64 on most builds).
    max_ndim: int = 64
    #: Distinct global names a pickle may reference (each unknown one becomes an opaque class).
    max_globals: int = 10_000
    #: Small text records (version, byteorder, ...) read whole.
    max_small_record: int = 4096
    #: Memory one index build may take (the unpickled objects, then the index): the unpickling child's
    #: address space grows by at most this much, and the index build stops once the process's
    #: anonymous resident memory grew by this much.
    max_memory: int = 768 << 20
    #: Unpickle in a forked child first (Linux/macOS): a pickle that crashes the C unpickler (a 10^6-deep
    #: tuple hashed as a dict key), hangs it (a tuple DAG hashed: 2^n steps) or needs more than
    #: ``max_memory`` fails there, as a clean error, instead of taking the process down.
    unpickle_probe: bool = True
    #: Seconds the unpickling child may take: this, plus 1 s per MiB of pickle (C unpickling runs at
    #: 50-100 MiB/s on torch's pickles, ~3 MiB/s on pickles of a million unknown objects).
    max_unpickle_seconds: float = 3.0


DEFAULT_LIMITS = Limits()


def limits_with(values: dict[str, str], what: str = "--limit ", base: Limits | None = None) -> Limits:
    """``base`` (the defaults) with fields given as text, ``{"max_tensors": "2M"}`` (K/M/G suffixes are
    powers of 1024; booleans 1/true/yes/on); ValueError (one line, naming ``what``) for an unknown name or a
    bad value (``what`` is what precedes a name where it was given: "--limit ", "-o limit.")."""
    out: dict[str, object] = {}
    for name, text in values.items():
        name = name.strip().replace("-", "_")
        if name not in Limits.__dataclass_fields__:
            raise ValueError(f"{what}{name}: not a limit; one of {', '.join(Limits.__dataclass_fields__)}")
        kind = type(getattr(DEFAULT_LIMITS, name))
        text = text.strip()
        try:
            if kind is bool:
                out[name] = text.lower() in ("1", "true", "yes", "on")
            elif kind is float:
                out[name] = float(text)
            else:
                mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(text[-1:].lower(), 1)
                out[name] = int(text[:-1] if mult > 1 else text, 0) * mult
        except ValueError:
            raise ValueError(f"{what}{name}={text!r}: not a {kind.__name__}") from None
    base = DEFAULT_LIMITS if base is None else base
    return replace(base, **out) if out else base  # type: ignore[arg-type]


def _pagesize() -> int:
    try:
        import os

        return os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 4096


_PAGE = _pagesize()


def memory_now() -> tuple[int, int] | None:
    """(virtual size, anonymous resident bytes) of this process, from /proc/self/statm (Linux); None
    where that does not exist. Anonymous = resident minus file-backed/shared pages, so mapped checkpoint
    pages read through the page cache do not count."""
    try:
        with open("/proc/self/statm", "rb") as f:
            fields = f.read().split()
        return int(fields[0]) * _PAGE, (int(fields[1]) - int(fields[2])) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


class MemoryGuard:
    """Raises LimitError once this process's anonymous memory grew by more than ``limit`` bytes since the
    guard was made. ``check()`` costs one read of /proc/self/statm; call it every few thousand objects."""

    __slots__ = ("limit", "start", "what")

    def __init__(self, limit: int, what: str = "indexing") -> None:
        self.limit = limit
        self.what = what
        now = memory_now()
        self.start = now[1] if now is not None else None

    def check(self) -> None:
        if self.start is None:
            return
        now = memory_now()
        if now is not None and now[1] - self.start > self.limit:
            from .errors import LimitError

            raise LimitError(f"{self.what} needs more than {self.limit >> 20} MiB of memory "
                             "(raise Limits.max_memory to index it)")
