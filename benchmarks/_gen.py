"""Checkpoint generator, run in its own process: ``python -m benchmarks._gen '<json spec>'``.

Every file is written by torch.save (torch's default zip format) from deterministic (seeded) data;
the .safetensors twins are converted from the .pth by loading it with torch and calling safetensors'
save_file on the flattened tensors (dotted keys, views made contiguous).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import sys
import time
import zlib
from collections import OrderedDict
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


def readers(n: int, tensor_bytes: int) -> dict:
    """n float32 tensors of tensor_bytes each (one per concurrent reader)."""
    g = _gen(7)
    return {f"t{i}": _fill(tensor_bytes // 4, g) for i in range(n)}


def flat(n: int, numel: int) -> dict:
    """tiny's tensors under top-level keys p0, p1, ...: one directory of n entries (and n sidecars) when mounted."""
    return {f"p{i}": t for i, t in enumerate(tiny(n, numel).values())}


KINDS = {"tiny": tiny, "big": big, "train": train, "mount": mount, "model": model, "daemon": daemon,
         "readers": readers, "flat": flat}


# --- a sparse checkpoint: a real torch zip whose storage records are holes --------------------------------------------


def _gf2_times(mat: list[int], vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _gf2_square(mat: list[int]) -> list[int]:
    return [_gf2_times(mat, mat[n]) for n in range(32)]


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC-32 of A + B from crc(A), crc(B) and len(B) (zlib's crc32_combine, which Python does not expose)."""
    if len2 <= 0:
        return crc1
    odd = [0xEDB88320] + [1 << n for n in range(31)]  # the operator for one zero bit
    even = _gf2_square(odd)  # two zero bits
    odd = _gf2_square(even)  # four
    while True:
        even = _gf2_square(odd)
        if len2 & 1:
            crc1 = _gf2_times(even, crc1)
        len2 >>= 1
        if not len2:
            break
        odd = _gf2_square(even)
        if len2 & 1:
            crc1 = _gf2_times(odd, crc1)
        len2 >>= 1
        if not len2:
            break
    return crc1 ^ crc2


def crc32_zeros(n: int) -> int:
    """CRC-32 of n zero bytes, without reading them."""
    chunk = 1 << 20
    block = zlib.crc32(bytes(chunk))
    crc = 0
    whole, rest = divmod(n, chunk)
    # crc of `whole` blocks by doubling
    acc, acc_len, k = block, chunk, whole
    while k:
        if k & 1:
            crc = crc32_combine(crc, acc, acc_len)
        acc = crc32_combine(acc, acc, acc_len)
        acc_len *= 2
        k >>= 1
    return crc32_combine(crc, zlib.crc32(bytes(rest)), rest)


class _Storage:
    def __init__(self, key: str, numel: int) -> None:
        self.key, self.numel = key, numel


class _Tensor:
    def __init__(self, storage: _Storage, shape: tuple[int, ...], stride: tuple[int, ...] | None = None) -> None:
        self.storage, self.shape = storage, shape
        self.stride = stride if stride is not None else _contiguous_stride(shape)


class _TorchPickler(pickle.Pickler):
    """Pickles _Tensor stand-ins exactly as torch.save pickles float32 tensors (no tensor is made)."""

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, _Storage):
            return ("storage", torch.FloatStorage, obj.key, "cpu", obj.numel)
        return None

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, _Tensor):
            return (torch._utils._rebuild_tensor_v2, (obj.storage, 0, obj.shape, obj.stride, False, OrderedDict()))
        return NotImplemented


def _contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))


