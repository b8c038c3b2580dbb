"""transformers loads a mounted ``--view safetensors`` model directory: a small GPT-2 built offline from a
config (no download), its weights saved as sharded .bin files in the layout transformers wrote them
(huggingface_hub's split, torch.save per shard, the index); ``from_pretrained`` on the mount (safetensors
files only, memory-mapped by safe_open over FUSE) gives the same parameters and the same outputs."""

from __future__ import annotations

import os

import pytest
import torch
import transformers
from helpers import run_ckptfs, write_hf_bin_shards

pytestmark = pytest.mark.mount


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpt2")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=500, n_positions=64, bos_token_id=0,
                                  eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # no parameter keeps its initial value (a missing one would be re-initialised alike)
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    cfg.save_pretrained(d)
    sd = model.state_dict()
    assert sd["lm_head.weight"].data_ptr() == sd["transformer.wte.weight"].data_ptr()  # tied, as GPT-2 has it
    shards = write_hf_bin_shards(d, sd, max_shard_size=200_000)
    assert len(shards) > 2 and not any(n.endswith(".safetensors") for n in os.listdir(d))
    return d, model


def same_model(a, b) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    ids = torch.tensor([[1, 5, 42, 7, 99, 3]])
    with torch.no_grad():
        assert torch.equal(a(ids).logits, b(ids).logits)


def test_from_pretrained_on_the_mounted_view(model_dir, mount):
    d, model = model_dir
    m = mount(d, "--view", "safetensors")
    names = os.listdir(m.path)
    assert "model.safetensors.index.json" in names and not any(n.endswith(".bin") for n in names)
    loaded, info = transformers.GPT2LMHeadModel.from_pretrained(m.path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    same_model(model, loaded.eval())


def test_from_pretrained_on_an_exported_directory(model_dir, tmp_path):
    d, model = model_dir
    out = tmp_path / "exported"
    r = run_ckptfs("export", str(d), str(out), "--max-shard-size", "100KB")
    assert r.returncode == 0, r.stderr
    assert (out / "config.json").read_bytes() == (d / "config.json").read_bytes()
    loaded, info = transformers.GPT2LMHeadModel.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    same_model(model, loaded.eval())
