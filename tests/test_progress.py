"""Progress on a terminal, nothing extra in a pipe: stats, diff, check and mount run with stderr on a
pseudo-terminal (pty) and in a pipe; the helper's activity line; delays and the switches that turn it off."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest
import torch
from helpers import CKPTFS, is_mounted, require_fuse

FAST = {"CKPTFS_PROGRESS_DELAY": "0"}


def bare(tty: str) -> str:
    """Terminal output without the line ends the pty adds (\n -> \r\n): a \r left is a redraw."""
    return tty.replace("\r\n", "\n")  # bars at once (by default they wait 0.5 s: quick commands show nothing)


def env(**extra: str) -> dict:
    e = dict(os.environ)
    e.pop("CKPTFS_PROGRESS", None)
    e.pop("CKPTFS_PROGRESS_DELAY", None)
    return e | extra


def run_on_tty(args: list[str], environ: dict, timeout: float = 120) -> tuple[int, str, str]:
    """Run with stderr on a pty (80 columns) and stdout on a pipe: (status, stdout, what the terminal got)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave, env=environ)
    os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            r, _, _ = select.select([master], [], [], 0.5)
            if not r:
                if p.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer has closed the terminal
                break
            if not data:
                break
            chunks.append(data)

    t = threading.Thread(target=drain)
    t.start()
    out = p.communicate(timeout=timeout)[0]
    t.join(timeout)
    os.close(master)
    return p.returncode, out.decode(), b"".join(chunks).decode(errors="replace")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("progress")
    g = torch.Generator().manual_seed(0)
    sd = {"big": torch.randn(4_000_000, generator=g), "small": torch.ones(3), "step": 5}
    a, b = d / "a.pth", d / "b.pth"
    torch.save(sd, a)
    sd["big"] = sd["big"].clone()
    sd["big"][123] += 1
    torch.save(sd, b)
    return a, b


@pytest.mark.parametrize("command", ["stats", "diff", "check"])
def test_a_bar_on_a_terminal_and_nothing_in_a_pipe(files, command):
    a, b = files
    args = [*CKPTFS, command, str(a)] + ([str(b)] if command == "diff" else [])
    code, out, tty = run_on_tty(args + ["--chunk-size", "1M"] * (command != "check"), env(**FAST))
    assert code == (1 if command == "diff" else 0), tty
    label = {"stats": "stats:", "diff": "diff:", "check": "check:"}[command]
    assert label in tty and "%|" in tty and "\r" in bare(tty), tty  # a tqdm bar, redrawn in place
    assert "%|" not in out and "\r" not in out  # stdout is the result alone
    if command == "stats":
        assert "15.3M/15.3M" in tty or "15.3M" in tty, tty  # bytes (4,000,000 float32 = 15.3 MiB)
    if command == "check":
        assert "torch.load" in tty, tty  # the activity line while torch loads (importing torch takes > 0.2 s)
    piped = subprocess.run(args, capture_output=True, text=True, env=env(**FAST), timeout=120)
    assert piped.returncode == code and piped.stdout == out
    assert "\r" not in piped.stderr and "%|" not in piped.stderr and "torch.load" not in piped.stderr
    assert len(piped.stderr.strip().splitlines()) <= 1, piped.stderr  # the summary line, nothing else


@pytest.mark.parametrize("switch", ["--no-progress", "CKPTFS_PROGRESS=0", "default delay"])
def test_switches_and_the_delay_silence_it(files, switch):
    a, _ = files
    args = [*CKPTFS, "stats", str(a), "small"]  # quick: well under the default delay of 0.5 s
    environ = env() if switch == "default delay" else env(**FAST)
    if switch == "--no-progress":
        args.append("--no-progress")
    elif switch.startswith("CKPTFS_PROGRESS="):
        environ["CKPTFS_PROGRESS"] = "0"
    code, out, tty = run_on_tty(args, environ)
    assert code == 0 and "small" in out
    assert "%|" not in tty and "\r" not in bare(tty), tty
    assert "1 tensor," in tty  # the summary is there: stderr is the terminal


