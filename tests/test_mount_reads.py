"""Reads through real mounts: bytes named by file descriptor (libfuse splices the checkpoint's pages) and
bytes made in memory (strided gathers, sidecars, values), each against torch.load; 8 processes reading
different tensors at once; 16 threads page-faulting one np.memmap'd tensor file."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import mount_entry, torch_bytes

pytestmark = pytest.mark.mount

MiB = 1 << 20


def corpus() -> dict:
    """Every way a tensor's bytes can lie: contiguous records of several dtypes and sizes (below two pages,
    where libfuse copies, and several 1 MiB requests long), a contiguous slice at a storage offset, two views
    of one storage, and strided views that are gathered (transposed, a column slice, expanded by stride 0)."""
    g = torch.Generator().manual_seed(13)
    base = torch.randn(1000, 1000, generator=g)
    shared = torch.arange(50_000, dtype=torch.int32)
    return {
        "big": torch.randn(3 * MiB // 4 + 123, generator=g),  # ~3 MiB: several requests, an odd end
        "f16": torch.randn(3000, 7, generator=g).half(),
        "bf16": torch.randn(5000, generator=g).bfloat16(),
        "i64": torch.arange(100_000),
        "flags": torch.rand(10_000, generator=g) > 0.5,
        "tiny": torch.tensor([1.0, 2.0]),
        "rows": base[100:400],  # contiguous, at a storage offset
        "shared": {"a": shared[1000:30_000], "b": shared},
        "t": torch.randn(700, 900, generator=g).t(),
        "col": base[:, 3:5],
        "expanded": torch.randn(1, 3000, generator=g).expand(200, 3000),
        "step": 12,
        "name": "run-7",
    }


def tensors(obj, prefix=""):
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from tensors(v, key + "/")
        elif isinstance(v, torch.Tensor):
            yield key, v


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    p = tmp_path_factory.mktemp("reads") / "c.pth"
    torch.save(corpus(), p)
    return p


def drop(path: Path) -> None:
    """Evict the mounted file's pages: the next reads reach the daemon."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_in_steps(path: Path, step: int, start: int = 0) -> bytes:
    out = bytearray()
    with open(path, "rb", buffering=0) as f:
        pos = start
        while True:
            chunk = os.pread(f.fileno(), step, pos)
            if not chunk:
                return bytes(out)
            out += chunk
            pos += len(chunk)


def check_every_file(m, saved: Path) -> None:
    ref = torch.load(saved, weights_only=True)
    for key, t in tensors(ref):
        f = m / key
        want = torch_bytes(t)
        assert os.path.getsize(f) == len(want), key
        for step, start in ((MiB, 0), (3 * 4096 + 5, 0), (4096, 77), (1, len(want) - 3)):
            drop(f)
            assert read_in_steps(f, step, start) == want[start:], (key, step, start)
        side = json.loads((m / (key + ".json")).read_bytes())
        assert side["shape"] == list(t.shape) and side["dtype"] == str(t.dtype).removeprefix("torch."), key
    assert (m / "step").read_bytes() == b"12" and (m / "name").read_bytes() == b"run-7"


@pytest.mark.parametrize("how", ["splice", "nosplice", "threads"])
def test_every_kind_of_tensor_reads_as_torch_says(saved, mount, how):
    """The default (libfuse3) names the checkpoint's bytes by descriptor and libfuse splices them; gathered
    tensors, sidecars and values are made in memory; -o nosplice makes everything in memory. The bytes are
    torch's either way; the daemon's debug log says which path each read took."""
    args = {"splice": [], "nosplice": ["-o", "nosplice"], "threads": ["--threads"]}[how]
    m = mount(saved, "-d", *args)
    info = json.loads((m / ".ckptfs/mount.json").read_bytes())
    assert info["splice"] is (how != "nosplice")
    check_every_file(m, saved)
    log = m.log.read_text()
    by_fd = [ln for ln in log.splitlines() if "by file descriptor" in ln and "): 0 bytes by" not in ln]
    in_memory = [ln for ln in log.splitlines() if "bytes in memory" in ln]
    if how == "nosplice":  # libfuse calls read: the -d trace shows each read_into call
        assert not by_fd and not in_memory and any("read_into(" in ln for ln in log.splitlines())
    else:
        assert any("/big [" in ln for ln in by_fd) and any("/rows [" in ln for ln in by_fd)
        assert not any("/big [" in ln or "/rows [" in ln or "/shared/a [" in ln for ln in in_memory)
        assert any("/t [" in ln for ln in in_memory) and any("/expanded [" in ln for ln in in_memory)
        assert not any("/t [" in ln for ln in by_fd)
    assert "read errors" not in log or "(0 read errors)" in log


