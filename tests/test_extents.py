"""Files as pieces: literal bytes, ranges of sources, computed transforms, served by one handle type."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ckptfs
from ckptfs.errors import StaleSourceError
from ckptfs.model.extents import Computed, Content, ContentHandle, Literal, SourceRange, source_range
from ckptfs.source import BytesSource, LocalFile, SubRange
from helpers import torch_bytes

BACKING = bytes(range(256)) * 8
SOURCE = BytesSource(BACKING, "backing")


def _reversed_fill(data: bytes):
    """A computed piece: ``data`` reversed, produced on demand."""
    rev = data[::-1]

    def fill(buf: memoryview, offset: int) -> None:
        buf[:] = rev[offset : offset + len(buf)]

    return fill


pieces = st.one_of(
    st.binary(min_size=0, max_size=64).map(lambda b: ("lit", b)),
    st.tuples(st.integers(0, len(BACKING) - 1), st.integers(0, 200)).map(lambda t: ("range", t)),
    st.binary(min_size=0, max_size=64).map(lambda b: ("comp", b)),
)


def _build(spec):
    made, expected = [], b""
    for kind, arg in spec:
        if kind == "lit":
            made.append(Literal(arg))
            expected += arg
        elif kind == "range":
            off, n = arg
            n = min(n, len(BACKING) - off)
            made.append(SourceRange(SOURCE, off, n))
            expected += BACKING[off : off + n]
        else:
            made.append(Computed(len(arg), _reversed_fill(arg), "reverse"))
            expected += arg[::-1]
    return Content(made), expected


@settings(max_examples=300, deadline=None)
@given(spec=st.lists(pieces, max_size=8), off=st.integers(0, 800), n=st.integers(0, 800))
def test_any_range_of_any_content_reads_as_the_concatenation(spec, off, n):
    content, expected = _build(spec)
    assert content.size == len(expected)
    buf = bytearray(n)
    got = content.readinto(memoryview(buf), off)
    assert got == len(expected[off : off + n])
    assert bytes(buf[:got]) == expected[off : off + n]
    assert content.read(off, n) == expected[off : off + n]
    assert content.read() == expected


def test_single_range_is_recognised_and_ranges_of_subranges_are_flattened(tmp_path):
    p = tmp_path / "f.bin"
    p.write_bytes(os.urandom(4096))
    with LocalFile(p) as f:
        sub = SubRange(f, 1000, 2000, "rec")
        r = source_range(sub, 10, 100)
        assert r.source is f and r.offset == 1010 and r.label == "rec"
        c = Content([r])
        assert c.single_range() is r and c.sources() == [f]
        assert r.region().offset == 1010
        assert Content([Literal(b"x"), r]).single_range() is None
        assert Content([]).size == 0 and Content([Literal(b"")]).pieces == []


def test_handle_verifies_its_sources_before_each_read(tmp_path):
    p = tmp_path / "f.bin"
    p.write_bytes(b"a" * 8192)
    with LocalFile(p) as f:
        h = ContentHandle(Content([SourceRange(f, 0, 8192)]))
        assert h.read(0, 4) == b"aaaa"
        with open(p, "r+b") as w:
            w.truncate(100)
        with pytest.raises(StaleSourceError):
            h.readinto(memoryview(bytearray(10)), 0)
        unchecked = ContentHandle(Content([Literal(b"meta")]), verify=True)
        assert unchecked.read() == b"meta"  # no source to check


def test_tensor_plans(tmp_path):
    """Each kind of tensor is the plan it should be: one range for a contiguous tensor, a computed gather
    for a strided view, literal bytes for a numpy array pickled inline — and each reads as torch says."""
    w = torch.randn(40, 30)
    p = tmp_path / "m.pth"
    torch.save({"w": w, "wt": w.t(), "np": np.arange(12, dtype=np.int16).reshape(3, 4)}, p)
    ref = torch.load(p, weights_only=False)
    with ckptfs.open(p) as ckpt:
        plan = ckpt.reader("w").content
        assert len(plan.pieces) == 1 and isinstance(plan.pieces[0], SourceRange)
        assert plan.read() == torch_bytes(ref["w"])
        plan = ckpt.reader("wt").content
        assert len(plan.pieces) == 1 and isinstance(plan.pieces[0], Computed)
        assert plan.read() == torch_bytes(ref["wt"])
        assert plan.read(1000, 77) == torch_bytes(ref["wt"])[1000:1077]
        plan = ckpt.reader("np").content
        assert isinstance(plan.pieces[0], Literal) and plan.read() == ref["np"].tobytes()


# --- where bytes lie: file spans (what the FUSE adapter splices) ------------------------------------------------------


def _span_bytes(spans) -> bytes:
    """The bytes the spans name, read back: pread of each (fd, position, length), literal bytes as they are."""
    out = b""
    for s in spans:
        out += s if isinstance(s, bytes) else os.pread(s[0], s[2], s[1])
    return out


local_pieces = st.one_of(
    st.binary(min_size=0, max_size=64).map(lambda b: ("lit", b)),
    st.tuples(st.integers(0, len(BACKING) - 1), st.integers(0, 300)).map(lambda t: ("range", t)),
)


@pytest.fixture(scope="module")
def backing_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("spans") / "f.bin"
    p.write_bytes(BACKING)
    return p


@settings(max_examples=200, deadline=None)
@given(spec=st.lists(local_pieces, max_size=8), off=st.integers(0, 1200), n=st.integers(0, 1200))
def test_file_spans_name_exactly_the_bytes_of_any_range(backing_file, spec, off, n):
    """Ranges of a local file and literal bytes, in any mix: the spans, read back, are the range's bytes; a
    range past the end gives fewer (none past the end of the content)."""
    with LocalFile(backing_file) as f:
        made, expected = [], b""
        for kind, arg in spec:
            if kind == "lit":
                made.append(Literal(arg))
                expected += arg
            else:
                start, k = arg
                k = min(k, len(BACKING) - start)
                made.append(source_range(SubRange(f, 1, len(BACKING) - 1), start - 1, k) if start else
                            SourceRange(f, start, k))
                expected += BACKING[start : start + k]
        content = Content(made)
        spans = content.file_spans(off, n)
        assert spans is not None
        assert _span_bytes(spans) == expected[off : off + n]
        for s in spans:
            if not isinstance(s, bytes):
                assert s[0] == f.fd and s[2] > 0


def test_file_spans_are_none_where_bytes_must_be_made(tmp_path):
    p = tmp_path / "f.bin"
    p.write_bytes(BACKING)
    with LocalFile(p) as f:
        computed = Computed(10, _reversed_fill(b"0123456789"), "reverse", (f,))
        assert Content([SourceRange(f, 0, 100), computed]).file_spans(0, 200) is None
        assert Content([SourceRange(f, 0, 100), computed]).file_spans(0, 100) == [(f.fd, 0, 100)]  # before it
        assert Content([SourceRange(SOURCE, 0, 100)]).file_spans(0, 10) is None  # bytes in memory: no file
        assert Content([SourceRange(f, 2000, 100)]).file_spans(0, 100) is None  # past the file's end: read says why
        assert Content([SourceRange(f, 0, 100)]).file_spans(100, 10) == []
        with pytest.raises(ValueError):
            Content([SourceRange(f, 0, 100)]).file_spans(-1, 10)


def test_handle_checks_its_sources_before_naming_spans(tmp_path):
    p = tmp_path / "f.bin"
    p.write_bytes(b"a" * 8192)
    with LocalFile(p) as f:
        h = ContentHandle(Content([SourceRange(f, 10, 8000)]))
        assert h.file_spans(0, 4) == [(f.fd, 10, 4)]
        with open(p, "r+b") as w:
            w.truncate(100)
        with pytest.raises(StaleSourceError):
            h.file_spans(0, 4)
