#!/usr/bin/env python3
"""Write the multi-version test fixtures: small checkpoints (KBs) saved by the torch that runs this script,
with a manifest of what that torch says each tensor holds, under tests/data/torch-<version>/.

Run it once with every torch to cover (tests never need an old torch; they read the files and manifests):

    /usr/bin/python3 scripts/make_fixtures.py            # Debian bookworm's python3-torch (1.13.1):
                                                         #   apt-get install python3-torch
    python scripts/make_fixtures.py                      # the project's torch (2.13, CPU)
    python -m venv /tmp/t214 && /tmp/t214/bin/pip install torch==2.14.1 numpy
    /tmp/t214/bin/python scripts/make_fixtures.py        # torch 2.14.1 in a throwaway venv

Each fixture set holds:
  state_dict.pt   zip format: a module state_dict, dtypes, shared storages and views (transposed, sliced,
                  expanded), a Parameter, nested containers
  legacy.pt       the same object with _use_new_zipfile_serialization=False (the torch < 1.6 stream format)
  exotic.pt       quantized (per-tensor, per-channel), sparse COO / CSR, conj / neg views, meta, nested
                  (each only if this torch can save it)
  training.pt     an Adam / SGD optimizer state, scheduler state, RNG state, epoch and metrics
  scripted.pt     a torch.jit.script module (TorchScript archive: code/, constants.pkl, deflated records)
  manifest.json   for every tensor (and every part of a composite, named as ckptfs names them): its path,
                  dtype, shape, and the sha256 of its bytes as stored (C order, file byte order, conj/neg bits
                  not applied), computed by the writing torch itself.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
from collections import OrderedDict

import torch


# --- what the writing torch says a tensor holds -------------------------------------------------------------


def stored_bytes(t: "torch.Tensor") -> bytes:
    t = t.detach()
    if getattr(t, "is_conj", lambda: False)():
        t = t.conj()  # clears the bit: the data as stored
    if getattr(t, "is_neg", lambda: False)():
        t = t._neg_view()
    t = t.contiguous()
    if t.numel() == 0:
        return b""
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def parts(t: "torch.Tensor") -> "list[tuple[str, torch.Tensor]] | None":
    """The component tensors of a composite tensor, named as ckptfs names its parts."""
    if t.is_quantized and t.qscheme() in (torch.per_channel_affine, torch.per_channel_affine_float_qparams):
        return [("int_repr", t.int_repr()), ("scales", t.q_per_channel_scales()),
                ("zero_points", t.q_per_channel_zero_points())]
    if getattr(t, "is_nested", False):
        return [("buffer", t.values()), ("sizes", t._nested_tensor_size()), ("strides", t._nested_tensor_strides()),
                ("offsets", t._nested_tensor_storage_offsets())]
    if t.layout == torch.sparse_coo:
        return [("indices", t._indices()), ("values", t._values())]
    if t.layout == torch.sparse_csr:
        return [("crow_indices", t.crow_indices()), ("col_indices", t.col_indices()), ("values", t.values())]
    return None


def describe(t: "torch.Tensor", path: list) -> list:
    out = []
    sub = parts(t)
    if sub is not None:
        out.append({"path": path, "composite": True, "dtype": str(t.dtype)[6:],
                    "shape": list(t.shape) if not getattr(t, "is_nested", False) else [t.size(0)]})
        for name, p in sub:
            out.extend(describe(p, path + [["s", name]]))
        return out
    entry = {"path": path, "dtype": str(t.dtype)[6:], "shape": list(t.shape), "requires_grad": t.requires_grad,
             "device": t.device.type}
    if t.is_quantized:
        entry.update(qscale=t.q_scale(), qzero_point=t.q_zero_point())
        data = stored_bytes(t.int_repr())
    elif t.device.type == "meta":
        data = b""
    else:
        data = stored_bytes(t)
    entry["nbytes"] = len(data)
    entry["sha256"] = hashlib.sha256(data).hexdigest()
    out.append(entry)
    return out


def walk(obj: object, path: list) -> list:
    if isinstance(obj, torch.Tensor):
        return describe(obj, path)
    if isinstance(obj, dict):
        out = []
        for k, v in obj.items():
            out.extend(walk(v, path + [["i" if type(k) is int else "s", k]]))
        return out
    if isinstance(obj, (list, tuple)):
        out = []
        for i, v in enumerate(obj):
            out.extend(walk(v, path + [["i", i]]))
        return out
    return []


# --- the checkpoints --------------------------------------------------------------------------------------


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 3, 3)
        self.bn = torch.nn.BatchNorm2d(3)
        self.fc = torch.nn.Linear(3, 2)
        self.register_buffer("steps", torch.arange(4, dtype=torch.int32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(self.conv(x)).mean(dim=(2, 3))
        return self.fc(y) + self.steps.sum()


def state_dict_obj() -> dict:
    torch.manual_seed(0)
    net = Net()
    base = torch.arange(60, dtype=torch.float32).reshape(3, 4, 5)
    dtypes = {}
    for name in ("float64", "float16", "bfloat16", "int8", "int16", "int64", "uint8", "bool", "complex64"):
        dt = getattr(torch, name)
        v = torch.arange(12, dtype=torch.float64).reshape(3, 4) - 5
        dtypes[name] = (v > 0) if dt == torch.bool else (torch.complex(v, -v).to(dt) if dt.is_complex else v.to(dt))
    return {
        "model": net.state_dict(),
        "dtypes": dtypes,
        "views": {"base": base, "t": base.transpose(0, 2), "sl": base[1:, ::2, 1:4], "row": base[2],
                  "expand": torch.arange(3.0).reshape(3, 1).expand(3, 4), "empty": torch.zeros(0, 3),
                  "scalar": torch.tensor(7), "channels_last": torch.randn(1, 2, 3, 3).contiguous(
                      memory_format=torch.channels_last)},
        "param": torch.nn.Parameter(torch.randn(4)),
        "nested": {"list": [torch.ones(2), (torch.zeros(3, dtype=torch.int16),)]},
        "meta": {"epoch": 3, "name": "net", "lr": 0.1},
    }


def exotic_obj() -> dict:
    torch.manual_seed(1)
    x = torch.randn(4, 6)
    makers = {
        "q_tensor": lambda: torch.quantize_per_tensor(x, 0.1, 3, torch.quint8),
        "q_channel": lambda: torch.quantize_per_channel(x, torch.rand(4, dtype=torch.float64) + 0.05,
                                                        torch.randint(-2, 3, (4,)), 0, torch.qint8),
        "coo": lambda: x.relu().to_sparse(),
        "csr": lambda: x.relu().to_sparse_csr(),
        "conj": lambda: torch.randn(3, dtype=torch.complex64).conj(),
        "neg": lambda: torch.randn(3, dtype=torch.complex64).conj().imag,
        "meta": lambda: torch.empty(2, 3, device="meta"),
        "nested": lambda: torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(1, 3)]),
    }
    out = {}
    for name, make in makers.items():
        try:
            t = make()
            import io

            torch.save(t, io.BytesIO())  # only what this torch can save
            out[name] = t
        except Exception as e:  # noqa: BLE001 - older torch lacks some kinds
            print(f"  exotic.pt: skipping {name} ({type(e).__name__}: {e})", file=sys.stderr)
    return out


def training_obj() -> dict:
    torch.manual_seed(2)
    net = Net()
    adam = torch.optim.Adam(net.parameters(), lr=1e-3)
    sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for opt in (adam, sgd, adam):
        opt.zero_grad()
        net(torch.randn(2, 2, 5, 5)).sum().backward()
        opt.step()
    sched = torch.optim.lr_scheduler.StepLR(adam, step_size=2)
    sched.step()
    return {"epoch": 4, "global_step": 120, "state_dict": net.state_dict(), "optimizer_states": [adam.state_dict(),
            sgd.state_dict()], "lr_schedulers": [sched.state_dict()], "rng": torch.get_rng_state(),
            "metrics": OrderedDict(val_loss=torch.tensor(0.5), acc=0.75)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "data"))
    args = ap.parse_args()
    version = torch.__version__.split("+")[0]
    out = os.path.join(args.out, f"torch-{version}")
    os.makedirs(out, exist_ok=True)
    manifest = {"torch": torch.__version__, "python": platform.python_version(), "byteorder": sys.byteorder,
                "files": {}}

    def save(name: str, obj: object, fmt: str, **kw: object) -> None:
        path = os.path.join(out, name)
        torch.save(obj, path, **kw)
        manifest["files"][name] = {"format": fmt, "tensors": walk(obj, [])}

    save("state_dict.pt", state_dict_obj(), "zip")
    save("legacy.pt", state_dict_obj(), "legacy", _use_new_zipfile_serialization=False)
    save("exotic.pt", exotic_obj(), "zip")
    save("training.pt", training_obj(), "zip")
    torch.manual_seed(3)
    scripted = torch.jit.script(Net().eval())
    path = os.path.join(out, "scripted.pt")
    torch.jit.save(scripted, path)
    named = list(scripted.named_parameters()) + list(scripted.named_buffers())
    entries = []
    for dotted, t in named:
        entries.extend(describe(t, [["s", p] for p in dotted.split(".")]))
    manifest["files"]["scripted.pt"] = {"format": "torchscript", "tensors": entries}
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(out, n)) for n in os.listdir(out))
    print(f"wrote {out} ({total // 1024} KiB) with torch {torch.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
