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

        mods["ckptfs"] = ckptfs
        if impl in ("ckptfs_tensor", "ckptfs_load"):
            import torch

            import ckptfs.torchio.tensors  # noqa: F401 - ckptfs.tensor()/load() import torch: count it as an import

            mods["torch"] = torch
    elif impl.startswith("torch"):
        import torch

        mods["torch"] = torch
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
            c = mods["ckptfs"].open(path)
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
    "random_read": op_random_read, "memmap_sum": op_memmap_sum, "stats": op_stats, "diff": op_diff,
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
