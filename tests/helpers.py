"""Shared test helpers: writing checkpoints with torch and reading torch's own bytes for comparison.

Expected values come from torch (and numpy) alone: nothing here calls ckptfs to decide what a tensor's
bytes, parts or location should be.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from ctypes.util import find_library
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


def torch_load_byteorder(path: Path | str) -> str:
    """The byte order torch.load reads a file's storages in, found as torch finds it: a zip's ``byteorder``
    record (torch refuses values other than little / big), little without one (torch's default load
    endianness); a legacy stream's storages are read as native (torch ignores sys_info's little_endian)."""
    try:
        reader = torch._C.PyTorchFileReader(str(path))
    except Exception:  # noqa: BLE001 - not a zip: the legacy loader
        return sys.byteorder
    return reader.get_record("byteorder").decode() if reader.has_record("byteorder") else "little"


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


# --- a model directory (tests of sharded checkpoints) -----------------------------------------------------------

def sharded_state_dict() -> dict[str, torch.Tensor]:
    """A small transformer-like state_dict (dtypes and shapes vary; one tensor is large enough to fill a
    shard alone)."""
    g = torch.Generator().manual_seed(11)
    sd = {"model.embed_tokens.weight": torch.randn(50, 16, generator=g)}
    for i in range(3):
        p = f"model.layers.{i}."
        sd[p + "self_attn.q_proj.weight"] = torch.randn(16, 16, generator=g)
        sd[p + "self_attn.k_proj.weight"] = torch.randn(8, 16, generator=g).to(torch.bfloat16)
        sd[p + "mlp.up_proj.weight"] = torch.randn(32, 16, generator=g)
        sd[p + "input_layernorm.weight"] = torch.ones(16)
        sd[p + "rotary.inv_freq"] = torch.arange(8, dtype=torch.float64)
    sd["model.norm.weight"] = torch.randn(16, generator=g).half()
    sd["lm_head.weight"] = torch.randn(50, 16, generator=g)
    sd["model.layers.0.counts"] = torch.arange(6, dtype=torch.int64)
    return sd


MODEL_FILES = {
    "config.json": json.dumps({"architectures": ["TinyForCausalLM"], "hidden_size": 16}, indent=2).encode(),
    "tokenizer.json": json.dumps({"version": "1.0", "model": {"vocab": {"a": 0, "b": 1}}}).encode(),
    "tokenizer.model": bytes(range(256)) * 4,
    "README.md": "# tiny\n\nnot a real model — ünïcödé\n".encode(),
}


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
    ``{"fstype", "source", "options", "super_options"}``, or None when nothing is mounted there."""
    target = os.path.realpath(path)
    found = None
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            left, _, right = line.rstrip("\n").partition(" - ")
            fields, rest = left.split(" "), right.split(" ")
            if _unoctal(fields[4]) == target:
                found = {"fstype": rest[0], "source": _unoctal(rest[1]), "options": fields[5],
                         "super_options": rest[2] if len(rest) > 2 else ""}
    return found


def is_mounted(path: Path | str) -> bool:
    return mount_entry(path) is not None
# --- generated tensors of every dtype and view kind (test_api, test_mount) ------------------------------------

FLOAT8 = ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"]
ALL_DTYPES = ["float64", "float32", "float16", "bfloat16", *FLOAT8, "complex64", "complex128", "complex32",
              "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool"]


def make(dtype_name: str, shape=(3, 5)) -> torch.Tensor:
    """A tensor of the dtype with non-trivial content (generated in float, cast)."""
    dt = getattr(torch, dtype_name)
    g = torch.Generator().manual_seed(hash(dtype_name) % 1000)
    base = torch.randn(shape, generator=g) * 10
    if dt.is_complex:
        return torch.complex(base, base.flip(-1)).to(dt)
    if dt == torch.bool:
        return base > 0
    if not dt.is_floating_point:
        return base.abs().to(torch.int64).to(dt) if dtype_name.startswith("uint") else base.to(torch.int64).to(dt)
    if dtype_name == "float8_e8m0fnu":
        return base.abs().clamp(min=0.01).to(dt)
    return base.to(dt)


