"""Remote directories from real servers: HF sharded checkpoints (torch.save and safetensors shards) and a DCP
checkpoint uploaded to S3 (SeaweedFS) and served by nginx with ``autoindex on``; every key's bytes compared with
what the writers' own loaders give for the local originals (torch.load, safetensors.safe_open,
dcp_to_torch_save); the no-trailing-slash rule; refusals and listing errors as one line without credentials."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers import MODEL_FILES, run_ckptfs, save, sharded_reference, torch_bytes
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

import ckptfs
from ckptfs.errors import FormatError
from ckptfs.source.remote_directory import RemoteDirectory


def upload(seaweed, local: Path, prefix: str) -> str:
    """Every file under ``local`` as ``prefix/<relative path>``; the directory's URL (with a trailing slash)."""
    client = seaweed.client()
    for p in sorted(local.rglob("*")):
        if p.is_file():
            client.put_object(Bucket=seaweed.bucket, Key=f"{prefix}/{p.relative_to(local).as_posix()}",
                              Body=p.read_bytes())
    return f"s3://{seaweed.bucket}/{prefix}/"


def options(seaweed, secret: str | None = None) -> dict:
    return {"endpoint_url": seaweed.endpoint, "key": seaweed.access_key, "secret": secret or seaweed.secret_key,
            "client_kwargs": {"region_name": "us-east-1"}}


def one_line(e: BaseException) -> str:
    text = str(e)
    assert "\n" not in text, text
    return text


def assert_sharded(ckpt, local: Path) -> None:
    want = sharded_reference(local)
    assert ckpt.format == "hf-sharded"
    assert sorted(ckpt.tensor_keys()) == sorted(want)
    for k, t in want.items():
        m = ckpt.meta(k)
        assert (m.dtype, m.shape) == (str(t.dtype).removeprefix("torch."), tuple(t.shape)), k
        assert ckpt.read(k) == torch_bytes(t), k
    files = ckpt.other_files()
    assert set(MODEL_FILES) | {next(local.glob("*.index.json")).name} == set(files)
    for name, data in MODEL_FILES.items():
        assert files[name] == len(data) and ckpt.read_other_file(name) == data, name


@pytest.fixture(scope="module")
def s3_hf(seaweed, hf_sharded):
    return {kind: upload(seaweed, d, f"dirs/hf-{kind}") for kind, d in hf_sharded.items()}


# --- S3 ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["safetensors", "bin"])
def test_a_sharded_directory_on_s3(seaweed, hf_sharded, s3_hf, kind):
    url = s3_hf[kind]
    with ckptfs.open(url, storage_options=options(seaweed)) as ckpt:
        assert ckpt.name == url
        assert_sharded(ckpt, hf_sharded[kind])


def test_without_a_trailing_slash_a_prefix_opens_as_a_directory(seaweed, hf_sharded, s3_hf):
    url = s3_hf["bin"].rstrip("/")
    with ckptfs.open(url, storage_options=options(seaweed)) as ckpt:
        assert_sharded(ckpt, hf_sharded["bin"])
    with pytest.raises(ckptfs.RemoteError) as e:  # neither an object nor a prefix: the object's error
        ckptfs.open(url + "-missing", storage_options=options(seaweed))
    assert "not found" in one_line(e.value) and url + "-missing" in str(e.value)


