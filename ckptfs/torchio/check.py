"""Comparing what ckptfs serves with what torch loads (``ckptfs check``): results, never printing.

torch.load runs with ``weights_only=True`` (and ``mmap=True`` for zip files, so memory stays low)
unless ``trust`` is given; a file torch refuses is reported, not loaded unsafely.
"""

from __future__ import annotations

import io
import os
import sys
from dataclasses import dataclass
from typing import Any, Iterator

from ..dtypes import numpy_dtype
from ..errors import CkptfsError, FormatError, TensorError, UnsupportedError
from ..model.catalog import Catalog
from ..model.index import COMPOSITE, TENSOR, Group
from ..model.meta import Meta
from ..source.fileobj import SourceFile
from ..source.urls import is_url


def _lookup(obj: Any, path: tuple[object, ...]) -> Any:
    """Follow a ckptfs path (original keys) through what torch.load returned."""
    import torch

    from .tensors import part_of

    for part in path:
        if isinstance(obj, torch.Tensor) and isinstance(part, str):  # a part of a sparse / nested / quantized tensor
            obj = part_of(obj, part)
        elif isinstance(obj, dict):
            obj = obj[part]
        elif isinstance(obj, (list, tuple)) and type(part) is int:
            obj = obj[part]
        elif isinstance(part, str) and hasattr(obj, "__dict__") and part in vars(obj):
            obj = vars(obj)[part]
        elif isinstance(part, str) and isinstance(obj, torch.jit.ScriptModule):  # TorchScript attributes
            obj = getattr(obj, part)
        elif hasattr(obj, "__getitem__"):
            obj = obj[part]
        else:
            raise KeyError(part)
    return obj


def _torch_bytes(t: Any, byteorder: str) -> bytes:
    """The tensor's C-contiguous bytes as stored in a file of ``byteorder`` (torch holds native order)."""
    import torch

    t = t.detach()
    if t.is_conj():
        t = t.conj()  # clears the bit: a view of the data as stored (un-conjugated)
    if t.is_neg():
        t = t._neg_view()  # likewise for the negative bit
    t = t.contiguous().cpu()
    if t.numel() == 0:
        return b""
    raw = t.reshape(-1).view(torch.uint8).numpy()
    if byteorder != sys.byteorder and t.element_size() > 1:
        unit = t.element_size() // (2 if t.is_complex() else 1)
        raw = raw.reshape(-1, unit)[:, ::-1].reshape(-1)
    return raw.tobytes()


@dataclass(frozen=True)
class Outcome:
    """One tensor compared: ``status`` is "ok", "fail" (``problem`` says why) or "skip" (a kind ckptfs
    does not serve: ``problem`` says which)."""

    key: str
    status: str
    problem: str = ""
    dtype: str | None = None
    shape: tuple[int, ...] = ()


class _Lazy:
    """A tensor of a safetensors file, read with ``safe_open`` when it is compared."""

    __slots__ = ("handle", "key")

    def __init__(self, handle: Any, key: str) -> None:
        self.handle, self.key = handle, key

    def load(self) -> Any:
        return self.handle.get_tensor(self.key)


class Reference(dict[Any, Any]):
    """What the writers' own loaders give for several files, as one dict (safetensors tensors loaded only
    when looked up)."""

    def __getitem__(self, key: Any) -> Any:
        v = dict.__getitem__(self, key)
        return v.load() if isinstance(v, _Lazy) else v


def _safetensors_reference(path: str) -> Reference:
    from safetensors import safe_open

    handle = safe_open(path, framework="pt")
    return Reference((k, _Lazy(handle, k)) for k in handle.keys())


def _dcp_reference(directory: str) -> Any:
    """torch's own conversion of a DCP checkpoint (``dcp_to_torch_save``: every tensor in memory), loaded
    back with mmap from a temporary file that is gone once loaded."""
    import tempfile

    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory(prefix="ckptfs-check-") as tmp:
        out = os.path.join(tmp, "dcp.pt")
        dcp_to_torch_save(directory, out)
        return torch.load(out, map_location="cpu", weights_only=False, mmap=True)