def views() -> dict[str, torch.Tensor]:
    base = torch.arange(4 * 6 * 5, dtype=torch.float32).reshape(4, 6, 5)
    return {
        "contig": base,
        "transposed": base.transpose(0, 2),
        "sliced": base[1:3, 2:, 1:4],
        "offset_row": base[2],
        "stepped": base[::2, ::3, 1::2],
        "expanded": torch.arange(5.0).reshape(5, 1).expand(5, 7),
        "broadcast0": torch.tensor(3.0).expand(4, 4),
        "channels_last": torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
        "channels_last_3d": torch.randn(2, 3, 2, 4, 5).to(memory_format=torch.channels_last_3d),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 7),
        "empty_view": base[:, 6:, :],
        "size1_dims": torch.randn(1, 5, 1).transpose(0, 2),
        "narrow_col": base[:, :, 3],
        "diag_like": torch.randn(6, 6).as_strided((6,), (7,)),
        "unsqueeze_t": torch.randn(3, 4).t().unsqueeze(1),
    }


# --- an audit hook: nothing a pickle names may be imported, compiled, executed or spawned ----------------------
# (os.fork is allowed: ckptfs unpickles each pickle first in a forked child of its own, the unpickling probe;
# the child inherits this hook, and tests/test_hostile.py checks what such children do.)
FORBIDDEN = ("import", "exec", "compile", "pickle.find_class", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
             "subprocess.Popen", "ctypes.dlopen", "ctypes.dlsym", "builtins.input", "socket.")
_events: list = []
_recording = [False]
_hooked = [False]


def _hook(event: str, args: tuple) -> None:
    if _recording[0] and event.startswith(FORBIDDEN):
        _events.append((event, repr(args)[:200]))


class audited:
    """``with audited():`` fails if a forbidden audit event fires inside. (The hook is installed once per
    process, the first time it is used; audit hooks cannot be removed, it records only inside the block.)"""

    def __enter__(self) -> None:
        if not _hooked[0]:
            sys.addaudithook(_hook)
            _hooked[0] = True
        _events.clear()
        _recording[0] = True

    def __exit__(self, *exc: object) -> None:
        _recording[0] = False
        assert not _events, _events


# --- user classes of a Lightning-style checkpoint (written through craft.throwaway_module: gone when reading) --
USER_CLASSES = '''
import dataclasses
import enum


class DictConfig:
    """Like omegaconf.DictConfig: content and metadata in __dict__ (pickled via __getstate__)."""

    def __init__(self, content):
        self.__dict__["_content"] = dict(content)
        self.__dict__["_metadata"] = {"object_type": dict, "flags": {"readonly": False}}
        self.__dict__["_parent"] = None

    def __getstate__(self):
        return dict(self.__dict__)

    def __setstate__(self, state):
        self.__dict__.update(state)

    def __getattr__(self, name):
        content = self.__dict__.get("_content", {})
        if name in content:
            return content[name]
        raise AttributeError(name)


class ListConfig(DictConfig):
    def __init__(self, items):
        self.__dict__["_content"] = list(items)
        self.__dict__["_metadata"] = {"object_type": list}
        self.__dict__["_parent"] = None


class AttributeDict(dict):
    """Like lightning's AttributeDict: a dict subclass with attribute access."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError as e:
            raise AttributeError(key) from e


class Mode(enum.Enum):
    TRAIN = "train"
    EVAL = "eval"


@dataclasses.dataclass
class TrainConfig:
    lr: float
    betas: tuple
    schedule: list
    init: object = None


class Exploit:
    """A class whose unpickling would run code: ckptfs must never call it."""

    def __reduce__(self):
        import os
        return (os.system, ("echo pwned > /tmp/ckptfs-pwned",))
'''


# --- the hostile corpus (test_hostile, test_hostile_mount, test_hostile_torch) ---------------------------------

_HOSTILE: list = []


def hostile_corpus() -> tuple[list, Path]:
    """``(cases, markers)``: every case of tests/hostile/make_corpus.py, and the directory their gadgets'
    marker files would appear in. Made once per test process and shared by the three hostile modules."""
    if not _HOSTILE:
        import atexit
        import tempfile

        from hostile.make_corpus import all_cases

        markers = Path(tempfile.mkdtemp(prefix="ckptfs-markers-"))
        atexit.register(shutil.rmtree, markers, True)
        _HOSTILE.append((all_cases(markers), markers))
    return _HOSTILE[0]


# --- FUSE, and mounts made by the ckptfs command --------------------------------------------------------------
# Mount tests skip only when FUSE is genuinely unavailable here (no /dev/fuse, no libfuse, no fusermount for a
# non-root user) AND CKPTFS_REQUIRE_FUSE is not set; CI sets it, and then they fail instead.

CKPTFS = [sys.executable, "-m", "ckptfs.cli"]


