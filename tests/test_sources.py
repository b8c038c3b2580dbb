"""Byte sources and their declared abilities: local files, ranges of other sources, memory."""

from __future__ import annotations

import io
import os
import zipfile

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ckptfs
from ckptfs.errors import FormatError, StaleSourceError
from ckptfs.source import ByteSource, BytesSource, LocalFile, SubRange, open_source
from helpers import torch_bytes


def test_local_file_declares_a_region_and_maps_it(tmp_path):
    p = tmp_path / "f.bin"
    data = os.urandom(10_000)
    p.write_bytes(data)
    with LocalFile(p) as f:
        assert isinstance(f, ByteSource)
        assert f.size == len(data) and f.read_size >= 4096
        region = f.region()
        assert region is not None and region.offset == 0 and region.fd == f.fd
        mapped, at = region.mapping()
        assert bytes(mapped[at : at + 100]) == data[:100]
        assert f.pread(9_990, 100) == data[9_990:]  # short only past the end
        buf = bytearray(50)
        assert f.preadinto(memoryview(buf), 20) == 50 and bytes(buf) == data[20:70]
        f.prefetch([(0, 10), (5_000, 10)])  # a hint: no effect, no error
        ident = f.identity()
        assert ident.kind == "posix" and ident.size == len(data) and ident.modified_ns == p.stat().st_mtime_ns


def test_memory_source_has_no_region():
    s = BytesSource(b"abcdef", "mem")
    assert isinstance(s, ByteSource)
    assert s.region() is None and s.pread(2, 3) == b"cde"


def test_cheap_check_sees_truncation_and_the_thorough_one_sees_a_rename(tmp_path):
    p = tmp_path / "f.bin"
    p.write_bytes(b"x" * 1000)
    with LocalFile(p) as f:
        f.check_unchanged(False)
        f.check_unchanged(True)
        other = tmp_path / "g.bin"
        other.write_bytes(b"x" * 1000)
        os.replace(other, p)  # our fd still sees the old (unchanged) inode
        f.check_unchanged(False)
        with pytest.raises(StaleSourceError, match="replaced"):
            f.check_unchanged(True)
    p.write_bytes(b"y" * 1000)
    with LocalFile(p) as f:
        os.truncate(p, 10)
        with pytest.raises(StaleSourceError, match="truncated"):
            f.check_unchanged(False)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(min_size=0, max_size=300), cuts=st.lists(st.integers(0, 300), min_size=4, max_size=4),
       read=st.tuples(st.integers(0, 320), st.integers(0, 320)))
def test_ranges_of_ranges_read_like_slices(data, cuts, read):
    parent = BytesSource(data, "p")
    a, b, c, d = cuts
    a = min(a, len(data))
    outer_len = min(b, len(data) - a)
    outer = SubRange(parent, a, outer_len, "outer")
    c = min(c, outer_len)
    inner_len = min(d, outer_len - c)
    inner = SubRange(outer, c, inner_len, "inner")
    assert inner.parent is parent and inner.start == a + c  # flattened: one offset onto the root
    want = data[a:][:outer_len][c:][:inner_len]
    off, n = read
    assert inner.pread(off, n) == want[off : off + n]
    buf = bytearray(n)
    got = inner.preadinto(memoryview(buf), off)
    assert bytes(buf[:got]) == want[off : off + n]


def test_subrange_bounds_and_truncation_name_the_record(tmp_path):
    p = tmp_path / "f.bin"
    p.write_bytes(bytes(range(200)))
    with LocalFile(p) as f:
        r = SubRange(f, 100, 150, "archive/data/7")  # claims 50 bytes past the end of the file
        assert r.region().offset == 100 and r.identity() == f.identity()
        assert r.pread(0, 10) == bytes(range(100, 110))
        with pytest.raises(FormatError, match="archive/data/7.*truncated"):
            r.pread(0, 150)
        with pytest.raises(FormatError, match="runs past the end"):
            SubRange(r, 100, 100, "inner")


def test_open_source_takes_paths_and_sources(tmp_path):
    p = tmp_path / "f.bin"
    p.write_bytes(b"12345")
    s = open_source(str(p))
    assert isinstance(s, LocalFile)
    s.close()
    m = BytesSource(b"x")
    assert open_source(m) is m
    with pytest.raises(TypeError):
        open_source(42)  # type: ignore[arg-type]


def test_a_checkpoint_nested_at_an_offset_opens_through_a_subrange(tmp_path):
    """A torch zip inside a bigger file (as every item of a DCP .distcp file is): a SubRange of the file is
    a source like any other; tensors are served from the file, zero-copy where stored."""
    w = torch.randn(64, 32)
    sd = {"w": w, "wt": w.t(), "step": 7}
    buf = io.BytesIO()
    torch.save(sd, buf)
    item = buf.getvalue()
    head, tail = os.urandom(12_345), os.urandom(999)
    p = tmp_path / "container.bin"
    p.write_bytes(head + item + tail)
    ref = torch.load(io.BytesIO(item), weights_only=True)
    with LocalFile(p) as f:
        with ckptfs.open(SubRange(f, len(head), len(item), "item 0")) as ckpt:
            assert ckpt.read("w") == torch_bytes(ref["w"])
            assert ckpt.read("wt") == torch_bytes(ref["wt"])
            assert ckpt.value("step") == 7
            arr = ckpt.numpy("w")  # zero-copy: a view of the file's map at the item's offset
            assert not arr.flags.owndata and arr.tobytes() == torch_bytes(ref["w"])
            region = ckpt.reader("w").region()
            assert region is not None and region.file is f and region.offset >= len(head)


def test_deflated_records_are_sources_without_a_region(tmp_path):
    w = torch.arange(5000, dtype=torch.float32)
    plain = tmp_path / "plain.pth"
    torch.save({"w": w}, plain)
    packed = tmp_path / "packed.pth"
    with zipfile.ZipFile(plain) as zin, zipfile.ZipFile(packed, "w") as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename), compress_type=zipfile.ZIP_DEFLATED)
    ref = torch.load(packed, weights_only=True)
    with ckptfs.open(packed) as ckpt:
        r = ckpt.reader("w")
        assert r.region() is None  # inflated on demand: no file range to map
        assert ckpt.read("w") == torch_bytes(ref["w"])
        assert ckpt.read("w", 4096, 100) == torch_bytes(ref["w"])[4096:4196]