def test_activity_line_in_process(monkeypatch):
    """The helper's activity line ("indexing ...: elapsed"), drawn by its thread once the delay passed, erased
    at the end, and the thread gone afterwards (the mount daemon forks after indexing)."""
    from ckptfs.cli import progress

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    term = os.fdopen(slave, "w", buffering=1)
    monkeypatch.setattr(sys, "stderr", term)
    monkeypatch.setenv("CKPTFS_PROGRESS_DELAY", "0.3")
    try:
        with progress.activity("indexing model.pth", interval=0.05):
            time.sleep(0.8)
        assert not [t for t in threading.enumerate() if t.name == "ckptfs-progress"]
        term.flush()
        got = b""
        while select.select([master], [], [], 0.2)[0]:
            got += os.read(master, 65536)
        text = got.decode()
        assert "indexing model.pth: 00:00" in text and text.endswith("\r"), text
        with progress.activity("quick one", interval=0.05):  # over before the delay: nothing at all
            time.sleep(0.05)
        term.flush()
        assert not select.select([master], [], [], 0.2)[0]
    finally:
        term.close()
        os.close(master)


def test_mount_on_a_terminal(files, tmp_path):
    """The indexing line's thread is joined before the daemon forks: the mount works with progress on."""
    require_fuse()
    a, _ = files
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        code, out, tty = run_on_tty([*CKPTFS, "mount", str(a), str(mnt)], env(**FAST))
        assert code == 0, tty
        assert is_mounted(mnt) and (mnt / "small").read_bytes() == torch.ones(3).numpy().tobytes()
    finally:
        if is_mounted(mnt):
            subprocess.run([*CKPTFS, "umount", str(mnt)], capture_output=True, timeout=60)
    assert not is_mounted(mnt)


@pytest.mark.parametrize("switch", ["on", "--no-progress", "-q", "CKPTFS_PROGRESS=0", "default delay"])
def test_export_follows_the_same_rules(files, tmp_path, switch):
    """export's bar is the shared one: shown on a terminal (once the delay has passed), erased when done, and
    silenced by --no-progress, -q, CKPTFS_PROGRESS=0 and the default delay for a quick export."""
    a, _ = files
    small = tmp_path / "small.pth"
    torch.save({"w": torch.ones(10)}, small)
    src = small if switch == "default delay" else a
    args = [*CKPTFS, "export", str(src), str(tmp_path / "out.safetensors")]
    environ = env() if switch == "default delay" else env(**FAST)
    if switch in ("--no-progress", "-q"):
        args.append(switch)
    elif switch.startswith("CKPTFS_PROGRESS="):
        environ["CKPTFS_PROGRESS"] = "0"
    code, out, tty = run_on_tty(args, environ)
    assert code == 0, tty
    assert out == "" and (tmp_path / "out.safetensors").exists()
    if switch == "on":
        assert "out.safetensors:" in tty and "%|" in tty and "\r" in bare(tty), tty
        assert re.search(r"\r +\rckptfs: wrote ", tty), tty  # the bar erased before the summary
    else:
        assert "%|" not in tty and "\r" not in bare(tty), tty
    assert ("ckptfs: wrote " in tty) == (switch != "-q"), tty
    piped = subprocess.run([*args, "--force"], capture_output=True, text=True, env=environ, timeout=120)
    assert piped.returncode == 0 and "\r" not in piped.stderr and "%|" not in piped.stderr


@pytest.mark.parametrize("command", [["ls"], ["info"], ["stats"], ["check"]])
def test_no_progress_is_accepted_by_every_command_that_opens_a_checkpoint(files, command):
    """docs/cli.md lists --no-progress among the common options: it silences the 'indexing ...' line."""
    from ckptfs.cli import build_parser

    for name in ("ls", "info", "code", "stats", "check", "diff", "export", "mount"):
        extra = {"diff": ["b.pth"], "export": ["b.safetensors"], "mount": ["/mnt"]}.get(name, [])
        assert build_parser().parse_args([name, "a.pth", *extra, "--no-progress"]).no_progress, name
    a, _ = files
    code, out, tty = run_on_tty([*CKPTFS, *command, str(a), "--no-progress"], env(**FAST))
    assert code == 0, tty
    assert "indexing" not in tty and "%|" not in tty and "\r" not in bare(tty), tty
