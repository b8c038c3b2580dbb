"""Writers for checkpoint forms current torch no longer produces (or only on other machines), shared by
the format tests and scripts/make_fixtures.py. Each writes with torch's own pickling machinery where it
can, so torch.load (weights_only=False) reads the result and the tests compare against it."""

from __future__ import annotations

import io
import pickle
import struct
import sys
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

LEGACY_CLASSES = {torch.float32: "FloatTensor", torch.float64: "DoubleTensor", torch.float16: "HalfTensor",
                  torch.int64: "LongTensor", torch.int32: "IntTensor", torch.int16: "ShortTensor",
                  torch.int8: "CharTensor", torch.uint8: "ByteTensor", torch.bool: "BoolTensor"}


def _typed_storage(t: torch.Tensor) -> Any:
    return torch.storage.TypedStorage(wrap_storage=t.untyped_storage(), dtype=t.dtype, _internal=True)


class LegacyTensor:
    """Pickles as torch < 0.4 did: ``torch.FloatTensor`` called with no arguments, then BUILD
    ``(storage, offset, size, stride)`` (Tensor.__setstate__ runs ``set_``). ``variable=True`` wraps it in
    the 5-item legacy Variable state ``(data, None, None, requires_grad, None)``."""

    def __init__(self, t: torch.Tensor, cls: Any = None, variable: bool = False) -> None:
        self.t, self.cls, self.variable = t, cls, variable

    def __reduce__(self) -> Any:
        t = self.t
        if self.variable:
            return (torch.Tensor, (), (LegacyTensor(t), None, None, True, None))
        cls = self.cls or getattr(torch, LEGACY_CLASSES[t.dtype])
        return (cls, (), (_typed_storage(t), t.storage_offset(), tuple(t.size()), t.stride()))


class RebuildV1:
    """Pickles as ``torch._utils._rebuild_tensor(storage, offset, size, stride)`` (torch 0.4.0)."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t

    def __reduce__(self) -> Any:
        t = self.t
        return (torch._utils._rebuild_tensor, (_typed_storage(t), t.storage_offset(), tuple(t.size()), t.stride()))


# --- a legacy stream written by hand (forms torch.save cannot produce any more) -------------------------------


class _Storage:
    """A storage reference with explicit legacy persistent-id fields."""

    def __init__(self, stype: Any, key: str, numel: int, location: str = "cpu", view: Any = None) -> None:
        self.pid = ("storage", stype, key, location, numel, view)


class _Rebuild:
    def __init__(self, fn: Any, args: tuple) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> Any:
        return (self.fn, self.args)


class _LegacyPickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        return obj.pid if isinstance(obj, _Storage) else None


TORCH_SYS_INFO = {"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 8}}


def write_legacy_stream(path: Path, obj: Any, storages: list[tuple[str, bytes, int]], protocol: int = 2,
                        sys_info: Any = None) -> None:
    """A legacy stream: header pickles (``sys_info``: torch's unless given), ``obj`` (whose storage
    references are :func:`storage_ref`), the key list, then each ``(key, data, itemsize)`` as an 8-byte
    count and the bytes."""
    f = io.BytesIO()
    pickle.dump(0x1950A86A20F9469CFC6C, f, protocol=protocol)
    pickle.dump(1001, f, protocol=protocol)
    pickle.dump(TORCH_SYS_INFO if sys_info is None else sys_info, f, protocol=protocol)
    _LegacyPickler(f, protocol=protocol).dump(obj)
    pickle.dump([k for k, _, _ in storages], f, protocol=protocol)
    for _key, data, itemsize in storages:
        f.write(struct.pack("<q", len(data) // itemsize))
        f.write(data)
    Path(path).write_bytes(f.getvalue())


def storage_ref(stype: Any, key: str, numel: int, location: str = "cpu", view: Any = None) -> _Storage:
    return _Storage(stype, key, numel, location, view)


def rebuild_v2(storage: _Storage, offset: int, size: tuple, stride: tuple) -> _Rebuild:
    return _Rebuild(torch._utils._rebuild_tensor_v2, (storage, offset, size, stride, False, OrderedDict()))


# --- big-endian zip files -----------------------------------------------------------------------------------


def to_big_endian(src: Path, dst: Path, itemsizes: dict[str, int]) -> None:
    """Rewrite a little-endian torch zip as a big-endian machine would have written it: the ``byteorder``
    record says "big" and each storage record ``data/<key>`` is byte-swapped in units of
    ``itemsizes[key]`` (the element size; complex dtypes swap each half: pass half the itemsize).
    Records stay stored (uncompressed), in the same order, data 64-byte aligned as torch writes them."""
    zin = zipfile.ZipFile(src)
    infos = zin.infolist()
    root = infos[0].filename.split("/", 1)[0]
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as zout:
        for info in infos:
            data = zin.read(info.filename)
            rel = info.filename[len(root) + 1 :]
            if rel == "byteorder":
                data = b"big"
            elif rel.startswith("data/") and rel[5:] in itemsizes:
                unit = itemsizes[rel[5:]]
                if unit > 1:
                    import numpy as np

                    data = np.frombuffer(data, dtype=np.uint8).reshape(-1, unit)[:, ::-1].tobytes()
            zi = zipfile.ZipInfo(info.filename, date_time=(1980, 1, 1, 0, 0, 0))
            # pad the local header's extra field so the data starts on a 64-byte boundary, as torch does
            header_len = 30 + len(info.filename.encode())
            pad = (-(out.tell() + header_len + 4)) % 64
            zi.extra = struct.pack("<HH", 0x4246, pad) + b"Z" * pad
            zout.writestr(zi, data)
    Path(dst).write_bytes(out.getvalue())


class Reduce:
    """Pickles as ``fn(*args)``: for rebuild calls torch only writes on other machines (XLA tensors)."""

    def __init__(self, fn: Any, *args: Any) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> Any:
        return (self.fn, self.args)


class throwaway_module:
    """``with throwaway_module("name", source) as mod:`` a real importable module written to a temporary
    directory (so pickle can name its classes), removed from disk, sys.path and sys.modules on exit: a
    later unpickler that tried to import it would fail."""

    def __init__(self, name: str, source: str, directory: Path) -> None:
        self.name, self.source, self.dir = name, source, Path(directory)

    def __enter__(self) -> Any:
        import importlib

        self.path = self.dir / f"{self.name}.py"
        self.path.write_text(self.source)
        sys.path.insert(0, str(self.dir))
        importlib.invalidate_caches()
        return importlib.import_module(self.name)

    def __exit__(self, *exc: Any) -> None:
        import shutil

        sys.path.remove(str(self.dir))
        sys.modules.pop(self.name, None)
        self.path.unlink()
        shutil.rmtree(self.dir / "__pycache__", ignore_errors=True)
