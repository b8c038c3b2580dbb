"""``ckptfs check``: load the checkpoint with torch and compare every tensor with what ckptfs serves.

torch.load runs with ``weights_only=True`` (and ``mmap=True`` for zip files, so memory stays low)
unless ``--trust`` is given; a file torch refuses is reported, not loaded unsafely.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from ..errors import CkptfsError, oneline
from ..model.index import COMPOSITE, TENSOR

GREEN, RED, YELLOW, RESET = "\033[32m", "\033[31m", "\033[33m", "\033[0m"


def _lookup(obj: Any, path: tuple) -> Any:
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


def run_check(args: argparse.Namespace) -> int:
    import torch

    from .. import open as ckpt_open
    from ..cli import EXIT_MISMATCH, EXIT_OK

    color = sys.stdout.isatty()

    def paint(c: str, s: str) -> str:
        return f"{c}{s}{RESET}" if color else s

    with ckpt_open(args.checkpoint, strict=args.strict) as ckpt:
        try:
            kwargs: dict = {"map_location": "cpu", "weights_only": not args.trust}
            if ckpt.format == "zip":
                kwargs["mmap"] = True
            if ckpt.format == "torchscript":
                if not args.trust:  # torch.load would hand it to torch.jit.load, which runs its code
                    raise CkptfsError("a TorchScript archive: torch compares only by running it with torch.jit.load "
                                      "(CVE-2025-32434); re-run with --trust if you trust the file", file=ckpt.name)
                ref = torch.jit.load(args.checkpoint, map_location="cpu")
            else:
                ref = torch.load(args.checkpoint, **kwargs)
        except CkptfsError:
            raise
        except Exception as e:  # noqa: BLE001 - torch's refusal is the result here
            msg = " ".join(str(e).split())[:300]
            hint = "" if args.trust else " (re-run with --trust to let torch run the pickle, if you trust the file)"
            raise CkptfsError(f"torch.load failed: {type(e).__name__}: {msg}{hint}", file=ckpt.name) from None
        index = ckpt.index
        rows = [i for i in index.order() if index.kinds[i] in (TENSOR, COMPOSITE)]
        show_progress = not args.no_progress and sys.stderr.isatty() and len(rows) > 200
        ok = bad = skipped = 0
        start = time.monotonic()
        for n, i in enumerate(rows, 1):
            key = index.keys[i]
            meta = ckpt.meta(key)
            problem = None
            try:
                expected = _lookup(ref, index.path(i))
            except (KeyError, IndexError, TypeError):
                expected = None
                problem = "not found in torch.load's result"
            if problem is None:
                compare = _compare_composite if index.kinds[i] == COMPOSITE else _compare
                problem = compare(ckpt, key, meta, expected)
            if problem == "skip":
                skipped += 1
                if args.verbose:
                    print(paint(YELLOW, "SKIP ") + f"{oneline(key)}: {oneline(str(meta.unsupported))}")
            elif problem:
                bad += 1
                print(paint(RED, "FAIL ") + f"{oneline(key)}: {oneline(str(problem))}")
            else:
                ok += 1
                if args.verbose:
                    print(paint(GREEN, "OK   ") + f"{oneline(key)}  {meta.dtype} {list(meta.shape or ())}")
            if show_progress and (n % 100 == 0 or n == len(rows)):
                sys.stderr.write(f"\r  {n}/{len(rows)} tensors checked ({time.monotonic() - start:.0f} s)")
                sys.stderr.flush()
        if show_progress:
            sys.stderr.write("\n")
        extra = _torch_only_tensors(ref, ckpt)
        for path in extra:
            bad += 1
            print(paint(RED, "FAIL ") + f"{oneline('.'.join(map(str, path)))}: a tensor torch.load returns that ckptfs lacks")
    summary = f"{ok} tensors identical, {bad} mismatched, {skipped} not compared (kinds ckptfs does not serve)"
    print(paint(GREEN if not bad else RED, summary))
    return EXIT_MISMATCH if bad else EXIT_OK


def _compare_composite(ckpt: Any, key: str, meta: Any, expected: Any) -> str | None:
    """A sparse / nested / per-channel quantized tensor: its kind and layout (its parts are compared as
    tensors of their own)."""
    import torch

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
        if not expected.is_quantized or str(expected.qscheme()) != f"torch.{extra.get('qscheme')}":
            return f"qscheme {extra.get('qscheme')} != torch's"
        if expected.q_per_channel_axis() != extra.get("axis"):
            return f"axis {extra.get('axis')} != torch's {expected.q_per_channel_axis()}"
    if str(expected.dtype) != f"torch.{meta.dtype}" or tuple(expected.shape) != tuple(meta.shape):
        return f"{meta.dtype} {list(meta.shape)} != torch's {expected.dtype} {list(expected.shape)}"
    return None


def _compare(ckpt: Any, key: str, meta: Any, expected: Any) -> str | None:
    import numpy as np
    import torch

    if isinstance(expected, np.ndarray) and meta.tensor_kind == "numpy":
        if meta.error or meta.unsupported:
            return "skip" if meta.unsupported else f"ckptfs refuses it: {meta.error}"
        if tuple(expected.shape) != tuple(meta.shape):
            return f"shape {list(meta.shape)} != numpy's {list(expected.shape)}"
        stored = np.ascontiguousarray(expected, dtype=ckpt.numpy(key).dtype)  # numpy may unpickle to native order
        return None if ckpt.read(key) == stored.tobytes() else "bytes differ from numpy's"
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
        return None if ckpt.read(key) == b"" else "a tensor without data read as bytes"
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
    got = ckpt.read(key)
    if got != want:
        first = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        return f"bytes differ (first at byte {first}; {len(got)} vs {len(want)} bytes)"
    return None


def _torch_only_tensors(ref: Any, ckpt: Any) -> list[tuple]:
    """Paths of tensors in torch.load's plain containers that ckptfs's index does not have."""
    import torch

    missing: list[tuple] = []
    stack: list[tuple[Any, tuple]] = [(ref, ())]
    seen: set[int] = set()
    while stack and len(missing) < 100:
        obj, path = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if ckpt.index.find_path(path) is None:
                missing.append(path)
        elif isinstance(obj, dict):
            stack.extend((v, path + (k,)) for k, v in obj.items())
        elif isinstance(obj, (list, tuple)):
            stack.extend((v, path + (i,)) for i, v in enumerate(obj))
    return missing
