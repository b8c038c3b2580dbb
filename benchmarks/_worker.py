"""One measurement in a fresh process: ``python -m benchmarks._worker '<json spec>'``.

The spec names an operation (index, api_all, load_state_dict, seq_read, random_read, memmap_sum) and
its parameters. Libraries are imported first (timed separately), then the measured step runs; the result
is printed as one JSON line prefixed with ``BENCH_RESULT``. With ``"profile": PATH`` the measured step runs
under pyinstrument and its call tree is written to PATH.
"""

from __future__ import annotations

import gc
import json
import os
import random
import resource
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from .util import drop_file_cache, percentile, proc_status, rss_bytes, warm_file

MARK = "BENCH_RESULT "


# --- imports (timed, outside the measured step) ------------------------------------------------------------


def import_for(impl: str) -> dict[str, Any]:
    mods: dict[str, Any] = {}
    if impl.startswith("ckptfs"):
        import ckptfs
        import ckptfs.model.directory  # noqa: F401 - what opening a directory imports: an import, not indexing

        mods["ckptfs"] = ckptfs
        if impl in ("ckptfs_tensor", "ckptfs_load"):
            import torch

            import ckptfs.torchio.tensors  # noqa: F401 - ckptfs.tensor()/load() import torch: count it as an import

            mods["torch"] = torch
    elif impl.startswith("torch"):
        import torch

        mods["torch"] = torch
        if impl == "torch_dcp_metadata":
            import torch.distributed.checkpoint  # noqa: F401
    elif impl.startswith("zipslicer"):
        import warnings

        import torch
        import zipslicer

        warnings.filterwarnings("ignore")
        mods["torch"] = torch
        mods["zipslicer"] = zipslicer
    elif impl.startswith("safetensors"):
        import safetensors

        mods["safetensors"] = safetensors
        if impl.endswith("_pt"):
            import safetensors.torch  # noqa: F401
            import torch

            mods["torch"] = torch
        else:
            import numpy  # noqa: F401
    return mods


# --- profiling ------------------------------------------------------------------------------------------------


@contextmanager
def maybe_profile(spec: dict) -> Iterator[None]:
    path = spec.get("profile")
    if not path:
        yield
        return
    try:
        from pyinstrument import Profiler
    except ImportError:  # not in every environment: fall back on cProfile
        import cProfile
        import io
        import pstats

        cprof = cProfile.Profile()
        cprof.enable()
        try:
            yield
        finally:
            cprof.disable()
            buf = io.StringIO()
            pstats.Stats(cprof, stream=buf).sort_stats("cumulative").print_stats(30)
            with open(path, "w") as f:
                f.write("CPROFILE\n" + buf.getvalue())
        return
    prof = Profiler(interval=0.0005)
    prof.start()
    try:
        yield
    finally:
        prof.stop()
        with open(path, "w") as f:
            f.write(prof.output_text(unicode=False, color=False, show_all=False))


# --- helpers ---------------------------------------------------------------------------------------------------


def walk_tensors(obj: Any, torch: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, tensor) for every tensor in nested dicts/lists/tuples of a torch.load result."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from walk_tensors(v, torch, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from walk_tensors(v, torch, f"{prefix}.{i}" if prefix else str(i))