def fuse_unavailable() -> str | None:
    """Why real mounts cannot work on this machine, or None."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if not (find_library("fuse3") or find_library("fuse")):
        return "no libfuse (install fuse3)"
    if os.geteuid() != 0 and not (shutil.which("fusermount3") or shutil.which("fusermount")):
        return "no fusermount (install fuse3)"
    # (never import the binding here: it would pin one libfuse for the whole test process)
    if importlib.util.find_spec("mfusepy") is None and importlib.util.find_spec("fuse") is None:
        return "neither mfusepy nor fusepy is installed"
    return None


def require_fuse() -> None:
    import pytest

    reason = fuse_unavailable()
    if reason is None:
        return
    if os.environ.get("CKPTFS_REQUIRE_FUSE"):
        pytest.fail(f"CKPTFS_REQUIRE_FUSE is set but FUSE is unavailable: {reason}")
    pytest.skip(f"FUSE unavailable: {reason}")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.02)
    return False


def run_ckptfs(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*CKPTFS, *args], capture_output=True, text=True, env=env, timeout=timeout)


class Mounted:
    """One mount made by ``ckptfs mount`` (daemon mode)."""

    def __init__(self, path: Path, checkpoint: Path, log: Path, pid: int) -> None:
        self.path, self.checkpoint, self.log, self.pid = path, checkpoint, log, pid

    def __truediv__(self, other: str) -> Path:
        return self.path / other

    def index(self) -> dict:
        return json.loads((self.path / ".ckptfs" / "index.json").read_bytes())

    def cleanup(self) -> None:
        """Unmount whatever state it is in, and make sure the daemon is gone."""
        for args in (["-u"], ["-uz"]):
            if not is_mounted(self.path):
                break
            for tool in ("fusermount3", "fusermount"):
                if shutil.which(tool):
                    subprocess.run([tool, *args, str(self.path)], capture_output=True, timeout=30)
                    break
        if pid_alive(self.pid) and not wait_gone(self.pid, 10):
            os.kill(self.pid, signal.SIGKILL)  # our own daemon, by pid
            wait_gone(self.pid, 5)
        assert not is_mounted(self.path), f"{self.path} is still mounted"


class Mounter:
    """Makes mounts under ``base``; ``cleanup()`` unmounts every one of them."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.made: list[Mounted] = []

    def __call__(self, checkpoint: Path | str, *args: str, env: dict | None = None) -> Mounted:
        n = len(self.made)
        mnt = self.base / f"mnt{n}"
        mnt.mkdir(parents=True)
        log = self.base / f"mount{n}.log"
        r = run_ckptfs("mount", str(checkpoint), str(mnt), "--log", str(log), *args, env=env)
        if r.returncode != 0:
            raise AssertionError(f"ckptfs mount failed ({r.returncode}): {r.stderr.strip()}")
        pid = json.loads((mnt / ".ckptfs" / "mount.json").read_bytes())["pid"]
        m = Mounted(mnt, Path(checkpoint), log, pid)
        self.made.append(m)
        return m

    def cleanup(self) -> None:
        errors = []
        for m in self.made:
            try:
                m.cleanup()
            except AssertionError as e:
                errors.append(str(e))
        assert not errors, errors


# --- remote checkpoints (test_remote_*) ------------------------------------------------------------------------


def remote_state_dict() -> dict:
    """A state_dict with what remote reads must get right: tensors smaller and larger than a block (256 KiB),
    one over the direct-read size (4 MiB) and the read-ahead windows, bfloat16, a strided view, a value."""
    g = torch.Generator().manual_seed(10)
    return {
        "emb.weight": torch.randn(1000, 64, generator=g),
        "enc.0.weight": torch.randn(64, 64, generator=g).to(torch.bfloat16),
        "enc.0.bias": torch.arange(64, dtype=torch.int64),
        "enc.1.weight": torch.randn(64, 32, generator=g).t(),
        "big": torch.randn(3_000_000, generator=g),
        "mid": torch.randn(300_000, generator=g),
        "tail": torch.randn(10, generator=g),
        "step": 1234,
    }


def torch_tensors(path: Path | str) -> dict[str, torch.Tensor]:
    """Every top-level tensor of a state_dict file as torch.load gives it."""
    loaded = torch.load(path, map_location="cpu", weights_only=True)
    return {k: v for k, v in loaded.items() if isinstance(v, torch.Tensor)}


# --- HF model directories -----------------------------------------------------------------------------------


