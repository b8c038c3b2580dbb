"""Mounting and unmounting: checks, daemonizing, readiness, stale mounts (the CLI's mount/umount).

``ckptfs mount SRC MNT`` checks everything it can first (checkpoint, mountpoint, /dev/fuse, libfuse,
allow_other), indexes the checkpoint, then forks (before any thread is started) and returns only once
the mount answers, reporting the daemon's error otherwise. ``-f`` serves in the foreground; SIGINT/SIGTERM
unmount cleanly. ``ckptfs umount MNT`` runs ``fusermount -u`` and, for a stale mount (daemon killed) or a
busy one, ``fusermount -uz``, and says which happened.
"""

from __future__ import annotations

import dataclasses
import errno
import gc
import json
import logging
import logging.handlers
import os
import re
import select
import shutil
import stat
import subprocess
import sys
import threading
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

from .._version import __version__
from ..errors import CkptfsError
from ..limits import DEFAULT_LIMITS, Limits, limits_with
from ..source.options import RemoteOptions, with_fields
from ..source.urls import is_url, local_path
from .options import STORAGE_PREFIX, become, merge_storage, split_options

log = logging.getLogger("ckptfs.mount")

READY_TIMEOUT = float(os.environ.get("CKPTFS_READY_TIMEOUT", "30"))
STALE_ERRNOS = (errno.ENOTCONN, errno.ECONNABORTED)
INSTALL_HINT = "install the fuse3 package (Debian/Ubuntu: apt install fuse3; Fedora: dnf install fuse3)"


class MountError(CkptfsError):
    """Why a mount or unmount cannot be done; one line."""


# --- /proc/self/mountinfo -------------------------------------------------------------------------------


class MountEntry(NamedTuple):
    mountpoint: str
    fstype: str
    source: str
    device: str  # major:minor


def _unoctal(s: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), s)


def mount_entry(path: str, mountinfo: str = "/proc/self/mountinfo") -> MountEntry | None:
    """The (topmost) mount whose mount point is ``path`` (works for stale mounts, unlike stat)."""
    path = os.path.realpath(path)
    found = None
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                if len(fields) < 5:
                    continue
                if _unoctal(fields[4]) == path:
                    r = right.split()
                    found = MountEntry(path, r[0] if r else "?", _unoctal(r[1]) if len(r) > 1 else "?", fields[2])
    except OSError:
        return None
    return found


def probe(path: str, timeout: float = 3.0) -> tuple[str, Any]:
    """statvfs() + stat() the path without hanging on a wedged daemon: ("ok", stat) / ("error", errno) /
    ("hung", None). statvfs always reaches a FUSE daemon (stat may be answered from the attribute cache),
    so a dead daemon shows as ENOTCONN."""
    result: list[tuple[str, Any]] = []

    def run() -> None:
        try:
            os.statvfs(path)
            result.append(("ok", os.stat(path)))
        except OSError as e:
            result.append(("error", e.errno))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    return result[0] if result else ("hung", None)


# --- option parsing and checks ----------------------------------------------------------------------------


def parse_options(groups: list[str]) -> dict[str, Any]:
    """``-o a,b=c -o d`` -> {"a": True, "b": "c", "d": True} (a backslash escapes a comma)."""
    out: dict[str, Any] = {}
    for group in groups:
        for opt in re.split(r"(?<!\\),", group):
            opt = opt.replace("\\,", ",").strip()
            if not opt:
                continue
            k, eq, v = opt.partition("=")
            out[k] = v if eq else True
    return out


