"""The legacy stream format (torch < 1.6, and _use_new_zipfile_serialization=False) against torch.load."""

from __future__ import annotations

import json
import pickle
import struct
import tarfile
from collections import OrderedDict

import numpy as np
import pytest
import torch

import ckptfs
from ckptfs.container.legacy import LegacyStream
from ckptfs.source import LocalFile
from craft import LegacyTensor, RebuildV1, rebuild_v2, storage_ref, write_legacy_stream
from helpers import lookup, torch_bytes

LEGACY_DTYPES = ["float64", "float32", "float16", "bfloat16", "complex64", "complex128", "int8", "int16", "int32",
                 "int64", "uint8", "bool"]


def _make(name: str, shape=(3, 4)) -> torch.Tensor:
    dt = getattr(torch, name)
    base = torch.arange(int(np.prod(shape)), dtype=torch.float64).reshape(shape) * 1.5 - 4
    if dt.is_complex:
        return torch.complex(base, -base).to(dt)
    if dt == torch.bool:
        return base > 0
    return base.to(dt)


def assert_same(ckpt: ckptfs.Checkpoint, ref: object) -> int:
    """Every tensor ckptfs indexes equals torch.load's, byte for byte and as a torch tensor."""
    n = 0
    for i in ckpt.index.tensors():
        key = ckpt.index.keys[i]
        want = lookup(ref, ckpt.index.path(i))
        m = ckpt.meta(key)
        assert m.error is None, (key, m.error)
        assert ckpt.read(key) == torch_bytes(want), key
        got = ckpt.tensor(key)
        assert got.dtype == want.dtype and got.shape == want.shape and got.requires_grad == want.requires_grad
        assert torch.equal(got, want), key
        n += 1
    return n


@pytest.mark.parametrize("protocol", [2, 4])
def test_dtypes_and_views(tmp_path, protocol):
    sd = {name: _make(name) for name in LEGACY_DTYPES}
    base = torch.arange(60, dtype=torch.float32).reshape(3, 4, 5)
    sd.update({"base": base, "t": base.transpose(0, 2), "sl": base[1:, ::2, 1:4], "row": base[2],
               "expand": torch.arange(3.0).reshape(3, 1).expand(3, 4), "empty": torch.zeros(0, 3),
               "scalar": torch.tensor(7), "param": torch.nn.Parameter(torch.randn(4)),
               "nested": {"list": [torch.ones(2), (torch.zeros(3, dtype=torch.int16),)]}})
    p = tmp_path / "legacy.pt"
    torch.save(sd, p, _use_new_zipfile_serialization=False, pickle_protocol=protocol)
    ref = torch.load(p, weights_only=protocol == 2)  # torch's weights_only unpickler lacks protocol 4's FRAME
    with ckptfs.open(p) as ckpt:
        assert ckpt.format == "legacy"
        assert ckpt.info()["format"] == "legacy"
        leaves = list(_leaves(sd))
        assert ckpt.info()["container"]["storage_keys"] == ckpt.info()["storages"] == len(leaves) - 3  # 3 views
        assert assert_same(ckpt, ref) == len(ckpt.index.tensors()) == len(leaves) == 22
        assert ckpt.meta("t").record.startswith("storages/")
        assert ckpt.meta("t").storage_key == ckpt.meta("base").storage_key  # one storage, shared
        assert ckpt.tensor("param").__class__ is torch.nn.Parameter
        np.testing.assert_array_equal(ckpt.numpy("sl"), ref["sl"].numpy())