def malloc_trim() -> None:
    """Give freed heap memory back to the OS (glibc), so RSS shows what is retained, not a past peak."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def prepare(spec: dict) -> None:
    """Cache state before the measured step: warm ranges, then drop files (order matters for cold runs)."""
    for w in spec.get("warm", []):
        warm_file(w[0], w[1], w[2]) if len(w) == 3 else warm_file(w[0])
    drop_file_cache(*spec.get("drop", []))


# --- operations --------------------------------------------------------------------------------------------------


def op_index(spec: dict, mods: dict) -> dict:
    """Keys + shapes of every tensor, from call to list in hand."""
    impl, path = spec["impl"], spec["path"]
    trace = spec.get("tracemalloc", False)
    index_only = spec.get("index_only", False)  # memory of the index object alone (no keys+shapes list kept)
    gc.collect()
    malloc_trim()
    if trace:
        import tracemalloc

        tracemalloc.start()
    rss0 = rss_bytes()
    anon0 = proc_status().get("RssAnon", 0)
    keep: Any = None
    t0 = time.perf_counter()
    with maybe_profile(spec):
        if impl == "ckptfs":
            ck = mods["ckptfs"]
            c = ck.open(path, limits=ck.Limits(**spec["limits"])) if spec.get("limits") else ck.open(path)
            rows = [(k, None) for k in c.tensor_keys()] if index_only else [(k, c.meta(k).shape) for k in c.keys()]
            keep = c
        elif impl in ("torch_mmap", "torch"):
            torch = mods["torch"]
            obj = torch.load(path, mmap=impl == "torch_mmap", weights_only=True)
            rows = [(k, ()) for k, t in walk_tensors(obj, torch)]
            if not index_only:
                rows = [(k, tuple(t.shape)) for k, t in walk_tensors(obj, torch)]
            keep = obj
        elif impl == "zipslicer":
            sd = mods["zipslicer"].load(path)
            rows = [(k, tuple(sd.get_meta(k).shape)) for k in sd.keys()]
            keep = sd
        elif impl == "safetensors":
            from safetensors import safe_open

            f = safe_open(path, framework="np")
            rows = [(k, tuple(f.get_slice(k).get_shape())) for k in f.keys()]
            keep = f
        elif impl == "safetensors_shards":  # a sharded directory as transformers reads its metadata
            from safetensors import safe_open

            keep, rows = [], []
            for name in sorted(os.listdir(path)):
                if name.endswith(".safetensors"):
                    f = safe_open(os.path.join(path, name), framework="np")
                    rows += [(k, tuple(f.get_slice(k).get_shape())) for k in f.keys()]
                    keep.append(f)
        elif impl == "torch_mmap_shards":  # .bin shards as transformers loads them (mmap, weights_only)
            torch = mods["torch"]
            keep, rows = [], []
            for name in sorted(os.listdir(path)):
                if name.endswith(".bin"):
                    sd = torch.load(os.path.join(path, name), mmap=True, weights_only=True)
                    rows += [(k, tuple(t.shape)) for k, t in sd.items()]
                    keep.append(sd)
        elif impl == "torch_dcp_metadata":  # DCP's own reader of .metadata
            from torch.distributed.checkpoint import FileSystemReader

            md = FileSystemReader(path).read_metadata()
            rows = [(k, tuple(getattr(v, "size", ()))) for k, v in md.state_dict_metadata.items()]
            keep = md
        else:
            raise ValueError(impl)
    t1 = time.perf_counter()
    out = {"seconds": t1 - t0, "n": len(rows)}
    out["n_tensors"] = len(rows) if index_only else sum(1 for r in rows if r[1] is not None)
    if index_only:
        del rows
    gc.collect()
    malloc_trim()
    out["rss_delta"] = rss_bytes() - rss0
    out["anon_delta"] = proc_status().get("RssAnon", 0) - anon0
    if trace:
        import tracemalloc

        cur, peak = tracemalloc.get_traced_memory()
        out.update(trace_current=cur, trace_peak=peak)
        top = spec.get("tracemalloc_top")
        if top:  # where the retained memory was allocated (a memory profile)
            snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
            out["trace_top"] = [
                [f"{os.path.relpath(s.traceback[0].filename, os.path.dirname(os.path.dirname(__file__)))}:"
                 f"{s.traceback[0].lineno}", s.size, s.count] for s in snap.statistics("lineno")[:top]]
    del keep
    return out


def op_api_all(spec: dict, mods: dict) -> dict:
    """Every tensor through the Python API, each touched (summed) so its bytes are really read."""
    impl, path = spec["impl"], spec["path"]
    n = 0
    nbytes = 0
    t0 = time.perf_counter()
    with maybe_profile(spec):
        if impl in ("ckptfs_tensor", "ckptfs_numpy"):
            c = mods["ckptfs"].open(path)
            get = c.tensor if impl == "ckptfs_tensor" else c.numpy
            for k in c.tensor_keys():
                t = get(k)
                t.sum()
                n += 1
                nbytes += t.nbytes
            c.close()
        elif impl in ("torch_mmap", "torch"):
            torch = mods["torch"]
            obj = torch.load(path, mmap=impl == "torch_mmap", weights_only=True)
            for _, t in walk_tensors(obj, torch):
                t.sum()
                n += 1
                nbytes += t.nbytes
        elif impl == "zipslicer":
            sd = mods["zipslicer"].load(path)
            for k in sd.keys():
                t = sd[k]
                t.sum()
                n += 1
                nbytes += t.nbytes
        elif impl in ("safetensors_pt", "safetensors_np"):
            from safetensors import safe_open

            with safe_open(path, framework="pt" if impl.endswith("_pt") else "np") as f:
                for k in f.keys():
                    t = f.get_tensor(k)
                    t.sum()
                    n += 1
                    nbytes += t.nbytes
        else:
            raise ValueError(impl)
    return {"seconds": time.perf_counter() - t0, "n": n, "bytes": nbytes}


class RssSampler:
    """Samples this process's RSS every few ms: the peak, and a memory profile — RSS growth (anonymous and
    file-backed separately) attributed to the Python frames running when it happened."""

    SKIP = ("_worker.py", "threading.py", "<frozen", "contextlib.py")

    def __init__(self, period: float = 0.005) -> None:
        self.period = period
        self.peak = 0
        self.peak_anon = 0
        self.peak_file = 0
        self.peak_detail: dict = {}
        self.peak_where = ""
        self.growth: dict[str, list[int]] = {}   # where -> [anon growth, file growth]
        self._last: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._main = threading.main_thread().ident
        self._t = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._sample()
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self._sample(final=True)

    def _where(self, final: bool) -> str:
        frame = None if final else sys._current_frames().get(self._main)
        if frame is None:
            return "(after the measured step returned)"
        names = []
        while frame is not None and len(names) < 3:
            co = frame.f_code
            fn = os.path.basename(co.co_filename)
            if not fn.startswith(self.SKIP):
                names.append(f"{co.co_name} ({fn}:{frame.f_lineno})")
            frame = frame.f_back
        return " <- ".join(names) or "(harness)"

    def _sample(self, final: bool = False) -> None:
        st = proc_status()
        rss, anon, file_ = st.get("VmRSS", 0), st.get("RssAnon", 0), st.get("RssFile", 0)
        self.peak_anon = max(self.peak_anon, anon)
        self.peak_file = max(self.peak_file, file_)
        where = None
        if self._last is not None:
            da, df = anon - self._last[0], file_ - self._last[1]
            if da > 0 or df > 0:
                where = self._where(final)
                g = self.growth.setdefault(where, [0, 0])
                g[0] += max(da, 0)
                g[1] += max(df, 0)
        self._last = (anon, file_)
        if rss > self.peak:
            self.peak = rss
            self.peak_detail = {"RssAnon": anon, "RssFile": file_}
            self.peak_where = where or self._where(final)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self._sample()

    def top_growth(self, n: int = 6) -> list[list]:
        return [[w, a, f] for w, (a, f) in sorted(self.growth.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))[:n]]


def op_load_state_dict(spec: dict, mods: dict) -> dict:
    """Build nn.Sequential(Linear(w, w) x L) with uninitialised parameters (meta device, then to_empty:
    the pages are not touched yet), then load the checkpoint into it with model.load_state_dict."""
    import torch

    impl, path, w, layers = spec["impl"], spec["path"], spec["width"], spec["layers"]
    with torch.device("meta"):
        model = torch.nn.Sequential(*[torch.nn.Linear(w, w) for _ in range(layers)])
    model = model.to_empty(device="cpu")
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    gc.collect()
    base = rss_bytes()
    st0 = proc_status()
    hwm0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    with RssSampler() as sampler, maybe_profile(spec):
        if impl == "ckptfs_load":
            sd = mods["ckptfs"].load(path)
        elif impl == "torch":
            sd = torch.load(path, weights_only=True)
        elif impl == "torch_mmap":
            sd = torch.load(path, mmap=True, weights_only=True)
        elif impl == "zipslicer":
            sd = mods["zipslicer"].load(path)
        else:
            raise ValueError(impl)
        res = model.load_state_dict(sd)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if res.missing_keys or res.unexpected_keys:
        raise RuntimeError(f"load_state_dict: {res}")
    if float(model[0].bias.detach().abs().sum()) == 0.0:
        raise RuntimeError("parameters were not loaded")
    return {"seconds": seconds, "model_bytes": model_bytes, "rss_base": base, "maxrss": peak, "maxrss_before": hwm0,
            "extra": peak - base - model_bytes, "sampled_peak": sampler.peak, "sampled_detail": sampler.peak_detail,
            "anon_growth": sampler.peak_anon - st0.get("RssAnon", 0),
            "file_growth": sampler.peak_file - st0.get("RssFile", 0),
            "peak_where": sampler.peak_where, "growth_by_frame": sampler.top_growth()}


def op_seq_read(spec: dict, mods: dict) -> dict:
    """Read [offset, offset+size) of a file front to back with os.preadv into one reused buffer."""
    path, offset, size, bufsize = spec["path"], spec.get("offset", 0), spec["size"], spec.get("bufsize", 1 << 20)
    buf = bytearray(bufsize)
    mv = memoryview(buf)
    prepare(spec)
    fd = os.open(path, os.O_RDONLY)
    try:
        pos, end = offset, offset + size
        t0 = time.perf_counter()
        with maybe_profile(spec):
            while pos < end:
                n = os.preadv(fd, [mv[: min(bufsize, end - pos)]], pos)
                if n <= 0:
                    raise OSError(f"short read at {pos} of {path}")
                pos += n
        seconds = time.perf_counter() - t0
    finally:
        os.close(fd)
    return {"seconds": seconds, "bytes": size, "bytes_per_s": size / seconds}


def op_random_read(spec: dict, mods: dict) -> dict:
    """``count`` os.pread calls of 4 KiB at distinct random 4 KiB-aligned offsets (seeded), each timed."""
    path, offset, size, count = spec["path"], spec.get("offset", 0), spec["size"], spec["count"]
    block = spec.get("block", 4096)
    rng = random.Random(spec.get("seed", 42))
    slots = rng.sample(range(size // block), min(count, size // block))
    prepare(spec)
    fd = os.open(path, os.O_RDONLY)
    lat = []
    try:
        with maybe_profile(spec):
            for s in slots:
                t0 = time.perf_counter()
                data = os.pread(fd, block, offset + s * block)
                lat.append(time.perf_counter() - t0)
                if len(data) != block:
                    raise OSError(f"short read at {s * block} of {path}")
    finally:
        os.close(fd)
    lat.sort()
    return {"count": len(lat), "p50": percentile(lat, 50), "p99": percentile(lat, 99), "mean": sum(lat) / len(lat),
            "max": lat[-1], "seconds": sum(lat)}


def op_memmap_sum(spec: dict, mods: dict) -> dict:
    """np.memmap(path, dtype, offset, shape).sum(): page faults through the page cache (or FUSE)."""
    import numpy as np

    path, offset, dtype = spec["path"], spec.get("offset", 0), spec.get("dtype")
    shape = spec.get("shape")
    if spec.get("sidecar"):  # dtype/shape from the mount's sidecar JSON, as a user of the mount would
        with open(spec["sidecar"]) as f:
            side = json.load(f)
        dtype = side.get("numpy_dtype") or side.get("dtype")
        shape = side["shape"]
    prepare(spec)
    t0 = time.perf_counter()
    with maybe_profile(spec):
        arr = np.memmap(path, dtype=np.dtype(dtype), mode="r", offset=offset, shape=tuple(shape))
        total = float(arr.sum())
    seconds = time.perf_counter() - t0
    nbytes = int(arr.nbytes)
    del arr
    return {"seconds": seconds, "bytes": nbytes, "bytes_per_s": nbytes / seconds, "sum": total}


# --- plain HTTP (the remote cases' limits and peers) ------------------------------------------------------------


def _http(url: str):
    import http.client
    from urllib.parse import urlsplit

    u = urlsplit(url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=600), u.path


def _get_into(conn, path: str, start: int, size: int, mv: memoryview) -> None:
    conn.request("GET", path, headers={"Range": f"bytes={start}-{start + size - 1}"})
    r = conn.getresponse()
    if r.status != 206:
        raise OSError(f"HTTP {r.status} for a range of {path}")
    got = 0
    while got < size:
        n = r.readinto(mv[: min(len(mv), size - got)])
        if not n:
            raise OSError(f"the answer ended after {got} of {size} bytes")
        got += n


def op_http_get(spec: dict, mods: dict) -> dict:
    """One GET of bytes [offset, offset+size) (a Range header, a new connection) read into a reused 1 MiB
    buffer with http.client: the limit for those bytes over HTTP from Python."""
    prepare(spec)
    mv = memoryview(bytearray(1 << 20))
    t0 = time.perf_counter()
    conn, path = _http(spec["url"])
    _get_into(conn, path, spec["offset"], spec["size"], mv)
    seconds = time.perf_counter() - t0
    conn.close()
    return {"seconds": seconds, "bytes": spec["size"], "bytes_per_s": spec["size"] / seconds}


def op_http_random(spec: dict, mods: dict) -> dict:
    """``count`` ranged GETs of 4 KiB on one kept-alive connection, at the offsets op_random_read uses, each
    timed: one round trip per read, the least any remote reader can do."""
    offset, size, count, block = spec["offset"], spec["size"], spec["count"], spec.get("block", 4096)
    rng = random.Random(spec.get("seed", 42))
    slots = rng.sample(range(size // block), min(count, size // block))
    prepare(spec)
    conn, path = _http(spec["url"])
    mv = memoryview(bytearray(block))
    lat = []
    for s in slots:
        t0 = time.perf_counter()
        _get_into(conn, path, offset + s * block, block, mv)
        lat.append(time.perf_counter() - t0)
    conn.close()
    lat.sort()
    return {"count": len(lat), "p50": percentile(lat, 50), "p99": percentile(lat, 99), "mean": sum(lat) / len(lat),
            "max": lat[-1], "seconds": sum(lat)}


def op_download_load(spec: dict, mods: dict) -> dict:
    """What people do without a remote reader: download the whole file (one GET), then torch.load it
    (weights_only, mmap) and list its keys and shapes."""
    import tempfile

    torch = mods["torch"]
    prepare(spec)
    t0 = time.perf_counter()
    conn, path = _http(spec["url"])
    conn.request("GET", path)
    r = conn.getresponse()
    if r.status != 200:
        raise OSError(f"HTTP {r.status}")
    with tempfile.NamedTemporaryFile(dir=spec.get("tmpdir"), suffix=".pth") as f:
        while chunk := r.read(8 << 20):
            f.write(chunk)
        f.flush()
        t_download = time.perf_counter() - t0
        sd = torch.load(f.name, map_location="cpu", weights_only=True, mmap=True)
        shapes = {k: tuple(v.shape) for k, v in walk_tensors(sd, torch)}
        seconds = time.perf_counter() - t0
    conn.close()
    return {"seconds": seconds, "download_seconds": t_download, "tensors": len(shapes)}


def _read_range(path: str, offset: int, size: int, bufsize: int = 1 << 20) -> None:
    buf = bytearray(bufsize)
    mv = memoryview(buf)
    fd = os.open(path, os.O_RDONLY)
    try:
        pos, end = offset, offset + size
        while pos < end:
            n = os.preadv(fd, [mv[: min(bufsize, end - pos)]], pos)
            if n <= 0:
                raise OSError(f"short read at {pos} of {path}")
            pos += n
    finally:
        os.close(fd)


def op_parallel_read(spec: dict, mods: dict) -> dict:
    """One process per [path, offset, size] of ``files``, each reading its range front to back; all are
    released at once (a pipe as the starting gun). Aggregate = all bytes / (last end - first start)."""
    files = spec["files"]
    prepare(spec)
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    pids = []
    for path, offset, size in files:
        pid = os.fork()
        if pid == 0:  # the reader: wait for the gun, read, report (start, end) on the pipe
            code = 1
            try:
                os.close(go_w)
                os.read(go_r, 1)
                t0 = time.perf_counter()
                _read_range(path, offset, size)
                t1 = time.perf_counter()
                os.write(out_w, json.dumps([t0, t1, size]).encode() + b"\n")
                code = 0
            except BaseException:  # noqa: BLE001
                traceback.print_exc()
            finally:
                os._exit(code)
        pids.append(pid)
    os.close(go_r)
    os.close(out_w)
    time.sleep(0.2)  # let every child reach its read of the gun
    os.write(go_w, b"x" * len(files))
    os.close(go_w)
    data = b""
    while True:
        chunk = os.read(out_r, 65536)
        if not chunk:
            break
        data += chunk
    os.close(out_r)
    failed = [pid for pid in pids if os.waitpid(pid, 0)[1] != 0]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(files)} readers failed")
    spans = [json.loads(line) for line in data.decode().splitlines()]
    start, end = min(s[0] for s in spans), max(s[1] for s in spans)
    total = sum(s[2] for s in spans)
    times = [s[1] - s[0] for s in spans]
    return {"seconds": end - start, "bytes": total, "bytes_per_s": total / (end - start),
            "spread": max(times) / min(times), "slowest": min(s[2] / (s[1] - s[0]) for s in spans),
            "fastest": max(s[2] / (s[1] - s[0]) for s in spans)}


def op_memmap_threads(spec: dict, mods: dict) -> dict:
    """np.memmap of ``count`` elements summed by ``threads`` threads at once (each its own slice: page faults
    from every thread into one mapping), then the mapped bytes compared with ``verify`` = [path, offset]."""
    import zlib

    import numpy as np

    path, offset, count, nthreads = spec["path"], spec.get("offset", 0), spec["count"], spec["threads"]
    dtype = np.dtype(spec.get("dtype", "<f4"))
    prepare(spec)
    faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt + resource.getrusage(resource.RUSAGE_SELF).ru_majflt
    arr = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(count,))
    bounds = [count * i // nthreads for i in range(nthreads + 1)]
    sums = [0.0] * nthreads
    errors: list[BaseException] = []
    gun = threading.Barrier(nthreads + 1)

    def work(i: int) -> None:
        try:
            gun.wait()
            sums[i] = float(arr[bounds[i] : bounds[i + 1]].sum(dtype=np.float64))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(nthreads)]
    for w in workers:
        w.start()
    gun.wait()
    t0 = time.perf_counter()
    for w in workers:
        w.join()
    seconds = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_SELF)
    if errors:
        raise RuntimeError(f"{len(errors)} thread(s) failed: {errors[0]!r}")
    verify = spec.get("verify")
    if verify:
        mapped = zlib.crc32(memoryview(arr).cast("B"))
        fd = os.open(verify[0], os.O_RDONLY)
        try:
            crc, pos, end = 0, verify[1], verify[1] + arr.nbytes
            while pos < end:
                chunk = os.pread(fd, min(8 << 20, end - pos), pos)
                if not chunk:
                    raise RuntimeError(f"{verify[0]} ends at {pos}")
                crc = zlib.crc32(chunk, crc)
                pos += len(chunk)
        finally:
            os.close(fd)
        if crc != mapped:
            raise RuntimeError(f"the mapped bytes of {path} differ from {verify[0]} at offset {verify[1]}")
    nbytes = int(arr.nbytes)
    return {"seconds": seconds, "bytes": nbytes, "bytes_per_s": nbytes / seconds, "sum": sum(sums),
            "faults": ru.ru_minflt + ru.ru_majflt - faults0}


def _torch_stats(t: Any, torch: Any) -> tuple:
    """What a user would write for a tensor's statistics with torch."""
    return (t.min(), t.max(), t.mean(), t.std(), torch.isnan(t).sum(), torch.isinf(t).sum(), (t == 0).sum(),
            t.abs().max())


