"""The generated checkpoints: made on first use (each in a fresh process, by benchmarks._gen) and
recorded in a manifest so that ``--data-dir DIR`` can reuse them across runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass

from .config import Config


@dataclass(frozen=True)
class Dataset:
    name: str
    kind: str
    params: dict
    ext: str = "pth"
    description: str = ""

    def key(self) -> str:
        return json.dumps([self.kind, self.params, self.ext], sort_keys=True)


def datasets(cfg: Config) -> dict[str, Dataset]:
    d = [
        Dataset("tiny", "tiny", {"n": cfg.tiny_n, "numel": cfg.tiny_numel},
                description=f"{cfg.tiny_n:,} tiny float32 tensors ({cfg.tiny_numel} elements each), flat state_dict"),
        Dataset("big", "big", {"total_bytes": cfg.big_bytes, "n": cfg.big_n},
                description=f"{cfg.big_n} float32 tensors, {cfg.big_bytes / 1e9:.2f} GB in total"),
        Dataset("train", "train", {"width": cfg.train_width, "layers": cfg.train_layers, "vocab": cfg.train_vocab},
                description=f"training checkpoint: a {cfg.train_layers}-block transformer-like MLP (width "
                            f"{cfg.train_width}), Adam state (exp_avg, exp_avg_sq, step), scheduler, hyper-parameters"),
        Dataset("huge", "tiny", {"n": cfg.huge_n, "numel": cfg.tiny_numel},
                description=f"{cfg.huge_n:,} tiny float32 tensors"),
        Dataset("mount", "mount", {"seq_bytes": cfg.seq_bytes, "square": cfg.square},
                description=f"seq: {cfg.seq_bytes >> 20} MiB float32; contig: {cfg.square}x{cfg.square} float32; "
                            f"transposed: the .t() view of another {cfg.square}x{cfg.square} float32"),
        Dataset("model", "model", {"width": cfg.model_width, "layers": cfg.model_layers},
                description=f"state_dict of nn.Sequential of {cfg.model_layers} x Linear({cfg.model_width}, "
                            f"{cfg.model_width})"),
        Dataset("daemon", "daemon", {"total_bytes": cfg.daemon_bytes, "tensor_bytes": cfg.daemon_tensor_bytes},
                description=f"{cfg.daemon_bytes // cfg.daemon_tensor_bytes} float32 tensors of "
                            f"{cfg.daemon_tensor_bytes >> 20} MiB, {cfg.daemon_bytes / 1e9:.2f} GB in total"),
        Dataset("readers", "readers", {"n": cfg.readers_n, "tensor_bytes": cfg.readers_tensor_bytes},
                description=f"{cfg.readers_n} float32 tensors of {cfg.readers_tensor_bytes >> 20} MiB (one per "
                            "concurrent reader)"),
        Dataset("sparse-small", "sparse", {"total_bytes": cfg.sparse_small, "n": cfg.sparse_n},
                description=f"{cfg.sparse_n} float32 tensors, {cfg.sparse_small / 2 ** 30:g} GiB, written as a torch "
                            "zip whose data records are holes (sparse file)"),
        Dataset("sparse-large", "sparse", {"total_bytes": cfg.sparse_large, "n": cfg.sparse_n},
                description=f"{cfg.sparse_n} float32 tensors, {cfg.sparse_large / 2 ** 30:g} GiB, written as a torch "
                            "zip whose data records are holes (sparse file)"),
    ]
    d += [
        Dataset("shards_st", "shards", {"n_shards": 30, "layers": cfg.shard_layers, "numel": cfg.shard_numel,
                                        "safe": True}, ext="d",
                description=f"30 safetensors shards + model.safetensors.index.json ({cfg.shard_layers * 9} "
                            f"tensors of {cfg.shard_numel} float32), written by huggingface_hub"),
        Dataset("shards_bin", "shards", {"n_shards": 30, "layers": cfg.shard_layers, "numel": cfg.shard_numel,
                                         "safe": False}, ext="d",
                description="the same as 30 torch.save shards + pytorch_model.bin.index.json"),
        Dataset("dcp", "dcp", {"n": cfg.dcp_n}, ext="d",
                description=f"a DCP checkpoint (torch.distributed.checkpoint.save) of {cfg.dcp_n:,} entries"),
        Dataset("bigchanged", "changed", {"source": "big"},
                description="big.pth with one element of every tensor changed (diff)"),
        Dataset("bigcopy", "copy", {"source": "big"}, description="a byte-identical copy of big.pth (diff)"),
    ]
    for n in cfg.scale_sizes:
        d.append(Dataset(f"scale{n}", "tiny", {"n": n, "numel": cfg.tiny_numel},
                         description=f"{n:,} tiny float32 tensors (scale curve)"))
    top = cfg.scale_sizes[-1]
    d.append(Dataset("flat", "flat", {"n": top, "numel": cfg.tiny_numel},
                     description=f"{top:,} tiny float32 tensors under top-level keys (one directory of {top:,} "
                                 "entries when mounted)"))
    out = {x.name: x for x in d}
    for base in ("tiny", "big", "train", "flat", *(f"scale{n}" for n in cfg.scale_sizes)):
        out[base + ".st"] = Dataset(base + ".st", "safetensors", {"source": base}, ext="safetensors",
                                    description=f"the tensors of {base}.pth converted to safetensors")
    return out


class DataDir:
    def __init__(self, root: str, cfg: Config, log) -> None:
        self.root = root
        self.cfg = cfg
        self.log = log
        self.sets = datasets(cfg)
        self.manifest_path = os.path.join(root, "manifest.json")
        try:
            with open(self.manifest_path) as f:
                self.manifest = json.load(f)
        except (OSError, ValueError):
            self.manifest = {}
        self.gen_seconds: dict[str, float] = {}

    def path(self, name: str) -> str:
        ds = self.sets[name]
        base = name.split(".")[0]
        return os.path.join(self.root, f"{base}.{ds.ext}")

    def _ready(self, name: str) -> bool:
        ds = self.sets[name]
        p = self.path(name)
        entry = self.manifest.get(name)
        return bool(entry and entry.get("key") == ds.key() and os.path.exists(p)
                    and _tree_size(p) == entry.get("size"))

    def get(self, name: str) -> str:
        """The path of a dataset, generating it (and what it is converted from) if needed."""
        self.prepare([name])
        return self.path(name)

    def prepare(self, names: list[str]) -> None:
        """Generate every missing dataset of ``names`` (and their sources) in one generator process."""
        todo: list[str] = []
        for name in names:
            ds = self.sets[name]
            derived = ds.kind in ("safetensors", "changed", "copy")
            if derived and not self._ready(ds.params["source"]) and ds.params["source"] not in todo:
                todo.append(ds.params["source"])
            if not self._ready(name) and name not in todo:
                todo.append(name)
        if not todo:
            return
        specs = []
        for name in todo:
            ds = self.sets[name]
            p = self.path(name)
            if os.path.isdir(p):
                import shutil

                shutil.rmtree(p)
            elif os.path.exists(p):
                os.unlink(p)
            params = dict(ds.params)
            if ds.kind in ("safetensors", "changed", "copy"):
                params["source"] = self.path(params["source"])
            specs.append({"kind": ds.kind, "path": p, "params": params})
        self.log(f"generating {', '.join(todo)} in {self.root} ...")
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks._gen", json.dumps(specs)], cwd=_pkg_parent(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = proc.communicate()
        done = {}
        for line in out.splitlines():
            if line.startswith("GEN "):
                d = json.loads(line[4:])
                done[d["path"]] = d
        for name in todo:
            ds = self.sets[name]
            d = done.get(self.path(name))
            if d is None:
                continue
            self.gen_seconds[name] = d["seconds"]
            self.manifest[name] = {"key": ds.key(), "size": d["size"], "dataset": asdict(ds)}
            self.log(f"  {name}: {d['size'] / 1e6:,.1f} MB in {d['seconds']:.1f} s")
        with open(self.manifest_path + ".tmp", "w") as f:
            json.dump(self.manifest, f, indent=1)
        os.replace(self.manifest_path + ".tmp", self.manifest_path)
        if proc.returncode != 0:
            raise RuntimeError(f"generating {', '.join(todo)} failed:\n{err[-3000:]}")

    def size(self, name: str) -> int:
        return _tree_size(self.get(name))


def _tree_size(path: str) -> int:
    if not os.path.isdir(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def _pkg_parent() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
