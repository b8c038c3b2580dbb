"""safetensors files: every tensor as safetensors' own loader gives it, served from the file with no copy, and
headers validated exactly as the safetensors library validates them (it is the oracle for what is refused)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import run_ckptfs, torch_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file

import ckptfs
from ckptfs.errors import FormatError

# every dtype safetensors.torch writes (float4 as packed pairs, as torch holds them)
DTYPES = ["float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "uint16",
          "uint32", "uint64", "bool", "complex64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
          "float8_e5m2fnuz", "float8_e8m0fnu"]


def _tensor(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(shape, generator=g) * 8
    dt = getattr(torch, name)
    if dt == torch.bool:
        return base > 0
    if dt.is_complex:
        return torch.complex(base, -base).to(dt)
    if not dt.is_floating_point:
        return base.abs().to(torch.int64).to(dt)
    if name == "float8_e8m0fnu":
        return base.abs().clamp(min=0.01).to(dt)
    return base.to(dt)


@pytest.fixture(scope="module")
def every_dtype(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tensors = {f"t.{name}": _tensor(name, (3, 5), i) for i, name in enumerate(DTYPES)}
    tensors["shapes.scalar"] = torch.tensor(4.5)
    tensors["shapes.empty"] = torch.zeros(0, 4)
    tensors["shapes.cube"] = torch.arange(24, dtype=torch.int16).reshape(2, 3, 4)
    tensors["packed.float4"] = torch.arange(12, dtype=torch.uint8).reshape(3, 4).view(torch.float4_e2m1fn_x2)
    path = tmp_path_factory.mktemp("st") / "every.safetensors"
    save_file(tensors, path, metadata={"format": "pt", "note": "ünï", "empty": ""})
    return path


def test_every_tensor_as_safe_open_gives_it(every_dtype: Path) -> None:
    with safe_open(every_dtype, framework="pt") as f, ckptfs.open(every_dtype) as ckpt:
        assert ckpt.format == "safetensors"
        assert sorted(ckpt.keys()) == sorted(f.keys())
        assert ckpt.metadata() == f.metadata()
        for key in f.keys():
            want = f.get_tensor(key)
            m = ckpt.meta(key)
            assert (m.dtype, m.shape) == (str(want.dtype).removeprefix("torch."), tuple(want.shape)), key
            assert ckpt.read(key) == torch_bytes(want), key
            got = ckpt.tensor(key)
            assert got.dtype == want.dtype and torch_bytes(got) == torch_bytes(want), key



def test_empty_tensors_have_torchs_strides(tmp_path: Path) -> None:
    """Strides of tensors with a size-0 dimension are torch's (a size-0 dimension counts as 1), as
    safetensors.torch gives them."""
    p = tmp_path / "e.safetensors"
    save_file({"inner": torch.zeros(3, 0, 2), "last": torch.zeros(2, 3, 0), "first": torch.zeros(0, 4)}, p)
    with safe_open(p, framework="pt") as f, ckptfs.open(p) as ckpt:
        for key in f.keys():
            assert ckpt.meta(key).stride == f.get_tensor(key).stride() == ckpt.tensor(key).stride(), key


def _header(path: Path) -> tuple[int, dict]:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return n, json.loads(raw[8 : 8 + n])


def test_tensors_are_ranges_of_the_file_mapped_without_a_copy(every_dtype: Path) -> None:
    """numpy() is a view of the file's page cache at the very offset the header gives."""
    n, header = _header(every_dtype)
    with ckptfs.open(every_dtype) as ckpt:
        for key in ("t.float32", "t.bfloat16", "shapes.cube"):
            begin, end = header[key]["data_offsets"]
            mapped = ckpt.mapped(ckpt.reader(key))
            assert mapped is not None and mapped[1] == 8 + n + begin, key
            arr = ckpt.numpy(key)
            assert not arr.flags.writeable and not arr.flags.owndata
            assert ckpt.meta(key).extra["safetensors"]["data_offsets"] == [begin, end]


def test_load_gives_safetensors_state_dict(every_dtype: Path) -> None:
    from safetensors.torch import load_file

    want = load_file(every_dtype)
    got = ckptfs.load(every_dtype)
    assert sorted(got) == sorted(want)
    for k, t in want.items():
        assert got[k].dtype == t.dtype and got[k].shape == t.shape and torch_bytes(got[k]) == torch_bytes(t), k


def test_cli_ls_info_check_accept_a_safetensors_file(every_dtype: Path) -> None:
    r = run_ckptfs("info", str(every_dtype))
    assert r.returncode == 0 and "format      safetensors" in r.stdout and "note = ünï" in r.stdout, r.stderr
    r = run_ckptfs("ls", str(every_dtype), "t.*")
    assert r.returncode == 0 and "t.bfloat16" in r.stdout and "shapes.cube" not in r.stdout
    r = run_ckptfs("check", str(every_dtype))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{len(DTYPES) + 4} tensors identical, 0 mismatched" in r.stdout


