"""Through real FUSE mounts: every file, sidecar, value and attribute against torch.load, on generated
checkpoints of every kind the foundation reads (docs/layout.md is what is checked)."""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import ALL_DTYPES, lookup, make, torch_bytes, views

import ckptfs

SIDECAR_SUFFIX = ".json"  # docs/layout.md: the sidecar of a/b/c is a/b/c.json

pytestmark = pytest.mark.mount


# --- the corpus ---------------------------------------------------------------------------------------------------


def training_checkpoint() -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                                torch.nn.Linear(4, 2))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 3, 3, 3)).sum().backward()
    opt.step()
    groups = [{"lr": 0.1, "tags": ("a", "b")}]
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 7, "loss": 0.25,
            "name": "run/1", "flag": True, "nothing": None, "blob": b"\x00\x01\xff", "cplx": 1 + 2j,
            "nested": [[1, 2], (3, 4.5)], "groups": groups, "same_groups": groups, "dtype": torch.float16,
            "device": torch.device("cpu")}


def hostile_checkpoint() -> dict:
    t = torch.arange(6, dtype=torch.float32)
    return {
        "": t + 1, ".": t + 2, "..": t + 3, "a/b": t + 4, "../../etc/passwd": t + 5, "nul\x00key": t + 6,
        ".hidden": t + 7, "k" * 70_000: t + 8, "bad\udc80utf8": t + 9, "lone\ud800": t + 10, 3: t + 11,
        (1, "x.y"): t + 12, None: t + 13, "Weight": t + 14, "weight": t + 15, "a.b": t + 16, "a.b.c": t + 17,
        "a..b": t + 18, "%41": t + 19, "3": t + 20, "x.json": t + 21, "tab\there": t + 22, "\u202eevil": t + 23,
        "n": {"a.b": t + 24, "a": {"b": t + 25}}, 2.5: t + 26, b"raw": t + 27, "deep." * 80 + "end": t + 28,
    }


#: numpy arrays saved in the corpus, by checkpoint and path, with the dtype they were saved in (numpy may
#: unpickle a big-endian array to native order; the file stores it as saved). Everything else in the corpus
#: is written here, in this machine's byte order.
NUMPY_SAVED = {("others", ("numpy",)): np.dtype(">i4"), ("others", ("np_f32",)): np.dtype(np.float32)}