def write_sparse(path: str, total_bytes: int, n: int, transposed: bool = False) -> None:
    """A torch.save-format zip of n float32 tensors totalling ~total_bytes whose data records are holes
    (a sparse file: the disk holds only headers, the pickle and the central directory). Records, names,
    64-byte alignment and zip64 fields as torch writes them; CRCs are those of the zero bytes. With
    ``transposed`` the last tensor is the transposed view of its storage (a strided tensor)."""
    root = os.path.splitext(os.path.basename(path))[0]
    per = total_bytes // n // 4
    cols = 1024 if per >= 1024 else per
    rows = max(1, per // cols)
    sd = OrderedDict((f"layers.{i}.weight", _Tensor(_Storage(str(i), rows * cols), (rows, cols))) for i in range(n))
    if transposed:
        sd[f"layers.{n - 1}.weight"] = _Tensor(_Storage(str(n - 1), rows * cols), (cols, rows), (1, cols))
    buf = io.BytesIO()
    _TorchPickler(buf, protocol=2).dump(sd)
    records: list[tuple[str, bytes | int]] = [("data.pkl", buf.getvalue()), (".format_version", b"1"),
                                              (".storage_alignment", b"64"), ("byteorder", sys.byteorder.encode())]
    records += [(f"data/{i}", rows * cols * 4) for i in range(n)]
    records += [("version", b"3\n"), (".data/serialization_id", b"0" * 40)]
    zero_crc: dict[int, int] = {}
    central = []
    with open(path, "wb") as f:
        pos = 0
        for name, data in records:
            full = f"{root}/{name}".encode()
            size = data if isinstance(data, int) else len(data)
            if isinstance(data, int):
                if size not in zero_crc:
                    zero_crc[size] = crc32_zeros(size)
                crc = zero_crc[size]
            else:
                crc = zlib.crc32(data)
            z64 = size >= 0xFFFFFFFF
            extra = struct.pack("<HHQQ", 1, 16, size, size) if z64 else b""
            header_len = 30 + len(full) + len(extra)
            pad = (-(pos + header_len + 4)) % 64  # torch pads with an extra field ("FB") to align the data
            extra += struct.pack("<HH", 0x4246, pad) + b"Z" * pad
            small = 0xFFFFFFFF if z64 else size
            f.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 45 if z64 else 20, 0x0800, 0, 0, 0x21, crc, small, small,
                                len(full), len(extra)) + full + extra)
            if isinstance(data, int):
                f.seek(size, os.SEEK_CUR)  # a hole
            else:
                f.write(data)
            central.append((full, crc, size, pos))
            pos = f.tell()
        cd_start = pos
        for full, crc, size, offset in central:
            vals, z64extra = [], b""
            small_size = size
            small_off = offset
            if size >= 0xFFFFFFFF:
                vals += [size, size]
                small_size = 0xFFFFFFFF
            if offset >= 0xFFFFFFFF:
                vals.append(offset)
                small_off = 0xFFFFFFFF
            if vals:
                z64extra = struct.pack("<HH", 1, 8 * len(vals)) + struct.pack(f"<{len(vals)}Q", *vals)
            f.write(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45 if vals else 20, 0x0800, 0, 0, 0x21, crc,
                                small_size, small_size, len(full), len(z64extra), 0, 0, 0, 0, small_off)
                    + full + z64extra)
        cd_end = f.tell()
        count = len(central)
        f.write(struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, count, count, cd_end - cd_start, cd_start))
        f.write(struct.pack("<IIQI", 0x07064B50, 0, cd_end, 1))
        f.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, min(count, 0xFFFF), min(count, 0xFFFF),
                            min(cd_end - cd_start, 0xFFFFFFFF), min(cd_start, 0xFFFFFFFF), 0))


WRITERS = {"sparse": write_sparse}


# --- directories ------------------------------------------------------------------------------------------------

SHARD_PARTS = (("self_attn.q_proj.weight", 1), ("self_attn.k_proj.weight", 1), ("self_attn.v_proj.weight", 1),
               ("self_attn.o_proj.weight", 1), ("mlp.gate_proj.weight", 1), ("mlp.up_proj.weight", 1),
               ("mlp.down_proj.weight", 1), ("input_layernorm.weight", 1), ("post_attention_layernorm.weight", 1))


def shards(path: str, n_shards: int, layers: int, numel: int, safe: bool) -> None:
    """A model directory as huggingface_hub's save_torch_state_dict writes it: exactly ``n_shards`` shards
    (``model-000NN-of-000MM.safetensors`` or ``pytorch_model-...bin``) with their index, plus config.json.
    ``layers`` x 9 equal-sized tensors of ``numel`` float32 (a shard holds the same number of each)."""
    from huggingface_hub import save_torch_state_dict

    g = _gen(7)
    sd = {f"model.layers.{i}.{name}": _fill(numel, g).reshape(-1, 16) for i in range(layers) for name, _ in SHARD_PARTS}
    per_shard = -(-len(sd) // n_shards)
    os.makedirs(path)
    save_torch_state_dict(sd, path, max_shard_size=per_shard * numel * 4, safe_serialization=safe)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"architectures": ["BenchForCausalLM"], "num_hidden_layers": layers}, f)
    got = sum(1 for p in os.listdir(path) if p.endswith((".safetensors", ".bin")))
    if got != n_shards:
        raise RuntimeError(f"{got} shards written, {n_shards} wanted")


def dcp_dir(path: str, n: int) -> None:
    """A DCP checkpoint (dcp.save, one process) of ``n`` small tensors: n entries, n items."""
    import warnings

    import torch.distributed.checkpoint as dcp

    warnings.filterwarnings("ignore")
    g = _gen(8)
    sd = {f"model.layers.{i // 10}.block{i % 10}.weight": _fill(8, g) for i in range(n)}
    dcp.save(sd, checkpoint_id=path, no_dist=True)


DIR_KINDS = {"shards": shards, "dcp": dcp_dir}


def tree_size(path: str) -> int:
    """Bytes of a file, or of every file under a directory."""
    if not os.path.isdir(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


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
        elif kind in DIR_KINDS:
            DIR_KINDS[kind](path, **params)
        elif kind in WRITERS:
            WRITERS[kind](path, **params)
        elif kind in DERIVED:
            DERIVED[kind](params["source"], path)
        else:
            obj = KINDS[kind](**params)
            torch.save(obj, path)  # the record root is the file's basename: keep the final name
            del obj
            _fsync(path)
        print("GEN " + json.dumps({"path": path, "size": tree_size(path), "seconds": time.perf_counter() - t0}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