def op_stats(spec: dict, mods: dict) -> dict:
    """Statistics of every tensor (ckptfs stats' engine, or torch over torch.load(mmap=True)), with the peak
    growth of anonymous memory (the page cache of the mapped file is not the process's own)."""
    impl, path = spec["impl"], spec["path"]
    prepare(spec)
    gc.collect()
    malloc_trim()
    anon0 = proc_status().get("RssAnon", 0)
    n = nbytes = 0
    t0 = time.perf_counter()
    with RssSampler() as sampler, maybe_profile(spec):
        if impl == "ckptfs":
            from ckptfs.api.stats import stats

            with mods["ckptfs"].open(path) as c:
                for s in stats(c.catalog):
                    n += 1
                    nbytes += s.numel * 4
        elif impl in ("torch_mmap", "torch_mmap_f64"):
            torch = mods["torch"]
            obj = torch.load(path, mmap=True, weights_only=True)
            for _, t in walk_tensors(obj, torch):
                _torch_stats(t.double() if impl.endswith("f64") else t, torch)
                n += 1
                nbytes += t.nbytes
        else:
            raise ValueError(impl)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "n": n, "bytes": nbytes, "bytes_per_s": nbytes / seconds,
            "anon_growth": sampler.peak_anon - anon0}


def op_diff(spec: dict, mods: dict) -> dict:
    """Compare ``path`` with ``other`` tensor by tensor: ckptfs's Comparison, or torch over two mmap loads (equal?
    else the largest absolute difference and the count, in float64)."""
    impl, path, other = spec["impl"], spec["path"], spec["other"]
    prepare(spec)
    gc.collect()
    malloc_trim()
    anon0 = proc_status().get("RssAnon", 0)
    different = n = nbytes = 0
    t0 = time.perf_counter()
    with RssSampler() as sampler, maybe_profile(spec):
        if impl == "ckptfs":
            from ckptfs.api.diff import Comparison

            with mods["ckptfs"].open(path) as a, mods["ckptfs"].open(other) as b:
                for e in Comparison(a.catalog, b.catalog):
                    n += 1
                    different += e.status != "identical"
                    nbytes += (e.numel or 0) * 4
        elif impl == "torch_mmap":
            torch = mods["torch"]
            ta = dict(walk_tensors(torch.load(path, mmap=True, weights_only=True), torch))
            tb = dict(walk_tensors(torch.load(other, mmap=True, weights_only=True), torch))
            for k, x in ta.items():
                y = tb[k]
                n += 1
                nbytes += x.nbytes
                if not torch.equal(x, y):
                    different += 1
                    d = (x.double() - y.double()).abs()
                    d.max(), (d > 0).sum()
        else:
            raise ValueError(impl)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "n": n, "different": different, "bytes": nbytes, "bytes_per_s": nbytes / seconds,
            "anon_growth": sampler.peak_anon - anon0}


