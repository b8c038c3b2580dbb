"""``ckptfs export``: what it writes (read back by safetensors and compared with torch.load), its memory on a
4 GB checkpoint, what a killed export leaves (nothing at DST), refusing to overwrite, --verify, the
progress bar on a terminal only, and model directories."""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import pty
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
import safetensors.torch as st
import torch
from craft import to_big_endian
from helpers import CKPTFS, MODEL_FILES, dotted_tensors, run_ckptfs, save, write_hf_bin_shards
from safetensors import safe_open

import ckptfs
from ckptfs.api import export as export_api

GiB = 1 << 30


def resolved(t: torch.Tensor) -> torch.Tensor:
    return t.resolve_conj().resolve_neg().contiguous()


def export_ok(*args: str) -> subprocess.CompletedProcess:
    r = run_ckptfs("export", *args)
    assert r.returncode == 0, r.stderr
    return r


# --- what is written ----------------------------------------------------------------------------------------------


def test_tied_strided_and_big_endian_tensors(tmp_path):
    base = torch.arange(48, dtype=torch.float32).reshape(6, 8)
    emb = torch.randn(20, 4)
    little = save(tmp_path / "l.pth", {"emb": emb, "head": emb, "t": base.t(), "rows": base[1:4], "cols": base[:, 2:5],
                                       "d": torch.arange(10, dtype=torch.float64)})
    big = tmp_path / "b.pth"
    to_big_endian(little, big, {"0": 4, "1": 4, "2": 8})  # storages: emb (and head), base (t, rows, cols), d
    for src in (little, big):
        ref = torch.load(src, weights_only=True)
        out = tmp_path / (src.stem + ".safetensors")
        export_ok(str(src), str(out), "--verify")
        loaded = st.load_file(out)
        assert loaded.keys() == ref.keys()
        for k in ref:
            assert torch.equal(loaded[k], ref[k].contiguous()), (src.name, k)


def test_deflated_records_and_strided_views_of_them(tmp_path):
    """Records compressed in the zip (no range of the file to copy or map): contiguous tensors are inflated
    through the buffer, strided ones gathered from a spooled copy of their storage (removed afterwards)."""
    import zipfile

    base = torch.randn(300, 200)
    stored = save(tmp_path / "stored.pth", {"t": base.t(), "c": base, "s": base[::3, 1::2],
                                            "bt": torch.arange(60, dtype=torch.int16).reshape(6, 10).t()})
    deflated = tmp_path / "deflated.pth"
    with zipfile.ZipFile(stored) as zin, zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename))
    ref = torch.load(deflated, weights_only=True)
    out = tmp_path / "d.safetensors"
    export_ok(str(deflated), str(out), "--verify")
    loaded = st.load_file(out)
    for k in ref:
        assert torch.equal(loaded[k], ref[k].contiguous()), k
    assert sorted(os.listdir(tmp_path)) == ["d.safetensors", "deflated.pth", "stored.pth"]  # no spool left


def test_directory_output_is_hf_s_layout(tmp_path):
    torch.manual_seed(2)
    sd = {f"layers.{i}.w": torch.randn(100 * (i + 1)) for i in range(8)} | {"epoch": 4}
    p = save(tmp_path / "s.pth", sd)
    out = tmp_path / "out"
    r = export_ok(str(p), str(out), "--max-shard-size", "4KB", "--json")
    result = json.loads(r.stdout)
    files = sorted(os.listdir(out))
    n = len(files) - 1
    assert n > 2 and files == sorted([f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
                                     + ["model.safetensors.index.json"])
    index = json.loads((out / "model.safetensors.index.json").read_bytes())
    assert set(index["weight_map"]) == {k for k in sd if k != "epoch"}
    merged = {}
    for name in files[:-1]:
        with safe_open(out / name, "pt") as f:
            for k in f.keys():
                assert index["weight_map"][k] == name
                merged[k] = f.get_tensor(k)
            size = sum(f.get_tensor(k).numel() * 4 for k in f.keys())
            assert size <= 4000 or len(list(f.keys())) == 1  # HF's rule: only a tensor over the limit exceeds it
            if name == files[0]:
                assert json.loads(f.metadata()["epoch"]) == 4  # values ride in the first shard
    for k, t in sd.items():
        if k != "epoch":
            assert torch.equal(merged[k], t), k
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for k, t in sd.items() if k != "epoch")
    assert result["tensors"] == 8 and len(result["files"]) == len(files)
    # one shard: model.safetensors, no index
    out1 = tmp_path / "one"
    export_ok(str(p), str(out1))
    assert os.listdir(out1) == ["model.safetensors"]


