"""Remote cases: checkpoints served over HTTP by nginx (started here on loopback, a free port), read by ckptfs
and by what people use otherwise, side by side in one run:

* ``remote-ls-1gb``: requests and bytes to list a 1 GB checkpoint (`ckptfs ls URL`) vs downloading it and
  calling torch.load;
* ``remote-seq``, ``remote-random-4k``: a 256 MiB tensor through a mount of the URL (a fresh mount per run:
  nothing cached) vs a plain ranged GET of the same bytes (the limit), ratarmount on the same URL and rclone
  mount (Debian's rclone, an ``:http:`` remote) of the same server;
* ``remote-seq-20ms``, ``remote-random-20ms``: the same through a proxy that delays every request and every
  new connection by 20 ms (tests/servers.py's FaultProxy, in its own process), where round trips dominate.

Requests and bytes are read from nginx's access log. The server's file is kept in its page cache (warmed
before each run): the network path is measured, not the disk.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from .cases_mount import STORAGE, _direct_span, _zip_root, mounted_paths
from .core import PKG_PARENT, CaseResult, Context, MeasureError, Row, judge, repeat, run_worker, time_command
from .util import first_line, script

SERVERS = os.path.join(PKG_PARENT, "tests", "servers.py")
DELAY = 0.020
_mod: list[Any] = []


def _servers() -> Any:
    """tests/servers.py (nginx, the proxy), loaded by path: one implementation for the tests and the benchmarks."""
    if not _mod:
        spec = importlib.util.spec_from_file_location("ckptfs_bench_servers", SERVERS)
        if spec is None or spec.loader is None:
            raise MeasureError(f"cannot load {SERVERS}")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _mod.append(mod)
    return _mod[0]


class Served:
    """nginx serving some files, optionally behind the delaying proxy; URLs and the access log."""

    def __init__(self, nginx: Any, proxy_port: int | None) -> None:
        self.nginx = nginx
        self.proxy_port = proxy_port

    def url(self, name: str) -> str:
        port = self.proxy_port or self.nginx.port
        return f"http://127.0.0.1:{port}/{name}"

    def base(self) -> str:
        return self.url("")

    def mark(self) -> int:
        return len(self.nginx.log())

    def traffic(self, name: str, since: int) -> tuple[int, int]:
        """(requests, body bytes) for ``name`` logged after ``since`` entries."""
        reqs = self.nginx.requests_for("/" + name, since)
        return len(reqs), sum(e["bytes"] for e in reqs)


@contextmanager
def served(ctx: Context, files: dict[str, str], delay: float = 0.0) -> Iterator[Served]:
    srv = _servers()
    base = Path(ctx.work) / f"nginx-{time.monotonic_ns()}"
    nginx = srv.Nginx(base)
    (base / "www").mkdir(parents=True)
    for name, path in files.items():
        os.symlink(os.path.abspath(path), base / "www" / name)
    proxy = None
    try:
        try:
            nginx.start()
        except Exception as e:  # noqa: BLE001
            raise MeasureError(f"nginx could not start: {e}") from None
        port = None
        if delay:
            proxy = subprocess.Popen([sys.executable, SERVERS, str(nginx.port), str(delay)], stdout=subprocess.PIPE,
                                     text=True)
            assert proxy.stdout is not None
            port = int(proxy.stdout.readline())
        yield Served(nginx, port)
    finally:
        if proxy is not None:
            proxy.terminate()
            proxy.wait(10)
        nginx.stop()


# --- mounts of a URL ------------------------------------------------------------------------------------------


class RemoteMount:
    """A mount of a URL by ckptfs (daemonizes), ratarmount (-f, in the background) or rclone (an :http: remote
    of the server's root, in the foreground, in the background); ``stop()`` unmounts whatever happened."""

    def __init__(self, ctx: Context, kind: str, url: str, base: str, mnt: str) -> None:
        self.ctx, self.kind, self.url, self.base, self.mnt = ctx, kind, url, base, mnt
        self.proc: subprocess.Popen | None = None
        os.makedirs(mnt, exist_ok=True)

    def start(self, wait_for: str, timeout: float = 120.0) -> None:
        env = dict(os.environ, RCLONE_CONFIG=os.devnull)
        if self.kind == "ckptfs":
            exe = script("ckptfs")
            if exe is None:
                raise MeasureError("the ckptfs command is not installed")
            r = subprocess.run([exe, "mount", self.url, self.mnt], capture_output=True, text=True, timeout=timeout)
            if r.returncode != 0:
                raise MeasureError(f"ckptfs mount exited {r.returncode}: {first_line(r.stderr)}")
        else:
            if self.kind == "ratarmount":
                exe = script("ratarmount")
                cmd = [exe, "-f", self.url, self.mnt] if exe else None
            else:
                exe = script("rclone")
                cmd = [exe, "mount", ":http:", self.mnt, "--http-url", self.base, "--read-only"] if exe else None
            if cmd is None:
                raise MeasureError(f"{self.kind} is not installed")
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        t0 = time.perf_counter()
        target = os.path.join(self.mnt, wait_for)
        while not os.path.exists(target):
            if self.proc is not None and self.proc.poll() is not None:
                err = self.proc.stderr.read() if self.proc.stderr else ""
                raise MeasureError(f"{self.kind} exited {self.proc.returncode}: {first_line(err)}")
            if time.perf_counter() - t0 > timeout:
                self.stop()
                raise MeasureError(f"{self.kind}: {wait_for} did not appear in {timeout:.0f} s")
            time.sleep(0.02)

    def stop(self) -> None:
        for cmd in (["fusermount3", "-u", self.mnt], ["fusermount", "-u", self.mnt], ["fusermount3", "-uz", self.mnt]):
            if self.mnt not in mounted_paths():
                break
            for _ in range(50):
                subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                if self.mnt not in mounted_paths():
                    break
                time.sleep(0.1)
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(20)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(5)
            if self.proc.stderr:
                self.proc.stderr.close()
            self.proc = None
        if self.mnt in mounted_paths():
            self.ctx.log(f"WARNING: {self.mnt} is still mounted")


@contextmanager
def remote_mount(ctx: Context, kind: str, s: Served, name: str, wait_for: str) -> Iterator[RemoteMount]:
    m = RemoteMount(ctx, kind, s.url(name), s.base(), os.path.join(ctx.work, "mnt", f"remote-{kind}"))
    try:
        m.start(wait_for)
        yield m
    finally:
        m.stop()


def _mounted_read(ctx: Context, s: Served, kind: str, pth: str, spec: dict) -> dict:
    """A fresh mount of kind ``kind``, one measured read of the "seq" tensor through it; with the requests and
    bytes nginx saw during the read."""
    off, size = _direct_span(pth, "seq")
    root = _zip_root(pth)
    rel = {"ckptfs": ("seq", 0), "ratarmount": (os.path.join(root, "data", STORAGE["seq"]), 0),
           "rclone": ("mount.pth", off)}[kind]
    with remote_mount(ctx, kind, s, "mount.pth", rel[0]) as m:
        path = os.path.join(m.mnt, rel[0])
        since = s.mark()
        out = run_worker(ctx, {**spec, "path": path, "offset": rel[1], "size": size, "warm": [[pth]]})
        time.sleep(0.2)  # nginx logs a request when it ends: the read-ahead still in flight lands too
        out["requests"], out["bytes_fetched"] = s.traffic("mount.pth", since)
    return out


PEERS = (("ckptfs", "ckptfs mount URL", True), ("ratarmount", "ratarmount URL (default options)", False),
         ("rclone", "rclone mount :http: (default options)", False))


def _seq_case(ctx: Context, delay: float) -> CaseResult:
    cfg = ctx.cfg
    cid = "remote-seq-20ms" if delay else "remote-seq"
    pth = ctx.data.get("mount")
    where = f", +{delay * 1e3:.0f} ms per request" if delay else ""
    res = CaseResult(cid, f"sequential read of a {cfg.seq_bytes >> 20} MiB tensor over HTTP{where}",
                     "throughput: a fresh mount of the URL, the tensor read front to back (os.preadv, 1 MiB); the "
                     "limit is one ranged GET of the same bytes with http.client", "GB/s", 1e-9, "higher",
                     "≥ 0.8× the plain ranged GET", extra_cols=[("requests", "requests", 1.0)])
    off, size = _direct_span(pth, "seq")
    with served(ctx, {"mount.pth": pth}, delay) as s:
        runs = []
        for kind, label, is_ck in PEERS:
            row = Row(label, is_ckptfs=is_ck)
            res.rows.append(row)
            spec = {"op": "seq_read", "bufsize": 1 << 20}
            runs.append((row, lambda kind=kind, spec=spec: _mounted_read(ctx, s, kind, pth, spec), "bytes_per_s",
                         None))
        limit = Row("plain ranged GET (http.client, one request)")
        res.rows.append(limit)
        runs.append((limit, lambda: run_worker(ctx, {"op": "http_get", "url": s.url("mount.pth"), "offset": off,
                                                     "size": size, "warm": [[pth]]}), "bytes_per_s", None))
        repeat(ctx, res, runs)
    judge(res, [("ckptfs/GET", lambda: res.ratio(limit), lambda v: v >= 0.8, "≥ 0.8")])
    res.notes.append("every run mounts afresh (ckptfs, ratarmount and rclone alike): no byte of the tensor is "
                     "cached anywhere but in nginx's page cache; the mount's start is not timed")
    return res


def _random_case(ctx: Context, delay: float) -> CaseResult:
    cfg = ctx.cfg
    cid = "remote-random-20ms" if delay else "remote-random-4k"
    pth = ctx.data.get("mount")
    count = cfg.random_reads_slow if delay else cfg.random_reads  # at +20 ms a read costs ~20-40 ms
    slow = cfg.random_reads_slow  # ratarmount: ~25-60 ms a read here
    where = f", +{delay * 1e3:.0f} ms per request" if delay else ""
    res = CaseResult(cid, f"random 4 KiB reads in a {cfg.seq_bytes >> 20} MiB tensor over HTTP{where}",
                     f"p50 latency of os.pread(4 KiB) at {count} distinct random aligned offsets through a fresh mount "
                     "of the URL; the limit is one ranged GET of 4 KiB per read on a kept-alive connection", "ms", 1e3,
                     "lower", "≤ 1 request per read",
                     extra_cols=[("p99", "p99 ms", 1e3), ("requests", "requests", 1.0)])
    off, size = _direct_span(pth, "seq")
    with served(ctx, {"mount.pth": pth}, delay) as s:
        runs = []
        for kind, label, is_ck in PEERS:
            row = Row(label, is_ckptfs=is_ck)
            res.rows.append(row)
            spec = {"op": "random_read", "count": slow if kind == "ratarmount" else count}
            if kind == "ratarmount" and slow < count:
                row.note = f"{slow} reads per run"
            runs.append((row, lambda kind=kind, spec=spec: _mounted_read(ctx, s, kind, pth, spec), "p50", None))
        limit = Row("ranged GETs of 4 KiB (http.client, one connection)")
        res.rows.append(limit)
        runs.append((limit, lambda: run_worker(ctx, {"op": "http_random", "url": s.url("mount.pth"), "offset": off,
                                                     "size": size, "count": count, "warm": [[pth]]}), "p50", None))
        repeat(ctx, res, runs)
    ck = res.ckptfs
    judge(res, [("ckptfs requests per read",
                 lambda: ck.extra_median("requests") / count if ck and ck.extra_median("requests") else None,
                 lambda v: v <= 1.0, "≤ 1")])
    ratio = res.ratio(limit)
    if ratio is not None:
        res.notes.append(f"ckptfs p50 / one ranged GET's p50 = {ratio:.2f} (a FUSE read fetches a 256 KiB block: "
                         "neighbouring reads are then served from memory)")
    return res


def remote_seq(ctx: Context) -> CaseResult:
    return _seq_case(ctx, 0.0)


def remote_seq_20ms(ctx: Context) -> CaseResult:
    return _seq_case(ctx, DELAY)


def remote_random(ctx: Context) -> CaseResult:
    return _random_case(ctx, 0.0)


def remote_random_20ms(ctx: Context) -> CaseResult:
    return _random_case(ctx, DELAY)


def remote_ls(ctx: Context) -> CaseResult:
    pth = ctx.data.get("big")
    size = os.path.getsize(pth)
    res = CaseResult("remote-ls-1gb", f"list a {size / 1e9:.2f} GB checkpoint over HTTP",
                     "bytes nginx sent to answer `ckptfs ls URL` (keys, dtypes, shapes) vs downloading the file and "
                     "calling torch.load(mmap=True) on it; requests and seconds beside", "MB", 1e-6, "lower",
                     "≤ 3 requests and ≤ 1 % of the download's bytes",
                     extra_cols=[("requests", "requests", 1.0), ("seconds", "seconds", 1.0)])
    exe = script("ckptfs")
    with served(ctx, {"big.pth": pth}) as s:
        def ckptfs_ls() -> dict:
            if exe is None:
                raise MeasureError("the ckptfs command is not installed")
            since = s.mark()
            seconds = time_command([exe, "ls", s.url("big.pth")])
            reqs, nbytes = s.traffic("big.pth", since)
            return {"bytes": nbytes, "requests": reqs, "seconds": seconds}

        def download() -> dict:
            since = s.mark()
            out = run_worker(ctx, {"op": "download_load", "impl": "torch_download", "url": s.url("big.pth"),
                                   "tmpdir": ctx.work, "warm": [[pth]]})
            out["requests"], out["bytes"] = s.traffic("big.pth", since)
            return out

        ck = Row("ckptfs ls URL", is_ckptfs=True)
        dl = Row("download (one GET) + torch.load(mmap=True)")
        res.rows += [ck, dl]
        repeat(ctx, res, [(ck, ckptfs_ls, "bytes", None), (dl, download, "bytes", None)])
    judge(res, [("ckptfs requests", lambda: ck.extra_median("requests"), lambda v: v <= 3, "≤ 3"),
                ("ckptfs/download bytes", lambda: res.ratio(dl), lambda v: v <= 0.01, "≤ 0.01")])
    return res


CASES = {"remote-ls-1gb": remote_ls, "remote-seq": remote_seq, "remote-random-4k": remote_random,
         "remote-seq-20ms": remote_seq_20ms, "remote-random-20ms": remote_random_20ms}
