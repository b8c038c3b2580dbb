"""``Converter.v2`` (the inlined fast path for ``_rebuild_tensor_v2``) agrees with the general path on every
fixture and on arbitrary arguments."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptfs.model.convert import Converter
from ckptfs.model.index import V2_CALL
from ckptfs.pickle.nodes import Call, PersistentId, StorageType, TensorNode
from ckptfs.pickle.unpickler import SafeUnpickler
from ckptfs.dtypes import DTYPES

DATA = Path(__file__).parent / "data"
V2_NAME = "torch._utils._rebuild_tensor_v2"


def _fields(t: object) -> object:
    if not isinstance(t, TensorNode):
        return ("not a tensor", type(t).__name__)
    ref = t.storage
    storage = None if ref is None else (ref.key, ref.dtype, ref.numel, ref.location, ref.typename, ref.error)
    return (t.kind, t.dtype, t.shape, t.stride, t.storage_offset, t.requires_grad, t.metadata, t.extra, t.error,
            t.unsupported, t.parts, storage)


def _agree(call: Call) -> None:
    fast = Converter().v2(call)
    general = Converter()
    slow = general.handlers[V2_NAME](call.args, V2_NAME)
    assert _fields(fast) == _fields(slow), call.args


def _v2_calls(obj: object) -> list[Call]:
    out, stack, seen = [], [obj], set()
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if type(x) is V2_CALL:
            out.append(x)
        if isinstance(x, Call):
            stack.extend(x.args)
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
        elif hasattr(x, "state"):  # opaque objects, ordered dicts: what they carry
            stack.append(getattr(x, "state"))
            for attr in ("args", "items", "list_items"):
                v = getattr(x, attr, None)
                if v is not None:
                    stack.append(list(v.values()) if isinstance(v, dict) else v)
    return out


def _pickles_of_fixtures(tmp: Path) -> list[tuple[str, bytes]]:
    w = torch.randn(6, 4)
    generated = {
        "views.pt": {"w": w, "wt": w.t(), "slice": w[1:3, ::2], "expand": torch.ones(3, 1).expand(3, 5),
                     "scalar": torch.tensor(2.5), "empty": torch.empty(0, 3), "param": torch.nn.Parameter(w),
                     "conj": torch.randn(3, dtype=torch.complex64).conj(), "neg": torch.randn(3)._neg_view(),
                     "channels_last": torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)},
        "dtypes.pt": {str(dt): torch.zeros(3, dtype=dt) for dt in (torch.float16, torch.bfloat16, torch.int8,
                                                                   torch.bool, torch.complex128, torch.uint16)},
    }
    out = []
    for name, obj in generated.items():
        buf = io.BytesIO()
        torch.save(obj, buf)
        with zipfile.ZipFile(buf) as z:
            out.append((name, z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))))
    for path in sorted(DATA.glob("*/*.pt")):
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                for n in z.namelist():
                    if n.endswith(".pkl") and "/code/" not in n:
                        out.append((f"{path.parent.name}/{path.name}:{n}", z.read(n)))
    return out


def test_fast_path_agrees_on_every_fixture(tmp_path):
    pickles = _pickles_of_fixtures(tmp_path)
    assert len(pickles) >= 8
    total = 0
    for name, data in pickles:
        obj = SafeUnpickler(data).load()
        calls = _v2_calls(obj)
        for call in calls:
            _agree(call)
        total += len(calls)
    assert total >= 40  # the fixtures really exercise it


STYPE = StorageType("torch.FloatStorage", DTYPES["float32"])
ints = st.integers(-3, 10)
shapes = st.one_of(st.lists(ints, max_size=4).map(tuple), st.lists(ints, max_size=4), st.just(None),
                   st.tuples(st.just(1.5)), st.just((1 << 70,)))
pids = st.one_of(
    st.tuples(st.just("storage"), st.just(STYPE), st.sampled_from(["0", "1", 3]), st.just("cpu"),
              st.integers(-1, 100)).map(lambda t: PersistentId(t)),
    st.just("not a storage"), st.just(None),
)
metadata = st.one_of(st.none(), st.just({}), st.just({"conj": True}), st.just({1: 2}), st.just([1]))


@settings(max_examples=400, deadline=None)
@given(pid=pids, offset=st.one_of(ints, st.just("0"), st.just(2.0)), size=shapes, stride=shapes,
       rg=st.sampled_from([True, False, 1, None]), n_args=st.sampled_from([4, 5, 6, 7, 8]), meta=metadata)
def test_fast_path_agrees_on_arbitrary_arguments(pid, offset, size, stride, rg, n_args, meta):
    args = (pid, offset, size, stride, rg, {}, meta, "extra")[:n_args]
    _agree(V2_CALL(*args))


def test_a_storage_with_a_negative_element_count_is_the_tensors_error_on_both_paths():
    """Found by the test above: the general path left the storage's error off the tensor."""
    pid = PersistentId(("storage", STYPE, "0", "cpu", -1))
    _agree(V2_CALL(pid, 0, (), (), True, {}))
    t = Converter().v2(V2_CALL(pid, 0, (), (), True, {}))
    assert t.error == "storage '0' declares -1 elements"


@pytest.mark.parametrize("args", [(), ("x",), tuple(range(9))])
def test_fast_path_agrees_on_wrong_arity(args):
    _agree(V2_CALL(*args))
