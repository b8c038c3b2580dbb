"""torch.distributed.checkpoint directories (written by dcp.save with world sizes 1, 2 and 4, zstd, FSDP2):
every entry as torch's own ``dcp_to_torch_save`` gives it; ``.metadata`` read without torch through a closed
allowlist; chunked tensors assembled as one; hostile metadata and items refused with one-line errors."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import audited, lookup, run_ckptfs, torch_bytes
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

import ckptfs
from ckptfs.errors import CkptfsError, FormatError, TensorError, UnsafePickleError

CHECKPOINTS = ["w1", "w2", "w4", "w4z", "fsdp"]


def torch_reference(d: Path, tmp: Path) -> dict:
    """What torch's own converter gives for the checkpoint (loaded back from its output)."""
    out = tmp / f"{d.name}-ref.pt"
    dcp_to_torch_save(d, out)
    return torch.load(out, weights_only=False)


def _walk(obj: object, path: tuple = ()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, path + (k,))
    elif isinstance(obj, (list, tuple)):  # (ckptfs's tree has their items as entries)
        for i, v in enumerate(obj):
            yield from _walk(v, path + (i,))
    elif not isinstance(obj, torch.Tensor) and hasattr(obj, "__dict__"):  # an object: its attributes
        for k, v in vars(obj).items():
            yield from _walk(v, path + (k,))
    else:
        yield path, obj


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_every_entry_as_dcp_to_torch_save_gives_it(dcp_checkpoints: Path, tmp_path: Path, name: str) -> None:
    d = dcp_checkpoints / name
    want = torch_reference(d, tmp_path)
    expected = dict(_walk(want))
    with ckptfs.open(d) as ckpt:
        assert ckpt.format == "dcp"
        index = ckpt.index
        got = {index.path(i): i for i in index.leaves()}
        assert set(got) == set(expected), set(got) ^ set(expected)
        for path, value in expected.items():
            row = got[path]
            if isinstance(value, torch.Tensor):
                m = ckpt.catalog.meta(row)
                assert (m.dtype, m.shape) == (str(value.dtype).removeprefix("torch."), tuple(value.shape)), path
                assert ckpt.catalog.data(row).read() == torch_bytes(value), path
            else:
                assert ckpt.value(path) == value and type(ckpt.value(path)) is type(value), path



def test_empty_tensors_have_torchs_strides(tmp_path: Path) -> None:
    """A tensor with a size-0 dimension has the strides dcp_to_torch_save's torch.empty gives it (a size-0
    dimension counts as 1), not a product that is 0."""
    import torch.distributed.checkpoint as dcp

    sd = {"inner": torch.zeros(3, 0, 2), "last": torch.zeros(2, 3, 0), "first": torch.zeros(0, 4)}
    dcp.save(sd, checkpoint_id=tmp_path / "d", no_dist=True)
    want = torch_reference(tmp_path / "d", tmp_path)
    with ckptfs.open(tmp_path / "d") as ckpt:
        for key, value in want.items():
            assert ckpt.meta(key).stride == value.stride() == ckpt.tensor(key).stride(), key
            assert ckpt.read(key) == b"", key



def test_saved_parameters_load_as_torch_loads_them(tmp_path: Path) -> None:
    """A Parameter / requires_grad tensor saved with dcp.save: dcp_to_torch_save gives a plain tensor that
    does not require grad, and so do meta, tensor() and load (the saved flag is in the sidecar's extra)."""
    import torch.distributed.checkpoint as dcp

    sd = {"p": torch.nn.Parameter(torch.randn(3, 2)), "r": torch.randn(2, requires_grad=True), "b": torch.ones(2)}
    dcp.save(sd, checkpoint_id=tmp_path / "d", no_dist=True)
    want = torch_reference(tmp_path / "d", tmp_path)
    loaded = ckptfs.load(tmp_path / "d")
    with ckptfs.open(tmp_path / "d") as ckpt:
        for key, value in want.items():
            m = ckpt.meta(key)
            assert m.requires_grad == value.requires_grad == ckpt.tensor(key).requires_grad, key
            assert type(ckpt.tensor(key)) is type(value) is type(loaded[key]), key
            assert loaded[key].requires_grad == value.requires_grad, key
            assert m.extra.get("saved_requires_grad", False) is (key != "b"), key
    r = run_ckptfs("check", "--trust", "--no-progress", str(tmp_path / "d"))
    assert r.returncode == 0 and "3 tensors identical, 0 mismatched" in r.stdout, r.stdout + r.stderr