def test_a_bucket_named_without_a_slash_opens_as_a_directory(seaweed, hf_sharded):
    """s3://BUCKET is its root directory, as s3://BUCKET/ is; a bucket that cannot be listed says why."""
    bucket = "ckptfs-root-dir"
    seaweed.client().create_bucket(Bucket=bucket)
    for p in sorted(hf_sharded["safetensors"].iterdir()):
        seaweed.client().put_object(Bucket=bucket, Key=p.name, Body=p.read_bytes())
    for url in (f"s3://{bucket}", f"s3://{bucket}/"):
        with ckptfs.open(url, storage_options=options(seaweed)) as ckpt:
            assert_sharded(ckpt, hf_sharded["safetensors"])
    with pytest.raises(ckptfs.RemoteError) as e:
        ckptfs.open("s3://ckptfs-no-such-bucket", storage_options=options(seaweed))
    assert one_line(e.value) == "s3://ckptfs-no-such-bucket/: cannot list: not found"
    with pytest.raises(ckptfs.RemoteError) as e:
        ckptfs.open(f"s3://{bucket}", storage_options=options(seaweed, secret="wrong-Secret-123"))
    assert "cannot list: access denied" in one_line(e.value) and "wrong-Secret-123" not in str(e.value)


def test_a_dcp_checkpoint_on_s3(seaweed, dcp_checkpoints, tmp_path):
    local = dcp_checkpoints / "w4"
    url = upload(seaweed, local, "dirs/dcp-w4")
    dcp_to_torch_save(local, tmp_path / "ref.pt")
    want = torch.load(tmp_path / "ref.pt", weights_only=False)
    tensors = {".".join(map(str, path)): t for path, t in _tensors(want)}
    assert len(tensors) >= 4
    with ckptfs.open(url, storage_options=options(seaweed)) as ckpt:
        assert ckpt.format == "dcp"
        assert sorted(ckpt.tensor_keys()) == sorted(tensors)
        for key, t in tensors.items():
            assert ckpt.read(key) == torch_bytes(t), key


def _tensors(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _tensors(v, path + (k,))
    elif isinstance(obj, torch.Tensor):
        yield path, obj


def test_shard_names_that_leave_the_directory_are_refused(seaweed, hf_sharded, tmp_path):
    local = tmp_path / "m"
    shutil.copytree(hf_sharded["safetensors"], local)
    index = next(local.glob("*.index.json"))
    doc = json.loads(index.read_text())
    key = next(iter(doc["weight_map"]))
    doc["weight_map"][key] = "../hf-bin/model.safetensors"
    index.write_text(json.dumps(doc))
    url = upload(seaweed, local, "dirs/climbing")
    with pytest.raises(FormatError) as e:
        ckptfs.open(url, storage_options=options(seaweed))
    assert ".." in one_line(e.value) and index.name in str(e.value)
    directory = RemoteDirectory(url, options(seaweed))
    for bad, said in (("../hf-bin/config.json", "climbs out"), ("/etc/passwd", "absolute")):
        with pytest.raises(FormatError, match=said) as e:
            directory.open(bad)
        one_line(e.value)


def test_listing_errors_are_one_line_without_credentials(seaweed, s3_hf):
    url = f"s3://{seaweed.bucket}/dirs/no-such-prefix/"
    with pytest.raises(ckptfs.RemoteError) as e:
        ckptfs.open(url, storage_options=options(seaweed))
    assert one_line(e.value).startswith(url + ": cannot list") and "not found" in str(e.value)
    obj = f"s3://{seaweed.bucket}/dirs/hf-bin/config.json/"  # an object named as a directory
    with pytest.raises(ckptfs.RemoteError, match="an object, not a directory") as e:
        ckptfs.open(obj, storage_options=options(seaweed))
    assert one_line(e.value).startswith(obj)
    wrong = "Wrong/Secret+Key=ckptfs0002"
    with pytest.raises(ckptfs.RemoteError) as e:
        ckptfs.open(f"s3://{seaweed.bucket}/dirs/hf-bin/", storage_options=options(seaweed, wrong))
    text = one_line(e.value)
    assert "cannot list" in text and wrong not in text, text


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["safetensors", "bin"])
def test_check_compares_an_s3_directory_with_the_writers_loaders(seaweed, hf_sharded, s3_hf, kind):
    """torch.load and safetensors' parser read each shard through the same remote source."""
    r = run_ckptfs("check", s3_hf[kind], env=seaweed.env())
    n = len(sharded_reference(hf_sharded[kind]))
    assert r.returncode == 0 and f"{n} tensors identical, 0 mismatched" in r.stdout, r.stdout + r.stderr