# --- validation: the library is the oracle --------------------------------------------------------------------


def st_bytes(header: object = None, data: bytes = b"", raw: bytes | None = None, n: int | None = None) -> bytes:
    h = raw if raw is not None else json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h) if n is None else n) + h + data


def library_accepts(path: Path) -> bool:
    try:
        with safe_open(path, framework="pt") as f:
            f.keys()
        return True
    except Exception:  # noqa: BLE001 - any refusal
        return False


F32_2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
HOSTILE = {
    "header-over-100MB": (struct.pack("<Q", 100_000_001) + b"{" + bytes(64), "over the format's limit"),
    "header-past-eof": (st_bytes(raw=b'{"a":1}', n=4096), "runs past the end of the file"),
    "not-utf8": (st_bytes(raw=b'{"\xff":1}'), "not UTF-8"),
    "not-json": (st_bytes(raw=b'{"a": [}'), "not valid JSON"),
    "entry-not-an-object": (st_bytes(raw=b'{"a": 1}'), "entry is not an object"),
    "unknown-dtype": (st_bytes({"a": {**F32_2, "dtype": "F128"}}, bytes(8)), "unknown dtype"),
    "float-shape": (st_bytes({"a": {**F32_2, "shape": [2.0]}}, bytes(8)), "not a list of non-negative"),
    "negative-shape": (st_bytes({"a": {**F32_2, "shape": [-2]}}, bytes(8)), "not a list of non-negative"),
    "bool-shape": (st_bytes({"a": {**F32_2, "shape": [True, 2]}}, bytes(8)), "not a list of non-negative"),
    "offsets-not-a-pair": (st_bytes({"a": {**F32_2, "data_offsets": [0, 8, 8]}}, bytes(8)), "not a pair"),
    "missing-field": (st_bytes({"a": {"dtype": "F32", "shape": [2]}}, bytes(8)), "has no 'data_offsets'"),
    "gap-before-first": (st_bytes({"a": {**F32_2, "data_offsets": [4, 12]}}, bytes(12)), "leaves a gap"),
    "overlap": (st_bytes({"a": F32_2, "b": {**F32_2, "data_offsets": [4, 12]}}, bytes(12)), "overlaps"),
    "gap-between": (st_bytes({"a": F32_2, "b": {**F32_2, "data_offsets": [12, 20]}}, bytes(20)), "leaves a gap"),
    "size-not-numel": (st_bytes({"a": {**F32_2, "shape": [3]}}, bytes(8)), "needs 12"),
    "end-before-begin": (st_bytes({"a": {**F32_2, "data_offsets": [8, 0]}}, bytes(8)), "ends before it begins"),
    "bytes-appended": (st_bytes({"a": F32_2}, bytes(9)), "bytes appended"),
    "truncated": (st_bytes({"a": F32_2}, bytes(7)), "truncated"),
    "sub-byte-count": (st_bytes({"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}, bytes(2)),
                       "not a whole number of bytes"),
    "shape-overflows": (st_bytes({"a": {**F32_2, "shape": [2**40, 2**40]}}, bytes(8)), "overflows"),
    "metadata-not-strings": (st_bytes({"a": F32_2, "__metadata__": {"x": 1}}, bytes(8)), "not an object of strings"),
    "field-twice": (st_bytes(raw=b'{"a":{"dtype":"F32","dtype":"I32","shape":[2],"data_offsets":[0,8]}}',
                             data=bytes(8)), "'dtype' appears twice"),
    "nan-in-an-ignored-field": (st_bytes(raw=b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":NaN}}',
                                         data=bytes(8)), "NaN is not JSON"),
    "infinity-in-an-ignored-field": (st_bytes(raw=b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],'
                                              b'"x":-Infinity}}', data=bytes(8)), "-Infinity is not JSON"),
    "number-out-of-range": (st_bytes(raw=b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1e999}}',
                                     data=bytes(8)), "number out of range"),
    "lone-surrogate-name": (st_bytes(raw=b'{"\\udc80":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
                                     data=bytes(8)), "lone surrogate"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_refused_as_the_library_refuses(tmp_path: Path, case: str) -> None:
    """Each malformed header is one FormatError naming the file (and the entry), and safetensors itself
    refuses the same file."""
    data, said = HOSTILE[case]
    path = tmp_path / "x.safetensors"
    path.write_bytes(data)
    assert not library_accepts(path), f"safetensors accepts {case}: the case is not hostile"
    with pytest.raises(FormatError) as e:
        ckptfs.open(path)
    assert said in str(e.value) and str(path) in str(e.value)


def test_a_name_given_twice_is_refused_where_the_library_keeps_the_last(tmp_path: Path) -> None:
    """The one rule stricter than the library's (docs/formats.md): readers disagree on duplicate names."""
    path = tmp_path / "dup.safetensors"
    path.write_bytes(st_bytes(raw=b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                              b'"a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}}', data=bytes(8)))
    assert library_accepts(path)
    with pytest.raises(FormatError, match="'a' appears twice"):
        ckptfs.open(path)


@pytest.mark.parametrize("header, data", [
    ({}, b""),  # no tensors at all
    ({"__metadata__": {"k": "v"}}, b""),
    ({"a": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]},  # two empty tensors at the same offset
      "b": {"dtype": "I8", "shape": [0, 3], "data_offsets": [0, 0]}}, b""),
    ({"a": {**F32_2, "extra": [1]}, "__metadata__": None}, bytes(8)),  # unknown fields ignored, null metadata
    ({"b": {"dtype": "I8", "shape": [3], "data_offsets": [8, 11]}, "a": F32_2}, bytes(11)),  # not in offset order
], ids=["empty", "metadata-only", "empty-tensors", "extra-fields", "unordered"])
def test_accepted_as_the_library_accepts(tmp_path: Path, header: dict, data: bytes) -> None:
    path = tmp_path / "ok.safetensors"
    path.write_bytes(st_bytes(header, data))
    assert library_accepts(path)
    with safe_open(path, framework="pt") as f, ckptfs.open(path) as ckpt:
        assert sorted(ckpt.tensor_keys()) == sorted(f.keys())
        assert ckpt.metadata() == f.metadata()
        for k in f.keys():
            assert ckpt.read(k) == torch_bytes(f.get_tensor(k))


