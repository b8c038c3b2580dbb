"""Fixtures of the directory formats (a pytest plugin registered in conftest.py): checkpoints written by the
real writers, once per test session.

* ``dcp_checkpoints``: ``torch.distributed.checkpoint.save`` with world sizes 1, 2 and 4 (gloo on CPU, the
  ranks started by tests/dcp_save.py), a zstd-compressed save and an FSDP2 model with its optimizer;
* ``hf_sharded``: a state_dict saved by huggingface_hub's ``save_torch_state_dict`` as safetensors shards
  and as ``torch.save`` shards, each with its index and the files a model directory carries.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def dcp_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of DCP checkpoints: w1, w2, w4, w4z (zstd), fsdp (see tests/dcp_save.py)."""
    out = tmp_path_factory.mktemp("dcp")
    r = subprocess.run([sys.executable, str(HERE / "dcp_save.py"), str(out)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return out


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


@pytest.fixture(scope="session")
def hf_sharded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{"safetensors": dir, "bin": dir}: the same state_dict in about 8 shards each, with model files."""
    from huggingface_hub import save_torch_state_dict

    base = tmp_path_factory.mktemp("hf")
    sd = sharded_state_dict()
    out = {}
    for kind, safe in (("safetensors", True), ("bin", False)):
        d = base / kind
        d.mkdir()
        save_torch_state_dict(sd, d, max_shard_size=3000, safe_serialization=safe)
        for name, data in MODEL_FILES.items():
            (d / name).write_bytes(data)
        out[kind] = d
    return out
