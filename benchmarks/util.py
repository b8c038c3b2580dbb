"""Small helpers shared by the parent (case drivers) and the workers. No torch, no ckptfs imports here."""

from __future__ import annotations

import os
import statistics
import struct
import sys
import zipfile
from typing import Iterable, Sequence

MiB = 1 << 20
GiB = 1 << 30


def bin_dir() -> str:
    """The directory of this interpreter's console scripts (the real scripts, not pyenv shims)."""
    return os.path.dirname(os.path.abspath(sys.executable))


def script(name: str) -> str | None:
    """Path of an installed console script next to sys.executable (else on PATH, else None)."""
    p = os.path.join(bin_dir(), name)
    if os.path.exists(p):
        return p
    import shutil

    return shutil.which(name)


# --- statistics -------------------------------------------------------------------------------------------


def summary(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max)."""
    return statistics.median(values), min(values), max(values)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (q in [0, 100])."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, int(round(q / 100.0 * len(sorted_values) + 0.5)) - 1))
    return sorted_values[k]


# --- page cache -------------------------------------------------------------------------------------------


def drop_file_cache(*paths: str) -> None:
    """Evict a file's pages from the page cache: posix_fadvise(POSIX_FADV_DONTNEED) on the whole file.

    Works for regular files and for files in a FUSE mount (the kernel keeps a page cache per FUSE inode).
    Dirty pages are not an issue: every file here is read-only after generation (we fsync after writing).
    """
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm_file(path: str, offset: int = 0, size: int | None = None, chunk: int = 8 * MiB) -> None:
    """Read a file (or a range of it) once so its pages are in the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        end = os.fstat(fd).st_size if size is None else offset + size
        buf = bytearray(chunk)
        mv = memoryview(buf)
        pos = offset
        while pos < end:
            n = os.preadv(fd, [mv[: min(chunk, end - pos)]], pos)
            if n <= 0:
                break
            pos += n
    finally:
        os.close(fd)


# --- memory -------------------------------------------------------------------------------------------------


def proc_status(pid: int | str = "self") -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile, ... of a process in bytes (from /proc/PID/status)."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            parts = rest.split()
            if len(parts) == 2 and parts[1] == "kB":
                out[name] = int(parts[0]) * 1024
    return out


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# --- zip records ----------------------------------------------------------------------------------------------


def record_span(path: str, name_suffix: str) -> tuple[int, int, str]:
    """(data offset, size, full name) of the stored zip record whose name ends with ``name_suffix``.

    The data offset comes from the LOCAL header (torch pads records with a local extra field).
    """
    with zipfile.ZipFile(path) as zf:
        matches = [i for i in zf.infolist() if i.filename.endswith(name_suffix)]
        if len(matches) != 1:
            raise LookupError(f"{path}: {len(matches)} records end with {name_suffix!r}")
        info = matches[0]
        if info.compress_type != zipfile.ZIP_STORED:
            raise ValueError(f"{path}: {info.filename} is compressed")
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        hdr = f.read(30)
        if hdr[:4] != b"PK\x03\x04":
            raise ValueError(f"{path}: no local header at {info.header_offset}")
        name_len, extra_len = struct.unpack("<HH", hdr[26:30])
    return info.header_offset + 30 + name_len + extra_len, info.file_size, info.filename


# --- formatting -------------------------------------------------------------------------------------------------


def fmt_num(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "-"
    if x != x:  # nan
        return "nan"
    ax = abs(x)
    if ax >= 1000:
        return f"{x:,.0f}"
    if ax >= 100:
        return f"{x:.0f}"
    if ax >= 10:
        return f"{x:.1f}"
    if ax >= 1:
        return f"{x:.2f}"
    if ax == 0:
        return "0"
    return f"{x:.{digits}g}"


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def first_line(text: str, limit: int = 200) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    s = lines[-1] if lines else ""
    return s if len(s) <= limit else s[: limit - 3] + "..."


def flatten(items: Iterable[Iterable[str]]) -> list[str]:
    return [x for it in items for x in it]