def test_chunked_tensors_are_one_tensor_each(dcp_checkpoints: Path, tmp_path: Path) -> None:
    """A Shard(0) / Shard(1) / 2-D-mesh / uneven tensor is one tensor of its full shape; its sidecar lists
    the chunks as torch's own metadata reader gives them."""
    d = dcp_checkpoints / "w4"
    md = FileSystemReader(d).read_metadata()
    want = torch_reference(d, tmp_path)
    with ckptfs.open(d) as ckpt:
        for key, assembly, n in (("model.rows", "ranges", 4), ("model.cols", "gather", 4),
                                 ("model.grid", "gather", 4), ("model.uneven", "ranges", 4),
                                 ("model.cube", "gather", 4), ("model.rep", None, 1)):
            ckpt.read(key, 0, 1)  # the tensor's chunks are opened on first read
            extra = ckpt.meta(key).extra
            chunks = extra["chunks"]
            tmd = md.state_dict_metadata[key]
            assert [(c["offsets"], c["sizes"]) for c in chunks] == \
                [(list(c.offsets), list(c.sizes)) for c in tmd.chunks], key
            for c in chunks:
                info = next(v for k, v in md.storage_data.items() if k.fqn == key and list(k.offset) == c["offsets"])
                assert (c["file"], c["offset"], c["length"]) == (info.relative_path, info.offset, info.length)
            assert len(chunks) == n and extra.get("assembly") == assembly, key
            full = lookup(want, tuple(key.split(".")))
            assert ckpt.read(key) == torch_bytes(full), key
            # reads at odd offsets and lengths cut across chunks and elements
            data = torch_bytes(full)
            for off, size in ((1, 5), (7, 33), (len(data) // 3, len(data) // 2), (len(data) - 3, 10)):
                assert ckpt.read(key, off, size) == data[off : off + size], (key, off, size)


def test_one_contiguous_chunk_is_served_from_the_file(dcp_checkpoints: Path) -> None:
    """A tensor saved whole and contiguous is a range of its item's record: numpy() maps it."""
    with ckptfs.open(dcp_checkpoints / "w1") as ckpt:
        r = ckpt.reader("model.0.weight")
        assert ckpt.mapped(r) is not None
        assert not ckpt.numpy("model.0.weight").flags.owndata
        # a transposed view was saved with its strides: a gather, the values as torch gives them
        assert ckpt.mapped(ckpt.reader("views.transposed")) is None


def test_zstd_items_are_decompressed(dcp_checkpoints: Path, tmp_path: Path) -> None:
    d = dcp_checkpoints / "w4z"
    md = FileSystemReader(d).read_metadata()
    assert all(v.transform_descriptors == ["stream.zstd/1"] for v in md.storage_data.values())
    with ckptfs.open(d) as ckpt:
        info = ckpt.info()
        assert info["container"]["compressed_entries"] == len(md.state_dict_metadata)
        assert ckpt.meta("model.cols").extra["chunks"][0]["transforms"] == ["stream.zstd/1"]


def test_a_save_without_rank_coordination(dcp_checkpoints: Path, tmp_path: Path) -> None:
    """``use_collectives=False``: every rank wrote its own ``__<rank>.metadata`` (torch's dcp_to_torch_save
    reads only ``.metadata``): ckptfs unites them; the same state_dict saved with coordination (w4) is the
    reference."""
    d = dcp_checkpoints / "w4nc"
    names = sorted(p.name for p in d.iterdir())
    assert ".metadata" not in names and [n for n in names if n.endswith(".metadata")] == \
        ["__0.metadata", "__1.metadata", "__2.metadata", "__3.metadata"]
    want = dict(_walk(torch_reference(dcp_checkpoints / "w4", tmp_path)))
    with ckptfs.open(d) as ckpt:
        index = ckpt.index
        got = {index.path(i): i for i in index.leaves()}
        assert set(got) == set(want)
        for path, value in want.items():
            if isinstance(value, torch.Tensor):
                assert ckpt.catalog.data(got[path]).read() == torch_bytes(value), path
            else:
                assert ckpt.value(path) == value, path
        assert ckpt.info()["container"]["rank_metadata_files"] == 4


def _edit_rank(d: Path, rank: int, change) -> None:
    with open(d / f"__{rank}.metadata", "rb") as f:
        md = pickle.load(f)
    change(md)
    with open(d / f"__{rank}.metadata", "wb") as f:
        pickle.dump(md, f)


def test_ranks_that_disagree_on_an_entry(dcp_checkpoints: Path, tmp_path: Path) -> None:
    """Rank 0 saying ``model.rep`` is a value and rank 1 a tensor gave the value, silently (the other order
    was an error): both orders are an error on the tensor. Ranks placing an entry at two paths refuse the whole
    checkpoint (which place is meant would depend on the reader)."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    def as_value(md):
        md.state_dict_metadata["model.rep"] = BytesStorageMetadata()
        infos = [k for k in md.storage_data if k.fqn == "model.rep"]
        info = md.storage_data[infos[0]]
        for k in infos:
            del md.storage_data[k]
        md.storage_data[MetadataIndex("model.rep")] = info

    for rank in (0, 1):
        d = copy(dcp_checkpoints, tmp_path / str(rank), "w4nc")
        _edit_rank(d, rank, as_value)
        with ckptfs.open(d) as ckpt:
            assert ckpt.meta("model.rep").kind == "tensor"
            assert ckpt.meta("model.rep").error == "a tensor on one rank, a value on another"
            assert ckpt.read("model.rows")  # the others are served
    _edit_rank(d, 2, lambda md: md.planner_data.__setitem__("model.rep", ("model", "elsewhere")))
    with pytest.raises(FormatError, match=r"__0\.metadata: model\.rep: ranks disagree on where it goes in "
                                          r"the state_dict \(\['model', 'rep'\] vs \['model', 'elsewhere'\]\)"):
        ckptfs.open(d)


def test_load_info_and_check(dcp_checkpoints: Path, tmp_path: Path) -> None:
    d = dcp_checkpoints / "fsdp"
    want = torch_reference(d, tmp_path)
    sd = ckptfs.load(d)
    for path, value in _walk(want):
        got = lookup(sd, path)
        if isinstance(value, torch.Tensor):
            assert got.dtype == value.dtype and torch.equal(got, value), path
        else:
            assert got == value, path
    r = run_ckptfs("info", str(d))
    assert r.returncode == 0 and "format      dcp (torch.distributed.checkpoint" in r.stdout, r.stderr
    r = run_ckptfs("check", "--trust", str(dcp_checkpoints / "w4"))
    assert r.returncode == 0 and "10 tensors identical, 0 mismatched" in r.stdout, r.stdout + r.stderr
    r = run_ckptfs("check", str(dcp_checkpoints / "w4"))  # torch's reader unpickles: only with --trust
    assert r.returncode == 2 and "re-run with --trust" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    r = run_ckptfs("ls", str(dcp_checkpoints / "w2"))
    assert r.returncode == 0 and "meta.epoch" in r.stdout and "[8, 6]" in r.stdout



def test_check_goes_on_past_a_tensor_refused_when_read(tmp_path: Path) -> None:
    """A tensor whose item is refused only when its bytes are read (a conj-bit tensor: not supported) is one
    FAIL line of ckptfs check; the other tensors are still compared (no abort with exit status 2)."""
    import torch.distributed.checkpoint as dcp

    d = tmp_path / "d"
    dcp.save({"a": torch.arange(4.0), "conj": torch.randn(3, dtype=torch.complex64).conj(), "z": torch.ones(2)},
             checkpoint_id=d, no_dist=True)
    r = run_ckptfs("check", "--trust", "--no-progress", str(d))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL conj: ckptfs refuses it: item __0_0.distcp@" in r.stdout and "conj/neg bits" in r.stdout, r.stdout
    assert "2 tensors identical, 1 mismatched" in r.stdout, r.stdout


def test_check_never_lets_torch_run_a_dcp_value_without_trust(tmp_path: Path) -> None:
    """torch's DCP reader loads byte values with torch.load(weights_only=False): checking such a checkpoint
    without --trust must not hand it to torch (ls, info and check all leave the marker uncreated)."""
    import torch.distributed.checkpoint as dcp

    marker = tmp_path / "ran"
    d = tmp_path / "dcp"
    dcp.save({"w": torch.ones(3), "cfg": Gadget(str(marker))}, checkpoint_id=str(d), no_dist=True)
    for args in (("ls",), ("info",), ("check",), ("check", "-v")):
        r = run_ckptfs(*args, str(d))
        assert not marker.exists(), args
    assert r.returncode == 2 and "--trust" in r.stderr
    # what a user asks for with --trust: torch runs it (the reason the default refuses)
    run_ckptfs("check", "--trust", str(d))
    assert marker.exists()


def test_check_of_a_dcp_directory_torch_cannot_read_is_one_line(dcp_checkpoints: Path, tmp_path: Path) -> None:
    """torch raises CheckpointException, a BaseException: still exit 2 with one line, not a traceback."""
    d = copy(dcp_checkpoints, tmp_path)

    def change(md):
        for k, v in md.storage_data.items():
            if k.fqn == "uneven" and list(k.offset) == [0, 0]:
                v.offset, v.length = v.offset + 3, v.length - 3  # not at the item's start: not a zip there

    edit_metadata(d, change)
    r = run_ckptfs("check", "--trust", str(d))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "torch.load failed: UnpicklingError" in r.stderr


# --- hostile metadata ------------------------------------------------------------------------------------------


def copy(dcp_checkpoints: Path, tmp_path: Path, name: str = "w2") -> Path:
    d = tmp_path / name
    shutil.copytree(dcp_checkpoints / name, d)
    return d


def edit_metadata(d: Path, change) -> None:
    """Change torch's own Metadata object and pickle it back, as torch writes it."""
    md = FileSystemReader(d).read_metadata()
    md.storage_meta = None
    change(md)
    with open(d / ".metadata", "wb") as f:
        pickle.dump(md, f)


class Gadget:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("what", ["posix.system", "collections.OrderedDict", "builtins.eval"])
def test_a_metadata_naming_another_class_is_refused(dcp_checkpoints: Path, tmp_path: Path, what: str) -> None:
    import collections

    d = copy(dcp_checkpoints, tmp_path)
    marker = tmp_path / "pwned"

    def change(md):
        if what == "posix.system":
            md.planner_data["rows"] = Gadget(str(marker))
        elif what == "collections.OrderedDict":
            md.planner_data = collections.OrderedDict(md.planner_data)
        else:
            md.storage_meta = eval  # a global function as a value

    edit_metadata(d, change)
    ckptfs.open(dcp_checkpoints / "w2").close()  # ckptfs's own modules imported: the block below imports nothing
    with audited(), pytest.raises(UnsafePickleError) as e:
        ckptfs.open(d)
    assert f"global {what} is not one of the DCP metadata classes" in str(e.value)
    assert ".metadata" in str(e.value) and not marker.exists()


@pytest.mark.parametrize("raw, said", [
    (b"\x80\x04\x8c%torch.distributed.checkpoint.metadata\x8c\x08Metadata\x93\x8c\x01x\x85R.",
     r"malformed pickle \(TypeError: Metadata\(\) takes no arguments\)"),
    (b"\x80\x04\x8c%torch.distributed.checkpoint.metadata\x8c\x08Metadata\x93\x8c\x01x\x85\x81.",
     r"malformed pickle \(TypeError: Metadata\(\) takes no arguments\)"),
    (b"\x80\x04\x8c\x03pidQ.", "a persistent id in a pickle that has none"),
    (b"\x80\x04}.", "not a Metadata"),
], ids=["called", "newobj-with-arguments", "persistent-id", "a-dict"])
def test_metadata_that_does_not_follow_the_classes_is_refused(dcp_checkpoints: Path, tmp_path: Path, raw: bytes,
                                                              said: str) -> None:
    d = copy(dcp_checkpoints, tmp_path)
    (d / ".metadata").write_bytes(raw)
    with pytest.raises(CkptfsError, match=said):
        ckptfs.open(d)


def test_chunks_that_overlap_or_leave_holes(dcp_checkpoints: Path, tmp_path: Path) -> None:
    """An error on that tensor alone: the others are served."""
    d = copy(dcp_checkpoints, tmp_path)

    def change(md):
        md.state_dict_metadata["rows"].chunks[1].offsets = torch.Size([3, 0])  # rows 3 read twice
        md.state_dict_metadata["cols"].chunks.pop()  # columns 4..7 in no chunk

    edit_metadata(d, change)
    with ckptfs.open(d) as ckpt:
        assert "chunks overlap (at element [3, 0])" in ckpt.meta("rows").error
        assert "the chunks leave a hole (element [0, 4] is in none of them)" in ckpt.meta("cols").error
        with pytest.raises(TensorError, match="chunks overlap"):
            ckpt.read("rows")
        want = FileSystemReader  # the untouched tensor still reads
        assert ckpt.read("rep") == torch_bytes(torch.arange(5, dtype=torch.int64)), want


def test_lying_item_offsets(dcp_checkpoints: Path, tmp_path: Path) -> None:
    d = copy(dcp_checkpoints, tmp_path)
    size = (d / "__1_0.distcp").stat().st_size

    def change(md):
        for k, v in md.storage_data.items():
            if k.fqn == "rows" and list(k.offset) == [4, 0]:
                v.offset = size - 10  # past the end of its file
            if k.fqn == "cols" and list(k.offset) == [0, 4]:
                other = next(v2 for k2, v2 in md.storage_data.items() if k2.fqn == "rep")
                v.relative_path, v.offset, v.length = other.relative_path, other.offset, other.length
            if k.fqn == "uneven" and list(k.offset) == [0, 0]:
                v.offset, v.length = v.offset + 1, v.length - 1  # not at the item's start: not a zip there

    edit_metadata(d, change)
    with ckptfs.open(d) as ckpt:
        assert "past its end" in ckpt.meta("rows").error
        with pytest.raises(TensorError, match="holds int64, the metadata says bfloat16"):
            ckpt.read("cols")
        with pytest.raises(TensorError, match=r"item __0_0.distcp@\d+: "):
            ckpt.read("uneven")
        assert ckpt.value("meta.epoch") == 2


def test_missing_data_file_and_unknown_transform(dcp_checkpoints: Path, tmp_path: Path) -> None:
    d = copy(dcp_checkpoints, tmp_path, "w4")

    def change(md):
        for k, v in md.storage_data.items():
            if k.fqn == "model.rows":
                v.transform_descriptors = ["stream.brotli/1"]
            if k.fqn == "step":
                v.relative_path = "__9_0.distcp"

    edit_metadata(d, change)
    with ckptfs.open(d) as ckpt:
        with pytest.raises(CkptfsError, match="item transform 'stream.brotli/1' is not supported"):
            ckpt.read("model.rows")
        unreadable = ckpt.meta("step")
        assert unreadable.type == "ckptfs.unreadable_value()"
        assert "'__9_0.distcp', which is not a file here" in ckpt.value(("step", "__args__", 0))
        assert ckpt.read("model.rep") == torch_bytes(torch.arange(5, dtype=torch.int64))


def test_data_files_gone_or_linked_out_say_so(dcp_checkpoints: Path, tmp_path: Path) -> None:
    gone = copy(dcp_checkpoints, tmp_path, "w1")
    for f in gone.glob("*.distcp"):
        f.unlink()
    with pytest.raises(FormatError, match=r"a DCP \.metadata with no \*\.distcp data file beside it"):
        ckptfs.open(gone)
    linked = copy(dcp_checkpoints, tmp_path / "l", "w1")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for f in linked.glob("*.distcp"):
        f.rename(elsewhere / f.name)
        f.symlink_to(elsewhere / f.name)
    with ckptfs.open(linked) as ckpt:
        tensors = ckpt.tensor_keys()
        assert tensors and all("refused: a symlink leads outside the directory" in ckpt.meta(k).error
                               for k in tensors)


def test_planner_data_through_a_value_and_metadata_over_the_limit(dcp_checkpoints: Path, tmp_path: Path) -> None:
    d = copy(dcp_checkpoints, tmp_path)
    order = list(FileSystemReader(d).read_metadata().state_dict_metadata)
    assert order.index("rows") < order.index("uneven")
    edit_metadata(d, lambda md: md.planner_data.__setitem__("uneven", ("rows", "uneven")))
    with pytest.raises(FormatError, match="runs through a value"):
        ckptfs.open(d)
    with pytest.raises(CkptfsError, match="over the pickle limit"):
        ckptfs.open(dcp_checkpoints / "w2", limits=ckptfs.Limits(max_pickle_bytes=100))


def test_a_corrupt_zstd_item(dcp_checkpoints: Path, tmp_path: Path) -> None:
    d = copy(dcp_checkpoints, tmp_path, "w4z")
    md = FileSystemReader(d).read_metadata()
    info = next(v for k, v in md.storage_data.items() if k.fqn == "model.rows" and list(k.offset) == [0, 0])
    data = bytearray((d / info.relative_path).read_bytes())
    data[info.offset : info.offset + 4] = b"XXXX"  # the frame's magic number
    (d / info.relative_path).write_bytes(bytes(data))
    with ckptfs.open(d) as ckpt:
        with pytest.raises(CkptfsError, match="corrupt zstd data"):
            ckpt.read("model.rows")


# --- the assembly itself, against numpy ------------------------------------------------------------------------


@st.composite
def tilings(draw: st.DrawFn):
    nd = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=nd, max_size=nd)))
    cuts = []
    for s in shape:
        inner = draw(st.sets(st.integers(1, max(1, s - 1)), max_size=2)) if s > 1 else set()
        b = sorted({0, s, *inner})
        cuts.append([(b[i], b[i + 1] - b[i]) for i in range(len(b) - 1)])
    strided = draw(st.lists(st.booleans(), min_size=1, max_size=64))
    return shape, cuts, strided


