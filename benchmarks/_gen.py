"""Checkpoint generator, run in its own process: ``python -m benchmarks._gen '<json spec>'``.

Every file is written by torch.save (torch's default zip format) from deterministic (seeded) data;
the .safetensors twins are converted from the .pth by loading it with torch and calling safetensors'
save_file on the flattened tensors (dotted keys, views made contiguous).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import torch

MiB = 1 << 20


def _gen(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def _fill(n: int, g: torch.Generator, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(n, dtype=dtype).uniform_(-1, 1, generator=g)


def tiny(n: int, numel: int) -> dict:
    """n tiny tensors in a flat state_dict with realistic dotted keys (a mix of 1-d and 2-d shapes)."""
    g = _gen(1)
    sd: dict[str, torch.Tensor] = {}
    side = max(1, int(numel ** 0.5))
    for i in range(n):
        shape = (numel,) if i % 2 == 0 else (side, max(1, numel // side))
        sd[f"blocks.{i // 16}.layer{(i // 4) % 4}.p{i % 4}"] = torch.randn(shape, generator=g)
    return sd


def big(total_bytes: int, n: int) -> dict:
    """n float32 tensors totalling ~total_bytes, 2-d, in a flat state_dict."""
    g = _gen(2)
    per = total_bytes // n // 4
    cols = 1024 if per >= 1024 else per
    rows = max(1, per // cols)
    return {f"layers.{i}.weight": _fill(rows * cols, g).reshape(rows, cols) for i in range(n)}


def train(width: int, layers: int, vocab: int) -> dict:
    """A Lightning-style training checkpoint: model weights, Adam state (exp_avg, exp_avg_sq, step),
    scheduler state and hyper-parameters (floats, strings, nested dicts, lists)."""
    torch.manual_seed(3)
    d = width
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.LayerNorm(d), torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d),
                   torch.nn.LayerNorm(d), torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)]
    model = torch.nn.Sequential(torch.nn.Embedding(vocab, d), *blocks, torch.nn.LayerNorm(d))
    opt = torch.optim.Adam(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    sched.step()
    return {
        "epoch": 3,
        "global_step": 12345,
        "pytorch-lightning_version": "2.4.0",
        "state_dict": model.state_dict(),
        "optimizer_states": [opt.state_dict()],
        "lr_schedulers": [sched.state_dict()],
        "hyper_parameters": {"lr": 3e-4, "width": d, "layers": layers, "name": "bench-train",
                             "betas": [0.9, 0.95], "schedule": {"step_size": 10, "gamma": 0.5}},
    }


def mount(seq_bytes: int, square: int) -> dict:
    """For the mount cases: one big contiguous tensor, a contiguous square matrix and a transposed one
    (stored as the transpose view of a square matrix: strides (1, n))."""
    g = _gen(4)
    n = square
    return {
        "seq": _fill(seq_bytes // 4, g),
        "contig": _fill(n * n, g).reshape(n, n),
        "transposed": _fill(n * n, g).reshape(n, n).t(),
    }


def model(width: int, layers: int) -> dict:
    """The state_dict of nn.Sequential(Linear(w, w) x layers) (what benchmarks._worker builds)."""
    g = _gen(5)
    sd = {}
    for i in range(layers):
        sd[f"{i}.weight"] = _fill(width * width, g).reshape(width, width)
        sd[f"{i}.bias"] = _fill(width, g)
    return sd


def daemon(total_bytes: int, tensor_bytes: int) -> dict:
    g = _gen(6)
    n = max(1, total_bytes // tensor_bytes)
    return {f"shard.{i}": _fill(tensor_bytes // 4, g) for i in range(n)}


KINDS = {"tiny": tiny, "big": big, "train": train, "mount": mount, "model": model, "daemon": daemon}


def changed(source: str, dst: str) -> None:
    """``source`` with one element of every tensor changed (the diff benchmark's "after")."""
    obj = torch.load(source, mmap=True, weights_only=True)
    out = {}
    for i, (k, t) in enumerate(obj.items()):
        u = t.clone()
        u.view(-1)[(i * 7919) % u.numel()] += 1.0
        out[k] = u
    torch.save(out, dst)
    _fsync(dst)


def copy(source: str, dst: str) -> None:
    """A byte-identical copy (another file: the diff benchmark's "identical, compared" case)."""
    import shutil

    shutil.copyfile(source, dst)
    _fsync(dst)


DERIVED = {"changed": changed, "copy": copy}


def flatten_tensors(obj: Any, prefix: str = "", out: dict | None = None) -> dict:
    """Dotted keys -> tensors for every tensor in nested dicts/lists (what the .safetensors twin holds)."""
    out = {} if out is None else out
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj.detach().contiguous().clone() if not obj.is_contiguous() else obj.detach()
    elif isinstance(obj, dict):
        for k, v in obj.items():
            flatten_tensors(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            flatten_tensors(v, f"{prefix}.{i}" if prefix else str(i), out)
    return out


def to_safetensors(pth: str, dst: str) -> None:
    from safetensors.torch import save_file

    obj = torch.load(pth, mmap=True, weights_only=True)
    tensors = flatten_tensors(obj)
    # safetensors refuses tensors sharing memory: give each its own storage
    seen: set = set()
    for k, t in tensors.items():
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen or t.untyped_storage().nbytes() != t.numel() * t.element_size():
            tensors[k] = t.clone()
        seen.add(ptr)
    save_file(tensors, dst)
    _fsync(dst)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    """One spec, or a list of specs (generated in order, in this one process)."""
    specs = json.loads(argv[0])
    for spec in specs if isinstance(specs, list) else [specs]:
        kind, path, params = spec["kind"], spec["path"], spec["params"]
        t0 = time.perf_counter()
        if kind == "safetensors":
            to_safetensors(params["source"], path)
        elif kind in DERIVED:
            DERIVED[kind](params["source"], path)
        else:
            obj = KINDS[kind](**params)
            torch.save(obj, path)  # the record root is the file's basename: keep the final name
            del obj
            _fsync(path)
        print("GEN " + json.dumps({"path": path, "size": os.path.getsize(path), "seconds": time.perf_counter() - t0}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
