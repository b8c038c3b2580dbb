"""Faults with real servers: a stalled server (a proxy that holds every byte), connections reset (the proxy
sends RST), 503 answers (nginx), the server stopped and started again under a mount, and the object replaced
under a mount. Expected bytes come from torch.load of the served file; retries are read from nginx's log."""

from __future__ import annotations

import errno
import os
import threading
import time

import pytest
from helpers import remote_state_dict, save, torch_bytes, torch_tensors

import ckptfs
from ckptfs.source.remote import RemoteOptions

NAME = "faults-m.pth"


@pytest.fixture(scope="module")
def expected(tmp_path_factory):
    path = save(tmp_path_factory.mktemp("faults") / NAME, remote_state_dict())
    return path, torch_tensors(path)


@pytest.fixture
def served(nginx, expected):
    path, tensors = expected
    (nginx.root / NAME).write_bytes(path.read_bytes())
    return tensors


def test_a_stalled_server_fails_the_read_after_the_timeout_then_recovers(nginx, served, proxy):
    p = proxy(nginx.port)
    with ckptfs.open(p.url(NAME), remote=RemoteOptions(timeout=1.5)) as ckpt:
        p.stall = True
        with pytest.raises(ckptfs.RemoteError, match=r"(no answer|timed out).*timeout is 1.5 s|timed out after 1.5 s"):
            ckpt.read("big")
        p.stall = False
        assert ckpt.read("big") == torch_bytes(served["big"])


def test_reset_connections_are_retried(nginx, served, proxy):
    p = proxy(nginx.port)
    p.resets, p.reset_after = 2, 100_000  # the first two connections die mid-answer
    since = len(nginx.log())
    with ckptfs.open(p.url(NAME)) as ckpt:
        opening = [e for e in nginx.requests_for(f"/{NAME}", since) if e["range"] == "bytes=0-1048575"]
        assert len(opening) == 3, opening  # two reset, the third answered
        p.drop_connections()  # the pooled connection is gone (as after a server restart) ...
        p.resets = 1  # ... and the next new one is reset too
        assert ckpt.read("big") == torch_bytes(served["big"])
        assert ckpt.read("mid") == torch_bytes(served["mid"])
    assert p.connections >= 5


def test_connections_the_server_closed_while_idle_cost_no_retry(tmp_path, caplog):
    """nginx closes connections idle for 1 s (Apache's default is 5 s): after a pause, a read takes a live
    connection or makes one at once, instead of trying the dead ones one by one with a backoff between."""
    import torch
    from servers import Nginx

    server = Nginx(tmp_path / "nginx")
    server.keepalive_timeout = "1s"
    sd = {"big": torch.randn(10_000_000, generator=torch.Generator().manual_seed(3))}
    server.root.mkdir(parents=True)
    save(server.root / NAME, sd)
    try:
        server.start()
        with ckptfs.open(server.url(NAME)) as ckpt:
            assert ckpt.read("big") == torch_bytes(sd["big"])  # 8 MiB parts in parallel: several connections
            since = len(server.log())
            assert len({e["conn"] for e in server.log()}) >= 3
            time.sleep(2.5)  # every pooled connection is closed by nginx meanwhile
            caplog.set_level("INFO", logger="ckptfs.remote")
            rows = ckpt.slice("big")
            for i in range(1, 4):
                j = i * 2_000_000
                assert rows[j : j + 10].tobytes() == torch_bytes(sd["big"][j : j + 10])
        assert not [r.message for r in caplog.records if "retrying" in r.message]
        assert len(server.log()[since:]) == 3  # one request per read
    finally:
        server.stop()


def test_503_answers_are_retried_with_backoff(own_nginx, expected):
    path, tensors = expected
    (own_nginx.root / NAME).write_bytes(path.read_bytes())
    own_nginx.fail_503(True)
    timer = threading.Timer(0.8, own_nginx.fail_503, (False,))
    timer.start()
    try:
        with ckptfs.open(own_nginx.url(NAME), remote=RemoteOptions(timeout=20)) as ckpt:
            assert ckpt.read("big") == torch_bytes(tensors["big"])
    finally:
        timer.cancel()
        own_nginx.fail_503(False)
    statuses = [e["status"] for e in own_nginx.requests_for(f"/{NAME}")]
    assert statuses[0] == 503 and 206 in statuses, statuses
    first_ok = statuses.index(206)
    assert set(statuses[:first_ok]) == {503} and 2 <= first_ok < 20, statuses  # backoff: a few, not hundreds