def write_hf_bin_shards(d: Path, state_dict: dict, max_shard_size: int | str = "5GB",
                        prefix: str = "pytorch_model") -> list[str]:
    """PyTorch weights as transformers wrote them before safetensors: huggingface_hub's own split of the
    state_dict, one torch.save per shard, and ``<prefix>.bin.index.json`` (indent=2, sorted keys) when there
    are several. Returns the shard file names in order."""
    from huggingface_hub import split_torch_state_dict_into_shards

    split = split_torch_state_dict_into_shards(state_dict, filename_pattern=prefix + "{suffix}.bin",
                                               max_shard_size=max_shard_size)
    for name, keys in split.filename_to_tensors.items():
        torch.save({k: state_dict[k] for k in keys}, Path(d) / name)
    if split.is_sharded:
        index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
        (Path(d) / f"{prefix}.bin.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return list(split.filename_to_tensors)


# --- statistics and differences as torch computes them (test_stats, test_diff) ------------------------------------


def torch_values(t: torch.Tensor) -> torch.Tensor:
    """The values of a tensor as torch.load gives it, widened by torch to float64 (complex128 for complex
    dtypes): quantized tensors dequantized, conjugate / negative views resolved."""
    t = t.detach()
    if t.is_quantized:
        t = t.dequantize()
    t = t.resolve_conj().resolve_neg()
    return t.to(torch.complex128 if t.is_complex() else torch.float64)


def expected_stats(t: torch.Tensor) -> dict:
    """What ckptfs stats must report for ``t`` (docs/cli.md), computed by torch: counts of NaN / +Inf / -Inf /
    zeros / finite; min, max and abs max over the values that are not NaN; mean and Bessel-corrected std over
    the finite values; integers' min/max exactly (torch's tolist), bool's as bools."""
    x = torch_values(t).reshape(-1)
    isnan = torch.isnan(x)
    fin = x[torch.isfinite(x)]
    nonnan = x[~isnan]
    out: dict = {"numel": x.numel(), "nan": int(isnan.sum()), "zeros": int((x == 0).sum()),
                 "finite": int(fin.numel())}
    if x.is_complex():
        out.update(posinf=None, neginf=None, inf=int(torch.isinf(x).sum()), min=None, max=None)
    else:
        out.update(posinf=int(torch.isposinf(x).sum()), neginf=int(torch.isneginf(x).sum()))
        out["inf"] = out["posinf"] + out["neginf"]
        if t.dtype == torch.bool:
            vals = t.reshape(-1).tolist()
            out["min"], out["max"] = (min(vals), max(vals)) if vals else (None, None)
        elif not t.is_floating_point() and not t.is_quantized:
            vals = t.reshape(-1).tolist()  # exact Python ints
            out["min"], out["max"] = (min(vals), max(vals)) if vals else (None, None)
        else:
            out["min"] = float(nonnan.min()) if nonnan.numel() else None
            out["max"] = float(nonnan.max()) if nonnan.numel() else None
    if out.get("min") is not None and not x.is_complex():
        out["abs_max"] = (max(abs(out["min"]), abs(out["max"])) if t.dtype != torch.bool else bool(out["max"]))
    else:
        out["abs_max"] = float(nonnan.abs().max()) if nonnan.numel() else None
    if fin.numel():
        m = fin.mean().item()
        out["mean"] = complex(m) if x.is_complex() else float(m)
    else:
        out["mean"] = None
    out["std"] = float(fin.std()) if fin.numel() > 1 else None
    return out


def dotted_tensors(obj: object, prefix: str = "") -> dict[str, torch.Tensor]:
    """The tensors of nested dicts by dotted key (as the safetensors view and export name them)."""
    if isinstance(obj, torch.Tensor):
        return {prefix: obj}
    out: dict[str, torch.Tensor] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out |= dotted_tensors(v, f"{prefix}.{k}" if prefix else str(k))
    return out


def sharded_reference(d: Path) -> dict[str, torch.Tensor]:
    """Every key of the shards the index names, loaded by the writer's own loader: torch.load of each
    ``.bin`` shard (merged, as transformers does), safetensors.safe_open of each ``.safetensors`` one."""
    index = next(d.glob("*.index.json"))
    out: dict[str, torch.Tensor] = {}
    for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
        if shard.endswith(".safetensors"):
            from safetensors import safe_open

            with safe_open(d / shard, framework="pt") as f:
                out.update({k: f.get_tensor(k) for k in f.keys()})
        else:
            out.update(torch.load(d / shard, weights_only=True, mmap=True))
    return out
