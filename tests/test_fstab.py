"""``mount -t fuse.ckptfs``, /etc/fstab lines and ``umount`` with the real mount(8) and umount(8): through the
mount.fuse.ckptfs helper and through fuse3's mount.fuse3 (``ckptfs SRC MNT -o OPTS``); the options mount(8)
and systemd add; errors; the systemd mount unit of docs/cli.md checked by systemd-analyze. The machine is put
back afterwards (tests/system_fixtures.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import is_mounted, mount_entry, pid_alive, torch_bytes, wait_gone
from system_fixtures import unavailable

pytestmark = pytest.mark.mount
DOCS = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


@pytest.fixture(scope="module")
def ckpt(system) -> tuple[Path, dict]:
    p = system.base / "model.pth"
    g = torch.Generator().manual_seed(1)
    torch.save({"enc": {"w": torch.randn(64, 8, generator=g)}, "step": 11}, p)
    os.chmod(p, 0o644)
    return p, torch.load(p)


def new_dir(system, name: str) -> Path:
    d = system.base / name
    d.mkdir()
    return d


def options_of(mnt: Path) -> set[str]:
    line = next(ln for ln in open("/proc/self/mountinfo") if f" {mnt} " in ln)
    left, _, right = line.partition(" - ")
    return set(left.split()[5].split(",")) | set(right.split()[2].split(","))


def daemon_pid(mnt: Path) -> int:
    return json.loads((mnt / ".ckptfs" / "mount.json").read_bytes())["pid"]


def umount(system, *mnts: Path) -> None:
    pids = [daemon_pid(m) for m in mnts]
    r = system.run("umount", *map(str, mnts), check=False)
    assert r.returncode == 0, r.stderr
    for m, pid in zip(mnts, pids, strict=True):
        assert not is_mounted(m)
        assert wait_gone(pid), f"the daemon of {m} did not exit after umount"


def test_mount_t_and_umount(system, ckpt, mount_helper):
    p, ref = ckpt
    mnt = new_dir(system, "t")
    # the options mount(8) and systemd keep for themselves, and FUSE's allow_other
    r = system.run("mount", "-t", "fuse.ckptfs", str(p), str(mnt), "-o",
                   "ro,allow_other,noauto,nofail,_netdev,x-systemd.automount,comment=ckptfs", check=False)
    assert r.returncode == 0 and r.stderr == "", (mount_helper, r.stderr)
    try:
        entry = mount_entry(mnt)
        assert (entry["fstype"], entry["source"]) == ("fuse.ckptfs", str(p))
        assert {"ro", "allow_other", "default_permissions"} <= options_of(mnt)
        assert (mnt / "enc/w").read_bytes() == torch_bytes(ref["enc"]["w"]) and (mnt / "step").read_bytes() == b"11"
        assert pid_alive(daemon_pid(mnt))
    finally:
        umount(system, mnt)


def test_fstab_lines_mount_a_and_noauto(system, ckpt, mount_helper, users):
    p, ref = ckpt
    owner, _ = users
    m1, m2 = new_dir(system, "fstab1"), new_dir(system, "fstab2")
    fstab = system.base / "fstab"
    fstab.write_text(f"# a test fstab\n{p} {m1} fuse.ckptfs ro,nofail,allow_other,uid={owner.name},umask=027 0 0\n"
                     f"{p} {m2} fuse.ckptfs ro,noauto,x-systemd.requires=network-online.target 0 0\n")
    if shutil.which("findmnt"):
        r = subprocess.run(["findmnt", "--verify", "--tab-file", str(fstab)], capture_output=True, text=True)
        assert "error" not in r.stdout.lower() or "0 errors" in r.stdout, r.stdout
    r = system.run("mount", "-a", "-T", str(fstab), check=False)
    assert r.returncode == 0, (mount_helper, r.stderr)
    try:
        assert is_mounted(m1) and not is_mounted(m2)  # noauto: not with -a
        st = (m1 / "enc/w").stat()
        assert (st.st_uid, st.st_mode & 0o777, (m1 / "enc").stat().st_mode & 0o777) == (owner.uid, 0o440, 0o550)
        r = system.run("mount", "-T", str(fstab), str(m2), check=False)  # by its mountpoint, as `mount /mnt/x`
        assert r.returncode == 0, r.stderr
        assert (m2 / "enc/w").read_bytes() == torch_bytes(ref["enc"]["w"])
    finally:
        umount(system, *(m for m in (m1, m2) if is_mounted(m)))


def test_defaults_relative_source_and_rw(system, ckpt, mount_helper):
    """mount(8) passes rw when no option says ro (no options, `defaults`): mounted read-only with a warning. A
    relative source is the file in mount's working directory."""
    p, ref = ckpt
    mnt = new_dir(system, "defaults")
    cmd = ["mount", "-t", "fuse.ckptfs", p.name, str(mnt)]
    r = subprocess.run([*system.priv, *cmd], capture_output=True, text=True, cwd=p.parent, timeout=120)
    assert r.returncode == 0, r.stderr
    try:
        assert "warning: mounted read-only" in r.stderr
        assert "ro" in options_of(mnt) and mount_entry(mnt)["source"] == str(p)
        with pytest.raises(OSError):
            (mnt / "step").write_bytes(b"12")
    finally:
        umount(system, mnt)


