"""Checkpoints read over HTTP(S) from a real nginx: every entry point but the mount (test_remote_mount), bytes
compared with torch.load of the file nginx serves, request counts read from nginx's access log."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import fsspec
import numpy as np
import pytest
import torch
from helpers import remote_state_dict, run_ckptfs, save, torch_bytes, torch_tensors

import ckptfs
from ckptfs.source.remote import RemoteOptions

NAME = "http-m.pth"


@pytest.fixture(scope="module")
def served(nginx, tmp_path_factory):
    """The checkpoint under several URLs of the session's nginx, and what torch.load gives for it."""
    local = save(tmp_path_factory.mktemp("http") / NAME, remote_state_dict())
    for where in ("", "private", "norange"):
        shutil.copy(local, nginx.root / where / NAME)
    legacy = save(nginx.root / "http-legacy.pth", remote_state_dict(), _use_new_zipfile_serialization=False)
    return SimpleNamespace(local=local, url=nginx.url(NAME), uri=f"/{NAME}", legacy=legacy,
                           expected=torch_tensors(local))


def _bytes_of(ckpt, key):
    return ckpt.read(key)


def test_ls_lists_what_torch_loads_in_at_most_3_requests(nginx, served):
    since = len(nginx.log())
    r = run_ckptfs("ls", "--json", served.url)
    assert r.returncode == 0, r.stderr
    rows = {m["key"]: m for m in map(json.loads, r.stdout.splitlines())}
    for key, t in served.expected.items():
        assert rows[key]["dtype"] == str(t.dtype).removeprefix("torch.")
        assert rows[key]["shape"] == list(t.shape)
    assert "step" in rows
    reqs = nginx.requests_for(served.uri, since)
    assert 1 <= len(reqs) <= 3, reqs  # the pickle is < 1 MiB: the first MiB, then the tail
    assert all(e["status"] == 206 for e in reqs), reqs
    assert sum(e["bytes"] for e in reqs) <= 3 << 20, reqs
    assert os.path.getsize(served.local) > 12 << 20  # ... of a file much larger than what was read


def test_head_and_tail_come_in_one_batch(nginx, tmp_path):
    """5,000 tensors after an 8 MB one: a central directory of ~0.5 MiB (more than the blocks the end record is
    read with) and a pickle under 1 MiB. The first request brings the head, the whole tail comes in the second."""
    name = "http-many.pth"
    sd = {"pad": torch.zeros(2_000_000)} | {f"layer.{i}.weight": torch.full((2,), float(i)) for i in range(5000)}
    save(nginx.root / name, sd)
    size = (nginx.root / name).stat().st_size
    since = len(nginx.log())
    with ckptfs.open(nginx.url(name)) as ckpt:
        assert len(ckpt.tensor_keys()) == 5001
        reqs = nginx.requests_for("/" + name, since)
        assert len(reqs) == 2 and reqs[0]["range"] == "bytes=0-1048575", reqs
        a, b = map(int, reqs[1]["range"].removeprefix("bytes=").split("-"))
        assert b == size - 1 and size - a >= 1 << 20, reqs  # the last MiB (the whole directory) at once
        assert ckpt.read("layer.4321.weight") == torch_bytes(sd["layer.4321.weight"])


def test_info_names_the_url(served):
    r = run_ckptfs("info", "--json", served.url)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["file"] == served.url
    assert info["size"] == os.path.getsize(served.local)
    assert info["tensors"] == len(served.expected)


def test_open_reads_every_tensor_as_torch_does(served):
    with ckptfs.open(served.url) as ckpt:
        assert sorted(ckpt.tensor_keys()) == sorted(served.expected)
        for key, t in served.expected.items():
            assert ckpt.read(key) == torch_bytes(t), key
        big = torch_bytes(served.expected["big"])
        rng = np.random.default_rng(0)
        for _ in range(50):  # random pieces: within a block, across blocks, unaligned
            off = int(rng.integers(0, len(big) - 1))
            n = int(rng.integers(1, 700_000))
            assert ckpt.read("big", off, n) == big[off : off + n]
        rows = ckpt.slice("emb.weight")[100:350]
        assert np.array_equal(rows, served.expected["emb.weight"][100:350].numpy())
        assert ckpt.value("step") == 1234


def test_load_is_a_lazy_state_dict_of_the_url(served):
    sd = ckptfs.load(served.url)
    assert sorted(k for k in sd if isinstance(sd[k], torch.Tensor)) == sorted(served.expected)
    for key, t in served.expected.items():
        assert sd[key].dtype == t.dtype and torch.equal(sd[key], t), key
    model = torch.nn.Embedding(1000, 64)
    model.load_state_dict({"weight": sd["emb.weight"]})
    assert torch.equal(model.weight.detach(), served.expected["emb.weight"])