def build_corpus(d: Path) -> dict[str, Path]:
    out = {}

    def save(name: str, obj, **kw) -> None:
        out[name] = d / f"{name}.pth"
        torch.save(obj, out[name], **kw)

    sd = {}
    for name in ALL_DTYPES:
        sd[f"{name}.contig"] = make(name)
        sd[f"{name}.t"] = make(name, (4, 6)).t()
    save("dtypes", sd)
    save("views", views())
    save("training", training_checkpoint())
    emb = torch.nn.Embedding(10, 4)
    save("tied", {"emb.weight": emb.weight, "head.weight": emb.weight, "T": emb.weight.data.t()})
    save("legacy", {"w": torch.randn(5, 3), "t": torch.randn(4, 2).t(), "meta": {"step": 3}},
         _use_new_zipfile_serialization=False)
    save("protocol4", {"a": torch.randn(4, 3), "b": [b"bytes", "x"]}, pickle_protocol=4)
    save("top_tensor", torch.arange(12).reshape(3, 4))
    save("top_list", [torch.ones(2), {"x": torch.zeros(1)}, 5])
    q = torch.quantize_per_tensor(torch.randn(4, 4), 0.1, 3, torch.qint8)
    save("others", {"q": q, "sparse": torch.randn(3, 3).to_sparse(), "numpy": np.arange(6, dtype=">i4").reshape(2, 3),
                    "np_f32": np.ones((2, 2), np.float32), "meta": torch.empty(3, 4, device="meta"),
                    "storage": torch.arange(4, dtype=torch.int16).untyped_storage(), "ok": torch.ones(3)})
    save("hostile", hostile_checkpoint())
    out["deflated"] = d / "deflated.pth"  # records re-zipped with deflate: inflated on read
    with zipfile.ZipFile(out["views"]) as zin, zipfile.ZipFile(out["deflated"], "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename))
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    return build_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def mounted(corpus, module_mount):
    return {name: module_mount(p) for name, p in corpus.items()}


# --- checks ---------------------------------------------------------------------------------------------------------


def expected_bytes(obj, saved_as: np.dtype | None = None) -> bytes:
    """What the file stores for torch.load's ``obj``: a tensor's bytes (native order: the corpus is written
    here), a storage's bytes, a numpy array in the dtype it was saved in (``saved_as``)."""
    if isinstance(obj, np.ndarray):
        assert saved_as is not None, "a numpy array the corpus does not list in NUMPY_SAVED"
        return np.ascontiguousarray(obj, dtype=saved_as).tobytes()
    if isinstance(obj, torch.TypedStorage):
        obj = obj.untyped()
    if isinstance(obj, torch.UntypedStorage):
        return bytes(obj)
    if obj.is_meta:
        return b""
    return torch_bytes(obj)


def expected_numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype docs/layout.md gives a torch dtype in a little-endian file: numpy's own where torch
    converts to numpy, the ml_dtypes type for bfloat16 and the float8 kinds."""
    if name == "bfloat16" or name.startswith("float8"):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    return torch.empty(0, dtype=getattr(torch, name)).numpy().dtype


def value_bytes(v) -> bytes:
    """What layout.md says a value's file holds."""
    if isinstance(v, str):
        return v.encode("utf-8", "surrogatepass")
    if isinstance(v, bytes):
        return v
    return json.dumps(v).encode()


def sidecar(path: Path) -> dict:
    return json.loads(path.with_name(path.name + SIDECAR_SUFFIX).read_bytes())


def user_memmap(path: Path, sc: dict):
    """np.memmap the way docs/layout.md tells users to."""
    name = sc["numpy_dtype"]
    if name.lstrip("<>|=")[0].isalpha() and len(name.lstrip("<>|=")) > 3:  # an ml_dtypes name
        import ml_dtypes

        dt = np.dtype(getattr(ml_dtypes, name.lstrip(">")))
        dt = dt.newbyteorder(">") if name.startswith(">") else dt
    else:
        dt = np.dtype(name)
    return np.memmap(path, dtype=dt, mode="r", shape=tuple(sc["shape"]))


def check_mount(m, ckpt_path: Path, name: str) -> dict[str, int]:
    """Every key of the checkpoint ``name`` of the corpus through the mount; returns counts by kind."""
    ref = torch.load(ckpt_path, weights_only=False)
    index = m.index()
    entries = {e["key"]: e for e in index["entries"]}
    counts = {"tensor": 0, "served": 0, "leaf": 0}
    with ckptfs.open(ckpt_path) as ck:
        for key in ck.keys():
            meta = ck.meta(key)
            e = entries[key]
            f = m.path / e["path"]
            st = os.lstat(f)
            assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o444, key
            if meta.kind == "tensor":
                counts["tensor"] += 1
                sc = sidecar(f)
                assert sc == {**json.loads(json.dumps(meta.to_dict())), **{k: sc[k] for k in
                              ("file", "path_repr", "served", "error") if k in sc}}, key
                assert sc["file"] == e["path"] and sc["path_repr"] == repr(meta.path)
                for field in ("key", "dtype", "shape", "numpy_dtype", "nbytes", "stride", "storage_offset",
                              "byteorder", "record", "requires_grad"):
                    assert field in sc, (key, field)
                # every tensor of the corpus is one torch.load reads: each must be served (an unservable
                # tensor is test_broken_tensor_is_an_empty_file_whose_sidecar_says_why)
                assert sc["served"] is True, (key, sc.get("error"), sc.get("unsupported"))
                counts["served"] += 1
                exp = lookup(ref, meta.path)
                want = expected_bytes(exp, NUMPY_SAVED.get((name, meta.path)))
                assert st.st_size == meta.nbytes == len(want) == e["size"], key
                assert st.st_blocks == math.ceil(st.st_size / 512) and st.st_blksize >= 1 << 20
                assert f.read_bytes() == want, key
                with open(f, "rb") as fh:  # ranges, unaligned
                    if len(want) > 5:
                        assert os.pread(fh.fileno(), len(want) - 3, 3) == want[3:], key
                if sc["numpy_dtype"] is not None and sc["tensor_kind"] != "meta":
                    arr = ckptfs.memmap(f)
                    assert arr.shape == tuple(sc["shape"]) and arr.tobytes() == want, key
                    if len(want):
                        assert user_memmap(f, sc).tobytes() == want, key
                    if meta.dtype in ("float32", "float16", "bfloat16", "float64") or meta.dtype.startswith("float8"):
                        exp = lookup(ref, meta.path)
                        exp = exp if isinstance(exp, np.ndarray) else exp.detach().double().numpy()
                        np.testing.assert_array_equal(arr.astype(np.float64), exp)
            else:
                counts["leaf"] += 1
                v = lookup(ref, meta.path)
                data = f.read_bytes()
                if isinstance(v, (str, bytes, int, float, type(None))):
                    assert data == value_bytes(v), key
                    assert not f.with_name(f.name + SIDECAR_SUFFIX).exists(), key
                else:  # dtype, device, complex ...: JSON with a sidecar that says the type
                    json.loads(data)
                    assert sidecar(f)["kind"] == "leaf", key
                assert st.st_size == len(data) == e["size"]
    return counts


# --- content ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["dtypes", "views", "training", "tied", "legacy", "protocol4", "top_tensor",
                                  "top_list", "others", "hostile", "deflated"])
