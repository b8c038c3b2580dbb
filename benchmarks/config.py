"""Sizes and repetition counts: the full run (the targets' sizes) and ``--quick`` (CI: small, fast)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .util import GiB, MiB


@dataclass
class Config:
    quick: bool
    reps: int                 # timed repetitions per measurement (each a fresh process)
    warmup: int               # untimed runs first (fresh processes too)
    slow_reps: int            # repetitions for peers that take minutes (zipslicer over every tensor)
    tiny_n: int               # "20,000 tiny tensors"
    tiny_numel: int
    big_bytes: int            # "1 GB, 400 tensors"
    big_n: int
    train_width: int          # training checkpoint: model width (bytes ~ 3 x model: weights + Adam exp_avg/exp_avg_sq)
    train_layers: int
    train_vocab: int
    seq_bytes: int            # "a 256 MiB tensor"
    square: int               # "transposed 4096x4096 float32"
    model_width: int          # load_state_dict: Linear(w, w) layers
    model_layers: int
    daemon_bytes: int         # "a 4 GB checkpoint" (and the 1 GB one for flatness)
    daemon_tensor_bytes: int
    huge_n: int               # "200k tensors"
    random_reads: int         # random 4 KiB reads per process (ckptfs, direct)
    random_reads_slow: int    # ... for ratarmount (~22 ms each)
    shard_layers: int         # "a 30-shard directory": layers x 9 tensors over 30 shards
    shard_numel: int
    dcp_n: int                # "a DCP directory with 100k entries"
    readers_n: int            # "8 processes reading different tensors at once"
    readers_tensor_bytes: int
    memmap_threads: int       # "16 threads page-faulting one np.memmap'd tensor file"
    scale_sizes: tuple        # tensor counts of the scale curve
    sparse_n: int             # tensors of the sparse checkpoints (same count at both sizes)
    sparse_small: int         # "1 GB"
    sparse_large: int         # "100 GB" (a sparse file: holes, no disk space)
    extra: dict = field(default_factory=dict)


FULL = Config(
    quick=False, reps=5, warmup=1, slow_reps=2,
    tiny_n=20_000, tiny_numel=8,
    big_bytes=1000 * MiB, big_n=400,
    train_width=512, train_layers=4, train_vocab=8192,
    seq_bytes=256 * MiB, square=4096,
    model_width=8192, model_layers=8,
    daemon_bytes=4 * GiB, daemon_tensor_bytes=64 * MiB,
    huge_n=200_000,
    random_reads=2000, random_reads_slow=200,
    shard_layers=80, shard_numel=4096, dcp_n=100_000,
    readers_n=8, readers_tensor_bytes=64 * MiB, memmap_threads=16,
    scale_sizes=(1_000, 3_000, 10_000, 30_000, 100_000, 300_000, 1_000_000),
    sparse_n=400, sparse_small=1 * GiB, sparse_large=100 * GiB,
)

QUICK = Config(
    quick=True, reps=1, warmup=0, slow_reps=1,
    tiny_n=2_000, tiny_numel=8,
    big_bytes=32 * MiB, big_n=40,
    train_width=64, train_layers=2, train_vocab=512,
    seq_bytes=16 * MiB, square=512,
    model_width=1024, model_layers=4,
    daemon_bytes=64 * MiB, daemon_tensor_bytes=4 * MiB,
    huge_n=10_000,
    random_reads=200, random_reads_slow=20,
    shard_layers=10, shard_numel=256, dcp_n=2_000,
    readers_n=8, readers_tensor_bytes=4 * MiB, memmap_threads=16,
    scale_sizes=(100, 300, 1_000, 3_000),
    sparse_n=40, sparse_small=32 * MiB, sparse_large=4 * GiB,
)


def get(quick: bool, reps: int | None = None, warmup: int | None = None) -> Config:
    base = QUICK if quick else FULL
    cfg = Config(**{k: getattr(base, k) for k in base.__dataclass_fields__})
    if reps is not None:
        cfg.reps = max(1, reps)
        cfg.slow_reps = min(cfg.slow_reps, cfg.reps)
    if warmup is not None:
        cfg.warmup = max(0, warmup)
    return cfg