def test_check_compares_every_tensor(served):
    r = run_ckptfs("check", "--no-progress", served.url)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{len(served.expected)} tensors identical, 0 mismatched" in r.stdout


def test_legacy_stream_over_http(nginx, served):
    since = len(nginx.log())
    with ckptfs.open(nginx.url(served.legacy.name)) as ckpt:
        assert ckpt.format == "legacy"
        for key, t in served.expected.items():
            assert ckpt.read(key) == torch_bytes(t), key
    reqs = nginx.requests_for("/" + served.legacy.name, since)
    # the storage headers are fetched in one concurrent batch (several connections at once), then the bytes
    assert len(reqs) <= 2 * len(served.expected) + 4, reqs
    assert len({e["conn"] for e in reqs}) > 1, reqs


def test_https_verifies_certificates(nginx, served):
    url = nginx.url(NAME, https=True)
    r = run_ckptfs("ls", url)
    assert r.returncode == 2 and "not trusted" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for opt in ("verify=false", f"verify={nginx.cert}"):
        r = run_ckptfs("ls", url, "--storage-option", opt)
        assert r.returncode == 0, r.stderr
        assert "emb.weight" in r.stdout
    with ckptfs.open(url, storage_options={"verify": str(nginx.cert)}) as ckpt:
        assert ckpt.read("big") == torch_bytes(served.expected["big"])
    env = {k: v for k, v in os.environ.items() if k not in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")}
    for var in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):  # what users of requests and curl already set
        r = run_ckptfs("ls", url, env={**env, var: str(nginx.cert)})
        assert r.returncode == 0 and "emb.weight" in r.stdout, (var, r.stderr)
    r = run_ckptfs("ls", url, env={**env, "REQUESTS_CA_BUNDLE": "/nonexistent/ca.pem"})
    assert r.returncode == 2 and "REQUESTS_CA_BUNDLE='/nonexistent/ca.pem': cannot load the CA bundle" in r.stderr, r.stderr


def test_basic_auth_from_url_or_options(nginx, served):
    user, password = nginx.USER, nginx.PASSWORD
    with ckptfs.open(nginx.url(f"private/{NAME}", auth=(user, password))) as ckpt:
        assert ckpt.name == nginx.url(f"private/{NAME}")  # shown without the credentials
        assert ckpt.read("mid") == torch_bytes(served.expected["mid"])
    with ckptfs.open(nginx.url(f"private/{NAME}"), storage_options={"username": user, "password": password}) as ckpt:
        assert ckpt.read("tail") == torch_bytes(served.expected["tail"])
    bad = nginx.url(f"private/{NAME}", auth=(user, "wrong-Secret-123"))
    r = run_ckptfs("ls", bad)
    assert r.returncode == 2 and "access denied (HTTP 401" in r.stderr, r.stderr
    assert "wrong-Secret-123" not in r.stderr and nginx.url(f"private/{NAME}") in r.stderr


