"""The parts of remote reading that need no server: URLs and their redaction, the read-ahead policy, the block
cache, command-line options, and the process-title scrubbing."""

from __future__ import annotations

import argparse
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptfs.cli.common import remote_from
from ckptfs.cli.proctitle import redacted_args
from ckptfs.errors import CkptfsError, RemoteError
from ckptfs.source.blocks import BlockCache
from ckptfs.source.options import RemoteOptions
from ckptfs.source.readahead import Readahead
from ckptfs.source.urls import Redactor, is_url, local_path, option_secrets, redact_url, url_secrets


@pytest.mark.parametrize("target,url", [
    ("https://host/x.pth", True), ("s3://b/k.pth", True), ("hf://org/repo/x.pth", True),
    ("simplecache::s3://b/k", True), ("file:///tmp/x.pth", False), ("/tmp/x.pth", False), ("x.pth", False),
    ("c://x", False), ("weird:name.pth", False), (b"https://x", False),
])
def test_is_url(target, url):
    assert is_url(target) is url


def test_file_urls_are_paths():
    assert local_path("file:///tmp/a%20b.pth") == "/tmp/a b.pth"
    assert local_path("/tmp/x") == "/tmp/x"


def test_redaction_of_user_info_and_signed_queries():
    url = ("https://bob:hunter2@cdn.example.com:8443/a/m.pth?X-Amz-Credential=AKIA%2F1&X-Amz-Signature=abc123"
           "&versionId=7&token=t0k&part=1#frag")
    shown = redact_url(url)
    assert shown == ("https://cdn.example.com:8443/a/m.pth?X-Amz-Credential=REDACTED&X-Amz-Signature=REDACTED"
                     "&versionId=7&token=REDACTED&part=1")
    assert {"hunter2", "bob", "abc123", "t0k", "AKIA/1"} <= set(url_secrets(url))
    assert redact_url("simplecache::s3://b/k?sig=zz") == "simplecache::s3://b/k?sig=REDACTED"
    for kept in ("s3://", "s3://b/", "file:///tmp/m.pth", "https://h/x?", "http://[::1]:8080/m.pth"):
        assert redact_url(kept) == kept.rstrip("?")  # an empty host or query is not a reason to reshape a URL


@given(user=st.text(st.characters(whitelist_categories=["Ll", "Lu", "Nd"]), min_size=1, max_size=12),
       password=st.text(st.characters(whitelist_categories=["Ll", "Lu", "Nd", "Po"]), min_size=6, max_size=20))
def test_a_password_never_survives_redaction(user, password):
    from urllib.parse import quote

    url = f"https://{quote(user, safe='')}:{quote(password, safe='')}@example.org/p/m.pth?sig={quote(password)}"
    shown = redact_url(url)
    assert password not in shown and quote(password, safe="") not in shown
    assert shown.startswith("https://example.org/p/m.pth")
    assert Redactor(url_secrets(url))(f"failed: {url} ({password})").count(password) == 0


def test_option_secrets_are_credentials_and_headers():
    opts = {"key": "AKID", "secret": "S3cret", "endpoint_url": "http://h:9000", "anon": False,
            "headers": {"Authorization": "Bearer xyz", "X-Trace": "abc"}, "client_kwargs": {"region_name": "eu"}}
    assert sorted(option_secrets(opts)) == ["AKID", "Bearer xyz", "S3cret", "abc"]


def test_process_title_hides_credentials():
    argv = ["/usr/bin/python3", "-m", "ckptfs.cli", "mount", "https://u:pw123@h/m.pth?sig=S1G", "/mnt/m",
            "--storage-option", "secret=S3", "--storage-option=headers.Authorization=Bearer x",
            "--storage-option", "endpoint_url=http://h:9000", "--timeout", "5"]
    assert redacted_args(argv) == ["/usr/bin/python3", "-m", "ckptfs.cli", "mount", "https://h/m.pth?sig=REDACTED",
                                   "/mnt/m", "--storage-option", "secret=***",
                                   "--storage-option=headers.Authorization=***", "--storage-option",
                                   "endpoint_url=http://h:9000", "--timeout", "5"]


def test_storage_options_from_the_command_line():
    ns = argparse.Namespace(storage_option=["anon=true", "client_kwargs.region_name=eu-west-1", "key=a=b"],
                            timeout=5.0, cache_dir="/c", cache_size="2G", memory_cache="64M")
    opts, remote = remote_from(ns)
    assert opts == {"anon": True, "client_kwargs": {"region_name": "eu-west-1"}, "key": "a=b"}
    assert remote == RemoteOptions(timeout=5.0, cache_dir="/c", cache_size=2 << 30, memory_cache=64 << 20)
    assert remote_from(argparse.Namespace()) == (None, None)
    with pytest.raises(CkptfsError, match="expected KEY=VALUE"):
        remote_from(argparse.Namespace(storage_option=["novalue"]))
    with pytest.raises(CkptfsError, match="timeout must be positive"):
        RemoteOptions(timeout=0)


# --- read-ahead -----------------------------------------------------------------------------------------------

B = 256 << 10


