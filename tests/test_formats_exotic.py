"""Exotic tensors against torch.load: quantized, sparse, nested, meta, conj/neg, Parameters with state,
subclasses, wrapper subclasses, device tensors, numpy data, other device locations and big-endian files."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

import ckptfs
from ckptfs.cli import EXIT_OK, main
from craft import Reduce, throwaway_module, to_big_endian
from helpers import lookup, torch_bytes


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.is_quantized or b.is_quantized:
        return a.is_quantized and b.is_quantized and a.qscheme() == b.qscheme() and torch.equal(a.int_repr(), b.int_repr()) \
            and (a.qscheme() not in (torch.per_tensor_affine,) or (a.q_scale(), a.q_zero_point()) == (b.q_scale(), b.q_zero_point()))
    if a.is_nested or b.is_nested:
        return a.is_nested and b.is_nested and all(torch.equal(x, y) for x, y in zip(a.unbind(), b.unbind()))
    if a.layout != torch.strided or b.layout != torch.strided:
        return a.layout == b.layout and a.shape == b.shape and torch.equal(a.to_dense(), b.to_dense())
    if a.is_meta or b.is_meta:
        return a.is_meta and b.is_meta and a.shape == b.shape and a.dtype == b.dtype
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b) and a.is_conj() == b.is_conj() \
        and a.is_neg() == b.is_neg()


def check_against(ckpt: ckptfs.Checkpoint, ref: dict) -> None:
    """Every tensor / composite row equals torch's: parts byte for byte, composites as torch tensors.
    (The files are written here, in this machine's byte order.)"""
    index = ckpt.index
    for i in index.order():
        kind = index.kinds[i]
        if kind not in ("tensor", "composite"):
            continue
        want = lookup(ref, index.path(i))
        key = index.keys[i]
        m = ckpt.meta(key)
        assert m.error is None, (key, m.error)
        if kind == "tensor":
            if isinstance(want, np.ndarray):
                assert ckpt.read(key) == np.ascontiguousarray(want).tobytes(), key
                continue
            expected = b"" if want.is_meta else torch_bytes(want)
            assert ckpt.read(key) == expected, key
            assert m.nbytes == len(expected)
        assert _same(ckpt.tensor(key), want), key


def save_load(tmp_path, obj, name="x.pt", weights_only=True):
    p = tmp_path / name
    torch.save(obj, p)
    return p, torch.load(p, weights_only=weights_only, map_location="cpu")


def test_quantized(tmp_path):
    x = torch.randn(4, 6)
    obj = {
        "quint8": torch.quantize_per_tensor(x, 0.1, 3, torch.quint8),
        "qint8": torch.quantize_per_tensor(x, 0.05, -2, torch.qint8),
        "qint32": torch.quantize_per_tensor(x, 0.001, 7, torch.qint32),
        "transposed": torch.quantize_per_tensor(x, 0.1, 0, torch.qint8).t(),
        "channel0": torch.quantize_per_channel(x, torch.rand(4, dtype=torch.float64) + 0.01,
                                               torch.randint(-3, 3, (4,)), 0, torch.qint8),
        "channel1": torch.quantize_per_channel(x, torch.rand(6, dtype=torch.float64) + 0.01,
                                               torch.randint(0, 5, (6,)), 1, torch.quint8),
        # embedding weights (float zero points). Not Embedding(4, 6).weight(): that is made from uninitialised
        # memory (torch._empty_per_channel_affine_quantized), whose NaN scales made torch.equal fail at random
        "float_qparams": torch.quantize_per_channel(x, torch.rand(4) + 0.01, torch.randn(4), 0, torch.quint8),
    }
    p, ref = save_load(tmp_path, obj)
    with ckptfs.open(p) as ckpt:
        check_against(ckpt, ref)
        m = ckpt.meta("qint8")
        assert (m.kind, m.tensor_kind, m.dtype, m.numpy_dtype) == ("tensor", "quantized", "qint8", "|i1")
        assert m.extra == {"qscheme": "per_tensor_affine", "scale": 0.05, "zero_point": -2}
        c = ckpt.meta("channel1")
        assert (c.kind, c.tensor_kind, c.extra["axis"], c.extra["qscheme"]) == ("composite", "quantized", 1,
                                                                                  "per_channel_affine")
        assert [ckpt.index.names[r] for r in ckpt.index.children(ckpt.row("channel1"))] == \
            ["int_repr", "scales", "zero_points"]
        assert ckpt.meta("channel1.int_repr").dtype == "uint8"
        # torch writes per_channel_affine for float-qparams tensors too; float zero points tell them apart
        assert ckpt.meta("float_qparams").extra["qscheme"] == "per_channel_affine"
        assert ckpt.meta("float_qparams.zero_points").dtype == "float32"
        assert ckpt.tensor("float_qparams").qscheme() == torch.per_channel_affine_float_qparams
        np.testing.assert_array_equal(ckpt.numpy("channel0.scales"), ref["channel0"].q_per_channel_scales().numpy())
        with pytest.raises(ckptfs.UnsupportedError, match="stored as parts: read channel0.int_repr"):
            ckpt.read("channel0")



def test_packed_quantized(tmp_path, capsys):
    """quint4x2 / quint2x4 (4-bit quantized EmbeddingBag weights) pack several values per byte, each row padded
    to whole bytes: torch.load reads them; ckptfs indexes them as torch gives them and refuses their bytes
    with one clear error (not a geometry error that calls a valid file corrupt)."""
    x = torch.randn(5, 7)
    obj = {"q4": torch.quantize_per_tensor(x, 0.1, 2, torch.quint4x2),
           "q2": torch.quantize_per_tensor(x, 0.5, 1, torch.quint2x4),
           "emb4": torch.quantize_per_channel(x, torch.rand(5) + 0.1, torch.randn(5), 0, torch.quint4x2),
           "other": torch.arange(3.0)}
    p, ref = save_load(tmp_path, obj)
    with ckptfs.open(p) as ckpt:
        for key, per_byte in (("q4", 2), ("q2", 4), ("emb4.int_repr", 2)):
            m = ckpt.meta(key)
            assert (m.dtype, m.shape, m.error) == (str(ref[key.split(".")[0]].dtype)[6:], (5, 7), None)
            assert m.unsupported.startswith(f"{m.dtype} packs {per_byte} values per byte")
            for read in (ckpt.read, ckpt.numpy, ckpt.tensor):
                with pytest.raises(ckptfs.UnsupportedError, match=rf"x\.pt: {key}\b.*packs"):
                    read(key)
            assert ckpt.stats(key).note == m.unsupported and ckpt.stats(key).error is None, key
        assert ckpt.meta("emb4").extra["qscheme"] == "per_channel_affine"
        assert torch.equal(ckpt.tensor("emb4.scales"), ref["emb4"].q_per_channel_scales())
        assert torch.equal(ckpt.tensor("other"), ref["other"])
    assert main(["check", str(p), "--no-progress"]) == EXIT_OK
    assert "0 mismatched, 3 not compared" in capsys.readouterr().out
    assert main(["stats", str(p), "q4", "--no-progress"]) == EXIT_OK  # a note (packed), not an unreadable tensor
    assert "packs 2 values per byte" in capsys.readouterr().out

def test_sparse(tmp_path):
    dense = torch.randn(5, 6).relu()
    uncoalesced = torch.sparse_coo_tensor(torch.tensor([[0, 0, 2], [1, 1, 3]]), torch.tensor([1.0, 2.0, 3.0]), (4, 5))
    obj = {
        "coo": dense.to_sparse(), "uncoalesced": uncoalesced, "hybrid": torch.randn(3, 4, 2).to_sparse(1),
        "empty": torch.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.long), torch.zeros(0), (3, 3)),
        "csr": dense.to_sparse_csr(), "csc": dense.to_sparse_csc(),
        "bsr": torch.randn(4, 6).relu().to_sparse_bsr((2, 3)), "bsc": torch.randn(4, 6).relu().to_sparse_bsc((2, 2)),
        "int_csr": (dense * 10).to(torch.int32).to_sparse_csr(),
    }
    p, ref = save_load(tmp_path, obj)
    with ckptfs.open(p) as ckpt:
        check_against(ckpt, ref)
        m = ckpt.meta("coo")
        assert (m.kind, m.tensor_kind, m.shape, m.dtype) == ("composite", "sparse", (5, 6), "float32")
        assert m.extra["layout"] == "sparse_coo" and m.extra["is_coalesced"] is True
        assert ckpt.meta("uncoalesced").extra["is_coalesced"] is False
        assert ckpt.meta("hybrid").extra["sparse_dim"] == 1 and ckpt.meta("hybrid").extra["dense_dim"] == 2
        assert ckpt.meta("bsr").extra["blocksize"] == [2, 3]
        assert [ckpt.index.keys[r] for r in ckpt.index.children(ckpt.row("csc"))] == \
            ["csc.ccol_indices", "csc.row_indices", "csc.values"]
        assert ckpt.meta("coo").to_dict()["shape"] == [5, 6]  # the dense shape, in the sidecar
        assert ckpt.info()["composite_tensors"] == {"sparse": 9}
        sd = ckptfs.load(p)
        assert torch.equal(sd["csr"].to_dense(), ref["csr"].to_dense())