def test_http_and_https_proxies_from_the_environment(nginx, served, proxy):
    """http_proxy: requests go to the proxy with absolute URLs; https_proxy: a CONNECT tunnel. The host name
    does not resolve: only the proxy can reach it."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    plain = proxy(nginx.port)
    since = len(nginx.log())
    r = run_ckptfs("ls", f"http://ckptfs-proxied.invalid/{NAME}", env={**env, "http_proxy": f"http://127.0.0.1:{plain.port}"})
    assert r.returncode == 0 and "emb.weight" in r.stdout, r.stderr
    assert len(nginx.requests_for(served.uri, since)) >= 1 and plain.connections >= 1
    tunnel = proxy(nginx.https_port)
    tunnel.connect = True
    r = run_ckptfs("info", f"https://ckptfs-proxied.invalid:443/{NAME}", "--storage-option", "verify=false",
                   env={**env, "HTTPS_PROXY": f"http://127.0.0.1:{tunnel.port}"})
    assert r.returncode == 0 and "tensors" in r.stdout, r.stderr
    assert tunnel.tunnels and set(tunnel.tunnels) == {"ckptfs-proxied.invalid:443"}
    r = run_ckptfs("ls", f"http://ckptfs-proxied.invalid/{NAME}", "--timeout", "2",
                   env={**env, "http_proxy": f"http://127.0.0.1:{plain.port}", "no_proxy": ".invalid"})
    assert r.returncode == 2 and "cannot resolve" in r.stderr, r.stderr  # no_proxy: straight to the host


def test_a_server_without_byte_ranges_is_named(nginx, served):
    r = run_ckptfs("ls", nginx.url(f"norange/{NAME}"))
    assert r.returncode == 2
    assert "does not serve byte ranges" in r.stderr and nginx.url(f"norange/{NAME}") in r.stderr, r.stderr


def test_redirects_are_followed_once(nginx, served):
    since = len(nginx.log())
    with ckptfs.open(nginx.url(f"moved/{NAME}")) as ckpt:
        assert ckpt.read("big") == torch_bytes(served.expected["big"])
    log = nginx.log()[since:]
    moved = [e for e in log if e["uri"] == f"/moved/{NAME}"]
    assert [e["status"] for e in moved] == [302], moved  # later requests go to the target directly
    assert moved[0]["conn"] in {e["conn"] for e in log if e["uri"] == served.uri}, log  # its connection is kept
    assert len([e for e in log if e["uri"] == served.uri]) >= 3


def test_missing_object_is_one_line(nginx):
    r = run_ckptfs("info", nginx.url("no-such.pth"))
    assert r.returncode == 2
    assert r.stderr.strip() == f"ckptfs: {nginx.url('no-such.pth')}: not found (HTTP 404 Not Found)"


def test_unknown_storage_option_is_refused(served):
    r = run_ckptfs("ls", served.url, "--storage-option", "endpoint=x")
    assert r.returncode == 2 and "unknown storage option for http(s) URLs: endpoint" in r.stderr, r.stderr


def _replace(path: Path, obj) -> None:
    """Write another checkpoint over ``path`` (new inode, an mtime nginx's ETag will differ by)."""
    st = path.stat()
    tmp = path.with_suffix(".new")
    save(tmp, obj)
    os.utime(tmp, (st.st_atime + 5, st.st_mtime + 5))
    os.replace(tmp, path)


def test_an_object_replaced_while_open_is_refused_not_mixed(nginx, tmp_path):
    name = "http-replaced.pth"
    sd = remote_state_dict()
    save(nginx.root / name, sd)
    with ckptfs.open(nginx.url(name)) as ckpt:
        assert ckpt.read("tail") == torch_bytes(sd["tail"])  # in the first MiB: cached
        other = {k: (v + 1 if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in sd.items()}
        _replace(nginx.root / name, other)
        since = len(nginx.log())
        with pytest.raises(ckptfs.StaleSourceError, match="replaced while in use"):
            ckpt.read("big")
        statuses = [e["status"] for e in nginx.requests_for("/" + name, since)]
        assert statuses and set(statuses) == {412}, statuses  # If-Match did it (once per parallel part)
        with pytest.raises(ckptfs.StaleSourceError):
            ckpt.read("tail")  # even bytes already in memory: the checkpoint is gone


def test_disk_cache_second_ls_transfers_nothing_already_fetched(nginx, served, tmp_path):
    cache = tmp_path / "cache"
    since = len(nginx.log())
    first = run_ckptfs("ls", served.url, "--cache-dir", str(cache))
    mid = len(nginx.log())
    second = run_ckptfs("ls", served.url, "--cache-dir", str(cache))
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert first.stdout == second.stdout
    assert sum(e["bytes"] for e in nginx.requests_for(served.uri, since)[:mid - since]) > 1 << 20
    again = nginx.requests_for(served.uri, mid)
    assert len(again) == 1 and again[0]["bytes"] <= 1, again  # only the identity check: 1 byte
    # a reader of the API shares the cache: whole tensors come from disk
    with ckptfs.open(served.url, remote=RemoteOptions(cache_dir=str(cache))) as ckpt:
        assert ckpt.read("big") == torch_bytes(served.expected["big"])
    third = len(nginx.log())
    with ckptfs.open(served.url, remote=RemoteOptions(cache_dir=str(cache))) as ckpt:
        assert ckpt.read("big") == torch_bytes(served.expected["big"])
    assert sum(e["bytes"] for e in nginx.requests_for(served.uri, third)) <= 1


def test_disk_cache_stays_within_its_size(served, tmp_path):
    cache = tmp_path / "cache"
    limit = 6 << 20
    with ckptfs.open(served.url, remote=RemoteOptions(cache_dir=str(cache), cache_size=limit)) as ckpt:
        for key, t in served.expected.items():
            assert ckpt.read(key) == torch_bytes(t), key
        ckpt.source._disk.trim()  # (trims also run on their own every tenth of the size written)
    on_disk = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file() and f.name != "object.json")
    assert 0 < on_disk <= limit * 0.9 + (256 << 10)


def test_a_forked_child_reads_with_its_own_connections(served):
    expected = torch_bytes(served.expected["big"])
    with ckptfs.open(served.url) as ckpt:
        assert ckpt.read("tail") == torch_bytes(served.expected["tail"])  # a pooled connection now exists
        pid = os.fork()
        if pid == 0:  # the child: what the mount daemon does after indexing
            ok = ckpt.read("big") == expected and ckpt.read("mid", 4, 1000) == torch_bytes(served.expected["mid"])[4:1004]
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert ckpt.read("mid") == torch_bytes(served.expected["mid"])  # the parent's still work


def test_other_fsspec_protocols(served):
    """Any fsspec filesystem: here fsspec's in-memory one (the identity is its info(), checked at open)."""
    data = served.local.read_bytes()
    with fsspec.open("memory://ckptfs/m.pth", "wb") as f:
        f.write(data)
    try:
        with ckptfs.open("memory://ckptfs/m.pth", remote=RemoteOptions(revalidate_after=0)) as ckpt:
            assert ckpt.name == "memory://ckptfs/m.pth"
            for key, t in served.expected.items():
                assert ckpt.read(key) == torch_bytes(t), key
            time.sleep(0.01)
            with fsspec.open("memory://ckptfs/m.pth", "wb") as f:
                f.write(data[:-10])
            with pytest.raises(ckptfs.StaleSourceError):
                ckpt.source.check_unchanged(True)
    finally:
        fsspec.filesystem("memory").rm("ckptfs/m.pth")


def test_an_empty_or_foreign_object_gets_the_same_error_as_a_file(nginx):
    (nginx.root / "http-empty.pth").write_bytes(b"")
    (nginx.root / "http-array.npy").write_bytes(b"\x93NUMPY" + b"\x00" * 100)
    with pytest.raises(ckptfs.FormatError, match="empty file"):
        ckptfs.open(nginx.url("http-empty.pth"))
    with pytest.raises(ckptfs.FormatError, match="NumPy .npy file") as e:
        ckptfs.open(nginx.url("http-array.npy"))
    assert e.value.file == nginx.url("http-array.npy")


def test_chunked_answers_are_read_to_their_end_and_their_connections_kept(nginx, served, proxy):
    """Through a proxy that re-frames every body as chunked (as some CDNs do): the bytes are right, and a
    connection goes back to the pool only once its answer's last chunk is read, so the next request on it gets
    its own answer (not the leftover last chunk: a bad status line, a retry and another connection)."""
    chunking = proxy(nginx.port)
    chunking.chunked = True
    since = len(nginx.log())
    big = served.expected["big"]
    with ckptfs.open(chunking.url(NAME)) as ckpt:
        assert ckpt.read("mid") == torch_bytes(served.expected["mid"])
        rows = ckpt.slice("big")
        for i in range(1, 9):  # one block each, one request each, one after the other
            j = i * 300_000
            assert rows[j : j + 10].tobytes() == torch_bytes(big[j : j + 10])
    reqs = nginx.requests_for(served.uri, since)
    assert all(e["status"] == 206 for e in reqs), reqs
    assert len({(e["range"]) for e in reqs}) == len(reqs), reqs  # nothing fetched twice
    assert chunking.connections <= 2, (chunking.connections, len(reqs))


def test_an_export_that_cannot_fit_is_refused_before_writing(nginx, tmp_path):
    """An expanded view (stride 0) is written out whole: more than the destination's free space is refused at
    once, naming both figures, and nothing is left behind."""
    free = shutil.disk_usage(tmp_path).free
    n = (free + (1 << 30)) // 4
    save(nginx.root / "expanded.pth", {"w": torch.zeros(1).expand(n)})
    dst = tmp_path / "out.safetensors"
    r = run_ckptfs("export", nginx.url("expanded.pth"), str(dst), timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"{dst}: needs {n * 4 / 2**30:.2f} GiB but {tmp_path} has " in r.stderr and "GiB free" in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_read_that_starts_the_read_ahead_is_the_head_of_its_first_request(nginx):
    """A sequential reader's second read misses its block and starts the read-ahead: the block and the window
    after it come in one request. (Fetched apart, the read's own block took a connection of its own: on a fresh
    mount, one handshake more before the first read returned.)"""
    from ckptfs.source.remote import BLOCK, open_url

    name = "http-stream.bin"
    data = os.urandom(24 << 20)
    (nginx.root / name).write_bytes(data)
    src = open_url(nginx.url(name))
    try:
        since = len(nginx.log())
        at = 4 << 20
        for k in range(32):  # 8 MiB read front to back, a block at a time
            off = at + k * BLOCK
            assert src.pread(off, BLOCK) == data[off : off + BLOCK]
        time.sleep(0.3)  # nginx logs a request when it ends: the read-ahead still in flight lands too
    finally:
        src.close()
    spans = [tuple(map(int, e["range"].removeprefix("bytes=").split("-"))) for e in
             nginx.requests_for("/" + name, since)]
    assert spans[0] == (at, at + BLOCK - 1), spans  # the first read: a stream not known to be sequential yet
    head = [s for s in spans if s[0] == at + BLOCK]
    assert len(head) == 1 and head[0][1] - head[0][0] + 1 > BLOCK, spans  # the second read's block leads
    assert len(spans) == len(set(spans)) and sum(b - a + 1 for a, b in spans) <= 24 << 20  # nothing twice