def test_hf_directory_to_one_file(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    torch.manual_seed(3)
    sd = {f"h.{i}.weight": torch.randn(40, 30) for i in range(6)}
    shards = write_hf_bin_shards(d, sd, max_shard_size=12_000)
    assert len(shards) > 2
    (d / "config.json").write_text("{}")
    out = tmp_path / "all.safetensors"
    export_ok(str(d), str(out))
    loaded = st.load_file(out)
    assert loaded.keys() == sd.keys()
    for k in sd:
        assert torch.equal(loaded[k], sd[k])


def test_overwrite_only_with_force_and_clear_errors(tmp_path):
    p = save(tmp_path / "a.pth", {"w": torch.ones(3)})
    out = tmp_path / "a.safetensors"
    out.write_bytes(b"precious")
    r = run_ckptfs("export", str(p), str(out))
    assert r.returncode == 2 and "exists; pass --force" in r.stderr and out.read_bytes() == b"precious"
    export_ok(str(p), str(out), "--force")
    assert torch.equal(st.load_file(out)["w"], torch.ones(3))
    d = tmp_path / "dir"
    d.mkdir()
    (d / "keep.txt").write_text("x")
    r = run_ckptfs("export", str(p), str(d))
    assert r.returncode == 2 and "exists" in r.stderr and (d / "keep.txt").exists()
    export_ok(str(p), str(d), "--force")  # --force replaces the whole directory
    assert os.listdir(d) == ["model.safetensors"]
    r = run_ckptfs("export", str(p), str(tmp_path / "no" / "such" / "x.safetensors"))
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = run_ckptfs("export", str(tmp_path / "missing.pth"), str(tmp_path / "m.safetensors"))
    assert r.returncode == 2 and "missing.pth" in r.stderr and not (tmp_path / "m.safetensors").exists()
    before = p.read_bytes()
    r = run_ckptfs("export", str(p), str(p), "--force")  # over its own source: refused, whatever --force says
    assert r.returncode == 2 and "is the checkpoint being exported" in r.stderr and p.read_bytes() == before
    parent = tmp_path / "par"
    parent.mkdir()
    inner = save(parent / "model.pth", {"w": torch.ones(3)})
    r = run_ckptfs("export", str(inner), str(parent), "--force")  # --force would delete the source with it
    assert r.returncode == 2 and "holds the checkpoint being exported" in r.stderr and inner.exists()
    r = run_ckptfs("export", str(p), str(tmp_path / "x"), "--max-shard-size", "lots")
    assert r.returncode == 2 and "not a size" in r.stderr
    assert not [n for n in os.listdir(tmp_path) if ".ckptfs-" in n]  # no temporary file left anywhere


def test_verify_finds_a_corrupted_write(tmp_path):
    """The disk returns other bytes than written (simulated: the temporary file is changed behind the
    exporter's back): --verify fails, and nothing is left at DST."""
    p = save(tmp_path / "v.pth", {"w": torch.randn(300_000)})
    dst = tmp_path / "v.safetensors"

    class Corrupting:
        def start(self, total: int) -> None:
            pass

        def update(self, n: int, what: str) -> None:
            part = Path(export_api._tmp_name(str(dst)))
            if part.exists() and part.stat().st_size > 4096:
                with open(part, "r+b") as f:
                    f.seek(4000)
                    f.write(b"\x55")

        def close(self) -> None:
            pass

    with pytest.raises(ckptfs.CkptfsError, match="verify: byte 4000 differs"):
        ckptfs.export(p, dst, verify=True, progress=Corrupting())
    assert not dst.exists() and not [n for n in os.listdir(tmp_path) if ".ckptfs-" in n]
    ckptfs.export(p, dst, verify=True)  # an honest run passes
    assert dst.exists()


def test_progress_bar_on_a_terminal_and_none_in_a_pipe(tmp_path):
    p = save(tmp_path / "p.pth", {"w": torch.randn(1000)})
    r = export_ok(str(p), str(tmp_path / "pipe.safetensors"))  # stderr is a pipe here
    assert "\r" not in r.stderr and "it/s" not in r.stderr and "B/s" not in r.stderr.split("(")[0]
    assert r.stderr.startswith("ckptfs: wrote ")
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal 100 columns wide
    proc = subprocess.Popen([*CKPTFS, "export", str(p), str(tmp_path / "tty.safetensors")], stdout=subprocess.PIPE,
                            stderr=slave, env={**os.environ, "CKPTFS_PROGRESS_DELAY": "0"})  # a bar at once
    os.close(slave)
    out = b""
    while True:
        ready, _, _ = select.select([master], [], [], 30)
        if not ready:
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the pty closed: the command is done
            break
        if not chunk:
            break
        out += chunk
    assert proc.wait(timeout=60) == 0
    os.close(master)
    text = out.decode(errors="replace")
    assert "%|" in text and "tty.safetensors" in text and "\r" in text  # tqdm's bar, redrawn in place, then erased


# --- memory and interruption on a 4 GB checkpoint -------------------------------------------------------------------


def make_sparse_4gb(path: Path) -> None:
    """4 x 1 GiB float32 matrices written by torch.save with skip_data (the records are holes: cheap to write,
    4 GiB to read), patterned rows written through torch's own map of the file, and the transposed view of one
    (1 GiB gathered and written for real by export)."""
    n = 16384
    mats = [torch.empty(n, n, dtype=torch.float32) for _ in range(4)]  # never touched: no memory used
    sd = {f"w{i}": m for i, m in enumerate(mats)} | {"w0_t": mats[0].t()}
    with torch.serialization.skip_data():
        torch.save(sd, path)
    old = torch.serialization.get_default_mmap_options()
    torch.serialization.set_default_mmap_options(mmap.MAP_SHARED)
    try:
        d = torch.load(path, mmap=True, weights_only=True)
        for i in range(4):
            d[f"w{i}"][i * 5 : i * 5 + 4] = torch.arange(4 * n, dtype=torch.float32).reshape(4, n) + i
        del d
    finally:
        torch.serialization.set_default_mmap_options(old)


@pytest.fixture(scope="module")
def sparse_4gb(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("big")
    free = os.statvfs(d).f_bavail * os.statvfs(d).f_frsize
    if free < 4 * GiB:
        pytest.fail(f"needs ~3 GiB free disk for the 4 GB export test ({free / GiB:.1f} GiB free)")
    p = d / "big4.pth"
    make_sparse_4gb(p)
    assert p.stat().st_size > 4 * GiB
    return p


#: Runs a command and prints its peak RSS from its own rusage. A separate small process starts it: a process
#: forked from pytest (hundreds of MB with torch) would carry pytest's RSS into its ru_maxrss (the kernel records
#: the high-water mark of the memory a process leaves at exec).
MEASURE = """
import json, os, subprocess, sys
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(proc.pid, 0)
print(json.dumps({"rc": os.waitstatus_to_exitcode(status), "maxrss": usage.ru_maxrss * 1024}))
"""


def run_measured(args: list[str]) -> tuple[int, int, str]:
    """(exit status, peak RSS in bytes, stderr) of a command."""
    r = subprocess.run([sys.executable, "-c", MEASURE, *args], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    return out["rc"], out["maxrss"], r.stderr


@pytest.mark.slow
def test_4gb_export_in_bounded_memory(sparse_4gb, tmp_path):
    out = tmp_path / "big4.safetensors"
    rc, rss, err = run_measured([*CKPTFS, "export", str(sparse_4gb), str(out)])
    assert rc == 0, err
    assert rss < 200 << 20, f"peak RSS {rss >> 20} MiB"
    assert out.stat().st_size > 5 * GiB
    assert out.stat().st_blocks * 512 < 2 * GiB  # the source's holes stay holes; the transposed GiB is data
    ref = torch.load(sparse_4gb, mmap=True, weights_only=True)
    with safe_open(out, "pt") as f:
        assert set(f.keys()) == set(ref)
        for k in ref:
            sl = f.get_slice(k)
            for rows in (slice(0, 24), slice(8000, 8004), slice(16380, 16384)):
                assert torch.equal(sl[rows], ref[k][rows]), (k, rows)
        assert torch.equal(f.get_slice("w0_t")[:, :4], ref["w0_t"][:, :4])  # the pattern, transposed


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_killed_export_leaves_no_destination(sparse_4gb, tmp_path, how):
    out = tmp_path / "killed.safetensors"
    part = Path(export_api._tmp_name(str(out), pid=0)).parent
    proc = subprocess.Popen([*CKPTFS, "export", str(sparse_4gb), str(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    tmp = Path(export_api._tmp_name(str(out), pid=proc.pid))
    deadline = time.monotonic() + 60
    while not tmp.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert tmp.exists(), "the export never started writing"
    os.kill(proc.pid, getattr(signal, how))  # our own child, by pid
    _, err = proc.communicate(timeout=60)
    assert not out.exists()
    if how == "SIGTERM":
        assert proc.returncode == 130 and "interrupted" in err
        assert not tmp.exists()  # cleaned up on the way out
    else:
        assert proc.returncode == -signal.SIGKILL
        assert tmp.exists()  # nothing could clean up; the next export to this DST removes it
        small = save(tmp_path / "small.pth", {"w": torch.ones(2)})
        export_ok(str(small), str(out))
        assert not tmp.exists() and out.exists()
    assert [n for n in os.listdir(part) if ".ckptfs-" in n] == []


def test_a_dcp_directory_exports_as_dcp_to_torch_save_gives_it(dcp_checkpoints, tmp_path):
    """A DCP directory (chunks in several .distcp files) becomes one model.safetensors whose tensors equal
    what torch's own dcp_to_torch_save writes."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    src = dcp_checkpoints / "w4"
    dcp_to_torch_save(src, tmp_path / "ref.pt")
    want = dotted_tensors(torch.load(tmp_path / "ref.pt", weights_only=False))
    assert want
    ckptfs.export(src, tmp_path / "out.safetensors")
    got = st.load_file(tmp_path / "out.safetensors")
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k


def test_hf_safetensors_shards(hf_sharded, tmp_path):
    """A directory of safetensors shards (huggingface_hub's writer): --keep-shards writes the same shards
    (names, tensors, index), the default re-shards by size (one model.safetensors here), a .safetensors
    DST holds every tensor; the model files are copied along."""
    d = hf_sharded["safetensors"]
    original = json.loads((d / "model.safetensors.index.json").read_bytes())
    shards = sorted(set(original["weight_map"].values()))
    assert len(shards) > 2  # the premise
    refs = {name: st.load_file(d / name) for name in shards}
    everything = {k: t for ref in refs.values() for k, t in ref.items()}

    kept = tmp_path / "kept"
    export_ok(str(d), str(kept), "--keep-shards", "--verify")
    assert sorted(os.listdir(kept)) == sorted(os.listdir(d))
    assert json.loads((kept / "model.safetensors.index.json").read_bytes())["weight_map"] == original["weight_map"]
    for name, ref in refs.items():
        got = st.load_file(kept / name)
        assert got.keys() == ref.keys(), name
        for k, t in ref.items():
            assert got[k].dtype == t.dtype and torch.equal(got[k], t), (name, k)
    for name, data in MODEL_FILES.items():
        assert (kept / name).read_bytes() == data, name

    resharded = tmp_path / "resharded"
    export_ok(str(d), str(resharded))
    assert sorted(os.listdir(resharded)) == sorted([*MODEL_FILES, "model.safetensors"])
    one = tmp_path / "one.safetensors"
    export_ok(str(d), str(one))
    for got in (st.load_file(resharded / "model.safetensors"), st.load_file(one)):
        assert got.keys() == everything.keys()
        for k, t in everything.items():
            assert torch.equal(got[k], t), k


def test_a_damaged_checkpoint_is_not_exported_as_if_complete(dcp_checkpoints, tmp_path):
    """A DCP directory whose data file is gone: its tensors cannot be read, so the copy would not be the
    checkpoint (the view still lists them, as omitted); a directory of checkpoints with a damaged file too."""
    d = tmp_path / "w2"
    shutil.copytree(dcp_checkpoints / "w2", d)
    victim = sorted(d.glob("*.distcp"))[0]
    victim.unlink()
    out = tmp_path / "out.safetensors"
    r = run_ckptfs("export", str(d), str(out))
    assert r.returncode == 2 and "cannot export: " in r.stderr and "tensors cannot be read" in r.stderr, r.stderr
    assert victim.name in r.stderr and "nothing was written" in r.stderr and not out.exists()
    runs = tmp_path / "runs"
    runs.mkdir()
    save(runs / "epoch_1.pt", {"w": torch.ones(3)})
    data = save(runs / "epoch_2.pt", {"w": torch.zeros(3)}).read_bytes()
    (runs / "epoch_2.pt").write_bytes(data[: len(data) // 2])
    r = run_ckptfs("export", str(runs), str(tmp_path / "runs-out"))
    assert r.returncode == 2 and "1 file of the directory cannot be opened (epoch_2.pt: " in r.stderr, r.stderr
    assert not (tmp_path / "runs-out").exists()
    assert not [n for n in os.listdir(tmp_path) if ".ckptfs-" in n]


def test_dcp_directory_with_config_json(dcp_checkpoints, tmp_path):
    """A DCP directory exported to a directory: model.safetensors (the tensors dcp_to_torch_save gives) and
    the directory's config.json."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    src = tmp_path / "dcp"
    shutil.copytree(dcp_checkpoints / "w4", src)
    (src / "config.json").write_text('{"model_type": "test"}\n')
    dcp_to_torch_save(dcp_checkpoints / "w4", tmp_path / "ref.pt")
    want = dotted_tensors(torch.load(tmp_path / "ref.pt", weights_only=False))
    assert want
    out = tmp_path / "out"
    export_ok(str(src), str(out), "--verify")
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    assert (out / "config.json").read_bytes() == (src / "config.json").read_bytes()
    got = st.load_file(out / "model.safetensors")
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), k


def test_directory_of_unrelated_checkpoints(tmp_path):
    """Two torch.save files (and a note) in one directory: one <name>.safetensors per file, keyed as that
    file alone; the note copied; a .safetensors DST holds both under their names."""
    d = tmp_path / "runs"
    d.mkdir()
    torch.manual_seed(5)
    a = save(d / "epoch_1.pt", {"w": torch.randn(3, 4), "b": torch.randn(4, 3).t(), "epoch": 1})
    b = save(d / "best.pth", {"model": {"w": torch.randn(2, 2)}, "step": 700})
    (d / "notes.txt").write_text("two runs\n")
    out = tmp_path / "out"
    export_ok(str(d), str(out), "--verify")
    assert sorted(os.listdir(out)) == ["best.safetensors", "epoch_1.safetensors", "notes.txt"]
    assert (out / "notes.txt").read_bytes() == (d / "notes.txt").read_bytes()
    for src, name, value_key in ((a, "epoch_1.safetensors", "epoch"), (b, "best.safetensors", "step")):
        want = dotted_tensors(torch.load(src, weights_only=True))
        got = st.load_file(out / name)
        assert got.keys() == want.keys(), name
        for k, t in want.items():
            assert torch.equal(got[k], t.contiguous()), (name, k)
        with safe_open(out / name, "pt") as f:
            assert json.loads(f.metadata()[value_key]) == torch.load(src, weights_only=True)[value_key]
    one = tmp_path / "all.safetensors"
    export_ok(str(d), str(one))
    got = st.load_file(one)
    want = {f"epoch_1.{k}": t for k, t in dotted_tensors(torch.load(a, weights_only=True)).items()}
    want |= {f"best.{k}": t for k, t in dotted_tensors(torch.load(b, weights_only=True)).items()}
    assert got.keys() == want.keys()
    for k, t in want.items():
        assert torch.equal(got[k], t.contiguous()), k