def _reads(ra: Readahead, offsets, n):
    return [ra.on_read(o, n).ahead for o in offsets]


def test_sequential_reads_keep_a_growing_window_on_its_way():
    ra = Readahead(1 << 40, B, 1 << 20, 64 << 20, 8 << 20)
    lead = []  # bytes asked for ahead of the reader, after each read
    ahead = []
    for off in range(0, 300 << 20, 128 << 10):
        a = ra.on_read(off, 128 << 10).ahead
        if a:
            ahead.append(a)
        if ahead:
            lead.append(ahead[-1][1] - (off + (128 << 10)))
    assert ahead[0][0] == 512 << 10  # the third read (256 KiB read in all) starts it, past its own block
    assert all(a % B == 0 for a, _ in ahead)
    assert all(ahead[i][1] == ahead[i + 1][0] for i in range(len(ahead) - 1))  # contiguous, never twice
    sizes = [b - a for a, b in ahead]
    assert sizes[0] == 1 << 20 and sorted(sizes[:6]) == sizes[:6]  # grows from 1 MiB ...
    assert max(lead) <= (64 << 20) + B and max(lead[len(lead) // 2 :]) >= 56 << 20  # ... to 64 MiB ahead
    assert min(sizes[10:]) >= 8 << 20  # then it is topped up a part (8 MiB) at a time, not a block at a time


def test_the_kernel_read_ahead_and_out_of_order_reads_stay_one_stream():
    """A multi-threaded mount: reads arrive out of order and the kernel's read-ahead runs up to 16 MiB ahead."""
    ra = Readahead(1 << 40, B, 1 << 20, 64 << 20, 8 << 20)
    for i in range(0, 64, 2):
        ra.on_read((i + 1) << 20, 1 << 20)  # the later one first
        ra.on_read(i << 20, 1 << 20)
        ra.on_read((i + 16) << 20, 1 << 20)  # the kernel's read-ahead
    assert len(ra.streams) == 1


def test_blocks_fetched_ahead_are_not_dropped_before_a_lagging_reader_copies_them():
    """A multi-threaded mount serves the kernel's read-ahead (16 MiB ahead of the reader) out of order: reads as
    far behind the furthest one as the stream still takes must find their blocks (dropping them made every
    lagging read fetch its block again, synchronously: 312 MiB fetched to read 256 MiB)."""
    ra = Readahead(1 << 40, B, 1 << 20, 64 << 20, 8 << 20)
    dropped_up_to = 0
    for i in range(0, 128):
        for off in ((i + 16) << 20, i << 20):  # the read-ahead's request first, then the reader's own
            advice = ra.on_read(off, 1 << 20)
            if advice.drop:
                dropped_up_to = max(dropped_up_to, advice.drop[1])
            assert dropped_up_to <= off, (off, advice.drop)  # what a read still asks for was never dropped
    assert dropped_up_to > 64 << 20  # (and memory is still given back)


def test_random_reads_fetch_nothing_ahead():
    import random

    rnd = random.Random(1)
    ra = Readahead(1 << 40, B, 1 << 20, 64 << 20, 8 << 20)
    assert all(a is None for a in _reads(ra, [rnd.randrange(0, 1 << 40) & ~4095 for _ in range(1000)], 4096))


def test_interleaved_streams_are_each_seen():
    ra = Readahead(1 << 40, B, 1 << 20, 64 << 20, 8 << 20)
    got = {0: [], 1: []}
    for i in range(40):
        for s, base in ((0, 0), (1, 10 << 30)):
            a = ra.on_read(base + i * (128 << 10), 128 << 10).ahead
            if a:
                got[s].append(a)
    assert got[0] and got[1]
    assert all(a < 10 << 30 for a, _ in got[0]) and all(a >= 10 << 30 for a, _ in got[1])


def test_a_large_read_then_small_ones_nearby_is_not_a_stream():
    """What indexing does (data.pkl, then the small records after it): nothing is fetched ahead."""
    ra = Readahead(1 << 40, B, 1 << 20, 64 << 20, 8 << 20)
    assert ra.on_read(64, 3 << 20).ahead is None
    assert _reads(ra, [(3 << 20) + 64 + 100 * i for i in range(20)], 50) == [None] * 20


def test_windows_stop_at_the_end_of_the_object():
    size = 5 << 20
    ra = Readahead(size, B, 1 << 20, 64 << 20, 8 << 20)
    ahead = [a for a in _reads(ra, range(0, size, 128 << 10), 128 << 10) if a]
    assert ahead[-1][1] == size and all(b <= size for _, b in ahead)


# --- the block cache --------------------------------------------------------------------------------------------


def _get(c: BlockCache, idx: int) -> bytes | None:
    out = bytearray(c.block)
    return bytes(out) if c.copy(idx, memoryview(out), 0) else None


def test_block_cache_is_bounded_lru_and_reuses_memory():
    c = BlockCache(4, 16)
    for i in range(10):
        assert c.claim([i]) == [i]
        buf = c.buffer(4)
        buf[:] = bytes([i]) * 4
        c.put(i, buf)
    assert c.nbytes == 16 and [_get(c, i) for i in range(10)] == [None] * 6 + [bytes([i]) * 4 for i in range(6, 10)]
    # ten blocks through an arena of six buffers: each evicted block's buffer was handed out again
    assert all(type(b) is memoryview for b in c._data.values()) and len(c._arena.made) == 6
    _get(c, 6)  # used: now the most recent
    c.claim([10])
    c.put(10, c.buffer(4))
    assert _get(c, 7) is None and _get(c, 6) == bytes([6]) * 4
    nine = c._data[9]
    c.drop([9])
    assert _get(c, 9) is None and c.nbytes == 12 and c.buffer(4) is nine  # a dropped block's memory is reused


def test_block_cache_arena_is_bounded_and_takes_back_what_a_failed_fetch_held():
    c = BlockCache(4, 16)  # at most 16 * 3 / 2 bytes of arena buffers: 6 of 4 bytes
    held = [c.buffer(4) for _ in range(8)]
    assert [type(b) for b in held] == [memoryview] * 6 + [bytearray] * 2  # then plain buffers
    views = held[:6]
    for i, v in enumerate(views):
        v[:] = bytes([i]) * 4
    assert len({bytes(v) for v in views}) == 6  # six distinct buffers, not one memory shared
    c.recycle(held)  # a fetch that failed gives its buffers back (plain ones are simply dropped)
    again = [c.buffer(4) for _ in range(6)]
    assert {id(b) for b in again} == {id(v) for v in views}
    c.claim([1])
    c.put(1, again[0])
    c.put(1, again[0])  # the same buffer put again is not also handed out as free
    assert all(c.buffer(4) is not again[0] for _ in range(3))
    assert _get(c, 1) == bytes(again[0])
    assert isinstance(c.buffer(3), bytearray)  # a short (last) block: a plain buffer


def test_a_pending_block_is_fetched_once_and_waited_for():
    c = BlockCache(4, 1 << 20)
    assert c.claim([1, 2]) == [1, 2]
    assert c.claim([1, 2, 3]) == [3]  # 1 and 2 are someone's already
    got = []
    t = threading.Thread(target=lambda: got.append(c.wait(1, 10) and _get(c, 1)))
    t.start()
    c.put(1, b"abcd")
    t.join(10)
    assert got == [b"abcd"]
    c.fail([2], RemoteError("down"))
    assert c.wait(2, 1) is False  # a transient failure: the waiter fetches it itself
    c.claim([4])
    with pytest.raises(RemoteError, match="timed out waiting"):
        c.wait(4, 0.05)


def test_a_sequential_stream_drops_what_it_read_long_ago_and_nothing_else():
    ra = Readahead(1 << 40, B, 1 << 20, 64 << 20, 8 << 20)
    drops = [d for d in (ra.on_read(off, 128 << 10).drop for off in range(0, 64 << 20, 128 << 10)) if d]
    assert drops[0][0] == 0 and all(drops[i][1] == drops[i + 1][0] for i in range(len(drops) - 1))
    assert (64 << 20) - drops[-1][1] >= 24 << 20  # the last 24 MiB are kept (reads out of order, re-reads)
    # indexing: the head, then the tail and the directory within 16 MiB of it: nothing dropped, nothing fetched
    ra = Readahead(10 << 20, B, 1 << 20, 64 << 20, 8 << 20)
    advice = [ra.on_read(0, 512), ra.on_read(64, 30), ra.on_read((10 << 20) - 65_000, 65_000),
              ra.on_read((10 << 20) - 600_000, 530_000), ra.on_read(100, 300_000)]
    assert all(a.drop is None for a in advice)


def test_a_block_read_ahead_leaves_the_cache_once_all_its_bytes_were_copied_out():
    """Read-ahead for a sequential reader: each block is read once (a mount's page cache keeps the bytes), so
    its memory takes the next block as soon as it has been copied out, not 24 MiB later; a block a reader
    fetched itself stays cached (random reads come back)."""
    c = BlockCache(8, 1 << 20)
    assert c.claim([0, 1], once=True) == [0, 1]
    assert c.claim([2]) == [2]
    for idx in (0, 1, 2):
        buf = c.buffer(8)
        buf[:] = bytes([idx]) * 8
        c.put(idx, buf)
    out = memoryview(bytearray(8))
    assert c.copy(0, out[:3], 0) and c.copy(0, out[3:8], 3)  # all 8 bytes, in two reads
    assert bytes(out) == bytes([0]) * 8
    assert not c.cached(0) and c.nbytes == 16
    assert c.copy(1, out[:5], 2) and c.cached(1)  # 5 of 8 bytes copied: still cached
    freed = c._arena.free[-1]
    assert c.buffer(8) is freed  # block 0's buffer is the next one handed out
    for _ in range(3):
        assert c.copy(2, out, 0)
    assert c.cached(2)  # fetched by a reader itself: kept however often it is read
    c.claim([3], once=True)
    c.put(3, b"x" * 8)
    c.drop([3])
    assert c._once == {1: 3}  # a dropped block leaves no count behind; block 1 has 3 bytes to go
