"""Directory formats: index and mount-ready time of a 30-shard Hugging Face directory and of a DCP checkpoint
with 100k entries, each beside the writer's own loader reading the same metadata."""

from __future__ import annotations

import os
import sys

from .cases_mount import Mount
from .core import CaseResult, Context, Row, judge, repeat, run_worker, time_command
from .util import warm_file


def _warm_tree(path: str) -> None:
    """Every file of a dataset in the page cache (the index cases measure CPU, not the disk)."""
    for d, _, files in os.walk(path):
        for f in files:
            warm_file(os.path.join(d, f))


def _largest(path: str, ext: str) -> str:
    files = [os.path.join(path, f) for f in os.listdir(path) if f.endswith(ext)]
    return max(files, key=os.path.getsize)


def _index_rows(ctx: Context, res: CaseResult, rows: list[tuple[str, str, str, bool]]) -> None:
    runs = []
    for impl, label, path, is_ck in rows:
        row = Row(label, is_ckptfs=is_ck)
        res.rows.append(row)
        spec = {"op": "index", "impl": impl, "path": path}
        runs.append((row, (lambda s=spec: run_worker(ctx, s)), "seconds", None))
    repeat(ctx, res, runs)


def _ratio(res: CaseResult, label: str) -> float | None:
    r = res.row(label)
    return None if r is None else res.ratio(r)


def index_shards(ctx: Context, dataset: str, ext: str, peer_impl: str, peer_label: str) -> CaseResult:
    d = ctx.data.get(dataset)
    _warm_tree(d)
    kind = "safetensors" if ext == ".safetensors" else "torch.save (.bin)"
    res = CaseResult(f"index-{dataset.replace('_', '-')}", f"index: a 30-shard {kind} directory",
                     "time from call to keys+shapes of every tensor in hand (imports excluded)", "ms", 1e3, "lower",
                     "≤ the writer's loader over every shard; within 10x one shard (not 30x)",
                     extra_cols=[("rss_delta", "RSS +MB", 1e-6)])
    one = _largest(d, ext)
    ck, ck_one = "ckptfs.open(directory) + meta", f"ckptfs.open(its largest shard: {os.path.basename(one)})"
    _index_rows(ctx, res, [("ckptfs", ck, d, True), ("ckptfs", ck_one, one, False),
                           (peer_impl, peer_label, d, False)])
    judge(res, [("ckptfs/writer's loader", lambda: _ratio(res, peer_label), lambda v: v <= 1.0, "≤ 1"),
                ("ckptfs dir/one shard", lambda: _ratio(res, ck_one), lambda v: v <= 10.0, "≤ 10 (30 shards)")])
    return res


def index_shards_st(ctx: Context) -> CaseResult:
    return index_shards(ctx, "shards_st", ".safetensors", "safetensors_shards",
                        "safetensors.safe_open of every shard + get_slice().get_shape()")


def index_shards_bin(ctx: Context) -> CaseResult:
    return index_shards(ctx, "shards_bin", ".bin", "torch_mmap_shards",
                        "torch.load(mmap=True, weights_only=True) of every shard (as transformers)")


