"""Shared test helpers: writing checkpoints with torch and reading torch's own bytes for comparison.

Expected values come from torch (and numpy) alone: nothing here calls ckptfs to decide what a tensor's
bytes, parts or location should be.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

# --- torch's side: bytes and paths ---------------------------------------------------------------------------


def torch_bytes(t: torch.Tensor, byteorder: str = sys.byteorder) -> bytes:
    """The tensor's C-contiguous content as torch.save stores it, in ``byteorder``: what ckptfs serves.

    A conj / neg view is stored as its underlying data (the bit is metadata): that data is computed here
    with torch's arithmetic (conj_physical / neg of the resolved values), not by reinterpreting the view.
    A quantized tensor's bytes are its integer representation."""
    t = t.detach()
    if t.is_conj():
        t = torch.conj_physical(t.resolve_conj())
    if t.is_neg():
        t = torch.neg(t.resolve_neg())
    if t.is_quantized:
        t = t.int_repr()
    t = t.contiguous()
    if t.numel() == 0:
        return b""
    raw = t.reshape(-1).view(torch.uint8).numpy()
    if byteorder != sys.byteorder and t.element_size() > 1:
        unit = t.element_size() // (2 if t.is_complex() else 1)
        raw = raw.reshape(-1, unit)[:, ::-1].reshape(-1)
    return raw.tobytes()


def save(path: Path, obj: Any, **kwargs: Any) -> Path:
    torch.save(obj, path, **kwargs)
    return path


def tensor_part(t: torch.Tensor, name: str) -> torch.Tensor:
    """The component torch gives for the part ``name`` of a sparse / nested / per-channel quantized tensor
    (the names docs/layout.md gives the parts of a composite)."""
    if t.is_quantized:
        parts = {"int_repr": t.int_repr, "scales": t.q_per_channel_scales, "zero_points": t.q_per_channel_zero_points}
    elif t.is_nested:
        parts = {"buffer": t.values, "sizes": t._nested_tensor_size, "strides": t._nested_tensor_strides,
                 "offsets": t._nested_tensor_storage_offsets}
    elif t.layout == torch.sparse_coo:
        parts = {"indices": t._indices, "values": t._values}
    elif t.layout in (torch.sparse_csr, torch.sparse_bsr):
        parts = {"crow_indices": t.crow_indices, "col_indices": t.col_indices, "values": t.values}
    elif t.layout in (torch.sparse_csc, torch.sparse_bsc):
        parts = {"ccol_indices": t.ccol_indices, "row_indices": t.row_indices, "values": t.values}
    else:
        raise KeyError(f"a {t.layout} tensor has no part {name!r}")
    return parts[name]()


def lookup(obj: Any, path: tuple) -> Any:
    """Follow a ckptfs path (tuple of original keys) through a torch.load / torch.jit.load result: into
    containers, the parts of composite tensors, the state of (opaque) objects and TorchScript attributes."""
    for part in path:
        if isinstance(obj, torch.Tensor) and isinstance(part, str):
            obj = tensor_part(obj, part)
        elif isinstance(obj, (dict, list, tuple)):
            obj = obj[part]
        elif isinstance(obj, torch.jit.ScriptModule):
            obj = getattr(obj, part)
        elif hasattr(obj, "__dict__") and part in vars(obj):
            obj = vars(obj)[part]
        else:
            obj = obj[part]
    return obj


# --- the kernel's mount table -----------------------------------------------------------------------------------


def _unoctal(field: str) -> str:
    """A mountinfo field with the kernel's octal escapes (\\040 for a space ...) undone."""
    out, i = bytearray(), 0
    raw = field.encode("utf-8", "surrogateescape")
    while i < len(raw):
        if raw[i : i + 1] == b"\\" and raw[i + 1 : i + 4].isdigit() and len(raw[i + 1 : i + 4]) == 3:
            out.append(int(raw[i + 1 : i + 4], 8))
            i += 4
        else:
            out.append(raw[i])
            i += 1
    return out.decode("utf-8", "surrogateescape")


def mount_entry(path: Path | str) -> dict | None:
    """The topmost mount at ``path`` in /proc/self/mountinfo (read here, not through ckptfs):
    ``{"fstype", "source", "options"}``, or None when nothing is mounted there."""
    import os

    target = os.path.realpath(path)
    found = None
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            left, _, right = line.rstrip("\n").partition(" - ")
            fields, rest = left.split(" "), right.split(" ")
            if _unoctal(fields[4]) == target:
                found = {"fstype": rest[0], "source": _unoctal(rest[1]), "options": fields[5]}
    return found


def is_mounted(path: Path | str) -> bool:
    return mount_entry(path) is not None
