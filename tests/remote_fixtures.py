"""Real servers for the remote tests, on loopback and free ports, always stopped: nginx (HTTP, HTTPS, basic
auth, a 503 switch, a location without byte ranges, a redirect), SeaweedFS (S3) and a fault-injecting TCP
proxy (stall, reset, delay). A server that cannot start skips its tests, except in CI (CKPTFS_CI set), where
it fails them. Registered as a plugin in conftest.py; the machinery is in tests/servers.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from servers import FaultProxy, Nginx, SeaweedS3, server_unavailable


@pytest.fixture(scope="session")
def nginx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nginx]:
    """One nginx for the session: put files under ``nginx.root``; ``nginx.url(name)``; ``nginx.log()``."""
    server = Nginx(tmp_path_factory.mktemp("nginx"))
    try:
        server.start()
    except Exception as e:  # noqa: BLE001 - reported as a skip (fail in CI)
        server.stop()
        server_unavailable(f"nginx could not start: {e}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def own_nginx(tmp_path: Path) -> Iterator[Nginx]:
    """An nginx of this test's own (to stop and restart)."""
    server = Nginx(tmp_path / "nginx")
    try:
        server.start()
    except Exception as e:  # noqa: BLE001
        server.stop()
        server_unavailable(f"nginx could not start: {e}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def proxy() -> Iterator[type[FaultProxy]]:
    """``proxy(upstream_port)`` -> a started FaultProxy; every one made is stopped afterwards."""
    made: list[FaultProxy] = []

    class Made(FaultProxy):
        def __init__(self, upstream_port: int) -> None:
            super().__init__(upstream_port)
            made.append(self)
            self.start()

    try:
        yield Made
    finally:
        for p in made:
            p.stop()


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """One SeaweedFS S3 gateway for the session (bucket ``seaweed.bucket``; ``seaweed.env()`` for clients)."""
    server = SeaweedS3(tmp_path_factory.mktemp("seaweed"))
    try:
        server.start()
    except Exception as e:  # noqa: BLE001
        server.stop()
        server_unavailable(f"SeaweedFS could not start: {e}")
    try:
        yield server
    finally:
        server.stop()
