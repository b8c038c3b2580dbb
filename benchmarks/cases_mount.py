"""Mount cases: mount-ready time, sequential / random / memmap / transposed reads through the mount,
and the daemon's RSS. ckptfs is driven through its documented CLI (`ckptfs mount CKPT MNT` returns when
ready, `ckptfs umount MNT`; key a.b.c is MNT/a/b/c with sidecar MNT/a/b/c.json); ratarmount mounts the
same .pth as a zip (its MNT/<root>/data/N files hold the same bytes)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import Iterator

from .core import PKG_PARENT, CaseResult, Context, MeasureError, Row, judge, repeat, run_worker
from .util import first_line, proc_status, record_span, script, warm_file

# storage keys of the "mount" and "readers" datasets' tensors (torch.save numbers storages in pickling order;
# checked against the bytes before measuring)
STORAGE = {"seq": "0", "contig": "1", "transposed": "2", **{f"t{i}": str(i) for i in range(64)}}
# the plot's series of a row (see benchmarks/plots.py)
CKPTFS, RAT, RAT_KC_SERIES, PLAIN = "ckptfs", "ratarmount", "ratarmount -o kernel_cache", "plain file"


# --- mounting ----------------------------------------------------------------------------------------------------


def mounted_paths() -> set[str]:
    out = set()
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 2 and "fuse" in parts[2]:
                out.add(parts[1].replace("\\040", " "))
    return out


def _find_daemon(mnt: str) -> int | None:
    me = os.getpid()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{d}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z":
            continue
        if any(a.decode(errors="replace").rstrip("/") == mnt.rstrip("/") for a in argv):
            return int(d)
    return None


class Mount:
    """A FUSE mount of a checkpoint by ckptfs or ratarmount; unmounts in stop() whatever happened."""

    def __init__(self, ctx: Context, kind: str, ckpt: str, mnt: str, options: list[str] | None = None) -> None:
        self.ctx, self.kind, self.ckpt, self.mnt = ctx, kind, os.path.abspath(ckpt), os.path.abspath(mnt)
        self.options = options or []
        self.pid: int | None = None
        os.makedirs(self.mnt, exist_ok=True)

    def command(self) -> list[str]:
        if self.kind == "ckptfs":
            exe = script("ckptfs")
            if exe is None:
                raise MeasureError("the ckptfs command is not installed")
            return [exe, "mount", self.ckpt, self.mnt] + sum((["-o", o] for o in self.options), [])
        exe = script("ratarmount")
        if exe is None:
            raise MeasureError("ratarmount is not installed")
        return [exe] + sum((["-o", o] for o in self.options), []) + [self.ckpt, self.mnt]

    def start(self, timeout: float = 120.0) -> float:
        """Mount; seconds from command start until listing the mount point answers (its first entry)."""
        if self.mnt in mounted_paths():
            self.stop()
        t0 = time.perf_counter()
        proc = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            while True:
                if os.path.ismount(self.mnt):
                    try:
                        with os.scandir(self.mnt) as it:  # its first entry: not the whole listing (1M entries)
                            if next(it, None) is not None:
                                break
                    except OSError:
                        pass
                rc = proc.poll()
                if rc is not None and rc != 0:
                    raise MeasureError(f"{self.kind} mount exited {rc}: {first_line(proc.stderr.read())}")
                if time.perf_counter() - t0 > timeout:
                    raise MeasureError(f"{self.kind} mount not ready after {timeout:.0f} s")
                time.sleep(0.001)
            ready = time.perf_counter() - t0
            try:
                proc.wait(timeout=30)  # the command returns once the daemon is up (daemonized)
            except subprocess.TimeoutExpired:
                pass
        except BaseException:
            self.stop()
            if proc.poll() is None:
                proc.kill()
            raise
        finally:
            if proc.stderr:
                proc.stderr.close()
        self.pid = _find_daemon(self.mnt)
        return ready

    def stop(self) -> None:
        if self.mnt not in mounted_paths():
            return
        cmds = []
        if self.kind == "ckptfs" and script("ckptfs"):
            cmds.append([script("ckptfs"), "umount", self.mnt])
        cmds += [["fusermount3", "-u", self.mnt], ["fusermount", "-u", self.mnt], ["fusermount3", "-uz", self.mnt],
                 ["fusermount", "-uz", self.mnt], ["umount", "-l", self.mnt]]
        for cmd in cmds:
            for _ in range(20):
                subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                if self.mnt not in mounted_paths():
                    break
                time.sleep(0.1)
            if self.mnt not in mounted_paths():
                break
        if self.pid is not None:  # let the daemon exit so that its RSS does not linger into the next case
            for _ in range(100):
                if not os.path.exists(f"/proc/{self.pid}"):
                    break
                time.sleep(0.05)
        if self.mnt in mounted_paths():
            self.ctx.log(f"WARNING: {self.mnt} is still mounted")


@contextmanager
def mount(ctx: Context, kind: str, ckpt: str, name: str, options: list[str] | None = None) -> Iterator[Mount]:
    m = Mount(ctx, kind, ckpt, os.path.join(ctx.work, "mnt", name), options)
    try:
        m.start()
        yield m
    finally:
        m.stop()


def _zip_root(pth: str) -> str:
    return record_span(pth, "data.pkl")[2].rsplit("/", 1)[0]


def ckptfs_path(m: Mount, key: str) -> str:
    return os.path.join(m.mnt, *key.split("."))


def rat_path(m: Mount, pth: str, key: str) -> str:
    return os.path.join(m.mnt, _zip_root(pth), "data", STORAGE[key])


def _check_same_bytes(a: str, b: str, a_off: int = 0, b_off: int = 0, n: int = 4096) -> None:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        fa.seek(a_off)
        fb.seek(b_off)
        if fa.read(n) != fb.read(n):
            raise MeasureError(f"{a} and {b} do not hold the same bytes")


def _direct_span(pth: str, key: str) -> tuple[int, int]:
    off, size, _ = record_span(pth, f"/data/{STORAGE[key]}")
    return off, size


# --- mount-ready ---------------------------------------------------------------------------------------------------


def mount_ready(ctx: Context) -> CaseResult:
    pth = ctx.data.get("tiny")
    warm_file(pth)
    res = CaseResult("mount-ready", f"mount-ready time, {ctx.cfg.tiny_n:,} tensors",
                     "command start → listing the mount point answers (interpreter start included)", "ms", 1e3,
                     "lower", "< 1 s and ≤ ratarmount")
    runs = []
    for kind, label, is_ck in (("ckptfs", "ckptfs mount", True), ("ratarmount", "ratarmount (default options)", False)):
        row = Row(label, is_ckptfs=is_ck)
        res.rows.append(row)

        def fn(kind=kind) -> dict:
            m = Mount(ctx, kind, pth, os.path.join(ctx.work, "mnt", f"ready-{kind}"))
            try:
                return {"seconds": m.start()}
            finally:
                m.stop()
        runs.append((row, fn, "seconds", None))
    repeat(ctx, res, runs)
    rat = res.rows[1]
    judge(res, [("ckptfs seconds", lambda: res.ckptfs.median, lambda v: v < 1.0, "< 1"),
                ("ckptfs/ratarmount", lambda: res.ratio(rat), lambda v: v <= 1.0, "≤ 1")])
    if res.met is False and ctx.profile:
        res.profile = _profile_mount_ready(ctx, pth)
    return res


def _profile_mount_ready(ctx: Context, pth: str) -> str | None:
    """py-spy over `ckptfs mount` (following the daemonized child) until the mount answers."""
    from .profiles import summarize_collapsed

    exe, spy = script("ckptfs"), script("py-spy")
    if exe is None or spy is None:
        return None
    mnt = os.path.join(ctx.work, "mnt", "ready-profile")
    os.makedirs(mnt, exist_ok=True)
    out = os.path.join(ctx.work, "profile-mount-ready.txt")
    m = Mount(ctx, "ckptfs", pth, mnt)
    proc = subprocess.Popen([spy, "record", "--subprocesses", "--format", "raw", "--rate", "500", "-o", out, "--",
                             exe, "mount", m.ckpt, m.mnt], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        t0 = time.perf_counter()
        while not (os.path.ismount(mnt) and os.listdir(mnt)) and time.perf_counter() - t0 < 60:
            time.sleep(0.01)
    finally:
        m.stop()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    return summarize_collapsed(out, title=" (ckptfs mount, command start to unmount)")


# --- reads through the mount ------------------------------------------------------------------------------------------


class ReadSetup:
    """ckptfs + ratarmount mounts of the "mount" dataset, and the paths/offsets every read case needs."""

    def __init__(self, ctx: Context, stack: ExitStack, rat_options: list[list[str]], dataset: str = "mount",
                 keys: tuple[str, ...] = ("seq", "contig")) -> None:
        self.ctx = ctx
        self.pth = ctx.data.get(dataset)
        self.errors: dict[str, str] = {}
        self.ck: Mount | None = None
        self.rats: dict[str, Mount] = {}
        try:
            self.ck = stack.enter_context(mount(ctx, "ckptfs", self.pth, f"{dataset}-ckptfs"))
            for key in keys:
                off, _ = _direct_span(self.pth, key)
                _check_same_bytes(ckptfs_path(self.ck, key), self.pth, 0, off)
        except Exception as e:  # noqa: BLE001
            self.errors["ckptfs"] = str(e)
        for opts in rat_options:
            label = _rat_label(opts)
            try:
                m = stack.enter_context(mount(ctx, "ratarmount", self.pth, f"{dataset}-rat" + "-".join(opts), opts))
                for key in keys:
                    off, _ = _direct_span(self.pth, key)
                    _check_same_bytes(rat_path(m, self.pth, key), self.pth, 0, off)
                self.rats[label] = m
            except Exception as e:  # noqa: BLE001
                self.errors[label] = str(e)

    def rows_for(self, res: CaseResult, key: str, spec_for, rat_labels: list[str], metric: str,
                 direct: bool = True, slow_override: int | None = None) -> list:
        """(Row, fn, metric, override) for ckptfs, direct and each ratarmount variant; spec_for(kind, path,
        offset, size, drop_paths) -> spec."""
        off, size = _direct_span(self.pth, key)
        runs = []
        row = Row("ckptfs mount", is_ckptfs=True, series=CKPTFS)
        res.rows.append(row)
        if self.ck is None:
            row.error = self.errors.get("ckptfs", "not mounted")
        else:
            p = ckptfs_path(self.ck, key)
            runs.append((row, _worker_fn(self.ctx, spec_for("ckptfs", p, 0, size, [self.pth, p], p + ".json")),
                         metric, None))
        if direct:
            row = Row("direct pread of the .pth", series=PLAIN)
            res.rows.append(row)
            runs.append((row, _worker_fn(self.ctx, spec_for("direct", self.pth, off, size, [self.pth], None)), metric,
                         None))
        for label in rat_labels:
            row = Row(label, series=RAT_KC_SERIES if label == RAT_KC else RAT)
            res.rows.append(row)
            m = self.rats.get(label)
            if m is None:
                row.error = self.errors.get(label, "not mounted")
                continue
            p = rat_path(m, self.pth, key)
            runs.append((row, _worker_fn(self.ctx, spec_for("rat", p, 0, size, [self.pth, p], None)), metric,
                         slow_override))
            if slow_override is not None and slow_override < self.ctx.cfg.reps:
                row.note = f"{slow_override} run(s)"
        return runs

    def profile_if_missed(self, res: CaseResult, key: str, spec_for, sidecar: bool = False) -> None:
        """Where ckptfs missed the target: profile the daemon (and the reader) over one more workload."""
        if res.met is not False or not self.ctx.profile or self.ck is None:
            return
        p = ckptfs_path(self.ck, key)
        _, size = _direct_span(self.pth, key)
        spec = spec_for("ckptfs", p, 0, size, [self.pth, p], p + ".json" if sidecar else None)
        res.profile = _profile_daemon(self.ctx, self.ck, res.id, spec)


def _rat_label(opts: list[str]) -> str:
    return "ratarmount" + (" -o " + ",".join(opts) if opts else " (default)")


RAT_DEFAULT = _rat_label([])
RAT_KC = _rat_label(["kernel_cache"])


def _worker_fn(ctx: Context, spec: dict):
    return lambda: run_worker(ctx, spec)


SEQ_STATES = {
    "cold": ("cold: posix_fadvise(DONTNEED) on the .pth and on the mounted file before the read (both caches "
             "dropped; the plain file is read cold too)", "≥ 0.9× the plain file cold"),
    "fresh": ("fresh mount: the .pth in the page cache, the mounted file's cache dropped (what a just-mounted "
              "checkpoint that was read before looks like); the plain file is read warm",
              "≥ 0.4× the plain file warm"),
    "warm": ("warm: the same range read once (separate open) just before the timed read",
             "≥ ratarmount -o kernel_cache and ≥ 0.5× the plain file"),
}


def _seq_case(ctx: Context, state: str) -> CaseResult:
    cfg = ctx.cfg
    cid = f"seq-read-{state}"
    how, target = SEQ_STATES[state]
    res = CaseResult(cid, f"sequential read of a {cfg.seq_bytes >> 20} MiB tensor through the mount, {state}",
                     f"throughput, os.preadv with a 1 MiB buffer; {how}", "GB/s", 1e-9, "higher", target)
    with ExitStack() as stack:
        rats = [[]] if state == "cold" else [[], ["kernel_cache"]]
        setup = ReadSetup(ctx, stack, rats)

        def spec_for(kind, p, off, size, drop, sidecar):
            s = {"op": "seq_read", "path": p, "offset": off, "size": size, "bufsize": 1 << 20}
            if state == "cold":
                s["drop"] = drop
            elif state == "fresh":
                s["warm"] = [[setup.pth]]
                s["drop"] = [x for x in drop if x != setup.pth]
            else:
                s["warm"] = [[p, off, size]]
            return s
        runs = setup.rows_for(res, "seq", spec_for, [_rat_label(o) for o in rats], "bytes_per_s")
        repeat(ctx, res, runs)
        direct, kc = res.row("direct pread of the .pth"), res.row(RAT_KC)
        if state == "cold":
            judge(res, [("ckptfs/plain file cold", lambda: res.ratio(direct), lambda v: v >= 0.9, "≥ 0.9")])
        elif state == "fresh":
            judge(res, [("ckptfs/plain file warm", lambda: res.ratio(direct), lambda v: v >= 0.4, "≥ 0.4")])
        else:
            judge(res, [("ckptfs/ratarmount -o kernel_cache", lambda: res.ratio(kc), lambda v: v >= 1.0, "≥ 1"),
                        ("ckptfs/plain file", lambda: res.ratio(direct), lambda v: v >= 0.5, "≥ 0.5")])
        setup.profile_if_missed(res, "seq", spec_for)
    return res


def random_4k(ctx: Context) -> CaseResult:
    cfg = ctx.cfg
    res = CaseResult("random-4k", f"random 4 KiB reads in a {cfg.seq_bytes >> 20} MiB tensor through the mount",
                     f"p50 latency of os.pread(4 KiB) at distinct random aligned offsets ({cfg.random_reads} per "
                     f"process; {cfg.random_reads_slow} for ratarmount); the .pth warm in the page cache, the "
                     "mounted file's cache dropped first", "ms", 1e3, "lower", "p50 ≤ 0.1 ms",
                     extra_cols=[("p99", "p99 ms", 1e3), ("mean", "mean ms", 1e3)])
    with ExitStack() as stack:
        setup = ReadSetup(ctx, stack, [[]])

        def spec_for(kind, p, off, size, drop, sidecar):
            count = cfg.random_reads_slow if kind == "rat" else cfg.random_reads
            return {"op": "random_read", "path": p, "offset": off, "size": size, "count": count,
                    "warm": [[setup.pth]], "drop": [x for x in drop if x != setup.pth]}
        runs = setup.rows_for(res, "seq", spec_for, [RAT_DEFAULT], "p50")
        repeat(ctx, res, runs)
        judge(res, [("ckptfs p50 ms", lambda: res.ckptfs.median * 1e3, lambda v: v <= 0.1, "≤ 0.1")])
        setup.profile_if_missed(res, "seq", spec_for)
    return res


def _memmap_case(ctx: Context, cold: bool) -> CaseResult:
    cfg = ctx.cfg
    cid = "memmap-cold" if cold else "memmap-warm"
    state = ("cold: posix_fadvise(DONTNEED) on the .pth and the mounted file first" if cold else
             "warm: the file read once just before (same for every row)")
    res = CaseResult(cid, f"np.memmap(...).sum() over a mounted {cfg.seq_bytes >> 20} MiB tensor, "
                     + ("cold" if cold else "warm"),
                     f"throughput of np.memmap + .sum() (dtype/shape from the sidecar for ckptfs); {state}",
                     "GB/s", 1e-9, "higher", "≥ 30% of the file at its offset" if cold else
                     "≥ ratarmount -o kernel_cache and ≥ 50% of the file at its offset")
    with ExitStack() as stack:
        rats = [[]] if cold else [[], ["kernel_cache"]]
        setup = ReadSetup(ctx, stack, rats)

        def spec_for(kind, p, off, size, drop, sidecar):
            s = {"op": "memmap_sum", "path": p, "offset": off, "dtype": "<f4", "shape": [size // 4]}
            if sidecar:
                s["sidecar"] = sidecar
            if cold:
                s["drop"] = drop
            else:
                s["warm"] = [[p, off, size]]
            return s
        runs = setup.rows_for(res, "seq", spec_for, [_rat_label(o) for o in rats], "bytes_per_s")
        res.rows[1].impl = "np.memmap of the .pth at the tensor's offset"
        repeat(ctx, res, runs)
        direct, kc = res.rows[1], res.row(RAT_KC)
        need = 0.3 if cold else 0.5
        checks = [("ckptfs/file", lambda: res.ratio(direct), lambda v: v >= need, f"≥ {need}")]
        if not cold:
            checks.insert(0, ("ckptfs/ratarmount -o kernel_cache", lambda: res.ratio(kc), lambda v: v >= 1.0, "≥ 1"))
        judge(res, checks)
        setup.profile_if_missed(res, "seq", spec_for, sidecar=True)
    return res


def transposed(ctx: Context) -> CaseResult:
    n = ctx.cfg.square
    res = CaseResult("transposed", f"transposed {n}×{n} float32 read through the mount",
                     "throughput of a whole-file read (1 MiB preadv); the .pth warm, the mounted file's cache "
                     "dropped first", "GB/s", 1e-9, "higher", "≥ 25% of the contiguous read (ratio ≥ 0.25)")
    with ExitStack() as stack:
        setup = ReadSetup(ctx, stack, [])
        runs = []
        row_t = Row("ckptfs mount: transposed tensor", is_ckptfs=True)
        row_c = Row("ckptfs mount: contiguous tensor, same size")
        row_d = Row("direct pread of the contiguous record")
        res.rows += [row_t, row_c, row_d]
        off, size = _direct_span(setup.pth, "contig")

        def spec(p: str, offset: int = 0, drop: bool = True) -> dict:
            return {"op": "seq_read", "path": p, "offset": offset, "size": size, "bufsize": 1 << 20,
                    "warm": [[setup.pth]], "drop": [p] if drop else []}
        if setup.ck is None:
            row_t.error = row_c.error = setup.errors.get("ckptfs", "not mounted")
        else:
            runs.append((row_t, _worker_fn(ctx, spec(ckptfs_path(setup.ck, "transposed"))), "bytes_per_s", None))
            runs.append((row_c, _worker_fn(ctx, spec(ckptfs_path(setup.ck, "contig"))), "bytes_per_s", None))
        runs.append((row_d, _worker_fn(ctx, spec(setup.pth, off, drop=False)), "bytes_per_s", None))
        repeat(ctx, res, runs)
        judge(res, [("transposed/contiguous", lambda: res.ratio(row_c), lambda v: v >= 0.25, "≥ 0.25")])
        if res.met is False and ctx.profile and setup.ck is not None:
            res.profile = _profile_daemon(ctx, setup.ck, "transposed", spec(ckptfs_path(setup.ck, "transposed")))
    return res


# --- concurrency ------------------------------------------------------------------------------------------------------


def readers_8(ctx: Context) -> CaseResult:
    cfg = ctx.cfg
    n, size_mib = cfg.readers_n, cfg.readers_tensor_bytes >> 20
    res = CaseResult("readers-8", f"{n} processes reading different tensors through the mount at once, checkpoint "
                     "cached", f"aggregate throughput of {n} processes, each reading its own {size_mib} MiB tensor "
                     "front to back (os.preadv, 1 MiB), released together (bytes / time from the first start to the "
                     "last end); the .pth warm, the mounted files' caches dropped. One reader alone on the same mount "
                     "for comparison", "GB/s", 1e-9, "higher",
                     "aggregate ≥ 1.6× one reader; slowest reader ≤ 2× the fastest",
                     extra_cols=[("spread", "slowest/fastest reader (time)", 1.0),
                                 ("slowest", "slowest reader GB/s", 1e-9)])
    keys = tuple(f"t{i}" for i in range(n))
    with ExitStack() as stack:
        setup = ReadSetup(ctx, stack, [[]], dataset="readers", keys=keys)
        spans = {k: _direct_span(setup.pth, k) for k in keys}

        def spec(files: list[list], drop: list[str]) -> dict:
            return {"op": "parallel_read", "files": files, "warm": [[setup.pth]], "drop": drop}
        runs = []
        mounts = [("ckptfs", CKPTFS, setup.ck, lambda m, k: ckptfs_path(m, k)),
                  ("plain file (the .pth at each tensor's offset)", PLAIN, None, None),
                  (RAT_DEFAULT, RAT, setup.rats.get(RAT_DEFAULT), lambda m, k: rat_path(m, setup.pth, k))]
        for label, series, m, path_of in mounts:
            for count in (n, 1):
                row = Row(f"{label}: {count} reader{'s' if count > 1 else ''}", is_ckptfs=series == CKPTFS and count > 1,
                          series=series if count > 1 else "")
                res.rows.append(row)
                if series != PLAIN and m is None:
                    row.error = setup.errors.get("ckptfs" if series == CKPTFS else label, "not mounted")
                    continue
                files, drop = [], []
                for k in keys[:count]:
                    off, size = spans[k]
                    if series == PLAIN:
                        files.append([setup.pth, off, size])
                    else:
                        files.append([path_of(m, k), 0, size])
                        drop.append(files[-1][0])
                runs.append((row, _worker_fn(ctx, spec(files, drop)), "bytes_per_s", None))
        repeat(ctx, res, runs)
        many, one = res.rows[0], res.rows[1]
        judge(res, [("ckptfs aggregate / one reader", lambda: many.median / one.median, lambda v: v >= 1.6, "≥ 1.6"),
                    ("ckptfs slowest/fastest reader", lambda: many.extra_median("spread"), lambda v: v <= 2.0,
                     "≤ 2")])
        if res.met is False and ctx.profile and setup.ck is not None:
            files = [[ckptfs_path(setup.ck, k), 0, spans[k][1]] for k in keys]
            res.profile = _profile_daemon(ctx, setup.ck, res.id, spec(files, [f[0] for f in files]))
    return res


def memmap_threads(ctx: Context) -> CaseResult:
    cfg = ctx.cfg
    threads = cfg.memmap_threads
    res = CaseResult("memmap-threads", f"{threads} threads page-faulting one np.memmap'd tensor file",
                     f"throughput of np.memmap over a {cfg.seq_bytes >> 20} MiB float32 tensor summed by {threads} "
                     f"threads at once, each its own slice (page faults from {threads} threads into one mapping); "
                     "the bytes are then compared with the .pth's (a mismatch or a hang fails the run). Fresh: the .pth "
                     "warm, the mounted file's cache dropped; warm: the file read once before", "GB/s", 1e-9, "higher",
                     "no deadlock, no error; ≥ 0.5× the plain file",
                     extra_cols=[("faults", "page faults", 1.0)])
    with ExitStack() as stack:
        setup = ReadSetup(ctx, stack, [["kernel_cache"]])
        off, size = _direct_span(setup.pth, "seq")

        def spec(p: str, offset: int, fresh: bool) -> dict:
            s = {"op": "memmap_threads", "path": p, "offset": offset, "dtype": "<f4", "count": size // 4,
                 "threads": threads, "verify": [setup.pth, off], "warm": [[setup.pth]]}
            if p != setup.pth:
                if fresh:
                    s["drop"] = [p]
                else:
                    s["warm"].append([p])
            return s
        rows = [("ckptfs mount, fresh (checkpoint cached)", CKPTFS, setup.ck, True),
                ("ckptfs mount, warm", "", setup.ck, False),
                ("np.memmap of the .pth at the tensor's offset (cached)", PLAIN, None, False),
                (f"{RAT_KC}, fresh (checkpoint cached)", RAT_KC_SERIES, setup.rats.get(RAT_KC), True)]
        runs = []
        for label, series, m, fresh in rows:
            row = Row(label, is_ckptfs=series == CKPTFS, series=series)
            res.rows.append(row)
            if label.startswith("np.memmap"):
                sp = spec(setup.pth, off, False)
            elif m is None:
                row.error = setup.errors.get("ckptfs" if series == CKPTFS else RAT_KC, "not mounted")
                continue
            else:
                p = ckptfs_path(m, "seq") if m is setup.ck else rat_path(m, setup.pth, "seq")
                sp = spec(p, 0, fresh)
            runs.append((row, (lambda sp=sp: run_worker(ctx, sp, timeout=600)), "bytes_per_s", None))
        repeat(ctx, res, runs)
        plain = res.rows[2]
        judge(res, [("ckptfs runs without error", lambda: 1.0 if res.ckptfs.error is None else 0.0,
                     lambda v: v == 1.0, "all"),
                    ("ckptfs fresh/plain file", lambda: res.ratio(plain), lambda v: v >= 0.5, "≥ 0.5")])
        if res.met is False and ctx.profile and setup.ck is not None:
            res.profile = _profile_daemon(ctx, setup.ck, res.id, spec(ckptfs_path(setup.ck, "seq"), 0, True))
    return res


# --- daemon RSS ---------------------------------------------------------------------------------------------------------


def _read_all(root: str, skip_json: bool) -> int:
    total = 0
    for dirpath, dirnames, files in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".ckptfs"]
        for f in files:
            if skip_json and f.endswith(".json"):
                continue
            p = os.path.join(dirpath, f)
            warm_file(p)
            total += os.path.getsize(p)
    return total


def daemon_rss(ctx: Context) -> CaseResult:
    cfg = ctx.cfg
    res = CaseResult("daemon-rss", "daemon RSS after reading every tensor through the mount",
                     "VmRSS of the FUSE daemon after every tensor file was read once (whole file, 8 MiB reads)",
                     "MB", 1e-6, "lower", "≤ 150 MB, flat in checkpoint size",
                     extra_cols=[("rss_after_mount", "after mount MB", 1e-6), ("hwm", "VmHWM MB", 1e-6),
                                 ("rss_file", "RssFile MB", 1e-6)])
    small, large = ctx.data.get("big"), ctx.data.get("daemon")
    cases = [("ckptfs", small, f"ckptfs, {os.path.getsize(small) / 1e9:.2f} GB file", True),
             ("ckptfs", large, f"ckptfs, {os.path.getsize(large) / 1e9:.2f} GB file", False),
             ("ratarmount", large, f"ratarmount (default), {os.path.getsize(large) / 1e9:.2f} GB file", False)]
    runs = []
    for kind, pth, label, is_ck in cases:
        row = Row(label, is_ckptfs=is_ck)
        res.rows.append(row)

        def fn(kind=kind, pth=pth) -> dict:
            warm_file(pth)
            with mount(ctx, kind, pth, f"rss-{kind}") as m:
                if m.pid is None:
                    raise MeasureError("could not find the daemon's pid")
                st0 = proc_status(m.pid)
                root = m.mnt if kind == "ckptfs" else os.path.join(m.mnt, _zip_root(pth), "data")
                nbytes = _read_all(root, skip_json=kind == "ckptfs")
                st = proc_status(m.pid)
            return {"rss": st["VmRSS"], "hwm": st["VmHWM"], "rss_file": st.get("RssFile", 0),
                    "rss_anon": st.get("RssAnon", 0), "rss_after_mount": st0["VmRSS"], "bytes_read": nbytes}
        runs.append((row, fn, "rss", None))
    repeat(ctx, res, runs, warmup=0, reps=min(3, cfg.reps))
    res.rows[0].is_ckptfs = True
    ck_small, ck_large = res.rows[0], res.rows[1]
    res.notes.append("ratio column: ckptfs on the smaller file against each row; the ckptfs row on the larger file "
                     "is the flatness check")
    judge(res, [("ckptfs MB (largest file)", lambda: ck_large.median / 1e6, lambda v: v <= 150, "≤ 150"),
                ("ckptfs growth MB, small→large file",
                 lambda: (ck_large.median - ck_small.median) / 1e6, lambda v: v <= 25, "≤ 25 (flat)")])
    if res.met is False and ctx.profile:
        res.profile = ("memory: see RssAnon/RssFile of each run in the raw notes; "
                       + "; ".join(f"{r.impl}: anon {r.extra_median('rss_anon') / 1e6:.0f} MB, file "
                                   f"{r.extra_median('rss_file') / 1e6:.0f} MB" for r in res.rows if r.values))
    return res


# --- profiles of the daemon ----------------------------------------------------------------------------------------------


def _profile_daemon(ctx: Context, m: Mount, cid: str, spec: dict) -> str | None:
    """py-spy on the ckptfs daemon while one more run of the case's workload runs."""
    from .profiles import PySpy, summarize_collapsed

    if m.pid is None:
        return "(no profile: daemon pid not found)"
    out = os.path.join(ctx.work, f"profile-{cid}.txt")
    # first without the profiler: where the daemon's time goes (user / kernel CPU) over one run of the workload
    try:
        cpu0, t0 = _cpu_times(m.pid), time.perf_counter()
        r = run_worker(ctx, spec)
        cpu1, wall = _cpu_times(m.pid), time.perf_counter() - t0
        busy = r.get("seconds", wall)
        cpu = (f"daemon CPU over one run of the workload ({busy:.3f} s measured in the reader): user "
               f"{cpu1[0] - cpu0[0]:.2f} s, system {cpu1[1] - cpu0[1]:.2f} s (wall {wall:.2f} s incl. the reader's "
               f"start-up); reader process: user {r.get('ru_utime', 0):.2f} s, system {r.get('ru_stime', 0):.2f} s")
    except Exception as e:  # noqa: BLE001
        cpu = f"(cpu accounting failed: {e})"
    try:
        with PySpy(m.pid, out, native=True):
            t0 = time.perf_counter()
            n = 0
            # repeat the workload so that a short one still yields enough samples
            while n < 2 or time.perf_counter() - t0 < (1.0 if ctx.cfg.quick else 3.0):
                run_worker(ctx, spec)
                n += 1
    except Exception as e:  # noqa: BLE001
        return cpu + f"\n(profiling failed: {e})"
    text = cpu + "\n" + (summarize_collapsed(out, title=f" ({cid}, {n} runs, --native)") or "(no py-spy output)")
    # the reader's side, kernel included (FUSE's page cache and request path live there)
    from .profiles import perf_available, perf_record, perf_summary

    if perf_available():
        data = os.path.join(ctx.work, f"perf-{cid}.data")
        # warm other files (the .pth) here, not in the profiled process: keep its samples to the workload
        pspec = dict(spec)
        for w in spec.get("warm", []):
            if w[0] != spec.get("path"):
                warm_file(*w)
        pspec["warm"] = [w for w in spec.get("warm", []) if w[0] == spec.get("path")]
        nbytes = (spec.get("size") or sum(f[2] for f in spec.get("files", [])) or 4 * spec.get("count", 0)
                  or 4 * math.prod(spec.get("shape") or [1]))
        pspec["repeat"] = min(20, max(3, -(-int(1.5e9) // max(1, nbytes))))
        cmd = [sys.executable, "-m", "benchmarks._worker", json.dumps(pspec)]
        if perf_record(cmd, data, cwd=PKG_PARENT):
            text += "\n" + (perf_summary(data, title=f" ({cid}, the reading process, workload run "
                                               f"{pspec['repeat']} times)") or "(no perf samples)")
    return text


def _cpu_times(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process, all threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


CASES = {
    "mount-ready": mount_ready, "seq-read-cold": partial(_seq_case, state="cold"),
    "seq-read-fresh": partial(_seq_case, state="fresh"), "seq-read-warm": partial(_seq_case, state="warm"),
    "random-4k": random_4k, "readers-8": readers_8, "memmap-threads": memmap_threads,
    "memmap-cold": partial(_memmap_case, cold=True), "memmap-warm": partial(_memmap_case, cold=False),
    "transposed": transposed, "daemon-rss": daemon_rss,
}