def test_max_read_fits_a_reply_in_the_largest_pipe(saved, mount):
    """libfuse splices a reply through one pipe, header included: where this process may not make a pipe of
    1 MiB and a few pages, the mount asks for smaller read requests (and still reads right)."""
    r, w = os.pipe()
    try:
        fcntl.fcntl(r, 1031, MiB + 4 * 4096)  # F_SETPIPE_SZ
        big_pipes = True
    except OSError:
        big_pipes = False
    finally:
        os.close(r)
        os.close(w)
    m = mount(saved)
    opts = mount_entry(m.path)["super_options"]
    if big_pipes:
        assert "max_read=" not in opts
    else:
        with open("/proc/sys/fs/pipe-max-size") as f:
            cap = int(f.read())
        max_read = int(opts.split("max_read=")[1].split(",")[0])
        assert max_read + 4 * 4096 <= cap and max_read % 4096 == 0
    drop(m / "big")
    assert (m / "big").read_bytes() == torch_bytes(torch.load(saved, weights_only=True)["big"])


READ_WHOLE = r"""
import hashlib, os, sys
path, want, step = sys.argv[1], sys.argv[2], int(sys.argv[3])
fd = os.open(path, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
sys.stdout.write("ready\n"); sys.stdout.flush()
sys.stdin.readline()  # all start together
h, pos = hashlib.sha256(), 0
while True:
    chunk = os.pread(fd, step, pos)
    if not chunk:
        break
    h.update(chunk)
    pos += len(chunk)
sys.exit(0 if h.hexdigest() == want else f"{path}: {pos} bytes, other content")
"""