@pytest.mark.slow
@pytest.mark.mount
def test_mount_survives_the_server_going_away_and_coming_back(mount, own_nginx, expected):
    path, tensors = expected
    (own_nginx.root / NAME).write_bytes(path.read_bytes())
    m = mount(own_nginx.url(NAME), "--timeout", "2")
    assert (m.path / "mid").read_bytes() == torch_bytes(tensors["mid"])
    own_nginx.stop()
    with pytest.raises(OSError) as e:
        (m.path / "big").read_bytes()
    assert e.value.errno == errno.EIO
    assert "big" in os.listdir(m.path)  # the daemon keeps serving what needs no server
    assert (m.path / "mid").read_bytes() == torch_bytes(tensors["mid"])  # (from the kernel's page cache)
    own_nginx.restart()
    assert (m.path / "big").read_bytes() == torch_bytes(tensors["big"])
    log = m.log.read_text()
    assert "connection refused" in log and "--timeout is 2 s" in log, log


@pytest.mark.mount
def test_a_stalled_server_under_a_mount_fails_a_read_after_the_timeout_not_twice_it(mount, nginx, served,
                                                                                    proxy):
    """The kernel reads a page again at once when its read-ahead failed: that second read must not wait a
    whole --timeout again (EIO after about --timeout); the mount then reads again once the server is back."""
    p = proxy(nginx.port)
    timeout = 3.0
    m = mount(p.url(NAME), "--timeout", str(timeout))
    assert (m.path / "mid").read_bytes() == torch_bytes(served["mid"])
    p.stall = True
    t0 = time.monotonic()
    with open(m.path / "big", "rb") as f, pytest.raises(OSError) as e:
        os.pread(f.fileno(), 1 << 20, 4 << 20)  # (past the object's first MiB, fetched when it was opened)
    took = time.monotonic() - t0
    assert e.value.errno == errno.EIO
    assert timeout * 0.9 < took < timeout * 1.6, f"EIO after {took:.1f} s with --timeout {timeout:g}"
    p.stall = False
    time.sleep(0.2)
    assert (m.path / "big").read_bytes() == torch_bytes(served["big"])


@pytest.mark.mount
def test_an_object_replaced_under_a_mount_gives_eio(mount, nginx, expected):
    path, tensors = expected
    name = "faults-replaced.pth"
    (nginx.root / name).write_bytes(path.read_bytes())
    m = mount(nginx.url(name))
    assert (m.path / "tail").read_bytes() == torch_bytes(tensors["tail"])
    other = {k: (v * 2 if hasattr(v, "is_floating_point") and v.is_floating_point() else v)
             for k, v in remote_state_dict().items()}
    tmp = nginx.root / (name + ".new")
    save(tmp, other)
    st = (nginx.root / name).stat()
    os.utime(tmp, (st.st_atime + 5, st.st_mtime + 5))
    os.replace(tmp, nginx.root / name)
    with pytest.raises(OSError) as e:
        (m.path / "big").read_bytes()
    assert e.value.errno == errno.EIO
    with pytest.raises(OSError) as e:
        (m.path / "emb" / "weight").read_bytes()
    assert e.value.errno == errno.EIO
    deadline = time.monotonic() + 10
    while "replaced while in use" not in m.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "replaced while in use" in m.log.read_text()


def test_a_fork_while_fetches_are_in_flight(nginx, served, proxy):
    """What the mount daemon's fork must survive: the parent's fetches (threads, locks, connections) do not
    exist in the child, which fetches again itself."""
    p = proxy(nginx.port)
    expected = torch_bytes(served["big"])
    got: list[bytes] = []
    with ckptfs.open(p.url(NAME), remote=RemoteOptions(timeout=8)) as ckpt:
        p.stall = True
        t = threading.Thread(target=lambda: got.append(ckpt.read("big")))
        t.start()
        time.sleep(0.3)  # its blocks are now being fetched (held by the proxy)
        pid = os.fork()
        if pid == 0:
            try:
                ok = ckpt.read("big") == expected
            except BaseException:  # noqa: BLE001
                ok = False
            os._exit(0 if ok else 3)
        p.stall = False
        t.join(30)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert got == [expected]
