"""Load: many readers of random slices of random tensors for a bounded time, every byte checked against
torch's, through the Python API from threads and through one FUSE mount from 16 processes.

    CKPTFS_LOAD_SECONDS=60 pytest -s tests/test_load.py    # longer run (default: 6 s per part)
    CKPTFS_LOAD_REPORT=load.json ...                     # write the figures

Required: 0 mismatches, no exception, and the mount daemon's RSS flat (it serves from the page cache and
keeps no per-read state). The timed runs are `slow`; test_api_threads_fixed_reads (a fixed number of reads, no
clock) is the quick run's.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import ckptfs
from helpers import torch_bytes

SECONDS = float(os.environ.get("CKPTFS_LOAD_SECONDS", "6"))
WORKERS = 16
REPORT: dict = {}


def _checkpoint(path: Path) -> dict[str, torch.Tensor]:
    """~40 MB: 160 tensors of 7 dtypes, contiguous and not (transposed, sliced, expanded, channels_last,
    views sharing storages), a few large ones. Returns what torch.load gives back."""
    g = torch.Generator().manual_seed(5)
    sd: dict[str, torch.Tensor] = {}
    for i in range(40):
        n = int(torch.randint(1, 2000, (1,), generator=g))
        sd[f"layer{i}.weight"] = torch.randn(n, 37, generator=g)
        sd[f"layer{i}.bias"] = torch.randn(n, generator=g).half()
        base = torch.randn(64, 48, generator=g).to(torch.bfloat16)
        sd[f"layer{i}.t"] = base.t()
        sd[f"layer{i}.slice"] = base[3:50:2, 5::3]
    for i in range(20):
        sd[f"ints.{i}"] = torch.randint(-2**40, 2**40, (int(torch.randint(1, 50000, (1,), generator=g)),), generator=g)
        sd[f"masks.{i}"] = torch.rand(300, 7, generator=g) > 0.5
        sd[f"bytes.{i}"] = torch.randint(0, 255, (4096,), dtype=torch.uint8, generator=g)
    sd["big"] = torch.randn(2048, 2048, generator=g)  # 16 MiB
    sd["expanded"] = torch.randn(1, 1000, generator=g).expand(500, 1000)
    sd["nhwc"] = torch.randn(8, 16, 32, 32, generator=g).to(memory_format=torch.channels_last)
    torch.save(sd, path)
    return torch.load(path, weights_only=True)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("load")
    path = d / "load.pt"
    loaded = _checkpoint(path)
    expected = {k: torch_bytes(v) for k, v in loaded.items()}
    return path, expected, loaded


def _percentile(xs: list[float], p: float) -> float:
    return float(np.percentile(np.asarray(xs), p)) if xs else 0.0


def test_api_threads_fixed_reads(dataset: tuple) -> None:
    """8 threads on one Checkpoint, 150 random reads each (byte ranges and slices of random tensors), every
    result compared with torch's bytes."""
    path, expected, loaded = dataset
    keys = sorted(expected)
    errors: list[str] = []
    done = [0] * 8
    with ckptfs.open(path) as ck:
        def worker(w: int) -> None:
            rnd = random.Random(100 + w)
            try:
                for _ in range(150):
                    key = rnd.choice(keys)
                    want = expected[key]
                    if rnd.random() < 0.8:
                        off = rnd.randrange(len(want)) if want else 0
                        n = rnd.choice([1, 7, 64, 4096, 65536, 1 << 20])
                        ok = ck.read(key, off, n) == want[off:off + n]
                    else:
                        t = loaded[key]
                        a = rnd.randrange(t.shape[0])
                        b = rnd.randrange(a, t.shape[0]) + 1
                        ok = np.ascontiguousarray(ck.slice(key)[a:b]).tobytes() == torch_bytes(t[a:b])
                    if not ok:
                        errors.append(f"{key}: wrong bytes")
                    done[w] += 1
            except Exception as e:  # noqa: BLE001 - any exception is a failure
                errors.append(f"{type(e).__name__}: {e}")

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors[:10]
    assert done == [150] * 8


@pytest.mark.slow
def test_api_threads(dataset: tuple) -> None:
    """16 threads on one Checkpoint: byte ranges (read) and numpy slices (slice()[...]) of random tensors."""
    path, expected, loaded = dataset
    keys = sorted(expected)
    errors: list[str] = []
    lat: list[list[float]] = [[] for _ in range(WORKERS)]
    counts = [0] * WORKERS
    stop = time.monotonic() + SECONDS
    with ckptfs.open(path) as ck:
        def worker(w: int) -> None:
            rnd = random.Random(w)
            try:
                while time.monotonic() < stop:
                    key = rnd.choice(keys)
                    want = expected[key]
                    t0 = time.perf_counter()
                    if rnd.random() < 0.8:
                        off = rnd.randrange(len(want)) if want else 0
                        n = rnd.choice([1, 7, 64, 4096, 65536, 1 << 20])
                        got = ck.read(key, off, n)
                        ok = got == want[off:off + n]
                    else:
                        t = loaded[key]
                        a = rnd.randrange(t.shape[0])
                        b = rnd.randrange(a, t.shape[0]) + 1
                        got_arr = ck.slice(key)[a:b]
                        ok = np.ascontiguousarray(got_arr).tobytes() == torch_bytes(t[a:b])
                    lat[w].append(time.perf_counter() - t0)
                    counts[w] += 1
                    if not ok:
                        errors.append(f"{key}: wrong bytes")
            except Exception as e:  # noqa: BLE001 - any exception is a failure
                errors.append(f"{type(e).__name__}: {e}")

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(WORKERS)]
        t_start = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t_start
    all_lat = [x for ls in lat for x in ls]
    REPORT["api_threads"] = {"threads": WORKERS, "seconds": round(elapsed, 1), "reads": sum(counts),
                             "reads_per_s": round(sum(counts) / elapsed), "p50_ms": round(_percentile(all_lat, 50) * 1e3, 3),
                             "p99_ms": round(_percentile(all_lat, 99) * 1e3, 3), "mismatches": len(errors)}
    print("load api:", json.dumps(REPORT["api_threads"]))
    assert not errors, errors[:10]
    assert sum(counts) > 100