def test_nested(tmp_path):
    obj = {"nt": torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3), torch.randn(1, 3)]),
           "ints": torch.nested.nested_tensor([torch.arange(3), torch.arange(5)])}
    p, ref = save_load(tmp_path, obj)
    with ckptfs.open(p) as ckpt:
        check_against(ckpt, ref)
        m = ckpt.meta("nt")
        assert (m.kind, m.tensor_kind, m.shape, m.extra["tensors"], m.extra["ndim"]) == ("composite", "nested",
                                                                                          (3,), 3, 3)
        assert ckpt.numpy("nt.sizes").tolist() == [[2, 3], [4, 3], [1, 3]]
        assert ckpt.numpy("nt.offsets").tolist() == [0, 6, 18]


def test_jagged_nested(tmp_path, capsys):
    """Jagged-layout nested tensors (``layout=torch.jagged``: a NestedTensor subclass pickled through
    ``_rebuild_njt``) are composites of values / offsets (/ lengths) rebuilt as torch.load rebuilds them."""
    base = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3), torch.randn(1, 3)], layout=torch.jagged)
    values = torch.randn(9, 4)
    obj = {"njt": base,
           "ints": torch.nested.nested_tensor([torch.arange(3), torch.arange(5)], layout=torch.jagged),
           "lengths": torch.nested.nested_tensor_from_jagged(values, torch.tensor([0, 3, 5, 9]),
                                                             lengths=torch.tensor([2, 1, 4])),
           "grad": torch.nested.nested_tensor([torch.randn(2), torch.randn(3)], layout=torch.jagged,
                                              requires_grad=True),
           "x": torch.ones(2)}
    p, ref = save_load(tmp_path, obj, weights_only=False)
    with ckptfs.open(p) as ckpt:
        m = ckpt.meta("njt")
        assert (m.kind, m.tensor_kind, m.dtype, m.shape, m.error) == ("composite", "nested", "float32", (3,), None)
        assert (m.extra["layout"], m.extra["ragged_idx"], m.extra["ndim"]) == ("jagged", 1, 3)
        assert [ckpt.index.names[r] for r in ckpt.index.children(ckpt.row("lengths"))] == \
            ["values", "offsets", "lengths"]
        for key, want in ref.items():
            got = ckpt.tensor(key)
            assert got.dtype == want.dtype and got.requires_grad == want.requires_grad, key
            if key == "x":
                assert torch.equal(got, want)
                continue
            assert got.layout == torch.jagged and got._ragged_idx == want._ragged_idx, key
            assert len(got.unbind()) == len(want.unbind()), key
            assert all(torch.equal(a, b) for a, b in zip(got.unbind(), want.unbind(), strict=True)), key
            assert ckpt.read(f"{key}.values") == torch_bytes(want.values()), key
            assert ckpt.read(f"{key}.offsets") == torch_bytes(want.offsets()), key
        assert ckpt.read("lengths.lengths") == torch_bytes(ref["lengths"].lengths())
    assert main(["check", "--trust", str(p), "--no-progress"]) == EXIT_OK
    assert "0 mismatched, 0 not compared" in capsys.readouterr().out