def test_every_key_through_the_mount(corpus, mounted, name):
    counts = check_mount(mounted[name], corpus[name], name)
    assert counts["tensor"] > 0 and counts["served"] > 0
    if name == "dtypes":
        assert counts["served"] == 2 * len(ALL_DTYPES)


def test_user_story_paths(mounted):
    m = mounted["training"]
    assert sorted(os.listdir(m / "model/0")) == ["bias", "bias.json", "weight", "weight.json"]
    assert (m / "optimizer/state/0/exp_avg").is_file()
    assert (m / "epoch").read_bytes() == b"7" and (m / "name").read_bytes() == b"run/1"
    assert (m / "flag").read_bytes() == b"true" and (m / "nothing").read_bytes() == b"null"
    assert (m / "blob").read_bytes() == b"\x00\x01\xff"
    assert (m / "nested/1/1").read_bytes() == b"4.5"
    assert sidecar(m / "dtype")["type"] == "torch.dtype" and json.loads((m / "dtype").read_bytes()) == "torch.float16"
    # a container met twice is a symlink to the first place it was met
    link = m / "same_groups"
    assert link.is_symlink() and os.readlink(link) == "groups"
    assert sidecar(link)["kind"] == "link" and sidecar(link)["target"] == "groups"
    assert (link / "0/lr").read_bytes() == b"0.1"
    t = mounted["top_tensor"]
    assert sorted(n for n in os.listdir(t.path) if not n.startswith(".")) == ["%root", "%root.json"]
    assert sidecar(t / "%root")["key"] == ""


def test_walk_finds_every_key_exactly_once(corpus, mounted):
    for name, m in mounted.items():
        index = m.index()
        want = [e["path"] for e in index["entries"] if e["kind"] in ("tensor", "leaf", "link")]
        found = []
        for root, dirs, files in os.walk(m.path):
            rel = os.path.relpath(root, m.path)
            if rel == ".":
                dirs.remove(".ckptfs")
            for n in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
                if n.endswith(SIDECAR_SUFFIX):
                    continue
                found.append(n if rel == "." else f"{rel}/{n}")
        assert sorted(found) == sorted(want), name
        assert len(set(found)) == len(found)
        with ckptfs.open(corpus[name]) as ck:
            keys = [e["key"] for e in index["entries"] if e["kind"] in ("tensor", "leaf")]
            assert sorted(keys) == sorted(ck.keys())


