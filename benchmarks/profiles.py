"""Profiles for cases whose target is missed: pyinstrument call trees (in-process steps) and py-spy samples
of a FUSE daemon (collapsed stacks summarised as self and inclusive shares per function)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections import Counter

from .util import script


def trim_pyinstrument(path: str, max_lines: int = 45, max_depth: int = 7) -> str | None:
    """The pyinstrument text tree, without its banner, at most max_depth levels deep, cut to max_lines."""
    try:
        with open(path) as f:
            lines = f.read().rstrip().splitlines()
    except OSError:
        return None
    if lines and lines[0] == "CPROFILE":  # the cProfile fallback: keep its table
        body = [ln.rstrip() for ln in lines[1:] if ln.strip()][: max_lines]
        return "cProfile (pyinstrument not installed), sorted by cumulative time:\n" + "\n".join(body)
    body = []
    started = False
    for ln in lines:
        if not started:
            # the tree starts at the first line with a time value after the banner
            if re.match(r"^\s*\d+\.\d+\s", ln):
                started = True
            else:
                continue
        if ln.strip().startswith("To view this report") or ln.strip().startswith("Recorded:"):
            break
        m = re.search(r"\d", ln)
        if m and m.start() // 3 > max_depth:  # pyinstrument indents 3 columns per level
            continue
        body.append(ln.rstrip())
    if len(body) > max_lines:
        body = body[:max_lines] + [f"... ({len(body) - max_lines} more lines in {os.path.basename(path)})"]
    return (f"pyinstrument (seconds, call tree of the measured step, {max_depth} levels):\n" + "\n".join(body))


class PySpy:
    """py-spy record of a running process (e.g. a FUSE daemon) while a workload runs."""

    def __init__(self, pid: int, out: str, rate: int = 250, native: bool = False) -> None:
        self.pid, self.out = pid, out
        exe = script("py-spy")
        if exe is None:
            raise RuntimeError("py-spy is not installed")
        cmd = [exe, "record", "--pid", str(pid), "--format", "raw", "--rate", str(rate), "-o", out, "--threads"]
        # --native shows libfuse/libc frames (where a FUSE daemon waits and copies); it needs to pause the
        # process per sample, so it cannot be combined with --nonblocking
        cmd.append("--native" if native else "--nonblocking")
        self.cmd = cmd
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> PySpy:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(0.5)  # let it attach
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def summarize_collapsed(path: str, top: int = 12, title: str = "") -> str | None:
    """Self and inclusive share per function from py-spy's raw (collapsed) output."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    self_c: Counter = Counter()
    incl_c: Counter = Counter()
    total = 0
    for ln in lines:
        stack, _, count = ln.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if f and not f.startswith("thread (")
                  and not f.startswith("process ")]
        if not frames:
            continue
        total += n
        names = [_short(f) for f in frames]
        self_c[names[-1]] += n
        for name in set(names):
            incl_c[name] += n
    if not total:
        return f"py-spy{title}: no samples (the daemon was idle or py-spy could not attach)"
    out = [f"py-spy{title}: {total} samples of the daemon's threads while the workload ran",
           "  self%  incl%  function (file:line)"]
    for name, n in self_c.most_common(top):
        out.append(f"  {100 * n / total:5.1f}  {100 * incl_c[name] / total:5.1f}  {name}")
    return "\n".join(out)


def _short(frame: str) -> str:
    # py-spy raw frames look like "function (path/to/file.py:123)"
    m = re.match(r"^(.*) \((.*?):(\d+)\)$", frame)
    if not m:
        return frame
    func, path, _line = m.groups()
    return f"{func} ({os.path.basename(path)})"


def perf_available() -> bool:
    exe = script("perf")
    if exe is None:
        return False
    r = subprocess.run([exe, "stat", "-e", "task-clock", "--", "true"], capture_output=True, text=True)
    return r.returncode == 0


def perf_record(cmd: list[str], out: str, cwd: str | None = None) -> bool:
    """perf record (user + kernel symbols) of one command and its children only."""
    exe = script("perf")
    if exe is None:
        return False
    r = subprocess.run([exe, "record", "-q", "-F", "4000", "-o", out, "--"] + cmd, cwd=cwd,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return r.returncode == 0 and os.path.exists(out)


def perf_summary(data: str, top: int = 12, title: str = "") -> str | None:
    """Top symbols (self %) of a perf.data, kernel ([k]) and user ([.]) alike."""
    exe = script("perf")
    if exe is None:
        return None
    r = subprocess.run([exe, "report", "-i", data, "--sort", "dso,sym", "--stdio", "--percent-limit", "0.5"],
                       capture_output=True, text=True)
    rows = []
    for ln in r.stdout.splitlines():
        m = re.match(r"^\s+(\d+\.\d+)%\s+(\S+)\s+\[(.)\]\s+(.*)$", ln)
        if m:
            pct, dso, kind, sym = m.groups()
            rows.append(f"  {float(pct):5.1f}  [{'kernel' if kind == 'k' else 'user'}] {sym.strip()} ({dso})")
    if not rows:
        return None
    return f"perf{title}: top symbols, self % of the reader process's samples\n" + "\n".join(rows[:top])