@settings(max_examples=200, deadline=None)
@given(case=tilings(), reads=st.lists(st.tuples(st.integers(0, 600), st.integers(0, 700)), min_size=1, max_size=5))
def test_chunked_tensor_reads_equal_numpy(case, reads) -> None:
    """Any tiling, chunks stored contiguously or transposed (with an offset), any read: the bytes numpy
    gives for the whole array."""
    import itertools

    from ckptfs.container.dcp.chunks import ChunkData, ChunkedTensor, check_tiling
    from ckptfs.source import BytesSource

    shape, cuts, strided = case
    full = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) * 1.5
    chunks = []
    for n, combo in enumerate(itertools.product(*cuts)):
        offs, sizes = tuple(o for o, _ in combo), tuple(z for _, z in combo)
        part = full[tuple(slice(o, o + z) for o, z in combo)]
        if strided[n % len(strided)] and part.ndim >= 2:
            stored = np.ascontiguousarray(part.T)  # the chunk saved as a transposed view's storage
            strides = tuple(s // 4 for s in stored.T.strides)
            data, base = b"\0" * 12 + stored.tobytes(), 12
        else:
            stored = np.array(part, order="C")  # (ascontiguousarray would make a 0-d part 1-d)
            data, base = stored.tobytes(), 0
            strides = tuple(s // 4 for s in stored.strides)
        chunks.append(ChunkData(offs, sizes, BytesSource(data), base, strides, str(offs)))
    assert check_tiling(shape, [(c.offsets, c.sizes) for c in chunks]) is None
    t = ChunkedTensor("x", "x", shape, 4, chunks)
    want = full.tobytes()
    assert t.pread(0, t.size) == want
    for off, n in reads:
        assert t.pread(off, n) == want[off : off + n], (off, n)


@st.composite
def chunk_lists(draw: st.DrawFn):
    """Any boxes in a small tensor: tilings, overlaps, holes, boxes past the shape, empty boxes."""
    nd = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=nd, max_size=nd)))
    boxes = []
    for _ in range(draw(st.integers(0, 6))):
        offs = tuple(draw(st.integers(0, s)) for s in shape)
        sizes = tuple(draw(st.integers(0, s - o + (1 if draw(st.booleans()) and draw(st.booleans()) else 0)))
                      for s, o in zip(shape, offs))
        boxes.append((offs, sizes))
    if draw(st.booleans()):  # often a real tiling: slabs along one dimension, or a grid
        d = draw(st.integers(0, max(nd - 1, 0)))
        if nd:
            cuts = sorted({0, shape[d], *draw(st.sets(st.integers(0, shape[d]), max_size=3))})
            boxes = [(tuple(c if e == d else 0 for e in range(nd)),
                      tuple(cuts[i + 1] - c if e == d else shape[e] for e in range(nd)))
                     for i, c in enumerate(cuts[:-1])]
            boxes = draw(st.permutations(boxes))
    return shape, boxes


