"""Resource limits applied while indexing untrusted checkpoints (see docs/security.md)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    #: Largest main pickle (data.pkl) read into memory. Unpickling costs at most ~10x this in the worst
    #: case (tiny opcodes building pointers), so the default keeps a hostile file under 1 GB.
    max_pickle_bytes: int = 64 << 20
    #: Deepest container nesting below the root (real checkpoints use < 20).
    max_depth: int = 256
    #: Objects (containers, leaves, tensors, opaque objects) visited while indexing.
    max_nodes: int = 4_000_000
    #: Tensors in one checkpoint.
    max_tensors: int = 1_000_000
    #: Entries in a zip central directory.
    max_records: int = 2_000_000
    #: Dimensions of one tensor (torch allows 64 on most builds).
    max_ndim: int = 64
    #: Distinct global names a pickle may reference (each unknown one becomes an opaque class).
    max_globals: int = 10_000
    #: Small text records (version, byteorder, ...) read whole.
    max_small_record: int = 4096
    #: Largest deflated record decompressed whole in memory (bigger ones are inflated in windows).
    max_inflate_whole: int = 64 << 20


DEFAULT_LIMITS = Limits()