@pytest.mark.parametrize("threads", [False, True], ids=["single-threaded", "multi-threaded"])
def test_eight_processes_read_different_tensors_at_once(tmp_path, mount, threads):
    g = torch.Generator().manual_seed(8)
    sd = {f"t{i}": torch.randn(MiB + 1000 * i, generator=g) for i in range(8)}  # ~4 MiB each
    p = tmp_path / "eight.pth"
    torch.save(sd, p)
    want = {k: hashlib.sha256(torch_bytes(t)).hexdigest() for k, t in torch.load(p, weights_only=True).items()}
    m = mount(p, *(["--threads"] if threads else []))
    procs = [subprocess.Popen([sys.executable, "-c", READ_WHOLE, str(m / k), want[k], str([MiB, 65536][i % 2])],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, k in enumerate(sd)]
    for proc in procs:
        assert proc.stdout.readline() == "ready\n"
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err


FAULTS = r"""
import os, sys, threading
import numpy as np
path, truth, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
fd = os.open(path, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # every fault goes to the daemon
arr = np.memmap(path, dtype=np.float32, mode="r")
want = np.fromfile(truth, dtype=np.float32)
assert arr.shape == want.shape
pages = arr.size // 1024
gun = threading.Barrier(n)
bad = []

def work(i):
    gun.wait()
    # interleaved pages (every thread faults next to the others), then a slice of its own, whole
    for p in range(i, pages, n):
        if arr[p * 1024] != want[p * 1024] and not (np.isnan(arr[p * 1024]) and np.isnan(want[p * 1024])):
            bad.append(("page", i, p))
    lo, hi = arr.size * i // n, arr.size * (i + 1) // n
    if arr[lo:hi].tobytes() != want[lo:hi].tobytes():
        bad.append(("slice", i))

threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
for t in threads:
    t.start()
for t in threads:
    t.join()
sys.exit(f"mismatches: {bad[:5]}" if bad else 0)
"""


@pytest.mark.parametrize("threads", [False, True], ids=["single-threaded", "multi-threaded"])
def test_sixteen_threads_page_faulting_one_memmap(tmp_path, mount, threads):
    """No deadlock (the reader runs under a timeout), no error, and every byte is torch's."""
    t = torch.randn(4 * MiB, generator=torch.Generator().manual_seed(16))  # 16 MiB
    p = tmp_path / "mm.pth"
    torch.save({"w": t}, p)
    truth = tmp_path / "w.truth"
    truth.write_bytes(torch_bytes(torch.load(p, weights_only=True)["w"]))
    m = mount(p, *(["--threads"] if threads else []))
    r = subprocess.run([sys.executable, "-c", FAULTS, str(m / "w"), str(truth), "16"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


def test_splice_max_read_and_reply_vectors():
    """The request size for a pipe of a given capacity, and the reply vectors handed to libfuse, read back
    with the C layout of struct fuse_bufvec / fuse_buf on x86_64 (libfuse 3.14; 3.17 appends mem_size):
    count, idx, off (3 x size_t), then the entries inline: size @0, flags @8, mem @16, fd @24, pos @32."""
    import ctypes
    import struct

    from ckptfs.mount.bufvec import FUSE_BUF_FD_RETRY, FUSE_BUF_FD_SEEK, FUSE_BUF_IS_FD, Replies
    from ckptfs.mount.fuse_ops import splice_max_read

    page = os.sysconf("SC_PAGE_SIZE")
    assert splice_max_read(1 << 30) == 0
    assert splice_max_read(MiB + 4 * page) == 0
    assert splice_max_read(MiB) == MiB - 4 * page
    assert splice_max_read(64 * 1024) == 64 * 1024 - 4 * page
    if struct.calcsize("P") != 8:
        pytest.skip("the layout below is the 64-bit one")
    def entry_at(raw: bytes, at: int) -> tuple[int, int, int, int, int]:
        """(size, flags, mem, fd, pos) of the struct fuse_buf at byte ``at``."""
        (size,), (flags,), (mem,) = struct.unpack_from("<Q", raw, at), struct.unpack_from("<i", raw, at + 8), \
            struct.unpack_from("<Q", raw, at + 16)
        (fd,), (pos,) = struct.unpack_from("<i", raw, at + 24), struct.unpack_from("<q", raw, at + 32)
        return size, flags, mem, fd, pos

    fd_flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK | FUSE_BUF_FD_RETRY
    for version, entry in (((3, 14), 40), ((3, 17), 48)):
        replies = Replies(version)
        assert replies.entry == entry
        vec = replies.spans([(7, 123, 3 * page), b"literal", (9, 1 << 33, 5)])
        raw = ctypes.string_at(vec, 24 + 3 * entry)
        assert struct.unpack_from("<QQQ", raw) == (3, 0, 0)
        assert entry_at(raw, 24) == (3 * page, fd_flags, 0, 7, 123)
        size, flags, mem, _, _ = entry_at(raw, 24 + entry)
        assert (size, flags) == (7, 0) and ctypes.string_at(mem, 7) == b"literal"
        assert entry_at(raw, 24 + 2 * entry) == (5, fd_flags, 0, 9, 1 << 33)
        replies.release(vec)
        vec, mem = replies.memory(100)
        ctypes.memmove(mem, b"x" * 100, 100)
        replies.set_size(vec, 60)
        raw = ctypes.string_at(vec, 24 + entry)
        assert struct.unpack_from("<Q", raw) == (1,) and entry_at(raw, 24)[:3] == (60, 0, mem)
        replies.release(vec)


def _memory_bytes() -> int:
    with open("/proc/meminfo") as f:
        info = {ln.split(":")[0]: int(ln.split()[1]) * 1024 for ln in f}
    return info["MemTotal"] + info.get("SwapTotal", 0)


def test_a_checkpoint_larger_than_memory_mounts_and_reads(tmp_path, mount):
    """A sparse torch zip (its records are holes) bigger than RAM + swap: the index and mount need only its
    headers, and a strided tensor in it is gathered through a read-only map (a private map of a file that
    size is refused under the kernel's default overcommit heuristic: ENOMEM)."""
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    try:
        from benchmarks._gen import write_sparse
    finally:
        sys.path.remove(str(root))
    size = max(64 << 30, 2 * _memory_bytes())
    p = tmp_path / "huge.pth"
    write_sparse(str(p), size, 8, transposed=True)
    assert os.stat(p).st_blocks * 512 < 64 * MiB  # holes
    import zipfile

    with zipfile.ZipFile(p) as zf:  # the records are where zipfile says, and hold zeros (holes)
        infos = {i.filename.rsplit("/", 1)[-1]: i for i in zf.infolist() if "/data/" in i.filename}
        assert len(infos) == 8 and all(i.file_size * 8 >= size * 0.99 for i in infos.values())
    m = mount(p)
    side = json.loads((m / "layers/7/weight.json").read_bytes())
    rows, cols = side["shape"]
    assert side["stride"] == [1, rows] and rows * cols * 4 == infos["7"].file_size
    for name in ("layers/0/weight", "layers/7/weight"):  # contiguous (spliced), transposed (gathered)
        f = m / name
        assert os.path.getsize(f) == infos["7"].file_size
        with open(f, "rb") as fh:  # (64 KiB of the transposed tensor gather from 16k pages of the file)
            for at in (0, os.path.getsize(f) // 2 + 12345, os.path.getsize(f) - 65536):
                assert os.pread(fh.fileno(), 65536, at) == bytes(65536), (name, at)
    assert "read errors" not in m.log.read_text() or "(0 read errors)" in m.log.read_text()
