"""Hostile files through a real mount: every file that indexes is mounted, walked and read; the daemon
stays up, serves the expected bytes, answers bad tensors with EIO (and one log line), and nothing runs."""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import pytest

from helpers import hostile_corpus
from hostile.make_corpus import Case

CASES, MARKERS = hostile_corpus()

# every indexing case except the slow 200k-tensor one and the ones with custom limits (the mount uses
# the defaults): ~125 mounts
MOUNT_CASES = [c for c in CASES if c.expect == "index" and c.limits is None and c.name != "res_200k_tensors_one_storage"]
# each mount costs ~1 s (an interpreter start): all of them are `slow` but a few of every family, the quick run's
QUICK = {"exec_os_system", "exec_numpy_reconstruct", "lie_shape_beyond", "lie_hostile_keys", "lie_byteorder_big",
         "zip_deflated_storage", "zip_local_crc", "legacy_ok", "legacy_truncated_storage", "res_deflate_bomb"}
assert QUICK <= {c.name for c in MOUNT_CASES}, QUICK - {c.name for c in MOUNT_CASES}


def _walk_and_read(root: Path, budget: float, max_reads: int = 3000) -> tuple[int, list[tuple[str, int]]]:
    """List the whole tree; open and read (the start, and the end of big files) up to ``max_reads`` files
    spread over it (100k-entry trees are listed in full but sampled)."""
    n, errs, seen = 0, [], 0
    stop = time.monotonic() + budget
    for d, dirs, files in os.walk(root):
        for f in files:
            seen += 1
            if n >= max_reads and seen % 50:
                continue
            p = os.path.join(d, f)
            try:
                with open(p, "rb") as fh:
                    size = os.fstat(fh.fileno()).st_size
                    fh.read(1 << 20)
                    if size > 1 << 20:
                        fh.seek(size - 4096)
                        fh.read()
                n += 1
            except OSError as e:
                errs.append((os.path.relpath(p, root), e.errno))
        assert time.monotonic() < stop, f"walking {root} took more than {budget} s"
    return n, errs


@pytest.mark.mount
@pytest.mark.parametrize("case", [pytest.param(c, id=c.name, marks=[] if c.name in QUICK else [pytest.mark.slow])
                                  for c in MOUNT_CASES])
def test_hostile_mount(case: Case, module_mount, tmp_path: Path) -> None:
    path = case.materialise(tmp_path)
    m = module_mount(path)
    try:
        index = m.index()
        files = {e["key"]: e["path"] for e in index["entries"] if e["kind"] == "tensor"}
        for key, want in case.tensors.items():
            assert key in files, f"{key!r} not in the mount"
            got = (m / files[key]).read_bytes() if want is not None else None
            if want is not None:
                assert got == want, f"{key!r}: wrong bytes through the mount"
        n, errs = _walk_and_read(m.path, 60.0 + len(index["entries"]) / 500)
        assert n > 0
        assert all(e == errno.EIO for _, e in errs), errs[:5]
        assert os.path.exists(f"/proc/{m.pid}"), "the daemon died"
        log = m.log.read_text(errors="replace") if m.log.exists() else ""
        assert "Traceback" not in log and "internal error" not in log, log[-2000:]
        assert not any(MARKERS.iterdir()), "a gadget ran"
        json.dumps(index)
    finally:
        m.cleanup()