def test_meta_conj_neg_and_parameter_state(tmp_path):
    z, z2 = torch.randn(4, dtype=torch.complex64), torch.randn(3, dtype=torch.complex64)
    p = torch.nn.Parameter(torch.randn(3))
    p.tag, p.scale = "frozen", 0.5
    obj = {"meta": torch.empty(3, 4, device="meta"), "meta_t": torch.empty(2, 5, device="meta", dtype=torch.float16).t(),
           "conj": z.conj(), "neg": z2.conj().imag, "pstate": p}
    path, ref = save_load(tmp_path, obj)
    with ckptfs.open(path) as ckpt:
        check_against(ckpt, ref)
        m = ckpt.meta("meta")
        assert (m.tensor_kind, m.nbytes, m.location, m.shape) == ("meta", 0, "meta", (3, 4))
        assert "no data" in m.extra["data"] and ckpt.read("meta") == b""
        assert ckpt.meta("meta_t").stride == (1, 5)
        assert ckpt.meta("conj").extra == {"conj": True} and ckpt.meta("neg").extra == {"neg": True}
        assert ckpt.read("conj") == z.numpy().tobytes() != ref["conj"].resolve_conj().numpy().tobytes()
        assert ckpt.read("neg") == z2.imag.numpy().tobytes()  # stored: the imaginary parts, not their negation
        assert ckpt.meta("pstate").extra["python_state"] == {"tag": "frozen", "scale": 0.5}
        got = ckpt.tensor("pstate")
        assert isinstance(got, torch.nn.Parameter) and (got.tag, got.scale) == ("frozen", 0.5)


