"""``ckptfs mount`` / ``ckptfs umount`` as a user meets them: daemon and foreground modes, signals, stale
mounts, one-line errors, options, and a checkpoint that changes under a live mount."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch
from helpers import (
    CKPTFS,
    Mounted,
    is_mounted,
    mount_entry,
    pid_alive,
    require_fuse,
    run_ckptfs,
    torch_bytes,
    wait_gone,
)

from ckptfs.mount import daemon as mountmod

pytestmark = pytest.mark.mount


@pytest.fixture
def ckpt(tmp_path) -> Path:
    p = tmp_path / "model.pth"
    g = torch.Generator().manual_seed(0)
    torch.save({"layer1": {"0": {"conv1.weight": torch.randn(64, 64, 3, 3, generator=g)}},
                "fc.weight": torch.randn(1024, 1024, generator=g), "fc.bias": torch.randn(1024, generator=g),
                "epoch": 3}, p)
    return p


def one_line_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode != 0, r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptfs: "), r.stderr
    return lines[0]


def wait_mounted(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if is_mounted(path):
            try:
                if os.listdir(path):
                    return
            except OSError:
                pass
        time.sleep(0.02)
    raise AssertionError(f"{path} did not get mounted")


# --- daemon / foreground lifecycle ----------------------------------------------------------------------------------


def test_daemon_returns_only_when_ready(ckpt, mount):
    dev = os.stat(ckpt.parent).st_dev
    for _ in range(3):
        m = mount(ckpt)
        # the command has returned: the mount must answer right now, without any waiting
        assert is_mounted(m.path) and os.stat(m.path).st_dev != dev
        assert sorted(os.listdir(m.path)) == [".ckptfs", "epoch", "fc", "layer1"]
        assert (m / "fc/bias").stat().st_size == 4096 and pid_alive(m.pid)
    assert mount_entry(m.path)["source"] == str(ckpt)


def test_sigterm_unmounts_the_daemon(ckpt, mount):
    m = mount(ckpt)
    os.kill(m.pid, signal.SIGTERM)
    assert wait_gone(m.pid), "the daemon did not exit on SIGTERM"
    assert not is_mounted(m.path) and os.listdir(m.path) == []
    assert "unmounted" in m.log.read_text()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_foreground_unmounts_on_signal(ckpt, tmp_path, sig):
    require_fuse()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.Popen([*CKPTFS, "mount", "-f", str(ckpt), str(mnt)], stderr=subprocess.PIPE, text=True)
    try:
        wait_mounted(mnt)
        assert (mnt / "fc/weight").read_bytes()[:8] == torch_bytes(torch.load(ckpt)["fc.weight"])[:8]
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert not is_mounted(mnt)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)


def test_killed_daemon_leaves_a_stale_mount_that_umount_clears(ckpt, mount):
    m = mount(ckpt)
    os.kill(m.pid, signal.SIGKILL)
    assert wait_gone(m.pid)
    with pytest.raises(OSError) as e:
        os.listdir(m.path)
    assert e.value.errno == errno.ENOTCONN  # "Transport endpoint is not connected"
    assert is_mounted(m.path)
    line = one_line_error(run_ckptfs("mount", str(ckpt), str(m.path)))
    assert "stale mount" in line and f"ckptfs umount {m.path}" in line
    r = run_ckptfs("umount", str(m.path))
    assert r.returncode == 0 and "stale" in r.stdout, r.stderr
    assert not is_mounted(m.path)
    m2 = mount(ckpt)  # the directory is usable again
    assert (m2 / "epoch").read_bytes() == b"3"


def test_umount_live_waits_for_the_daemon(ckpt, mount):
    m = mount(ckpt)
    r = run_ckptfs("umount", str(m.path))
    assert r.returncode == 0 and r.stdout.strip() == f"ckptfs: {m.path}: unmounted", r.stderr
    assert not pid_alive(m.pid) and not is_mounted(m.path)


def test_umount_of_a_busy_mount_detaches_lazily(ckpt, mount):
    m = mount(ckpt)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1], 'rb'); time.sleep(60)",
                               str(m / "fc/weight")])
    try:
        time.sleep(0.5)
        r = run_ckptfs("umount", str(m.path))
        assert r.returncode == 0 and "lazily detached" in r.stdout and "busy" in r.stdout, (r.stdout, r.stderr)
        assert not is_mounted(m.path)
    finally:
        holder.kill()
        holder.wait()
    assert wait_gone(m.pid), "the daemon did not exit once the last user closed the file"


def test_umount_errors(tmp_path):
    line = one_line_error(run_ckptfs("umount", str(tmp_path)))
    assert line.endswith(f"{tmp_path}: not mounted")
    line = one_line_error(run_ckptfs("umount", str(tmp_path / "nope")))
    assert "no such directory" in line
    if os.geteuid() == 0 and shutil.which("mount"):
        other = tmp_path / "tmpfs"
        other.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "none", str(other)], capture_output=True).returncode == 0:
            try:
                line = one_line_error(run_ckptfs("umount", str(other)))
                assert "tmpfs mount, not a FUSE mount" in line and is_mounted(other)
            finally:
                subprocess.run(["umount", str(other)], check=True)


# --- mount errors: one line, non-zero -------------------------------------------------------------------------------


def test_mount_errors_are_one_line(ckpt, tmp_path, mount):
    require_fuse()
    empty = tmp_path / "empty"
    empty.mkdir()
    line = one_line_error(run_ckptfs("mount", str(tmp_path / "missing.pth"), str(empty)))
    assert "missing.pth: No such file or directory" in line
    notes = tmp_path / "notes"  # a directory, but no checkpoint in it
    notes.mkdir()
    (notes / "readme.md").write_text("hi")
    line = one_line_error(run_ckptfs("mount", str(notes), str(empty)))
    assert "notes: no checkpoint in this directory" in line
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"not a checkpoint at all" * 10)
    assert "junk.pth" in one_line_error(run_ckptfs("mount", str(junk), str(empty)))
    line = one_line_error(run_ckptfs("mount", str(ckpt), str(tmp_path / "nodir")))
    assert "mountpoint does not exist" in line
    line = one_line_error(run_ckptfs("mount", str(ckpt), str(ckpt)))
    assert "not a directory" in line
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    assert "not empty" in one_line_error(run_ckptfs("mount", str(ckpt), str(full)))
    m = mount(ckpt)
    line = one_line_error(run_ckptfs("mount", str(ckpt), str(m.path)))
    assert "already mounted" in line and "ckptfs umount" in line
    assert "read-only" in one_line_error(run_ckptfs("mount", "-o", "rw", str(ckpt), str(empty)))
    assert os.listdir(empty) == [] and not is_mounted(empty)


def test_missing_fuse_pieces_are_named(tmp_path, monkeypatch):
    with pytest.raises(mountmod.MountError, match=r"/nonexistent/fuse is missing.*modprobe fuse"):
        mountmod.check_fuse({}, device="/nonexistent/fuse")
    from ckptfs.mount import fuse_ops

    monkeypatch.setattr(fuse_ops, "find_library", lambda name: None)
    monkeypatch.delenv("FUSE_LIBRARY_PATH", raising=False)
    monkeypatch.delenv("FUSE_LIBRARY_NAME", raising=False)
    with pytest.raises(mountmod.MountError, match="libfuse is not installed: install the fuse3 package"):
        mountmod.check_fuse({}, device=os.devnull)
    monkeypatch.setenv("CKPTFS_FUSE", "3")
    with pytest.raises(mountmod.MountError, match="libfuse3 is not installed: install the fuse3 package"):
        mountmod.check_fuse({}, device=os.devnull)


def test_allow_other_needs_user_allow_other(tmp_path):
    require_fuse()
    conf = tmp_path / "fuse.conf"
    conf.write_text("#user_allow_other\nmount_max = 10\n")
    with pytest.raises(mountmod.MountError, match=r"allow_other needs a line 'user_allow_other' in .*fuse.conf"):
        mountmod.check_fuse({"allow_other": True}, device=os.devnull, euid=1000, conf=str(conf))
    conf.write_text("user_allow_other\n")
    mountmod.check_fuse({"allow_other": True}, device=os.devnull, euid=1000, conf=str(conf))


def test_no_dev_fuse_in_a_namespace(ckpt, tmp_path):
    """Hide /dev/fuse for real (a private mount namespace) and ask for a mount."""
    require_fuse()
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare to hide /dev/fuse")
    empty = tmp_path / "empty"
    empty.mkdir()
    script = f"mount -t tmpfs none /dev && exec {sys.executable} -m ckptfs.cli mount {ckpt} {empty}"
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], capture_output=True,
                       text=True, timeout=60)
    if "unshare failed" in r.stderr or "Operation not permitted" in r.stderr:
        pytest.skip(f"unshare is not permitted here: {r.stderr.strip()}")
    line = one_line_error(r)
    assert "FUSE is not available: /dev/fuse is missing" in line


def test_options_pass_through(ckpt, mount):
    other = os.geteuid() == 0 or mountmod.user_allow_other()  # else ckptfs refuses it (tested below)
    m = mount(ckpt, "-o", ("allow_other," if other else "") + "attr_timeout=5", "-o", "max_read=131072")
    assert mount_entry(m.path)["fstype"] == "fuse.ckptfs"
    if other:
        line = next(ln for ln in open("/proc/self/mountinfo") if f" {m.path} " in ln)
        assert "allow_other" in line
    info = json.loads((m / ".ckptfs/mount.json").read_bytes())
    assert info["options"] == {**({"allow_other": True} if other else {}), "attr_timeout": "5", "max_read": "131072"}
    assert (m / "epoch").read_bytes() == b"3"


def test_parse_options():
    assert mountmod.parse_options(["a,b=c", "d", "fsname=x\\,y"]) == {"a": True, "b": "c", "d": True, "fsname": "x,y"}


def test_debug_logs_fuse_calls(ckpt, mount):
    m = mount(ckpt, "-d")
    os.listdir(m / "fc")
    (m / "epoch").read_bytes()
    log = m.log.read_text()
    assert "opendir('/fc',)" in log and "listing(" in log and "open('/epoch'" in log
    # the read: through read_buf (libfuse3: bytes by descriptor or literal), or read_into (libfuse2, -o nosplice)
    assert "read /epoch [0, +" in log or "read_into(" in log


def test_foreground_debug_writes_to_stderr(ckpt, tmp_path):
    require_fuse()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.Popen([*CKPTFS, "mount", "-d", str(ckpt), str(mnt)], stderr=subprocess.PIPE, text=True)
    try:
        wait_mounted(mnt)  # -d alone implies foreground
        (mnt / "epoch").read_bytes()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and "open('/epoch'" in err and not is_mounted(mnt)


# --- the checkpoint changes while mounted ----------------------------------------------------------------------------


def read_error(path: Path, offset: int = 0, n: int = 4096) -> int | None:
    try:
        with open(path, "rb") as f:
            os.pread(f.fileno(), n, offset)
    except OSError as e:
        return e.errno
    return None


def assert_still_serving(m: Mounted) -> None:
    assert pid_alive(m.pid)
    assert sorted(os.listdir(m.path)) == [".ckptfs", "epoch", "fc", "layer1"]
    assert json.loads((m / "fc/weight.json").read_bytes())["shape"] == [1024, 1024]
    assert (m / "epoch").read_bytes() == b"3"


def test_truncated_checkpoint_gives_eio_and_logs_why(ckpt, mount):
    m = mount(ckpt)
    want = torch_bytes(torch.load(ckpt)["fc.weight"])
    f = open(m / "fc/weight", "rb")
    assert os.pread(f.fileno(), 4096, 0) == want[:4096]
    os.truncate(ckpt, os.path.getsize(ckpt) // 2)
    assert read_error(m / "fc/weight") == errno.EIO  # a new open
    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # nothing cached: this read reaches the daemon
    with pytest.raises(OSError) as e:
        os.pread(f.fileno(), 4096, 3 << 20)
    assert e.value.errno == errno.EIO
    f.close()
    assert "truncated" in m.log.read_text()
    assert_still_serving(m)


def test_rewritten_in_place_gives_eio(ckpt, mount):
    m = mount(ckpt)
    assert read_error(m / "fc/bias") is None
    data = bytearray(ckpt.read_bytes())
    data[-5000:-4000] = b"\xff" * 1000
    with open(ckpt, "r+b") as f:  # same inode, same size, other bytes
        f.write(data)
    st = os.stat(ckpt)
    os.utime(ckpt, ns=(st.st_atime_ns, st.st_mtime_ns + 10_000_000))  # a later write; never the same tick
    assert read_error(m / "fc/bias") == errno.EIO
    assert "modified" in m.log.read_text()
    assert_still_serving(m)


@pytest.mark.parametrize("how", ["replaced", "deleted"])
def test_replaced_or_deleted_checkpoint_gives_eio(ckpt, mount, how):
    m = mount(ckpt)
    assert read_error(m / "fc/bias") is None
    if how == "replaced":
        other = ckpt.with_name("other.pth")
        torch.save({"fc.bias": torch.zeros(1024)}, other)
        os.replace(other, ckpt)
    else:
        ckpt.unlink()
    assert read_error(m / "fc/bias") == errno.EIO
    assert read_error(m / "layer1/0/conv1/weight") == errno.EIO
    assert how in m.log.read_text()
    assert_still_serving(m)


def test_a_broken_record_fails_only_its_file(tmp_path, mount):
    """A deflated record with corrupt data: reads of that tensor fail with EIO, the rest is served."""
    p = tmp_path / "plain.pth"
    good, bad = torch.randn(1000), torch.randn(200_000)
    torch.save({"good": good, "bad": bad}, p)
    q = tmp_path / "deflated.pth"
    with zipfile.ZipFile(p) as zin, zipfile.ZipFile(q, "w") as zout:
        for info in zin.infolist():
            method = zipfile.ZIP_DEFLATED if info.filename.endswith("data/1") else zipfile.ZIP_STORED
            zout.writestr(info.filename, zin.read(info.filename), compress_type=method)
    with zipfile.ZipFile(q) as z:
        rec = next(i for i in z.infolist() if i.filename.endswith("data/1"))
        start = rec.header_offset + 30 + len(rec.filename.encode()) + len(rec.extra)
    raw = bytearray(q.read_bytes())
    for i in range(start + 2000, start + rec.compress_size - 100, 997):
        raw[i] ^= 0x5A
    q.write_bytes(raw)
    m = mount(q)
    assert read_error(m / "bad", 0, 1 << 20) == errno.EIO
    assert (m / "good").read_bytes() == torch_bytes(good)
    assert read_error(m / "bad", 0, 1 << 20) == errno.EIO
    assert pid_alive(m.pid) and "read /bad" in m.log.read_text()


def test_limits_are_given_to_a_mount_as_to_every_command(tmp_path, mount):
    """A checkpoint over a default limit (500k tensors) must be mountable: --limit on the command line, and
    -o limit.NAME=VALUE for an /etc/fstab line."""
    p = tmp_path / "many.pth"
    torch.save({f"p{i}": torch.full((2,), float(i)) for i in range(40)}, p)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    line = one_line_error(run_ckptfs("mount", "--limit", "max_tensors=10", str(p), str(mnt)))
    assert "more than 10 tensors" in line and "max_tensors" in line and not is_mounted(mnt)
    line = one_line_error(run_ckptfs("mount", "-o", "limit.max_tensors=10", str(p), str(mnt)))
    assert "more than 10 tensors" in line and not is_mounted(mnt)
    line = one_line_error(run_ckptfs("mount", "-o", "limit.max_cats=10", str(p), str(mnt)))
    assert "-o limit.max_cats: not a limit" in line
    m = mount(p, "--limit", "max_tensors=10", "-o", "limit.max_tensors=100")  # -o applies over --limit
    assert (m.path / "p39").read_bytes() == torch_bytes(torch.full((2,), 39.0))
    assert len([n for n in os.listdir(m.path) if not n.endswith(".json")]) == 41  # (and .ckptfs)


def test_a_listing_is_made_only_as_far_as_readdir_asks():
    """The first entries of a million-entry directory come without making the million (``ls`` answers at
    once); the whole listing is the same."""
    from ckptfs.mount.fuse_ops import Listing

    made = []

    def entries():
        for i in range(1_000_000):
            made.append(i)
            yield f"p{i}", i

    listing = Listing(entries())
    assert listing.at(0) == ("p0", 0) and listing.at(100) == ("p100", 100)
    assert len(made) <= 512
    assert listing.at(1_000_000) is None and len(made) == 1_000_000
    assert listing.all()[-1] == ("p999999", 999999) and len(listing.all()) == 1_000_000