def check_checkpoint(path: str) -> None:
    """The checkpoint (a file, or a directory of checkpoint files) exists and can be read."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise MountError(e.strerror or str(e), file=path) from None
    try:
        if stat.S_ISDIR(os.fstat(fd).st_mode) and not os.access(path, os.R_OK | os.X_OK):
            raise MountError("the directory cannot be listed (permission denied)", file=path)
    finally:
        os.close(fd)


def check_mountpoint(mnt: str, *, nonempty: bool = False) -> None:
    kind, st = probe(mnt)
    if kind == "hung":
        raise MountError("the mountpoint does not answer (a hung FUSE daemon?): run `ckptfs umount "
                         f"{mnt}`", file=mnt)
    if kind == "error":
        if st in STALE_ERRNOS:
            raise MountError(f"stale mount (Transport endpoint is not connected; its daemon died): run "
                             f"`ckptfs umount {mnt}` first", file=mnt)
        if st == errno.ENOENT:
            raise MountError("mountpoint does not exist (create it with mkdir)", file=mnt)
        raise MountError(os.strerror(st), file=mnt)
    if not stat.S_ISDIR(st.st_mode):
        raise MountError("mountpoint is not a directory", file=mnt)
    entry = mount_entry(mnt)
    if entry is not None:
        raise MountError(f"already mounted ({entry.fstype} from {entry.source}): run `ckptfs umount {mnt}` "
                         "first", file=mnt)
    if not nonempty and os.listdir(mnt):
        raise MountError("mountpoint is not empty (mount on an empty directory, or pass -o nonempty)", file=mnt)
    if os.geteuid() != 0 and not os.access(mnt, os.W_OK):
        raise MountError("no write permission on the mountpoint (fusermount requires it)", file=mnt)


def user_allow_other(conf: str = "/etc/fuse.conf") -> bool:
    try:
        with open(conf) as f:
            return any(line.split("#", 1)[0].strip() == "user_allow_other" for line in f)
    except OSError:
        return False


def check_fuse(options: dict[str, Any], *, device: str = "/dev/fuse", euid: int | None = None,
               conf: str = "/etc/fuse.conf") -> Any:
    """/dev/fuse, libfuse, fusermount (non-root) and allow_other: the binding module, or MountError."""
    from .fuse_ops import FuseUnavailable, fuse_major, load_fuse

    euid = os.geteuid() if euid is None else euid
    if not os.path.exists(device):
        raise MountError(f"FUSE is not available: {device} is missing (load the module: sudo modprobe fuse; "
                         "in a container: --device /dev/fuse --cap-add SYS_ADMIN)")
    if not os.access(device, os.R_OK | os.W_OK):
        if euid == 0:
            raise MountError(f"FUSE is not available: cannot open {device} (permission denied)")
        mode = stat.S_IMODE(os.stat(device).st_mode)
        raise MountError(f"{device} has mode {mode:04o}: only root can use FUSE here (a standard system opens it to "
                         f"every user, mode 0666, by udev's rule): as root, chmod 0666 {device}; or mount as root")
    try:
        fuse = load_fuse()
    except FuseUnavailable as e:
        raise MountError(str(e)) from None
    if euid != 0:
        tool = "fusermount3" if fuse_major(fuse) == 3 else "fusermount"
        if shutil.which(tool) is None and not os.path.exists(f"/usr/bin/{tool}"):
            raise MountError(f"{tool} is missing (non-root mounts need it): {INSTALL_HINT}")
        for opt in ("allow_other", "allow_root"):
            if options.get(opt) and not user_allow_other(conf):
                raise MountError(f"-o {opt} needs a line 'user_allow_other' in {conf} (add it as root), or "
                                 "mount as root")
    return fuse


def _fsname(path: str) -> str:
    return path if re.fullmatch(r"[^,\s\\]+", path) else "ckptfs"


# --- logging ------------------------------------------------------------------------------------------------


def _setup_logging(debug: bool, logfile: str | None, foreground: bool) -> None:
    handlers: list[logging.Handler] = []
    fmt = logging.Formatter("ckptfs[%(process)d]: %(levelname)s %(message)s")
    if logfile:
        handlers.append(logging.FileHandler(logfile))
    elif foreground:
        handlers.append(logging.StreamHandler(sys.stderr))
    elif os.path.exists("/dev/log"):
        try:
            syslog = logging.handlers.SysLogHandler("/dev/log")
            syslog.ident = "ckptfs: "
            handlers.append(syslog)
        except OSError:
            pass
    for h in handlers:
        h.setFormatter(fmt)
    level = logging.DEBUG if debug else logging.INFO
    for name in ("ckptfs", "fuse"):
        lg = logging.getLogger(name)
        lg.handlers[:] = handlers or [logging.NullHandler()]
        lg.setLevel(level if name == "ckptfs" else (logging.DEBUG if debug else logging.WARNING))
        lg.propagate = False


# --- mount ----------------------------------------------------------------------------------------------------


@dataclass
class MountRequest:
    """What ``ckptfs mount`` was asked to do."""

    checkpoint: str
    mountpoint: str
    options: dict[str, Any] = field(default_factory=dict)  # -o options, parsed (parse_options)
    foreground: bool = False
    debug: bool = False  # log every FUSE call (implies foreground unless there is a log file)
    strict: bool = False
    threads: bool = False
    log: str | None = None
    storage_options: dict[str, Any] | None = None  # a URL's backend options (credentials: never shown)
    remote: RemoteOptions | None = None  # how a URL is read (timeout, caches)
    limits: Limits = DEFAULT_LIMITS  # resource limits for indexing (-o limit.NAME=VALUE apply over them)
    view: str = "tree"  # VIEWS: "tree" (keys as files), "safetensors" (the checkpoint as safetensors files)
    #: a context manager factory around indexing (the CLI shows what takes time on a terminal)
    indexing: Callable[[str], AbstractContextManager[object]] | None = None


#: ``--view`` choices; ``-o`` options that belong to a view (not passed to FUSE)
VIEWS = ("tree", "safetensors")
VIEW_OPTIONS = {"npy": "tree"}


def warnings_for(options: dict[str, Any]) -> list[str]:
    """Options that work but that users rarely want, with why."""
    out = []
    if options.get("direct_io"):
        out.append("-o direct_io makes np.memmap on the mount fail (ENODEV) and disables the page cache")
    return out


def mount(req: MountRequest) -> None:
    """Mount ``req.checkpoint`` at ``req.mountpoint``: in the foreground until unmounted, or as a daemon,
    returning once the mount answers. Raises MountError (or any CkptfsError of indexing) with why not."""
    remote = is_url(req.checkpoint)
    src = req.checkpoint if remote else os.path.abspath(local_path(req.checkpoint))
    mnt = os.path.realpath(req.mountpoint)
    debug = req.debug
    try:
        opts = split_options(req.options)
    except CkptfsError as e:
        raise MountError(e.reason) from None
    if opts.setuid:  # as mount.fuse3's setuid=USER: the user owns the mount (and reads the checkpoint)
        become(opts.setuid)
    if opts.limits:
        try:
            req = dataclasses.replace(req, limits=limits_with(opts.limits, "-o limit.", base=req.limits))
        except ValueError as e:
            raise MountError(str(e)) from None
    if opts.remote or opts.storage:  # -o timeout=, storage.KEY=... (an /etc/fstab line has nothing else)
        if not remote:
            given = sorted([*opts.remote, *(STORAGE_PREFIX + k for k in opts.storage)])
            raise MountError(f"-o {', '.join(given)}: options of remote checkpoints (URLs), not of a local file")
        storage = merge_storage(req.storage_options, opts.storage)
        req = dataclasses.replace(req, storage_options=storage or None,
                                  remote=with_fields(req.remote, opts.remote))
    options = opts.fuse
    log_option = req.log or opts.log
    foreground = bool(req.foreground or debug and not log_option)
    if req.view not in VIEWS:
        raise MountError(f"--view {req.view!r}: expected one of {', '.join(VIEWS)}")
    view_options = {k: options.pop(k) for k in list(options) if k in VIEW_OPTIONS}
    for k in view_options:
        if VIEW_OPTIONS[k] != req.view:
            raise MountError(f"-o {k} applies to --view {VIEW_OPTIONS[k]}, not --view {req.view}")
    if not remote:
        check_checkpoint(src)
    check_mountpoint(mnt, nonempty=bool(options.get("nonempty")))
    fuse = check_fuse(options)

    with req.indexing(src) if req.indexing is not None else nullcontext():
        view, catalog = _make_view(req, src, view_options, strict=req.strict or opts.strict)
    src = catalog.name  # a URL without its credentials: what the log, mount.json and /proc/mounts show
    # a read waiting on the network must not hold up every other request: a URL is always served by threads
    threads = req.threads or opts.threads or remote
    logfile = os.path.abspath(log_option) if log_option else None

    def run() -> None:
        from .fuse_ops import Operations, library_version, serve, splice_wanted

        _setup_logging(debug, logfile, foreground)
        fuse_opts = dict(options)
        # reads answered by splicing the checkpoint's pages; a URL's bytes are in memory, and libfuse would copy a
        # memory reply into its pipe before splicing it (a copy more than writev: remote-seq, docs/remote.md)
        splice = splice_wanted(fuse, fuse_opts) and not remote
        info: dict[str, Any] = {"pid": os.getpid(), "checkpoint": src, "mountpoint": mnt,
                                "libfuse": library_version(fuse), "threads": threads, "splice": splice,
                                "options": {k: "***" if k.startswith(STORAGE_PREFIX) else v for k, v in req.options.items()},
                                "view": req.view, "ckptfs": __version__}
        if remote:  # how it is read; of the storage options only their names (values may be credentials)
            info["remote"] = dataclasses.asdict(req.remote or RemoteOptions())
            info["storage_options"] = sorted(req.storage_options or {})
        view.add_info_file("mount.json", (json.dumps(info, indent=2) + "\n").encode())
        ops = Operations(view, fuse, mountpoint=mnt, uid=opts.uid, gid=opts.gid, umask=opts.umask)
        ops.max_read = int(options.get("max_read", 0) or 0)
        if not foreground:
            ops.on_ready.append(_detach_stderr(logfile))
        log.info("mounting %s at %s (libfuse %s, %s)", src, mnt, library_version(fuse),
                 "multi-threaded" if threads else "single-threaded")
        try:
            serve(view, mnt, fuse, threads=threads, debug=debug, fsname=_fsname(src), options=fuse_opts, ops=ops,
                  splice=splice)
        except RuntimeError as e:  # fuse_main's status: libfuse printed why on stderr
            if not ops.ready.is_set():
                raise MountError(f"mount failed (libfuse status {e})", file=mnt) from None
            # libfuse3 ends its loop with status 8 when a signal stopped it; it has unmounted either way
            log.info("the FUSE loop ended with libfuse status %s", e)
        log.info("unmounted %s (%d read errors)", mnt, ops.errors)

    if foreground:
        run()
        catalog.close()
        return
    _daemonize(run, mnt, remote)


def _make_view(req: MountRequest, src: str, view_options: dict[str, Any], *, strict: bool) -> tuple[Any, Any]:
    """(mount source, catalog) of the view asked for."""
    verify = os.environ.get("CKPTFS_VERIFY_READS", "1") != "0"
    if req.view == "safetensors":
        from ..views.model_dir import open_model
        from ..views.safetensors_tree import SafetensorsTree

        model = open_model(src, strict=strict, limits=req.limits, storage_options=req.storage_options,
                           remote=req.remote)
        try:
            return SafetensorsTree(model, verify_reads=verify), model.catalog
        except BaseException:
            model.close()
            raise
    from ..model.opener import open_catalog
    from ..views.tree import TreeView

    catalog = open_catalog(src, strict=strict, limits=req.limits, storage_options=req.storage_options,
                           remote=req.remote)
    return TreeView(catalog, verify_reads=verify, npy=bool(view_options.get("npy"))), catalog


def _detach_stderr(logfile: str | None) -> Any:
    """Once the mount answers, the daemon's stderr (the pipe the parent reads) goes to the log file or
    /dev/null: the parent sees EOF and checks that the mount answers."""

    def detach() -> None:
        fd = os.open(logfile, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if logfile else \
            os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 2)
        os.close(fd)

    return detach


def _daemonize(run: Any, mnt: str, remote: bool) -> None:
    before = os.stat(mnt).st_dev
    sys.stdout.flush()
    sys.stderr.flush()
    r, w = os.pipe()
    handover: AbstractContextManager[None] = nullcontext()
    if remote:
        from ..source.remote import handing_over

        handover = handing_over()  # the daemon takes over the connections the indexing opened
    # the index's objects go to the collector's permanent generation first: the daemon never walks them
    # (a walk writes to every object: with a million keys, seconds of copy-on-write faults before the mount answered)
    gc.freeze()
    with handover:
        pid = os.fork()
    if pid == 0:  # the daemon: no thread has been started in this process
        code = 1
        try:
            os.close(r)
            os.setsid()
            os.chdir("/")
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(null, 1)
            os.dup2(w, 2)  # libfuse's and our startup errors reach the parent
            os.close(null)
            os.close(w)
            run()
            code = 0
        except CkptfsError as e:
            os.write(2, f"{e}\n".encode(errors="replace"))
        except BaseException as e:  # noqa: BLE001 - report, never return into the parent's code
            os.write(2, f"{type(e).__name__}: {e}\n".encode(errors="replace"))
        finally:
            os._exit(code)
    os.close(w)
    _wait_ready(pid, r, mnt, before)


def _wait_ready(pid: int, r: int, mnt: str, before_dev: int) -> None:
    """Wait for the daemon's stderr pipe to close (mounted, or failed), then for the mount to answer."""
    deadline = time.monotonic() + READY_TIMEOUT
    chunks: list[bytes] = []
    eof = False
    while time.monotonic() < deadline:
        if not eof:
            ready, _, _ = select.select([r], [], [], 0.05)
            if ready:
                data = os.read(r, 65536)
                if data:
                    chunks.append(data)
                    continue
                eof = True
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            os.close(r)
            raise _failure(b"".join(chunks), status)
        if eof:
            kind, st = probe(mnt, timeout=max(0.1, deadline - time.monotonic()))
            if kind == "ok" and st.st_dev != before_dev:
                os.close(r)
                return
            time.sleep(0.01)
    os.close(r)
    raise MountError(f"the daemon (pid {pid}) did not make the mount answer within {READY_TIMEOUT:.0f} s; "
                     f"`ckptfs umount {mnt}` clears it", file=mnt)


