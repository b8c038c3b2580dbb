"""Mounts of checkpoints served by a real nginx: bytes through the mount compared with torch.load of the file
nginx serves, several mounts of one object at once, the disk cache, and credentials that never show."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import mount_entry, remote_state_dict, run_ckptfs, save, torch_bytes, torch_tensors

pytestmark = pytest.mark.mount

NAME = "mount-m.pth"


@pytest.fixture(scope="module")
def served(nginx, tmp_path_factory):
    local = save(tmp_path_factory.mktemp("mount") / NAME, remote_state_dict())
    for where in ("", "private"):
        shutil.copy(local, nginx.root / where / NAME)
    return SimpleNamespace(local=local, url=nginx.url(NAME), uri=f"/{NAME}", expected=torch_tensors(local))


def _file(mnt, key: str) -> Path:
    return mnt.path.joinpath(*key.split("."))


def _check_all(mnt, expected) -> None:
    for key, t in expected.items():
        assert _file(mnt, key).read_bytes() == torch_bytes(t), key


def test_the_daemon_reads_over_the_connections_the_indexing_opened(mount, served, nginx):
    """The mount daemon takes over the idle connections its parent indexed with (the parent closes its copies):
    a fresh mount's first read costs no new connection (on a real link: no TCP or TLS handshake)."""
    since = len(nginx.log())
    m = mount(served.url)
    indexing = {e["conn"] for e in nginx.requests_for(served.uri, since)}
    mark = len(nginx.log())
    big = torch_bytes(served.expected["big"])
    with open(_file(m, "big"), "rb", buffering=0) as f:
        got = os.pread(f.fileno(), 4096, len(big) // 2)  # far from the first MiB the open fetched
    assert got == big[len(big) // 2 : len(big) // 2 + 4096]
    reading = {e["conn"] for e in nginx.requests_for(served.uri, mark)}
    assert indexing and reading and reading <= indexing, (indexing, reading)


def test_mount_serves_torch_bytes_to_concurrent_readers(mount, served):
    m = mount(served.url)
    info = json.loads((m.path / ".ckptfs" / "mount.json").read_bytes())
    assert info["checkpoint"] == served.url
    assert info["splice"] is False  # a URL's bytes are in memory: writev, not a copy into a pipe and a splice
    assert m.index()["checkpoint"] == served.url
    side = json.loads((m.path / "emb" / "weight.json").read_bytes())
    assert side["shape"] == [1000, 64] and side["dtype"] == "float32"
    errors: list[str] = []

    def reader(key: str) -> None:
        want = torch_bytes(served.expected[key])
        with open(_file(m, key), "rb", buffering=0) as f:
            got = bytearray()
            while chunk := f.read(96 << 10):
                got += chunk
        if bytes(got) != want:
            errors.append(key)

    threads = [threading.Thread(target=reader, args=(k,)) for k in ("big", "mid", "emb.weight", "big", "enc.1.weight")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    _check_all(m, served.expected)
    with open(_file(m, "big"), "rb") as f:  # random reads
        want = torch_bytes(served.expected["big"])
        for off in (0, 4096 * 999, len(want) - 4096, 7_000_001):
            f.seek(off)
            assert f.read(4096) == want[off : off + 4096]


def test_many_mounts_of_one_object_at_once(mount, served, tmp_path):
    cache = tmp_path / "cache"
    mounts = [mount(served.url, "--cache-dir", str(cache)) for _ in range(3)]
    errors: list[str] = []

    def read_all(m) -> None:
        for key, t in served.expected.items():
            if _file(m, key).read_bytes() != torch_bytes(t):
                errors.append(f"{m.path}: {key}")

    threads = [threading.Thread(target=read_all, args=(m,)) for m in mounts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


def test_a_second_mount_with_the_disk_cache_transfers_nothing(mount, nginx, served, tmp_path):
    cache = str(tmp_path / "cache")
    since = len(nginx.log())
    first = mount(served.url, "--cache-dir", cache)
    _check_all(first, served.expected)
    fetched = sum(e["bytes"] for e in nginx.requests_for(served.uri, since))
    assert fetched >= served.local.stat().st_size * 0.9
    mid = len(nginx.log())
    second = mount(served.url, "--cache-dir", cache)
    _check_all(second, served.expected)
    again = nginx.requests_for(served.uri, mid)
    assert sum(e["bytes"] for e in again) <= 1, again  # one identity check of 1 byte


def test_credentials_never_show(mount, nginx, served, tmp_path):
    """Not in the daemon's command line, mount.json, index.json, sidecars, the log, /proc/mounts, `ckptfs
    info`, nor an error message."""
    password = nginx.PASSWORD
    token = "Tok3n-VALUE-never-shown"
    url = nginx.url(f"private/{NAME}", auth=(nginx.USER, password))
    m = mount(url, "--storage-option", f"headers.X-Api-Token={token}", "--debug")
    assert _file(m, "mid").read_bytes() == torch_bytes(served.expected["mid"])
    shown = nginx.url(f"private/{NAME}")
    cmdline = Path(f"/proc/{m.pid}/cmdline").read_bytes().decode(errors="replace")
    assert shown in cmdline and "headers.X-Api-Token=***" in cmdline, cmdline
    texts = {"cmdline": cmdline,
             "mount.json": (m.path / ".ckptfs" / "mount.json").read_text(),
             "index.json": (m.path / ".ckptfs" / "index.json").read_text(),
             "sidecar": (m.path / "big.json").read_text(),
             "log": m.log.read_text(),
             "mounts": str(mount_entry(m.path))}
    info = run_ckptfs("info", url, "--storage-option", f"headers.X-Api-Token={token}")
    assert info.returncode == 0, info.stderr
    texts["info"] = info.stdout + info.stderr
    wrong = run_ckptfs("ls", nginx.url(f"private/{NAME}", auth=(nginx.USER, password + "x")))
    assert wrong.returncode == 2
    texts["error"] = wrong.stderr
    assert shown in texts["mount.json"] and shown in texts["info"] and shown in texts["mounts"]
    for where, text in texts.items():
        for secret in (password, token, nginx.USER + ":"):
            assert secret not in text, f"{secret!r} shows in {where}: {text[:300]}"


@pytest.mark.parametrize("how", ["mount.fuse.ckptfs", "ckptfs SRC MNT -o"])
def test_credentials_never_show_through_mount8_s_helpers(nginx, served, tmp_path, how):
    """mount(8) runs `mount.fuse.ckptfs SRC MNT -o OPTS` (or mount.fuse3 runs `ckptfs SRC MNT -o OPTS`): the
    daemon forked from that process must not keep the URL's password in its command line either."""
    import subprocess
    import sys

    url = nginx.url(f"private/{NAME}", auth=(nginx.USER, nginx.PASSWORD))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if how == "mount.fuse.ckptfs":
        cmd = [os.path.join(os.path.dirname(sys.executable), "mount.fuse.ckptfs"), url, str(mnt), "-o", "ro"]
    else:
        cmd = [sys.executable, "-m", "ckptfs.cli", url, str(mnt), "-o", "ro"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    try:
        assert r.returncode == 0, r.stderr
        assert (mnt / "mid").read_bytes() == torch_bytes(served.expected["mid"])
        daemons = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if str(mnt) in cmdline and pid != str(os.getpid()):
                daemons.append(cmdline)
        assert daemons, "no daemon serves the mount"
        for cmdline in daemons:
            assert nginx.PASSWORD not in cmdline and nginx.url(f"private/{NAME}") in cmdline, cmdline
    finally:
        run_ckptfs("umount", str(mnt))


def test_listing_a_mount_costs_no_request(mount, nginx, served):
    """`ls -l`, `du`, `find`: sizes come from the index; a tensor's local header is read with its bytes."""
    m = mount(served.url)
    since = len(nginx.log())
    sizes = {}
    for root, _, files in os.walk(m.path):
        for f in files:
            p = Path(root) / f
            sizes[str(p.relative_to(m.path))] = p.stat().st_size
    for key, t in served.expected.items():
        assert sizes[key.replace(".", "/")] == t.numel() * t.element_size(), key
    assert nginx.requests_for(served.uri, since) == []