def mount_ready_shards(ctx: Context) -> CaseResult:
    """ckptfs mount of each 30-shard directory and of its largest shard alone: the directory should cost
    about one file's mount, not 30."""
    st, bn = ctx.data.get("shards_st"), ctx.data.get("shards_bin")
    for d in (st, bn):
        _warm_tree(d)
    res = CaseResult("mount-ready-30-shards", "mount-ready time: a 30-shard directory vs its largest shard",
                     "command start → listing the mount point answers (interpreter start included)", "ms", 1e3,
                     "lower", "directory ≤ 1.5x its largest shard; ≤ the writer's loader reading its shards' keys")
    targets = [("ckptfs mount DIR (30 .bin shards)", bn, True),
               ("ckptfs mount of its largest .bin shard", _largest(bn, ".bin"), False),
               ("ckptfs mount DIR (30 safetensors shards)", st, False),
               ("ckptfs mount of its largest safetensors shard", _largest(st, ".safetensors"), False)]
    runs = []
    for n, (label, path, is_ck) in enumerate(targets):
        row = Row(label, is_ckptfs=is_ck)
        res.rows.append(row)

        def fn(path=path, n=n) -> dict:
            m = Mount(ctx, "ckptfs", path, os.path.join(ctx.work, "mnt", f"shards-{n}"))
            try:
                return {"seconds": m.start()}
            finally:
                m.stop()
        runs.append((row, fn, "seconds", None))
    # the writers' loaders reading the same keys, shapes and dtypes (every shard), from a fresh process
    loaders = [("python -c: torch.load(mmap=True, weights_only=True) of every .bin shard (fresh process)", bn,
                "import sys, glob, torch\n"
                "for f in sorted(glob.glob(sys.argv[1] + '/*.bin')):\n"
                "    [(t.shape, t.dtype) for t in torch.load(f, mmap=True, weights_only=True).values()]"),
               ("python -c: safe_open of every safetensors shard, keys + shapes (fresh process)", st,
                "import sys, glob\nfrom safetensors import safe_open\n"
                "for f in sorted(glob.glob(sys.argv[1] + '/*.safetensors')):\n"
                "    with safe_open(f, 'pt') as h: [h.get_slice(k).get_shape() for k in h.keys()]")]
    for label, path, code in loaders:
        peer = Row(label)
        res.rows.append(peer)
        runs.append((peer, lambda code=code, path=path: {"seconds": time_command([sys.executable, "-c", code, path])},
                     "seconds", None))
    repeat(ctx, res, runs)
    judge(res, [(".bin dir/one shard", lambda: _over(res, targets[0][0], targets[1][0]), lambda v: v <= 1.5, "≤ 1.5"),
                ("safetensors dir/one shard", lambda: _over(res, targets[2][0], targets[3][0]), lambda v: v <= 1.5,
                 "≤ 1.5"),
                ("ckptfs .bin dir/torch.load of its shards", lambda: _over(res, targets[0][0], loaders[0][0]),
                 lambda v: v <= 1.0, "≤ 1"),
                ("ckptfs safetensors dir/safe_open of its shards", lambda: _over(res, targets[2][0], loaders[1][0]),
                 lambda v: v <= 1.0, "≤ 1")])
    return res


def _over(res: CaseResult, a: str, b: str) -> float | None:
    """Row a's median over row b's."""
    ra, rb = res.row(a), res.row(b)
    return ra.median / rb.median if ra and rb and ra.median and rb.median else None


def index_dcp(ctx: Context) -> CaseResult:
    d = ctx.data.get("dcp")
    _warm_tree(d)
    n = ctx.cfg.dcp_n
    res = CaseResult("index-dcp", f"index: a DCP checkpoint of {n:,} entries",
                     "time from call to keys+shapes of every entry in hand (imports excluded)", "ms", 1e3, "lower",
                     "≤ 1.5x torch's own FileSystemReader.read_metadata()", extra_cols=[("rss_delta", "RSS +MB", 1e-6)])
    peer = "torch: FileSystemReader(dir).read_metadata() (pickle.load of .metadata)"
    _index_rows(ctx, res, [("ckptfs", "ckptfs.open(directory) + meta", d, True), ("torch_dcp_metadata", peer, d, False)])
    judge(res, [("ckptfs/torch read_metadata", lambda: _ratio(res, peer), lambda v: v <= 1.5, "≤ 1.5")])
    return res


def mount_ready_dcp(ctx: Context) -> CaseResult:
    d = ctx.data.get("dcp")
    _warm_tree(d)
    n = ctx.cfg.dcp_n
    res = CaseResult("mount-ready-dcp", f"mount-ready time: a DCP checkpoint of {n:,} entries",
                     "command start → the mount answers / the metadata is read (interpreter start and imports "
                     "included)", "ms", 1e3, "lower", "≤ torch reading the same metadata from a fresh process")
    runs = []
    row = Row("ckptfs mount DIR", is_ckptfs=True)
    res.rows.append(row)

    def mount() -> dict:
        m = Mount(ctx, "ckptfs", d, os.path.join(ctx.work, "mnt", "dcp"))
        try:
            return {"seconds": m.start()}
        finally:
            m.stop()
    runs.append((row, mount, "seconds", None))
    peer = Row("python -c 'FileSystemReader(dir).read_metadata()' (torch's reader, fresh process)")
    res.rows.append(peer)
    code = ("import sys, torch.distributed.checkpoint as d; d.FileSystemReader(sys.argv[1]).read_metadata()")
    runs.append((peer, lambda: {"seconds": time_command([sys.executable, "-c", code, d])}, "seconds", None))
    repeat(ctx, res, runs)
    judge(res, [("ckptfs/torch", lambda: res.ratio(peer), lambda v: v <= 1.0, "≤ 1")])
    return res


CASES = {"index-shards-st": index_shards_st, "index-shards-bin": index_shards_bin,
         "mount-ready-30-shards": mount_ready_shards, "index-dcp": index_dcp, "mount-ready-dcp": mount_ready_dcp}
