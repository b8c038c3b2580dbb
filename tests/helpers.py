"""Shared test helpers: writing checkpoints with torch and reading torch's own bytes for comparison."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch


def torch_bytes(t: torch.Tensor, byteorder: str = sys.byteorder) -> bytes:
    """The tensor's C-contiguous content as bytes in ``byteorder`` (what ckptfs serves for a tensor)."""
    t = t.detach()
    if t.is_conj():
        t = t.conj().resolve_conj().conj()
    if t.is_neg():
        t = t.neg().resolve_neg().neg()
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


def lookup(obj: Any, path: tuple) -> Any:
    """Follow a ckptfs path (tuple of original keys) through a torch.load result."""
    for part in path:
        obj = obj[part]
    return obj