SUBCLASSES = '''
import torch

class Tagged(torch.Tensor):
    """A plain Python tensor subclass with state (pickled with _rebuild_from_type_v2)."""


class Wrapper(torch.Tensor):
    """A wrapper subclass without storage (pickled with _rebuild_wrapper_subclass)."""

    @staticmethod
    def __new__(cls, shape, dtype):
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(func)
'''


def test_subclasses_without_importing_them(tmp_path):
    with throwaway_module("ckptfs_test_subclasses", SUBCLASSES, tmp_path) as mod:
        tagged = torch.arange(4.0).as_subclass(mod.Tagged)
        tagged.note = "hello"
        obj = {"tagged": tagged, "wrapper": mod.Wrapper((2, 3), torch.float16), "plain": torch.ones(2)}
        p, ref = save_load(tmp_path, obj, weights_only=False)
    with ckptfs.open(p) as ckpt:
        assert set(ckpt.unknown_globals) == {"ckptfs_test_subclasses.Tagged", "ckptfs_test_subclasses.Wrapper"}
        m = ckpt.meta("tagged")
        assert m.extra == {"subclass": "ckptfs_test_subclasses.Tagged", "python_state": {"note": "hello"}}
        assert ckpt.read("tagged") == torch_bytes(ref["tagged"].as_subclass(torch.Tensor))
        got = ckpt.tensor("tagged")  # the class is not imported: its base class, with its state
        assert type(got) is torch.Tensor and got.note == "hello" and torch.equal(got, ref["tagged"].as_subclass(torch.Tensor))
        w = ckpt.meta("wrapper")
        assert (w.tensor_kind, w.dtype, w.shape, w.nbytes, w.extra["subclass"]) == \
            ("wrapper", "float16", (2, 3), 0, "ckptfs_test_subclasses.Wrapper")
        assert ckpt.read("wrapper") == b""
        with pytest.raises(ckptfs.UnsupportedError, match="metadata only"):
            ckpt.tensor("wrapper")
        assert ref["wrapper"].shape == (2, 3) and ref["wrapper"].dtype == torch.float16


