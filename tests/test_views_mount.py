"""The views through real FUSE mounts: ``--view safetensors`` (a file, an HF directory of .bin shards) read by
the safetensors library (safe_open maps the whole file), 16 threads page-faulting one mapped virtual file,
and ``-o npy`` files read by np.load(mmap_mode="r") for every dtype. Expected values from torch.load, the
safetensors library and numpy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch as st
import torch
from craft import to_big_endian
from helpers import ALL_DTYPES, MODEL_FILES, dotted_tensors, make, run_ckptfs, save, views, write_hf_bin_shards
from safetensors import safe_open

pytestmark = pytest.mark.mount


def safetensors_accepts(t: torch.Tensor) -> bool:
    try:
        st.save({"x": t.contiguous()})
    except Exception:  # noqa: BLE001 - the writer's refusal is the answer
        return False
    return True


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("views")
    sd = {}
    for name in ALL_DTYPES:
        sd[f"{name}.contig"] = make(name)
        sd[f"{name}.t"] = make(name, (4, 6)).t()
    for name, v in views().items():
        sd[f"views.{name}"] = v
    emb = torch.nn.Embedding(30, 8)
    sd |= {"tied.a": emb.weight, "tied.b": emb.weight, "epoch": 3, "hparams": {"lr": 0.5}}
    return save(d / "model.pth", sd)


# --- a checkpoint file ------------------------------------------------------------------------------------------


def test_safetensors_view_of_a_checkpoint(corpus, mount, tmp_path):
    m = mount(corpus, "--view", "safetensors")
    assert sorted(os.listdir(m.path)) == [".ckptfs", "model.safetensors"]
    virtual = m / "model.safetensors"
    ref = torch.load(corpus, weights_only=True)
    with safe_open(virtual, "pt") as f:  # maps the whole virtual file
        keys = set(f.keys())
        for key, t in ref.items():
            if not isinstance(t, torch.Tensor) or not safetensors_accepts(t):
                assert key not in keys
                continue
            got = f.get_tensor(key)
            if got.dtype == torch.float4_e2m1fn_x2:
                got, t = got.view(torch.uint8), t.view(torch.uint8)
            assert torch.equal(got, t.contiguous()), key
        md = f.metadata()
    assert json.loads(md["epoch"]) == 3 and json.loads(md["hparams"]) == {"lr": 0.5}
    assert "complex128.contig" in json.loads(md["ckptfs.omitted"])
    # the same bytes as a file written by ckptfs export, and both load in the library's other loader
    exported = tmp_path / "exported.safetensors"
    r = run_ckptfs("export", str(corpus), str(exported))
    assert r.returncode == 0, r.stderr
    assert virtual.read_bytes() == exported.read_bytes()
    a, b = st.load_file(virtual), st.load_file(exported)
    assert a.keys() == b.keys() == keys
    assert json.loads((m / ".ckptfs/mount.json").read_bytes())["view"] == "safetensors"


PAGE_FAULTS = r"""
import hashlib, mmap, os, random, sys, threading
import numpy as np
from safetensors import safe_open

path, truth = sys.argv[1], sys.argv[2]
size = os.path.getsize(path)
want = open(truth, "rb").read()
assert len(want) == size
fd = os.open(path, os.O_RDONLY)
mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
arr = np.frombuffer(mm, dtype=np.uint8)
errors = []
start = threading.Barrier(16)

def worker(i):
    rnd = random.Random(i)
    start.wait()
    try:
        # page faults all over the map: every thread, at once, in its own order
        for _ in range(300):
            off = rnd.randrange(0, size - 1)
            n = min(size - off, rnd.choice([1, 4096, 65536, 1 << 20]))
            if arr[off : off + n].tobytes() != want[off : off + n]:
                errors.append(f"thread {i}: bytes differ at {off} +{n}")
                return
        with safe_open(path, "pt") as f:  # the library's own map, from 16 threads too
            for k in rnd.sample(list(f.keys()), 8):
                f.get_tensor(k).sum()
    except Exception as e:
        errors.append(f"thread {i}: {type(e).__name__}: {e}")

threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
for t in threads: t.start()
for t in threads: t.join()
print("\n".join(errors))
sys.exit(1 if errors else 0)
"""


@pytest.mark.parametrize("threads", [False, True], ids=["single-threaded", "multi-threaded"])
def test_16_threads_page_faulting_one_mapped_virtual_file(tmp_path, mount, threads):
    g = torch.Generator().manual_seed(5)
    sd = {f"layer.{i}.w": torch.randn(256, 1024, generator=g) for i in range(12)}  # 12 MiB of ranges
    sd["wt"] = torch.randn(1024, 1536, generator=g).t()  # 6 MiB gathered on the fly
    sd["be"] = torch.randn(3, 1000, generator=g).half()
    p = save(tmp_path / "faults.pth", sd)
    truth = tmp_path / "truth.safetensors"
    st.save_file({k: v.contiguous() for k, v in sd.items()}, truth, metadata={"format": "pt"})  # the writer's bytes
    m = mount(p, "--view", "safetensors", *(["--threads"] if threads else []))
    proc = subprocess.run([sys.executable, "-c", PAGE_FAULTS, str(m / "faults.safetensors"), str(truth)],
                          capture_output=True, text=True, timeout=240)  # a deadlock fails here, never hangs
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- an HF model directory ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> tuple[Path, dict]:
    d = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    emb = torch.randn(100, 16)
    sd = {"embed.weight": emb, "lm_head.weight": emb}  # tied: huggingface_hub keeps them in one shard
    sd |= {f"layers.{i}.weight": torch.randn(32, 16) for i in range(5)} | {"norm.bias": torch.randn(16)}
    shards = write_hf_bin_shards(d, sd, max_shard_size=5000)
    (d / "config.json").write_text('{"model_type": "test"}\n')
    (d / "tokenizer").mkdir()
    (d / "tokenizer" / "vocab.txt").write_bytes(bytes(range(256)) * 10)
    (d / "README.md").write_text("hello\n")
    (d / "blobs").mkdir()
    (d / "blobs" / "abc").write_text("linked\n")
    (d / "generation_config.json").symlink_to(d / "blobs" / "abc")  # an HF cache snapshot links to blobs
    return d, {"sd": sd, "shards": shards}


def test_hf_directory_becomes_a_safetensors_model(hf_dir, mount):
    d, info = hf_dir
    shards = info["shards"]
    n = len(shards)
    assert n >= 3  # the premise
    m = mount(d, "--view", "safetensors")
    names = set(os.listdir(m.path))
    want = {f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)}
    assert names == want | {"model.safetensors.index.json", "config.json", "tokenizer", "README.md", "blobs",
                            "generation_config.json", ".ckptfs"}
    for rel in ("config.json", "tokenizer/vocab.txt", "README.md", "generation_config.json", "blobs/abc"):
        assert (m / rel).read_bytes() == (d / rel).read_bytes(), rel
    index = json.loads((m / "model.safetensors.index.json").read_bytes())
    original = json.loads((d / "pytorch_model.bin.index.json").read_bytes())
    assert set(index["weight_map"]) == set(original["weight_map"])
    for i, src in enumerate(shards):  # shard i of the view holds the tensors of .bin shard i
        name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        ref = torch.load(d / src, weights_only=True)
        got = st.load_file(m / name)
        assert got.keys() == ref.keys()
        for k in got:
            assert torch.equal(got[k], ref[k]) and index["weight_map"][k] == name


def test_export_keep_shards_writes_the_view_s_files(hf_dir, mount, tmp_path):
    d, _ = hf_dir
    m = mount(d, "--view", "safetensors")
    out = tmp_path / "out"
    r = run_ckptfs("export", str(d), str(out), "--keep-shards")
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(out)) == sorted(x for x in os.listdir(m.path) if x != ".ckptfs")
    for rel in [x for x in os.listdir(out) if not os.path.isdir(out / x)] + ["tokenizer/vocab.txt"]:
        assert (out / rel).read_bytes() == (m / rel).read_bytes(), rel


def test_hf_safetensors_shards_shown_as_they_are(hf_sharded, mount):
    """A directory of safetensors shards (huggingface_hub's writer): the same shard names, each holding what
    the source shard holds, the HF index, and the model files passed through."""
    d = hf_sharded["safetensors"]
    original = json.loads((d / "model.safetensors.index.json").read_bytes())
    shards = sorted(set(original["weight_map"].values()))
    assert len(shards) > 2  # the premise
    m = mount(d, "--view", "safetensors")
    assert set(os.listdir(m.path)) == set(os.listdir(d)) | {".ckptfs"}
    for name in MODEL_FILES:
        assert (m / name).read_bytes() == (d / name).read_bytes(), name
    index = json.loads((m / "model.safetensors.index.json").read_bytes())
    assert index["weight_map"] == original["weight_map"]
    for name in shards:
        ref = st.load_file(d / name)
        with safe_open(m / name, "pt") as f:  # maps the whole virtual file
            assert set(f.keys()) == set(ref)
            for k, t in ref.items():
                got = f.get_tensor(k)
                assert got.dtype == t.dtype and torch.equal(got, t), (name, k)


def test_dcp_directory_with_config_json(dcp_checkpoints, mount, tmp_path):
    """A DCP directory carrying a config.json: model.safetensors (the tensors torch's dcp_to_torch_save
    gives) and config.json byte-exact."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    src = tmp_path / "dcp"
    shutil.copytree(dcp_checkpoints / "w4", src)
    (src / "config.json").write_text('{"model_type": "test"}\n')
    dcp_to_torch_save(dcp_checkpoints / "w4", tmp_path / "ref.pt")
    want = dotted_tensors(torch.load(tmp_path / "ref.pt", weights_only=False))
    assert want
    m = mount(src, "--view", "safetensors")
    assert sorted(os.listdir(m.path)) == [".ckptfs", "config.json", "model.safetensors"]
    assert (m / "config.json").read_bytes() == (src / "config.json").read_bytes()
    got = st.load_file(m / "model.safetensors")
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k


def test_view_errors_are_one_line(tmp_path, corpus):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = run_ckptfs("mount", "--view", "safetensors", "-o", "npy", str(corpus), str(mnt))
    assert r.returncode != 0 and "-o npy applies to --view tree" in r.stderr
    empty = tmp_path / "nothing"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    r = run_ckptfs("mount", "--view", "safetensors", str(empty), str(mnt))
    assert r.returncode != 0 and "no checkpoint in this directory" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = run_ckptfs("mount", str(empty), str(mnt))  # the tree view: the same directory reading (ckptfs.open)
    assert r.returncode != 0 and "no checkpoint in this directory" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not os.listdir(mnt)


# --- .npy files ---------------------------------------------------------------------------------------------------


def npy_expected(t: torch.Tensor) -> np.ndarray:
    """What docs/layout.md says the .npy holds: numpy's own array, the raw bits for bfloat16 / float8 /
    float4, (real, imaginary) float16 pairs for complex32."""
    t = t.detach().contiguous()
    if t.dtype == torch.complex32:
        return torch.view_as_real(t).numpy()
    if t.dtype == torch.bfloat16 or "float8" in str(t.dtype) or "float4" in str(t.dtype):
        return t.view(torch.uint16 if t.element_size() == 2 else torch.uint8).numpy()
    return t.numpy()


def test_npy_files_every_dtype_with_mmap(corpus, mount):
    m = mount(corpus, "-o", "npy")
    ref = torch.load(corpus, weights_only=True)
    checked = 0
    for key, t in ref.items():
        if not isinstance(t, torch.Tensor):
            continue
        path = m.path.joinpath(*key.split("."))
        arr = np.load(str(path) + ".npy", mmap_mode="r")
        want = npy_expected(t)
        assert arr.dtype == want.dtype and arr.shape == want.shape, key
        assert np.array_equal(arr, want, equal_nan=want.dtype.kind in "fc"), key
        if arr.size:
            assert isinstance(arr, np.memmap), key  # mapped from the mount, not read into memory
        checked += 1
    assert checked == len([v for v in ref.values() if isinstance(v, torch.Tensor)])
    assert "x.npy.json" not in os.listdir(m.path) and not (m / "epoch.npy").exists()  # tensors only


def test_npy_of_a_big_endian_checkpoint(tmp_path, mount):
    base = torch.arange(12, dtype=torch.float64).reshape(3, 4) * 1.5
    little = save(tmp_path / "little.pt", {"f": base.float(), "i": base.to(torch.int64)})
    big = tmp_path / "big.pt"
    to_big_endian(little, big, {"0": 4, "1": 8})
    ref = torch.load(big, weights_only=True)
    m = mount(big, "-o", "npy")
    for k in ("f", "i"):
        arr = np.load(m / f"{k}.npy", mmap_mode="r")
        assert arr.dtype.byteorder == ">" and np.array_equal(arr, ref[k].numpy()), k


# --- what a model directory must not be able to make the view or export do --------------------------------------


def _bin_model(d: Path) -> list[str]:
    torch.manual_seed(1)
    sd = {f"layers.{i}.weight": torch.randn(32, 16) for i in range(4)}
    shards = write_hf_bin_shards(d, sd, max_shard_size=3000)
    assert len(shards) >= 2  # the premise
    (d / "config.json").write_text("{}\n")
    return shards


def _disagreeing(tmp_path: Path, how: str) -> Path:
    d = tmp_path / how
    d.mkdir()
    shards = _bin_model(d)
    index_path = d / "pytorch_model.bin.index.json"
    index = json.loads(index_path.read_text())
    if how == "key-in-two-shards":  # the second shard holds a key of the first as well
        second = torch.load(d / shards[1], weights_only=True)
        first_key = next(k for k, s in index["weight_map"].items() if s == shards[0])
        torch.save({**second, first_key: torch.zeros(32, 16)}, d / shards[1])
    elif how == "mapped-to-the-wrong-shard":
        key = next(k for k, s in index["weight_map"].items() if s == shards[0])
        index["weight_map"][key] = shards[1]
        index_path.write_text(json.dumps(index))
    elif how == "unmapped-key":
        first = torch.load(d / shards[0], weights_only=True)
        torch.save({**first, "stray": torch.ones(2)}, d / shards[0])
    elif how == "shard-symlinked-out":
        outside = tmp_path / f"{how}-outside.bin"
        shutil.move(d / shards[1], outside)
        (d / shards[1]).symlink_to(outside)
    return d


@pytest.mark.parametrize("how", ["key-in-two-shards", "mapped-to-the-wrong-shard", "unmapped-key",
                                 "shard-symlinked-out"])
def test_a_bin_index_and_shards_that_disagree_are_refused_by_every_front_end(tmp_path, mount, how):
    """The view and export read a .bin model directory as ls does: the index cross-checked with its shards,
    shards opened only inside the directory (one-line error, exit 2, nothing written or mounted)."""
    d = _disagreeing(tmp_path, how)
    r = run_ckptfs("ls", str(d))
    assert r.returncode == 2, r.stdout
    reason = r.stderr.strip()
    assert len(reason.splitlines()) == 1 and "pytorch_model" in reason
    out = tmp_path / f"{how}-out"
    r = run_ckptfs("export", str(d), str(out))
    assert r.returncode == 2 and not out.exists()
    assert r.stderr.strip() == reason  # the same reading, the same words
    mnt = tmp_path / f"{how}-mnt"
    mnt.mkdir()
    r = run_ckptfs("mount", "--view", "safetensors", str(d), str(mnt))
    try:
        assert r.returncode == 2 and r.stderr.strip().endswith(reason.split(": ", 1)[1]), r.stderr
        assert not os.path.ismount(mnt)
    finally:
        if os.path.ismount(mnt):
            run_ckptfs("umount", str(mnt))


def test_files_passed_through_never_leave_the_directory(tmp_path, mount):
    """A model directory's other files are served and copied only if they lie inside it (an HF cache
    snapshot's links into its blobs/ excepted): a symlink to a file or a directory outside is left out."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "SECRET.txt").write_text("top secret\n")
    d = tmp_path / "model"
    d.mkdir()
    _bin_model(d)
    (d / "tokenizer.json").symlink_to(outside / "SECRET.txt")
    (d / "extra").symlink_to(outside)
    (d / "inside.json").symlink_to(d / "config.json")  # a link that stays inside is fine
    out = tmp_path / "out"
    r = run_ckptfs("export", str(d), str(out))
    assert r.returncode == 0, r.stderr
    assert "tokenizer.json" not in os.listdir(out) and "extra" not in os.listdir(out)
    assert (out / "inside.json").read_text() == "{}\n"
    m = mount(d, "--view", "safetensors")
    names = os.listdir(m.path)
    assert "tokenizer.json" not in names and "extra" not in names and "inside.json" in names
    for root in (out, m.path):
        for dirpath, _, files in os.walk(root):
            for f in files:
                assert b"top secret" not in Path(dirpath, f).read_bytes()[:1 << 20], (dirpath, f)