def _failure(output: bytes, status: int) -> MountError:
    """The daemon died before the mount answered: what it said (libfuse's and ckptfs's errors), one line."""
    text = output.decode(errors="replace")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    msg = "; ".join(dict.fromkeys(lines)) or f"the daemon exited with status {os.waitstatus_to_exitcode(status)}"
    if "user_allow_other" in msg:
        msg += " (add a line 'user_allow_other' to /etc/fuse.conf as root)"
    if msg.startswith("ckptfs: "):
        msg = msg[len("ckptfs: "):]
    return MountError(msg)


# --- umount ---------------------------------------------------------------------------------------------------


def _fusermount() -> str | None:
    for tool in ("fusermount3", "fusermount"):
        path = shutil.which(tool)
        if path:
            return path
    return None


def _run(cmd: list[str]) -> tuple[int, str]:
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    return p.returncode, " ".join((p.stderr or p.stdout).split())


def _umount2(path: str, lazy: bool) -> tuple[int, str]:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(os.fsencode(path), 2 if lazy else 0) == 0:
        return 0, ""
    e = ctypes.get_errno()
    return e, os.strerror(e)


def _daemon_pid(mnt: str) -> int | None:
    """The daemon's pid from /.ckptfs/mount.json (read with a timeout: never hang on a wedged daemon)."""
    out: list[int] = []

    def read() -> None:
        try:
            with open(os.path.join(mnt, ".ckptfs", "mount.json")) as f:
                out.append(int(json.load(f)["pid"]))
        except (OSError, ValueError, KeyError, TypeError):
            pass

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(2.0)
    return out[0] if out else None