def test_device_tensors(tmp_path):
    """XLA-style tensors: data as a CPU tensor (torch >= 2.1) or a numpy array (older), moved on load."""
    cpu = torch.arange(6.0).reshape(2, 3)
    obj = {"from_cpu": Reduce(torch._utils._rebuild_device_tensor_from_cpu_tensor, cpu, torch.float32, "xla:0", False),
           "from_numpy": Reduce(torch._utils._rebuild_device_tensor_from_numpy, np.arange(4, dtype=np.int16),
                                torch.int16, "xla:1", False)}
    p, ref = save_load(tmp_path, obj, weights_only=False)
    with ckptfs.open(p) as ckpt:
        check_against(ckpt, ref)
        assert ckpt.meta("from_cpu").location == "xla:0" and ckpt.meta("from_numpy").location == "xla:1"
        assert ckpt.meta("from_numpy").tensor_kind == "numpy"
        assert torch.equal(ckpt.tensor("from_numpy"), ref["from_numpy"])


LOCATIONS = {}


def _tagger(storage):
    return LOCATIONS.get(storage.data_ptr())


def _deserializer(storage, location):
    return None


def test_device_locations_are_metadata(tmp_path):
    """Storages saved from cuda / mps / xla devices index and serve on a CPU-only machine."""
    torch.serialization.register_package(1, _tagger, _deserializer)
    tensors = {loc: torch.randn(3) + i for i, loc in enumerate(["cuda:0", "cuda:1", "mps", "xla:0", "meta:0"][:4])}
    LOCATIONS.update({t.untyped_storage().data_ptr(): loc for loc, t in tensors.items()})
    try:
        p, ref = save_load(tmp_path, tensors)
    finally:
        LOCATIONS.clear()
    assert ref["cuda:0"].device.type == "cpu"
    with ckptfs.open(p) as ckpt:
        check_against(ckpt, ref)
        for loc in tensors:
            assert ckpt.meta(loc).location == loc
        with pytest.raises(ckptfs.CkptfsError, match="map_location"):
            ckpt.tensor("cuda:0", map_location=None)


def test_numpy_data_in_the_pickle(tmp_path):
    obj = {"f4": np.arange(6, dtype=np.float32).reshape(2, 3), "big": np.arange(5, dtype=">i4"),
           "fortran": np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4)), "zero_d": np.array(2.5),
           "bool": np.array([True, False, True]), "complex": np.array([1 + 2j, 3 - 4j], dtype=np.complex64),
           "scalar": np.float32(1.5), "big_scalar": np.array([7], dtype=">i8")[0], "i64": np.int64(-3),
           "objects": np.array([1, "x", torch.ones(2)], dtype=object), "strings": np.array(["ab", "c"])}
    p, ref = save_load(tmp_path, obj, weights_only=False)
    with ckptfs.open(p) as ckpt:
        for key in ("f4", "big", "fortran", "zero_d", "bool", "complex"):
            m = ckpt.meta(key)
            assert m.tensor_kind == "numpy" and m.error is None, key
            got = ckpt.numpy(key)
            np.testing.assert_array_equal(got, ref[key])
            assert got.dtype.newbyteorder("=") == ref[key].dtype.newbyteorder("="), key  # numpy 2 unpickles
            assert ckpt.read(key) == np.ascontiguousarray(obj[key]).tobytes(), key  # as saved, in its byte order
        assert ckpt.meta("big").numpy_dtype == ">i4" and ckpt.meta("big").byteorder == "big"
        assert ckpt.meta("fortran").extra["fortran_order"] is True
        assert ckpt.value("scalar") == 1.5 and ckpt.value("big_scalar") == 7 and ckpt.value("i64") == -3
        assert ckpt.meta("objects").kind == "opaque" and ckpt.meta("objects").type == "numpy.ndarray"
        assert ckpt.value("objects.1") == "x"
        assert ckpt.numpy("objects.2").tolist() == [1.0, 1.0]  # a tensor inside an object array is reachable
        assert ckpt.meta("strings").unsupported is not None
        sd = ckptfs.load(p)
        assert isinstance(sd["big"], np.ndarray) and sd["big"].tolist() == [0, 1, 2, 3, 4]  # as torch.load gives it


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int64", "int16", "complex64",
                                   "uint8", "bool"])