_ST = {"F32": (torch.float32, 4), "I8": (torch.int8, 1), "BF16": (torch.bfloat16, 2), "U16": (torch.uint16, 2),
       "F64": (torch.float64, 8), "BOOL": (torch.bool, 1)}


@st.composite
def mutated_files(draw: st.DrawFn) -> tuple[bytes, str]:
    """A valid file of a few tensors with one header field nudged (or the data length changed)."""
    n = draw(st.integers(1, 4))
    header: dict[str, dict] = {}
    pos = 0
    for i in range(n):
        dt = draw(st.sampled_from(sorted(_ST)))
        shape = draw(st.lists(st.integers(0, 4), max_size=3))
        size = int(np.prod(shape, dtype=np.int64)) * _ST[dt][1]
        header[f"t{i}"] = {"dtype": dt, "shape": shape, "data_offsets": [pos, pos + size]}
        pos += size
    data = bytes(range(256)) * (pos // 256 + 1)
    data = data[:pos]
    what = draw(st.sampled_from(["none", "begin", "end", "shape", "dtype", "length", "drop"]))
    name = f"t{draw(st.integers(0, n - 1))}"
    delta = draw(st.sampled_from([-2, -1, 1, 2, 8]))
    entry = header[name]
    if what == "begin":
        entry["data_offsets"][0] = max(0, entry["data_offsets"][0] + delta)
    elif what == "end":
        entry["data_offsets"][1] = max(0, entry["data_offsets"][1] + delta)
    elif what == "shape":
        entry["shape"] = entry["shape"] + [2] if delta > 0 else entry["shape"][:-1]
    elif what == "dtype":
        entry["dtype"] = draw(st.sampled_from(sorted(_ST)))
    elif what == "length":
        data = data + bytes(delta) if delta > 0 else data[:delta]
    elif what == "drop":
        del header[name]
    return st_bytes(header, data), what


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=mutated_files())
def test_ckptfs_accepts_exactly_what_the_library_accepts(tmp_path: Path, case: tuple[bytes, str]) -> None:
    """Differential: for files a nudge away from valid, ckptfs opens exactly those safetensors opens, and then
    serves the bytes safetensors gives."""
    data, _what = case
    path = tmp_path / "m.safetensors"
    path.write_bytes(data)
    lib = library_accepts(path)
    try:
        ckpt = ckptfs.open(path)
    except FormatError:
        assert not lib, "ckptfs refuses a file safetensors opens"
        return
    assert lib, "ckptfs opens a file safetensors refuses"
    with ckpt, safe_open(path, framework="pt") as f:
        for k in f.keys():
            assert ckpt.read(k) == torch_bytes(f.get_tensor(k)), k


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 4), max_size=5))
def test_contiguous_strides_are_torch_empty_strides(shape):
    # safetensors and DCP tensors get these strides (safetensors.torch and dcp_to_torch_save make torch.empty ones)
    from ckptfs.pickle.nodes import contiguous_strides
    assert contiguous_strides(tuple(shape)) == torch.empty(shape).stride()


def test_size0_dimension_strides_match_safe_open(tmp_path):
    path = tmp_path / "z.safetensors"
    save_file({"inner": torch.zeros(3, 0, 2), "last": torch.zeros(2, 3, 0), "first": torch.zeros(0, 4)}, path)
    with safe_open(path, "pt") as f, ckptfs.open(path) as ckpt:
        for key in f.keys():
            assert ckpt.meta(key).stride == f.get_tensor(key).stride(), key