@pytest.mark.slow
def test_check_of_a_remote_dcp_checkpoint_says_why_not(seaweed, dcp_checkpoints):
    url = upload(seaweed, dcp_checkpoints / "w2", "dirs/dcp-check")
    r = run_ckptfs("check", url, env=seaweed.env())
    assert r.returncode == 2 and "dcp_to_torch_save reads only local directories" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_the_cli_lists_an_s3_directory(seaweed, hf_sharded, s3_hf):
    r = run_ckptfs("ls", "--json", s3_hf["safetensors"], env=seaweed.env())
    assert r.returncode == 0, r.stderr
    rows = {m["key"]: m for m in map(json.loads, r.stdout.splitlines())}
    for k, t in sharded_reference(hf_sharded["safetensors"]).items():
        assert rows[k]["shape"] == list(t.shape) and rows[k]["dtype"] == str(t.dtype).removeprefix("torch."), k
    missing = f"s3://{seaweed.bucket}/dirs/nothing-here/"
    r = run_ckptfs("ls", missing, "--timeout", "5", env=seaweed.env())
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert missing in r.stderr and "cannot list" in r.stderr and seaweed.secret_key not in r.stderr


@pytest.mark.mount
def test_mount_an_s3_directory(mount, seaweed, hf_sharded, s3_hf):
    want = sharded_reference(hf_sharded["bin"])
    m = mount(s3_hf["bin"], env=seaweed.env())
    key = "model.layers.1.mlp.up_proj.weight"
    assert m.path.joinpath(*key.split(".")).read_bytes() == torch_bytes(want[key])
    assert (m.path / ".ckptfs" / "files" / "config.json").read_bytes() == MODEL_FILES["config.json"]


# --- HTTP (nginx autoindex) -------------------------------------------------------------------------------------


def test_a_sharded_directory_over_http(nginx, hf_sharded):
    shutil.copytree(hf_sharded["safetensors"], nginx.root / "dirs" / "st", dirs_exist_ok=True)
    url = nginx.url("dirs/st/")
    with ckptfs.open(url) as ckpt:
        assert ckpt.name == url
        assert_sharded(ckpt, hf_sharded["safetensors"])


def test_a_directory_over_http_through_the_environment_s_proxy(nginx, hf_sharded, proxy):
    """http_proxy and https_proxy (a CONNECT tunnel) serve listings as they serve objects: the host name does
    not resolve, only the proxy reaches it."""
    import os

    shutil.copytree(hf_sharded["safetensors"], nginx.root / "dirs" / "proxied", dirs_exist_ok=True)
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    plain = proxy(nginx.port)
    r = run_ckptfs("ls", "http://ckptfs-proxied.invalid/dirs/proxied/", "--timeout", "10",
                   env={**env, "http_proxy": f"http://127.0.0.1:{plain.port}"})
    assert r.returncode == 0 and "model.layers.1.mlp.up_proj.weight" in r.stdout, r.stderr
    tunnel = proxy(nginx.https_port)
    tunnel.connect = True
    r = run_ckptfs("info", "https://ckptfs-proxied.invalid:443/dirs/proxied/", "--storage-option", "verify=false",
                   "--timeout", "10", env={**env, "https_proxy": f"http://127.0.0.1:{tunnel.port}"})
    assert r.returncode == 0 and "hf-sharded" in r.stdout, r.stderr
    assert set(tunnel.tunnels) == {"ckptfs-proxied.invalid:443"}, tunnel.tunnels


