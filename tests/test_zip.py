"""The zip container reader: property tests against Python's zipfile, and refusals of ambiguous archives."""

from __future__ import annotations

import io
import struct
import zipfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptfs.container.zip import HeaderFirst, ZipArchive
from ckptfs.errors import FormatError
from ckptfs.source import BytesSource, SubRange

name_part = st.text(alphabet=st.characters(blacklist_characters="/\x00", blacklist_categories=("Cs",)),
                    min_size=1, max_size=12)
member = st.tuples(st.lists(name_part, min_size=1, max_size=3).map("/".join), st.binary(max_size=3000),
                   st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]))


def build(members, root="arch", comment=b"", force_zip64=False) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.comment = comment
        for name, data, method in members:
            info = zipfile.ZipInfo(f"{root}/{name}")
            info.compress_type = method
            with z.open(info, "w", force_zip64=force_zip64) as f:
                f.write(data)
    return buf.getvalue()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(member, min_size=1, max_size=12, unique_by=lambda m: m[0]), st.binary(max_size=40),
       st.booleans())
def test_reads_what_zipfile_reads(members, comment, force_zip64):
    data = build(members, comment=comment, force_zip64=force_zip64)
    arch = ZipArchive(BytesSource(data, "t.zip"))
    assert arch.root == "arch/"
    assert sorted(arch.names()) == sorted(m[0] for m in members)
    for name, payload, method in members:
        rec = arch.get(name)
        assert rec is not None and rec.size == len(payload) and rec.method == method
        data = rec.data()
        assert data.size == len(payload) and data.pread(0, data.size) == payload
        if payload:
            mid = len(payload) // 2
            assert data.pread(mid, 7) == payload[mid : mid + 7]
        # a stored record is a range of the archive (in memory, not a local file: its header is checked first)
        assert isinstance(data, HeaderFirst) == (method == zipfile.ZIP_STORED)
        if isinstance(data, HeaderFirst):
            assert isinstance(data._resolved(), SubRange)


@settings(max_examples=100, deadline=None)
@given(st.binary(min_size=0, max_size=400))
def test_arbitrary_bytes_fail_cleanly(data):
    try:
        ZipArchive(BytesSource(data, "junk.zip"))
    except FormatError as e:
        assert "junk.zip" in str(e) and "\n" not in str(e)


small_member = st.tuples(name_part, st.binary(max_size=200), st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]))


@settings(max_examples=150, deadline=None)
@given(st.lists(small_member, min_size=1, max_size=4, unique_by=lambda m: m[0]), st.data())
def test_truncation_and_bit_flips_never_crash(members, data):
    blob = bytearray(build(members))
    how = data.draw(st.sampled_from(["truncate", "flip"]))
    if how == "truncate":
        blob = blob[: data.draw(st.integers(0, len(blob) - 1))]
    else:
        i = data.draw(st.integers(0, len(blob) - 1))
        blob[i] ^= 1 << data.draw(st.integers(0, 7))
    try:
        arch = ZipArchive(BytesSource(bytes(blob), "m.zip"))
        for name in arch.names():
            rec = arch.get(name)
            rec.data().pread(0, rec.size)
    except FormatError as e:
        assert "\n" not in str(e)


def _entries(data: bytes):
    """(offset of each central-directory entry) for hand edits."""
    pos = data.rfind(b"PK\x05\x06")
    _, _, _, _, n, size, off, _ = struct.unpack_from("<4s4H2LH", data, pos)
    out, p = [], off
    for _ in range(n):
        out.append(p)
        nl, xl, cl = struct.unpack_from("<3H", data, p + 28)
        p += 46 + nl + xl + cl
    return out


def test_refuses_duplicate_names():
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z, pytest.warns(UserWarning):
        z.writestr("a/x", b"first")
        z.writestr("a/x", b"second")
    with pytest.raises(FormatError, match="duplicate"):
        ZipArchive(BytesSource(buf.getvalue(), "dup.zip"))


def test_refuses_entries_outside_root():
    buf = io.BytesIO()  # the first entry sets the root
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("a/x", b"1")
        z.writestr("b/y", b"2")
    with pytest.raises(FormatError, match="outside the archive root"):
        ZipArchive(BytesSource(buf.getvalue(), "root.zip"))


def test_refuses_overlapping_records_and_disagreeing_headers():
    data = bytearray(build([("x", b"A" * 100, 0), ("y", b"B" * 100, 0)]))
    cd = _entries(bytes(data))
    # point y's central entry at x's local header: two entries sharing bytes
    struct.pack_into("<L", data, cd[1] + 42, struct.unpack_from("<L", data, cd[0] + 42)[0])
    with pytest.raises(FormatError, match="overlaps"):
        ZipArchive(BytesSource(bytes(data), "ov.zip"))
    data = bytearray(build([("x", b"A" * 100, 0)]))
    local_name = data.find(b"arch/x")
    data[local_name + 5] = ord("z")  # local header names arch/z, the directory arch/x
    arch = ZipArchive(BytesSource(bytes(data), "dis.zip"))
    with pytest.raises(FormatError, match="disagree"):
        arch.get("x").data().pread(0, 10)


