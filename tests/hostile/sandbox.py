"""Run ckptfs on a hostile file in a jailed child process and report what happened.

A long-lived *server* process (``python sandbox.py --serve``, started once per test session) imports
ckptfs, numpy and everything they use, then forks one child per request. The child, before it touches
the file:

- caps its address space (RLIMIT_AS) and CPU time,
- redirects stdout/stderr to files,
- installs an audit hook (``sys.addaudithook``) that ends the process at once (exit 99, the event
  written to a violations file: an exception could be swallowed by the code under test) on any import
  of a module not already loaded, exec/compile, process creation (system, exec*, spawn, Popen), a
  pickle's own ``find_class`` (``pickle.find_class``: a global resolved the real way), ctypes,
  sockets, file system writes, or an ``open`` of anything but the checkpoint and /proc/self.

The server waits for the child and returns exit status, signal, elapsed time, CPU time and peak RSS
(``wait4``). A request's ``timeout`` is a budget of CPU seconds (what the work costs, whatever else the
machine runs: a run over it has timed out); a child still running after ``hang_after`` wall-clock seconds
(default 4 x timeout) is a hang: SIGKILLed, timed out too. The test process (which has torch loaded) never parses
a hostile file itself.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

VIOLATION_EXIT = 99

# Audit events that must never happen while ckptfs reads a file (prefix match).
BANNED = (
    "exec", "compile", "import", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.startfile",
    "subprocess.Popen", "pty.spawn", "pickle.find_class", "ctypes.", "socket.", "os.kill", "os.killpg",
    "os.remove", "os.unlink", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.symlink",
    "os.link", "os.truncate", "os.putenv", "os.unsetenv", "os.chdir", "shutil.", "urllib.", "webbrowser.",
    "code.__new__", "function.__new__", "marshal.load", "builtins.input", "cpython.run_", "sys.settrace",
    "sys.setprofile", "sys.addaudithook", "winreg.", "glob.glob", "os.listdir", "os.scandir", "os.walk",
)
#: Modules imported before the hook is installed (everything ckptfs uses when indexing / listing).
PREIMPORT = (
    "ckptfs", "ckptfs.cli", "ckptfs.cli.inspect", "ckptfs.api.checkpoint", "ckptfs.api.slicing",
    "ckptfs.model.catalog", "ckptfs.container.legacy", "ckptfs.container.zip", "ckptfs.container.torchzip",
    "ckptfs.model.meta", "ckptfs.model.slicing", "ckptfs.model.reader", "ckptfs.model.tensors",
    "numpy", "ml_dtypes", "json", "reprlib", "select", "resource", "hashlib", "encodings.cp437",
    "encodings.latin_1", "encodings.ascii", "encodings.utf_8", "fnmatch", "argparse", "zlib", "mmap",
    "ckptfs.views.namespace", "ckptfs.views.tree", "traceback", "linecache", "tokenize",
    "shutil",  # argparse's help formatter imports it lazily (terminal width); preloaded only under some venvs
)


def _preimport() -> list[str]:
    import importlib

    missing = []
    for m in PREIMPORT:
        try:
            importlib.import_module(m)
        except ImportError:
            missing.append(m)
    return missing


# --- in the child ------------------------------------------------------------------------------------------


_DUMPING = []  # set while a traceback is printed (its source lines are read from .py files)


def _install_limits(req: dict) -> None:
    import resource

    mem = int(req.get("mem", 1 << 30))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard == resource.RLIM_INFINITY or hard > mem:
        resource.setrlimit(resource.RLIMIT_AS, (mem, hard if hard != resource.RLIM_INFINITY else mem))
    cpu = int(req.get("timeout", 5.0)) + 5
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))


def _install_jail(req: dict, vfd: int) -> None:
    _install_limits(req)
    allowed_open = {os.path.realpath(req["path"]), req["path"]}

    def hook(event: str, args: tuple) -> None:
        if _DUMPING and event in ("open", "compile", "import"):
            return  # printing a traceback (the test fails on it anyway) reads and parses source
        bad = None
        if event == "open":
            p = args[0]
            if isinstance(p, (str, bytes)) and not isinstance(p, int):
                p = os.fsdecode(p)
                if p not in allowed_open and not p.startswith("/proc/") and p != "/dev/null" \
                        and os.path.realpath(p) not in allowed_open and not (_DUMPING and p.endswith(".py")):
                    bad = f"open {p!r}"
        elif event == "os.kill" and _is_my_child(args[0]):
            pass  # ckptfs ends its own unpickling probe (a forked child) when it overruns
        elif event.startswith(BANNED):
            bad = f"{event} {str(args)[:300]}"
        if bad is not None:
            os.write(vfd, (bad + "\n").encode("utf-8", "backslashreplace"))
            os._exit(VIOLATION_EXIT)

    sys.addaudithook(hook)


def _is_my_child(pid: object) -> bool:
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:  # type: ignore[call-overload]
            stat = f.read()
        return int(stat.rsplit(b")", 1)[1].split()[1]) == os.getpid()
    except (OSError, ValueError, IndexError):
        return False


def _limits(req: dict):  # -> ckptfs.Limits
    from ckptfs import Limits

    return Limits(**req["limits"]) if req.get("limits") else Limits()


def _task_api(req: dict) -> dict:
    """Open, list, describe and read every tensor (ranges of big ones); everything a user would do."""
    import hashlib

    import ckptfs

    path = req["path"]
    out: dict = {"ok": False}
    try:
        ck = ckptfs.open(path, limits=_limits(req), strict=bool(req.get("strict")))
    except ckptfs.CkptfsError as e:
        out.update(error=str(e), type=type(e).__name__, file=e.file, record=e.record)
        return out
    with ck:
        out["ok"] = True
        keys = ck.keys()
        out["keys"] = keys[:2000]
        out["n_keys"] = len(keys)
        out["all_keys"] = ck.index.keys[:5000]
        info = ck.info()
        json.dumps(info, ensure_ascii=False)
        out["info"] = {k: info[k] for k in ("tensors", "errors", "unsupported", "format", "byteorder")}
        out["unknown_globals"] = sorted(info["unknown_globals"])[:50]
        tensors: dict = {}
        index = ck.index
        max_read = int(req.get("max_read", 1 << 30))
        for n, i in enumerate(index.order()):
            m = ck.meta(index.keys[i]) if index.kinds[i] != "link" else None
            if m is None:
                continue
            d = m.to_dict()
            json.dumps(d, ensure_ascii=False)
            if index.kinds[i] != "tensor" or len(tensors) >= max_read:
                continue
            key = index.keys[i]
            rec: dict = {"nbytes": d.get("nbytes"), "dtype": d.get("dtype"), "shape": d.get("shape"),
                         "byteorder": d.get("byteorder")}
            try:
                r = ck.reader(key)
                size = r.size
                if size <= (32 << 20):
                    data = ck.read(key)
                    if len(data) != size:
                        raise AssertionError(f"{key}: read {len(data)} bytes, size {size}")
                    rec["sha256"] = hashlib.sha256(data).hexdigest()
                    try:
                        arr = ck.numpy(key)
                    except ckptfs.UnsupportedError:
                        pass
                    else:
                        if arr.tobytes() != data:
                            raise AssertionError(f"{key}: numpy() bytes differ from read()")
                    # a few ranged reads must agree with the whole
                    for off, ln in ((0, 7), (size // 3, 13), (max(0, size - 5), 9)):
                        part = ck.read(key, off, ln)
                        if part != data[off:off + ln]:
                            raise AssertionError(f"{key}: read({off}, {ln}) disagrees with the whole")
                else:  # huge (e.g. expanded) tensors: ranges only
                    for off in (0, size // 2, max(0, size - (1 << 20))):
                        part = ck.read(key, off, 1 << 20)
                        if len(part) != min(1 << 20, size - off):
                            raise AssertionError(f"{key}: short ranged read")
                    rec["sampled"] = True
                    for whole in (lambda: ck.read(key), lambda: ck.numpy(key)):  # all at once: fits or a clean error
                        try:
                            whole()
                        except ckptfs.CkptfsError as e:
                            rec["whole_error"] = str(e)
            except ckptfs.CkptfsError as e:
                rec["error"] = str(e)
                rec["error_type"] = type(e).__name__
            tensors[key] = rec
        out["tensors"] = tensors
    return out


def _task_torch(req: dict) -> dict:
    """What torch.load(weights_only=True) does with the file: refuses (how), or the bytes of every tensor
    it returns, flattened to dotted keys like ckptfs's (sha256 of the C-contiguous bytes in both orders),
    and the byte order torch read the file's storages in."""
    import hashlib

    import torch

    sys.path.insert(0, str(REPO / "tests"))
    from helpers import torch_bytes, torch_load_byteorder

    try:
        obj = torch.load(req["path"], weights_only=True, map_location="cpu", mmap=bool(req.get("mmap")))
    except MemoryError:
        return {"status": "memory"}
    except Exception as e:  # noqa: BLE001 - how torch refuses is the point
        return {"status": "refused", "error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}
    tensors: dict = {}
    stack: list = [("", obj)]
    seen = 0
    while stack and seen < 5000:
        key, v = stack.pop()
        seen += 1
        if isinstance(v, torch.Tensor):
            try:
                if v.is_sparse or v.is_nested or v.is_quantized or v.device.type != "cpu":
                    continue
                tensors[key] = {order: hashlib.sha256(torch_bytes(v, order)).hexdigest() for order in ("little", "big")}
            except Exception as e:  # noqa: BLE001
                tensors[key] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        elif isinstance(v, dict):
            stack.extend((f"{key}.{k}" if key else str(k), x) for k, x in v.items() if type(k) in (str, int))
        elif isinstance(v, (list, tuple)):
            stack.extend((f"{key}.{i}" if key else str(i), x) for i, x in enumerate(v))
    return {"status": "accepted", "tensors": tensors, "byteorder": torch_load_byteorder(req["path"])}


def _task_cli(req: dict) -> int:
    from ckptfs.cli import main

    return main(list(req["argv"]))


def _child(req: dict, vfd: int) -> None:
    code = 0
    try:
        out_fd = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        err_fd = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        res_fd = os.open(req["result"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        if req["task"] == "torch":
            _install_limits(req)  # torch imports lazily: no audit hook, only limits and marker files
        else:
            _install_jail(req, vfd)
        t0 = time.perf_counter()
        if req["task"] in ("api", "torch"):
            res = _task_api(req) if req["task"] == "api" else _task_torch(req)
            res["seconds"] = time.perf_counter() - t0
            import resource

            res["children_maxrss_kb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            os.write(res_fd, json.dumps(res, ensure_ascii=True).encode())
        else:
            code = _task_cli(req)
        sys.stdout.flush()
        sys.stderr.flush()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # a traceback on stderr: the test fails on it
        import traceback

        _DUMPING.append(True)
        traceback.print_exc()
        sys.stderr.flush()
        code = 70
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001
            pass
        os._exit(code)


def serve(with_torch: bool = False) -> None:
    """Read one JSON request per line on stdin; answer one JSON line per request on stdout."""
    missing = _preimport()
    if with_torch:
        import torch

        torch.set_num_threads(1)
        sys.path.insert(0, str(REPO / "tests"))
        import helpers  # noqa: F401
    out = sys.stdout
    out.write(json.dumps({"ready": True, "missing": missing}) + "\n")
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        vr, vw = os.pipe()
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:
            os.close(vr)
            _child(req, vw)
        os.close(vw)
        timeout = float(req.get("timeout", 5.0))
        hang_after = float(req.get("hang_after") or 4 * timeout)
        timed_out = False
        status = rusage = None
        while True:
            wpid, st, ru = os.wait4(pid, os.WNOHANG)
            if wpid:
                status, rusage = st, ru
                break
            if time.monotonic() - t0 > hang_after:
                timed_out = True
                os.kill(pid, signal.SIGKILL)
                _, status, rusage = os.wait4(pid, 0)
                break
            time.sleep(0.002)
        elapsed = time.monotonic() - t0
        cpu = rusage.ru_utime + rusage.ru_stime if rusage else 0.0  # the child's and its reaped children's
        timed_out = timed_out or cpu > timeout
        violations = b""
        while True:
            r, _, _ = select.select([vr], [], [], 0)
            if not r:
                break
            chunk = os.read(vr, 65536)
            if not chunk:
                break
            violations += chunk
        os.close(vr)
        rep = {
            "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
            "timed_out": timed_out,
            "elapsed": elapsed,
            "cpu": cpu,
            "maxrss_kb": rusage.ru_maxrss if rusage else None,
            "violations": violations.decode("utf-8", "backslashreplace"),
        }
        out.write(json.dumps(rep) + "\n")
        out.flush()


# --- in the test process --------------------------------------------------------------------------------------


@dataclass
class Run:
    exit: int | None
    signal: int | None
    timed_out: bool
    elapsed: float
    cpu: float
    maxrss_kb: int | None
    violations: str
    stdout: str
    stderr: str
    result: dict | None

    def describe(self) -> str:
        return (f"exit={self.exit} signal={self.signal} timed_out={self.timed_out} elapsed={self.elapsed:.2f}s "
                f"cpu={self.cpu:.2f}s "
                f"maxrss={self.maxrss_kb} KiB violations={self.violations!r}\nstderr: {self.stderr[-2000:]}\n"
                f"stdout: {self.stdout[-1000:]}")


class Sandbox:
    def __init__(self, workdir: Path, torch: bool = False) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONHASHSEED="0",
                   PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        argv = [sys.executable, str(Path(__file__)), "--serve"] + (["--torch"] if torch else [])
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, text=True, bufsize=1)
        hello = json.loads(self.proc.stdout.readline())  # type: ignore[union-attr]
        if not hello.get("ready"):
            raise RuntimeError("sandbox server did not start")
        self.missing = hello["missing"]
        self.n = 0

    def run(self, task: str, path: Path | str, *, argv: list[str] | None = None, limits: dict | None = None,
            strict: bool = False, timeout: float = 5.0, mem: int = 1 << 30, max_read: int | None = None,
            mmap: bool = False, hang_after: float | None = None) -> Run:
        self.n += 1
        base = self.workdir / f"run{self.n}"
        req = {"task": task, "path": str(path), "argv": argv or [], "limits": limits, "strict": strict,
               "timeout": timeout, "mem": mem, "stdout": f"{base}.out", "stderr": f"{base}.err",
               "result": f"{base}.json", "mmap": mmap,
               "hang_after": hang_after}
        if max_read is not None:
            req["max_read"] = max_read
        self.proc.stdin.write(json.dumps(req) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        rep = json.loads(self.proc.stdout.readline())  # type: ignore[union-attr]
        out = Path(req["stdout"]).read_text("utf-8", "backslashreplace") if Path(req["stdout"]).exists() else ""
        err = Path(req["stderr"]).read_text("utf-8", "backslashreplace") if Path(req["stderr"]).exists() else ""
        res = None
        rp = Path(req["result"])
        if rp.exists() and rp.stat().st_size:
            res = json.loads(rp.read_text())
        for suffix in (".out", ".err", ".json"):
            Path(f"{base}{suffix}").unlink(missing_ok=True)
        return Run(rep["exit"], rep["signal"], rep["timed_out"], rep["elapsed"], rep["cpu"], rep["maxrss_kb"],
                   rep["violations"], out, err, res)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # type: ignore[union-attr]
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        sys.path.insert(0, str(REPO))
        serve(with_torch="--torch" in sys.argv)