def test_big_endian_files(tmp_path, dtype):
    """A file written on a big-endian machine (byteorder record "big"): bytes served as stored, numpy dtype
    '>', torch tensors byte-swapped to native like torch.load."""
    dt = getattr(torch, dtype)
    base = (torch.arange(12, dtype=torch.float64).reshape(3, 4) * 1.25 - 3)
    t = torch.complex(base, -base).to(dt) if dt.is_complex else (base > 0 if dt == torch.bool else base.to(dt))
    sd = {"w": t, "view": t.t()[1:], "q": torch.quantize_per_tensor(base.float(), 0.5, 2, torch.qint32)}
    little = tmp_path / "little.pt"
    torch.save(sd, little)
    unit = t.element_size() // (2 if dt.is_complex else 1)
    big = tmp_path / "big.pt"
    to_big_endian(little, big, {"0": unit, "1": 4})
    ref = torch.load(big, weights_only=True)
    assert torch.equal(ref["w"], t)  # torch byte-swaps to native
    with ckptfs.open(big) as ckpt:
        assert ckpt.byteorder == "big"
        for key in ("w", "view"):
            assert ckpt.read(key) == torch_bytes(ref[key], "big"), key
            assert torch.equal(ckpt.tensor(key), ref[key])
            m = ckpt.meta(key)
            assert m.byteorder == "big"
            if t.element_size() > 1 and m.numpy_dtype and not dtype == "bfloat16":
                assert m.numpy_dtype.startswith(">")
        if dtype != "bfloat16":
            np.testing.assert_array_equal(ckpt.numpy("w"), ref["w"].numpy())
        assert torch.equal(ckpt.tensor("q").int_repr(), ref["q"].int_repr())


def test_ckptfs_check_compares_saved_storages(tmp_path, capsys):
    """A storage saved as itself (torch.save(t.untyped_storage()), a TypedStorage): ckptfs serves it as a 1-D
    tensor of its elements; check compares those with the storage torch.load gives (no false mismatch)."""
    t = torch.arange(6, dtype=torch.int16)
    for name, obj, legacy in (("zip", {"u": t.untyped_storage(), "s": torch.arange(4.0).storage(), "t": t.clone()}, False),
                              ("legacy", {"s": torch.arange(4.0).half().storage(), "t": t.clone()}, True)):
        p = tmp_path / f"{name}.pt"
        torch.save(obj, p, _use_new_zipfile_serialization=not legacy)
        assert main(["check", str(p), "--no-progress"]) == EXIT_OK, name
        assert f"{len(obj)} tensors identical, 0 mismatched" in capsys.readouterr().out, name
    with ckptfs.open(tmp_path / "zip.pt") as ckpt:
        assert (ckpt.meta("u").dtype, ckpt.meta("u").shape, ckpt.read("u")) == ("uint8", (12,), torch_bytes(t))


def test_ckptfs_check_compares_every_kind(tmp_path, capsys):
    x = torch.randn(4, 6)
    obj = {"q": torch.quantize_per_tensor(x, 0.1, 3, torch.quint8),
           "qc": torch.quantize_per_channel(x, torch.rand(4, dtype=torch.float64) + 0.1, torch.zeros(4, dtype=torch.long),
                                            0, torch.qint8),
           # a quantized Embedding's weight: torch writes per_channel_affine, torch.load gives float_qparams
           "qf": torch.quantize_per_channel(x, torch.rand(4) + 0.1, torch.randn(4), 0, torch.quint8),
           "coo": x.relu().to_sparse(), "csr": x.relu().to_sparse_csr(), "meta": torch.empty(2, device="meta"),
           "nt": torch.nested.nested_tensor([torch.randn(2), torch.randn(3)]), "conj": torch.randn(2, dtype=torch.cfloat).conj()}
    p = tmp_path / "all.pt"
    torch.save(obj, p)
    assert main(["check", str(p), "--no-progress"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "0 mismatched" in out and "0 not compared" in out
    assert main(["info", str(p)]) == EXIT_OK
    assert "composite" in capsys.readouterr().out
    assert main(["ls", "--json", str(p)]) == EXIT_OK
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["key"] for r in rows} >= {"coo.indices", "coo.values", "qc.scales", "nt.buffer", "meta"}
    assert sys.byteorder == "little"
