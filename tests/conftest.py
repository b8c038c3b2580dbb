"""Shared fixtures. ``mount``: real FUSE mounts through the ``ckptfs mount`` command, always unmounted.

Mount tests skip only when FUSE is genuinely unavailable here (no /dev/fuse, no libfuse, no fusermount
for a non-root user) AND CKPTFS_REQUIRE_FUSE is not set; CI sets it, and then they fail instead.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from ctypes.util import find_library
from pathlib import Path
from typing import Iterator

import pytest

CKPTFS = [sys.executable, "-m", "ckptfs.cli"]


def fuse_unavailable() -> str | None:
    """Why real mounts cannot work on this machine, or None."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if not (find_library("fuse3") or find_library("fuse")):
        return "no libfuse (install fuse3)"
    if os.geteuid() != 0 and not (shutil.which("fusermount3") or shutil.which("fusermount")):
        return "no fusermount (install fuse3)"
    # (never import the binding here: it would pin one libfuse for the whole test process)
    if importlib.util.find_spec("mfusepy") is None and importlib.util.find_spec("fuse") is None:
        return "neither mfusepy nor fusepy is installed"
    return None


def require_fuse() -> None:
    reason = fuse_unavailable()
    if reason is None:
        return
    if os.environ.get("CKPTFS_REQUIRE_FUSE"):
        pytest.fail(f"CKPTFS_REQUIRE_FUSE is set but FUSE is unavailable: {reason}")
    pytest.skip(f"FUSE unavailable: {reason}")


from helpers import is_mounted  # noqa: E402 - /proc/self/mountinfo read by the tests themselves


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.02)
    return False


def run_ckptfs(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*CKPTFS, *args], capture_output=True, text=True, env=env, timeout=timeout)


class Mounted:
    """One mount made by ``ckptfs mount`` (daemon mode)."""

    def __init__(self, path: Path, checkpoint: Path, log: Path, pid: int) -> None:
        self.path, self.checkpoint, self.log, self.pid = path, checkpoint, log, pid

    def __truediv__(self, other: str) -> Path:
        return self.path / other

    def index(self) -> dict:
        return json.loads((self.path / ".ckptfs" / "index.json").read_bytes())

    def cleanup(self) -> None:
        """Unmount whatever state it is in, and make sure the daemon is gone."""
        for args in (["-u"], ["-uz"]):
            if not is_mounted(self.path):
                break
            for tool in ("fusermount3", "fusermount"):
                if shutil.which(tool):
                    subprocess.run([tool, *args, str(self.path)], capture_output=True, timeout=30)
                    break
        if pid_alive(self.pid) and not wait_gone(self.pid, 10):
            os.kill(self.pid, signal.SIGKILL)  # our own daemon, by pid
            wait_gone(self.pid, 5)
        assert not is_mounted(self.path), f"{self.path} is still mounted"


class Mounter:
    """Makes mounts under ``base``; ``cleanup()`` unmounts every one of them."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.made: list[Mounted] = []

    def __call__(self, checkpoint: Path | str, *args: str, env: dict | None = None) -> Mounted:
        n = len(self.made)
        mnt = self.base / f"mnt{n}"
        mnt.mkdir(parents=True)
        log = self.base / f"mount{n}.log"
        r = run_ckptfs("mount", str(checkpoint), str(mnt), "--log", str(log), *args, env=env)
        if r.returncode != 0:
            raise AssertionError(f"ckptfs mount failed ({r.returncode}): {r.stderr.strip()}")
        pid = json.loads((mnt / ".ckptfs" / "mount.json").read_bytes())["pid"]
        m = Mounted(mnt, Path(checkpoint), log, pid)
        self.made.append(m)
        return m

    def cleanup(self) -> None:
        errors = []
        for m in self.made:
            try:
                m.cleanup()
            except AssertionError as e:
                errors.append(str(e))
        assert not errors, errors


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[Mounter]:
    """``mount(checkpoint, *mount_args, env=None) -> Mounted``; everything is unmounted afterwards."""
    require_fuse()
    m = Mounter(tmp_path / "mounts")
    try:
        yield m
    finally:
        m.cleanup()


@pytest.fixture(scope="module")
def module_mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mounter]:
    """Like ``mount``, shared by the tests of one module (mounting costs an interpreter start)."""
    require_fuse()
    m = Mounter(tmp_path_factory.mktemp("mounts"))
    try:
        yield m
    finally:
        m.cleanup()