OPS: dict[str, Callable[[dict, dict], dict]] = {
    "index": op_index, "api_all": op_api_all, "load_state_dict": op_load_state_dict, "seq_read": op_seq_read,
    "random_read": op_random_read, "memmap_sum": op_memmap_sum, "http_get": op_http_get,
    "http_random": op_http_random, "download_load": op_download_load,
    "parallel_read": op_parallel_read,
    "memmap_threads": op_memmap_threads,
    "stats": op_stats, "diff": op_diff,
}


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    t0 = time.perf_counter()
    mods = import_for(spec.get("impl", ""))
    t_import = time.perf_counter() - t0
    try:
        # "repeat" (profiling runs only): the whole operation again, so it outweighs the interpreter's start
        for _ in range(max(1, int(spec.get("repeat", 1)))):
            out = OPS[spec["op"]](spec, mods)
    except Exception as e:  # noqa: BLE001 - reported to the parent as this measurement's error
        traceback.print_exc()
        print(MARK + json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        return 1
    out["import_seconds"] = t_import
    ru = resource.getrusage(resource.RUSAGE_SELF)
    out["maxrss_total"] = ru.ru_maxrss * 1024
    out["ru_utime"], out["ru_stime"] = ru.ru_utime, ru.ru_stime
    print(MARK + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