def test_hostile_keys_round_trip(mounted):
    m = mounted["hostile"]
    ref = torch.load(m.checkpoint, weights_only=False)
    seen = {}
    for root, dirs, files in os.walk(m.path):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for n in files:
            assert "/" not in n and "\x00" not in n and not n.startswith(".")
            assert len(n.encode()) <= 255
            if n.endswith(SIDECAR_SUFFIX):
                continue
            sc = sidecar(Path(root) / n)
            path = eval(sc["path_repr"])  # noqa: S307 - our own repr of str/int/float/None/bytes/tuple keys
            seen[path] = (Path(root) / n).read_bytes()
    assert len(seen) == 28
    for path, data in seen.items():
        assert data == torch_bytes(lookup(ref, path)), path
    where = {eval(e["original_repr"]): e["path"] for e in m.index()["entries"] if "original_repr" in e}  # noqa: S307
    assert where[("",)] == "%%''%~2"  # the directory made by "." and ".." took the name first
    assert where[(".",)] == "%%''/%%''%~2" and where[("..",)] == "%%''/%%''/%%''"
    assert where[(".hidden",)] == "%%''/hidden"
    assert where[("../../etc/passwd",)] == "%%''/%%''/%2F/%%''/%2Fetc%2Fpasswd"
    assert where[("a/b",)] == "a%2Fb" and where[("nul\x00key",)] == "nul%00key" and where[("%41",)] == "%2541"
    assert where[("bad\udc80utf8",)] == "bad%ED%B2%80utf8" and where[("tab\there",)] == "tab%09here"
    assert where[("\u202eevil",)] == "%E2%80%AEevil"
    assert where[("Weight",)] == "Weight" and where[("weight",)] == "weight"
    assert where[(None,)] == "%%None" and where[(2.5,)] == "%%2%2E5" and where[(b"raw",)] == "%%b'raw'"
    assert where[((1, "x.y"),)] == "%%(1, 'x%2Ey')"
    assert where[(3,)] == "3" and where[("3",)] == "3%~2"  # int 3 and str "3": the later one is renamed
    assert where[("a.b",)] == "a/b%~2" and where[("a.b.c",)] == "a/b/c"  # a leaf that is also a prefix
    assert where[("n", "a.b")] == "n/a/b" and where[("n", "a", "b")] == "n/a/b%~2"
    assert where[("x.json",)] == "x/json"
    long = where[("k" * 70_000,)]
    assert "%#" in long and len(long.encode()) <= 230
    deep = where[("deep." * 80 + "end",)]
    assert deep.count("/") == 63 and deep.endswith("deep%2Edeep%2E" * 8 + "end")


def test_index_json(mounted):
    m = mounted["training"]
    idx = m.index()
    assert idx["format"] == "ckptfs-index" and idx["checkpoint"] == str(m.checkpoint)
    by_key = {e["key"]: e for e in idx["entries"]}
    e = by_key["optimizer.state.0.exp_avg"]
    assert e["path"] == "optimizer/state/0/exp_avg" and e["kind"] == "tensor" and e["dtype"] == "float32"
    assert e["nbytes"] == e["size"] == math.prod(e["shape"]) * 4 and e["sidecar"] == e["path"] + ".json"
    assert by_key["epoch"]["kind"] == "leaf" and by_key["model"]["kind"] == "dict"
    assert sorted(os.listdir(m / ".ckptfs")) == ["index.json", "mount.json"]
    assert ".ckptfs" in os.listdir(m.path)


def test_xattrs(mounted):
    m = mounted["training"]
    f = m / "model/3/weight"
    names = os.listxattr(f)
    assert "user.ckptfs.dtype" in names and "user.ckptfs.shape" in names
    assert os.getxattr(f, "user.ckptfs.dtype") == b"float32"
    assert json.loads(os.getxattr(f, "user.ckptfs.shape")) == [2, 4]
    assert os.getxattr(f, "user.ckptfs.key") == b"model.3.weight"
    with pytest.raises(OSError) as e:
        os.getxattr(f, "user.nope")
    assert e.value.errno == errno.ENODATA
    assert os.getxattr(m / "model", "user.ckptfs.kind") == b"dict"
    if shutil.which("getfattr"):  # the attr package is optional
        out = subprocess.run(["getfattr", "-d", str(f)], capture_output=True, text=True, check=True)
        assert 'user.ckptfs.dtype="float32"' in out.stdout


def test_attributes_and_statfs(mounted):
    m = mounted["training"]
    mtime = os.stat(m.checkpoint).st_mtime_ns
    for p in (m.path, m / "model", m / "model/3/weight", m / "model/3/weight.json", m / "epoch"):
        st = os.lstat(p)
        assert st.st_uid == os.getuid() and st.st_gid == os.getgid()
        assert st.st_mtime_ns == mtime and st.st_atime_ns == mtime and st.st_ctime_ns == mtime
        assert stat.S_IMODE(st.st_mode) == (0o555 if stat.S_ISDIR(st.st_mode) else 0o444)
        assert st.st_blocks == math.ceil(st.st_size / 512)
        assert os.lstat(p).st_ino == st.st_ino  # stable
    inodes = [os.lstat(m / p).st_ino for p in ("model", "model/3", "model/3/weight", "epoch")]
    assert len(set(inodes)) == 4
    sub = [d for d in os.listdir(m / "model") if (m / "model" / d).is_dir()]
    assert os.stat(m / "model").st_nlink == 2 + len(sub)
    vfs = os.statvfs(m.path)
    assert vfs.f_bsize >= 1 << 20 and vfs.f_namemax == 255 and vfs.f_bfree == 0 and vfs.f_files > 10
    total = sum(e["nbytes"] for e in m.index()["entries"] if e["kind"] == "tensor")
    assert vfs.f_blocks * vfs.f_frsize >= total


