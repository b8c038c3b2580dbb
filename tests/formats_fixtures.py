"""Fixtures of the directory formats (a pytest plugin registered in conftest.py): checkpoints written by the
real writers, once per test session.

* ``dcp_checkpoints``: ``torch.distributed.checkpoint.save`` with world sizes 1, 2 and 4 (gloo on CPU, the
  ranks started by tests/dcp_save.py), a zstd-compressed save and an FSDP2 model with its optimizer;
* ``hf_sharded``: a state_dict saved by huggingface_hub's ``save_torch_state_dict`` as safetensors shards
  and as ``torch.save`` shards, each with its index and the files a model directory carries.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import MODEL_FILES, sharded_state_dict

HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def dcp_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of DCP checkpoints: w1, w2, w4, w4z (zstd), fsdp (see tests/dcp_save.py)."""
    out = tmp_path_factory.mktemp("dcp")
    r = subprocess.run([sys.executable, str(HERE / "dcp_save.py"), str(out)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return out


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
