"""Mounts made by an ordinary user, with real users (useradd) and fusermount3: private by default, allow_other
only where /etc/fuse.conf allows it (else a one-line error saying what to change), permissions as the mount
defines them (owner, umask, gid), another user refused what they were not allowed, a ``user`` line in
/etc/fstab mounted and unmounted by the user with mount(8) / umount(8). The machine is put back afterwards
(tests/system_fixtures.py)."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest
import torch
from helpers import is_mounted, mount_entry, torch_bytes

pytestmark = pytest.mark.mount


@pytest.fixture(scope="module")
def ckpt(system) -> tuple[Path, dict]:
    p = system.base / "model.pth"
    g = torch.Generator().manual_seed(0)
    sd = {"fc": {"weight": torch.randn(32, 16, generator=g), "bias": torch.randn(32, generator=g)}, "epoch": 7}
    torch.save(sd, p)
    os.chmod(p, 0o644)
    return p, torch.load(p)


def mountpoint(system, owner, name: str) -> Path:
    mnt = system.base / name
    mnt.mkdir()
    os.chown(mnt, owner.uid, owner.gid)
    return mnt


def stat_as(user, *paths: Path) -> list[tuple[int, int, int]]:
    """(uid, gid, permission bits) of each path, as ``user`` sees them (coreutils stat)."""
    r = user.run("stat", "-c", "%u %g %a", *map(str, paths))
    assert r.returncode == 0, r.stderr
    return [tuple(int(x, 8 if i == 2 else 10) for i, x in enumerate(line.split())) for line in r.stdout.splitlines()]


def read_as(user, path: Path) -> tuple[int, bytes, str]:
    r = user.run("cat", str(path), text=False)
    return r.returncode, r.stdout, r.stderr.decode(errors="replace")


def one_line_error(r) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ckptfs: "), r.stderr
    return lines[0]


def unmount_as(user, mnt: Path) -> None:
    r = user.ckptfs("umount", str(mnt))
    assert r.returncode == 0, r.stderr
    assert not is_mounted(mnt)


def test_dev_fuse_closed_to_users_is_one_line_saying_what_to_change(system, users, ckpt, dev_fuse_closed):
    """/dev/fuse made 0600 for this test (as in containers and minimal VMs; put back afterwards)."""
    owner, _ = users
    assert stat.S_IMODE(os.stat("/dev/fuse").st_mode) == 0o600
    mnt = mountpoint(system, owner, "closed")
    line = one_line_error(owner.ckptfs("mount", str(ckpt[0]), str(mnt)))
    assert "/dev/fuse has mode 0600" in line and "chmod 0666 /dev/fuse" in line, line
    assert not is_mounted(mnt)


def test_a_user_mount_is_private(system, users, ckpt, dev_fuse_for_users, fuse_conf):
    owner, other = users
    fuse_conf(False)
    p, ref = ckpt
    mnt = mountpoint(system, owner, "private")
    r = owner.ckptfs("mount", str(p), str(mnt))
    assert r.returncode == 0, r.stderr
    try:
        entry = mount_entry(mnt)
        assert entry["fstype"] == "fuse.ckptfs" and entry["source"] == str(p)
        assert f"user_id={owner.uid}" in open("/proc/self/mountinfo").read().split(f" {mnt} ", 1)[1].splitlines()[0]
        # the owner sees its files as the mount defines them: owned by the owner, read-only modes
        assert stat_as(owner, mnt, mnt / "fc", mnt / "fc/weight", mnt / "epoch") == [
            (owner.uid, owner.gid, 0o555), (owner.uid, owner.gid, 0o555), (owner.uid, owner.gid, 0o444),
            (owner.uid, owner.gid, 0o444)]
        code, data, _ = read_as(owner, mnt / "fc/weight")
        assert code == 0 and data == torch_bytes(ref["fc"]["weight"])
        # nobody else gets in: another user, and root too (FUSE refuses other users without allow_other)
        code, data, err = read_as(other, mnt / "fc/weight")
        assert code != 0 and data == b"" and "Permission denied" in err
        assert other.run("ls", str(mnt)).returncode != 0
        if os.geteuid() == 0:
            with pytest.raises(PermissionError) as e:
                os.listdir(mnt)
            assert e.value.errno == errno.EACCES
        info = json.loads(owner.run("cat", str(mnt / ".ckptfs/mount.json")).stdout)
        assert pwd_uid(info["pid"]) == owner.uid  # the daemon runs as the owner
    finally:
        unmount_as(owner, mnt)


def pwd_uid(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("Uid:")).split()[1])


def test_allow_other_without_user_allow_other_says_what_to_change(system, users, ckpt, dev_fuse_for_users, fuse_conf):
    owner, _ = users
    fuse_conf(False)
    mnt = mountpoint(system, owner, "refused")
    line = one_line_error(owner.ckptfs("mount", "-o", "allow_other", str(ckpt[0]), str(mnt)))
    assert "-o allow_other needs a line 'user_allow_other' in /etc/fuse.conf" in line, line
    assert not is_mounted(mnt)


@pytest.mark.slow
def test_allow_other_and_permissions_the_mount_defines(system, users, ckpt, dev_fuse_for_users, fuse_conf):
    owner, other = users
    fuse_conf(True)
    p, ref = ckpt
    want = torch_bytes(ref["fc"]["bias"])
    # allow_other: everyone may read (modes 0444 / 0555, checked by the kernel: default_permissions)
    mnt = mountpoint(system, owner, "shared")
    r = owner.ckptfs("mount", "-o", "allow_other", str(p), str(mnt))
    assert r.returncode == 0, r.stderr
    try:
        assert read_as(other, mnt / "fc/bias")[:2] == (0, want)
        assert stat_as(other, mnt / "fc/bias") == [(owner.uid, owner.gid, 0o444)]
        if os.geteuid() == 0:
            assert (mnt / "fc/bias").read_bytes() == want
    finally:
        unmount_as(owner, mnt)
    # allow_other with umask=027: the owner's group may read, others may not
    mnt = mountpoint(system, owner, "group-only")
    r = owner.ckptfs("mount", "-o", "allow_other,umask=027", str(p), str(mnt))
    assert r.returncode == 0, r.stderr
    try:
        assert stat_as(owner, mnt, mnt / "fc/bias") == [(owner.uid, owner.gid, 0o550), (owner.uid, owner.gid, 0o440)]
        assert read_as(owner, mnt / "fc/bias")[:2] == (0, want)
        code, _, err = read_as(other, mnt / "fc/bias")
        assert code != 0 and "Permission denied" in err
    finally:
        unmount_as(owner, mnt)
    # ... and with gid= set to the other user's group, that user may read
    mnt = mountpoint(system, owner, "their-group")
    r = owner.ckptfs("mount", "-o", f"allow_other,umask=027,gid={other.name}", str(p), str(mnt))
    assert r.returncode == 0, r.stderr
    try:
        assert stat_as(other, mnt / "fc/bias") == [(owner.uid, other.gid, 0o440)]
        assert read_as(other, mnt / "fc/bias")[:2] == (0, want)
    finally:
        unmount_as(owner, mnt)


def test_a_user_line_in_fstab(system, users, ckpt, mount_helper, dev_fuse_for_users, fstab_lines):
    """`SRC MNT fuse.ckptfs ro,user,noauto 0 0`: the user mounts it with mount(8) and unmounts it with umount(8)."""
    owner, other = users
    p, ref = ckpt
    mnt = mountpoint(system, owner, "fstab-user")
    fstab_lines(f"{p} {mnt} fuse.ckptfs ro,user,noauto,umask=022 0 0")
    r = owner.run("mount", str(mnt))
    assert r.returncode == 0, (mount_helper, r.stderr)
    try:
        entry = mount_entry(mnt)
        assert entry["fstype"] == "fuse.ckptfs" and entry["source"] == str(p)
        assert stat_as(owner, mnt / "fc/weight") == [(owner.uid, owner.gid, 0o444)]
        assert read_as(owner, mnt / "fc/weight")[:2] == (0, torch_bytes(ref["fc"]["weight"]))
        assert read_as(other, mnt / "fc/weight")[0] != 0  # no allow_other: private to the user
        r = other.run("umount", str(mnt))
        assert r.returncode != 0 and is_mounted(mnt)  # not theirs to unmount
        r = owner.run("umount", str(mnt))
        assert r.returncode == 0, r.stderr
        assert not is_mounted(mnt)
    finally:
        if is_mounted(mnt):
            system.run("umount", "-l", str(mnt), check=False)


def test_setuid_runs_the_mount_as_the_user(system, users, ckpt, mount_helper, dev_fuse_for_users):
    """As root, `mount -t fuse.ckptfs ... -o setuid=USER` (mount.fuse3's option): USER owns the mount."""
    owner, _ = users
    p, ref = ckpt
    mnt = mountpoint(system, owner, "setuid")
    r = system.run("mount", "-t", "fuse.ckptfs", str(p), str(mnt), "-o", f"ro,setuid={owner.name}", check=False)
    assert r.returncode == 0, (mount_helper, r.stderr)
    try:
        line = next(ln for ln in open("/proc/self/mountinfo") if f" {mnt} " in ln)
        assert f"user_id={owner.uid}" in line
        assert read_as(owner, mnt / "fc/bias")[:2] == (0, torch_bytes(ref["fc"]["bias"]))
        info = json.loads(owner.run("cat", str(mnt / ".ckptfs/mount.json")).stdout)
        assert pwd_uid(info["pid"]) == owner.uid
    finally:
        r = system.run("umount", str(mnt), check=False)
    assert r.returncode == 0 and not is_mounted(mnt), r.stderr



