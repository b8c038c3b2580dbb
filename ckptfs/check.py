"""``ckptfs check``: load the checkpoint with torch and compare every tensor with what ckptfs serves.

torch.load runs with ``weights_only=True`` (and ``mmap=True`` for zip files, so memory stays low)
unless ``--trust`` is given; a file torch refuses is reported, not loaded unsafely.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from .errors import CkptfsError

GREEN, RED, YELLOW, RESET = "\033[32m", "\033[31m", "\033[33m", "\033[0m"


def _lookup(obj: Any, path: tuple) -> Any:
    """Follow a ckptfs path (original keys) through what torch.load returned."""
    for part in path:
        if isinstance(obj, dict):
            obj = obj[part]
        elif isinstance(obj, (list, tuple)) and type(part) is int:
            obj = obj[part]
        elif isinstance(part, str) and hasattr(obj, "__dict__") and part in vars(obj):
            obj = vars(obj)[part]
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
        t = t.conj().resolve_conj().conj()  # stored bytes are the un-conjugated data
    if t.is_neg():
        t = t.neg().resolve_neg().neg()
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

    from . import open as ckpt_open
    from .cli import EXIT_MISMATCH, EXIT_OK

    color = sys.stdout.isatty()

    def paint(c: str, s: str) -> str:
        return f"{c}{s}{RESET}" if color else s

    with ckpt_open(args.checkpoint, strict=args.strict) as ckpt:
        try:
            kwargs: dict = {"map_location": "cpu", "weights_only": not args.trust}
            if ckpt.format == "zip":
                kwargs["mmap"] = True
            ref = torch.load(args.checkpoint, **kwargs)
        except Exception as e:  # noqa: BLE001 - torch's refusal is the result here
            msg = " ".join(str(e).split())[:300]
            hint = "" if args.trust else " (re-run with --trust to let torch run the pickle, if you trust the file)"
            raise CkptfsError(f"torch.load failed: {type(e).__name__}: {msg}{hint}", file=ckpt.name) from None
        index = ckpt.index
        rows = index.tensors()
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
                problem = _compare(ckpt, key, meta, expected)
            if problem == "skip":
                skipped += 1
                if args.verbose:
                    print(paint(YELLOW, "SKIP ") + f"{key}: {meta.unsupported}")
            elif problem:
                bad += 1
                print(paint(RED, "FAIL ") + f"{key}: {problem}")
            else:
                ok += 1
                if args.verbose:
                    print(paint(GREEN, "OK   ") + f"{key}  {meta.dtype} {list(meta.shape or ())}")
            if show_progress and (n % 100 == 0 or n == len(rows)):
                sys.stderr.write(f"\r  {n}/{len(rows)} tensors checked ({time.monotonic() - start:.0f} s)")
                sys.stderr.flush()
        if show_progress:
            sys.stderr.write("\n")
        extra = _torch_only_tensors(ref, ckpt)
        for path in extra:
            bad += 1
            print(paint(RED, "FAIL ") + f"{'.'.join(map(str, path))}: a tensor torch.load returns that ckptfs lacks")
    summary = f"{ok} tensors identical, {bad} mismatched, {skipped} not compared (kinds ckptfs does not serve)"
    print(paint(GREEN if not bad else RED, summary))
    return EXIT_MISMATCH if bad else EXIT_OK


def _compare(ckpt: Any, key: str, meta: Any, expected: Any) -> str | None:
    import torch

    if not isinstance(expected, torch.Tensor):
        return f"torch.load gives a {type(expected).__name__} here, not a tensor"
    if meta.unsupported:
        return "skip"
    if meta.error:
        return f"ckptfs refuses it: {meta.error}"
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
