"""Shared fixtures. ``mount``: real FUSE mounts through the ``ckptfs mount`` command, always unmounted.

Mount tests skip only when FUSE is genuinely unavailable here (no /dev/fuse, no libfuse, no fusermount
for a non-root user) AND CKPTFS_REQUIRE_FUSE is not set; CI sets it, and then they fail instead. The
machinery (Mounter, require_fuse ...) is in tests/helpers.py; no module imports this one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from helpers import Mounter, require_fuse

#: fixtures of the directory formats (DCP, sharded checkpoints), written by the real writers; nginx, SeaweedFS
#: and a fault-injecting proxy (tests/servers.py); fixtures that change the machine (users, /etc/fuse.conf,
#: /etc/fstab, the mount(8) helper) and put it back
pytest_plugins = ["formats_fixtures", "remote_fixtures", "system_fixtures"]


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[Mounter]:
    """``mount(checkpoint, *mount_args, env=None) -> Mounted``; everything is unmounted afterwards."""
    require_fuse()
    m = Mounter(tmp_path / "mounts")
    try:
        yield m
    finally:
        m.cleanup()


@pytest.fixture(scope="module")
def module_mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mounter]:
    """Like ``mount``, shared by the tests of one module (mounting costs an interpreter start)."""
    require_fuse()
    m = Mounter(tmp_path_factory.mktemp("mounts"))
    try:
        yield m
    finally:
        m.cleanup()