def test_a_listing_that_cannot_connect_fails_as_an_object_would():
    """An unknown host is one line at once (not --timeout seconds of retries), in the words used for objects; a
    refused connection is retried, then named."""
    import os

    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    for url in ("http://ckptfs-no-such-host.invalid/m/", "http://ckptfs-no-such-host.invalid/m.pth"):
        r = run_ckptfs("ls", url, "--timeout", "20", env=env)
        assert r.returncode == 2 and "gave up" not in r.stderr, r.stderr
        assert r.stderr.strip().endswith("cannot resolve the host name ckptfs-no-such-host.invalid"), r.stderr
    r = run_ckptfs("ls", "http://127.0.0.1:1/m/", "--timeout", "1", env=env)
    assert r.returncode == 2 and "cannot list: connection refused by 127.0.0.1:1 (gave up" in r.stderr, r.stderr
    assert "object at 0x" not in r.stderr


def test_a_directory_of_checkpoints_over_http_with_basic_auth(nginx, tmp_path):
    """File names that need URL quoting; a subdirectory; credentials in the URL never shown."""
    d = nginx.root / "private" / "runs"
    (d / "sub dir").mkdir(parents=True, exist_ok=True)
    sds = {"epoch 1": {"w": torch.arange(6.0)}, "sub dir": {"b": torch.ones(3, dtype=torch.int64)}}
    save(d / "epoch 1.pt", sds["epoch 1"])
    save(d / "sub dir" / "last.pt", sds["sub dir"])
    (d / "notes ü.txt").write_bytes(b"notes")
    url = nginx.url("private/runs/", auth=(nginx.USER, nginx.PASSWORD))
    with ckptfs.open(url) as ckpt:
        assert ckpt.name == nginx.url("private/runs/")
        assert ckpt.read("epoch 1.w") == torch_bytes(sds["epoch 1"]["w"])
        assert ckpt.read("sub dir.b") == torch_bytes(sds["sub dir"]["b"])
        assert ckpt.read_other_file("notes ü.txt") == b"notes"
    with pytest.raises(ckptfs.RemoteError) as e:  # without the credentials
        ckptfs.open(nginx.url("private/runs/"))
    assert "cannot list" in one_line(e.value) and "401" in str(e.value)


def test_a_server_without_listings_says_so(nginx, hf_sharded):
    shutil.copytree(hf_sharded["bin"], nginx.root / "nolist" / "bin", dirs_exist_ok=True)
    url = nginx.url("nolist/bin/", auth=("someone", "Secret-Pa55word-77"))
    with pytest.raises(ckptfs.RemoteError) as e:
        ckptfs.open(url)
    text = one_line(e.value)
    assert text.startswith(nginx.url("nolist/bin/") + ": cannot list") and "no directory listing" in text, text
    assert "Secret-Pa55word-77" not in text and "someone" not in text
    r = run_ckptfs("ls", url, "--timeout", "5")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "no directory listing" in r.stderr and "Secret-Pa55word-77" not in r.stderr


@pytest.mark.parametrize("kind", ["safetensors", "bin"])
def test_export_of_an_s3_model_directory_keeps_its_layout(seaweed, hf_sharded, s3_hf, kind, tmp_path):
    """An HF model directory on S3 exports as the local one does: safetensors shards with their index and the
    model files copied along, every tensor as the writers' loaders give the local original."""
    out = tmp_path / "out"
    r = run_ckptfs("export", s3_hf[kind], str(out), "--keep-shards", env=seaweed.env())
    assert r.returncode == 0, r.stderr
    local = tmp_path / "local"
    assert run_ckptfs("export", str(hf_sharded[kind]), str(local), "--keep-shards").returncode == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in local.iterdir())
    assert "model.safetensors.index.json" in {p.name for p in out.iterdir()}
    for name, data in MODEL_FILES.items():
        assert (out / name).read_bytes() == data, name
    got = sharded_reference(out)
    want = sharded_reference(hf_sharded[kind])
    assert got.keys() == want.keys()
    for k, t in want.items():
        assert got[k].dtype == t.dtype and torch.equal(got[k], t), k