def test_mount8_errors(system, ckpt, mount_helper):
    p, _ = ckpt
    mnt = new_dir(system, "errors")
    for source, opts, msg in ((str(system.base / "missing.pth"), "ro", "missing.pth: No such file or directory"),
                              (str(p), "ro,umask=abc", "-o umask=abc: expected octal"),
                              (str(p), "ro,drop_privileges", "-o drop_privileges is not supported"),
                              (str(p), "ro,setuid=nosuchuser-x9", "no such user")):
        r = system.run("mount", "-t", "fuse.ckptfs", source, str(mnt), "-o", opts, check=False)
        assert r.returncode == 32, (opts, r.returncode, r.stderr)  # mount(8)'s "mount failure"
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ckptfs: ") and msg in lines[0], (opts, r.stderr)
        assert not is_mounted(mnt)


def test_through_mount_fuse3(system, ckpt, ckptfs_on_path):
    """No mount.fuse.ckptfs: mount(8) runs mount.fuse3, which runs `ckptfs SRC MNT -o OPTS` from PATH."""
    p, ref = ckpt
    mnt = new_dir(system, "fuse3")
    r = system.run("mount", "-t", "fuse.ckptfs", str(p), str(mnt), "-o", "ro,allow_other,nofail", check=False)
    assert r.returncode == 0, (ckptfs_on_path, r.stderr)
    try:
        info = json.loads((mnt / ".ckptfs/mount.json").read_bytes())
        assert info["options"].get("dev") and info["options"].get("suid")  # what mount.fuse3 adds: it came that way
        assert mount_entry(mnt)["fstype"] == "fuse.ckptfs"
        assert (mnt / "enc/w").read_bytes() == torch_bytes(ref["enc"]["w"])
    finally:
        umount(system, mnt)


def systemd_unit_from_docs() -> str:
    text = DOCS.read_text()
    m = re.search(r"<!-- systemd mount unit -->\s*```ini\n(.*?)```", text, re.S)
    assert m, "docs/cli.md has no systemd mount unit example"
    return m.group(1)


def test_the_docs_systemd_unit_verifies(system, ckpt, mount_helper):
    """The unit in docs/cli.md, for a real checkpoint and mountpoint, accepted by systemd-analyze verify. (systemd
    is not PID 1 here, so the unit cannot be started; systemd mounts it by running mount(8) as
    test_mount_t_and_umount does.)"""
    if not shutil.which("systemd-analyze") or not shutil.which("systemd-escape"):
        unavailable("systemd-analyze is not installed (Debian's systemd package: in APT_PACKAGES and .ci/run)")
    p, _ = ckpt
    mnt = new_dir(system, "unit")
    unit = systemd_unit_from_docs()
    assert re.search(r"^What=/\S+$", unit, re.M) and re.search(r"^Where=/\S+$", unit, re.M)
    unit = re.sub(r"^What=.*$", f"What={p}", unit, flags=re.M)
    unit = re.sub(r"^Where=.*$", f"Where={mnt}", unit, flags=re.M)
    name = subprocess.run(["systemd-escape", "--path", "--suffix=mount", str(mnt)], capture_output=True, text=True,
                          check=True).stdout.strip()
    path = system.base / "units" / name
    path.parent.mkdir()
    path.write_text(unit)
    r = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Type=fuse.ckptfs" in unit
    # a mistake is noticed (the check is not vacuous)
    path.write_text(unit.replace(f"Where={mnt}", f"Where={mnt}-elsewhere"))
    assert subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True).returncode != 0