def _member_reference(container: Any, trust: bool) -> Any:
    """The writer's loader's result for one file of a directory. A remote file (a directory URL's member, no
    local file behind its source) is read by the loader through the same source, by range: torch.load from
    a file object (no mmap), safetensors' own parser over the object's bytes."""
    import torch

    kind = container.kind
    if kind == "dcp":
        if is_url(container.name):
            raise CkptfsError("torch's dcp_to_torch_save reads only local directories: copy the checkpoint here "
                              "to check it", file=container.name)
        if not trust:  # FileSystemReader: pickle.load(.metadata), torch.load(weights_only=False) of byte items
            raise CkptfsError("a DCP checkpoint: torch reads its .metadata with pickle.load and its values with "
                              "torch.load(weights_only=False), which run code the files name; re-run with --trust "
                              "if you trust the files", file=container.name)
        return _dcp_reference(container.name)
    source = container.source
    local = source.region() is not None
    target: Any = source.name if local else io.BufferedReader(SourceFile(source), 1 << 20)
    if kind == "safetensors":
        if local:
            return _safetensors_reference(source.name)
        from safetensors.torch import load

        return load(target.read())
    if kind == "torchscript":
        if not trust:
            raise CkptfsError("a TorchScript archive: torch compares only by running it with torch.jit.load "
                              "(CVE-2025-32434); re-run with --trust if you trust the file", file=source.name)
        return torch.jit.load(target, map_location="cpu")
    return torch.load(target, map_location="cpu", weights_only=not trust, mmap=kind == "zip" and local)


def _group_reference(catalog: Catalog, group: Group, trust: bool) -> Any:
    """The writers' loaders' results laid out as the catalog lays its members out."""
    out = Reference()
    for m in group.flat:
        ref = _member_reference(catalog.members[m].container, trust)
        if isinstance(ref, dict):
            for k in dict.keys(ref):
                dict.__setitem__(out, k, dict.__getitem__(ref, k))
        else:
            dict.__setitem__(out, catalog.members[m].name, ref)
    for name, what in group.named:
        sub = _group_reference(catalog, what, trust) if isinstance(what, Group) else \
            _member_reference(catalog.members[what].container, trust)
        dict.__setitem__(out, name, sub)
    return out


def _cause(e: BaseException) -> BaseException:
    """DCP's CheckpointException carries each rank's exception with its traceback in its text: the first
    rank's exception is the reason to show."""
    try:
        from torch.distributed.checkpoint.api import CheckpointException
    except ImportError:  # a torch built without distributed
        return e
    if isinstance(e, CheckpointException) and e.failures:
        return next(iter(e.failures.values()))[0]
    return e