def test_refuses_fake_end_record_in_comment_and_trailing_junk():
    real = build([("x", b"data", 0)])
    eocd = real[real.rfind(b"PK\x05\x06"):]
    fake = eocd[:-2] + b"\x00\x00"  # a plausible end record with no comment...
    data = real[:-2] + struct.pack("<H", len(fake)) + fake  # ...hidden in the real one's comment
    with pytest.raises(FormatError, match="ambiguous"):
        ZipArchive(BytesSource(data, "fake.zip"))
    with pytest.raises(FormatError, match="end-of-central-directory"):
        ZipArchive(BytesSource(real + b"junk" * 10, "tail.zip"))
    with pytest.raises(FormatError):
        ZipArchive(BytesSource(b"junk" * 10 + real, "head.zip"))


def test_deflate_bomb_stops_at_declared_size():
    payload = b"\x00" * (10 << 20)
    data = bytearray(build([("x", payload, zipfile.ZIP_DEFLATED)]))
    cd = _entries(bytes(data))
    struct.pack_into("<L", data, cd[0] + 24, 1000)  # the directory claims 1000 bytes
    arch = ZipArchive(BytesSource(bytes(data), "bomb.zip"))
    rec = arch.get("x")
    assert rec.size == 1000
    # inflation stops at the declared size; the local header (10 MiB) and the CRC both tell the lie
    with pytest.raises(FormatError, match="CRC|disagree on the size"):
        rec.data().pread(0, 5000)


def test_bad_crc_in_deflated_record_is_reported():
    data = bytearray(build([("x", b"hello world" * 10, zipfile.ZIP_DEFLATED)]))
    cd = _entries(bytes(data))
    struct.pack_into("<L", data, cd[0] + 16, 12345)
    arch = ZipArchive(BytesSource(bytes(data), "crc.zip"))
    with pytest.raises(FormatError, match="CRC"):
        arch.get("x").data().pread(0, 10)


def _npz() -> bytes:
    import numpy as np

    buf = io.BytesIO()
    np.savez(buf, x=np.arange(3), y=np.ones(2))
    return buf.getvalue()


def _npy() -> bytes:
    import numpy as np

    buf = io.BytesIO()
    np.save(buf, np.arange(3))
    return buf.getvalue()


@pytest.mark.parametrize("data, said", [
    (_npz(), "a NumPy .npz archive, not a torch checkpoint"),
    (_npy(), "a NumPy .npy file, not a torch checkpoint"),
    (b"GGUF\x03\x00\x00\x00" + bytes(40), "a GGUF file, not a torch checkpoint"),
    (b"\x89HDF\r\n\x1a\n" + bytes(40), "an HDF5 file, not a torch checkpoint"),
    (b"\xff\xff\x00\x00\x00\x00\x00\x00{" + bytes(40), "safetensors header length 65535 runs past the end"),
], ids=["npz", "npy", "gguf", "hdf5", "not-safetensors"])
def test_other_formats_are_named(data, said):
    """Files people mistake for checkpoints get one line naming what they are (no guessing on lookalikes)."""
    from ckptfs.container import open_container

    with pytest.raises(FormatError) as e:
        open_container(BytesSource(data, "f.bin"))
    assert said in str(e.value)


# zip64 extras: the directory reads them all at once when every entry needs the same values and its extra field
# starts with the zip64 record (torch's writer); other layouts row by row. Expected values from Python's zipfile.

_combos = st.tuples(st.booleans(), st.booleans(), st.booleans(), st.sampled_from(["first", "after", "short", "longer"]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_combos, min_size=1, max_size=6))
def test_zip64_extras_of_every_layout_read_as_zipfile_reads_them(combos):
    from hostile.craft import Entry, write_zip

    entries = [Entry(b"arch/data.pkl", b"\x80\x02}q\x00.")]
    entries += [Entry(f"arch/data/{i}".encode(), bytes(range(i + 1)) * 3) for i in range(len(combos))]
    first = write_zip(entries)  # where each local header lands (the central directory's extras do not move them)
    for i, (s, c, h, layout) in enumerate(combos, start=1):
        e = entries[i]
        values = [len(e.data)] * s + [len(e.data)] * c + [first.local[e.name]] * h
        body = struct.pack(f"<{len(values)}Q", *values) + (b"\0" * 8 if layout == "longer" else b"")
        if layout == "short" and values:
            body = body[:-1]
        record = struct.pack("<2H", 1, len(body)) + body
        other = struct.pack("<2H", 0x5455, 5) + b"\x01\0\0\0\0"  # an extended-timestamp record
        e.extra_cd = other + record if layout == "after" else record
        e.size = 0xFFFFFFFF if s else None
        e.csize = 0xFFFFFFFF if c else None
        e.header_offset = 0xFFFFFFFF if h else None
    data = write_zip(entries).data
    if any(layout == "short" and (s or c or h) for s, c, h, layout in combos):
        with pytest.raises(FormatError, match="zip64"):
            ZipArchive(BytesSource(data, "z.zip"))
        return
    arch = ZipArchive(BytesSource(data, "z.zip"))
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for info in z.infolist():
            rec = arch.get(info.filename.removeprefix("arch/"))
            assert (rec.size, rec.compress_size, rec.header_offset) == (info.file_size, info.compress_size,
                                                                        info.header_offset), info.filename
            assert rec.data().pread(0, 1 << 20) == z.read(info)