def _wait_exit(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        try:  # our own child (tests, -f runs in-process) must be reaped to disappear
            if os.waitpid(pid, os.WNOHANG)[0]:
                return True
        except ChildProcessError:
            pass
        time.sleep(0.02)
    return False


def umount(mountpoint: str) -> str:
    """Unmount (clearing a stale or busy mount lazily); returns what was done, one line. Raises MountError."""
    mnt = os.path.realpath(mountpoint)
    entry = mount_entry(mnt)
    if entry is None:
        kind, err = probe(mnt)
        if kind == "error" and err == errno.ENOENT:
            raise MountError("no such directory", file=mnt)
        raise MountError("not mounted", file=mnt)
    if not entry.fstype.startswith("fuse"):
        raise MountError(f"is a {entry.fstype} mount, not a FUSE mount (use umount)", file=mnt)
    kind, err = probe(mnt)
    stale = kind == "error" and err in STALE_ERRNOS
    pid = _daemon_pid(mnt) if kind == "ok" and entry.fstype == "fuse.ckptfs" else None
    tool = _fusermount()
    if tool:
        rc, msg = _run([tool, "-u", mnt])
    elif os.geteuid() == 0:
        rc, msg = _umount2(mnt, lazy=False)
    else:
        raise MountError(f"fusermount3 is missing: {INSTALL_HINT}", file=mnt)
    if rc == 0 and mount_entry(mnt) is None:
        if stale:
            return f"{mnt}: cleared a stale mount (its daemon had died)"
        gone = pid is None or _wait_exit(pid, 10.0)
        return f"{mnt}: unmounted" + ("" if gone else f" (daemon pid {pid} is still exiting)")
    busy = "busy" in msg.lower()
    if stale or busy or kind == "hung":
        rc2, msg2 = _run([tool, "-uz", mnt]) if tool else _umount2(mnt, lazy=True)
        if rc2 == 0:
            why = "stale" if stale else ("hung" if kind == "hung" else "busy")
            return f"{mnt}: lazily detached ({why}: {msg or 'unmount failed'}); it disappears once nothing uses it"
        msg = msg2 or msg
    raise MountError(f"unmount failed: {msg or f'exit status {rc}'}", file=mnt)