def load_reference(catalog: Catalog, path: str, trust: bool) -> Any:
    """What the writer's own loader gives: ``torch.load(weights_only=not trust)`` (``mmap`` for zip files),
    ``torch.jit.load`` for a TorchScript archive (only with ``trust``: it runs the archive's code),
    ``safetensors.safe_open`` for safetensors files, ``dcp_to_torch_save`` for a DCP checkpoint; for a
    directory, each member's laid out as the catalog lays them out (shards merged)."""
    import torch

    kind = catalog.members[0].container.kind
    remote = is_url(path)
    # a remote checkpoint: torch reads it through the same source (its reads go by range, like ckptfs's)
    target: Any = io.BufferedReader(SourceFile(catalog.members[0].source), 1 << 20) if remote else path
    try:
        if catalog.group is not None:
            return _group_reference(catalog, catalog.group, trust)
        if kind in ("safetensors", "dcp"):
            return _member_reference(catalog.members[0].container, trust)
        kwargs: dict[str, Any] = {"map_location": "cpu", "weights_only": not trust}
        if kind == "zip" and not remote:
            kwargs["mmap"] = True
        if kind == "torchscript":
            if not trust:  # torch.load would hand it to torch.jit.load, which runs its code
                raise CkptfsError("a TorchScript archive: torch compares only by running it with torch.jit.load "
                                  "(CVE-2025-32434); re-run with --trust if you trust the file", file=catalog.name)
            return torch.jit.load(target, map_location="cpu")
        return torch.load(target, **kwargs)
    except (CkptfsError, KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - torch's refusal is the result here (DCP's CheckpointException
        # derives from BaseException)
        e = _cause(e)
        msg = " ".join(str(e).split())[:300]
        hint = "" if trust else " (re-run with --trust to let torch run the pickle, if you trust the file)"
        raise CkptfsError(f"torch.load failed: {type(e).__name__}: {msg}{hint}", file=catalog.name) from None


def compare(catalog: Catalog, reference: Any) -> Iterator[Outcome]:
    """Every tensor of ``catalog`` compared with ``reference`` (what torch loaded), in checkpoint order;
    then one "fail" outcome per tensor torch has and ckptfs lacks."""
    index = catalog.index
    rows = [i for i in index.order() if index.kinds[i] in (TENSOR, COMPOSITE)]
    for i in rows:
        key = index.keys[i]
        meta = catalog.meta(i)
        problem: str | None
        try:
            expected = _lookup(reference, index.path(i))
        except (KeyError, IndexError, TypeError):
            problem = "not found in torch.load's result"
        else:
            try:
                problem = (_compare_composite(catalog, i, meta, expected) if index.kinds[i] == COMPOSITE
                           else _compare(catalog, i, meta, expected))
            except (TensorError, UnsupportedError, FormatError) as e:  # found when its bytes are read (a DCP
                # item's tensor): that tensor's outcome, the others are still compared
                problem = f"ckptfs refuses it: {e.reason}"
        shape = tuple(meta.shape or ())
        if problem == "skip":
            yield Outcome(key, "skip", str(meta.unsupported), meta.dtype, shape)
        elif problem:
            yield Outcome(key, "fail", problem, meta.dtype, shape)
        else:
            yield Outcome(key, "ok", "", meta.dtype, shape)
    for path in _torch_only_tensors(reference, catalog):
        yield Outcome(".".join(map(str, path)), "fail", "a tensor torch.load returns that ckptfs lacks")


def count_compared(catalog: Catalog) -> int:
    """How many outcomes :func:`compare` yields before the torch-only ones (for progress)."""
    kinds = catalog.index.kinds
    return sum(1 for k in kinds if k in (TENSOR, COMPOSITE))


def _loaded_qscheme(catalog: Catalog, row: int, saved: Any) -> Any:
    """The qscheme torch.load gives a per-channel quantized tensor: torch writes ``per_channel_affine`` for
    float-qparams tensors too (quantized Embedding weights), and its loader makes them
    ``per_channel_affine_float_qparams`` from their float zero points."""
    index = catalog.index
    if saved == "per_channel_affine":
        for c in index.children(row):
            if index.names[c] == "zero_points" and catalog.meta(c).dtype in ("float16", "float32", "float64",
                                                                           "bfloat16"):
                return "per_channel_affine_float_qparams"
    return saved


def _compare_composite(catalog: Catalog, row: int, meta: Meta, expected: Any) -> str | None:
    """A sparse / nested / per-channel quantized tensor: its kind and layout (its parts are compared as
    tensors of their own)."""
    import torch

    assert meta.shape is not None  # the meta of a tensor row
    if not isinstance(expected, torch.Tensor):
        return f"torch.load gives a {type(expected).__name__} here, not a tensor"
    if meta.error:
        return f"ckptfs refuses it: {meta.error}"
    extra = meta.extra
    if meta.tensor_kind == "sparse":
        if str(expected.layout) != f"torch.{extra.get('layout')}":
            return f"layout {extra.get('layout')} != torch's {expected.layout}"
    elif meta.tensor_kind == "nested":
        if not expected.is_nested or expected.size(0) != meta.shape[0]:
            return "torch's tensor is not a nested tensor of as many tensors"
        return None if str(expected.dtype) == f"torch.{meta.dtype}" else f"dtype {meta.dtype} != torch's {expected.dtype}"
    elif meta.tensor_kind == "quantized":
        qscheme = _loaded_qscheme(catalog, row, extra.get("qscheme"))
        if not expected.is_quantized or str(expected.qscheme()) != f"torch.{qscheme}":
            return f"qscheme {qscheme} != torch's {expected.qscheme() if expected.is_quantized else None}"
        if expected.q_per_channel_axis() != extra.get("axis"):
            return f"axis {extra.get('axis')} != torch's {expected.q_per_channel_axis()}"
    if str(expected.dtype) != f"torch.{meta.dtype}" or tuple(expected.shape) != tuple(meta.shape):
        return f"{meta.dtype} {list(meta.shape)} != torch's {expected.dtype} {list(expected.shape)}"
    return None


def _compare(catalog: Catalog, row: int, meta: Meta, expected: Any) -> str | None:
    import numpy as np
    import torch

    assert meta.shape is not None  # the meta of a tensor row

    def read() -> bytes:
        return catalog.data(row).read()

    if isinstance(expected, np.ndarray) and meta.tensor_kind == "numpy":
        if meta.error or meta.unsupported:
            return "skip" if meta.unsupported else f"ckptfs refuses it: {meta.error}"
        if tuple(expected.shape) != tuple(meta.shape):
            return f"shape {list(meta.shape)} != numpy's {list(expected.shape)}"
        t = catalog.data(row).t
        dt = numpy_dtype(t.dtype, catalog.byteorder_of(t, row))
        stored = np.ascontiguousarray(expected, dtype=dt)  # numpy may unpickle to native order
        return None if read() == stored.tobytes() else "bytes differ from numpy's"
    if isinstance(expected, (torch.TypedStorage, torch.UntypedStorage)):  # a storage saved as itself: ckptfs
        # serves it as a 1-D tensor of its elements (uint8 for an untyped one)
        untyped = expected if isinstance(expected, torch.UntypedStorage) else expected._untyped_storage
        sdt = torch.uint8 if isinstance(expected, torch.UntypedStorage) else expected.dtype
        expected = torch.empty(0, dtype=sdt).set_(untyped, 0, (untyped.nbytes() // sdt.itemsize,))  # type: ignore[call-overload]
    if not isinstance(expected, torch.Tensor):
        return f"torch.load gives a {type(expected).__name__} here, not a tensor"
    if meta.unsupported:
        return "skip"
    if meta.error:
        return f"ckptfs refuses it: {meta.error}"
    if meta.tensor_kind in ("meta", "wrapper"):  # no data: the metadata is all there is
        if str(expected.dtype) != f"torch.{meta.dtype}" or tuple(expected.shape) != tuple(meta.shape):
            return f"{meta.dtype} {list(meta.shape)} != torch's {expected.dtype} {list(expected.shape)}"
        if meta.tensor_kind == "meta" and not expected.is_meta:
            return "torch's tensor is not on the meta device"
        return None if read() == b"" else "a tensor without data read as bytes"
    if meta.tensor_kind == "quantized":
        extra = meta.extra
        if not expected.is_quantized or (expected.q_scale(), expected.q_zero_point()) != \
                (extra.get("scale"), extra.get("zero_point")):
            return f"scale / zero point {extra.get('scale')} / {extra.get('zero_point')} differ from torch's"
    if str(expected.dtype).removeprefix("torch.") != meta.dtype:
        return f"dtype {meta.dtype} != torch's {expected.dtype}"
    if tuple(expected.shape) != tuple(meta.shape):
        return f"shape {list(meta.shape)} != torch's {list(expected.shape)}"
    if expected.requires_grad != bool(meta.requires_grad):
        return f"requires_grad {meta.requires_grad} != torch's {expected.requires_grad}"
    if isinstance(expected, torch.nn.Parameter) != bool(meta.is_parameter):
        return "Parameter-ness differs from torch's"
    if expected.is_quantized:
        expected = expected.int_repr()
    try:
        want = _torch_bytes(expected, meta.byteorder or "little")
    except Exception as e:  # noqa: BLE001
        return f"cannot read torch's bytes ({type(e).__name__}: {e})"
    got = read()
    if got != want:
        first = next((j for j, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
        return f"bytes differ (first at byte {first}; {len(got)} vs {len(want)} bytes)"
    return None


def _torch_only_tensors(ref: Any, catalog: Catalog) -> list[tuple[object, ...]]:
    """Paths of tensors in torch.load's plain containers that ckptfs's index does not have."""
    import torch

    missing: list[tuple[object, ...]] = []
    stack: list[tuple[Any, tuple[object, ...]]] = [(ref, ())]
    seen: set[int] = set()
    while stack and len(missing) < 100:
        obj, path = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, (torch.Tensor, _Lazy)):
            if catalog.index.find_path(path) is None:
                missing.append(path)
        elif isinstance(obj, dict):
            stack.extend((v, path + (k,)) for k, v in dict.items(obj))
        elif isinstance(obj, (list, tuple)):
            stack.extend((v, path + (i,)) for i, v in enumerate(obj))
    return missing
