"""URL shapes met in the wild, against a real nginx: IPv6 hosts; bytes compared with torch.load of the file
nginx serves."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest
from helpers import remote_state_dict, run_ckptfs, save, torch_bytes, torch_tensors

import ckptfs
from ckptfs.source.urls import chain, is_url, redact_url, scheme

NAME = "urls-m.pth"


@pytest.fixture(scope="module")
def served(nginx, tmp_path_factory):
    local = save(tmp_path_factory.mktemp("urls") / NAME, remote_state_dict())
    shutil.copy(local, nginx.root / NAME)
    (nginx.root / "my models").mkdir(exist_ok=True)
    shutil.copy(local, nginx.root / "my models" / "ré sumé.pth")
    (nginx.root / "urls-dir").mkdir(exist_ok=True)
    shutil.copy(local, nginx.root / "urls-dir" / NAME)
    return SimpleNamespace(local=local, expected=torch_tensors(local))


def test_an_ipv6_host_is_a_url_not_an_fsspec_chain():
    url = "http://u:pw@[::1]:8080/m.pth?sig=abc"
    assert chain(url) == [url] and scheme(url) == "http" and is_url(url)
    assert redact_url(url) == "http://[::1]:8080/m.pth?sig=REDACTED"
    assert chain("simplecache::http://[::1]:8080/m.pth") == ["simplecache", "http://[::1]:8080/m.pth"]


def test_an_ipv6_host(nginx, served):
    if not nginx.ipv6:
        pytest.skip("no IPv6 loopback")
    url = nginx.url(NAME, ipv6=True)
    with ckptfs.open(url) as ckpt:
        assert ckpt.name == url
        for key in ("big", "mid", "emb.weight"):
            assert ckpt.read(key) == torch_bytes(served.expected[key])
    r = run_ckptfs("info", nginx.url("no-such.pth", ipv6=True))
    assert r.returncode == 2 and r.stderr.strip() == (f"ckptfs: {nginx.url('no-such.pth', ipv6=True)}: "
                                                       "not found (HTTP 404 Not Found)"), r.stderr
    r = run_ckptfs("ls", nginx.url("urls-dir/", ipv6=True))
    assert r.returncode == 0 and "emb.weight" in r.stdout, r.stderr
