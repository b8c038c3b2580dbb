"""s3:// checkpoints from a real S3 server (SeaweedFS): configured by the standard AWS_* variables (with
AWS_ENDPOINT_URL) or by storage options; every entry point; bytes compared with torch.load of the uploaded file."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import remote_state_dict, run_ckptfs, save, torch_bytes, torch_tensors

import ckptfs

KEY = "ckpts/s3-m.pth"


@pytest.fixture(scope="module")
def s3obj(seaweed, tmp_path_factory):
    local = save(tmp_path_factory.mktemp("s3") / "m.pth", remote_state_dict())
    url = seaweed.put(KEY, local)
    return SimpleNamespace(local=local, url=url, expected=torch_tensors(local), env=seaweed.env())


def _options(seaweed) -> dict:
    return {"endpoint_url": seaweed.endpoint, "key": seaweed.access_key, "secret": seaweed.secret_key,
            "client_kwargs": {"region_name": "us-east-1"}}


def test_ls_with_the_aws_environment(s3obj):
    """AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY: nothing else to configure. (info and check
    take the same path to the object: test_remote_http covers them.)"""
    r = run_ckptfs("ls", "--json", s3obj.url, env=s3obj.env)
    assert r.returncode == 0, r.stderr
    rows = {m["key"]: m for m in map(json.loads, r.stdout.splitlines())}
    for key, t in s3obj.expected.items():
        assert rows[key]["shape"] == list(t.shape) and rows[key]["dtype"] == str(t.dtype).removeprefix("torch.")


def test_without_credentials_the_error_says_so(s3obj, seaweed):
    env = {k: v for k, v in s3obj.env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    r = run_ckptfs("ls", s3obj.url, "--timeout", "5", env=env)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert s3obj.url in r.stderr and ("credentials" in r.stderr or "denied" in r.stderr), r.stderr


@pytest.mark.parametrize("target", ["object", "directory"])
def test_credentials_that_cannot_be_found_fail_at_once(s3obj, seaweed, tmp_path, target):
    """No credentials at all, or an AWS_PROFILE the files do not have: one line at once, for an object and for
    a listing alike (not --timeout seconds of retries)."""
    url = s3obj.url if target == "object" else s3obj.url.rsplit("/", 1)[0] + "/"
    env = {k: v for k, v in s3obj.env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    r = run_ckptfs("ls", url, "--timeout", "20", env=env)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "gave up" not in r.stderr, r.stderr
    assert "no AWS credentials" in r.stderr, r.stderr
    creds = tmp_path / "credentials"
    creds.write_text(f"[ckptfs]\naws_access_key_id = {seaweed.access_key}\naws_secret_access_key = {seaweed.secret_key}\n")
    env["AWS_SHARED_CREDENTIALS_FILE"] = str(creds)
    r = run_ckptfs("ls", url, "--timeout", "20", env={**env, "AWS_PROFILE": "no-such-profile"})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "gave up" not in r.stderr, r.stderr
    assert "The config profile (no-such-profile) could not be found" in r.stderr, r.stderr
    assert seaweed.secret_key not in r.stderr
    r = run_ckptfs("ls", url, env={**env, "AWS_PROFILE": "ckptfs"})
    assert r.returncode == 0 and "emb.weight" in r.stdout, r.stderr


@pytest.mark.parametrize("target", ["object", "directory"])
def test_an_endpoint_whose_tls_cannot_work_fails_at_once(s3obj, seaweed, nginx, target):
    """AWS_ENDPOINT_URL https:// at SeaweedFS's plain HTTP port, or at a server whose certificate is not trusted
    (nginx's self-signed one: the handshake fails before any S3 request): one line at once, as for https://
    objects, with the way to trust a CA bundle."""
    url = s3obj.url if target == "object" else s3obj.url.rsplit("/", 1)[0] + "/"
    r = run_ckptfs("ls", url, "--timeout", "20", env={**s3obj.env, "AWS_ENDPOINT_URL": f"https://127.0.0.1:{seaweed.port}"})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "gave up" not in r.stderr, r.stderr
    assert f"127.0.0.1:{seaweed.port} does not speak TLS" in r.stderr, r.stderr
    r = run_ckptfs("ls", url, "--timeout", "20", env={**s3obj.env, "AWS_ENDPOINT_URL": f"https://127.0.0.1:{nginx.https_port}"})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "gave up" not in r.stderr, r.stderr
    assert f"the TLS certificate of 127.0.0.1:{nginx.https_port} is not trusted (self-signed certificate); " \
           "AWS_CA_BUNDLE" in r.stderr, r.stderr


@pytest.mark.parametrize("target", ["object", "directory"])
def test_an_endpoint_host_that_does_not_exist_fails_at_once(s3obj, target):
    """No such host (the name does not resolve): no retrying for the whole --timeout, as for https:// objects."""
    url = s3obj.url if target == "object" else s3obj.url.rsplit("/", 1)[0] + "/"
    r = run_ckptfs("ls", url, "--timeout", "60", env={**s3obj.env, "AWS_ENDPOINT_URL": "http://ckptfs-nohost.invalid:9000"})
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "gave up" not in r.stderr, r.stderr
    assert "cannot resolve the host name ckptfs-nohost.invalid of the endpoint http://ckptfs-nohost.invalid:9000" \
        in r.stderr, r.stderr


def test_open_and_load_with_storage_options(s3obj, seaweed):
    with ckptfs.open(s3obj.url, storage_options=_options(seaweed)) as ckpt:
        assert ckpt.name == s3obj.url
        for key, t in s3obj.expected.items():
            assert ckpt.read(key) == torch_bytes(t), key
        assert ckpt.read("big", 1_000_003, 500_000) == torch_bytes(s3obj.expected["big"])[1_000_003:1_500_003]
    sd = ckptfs.load(s3obj.url, storage_options=_options(seaweed))
    for key, t in s3obj.expected.items():
        assert torch.equal(sd[key], t), key


@pytest.mark.mount
def test_mount_s3_and_no_secret_in_the_process_list(mount, s3obj, seaweed):
    env = {k: v for k, v in s3obj.env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    m = mount(s3obj.url, "--storage-option", f"key={seaweed.access_key}", "--storage-option",
              f"secret={seaweed.secret_key}", "--storage-option", "client_kwargs.region_name=us-east-1", env=env)
    for key, t in s3obj.expected.items():
        assert m.path.joinpath(*key.split(".")).read_bytes() == torch_bytes(t), key
    cmdline = Path(f"/proc/{m.pid}/cmdline").read_bytes().decode(errors="replace")
    assert seaweed.secret_key not in cmdline and "secret=***" in cmdline, cmdline
    assert "client_kwargs.region_name=us-east-1" in cmdline
    for text in (m.log.read_text(), (m.path / ".ckptfs" / "mount.json").read_text()):
        assert seaweed.secret_key not in text


def test_an_fstab_style_mount_takes_every_remote_option_as_o(mount, s3obj, seaweed, tmp_path):
    """An /etc/fstab line has only -o: the backend's options (storage.KEY=VALUE), the timeout and the caches
    go there; secrets are masked in the process list and mount.json as --storage-option's are."""
    env = {k: v for k, v in s3obj.env.items() if not k.startswith("AWS_")}
    cache = tmp_path / "cache"
    opts = ",".join([f"storage.endpoint_url={seaweed.endpoint}", f"storage.key={seaweed.access_key}",
                     f"storage.secret={seaweed.secret_key}", "storage.client_kwargs.region_name=us-east-1",
                     "timeout=7", f"cache_dir={cache}", "cache_size=1G", "memory_cache=64M"])
    m = mount(s3obj.url, "-o", opts, env=env)
    for key, t in s3obj.expected.items():
        assert m.path.joinpath(*key.split(".")).read_bytes() == torch_bytes(t), key
    info = json.loads((m.path / ".ckptfs" / "mount.json").read_text())
    assert info["remote"]["timeout"] == 7 and info["remote"]["cache_dir"] == str(cache)
    assert info["remote"]["memory_cache"] == 64 << 20 and info["remote"]["cache_size"] == 1 << 30
    assert sorted(info["storage_options"]) == ["client_kwargs", "endpoint_url", "key", "secret"]
    assert any(cache.rglob("*")), "the disk cache was not used"
    cmdline = Path(f"/proc/{m.pid}/cmdline").read_bytes().decode(errors="replace")
    assert "storage.secret=***" in cmdline and f"storage.endpoint_url={seaweed.endpoint}" in cmdline, cmdline
    for text in (cmdline, m.log.read_text(), (m.path / ".ckptfs" / "mount.json").read_text()):
        assert seaweed.secret_key not in text
    local = save(tmp_path / "local.pth", {"w": torch.ones(2)})
    r = run_ckptfs("mount", str(local), str(tmp_path), "-o", "timeout=3")
    assert r.returncode == 2 and "options of remote checkpoints (URLs)" in r.stderr
    r = run_ckptfs("mount", s3obj.url, str(tmp_path), "-o", "timeout=soon", env=env)
    assert r.returncode == 2 and "-o timeout 'soon': expected a number" in r.stderr


def test_an_object_replaced_while_open_is_refused(s3obj, seaweed, tmp_path):
    key = "ckpts/s3-replaced.pth"
    sd = remote_state_dict()
    url = seaweed.put(key, save(tmp_path / "a.pth", sd))
    with ckptfs.open(url, storage_options=_options(seaweed)) as ckpt:
        assert ckpt.read("tail") == torch_bytes(sd["tail"])
        sd["big"] = sd["big"] + 1
        seaweed.put(key, save(tmp_path / "b.pth", sd))
        with pytest.raises(ckptfs.StaleSourceError, match="replaced while in use"):
            ckpt.read("big")
