"""Fixtures that change the machine for a test and always put it back: real users (useradd / userdel), the
mount(8) helper in /sbin, ``ckptfs`` in /usr/local/bin, /etc/fuse.conf, /etc/fstab and /dev/fuse's mode (0666
for users' mounts, or 0600 to see the error a closed /dev/fuse gives).

They need root (or passwordless sudo); without it they skip, or fail when CKPTFS_CI is set. Every change
is made under one lock file, held for a whole test module, so that several test runs on one machine never
interleave their edits of the same system file. Processes of the users made here are ended by pid (read
from /proc), their mounts unmounted, and the users deleted in ``finally`` blocks.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest
from helpers import require_fuse

LOCK = "/tmp/ckptfs-tests-system.lock"
HELPER = "/sbin/mount.fuse.ckptfs"  # where mount(8) looks for the fuse.ckptfs helper (/sbin: /usr/sbin if merged)
ON_PATH = "/usr/local/bin/ckptfs"  # where mount.fuse3's /bin/sh finds `ckptfs` (mount(8) resets PATH)
CHECKOUT = Path(__file__).resolve().parents[1]


def unavailable(reason: str) -> None:
    """Skip the test, or fail it in CI (CKPTFS_CI set): there, everything these tests need is installed
    (.ci/run) and they must really run."""
    if os.environ.get("CKPTFS_CI"):
        pytest.fail(f"CKPTFS_CI is set but this test cannot run here: {reason}")
    pytest.skip(reason)


_unavailable = unavailable


def privileged_prefix() -> list[str]:
    """[] as root, ["sudo", "-n"] with passwordless sudo; skips (fails in CI) otherwise."""
    if os.geteuid() == 0:
        return []
    if shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0:
        return ["sudo", "-n"]
    _unavailable("needs root or passwordless sudo (users, /etc/fuse.conf, /etc/fstab, /sbin)")
    return []


@dataclass
class System:
    """Privileged commands and file edits, each undone by the fixture that made it."""

    priv: list[str]
    base: Path  # a directory every user can traverse (checkpoints and mountpoints live here)
    undo: list = field(default_factory=list)

    def run(self, *argv: str, check: bool = True, input: str | None = None, timeout: float = 120
            ) -> subprocess.CompletedProcess:
        r = subprocess.run([*self.priv, *argv], capture_output=True, text=True, input=input, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")
        return r

    def write(self, path: str, text: str, mode: int = 0o644) -> None:
        self.run("tee", path, input=text)
        self.run("chmod", f"{mode:o}", path)

    def read(self, path: str) -> str | None:
        r = self.run("cat", path, check=False)
        return r.stdout if r.returncode == 0 else None

    @contextmanager
    def replaced(self, path: str, text: str | None, mode: int = 0o644) -> Iterator[None]:
        """``path`` holds ``text`` (or is absent, for None) inside the block, and what it was afterwards."""
        before = self.read(path)
        link = os.readlink(path) if os.path.islink(path) else None
        try:
            if link is not None or before is not None:
                self.run("rm", "-f", path)
            if text is not None:
                self.write(path, text, mode)
            yield
        finally:
            self.run("rm", "-f", path, check=False)
            if link is not None:
                self.run("ln", "-s", link, path)
            elif before is not None:
                self.write(path, before, mode)

    @contextmanager
    def symlinked(self, path: str, target: str) -> Iterator[None]:
        link = os.readlink(path) if os.path.islink(path) else None
        before = self.read(path) if link is None else None
        try:
            self.run("rm", "-f", path)
            self.run("ln", "-s", target, path)
            yield
        finally:
            self.run("rm", "-f", path, check=False)
            if link is not None:
                self.run("ln", "-s", link, path)
            elif before is not None:
                self.write(path, before, 0o755)


@dataclass
class User:
    name: str
    uid: int
    gid: int
    system: System
    python: str = ""  # an interpreter this user can run
    pythonpath: list[str] = field(default_factory=list)  # where it finds ckptfs (this checkout), numpy, mfusepy

    def env(self, **extra: str) -> list[str]:
        values = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/", "LANG": "C.UTF-8",
                  "PYTHONDONTWRITEBYTECODE": "1"}
        if self.pythonpath:
            values["PYTHONPATH"] = os.pathsep.join(self.pythonpath)
        values.update(extra)
        return ["env", "-i", *(f"{k}={v}" for k, v in values.items())]

    def run(self, *argv: str, timeout: float = 120, text: bool = True, **env: str) -> subprocess.CompletedProcess:
        """``argv`` run as this user, in a clean environment."""
        prefix = ["runuser", "-u", self.name, "--"] if not self.system.priv else [*self.system.priv, "-u", self.name]
        return subprocess.run([*prefix, *self.env(**env), *argv], capture_output=True, text=text, timeout=timeout,
                              cwd="/")

    def ckptfs(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        return self.run(self.python, "-m", "ckptfs.cli", *args, **env)


def _processes_of(uid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as f:
                    for line in f:
                        if line.startswith("Uid:"):
                            if int(line.split()[1]) == uid:
                                pids.append(int(entry))
                            break
            except OSError:
                continue
    return pids


@contextmanager
def _lock() -> Iterator[None]:
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@pytest.fixture(scope="module")
def system() -> Iterator[System]:
    """The machine, for one test module: the lock held, a world-traversable work directory, and on the way out
    every mount under it unmounted (by root, lazily if needed)."""
    require_fuse()
    priv = privileged_prefix()
    for tool in ("useradd", "userdel", "runuser" if not priv else "sudo", "mount", "umount"):
        if not shutil.which(tool) and not os.path.exists(f"/usr/sbin/{tool}"):
            _unavailable(f"{tool} is missing")
    base = Path(tempfile.mkdtemp(prefix="ckptfs-system-", dir="/tmp"))
    os.chmod(base, 0o755)
    with _lock():
        s = System(priv, base)
        try:
            yield s
        finally:
            for line in open("/proc/self/mountinfo").read().splitlines():
                mnt = line.split()[4]
                if mnt.startswith(str(base)):
                    for cmd in (["fusermount3", "-uz", mnt], ["umount", "-l", mnt]):
                        if s.run(*cmd, check=False).returncode == 0:
                            break
            s.run("rm", "-rf", str(base), check=False)


@pytest.fixture(scope="module")
def users(system: System) -> Iterator[tuple[User, User]]:
    """Two new users: an owner (who mounts) and another one. Their processes are ended (by pid) and both are
    deleted afterwards."""
    tag = f"{os.getpid() % 100000:05d}"
    names = [f"ckfs{tag}a", f"ckfs{tag}b"]
    made: list[User] = []
    try:
        for name in names:
            try:
                pwd.getpwnam(name)
                system.run("userdel", "-f", name, check=False)  # left by a run that crashed with our pid
            except KeyError:
                pass
            system.run("useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", name)
            pw = pwd.getpwnam(name)
            made.append(User(name, pw.pw_uid, pw.pw_gid, system))
        python, path = user_python(made[0], system)
        for u in made:
            u.python, u.pythonpath = python, path
        yield made[0], made[1]
    finally:
        for u in made:
            for _ in range(3):
                pids = _processes_of(u.uid)
                if not pids:
                    break
                for pid in pids:  # our users' processes: ended by pid, never by name
                    system.run("kill", "-TERM" if _ == 0 else "-KILL", str(pid), check=False)
                time.sleep(0.5)
            system.run("userdel", "-f", u.name, check=False)
            system.run("groupdel", u.name, check=False)


def user_python(user: User, system: System) -> tuple[str, list[str]]:
    """An interpreter ``user`` can run and a PYTHONPATH under which it imports this checkout's ckptfs (with numpy
    and mfusepy). The test interpreter may live where other users cannot go (a venv over a Python in root's
    home): then the system's python3.X of the same version is tried, and packages other users cannot read are
    copied to a directory they can. (A real deployment installs ckptfs where every user can read it:
    docs/cli.md.)"""
    import mfusepy
    import numpy

    want = (CHECKOUT / "ckptfs" / "__init__.py").resolve()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    candidates = list(dict.fromkeys([sys.executable, os.path.realpath(sys.executable), f"/usr/bin/python{version}",
                                     f"/usr/local/bin/python{version}", "/usr/bin/python3"]))
    site = [str(Path(numpy.__file__).resolve().parents[1]), str(Path(mfusepy.__file__).resolve().parent)]
    paths = list(dict.fromkeys([str(CHECKOUT), *site]))
    probe = "import ckptfs, numpy, mfusepy; print(ckptfs.__file__)"

    def works(python: str, path: list[str]) -> bool:
        if not os.path.exists(python):
            return False
        user.pythonpath = path
        r = user.run(python, "-c", probe)
        return r.returncode == 0 and Path(r.stdout.strip()).resolve() == want

    for python in candidates:
        if works(python, paths):
            return python, paths
    lib = system.base / "pylib"  # the packages copied where every user can read them
    if not lib.exists():
        lib.mkdir()
        shutil.copytree(CHECKOUT / "ckptfs", lib / "ckptfs", ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("numpy", "numpy.libs"):
            src = Path(numpy.__file__).resolve().parents[1] / name
            if src.exists():
                shutil.copytree(src, lib / name, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy2(mfusepy.__file__, lib)
        system.run("chmod", "-R", "a+rX", str(lib))
    want = (lib / "ckptfs" / "__init__.py").resolve()
    for python in candidates:
        if works(python, [str(lib)]):
            return python, [str(lib)]
    _unavailable(f"no Python {version} that user {user.name} can run with numpy and mfusepy (tried "
                 f"{', '.join(candidates)})")
    return "", []


@pytest.fixture
def dev_fuse_for_users(system: System) -> Iterator[None]:
    """/dev/fuse open to every user (0666), as udev makes it on a standard system; its mode restored after."""
    mode = stat.S_IMODE(os.stat("/dev/fuse").st_mode)
    try:
        if mode & 0o006 != 0o006:
            system.run("chmod", "0666", "/dev/fuse")
        yield
    finally:
        system.run("chmod", f"{mode:04o}", "/dev/fuse", check=False)


@pytest.fixture
def dev_fuse_closed(system: System) -> Iterator[None]:
    """/dev/fuse open to root only (0600), as in containers and minimal VMs; its mode restored after, whatever
    happens in the test."""
    mode = stat.S_IMODE(os.stat("/dev/fuse").st_mode)
    try:
        system.run("chmod", "0600", "/dev/fuse")
        yield
    finally:
        system.run("chmod", f"{mode:04o}", "/dev/fuse", check=False)
        if stat.S_IMODE(os.stat("/dev/fuse").st_mode) != mode:
            raise AssertionError(f"/dev/fuse's mode could not be put back to {mode:04o}")


@pytest.fixture
def fuse_conf(system: System) -> Iterator[object]:
    """``fuse_conf(allow)``: /etc/fuse.conf with (or without) ``user_allow_other``; restored afterwards."""
    path = "/etc/fuse.conf"
    before = system.read(path)

    def set_allow(allow: bool) -> None:
        lines = [ln for ln in (before or "").splitlines() if ln.split("#", 1)[0].strip() != "user_allow_other"]
        if allow:
            lines.append("user_allow_other")
        system.write(path, "\n".join(lines) + "\n")

    try:
        yield set_allow
    finally:
        if before is None:
            system.run("rm", "-f", path, check=False)
        else:
            system.write(path, before)


@pytest.fixture
def fstab_lines(system: System) -> Iterator[object]:
    """``fstab_lines(*lines)``: lines appended to /etc/fstab (for ``user`` mounts: mount(8) reads no other fstab
    for a user); /etc/fstab restored afterwards."""
    path = "/etc/fstab"
    before = system.read(path) or ""

    def add(*lines: str) -> None:
        system.write(path, before + ("" if before.endswith("\n") or not before else "\n") + "\n".join(lines) + "\n")

    try:
        yield add
    finally:
        system.write(path, before)


def _script(python: str, paths: list[str], module: str) -> str:
    """What a console script of this checkout would be, for an interpreter every user can run."""
    return (f"#!{python}\n# ckptfs's tests: this checkout's {module}.main (what pip's console script runs)\n"
            f"import sys\nsys.path[:0] = {paths!r}\nfrom {module} import main\nsys.exit(main())\n")


def _console_script(name: str, user: User) -> str | None:
    """The installed console script ``name`` next to the test interpreter, when it runs this checkout for
    ``user`` too (CI: `make setup` installs the package in .venv): the package installed the documented way."""
    script = Path(sys.executable).parent / name
    if not script.exists():
        return None
    python = script.read_text().splitlines()[0].removeprefix("#!").strip()
    r = user.run(python, "-c", "import ckptfs; print(ckptfs.__file__)", PYTHONPATH="")
    ok = r.returncode == 0 and Path(r.stdout.strip()).resolve() == (CHECKOUT / "ckptfs" / "__init__.py").resolve()
    return str(script) if ok else None


@pytest.fixture(scope="module")
def mount_helper(system: System, users: tuple[User, User]) -> Iterator[str]:
    """/sbin/mount.fuse.ckptfs for this checkout: a symlink to the installed console script (docs/cli.md's way)
    when it runs this checkout, else an equivalent script; the previous state restored afterwards. Yields which
    one ("console script" or "generated")."""
    owner = users[0]
    installed = _console_script("mount.fuse.ckptfs", owner)
    if installed:
        with system.symlinked(HELPER, installed):
            yield "console script"
    else:
        with system.replaced(HELPER, _script(owner.python, owner.pythonpath, "ckptfs.cli.mounthelper"), 0o755):
            yield "generated"


@pytest.fixture
def ckptfs_on_path(system: System, users: tuple[User, User]) -> Iterator[str]:
    """``ckptfs`` in /usr/local/bin and no /sbin/mount.fuse.ckptfs: mount(8) then goes through fuse3's
    mount.fuse3, which runs ``ckptfs SOURCE MOUNTPOINT -o OPTIONS``."""
    owner = users[0]
    installed = _console_script("ckptfs", owner)
    with system.replaced(HELPER, None):
        if installed:
            with system.symlinked(ON_PATH, installed):
                yield "console script"
        else:
            with system.replaced(ON_PATH, _script(owner.python, owner.pythonpath, "ckptfs.cli"), 0o755):
                yield "generated"
