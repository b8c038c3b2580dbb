"""URL shapes met in the wild, against a real nginx: IPv6 hosts, paths with spaces and non-ASCII characters
(as typed, or percent-encoded), https:// at a plain HTTP port; bytes compared with torch.load of the file nginx
serves."""

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


@pytest.mark.parametrize("path", ["my models/ré sumé.pth", "my%20models/r%C3%A9%20sum%C3%A9.pth"])
def test_spaces_and_non_ascii_in_the_path(nginx, served, path):
    """As typed (spaces, é) the path is percent-encoded on the request line; already encoded, it is kept."""
    since = len(nginx.log())
    with ckptfs.open(nginx.url(path), remote=ckptfs.RemoteOptions(timeout=5)) as ckpt:
        assert ckpt.read("big") == torch_bytes(served.expected["big"])
    assert {e["status"] for e in nginx.requests_for("/my models/ré sumé.pth", since)} == {206}
    r = run_ckptfs("check", nginx.url(path))
    assert r.returncode == 0, r.stderr
    r = run_ckptfs("ls", nginx.url("my models/"))
    assert r.returncode == 0 and "emb.weight" in r.stdout, r.stderr


def test_a_control_character_is_encoded_not_retried(nginx):
    """http.client refuses a control character on the request line: encoded, it is an ordinary 404 at once."""
    r = run_ckptfs("info", nginx.url("a\x7fb.pth"), "--timeout", "20")
    assert r.returncode == 2 and "not found (HTTP 404" in r.stderr and "gave up" not in r.stderr, r.stderr


@pytest.mark.parametrize("path", [NAME, "urls-dir/"])
def test_https_to_a_plain_http_port_is_refused_at_once(nginx, served, path):
    """https:// at nginx's plain HTTP port: one line saying so, not --timeout seconds of TLS retries."""
    url = f"https://127.0.0.1:{nginx.port}/{path}"
    r = run_ckptfs("ls", url, "--timeout", "20")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"127.0.0.1:{nginx.port} does not speak TLS" in r.stderr and "gave up" not in r.stderr, r.stderr


def test_an_untrusted_certificate_is_one_line_for_a_directory_too(nginx, served):
    r = run_ckptfs("ls", nginx.url("urls-dir/", https=True), "--timeout", "20")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"the TLS certificate of 127.0.0.1:{nginx.https_port} is not trusted" in r.stderr, r.stderr
    r = run_ckptfs("ls", nginx.url("urls-dir/", https=True), "--storage-option", f"verify={nginx.cert}")
    assert r.returncode == 0 and "emb.weight" in r.stdout, r.stderr