def test_du_is_exact(mounted):
    for name in ("training", "views", "dtypes", "hostile"):
        m = mounted[name]
        entries = m.index()["entries"]
        tops = {e["path"].split("/")[0] for e in entries}
        for top in sorted(tops):
            under = [e for e in entries if e["path"] == top or e["path"].startswith(top + "/")]
            data = sum(e["size"] for e in under if e["kind"] in ("tensor", "leaf"))
            data += sum(len(e["link"]) for e in under if e["kind"] == "link")
            side = sum(os.lstat(m / e["sidecar"]).st_size for e in under if e.get("sidecar", "").startswith(top + "/"))
            out = subprocess.run(["du", "-sb", "--exclude=*.json", "--", top], cwd=m.path, capture_output=True,
                                 text=True, check=True).stdout
            assert int(out.split()[0]) == data, (name, top)
            out = subprocess.run(["du", "-sb", "--", top], cwd=m.path, capture_output=True, text=True,
                                 check=True).stdout
            assert int(out.split()[0]) == data + side, (name, top)


WRITES = [
    ("open for writing", lambda p: open(p / "epoch", "r+b")),
    ("create", lambda p: open(p / "new", "wb")),
    ("O_TRUNC", lambda p: os.open(p / "epoch", os.O_WRONLY | os.O_TRUNC)),
    ("truncate", lambda p: os.truncate(p / "epoch", 0)),
    ("chmod", lambda p: os.chmod(p / "epoch", 0o777)),
    ("chown", lambda p: os.chown(p / "epoch", 1, 1)),
    ("utime", lambda p: os.utime(p / "epoch", (0, 0))),
    ("mkdir", lambda p: os.mkdir(p / "d")),
    ("rmdir", lambda p: os.rmdir(p / "model")),
    ("unlink", lambda p: os.unlink(p / "epoch")),
    ("rename", lambda p: os.rename(p / "epoch", p / "epoch2")),
    ("symlink", lambda p: os.symlink("epoch", p / "l")),
    ("link", lambda p: os.link(p / "epoch", p / "l2")),
    ("setxattr", lambda p: os.setxattr(p / "epoch", "user.x", b"1")),
    ("removexattr", lambda p: os.removexattr(p / "model/3/weight", "user.ckptfs.dtype")),
    ("mknod", lambda p: os.mkfifo(p / "fifo")),
]


@pytest.mark.parametrize("what,op", WRITES, ids=[w[0] for w in WRITES])
def test_writes_fail_with_erofs(mounted, what, op):
    with pytest.raises(OSError) as e:
        op(mounted["training"].path)
    assert e.value.errno == errno.EROFS, what


READER = r"""
import os, random, sys
path, truth, seed, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rnd = random.Random(seed)
size = os.path.getsize(truth)
assert os.path.getsize(path) == size
fd, td = os.open(path, os.O_RDONLY), os.open(truth, os.O_RDONLY)
for i in range(n):
    off = rnd.randrange(size)
    k = rnd.choice([1, 7, 4096, 65536, 1 << 20, 3 << 20])
    if os.pread(fd, k, off) != os.pread(td, k, off):
        sys.exit(f"mismatch at {off} +{k}")
"""


@pytest.mark.parametrize("threads", [False, True], ids=["single-threaded", "multi-threaded"])
def test_eight_concurrent_readers(tmp_path, mount, threads):
    g = torch.Generator().manual_seed(1)
    big = torch.randn(4 << 20, generator=g)  # 16 MiB contiguous
    strided = torch.randn(1024, 1536, generator=g).t()  # 6 MiB gathered
    p = tmp_path / "c.pth"
    torch.save({"big": big, "strided": strided}, p)
    m = mount(p, *(["--threads"] if threads else []))
    procs = []
    for i in range(8):
        name = "big" if i % 2 == 0 else "strided"
        truth = tmp_path / f"{name}.truth"
        if not truth.exists():
            truth.write_bytes(torch_bytes(big if name == "big" else strided))
        procs.append(subprocess.Popen([sys.executable, "-c", READER, str(m / name), str(truth), str(i), "150"],
                                      stderr=subprocess.PIPE, text=True))
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    assert json.loads((m / ".ckptfs/mount.json").read_bytes())["threads"] is threads