WORKER = r"""
import json, os, random, sys, time
mnt, ref, seconds, seed, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
cold = sys.argv[6] == "cold"
files = json.loads(open(os.path.join(ref, "files.json")).read())
rnd = random.Random(seed)
fds = {}
lat, n, bad = [], 0, []
stop = time.monotonic() + seconds
while time.monotonic() < stop:
    rel, size = rnd.choice(files)
    if rel not in fds:
        fds[rel] = (os.open(os.path.join(mnt, rel), os.O_RDONLY), os.open(os.path.join(ref, rel.replace("/", "__")), os.O_RDONLY))
    fm, fr = fds[rel]
    off = rnd.randrange(size) if size else 0
    k = rnd.choice([1, 7, 64, 4096, 65536, 1 << 20])
    if cold:  # drop the range from the page cache first: the read goes to the daemon
        lo = off - off % 4096  # whole pages: a range within one page drops nothing
        os.posix_fadvise(fm, lo, (off + k - lo + 4095) // 4096 * 4096, os.POSIX_FADV_DONTNEED)
    t0 = time.perf_counter()
    got = os.pread(fm, k, off)
    lat.append(time.perf_counter() - t0)
    n += 1
    if got != os.pread(fr, k, off):
        bad.append((rel, off, k))
with open(out, "w") as f:
    json.dump({"reads": n, "lat": lat, "bad": bad[:20], "nbad": len(bad)}, f)
"""


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@pytest.mark.slow
@pytest.mark.mount
@pytest.mark.parametrize("cache", ["cold", "warm"])
@pytest.mark.parametrize("threads", [False, True], ids=["single-threaded", "threads"])
def test_mount_processes(dataset: tuple, mount, tmp_path: Path, threads: bool, cache: str) -> None:
    """16 processes pread random ranges of random tensor files through one mount; each read is compared
    with torch's bytes (reference files written from torch.load's tensors). "cold": each range is dropped
    from the page cache first (POSIX_FADV_DONTNEED), so every read reaches the daemon; "warm": repeated
    ranges come from the kernel's page cache, as they do for real readers."""
    path, expected, _ = dataset
    m = mount(path, *(["--threads"] if threads else []))
    index = m.index()
    ref = tmp_path / "ref"
    ref.mkdir()
    files = []
    for e in index["entries"]:
        if e["kind"] == "tensor":
            (ref / e["path"].replace("/", "__")).write_bytes(expected[e["key"]])
            files.append((e["path"], e["nbytes"]))
    assert len(files) == len(expected)
    (ref / "files.json").write_text(json.dumps(files))
    # warm up: every file opened and read once, so the RSS baseline includes the daemon's steady state
    for rel, _ in files:
        with open(m / rel, "rb") as f:
            f.read(1)
    rss0 = _rss_kb(m.pid)
    samples = [rss0]
    outs = [tmp_path / f"worker{i}.json" for i in range(WORKERS)]
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(m.path), str(ref), str(SECONDS), str(i), str(outs[i]), cache])
             for i in range(WORKERS)]
    t_start = time.monotonic()
    deadline = time.monotonic() + SECONDS + 120
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.5)
        samples.append(_rss_kb(m.pid))
    for p in procs:  # our own workers, by handle
        if p.poll() is None:
            p.kill()
        p.wait()
    elapsed = time.monotonic() - t_start
    assert all(p.returncode == 0 for p in procs), [p.returncode for p in procs]
    results = [json.loads(o.read_text()) for o in outs]
    rss1 = _rss_kb(m.pid)
    lat = [x for r in results for x in r["lat"]]
    reads = sum(r["reads"] for r in results)
    nbad = sum(r["nbad"] for r in results)
    key = ("mount_threads_" if threads else "mount_single_") + cache
    REPORT[key] = {"processes": WORKERS, "seconds": round(elapsed, 1), "reads": reads,
                   "reads_per_s": round(reads / elapsed), "p50_ms": round(_percentile(lat, 50) * 1e3, 3),
                   "p99_ms": round(_percentile(lat, 99) * 1e3, 3), "mismatches": nbad,
                   "daemon_rss_kb_before": rss0, "daemon_rss_kb_after": rss1, "daemon_rss_kb_max": max(samples)}
    print(f"load {key}:", json.dumps(REPORT[key]))
    out = os.environ.get("CKPTFS_LOAD_REPORT")
    if out:
        Path(out).write_text(json.dumps(REPORT, indent=1))
    assert nbad == 0, [r["bad"] for r in results if r["bad"]][:3]
    assert reads > 100
    # flat: no growth with the number of reads (a leak per read would show as tens of MB here)
    assert max(samples) - rss0 < 32 << 10, (rss0, max(samples))
