"""Progress on a terminal, nothing anywhere else: the one helper every long command uses.

    with progress.bar(total=nbytes, desc="stats", unit="B", disable=args.no_progress) as bar:
        for chunk in ...:
            bar.update(len(chunk))
    with progress.activity(f"indexing {name}"):      # no count to show: what is being done, and for how long
        ckpt = ckptfs.open(name)

A bar (tqdm, on stderr) is shown only when stderr is a terminal, ``--no-progress`` was not given and the
environment does not set ``CKPTFS_PROGRESS=0``; it appears only once the work has taken
``CKPTFS_PROGRESS_DELAY`` seconds (default 0.5: quick commands print nothing) and is erased when done, so the
terminal keeps only the command's output. In a pipe or a file, nothing extra is written.
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from typing import IO, Any, Iterator

DEFAULT_DELAY = 0.5


class NullBar:
    """What ``bar`` gives when nothing is shown: the same methods, doing nothing."""

    n = 0

    def update(self, n: float = 1) -> None:
        self.n += n  # type: ignore[assignment]

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


def delay() -> float:
    try:
        return max(0.0, float(os.environ.get("CKPTFS_PROGRESS_DELAY", DEFAULT_DELAY)))
    except ValueError:
        return DEFAULT_DELAY


def enabled(disable: bool = False, stream: IO[str] | None = None) -> bool:
    """Whether progress is shown: a terminal on stderr, not disabled by an option or CKPTFS_PROGRESS=0."""
    if disable or os.environ.get("CKPTFS_PROGRESS", "1").strip().lower() in ("0", "no", "off", "false"):
        return False
    stream = stream or sys.stderr
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or not a real file
        return False


def _tqdm() -> Any:
    try:
        import tqdm
    except ImportError:  # an optional nicety: without tqdm, no progress
        return None
    # no monitor thread: the mount daemon and the unpickling probe fork, which must not happen while
    # threads run
    tqdm.tqdm.monitor_interval = 0
    return tqdm.tqdm


@contextmanager
def bar(total: int | None, desc: str, unit: str = "B", *, disable: bool = False) -> Iterator[Any]:
    """A progress bar of ``total`` units (bytes by default: shown as KB/MB/GB per second)."""
    tqdm = _tqdm() if enabled(disable) else None
    if tqdm is None:
        yield NullBar()
        return
    b = tqdm(total=total, desc=desc, unit=unit, unit_scale=unit == "B", unit_divisor=1024 if unit == "B" else 1000,
             delay=delay(), leave=False, file=sys.stderr, dynamic_ncols=True, miniters=1, mininterval=0.1)
    try:
        yield b
    finally:
        b.close()


@contextmanager
def activity(desc: str, *, disable: bool = False, interval: float = 0.2) -> Iterator[None]:
    """A line saying what is being done and for how long ("indexing model.pth: 3s"), for work without a
    count to show (indexing a checkpoint). A thread refreshes it; it is joined before the block's end."""
    tqdm = _tqdm() if enabled(disable) else None
    if tqdm is None:
        yield
        return
    wait = delay()
    b = tqdm(total=None, desc=desc, bar_format="{desc}: {elapsed}", leave=False, file=sys.stderr, delay=wait,
             dynamic_ncols=True)
    stop = threading.Event()

    def refresh() -> None:
        while not stop.wait(interval):
            b.update(0)  # redraws once the delay has passed (and marks the line as shown, for close to erase)

    thread = threading.Thread(target=refresh, name="ckptfs-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        b.close()