@settings(max_examples=400, deadline=None)
@given(case=chunk_lists())
def test_tiling_check_agrees_with_counting_every_element(case) -> None:
    """check_tiling's verdict (tiles exactly, or not) against numpy counting how many boxes hold each
    element; its message names an overlap or a hole where there is one."""
    from ckptfs.container.dcp.chunks import check_tiling

    shape, boxes = case
    why = check_tiling(shape, boxes)
    if any(o + z > s for offs, sizes in boxes for o, z, s in zip(offs, sizes, shape)):
        assert why is not None and "runs past the shape" in why
        return
    count = np.zeros(shape, dtype=np.int64)
    for offs, sizes in boxes:
        count[tuple(slice(o, o + z) for o, z in zip(offs, sizes))] += 1
    exact = bool((count == 1).all())
    assert (why is None) == exact, (shape, boxes, why)
    if not exact:
        assert ("overlap" in why) == bool((count > 1).any()) or "hole" in why, why


def test_thousands_of_nested_chunks_cost_no_more_than_their_boundaries() -> None:
    """A metadata file can list 2,000 nested boxes for one tensor (each inside the one before): checking them
    must not count every box over the whole grid (10 s per tensor before; a hostile file holds hundreds)."""
    import time

    from ckptfs.container.dcp.chunks import check_tiling

    n = 2000  # 4,000 boundaries per dimension: a grid of 16M cells, within what is checked exactly
    shape = (2 * n, 2 * n)
    boxes = [((i, i), (2 * n - 2 * i, 2 * n - 2 * i)) for i in range(n)]
    t0 = time.perf_counter()
    why = check_tiling(shape, boxes)
    assert why is not None and "chunks overlap" in why
    assert time.perf_counter() - t0 < 5, "the check took as long as counting every box"
    grid = [((i, j), (1, 1)) for i in range(64) for j in range(64)]  # a 64 x 64 mesh: valid, checked exactly
    assert check_tiling((64, 64), grid) is None
    assert "hole" in check_tiling((64, 64), grid[:-1])