@pytest.mark.parametrize("lib", ["2", "3"])
def test_libfuse2_and_libfuse3(corpus, mount, lib):
    from ctypes.util import find_library

    if find_library("fuse3" if lib == "3" else "fuse") is None:
        if os.environ.get("CKPTFS_REQUIRE_FUSE"):
            pytest.fail(f"libfuse{lib} is not installed (CI installs fuse3 and libfuse2)")
        pytest.skip(f"libfuse{lib} is not installed here")
    m = mount(corpus["views"], env={**os.environ, "CKPTFS_FUSE": lib})
    assert json.loads((m / ".ckptfs/mount.json").read_bytes())["libfuse"].startswith(lib + ".")
    counts = check_mount(m, corpus["views"], "views")
    assert counts["served"] == len(views())


def test_memmap_of_every_dtype_equals_the_tensor(mounted):
    """np.memmap with the sidecar's numpy_dtype, the documented way, for each dtype that has one."""
    m = mounted["dtypes"]
    ref = torch.load(m.checkpoint, weights_only=True)
    done = set()
    for name in ALL_DTYPES:
        for suffix in ("contig", "t"):
            f = m / name / suffix
            sc = sidecar(f)
            expected = ref[f"{name}.{suffix}"]
            if sc["numpy_dtype"] is None:
                assert sc["numpy_dtype_reason"] and name == "complex32"
                with pytest.raises(ckptfs.UnsupportedError):
                    ckptfs.memmap(f)
                continue
            arr = user_memmap(f, sc)
            assert arr.dtype == expected_numpy_dtype(name)
            assert arr.tobytes() == torch_bytes(expected)
            if expected.dtype.is_complex:
                np.testing.assert_array_equal(arr, expected.resolve_conj().numpy())
            elif expected.dtype != torch.bool and not expected.dtype.is_floating_point:
                np.testing.assert_array_equal(arr, expected.numpy())
            else:
                np.testing.assert_array_equal(arr.astype(np.float64), expected.double().numpy())
            done.add(name)
    assert done == set(ALL_DTYPES) - {"complex32"}


def test_exotic_tensors(mounted):
    m = mounted["others"]
    sc = sidecar(m / "sparse")  # a composite: a directory of its parts, with a sidecar
    assert (m / "sparse").is_dir() and sc["kind"] == "composite" and sc["tensor_kind"] == "sparse"
    assert sorted(os.listdir(m / "sparse")) == ["indices", "indices.json", "values", "values.json"]
    meta = sidecar(m / "meta")  # no data: an empty file; memmap says why
    assert meta["tensor_kind"] == "meta" and os.path.getsize(m / "meta") == 0
    with pytest.raises(ckptfs.UnsupportedError, match="meta"):
        ckptfs.memmap(m / "meta")
    q = sidecar(m / "q")
    assert q["tensor_kind"] == "quantized" and q["served"] is True and q["numpy_dtype"] == "|i1"


def test_broken_tensor_is_an_empty_file_whose_sidecar_says_why(tmp_path, mount):
    import zipfile

    p = tmp_path / "ok.pth"
    torch.save({"good": torch.ones(3), "bad": torch.zeros(4)}, p)
    q = tmp_path / "broken.pth"
    with zipfile.ZipFile(p) as zin, zipfile.ZipFile(q, "w") as zout:
        for info in zin.infolist():
            if not info.filename.endswith("data/1"):
                zout.writestr(info, zin.read(info.filename))
    m = mount(q)
    sc = sidecar(m / "bad")
    assert sc["served"] is False and "missing" in sc["error"] and os.path.getsize(m / "bad") == 0
    assert (m / "bad").read_bytes() == b""
    assert (m / "good").read_bytes() == torch_bytes(torch.ones(3))


def test_ordered_dict_and_nested_lists(tmp_path, mount):
    sd = OrderedDict([("b", torch.ones(1)), ("a", [torch.zeros(2), (torch.ones(3), {"k": 4})])])
    p = tmp_path / "o.pth"
    torch.save(sd, p)
    m = mount(p)
    assert os.listdir(m.path)[:3] == ["b", "b.json", "a"]  # checkpoint order, a sidecar after its file
    assert (m / "a/1/1/k").read_bytes() == b"4" and os.path.getsize(m / "a/1/0") == 12
    assert os.getxattr(m / "a/1", "user.ckptfs.kind") == b"tuple"
