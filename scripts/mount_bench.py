#!/usr/bin/env python3
"""Figures for `ckptfs mount` on this machine, each beside the same bytes read straight from the file.

    python scripts/mount_bench.py [--dir DIR] [--size-mib 256] [--rounds 3] [--threads both|single|multi]

Cold = the checkpoint's pages and the mount file's pages dropped with posix_fadvise(DONTNEED) (only these
files: other processes' caches are left alone). Prints a Markdown table; nothing stays mounted.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile

import numpy as np

CKPTFS = [sys.executable, "-m", "ckptfs.cli"]
CHUNK = 1 << 20


def drop(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def seq_read(path: str, offset: int, size: int) -> float:
    """GB/s reading [offset, offset+size) in 1 MiB preads (what dd bs=1M does)."""
    buf = bytearray(CHUNK)
    mv = memoryview(buf)
    fd = os.open(path, os.O_RDONLY)
    t = time.perf_counter()
    pos, end = offset, offset + size
    while pos < end:
        n = os.preadv(fd, [mv[: min(CHUNK, end - pos)]], pos)
        if n <= 0:
            raise OSError(f"short read at {pos}")
        pos += n
    dt = time.perf_counter() - t
    os.close(fd)
    return size / dt / 1e9


def random_reads(path: str, offset: int, size: int, n: int, seed: int = 0) -> list[float]:
    """Latencies (ms) of n random 4 KiB preads (page-aligned), readahead disabled (FADV_RANDOM)."""
    rnd = random.Random(seed)
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    out = []
    pages = size // 4096
    for _ in range(n):
        off = offset + rnd.randrange(pages) * 4096
        t = time.perf_counter()
        os.pread(fd, 4096, off)
        out.append((time.perf_counter() - t) * 1e3)
    os.close(fd)
    return out


def parallel_read(path: str, size: int, n: int, offset: int = 0) -> float:
    """Aggregate GB/s of n processes each reading its own 1/n of the range sequentially (they start
    together once all are up: interpreter start-up is not timed)."""
    code = ("import os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_RDONLY); b = bytearray(1 << 20); m = memoryview(b)\n"
            "pos, end, go = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])\n"
            "time.sleep(max(0, go - time.time())); t0 = time.time()\n"
            "while pos < end: pos += os.preadv(fd, [m[: min(1 << 20, end - pos)]], pos)\n"
            "print(t0, time.time())\n")
    part = size // n
    go = time.time() + 2.0
    procs = [subprocess.Popen([sys.executable, "-c", code, path, str(offset + i * part),
                               str(offset + (i + 1) * part), str(go)], stdout=subprocess.PIPE, text=True)
             for i in range(n)]
    spans = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise RuntimeError("a reader failed")
        spans.append([float(x) for x in out.split()])
    return part * n / (max(e for _, e in spans) - min(s for s, _ in spans)) / 1e9


def memmap_sum(path: str, offset: int, count: int) -> tuple[float, float]:
    t = time.perf_counter()
    a = np.memmap(path, dtype=np.float32, mode="r", offset=offset, shape=(count,))
    s = float(a.sum(dtype=np.float64))
    dt = time.perf_counter() - t
    del a
    return count * 4 / dt / 1e9, s


def data_span(pth: str) -> tuple[int, int]:
    """Absolute offset and size of the only data record of a one-tensor checkpoint."""
    with zipfile.ZipFile(pth) as z:
        info = next(i for i in z.infolist() if "/data/" in i.filename)
    with open(pth, "rb") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
    return info.header_offset + 30 + name_len + extra_len, info.file_size


def mount(pth: str, mnt: str, *args: str, env: dict | None = None) -> float:
    t = time.perf_counter()
    subprocess.run([*CKPTFS, "mount", pth, mnt, *args], check=True, env=env)
    os.listdir(mnt)
    return time.perf_counter() - t


def umount(mnt: str) -> None:
    subprocess.run([*CKPTFS, "umount", mnt], check=True, capture_output=True)


def fmt(xs: list[float], unit: str = "") -> str:
    return f"{statistics.median(xs):.2f}{unit}" + (f" (min {min(xs):.2f}, max {max(xs):.2f})" if len(xs) > 1 else "")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=None)
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--random", type=int, default=2000)
    ap.add_argument("--threads", choices=["both", "single", "multi"], default="both")
    ap.add_argument("--ready-tensors", type=int, default=20_000)
    args = ap.parse_args()
    import torch

    work = args.dir or tempfile.mkdtemp(prefix="ckptfs-bench-")
    pth = os.path.join(work, "big.pth")
    if not os.path.exists(pth):
        torch.save({"w": torch.randn(args.size_mib << 18)}, pth)
    many = os.path.join(work, f"many{args.ready_tensors}.pth")
    if not os.path.exists(many):
        names = ["conv.weight", "conv.bias", "bn.weight", "bn.bias"]
        torch.save({f"layers.{i // 4}.{names[i % 4]}": torch.zeros(4) for i in range(args.ready_tensors)}, many)
    off, size = data_span(pth)
    count = size // 4
    mnt = os.path.join(work, "mnt")
    os.makedirs(mnt, exist_ok=True)
    direct: dict[str, list[float]] = {"cold": [], "warm": [], "mm_cold": [], "mm_warm": [], "src": [], "par": []}
    for _ in range(args.rounds):
        drop(pth)
        direct["cold"].append(seq_read(pth, off, size))
        direct["warm"].append(seq_read(pth, off, size))
        direct["src"].append(seq_read(pth, off, size))
        direct["par"].append(parallel_read(pth, size, 4, off))
        drop(pth)
        direct["mm_cold"].append(memmap_sum(pth, off, count)[0])
        direct["mm_warm"].append(memmap_sum(pth, off, count)[0])
    seq_read(pth, off, size)
    lat_direct = random_reads(pth, off, size, args.random)
    configs = {"single-threaded": ([], None), "multi-threaded": (["--threads"], None),
               "single-threaded, fstat only at open": ([], {**os.environ, "CKPTFS_VERIFY_READS": "0"})}
    if args.threads != "both":
        configs = {k: v for k, v in configs.items() if k.startswith(args.threads)}
    results = {}
    for label, (margs, env) in configs.items():
        r: dict[str, list[float]] = {"cold": [], "warm": [], "mm_cold": [], "mm_warm": [], "lat": [], "src": [],
                                     "par": []}
        mount(pth, mnt, *margs, env=env)
        try:
            f = os.path.join(mnt, "w")
            info = json.load(open(os.path.join(mnt, ".ckptfs", "mount.json")))
            for _ in range(args.rounds):
                drop(pth)
                drop(f)
                r["cold"].append(seq_read(f, 0, size))
                r["warm"].append(seq_read(f, 0, size))
                seq_read(pth, off, size)  # the checkpoint in the page cache, the mount's cache dropped
                drop(f)
                r["src"].append(seq_read(f, 0, size))
                drop(f)
                r["par"].append(parallel_read(f, size, 4))
                drop(pth)
                drop(f)
                r["mm_cold"].append(memmap_sum(f, 0, count)[0])
                r["mm_warm"].append(memmap_sum(f, 0, count)[0])
            assert memmap_sum(f, 0, count)[1] == memmap_sum(pth, off, count)[1]
            seq_read(pth, off, size)  # the source warm, the mount's own cache dropped: every 4 KiB is a request
            drop(f)
            r["lat"] = random_reads(f, 0, size, args.random)
        finally:
            umount(mnt)
        results[label] = (r, info)
    ready = []
    for _ in range(5):
        ready.append(mount(many, mnt))
        umount(mnt)

    print(f"## ckptfs mount figures ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, "
          f"{os.uname().release}, libfuse {results[next(iter(results))][1]['libfuse']})\n")
    print(f"{size >> 20} MiB float32 tensor, median of {args.rounds} rounds (min, max); GB/s = 1e9 bytes/s\n")
    print("| measure | direct (the .pth file) | " + " | ".join(f"mount, {k}" for k in results) + " |")
    print("|---|---|" + "---|" * len(results))

    def line(name: str, key: str, unit: str = " GB/s") -> None:
        cells = [fmt(results[k][0][key], unit) for k in results]
        print(f"| {name} | {fmt(direct[key], unit)} | " + " | ".join(cells) + " |")

    line("sequential read, cold (checkpoint and mount caches dropped)", "cold")
    line("sequential read, mount cache cold, checkpoint in page cache", "src")
    line("sequential read, warm (mount's page cache)", "warm")
    line("4 readers on disjoint quarters, aggregate (mount cache cold, checkpoint cached)", "par")
    line("np.memmap(...).sum(), cold", "mm_cold")
    line("np.memmap(...).sum(), warm", "mm_warm")
    q = lambda xs, p: sorted(xs)[int(p * (len(xs) - 1))]  # noqa: E731
    cells = [f"p50 {q(results[k][0]['lat'], .5):.3f} ms, p99 {q(results[k][0]['lat'], .99):.3f} ms" for k in results]
    print(f"| random 4 KiB pread (FADV_RANDOM; mount cache dropped, source warm) | p50 {q(lat_direct, .5):.4f} ms, "
          f"p99 {q(lat_direct, .99):.4f} ms | " + " | ".join(cells) + " |")
    print(f"\nmount-ready, {args.ready_tensors:,} tensors (command start to `ckptfs mount` returning with the "
          f"mount answering, interpreter start included): median {statistics.median(ready):.3f} s "
          f"(min {min(ready):.3f}, max {max(ready):.3f}) over {len(ready)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