def _leaves(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _leaves(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _leaves(v)


def test_state_dict_of_a_module_and_metadata(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.LSTM(3, 2))
    p = tmp_path / "model.pt"
    torch.save(model.state_dict(), p, _use_new_zipfile_serialization=False)
    ref = torch.load(p, weights_only=True)
    with ckptfs.open(p) as ckpt:
        assert ckpt.tensor_keys() == list(ref.keys())
        assert assert_same(ckpt, ref) == len(ref)
        sd = ckptfs.load(p)
        assert sd._metadata == ref._metadata
        model.load_state_dict(sd)


def test_legacy_tensor_class_forms(tmp_path):
    """torch < 0.4: ``torch.FloatTensor()`` + BUILD (storage, offset, size, stride), legacy Variables, and
    ``_rebuild_tensor`` (v1)."""
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    obj = {"float": LegacyTensor(base), "slice": LegacyTensor(base[1:, ::2]), "long": LegacyTensor(torch.arange(5)),
           "double": LegacyTensor(torch.randn(2, 2, dtype=torch.float64)), "byte": LegacyTensor(torch.arange(4).byte()),
           "tensor_cls": LegacyTensor(torch.randn(3), cls=torch.Tensor),
           "variable": LegacyTensor(torch.randn(2), variable=True), "v1": RebuildV1(base.t()),
           "v1_offset": RebuildV1(base[2, 1:])}
    p = tmp_path / "old.pt"
    torch.save(obj, p, _use_new_zipfile_serialization=False)
    ref = torch.load(p, weights_only=False)
    with ckptfs.open(p) as ckpt:
        assert assert_same(ckpt, ref) == len(obj)
        assert ckpt.meta("variable").requires_grad is True
        assert ckpt.meta("slice").stride == (4, 2)
        assert not ckpt.unknown_globals  # torch.FloatTensor & co are recorded calls, not opaque objects


def test_legacy_tensor_class_with_a_storage_of_another_dtype(tmp_path):
    p = tmp_path / "bad.pt"
    torch.save({"ok": LegacyTensor(torch.ones(2)),
                "bad": LegacyTensor(torch.ones(2, dtype=torch.float64), cls=torch.FloatTensor)},
               p, _use_new_zipfile_serialization=False)
    with pytest.raises(RuntimeError):
        torch.load(p, weights_only=False)  # torch refuses the whole file
    with ckptfs.open(p) as ckpt:
        assert "set_() refuses" in ckpt.meta("bad").error
        assert ckpt.numpy("ok").tolist() == [1.0, 1.0]
        with pytest.raises(ckptfs.TensorError):
            ckpt.read("bad")


def test_storage_views(tmp_path):
    """Pre-1.0 storage views: persistent ids whose 6th item is (view_key, offset, numel)."""
    data = np.arange(10, dtype="<f4")
    root_v = storage_ref(torch.FloatStorage, "root", 10, view=("v1", 2, 4))
    root_plain = storage_ref(torch.FloatStorage, "root", 10)
    obj = {"view": rebuild_v2(root_v, 1, (2,), (1,)), "whole": rebuild_v2(root_plain, 0, (10,), (1,))}
    p = tmp_path / "views.pt"
    write_legacy_stream(p, obj, [("root", data.tobytes(), 4)])
    ref = torch.load(p, weights_only=False)
    assert ref["view"].tolist() == [3.0, 4.0]
    with ckptfs.open(p) as ckpt:
        assert assert_same(ckpt, ref) == 2
        assert ckpt.meta("view").storage_key == "v1"


def test_storage_view_outside_its_root(tmp_path):
    root_v = storage_ref(torch.FloatStorage, "root", 4, view=("v1", 3, 4))
    p = tmp_path / "badview.pt"
    write_legacy_stream(p, {"view": rebuild_v2(root_v, 0, (4,), (1,)),
                            "ok": rebuild_v2(storage_ref(torch.FloatStorage, "root", 4), 0, (4,), (1,))},
                        [("root", np.arange(4, dtype="<f4").tobytes(), 4)])
    with ckptfs.open(p) as ckpt:
        assert "outside its root" in ckpt.meta("view").error
        assert ckpt.numpy("ok").tolist() == [0, 1, 2, 3]


class _Inert(pickle.Unpickler):
    """Unpickles the object pickle of a stream written here without building anything: every global is an
    inert stand-in (the walk needs only where the pickle ends)."""

    class Any:
        def __init__(self, *args, **kwargs):
            pass

        def __setstate__(self, state):
            pass

        def __setitem__(self, key, value):
            pass

    def find_class(self, module, name):
        return _Inert.Any

    def persistent_load(self, pid):
        return None


def _walk_legacy(path, itemsize: int) -> tuple[int, list[tuple[str, int]]]:
    """(where the storage data starts, [(key, offset of its 8-byte count)]) of a legacy stream whose storages
    all have ``itemsize``-byte elements, walked with pickle and struct as torch.save wrote it: the magic,
    protocol and sys_info pickles, the object pickle, the key list, then per key a count and the data."""
    with open(path, "rb") as f:
        for _ in range(3):
            pickle.load(f)
        _Inert(f).load()
        keys = pickle.load(f)
        data_start = f.tell()
        out = []
        for key in keys:
            out.append((key, f.tell()))
            (count,) = struct.unpack("<q", f.read(8))
            f.seek(count * itemsize, 1)
        assert f.tell() == path.stat().st_size, "the walk did not end at the end of the file"
    return data_start, out


def _storage_positions(path, itemsize: int = 4) -> list[tuple[str, int]]:
    """(key, offset of the 8-byte count) of each storage, in file order."""
    return _walk_legacy(path, itemsize)[1]


def test_header_counts_are_checked(tmp_path):
    p = tmp_path / "lie.pt"
    torch.save({"a": torch.arange(4.0), "b": torch.arange(3.0)}, p, _use_new_zipfile_serialization=False)
    pos = _storage_positions(p)
    raw = bytearray(p.read_bytes())
    first_key, at = pos[0]
    count = struct.unpack_from("<q", raw, at)[0]
    # claim fewer elements and shift the rest so the next storage is still where the count says
    itemsize = 4
    del raw[at + 8 + (count - 1) * itemsize : at + 8 + count * itemsize]
    struct.pack_into("<q", raw, at, count - 1)
    p.write_bytes(bytes(raw))
    with pytest.raises(RuntimeError, match="wrong byte size|size"):
        torch.load(p, weights_only=True)
    with ckptfs.open(p) as ckpt:
        bad = [k for k in ("a", "b") if ckpt.meta(k).storage_key == first_key]
        good = [k for k in ("a", "b") if k not in bad]
        assert len(bad) == 1 and "the pickle declares" in ckpt.meta(bad[0]).error
        assert ckpt.meta(good[0]).error is None
        assert ckpt.numpy(good[0]).tolist() == [0.0, 1.0, 2.0, 3.0][: ckpt.meta(good[0]).shape[0]]


def test_truncated_stream(tmp_path):
    p = tmp_path / "trunc.pt"
    torch.save({"a": torch.arange(4.0), "b": torch.arange(300.0)}, p, _use_new_zipfile_serialization=False)
    pos = _storage_positions(p)
    raw = p.read_bytes()
    p.write_bytes(raw[: pos[-1][1] + 8 + 10])  # the last storage loses its tail
    with ckptfs.open(p) as ckpt:
        errors = {k: ckpt.meta(k).error for k in ("a", "b")}
        assert sum(1 for e in errors.values() if e and "file ends" in e) == 1
        assert sum(1 for e in errors.values() if e is None) == 1


def test_headers_are_read_without_reading_data(tmp_path):
    """Indexing reads the pickles and the 8-byte headers, not the storages (small reads only)."""
    sd = {f"w{i}": torch.randn(64, 1024) for i in range(8)}  # 8 x 256 KiB
    sd.update({f"s{i}": torch.tensor(float(i)) for i in range(2000)})  # many tiny storages
    p = tmp_path / "big.pt"
    torch.save(sd, p, _use_new_zipfile_serialization=False)

    class Counting(LocalFile):
        total = 0

        def pread(self, offset, n):
            data = super().pread(offset, n)
            Counting.total += len(data)
            return data

        def preadinto(self, buf, offset):
            got = super().preadinto(buf, offset)
            Counting.total += got
            return got

    src = Counting(p)
    with ckptfs.open(src) as ckpt:
        assert len(ckpt.tensor_keys()) == 2008
        assert ckpt.numpy("s1999").item() == 1999.0
    pickle_end = _walk_legacy(p, 4)[0]
    # the pickles, at most 64 KiB read past each, one 4 KiB window per big storage's header, the scalar read
    assert Counting.total < pickle_end + 3 * 65536 + 8 * 4096 + 4096, Counting.total
    assert Counting.total < p.stat().st_size / 4


def test_trailing_bytes_and_info(tmp_path):
    p = tmp_path / "t.pt"
    torch.save({"a": torch.ones(3)}, p, _use_new_zipfile_serialization=False)
    with open(p, "ab") as f:
        f.write(b"junk")
    with ckptfs.open(p) as ckpt:
        info = ckpt.info()
        assert info["container"]["trailing_bytes"] == 4
        assert info["container"]["sys_info"]["little_endian"] is True
        assert "legacy" in info["torch_version_hint"] or "1.6" in info["torch_version_hint"]
        assert ckpt.numpy("a").tolist() == [1, 1, 1]


def test_sys_info_with_values_torch_never_writes(tmp_path):
    """torch.load reads sys_info and ignores it; ckptfs shows it in info(), which must stay JSON whatever the
    file put there (found by the fuzzer: a storage class spliced into type_sizes)."""
    p = tmp_path / "s.pt"
    data = np.arange(6, dtype="<f4").tobytes()
    sys_info = {"protocol_version": 1001, "little_endian": True, 7: "int key",
                "type_sizes": {"short": 2, "long": torch.FloatStorage, "nan": float("nan"), 3: (1, 2)},
                "huge": 1 << 100, "nested": {"a": {"b": {"c": [1]}}}}
    write_legacy_stream(p, {"a": rebuild_v2(storage_ref(torch.FloatStorage, "0", 6), 0, (2, 3), (3, 1))},
                        [("0", data, 4)], sys_info=sys_info)
    ref = torch.load(p, weights_only=False)
    with ckptfs.open(p) as ckpt:
        info = ckpt.info()
        shown = json.loads(json.dumps(info))["container"]["sys_info"]
        assert shown["little_endian"] is True and shown["protocol_version"] == 1001
        assert shown["type_sizes"]["short"] == 2
        assert "FloatStorage" in shown["type_sizes"]["long"]
        assert shown["type_sizes"]["nan"] == "nan" and shown["type_sizes"]["3"] == "(1, 2)"
        assert shown["huge"] == str(1 << 100)
        assert "7" not in shown  # torch writes str keys only; others are left out
        assert ckpt.read("a") == torch_bytes(ref["a"])


def test_bad_magic_and_protocol(tmp_path):
    p = tmp_path / "m.pt"
    torch.save({"a": torch.ones(3)}, p, _use_new_zipfile_serialization=False)
    raw = bytearray(p.read_bytes())
    i = raw.index(struct.pack("<H", 1001))  # BININT2 1001 in the protocol pickle
    raw[i : i + 2] = struct.pack("<H", 1002)
    p.write_bytes(bytes(raw))
    with pytest.raises(ckptfs.FormatError, match="protocol version 1002"):
        ckptfs.open(p)
    with pytest.raises(ckptfs.FormatError):
        LegacyStream(LocalFile(p))


def test_pickle_limit_applies_to_the_streamed_pickle(tmp_path):
    p = tmp_path / "l.pt"
    torch.save({f"k{i}": i for i in range(5000)} | {"t": torch.ones(1)}, p, _use_new_zipfile_serialization=False)
    with pytest.raises(ckptfs.LimitError, match="over the limit"):
        ckptfs.open(p, limits=ckptfs.Limits(max_pickle_bytes=1000))
    with ckptfs.open(p) as ckpt:
        assert ckpt.value("k4999") == 4999


def test_tar_format_is_refused_with_its_reason(tmp_path):
    p = tmp_path / "old.tar.pt"
    with tarfile.open(p, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in ("sys_info", "pickle", "storages", "tensors"):
            f = tmp_path / name
            f.write_bytes(b"\x80\x02N.")
            tar.add(f, arcname=name)
    with pytest.raises(ckptfs.UnsupportedError, match=r"unsupported \(tar-based torch < 0.4 format\)"):
        ckptfs.open(p)


def test_storages_saved_on_their_own(tmp_path):
    """torch.save of a (typed) storage in the legacy format: served as a 1-D tensor of it. (torch 2.13
    cannot load an UntypedStorage saved in this format itself: its loader asks the class for a dtype.)"""
    t = torch.arange(6, dtype=torch.int32)
    p = tmp_path / "st.pt"
    torch.save({"t": t, "s": torch.arange(5, dtype=torch.int16).storage()}, p, _use_new_zipfile_serialization=False)
    ref = torch.load(p, weights_only=False)
    with ckptfs.open(p) as ckpt:
        assert ckpt.read("t") == torch_bytes(ref["t"])
        assert ckpt.meta("s").dtype == "int16"
        assert ckpt.numpy("s").tolist() == ref["s"].tolist() == [0, 1, 2, 3, 4]


def test_ordered_dict_root_and_empty(tmp_path):
    p = tmp_path / "e.pt"
    torch.save(OrderedDict(), p, _use_new_zipfile_serialization=False)
    with ckptfs.open(p) as ckpt:
        assert ckpt.keys() == [] and ckpt.info()["container"]["storage_keys"] == 0
