"""Training checkpoints: optimizer state, RNG states, Lightning checkpoints and arbitrary user classes,
none of which is ever imported or run (checked with an audit hook)."""

from __future__ import annotations

import argparse
import random
from collections import OrderedDict

import numpy as np
import pytest
import torch

import ckptfs
import ckptfs.container.legacy  # noqa: F401 - imported before the audit window
import ckptfs.container.torchzip  # noqa: F401
import ckptfs.torchio.tensors  # noqa: F401
from ckptfs.torchio.tensors import OpaqueValue
from craft import throwaway_module
from helpers import USER_CLASSES, audited, lookup, torch_bytes

def _training_state():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        for opt in (adam, sgd):
            opt.zero_grad()
            model(torch.randn(5, 4)).sum().backward()
            opt.step()
    sched = torch.optim.lr_scheduler.StepLR(adam, step_size=2)
    sched.step()
    return model, adam, sgd, sched


def test_lightning_style_checkpoint_without_importing_anything(tmp_path):
    model, adam, sgd, sched = _training_state()
    with throwaway_module("ckptfs_test_userclasses", USER_CLASSES, tmp_path) as mod:
        cfg = mod.DictConfig({"model": {"hidden": 8}, "init_scale": torch.tensor([0.5, 2.0]),
                              "layers": mod.ListConfig([4, 8, 2])})
        ckpt_obj = {
            "epoch": 3, "global_step": 1200, "pytorch-lightning_version": "2.1.0",
            "state_dict": model.state_dict(),
            "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"ready": 4, "completed": 3}}}},
            "callbacks": {"ModelCheckpoint{'monitor': 'val_loss', 'mode': 'min'}": {
                "best_model_score": torch.tensor(0.25), "best_model_path": "/ckpts/epoch=2.ckpt",
                "best_k_models": {"/ckpts/epoch=2.ckpt": torch.tensor(0.25)}}},
            "optimizer_states": [adam.state_dict(), sgd.state_dict()],
            "lr_schedulers": [sched.state_dict()],
            "hparams_name": "kwargs",
            "hyper_parameters": mod.AttributeDict(lr=1e-3, cfg=cfg, mode=mod.Mode.TRAIN,
                                                  train=mod.TrainConfig(1e-3, (0.9, 0.999), [1, 2],
                                                                        init=torch.arange(3.0))),
            "args": argparse.Namespace(batch_size=32, data="/data", weights=torch.ones(2)),
            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
                    "cuda": [torch.get_rng_state()]},
            "metrics": OrderedDict(val_loss=torch.tensor(0.31), acc=0.9),
        }
        p = tmp_path / "lightning.ckpt"
        torch.save(ckpt_obj, p)
        ref = torch.load(p, weights_only=False)  # torch needs the classes (and runs their code) to load it
        exploit = tmp_path / "exploit.ckpt"
        torch.save({"w": torch.ones(2), "evil": mod.Exploit()}, exploit)
    with pytest.raises(Exception):  # noqa: B017 - torch.load refuses the whole file without them
        torch.load(p, weights_only=False)
    with pytest.raises(Exception):  # noqa: B017
        torch.load(p, weights_only=True)

    with ckptfs.open(tmp_path / "exploit.ckpt"):  # warm up lazily imported modules of ckptfs itself
        pass
    with audited():
        ckpt = ckptfs.open(p)
        keys = ckpt.keys()
        n = 0
        for i in ckpt.index.tensors():
            key = ckpt.index.keys[i]
            want = lookup(ref, ckpt.index.path(i))
            if isinstance(want, np.ndarray):  # numpy's RNG state (a native-order uint32 array, saved as it is)
                assert ckpt.read(key) == np.ascontiguousarray(want).tobytes()
            else:
                assert ckpt.read(key) == torch_bytes(want), key
            assert ckpt.meta(key).error is None
            n += 1
        values = {k: ckpt.value(k) for k in keys if ckpt.meta(k).kind == "leaf"}
        metas = [ckpt.meta(k).to_dict() for k in keys]
        info = ckpt.info()
    assert metas and n == info["tensors"]

    unknown = set(ckpt.unknown_globals)
    assert unknown == {"ckptfs_test_userclasses.DictConfig", "ckptfs_test_userclasses.ListConfig",
                       "ckptfs_test_userclasses.AttributeDict", "ckptfs_test_userclasses.Mode",
                       "ckptfs_test_userclasses.TrainConfig", "argparse.Namespace",
                       "builtins.dict"}  # the class `dict` as a value in DictConfig's _metadata
    # every tensor torch.load returns is indexed, wherever it sits (plain containers and opaque objects)
    assert "optimizer_states.0.state.0.exp_avg" in keys and "optimizer_states.1.state.3.momentum_buffer" in keys
    assert values["optimizer_states.0.param_groups.0.lr"] == 1e-3
    assert values["optimizer_states.0.param_groups.0.params.3"] == 3
    assert ckpt.meta("hyper_parameters").type == "ckptfs_test_userclasses.AttributeDict"
    assert ckpt.meta("hyper_parameters.cfg").type == "ckptfs_test_userclasses.DictConfig"
    assert ckpt.numpy("hyper_parameters.cfg._content.init_scale").tolist() == [0.5, 2.0]
    assert values["hyper_parameters.cfg._content.layers._content.2"] == 2
    assert values["hyper_parameters.mode.__args__.0"] == "train"
    assert values["hyper_parameters.train.betas.1"] == 0.999
    assert ckpt.numpy("hyper_parameters.train.init").tolist() == [0.0, 1.0, 2.0]
    assert values["args.batch_size"] == 32 and ckpt.numpy("args.weights").tolist() == [1.0, 1.0]
    assert ckpt.meta("rng.torch").dtype == "uint8"
    assert ckpt.read("rng.torch") == ref["rng"]["torch"].numpy().tobytes()
    np.testing.assert_array_equal(ckpt.numpy("rng.numpy.1"), ref["rng"]["numpy"][1])
    assert values["rng.numpy.0"] == "MT19937" and values["rng.python.0"] == 3
    assert values["callbacks.ModelCheckpoint{'monitor': 'val_loss', 'mode': 'min'}.best_model_path"] == \
        "/ckpts/epoch=2.ckpt"
    # the lazy state_dict API gives plain data for what it did not import
    sd = ckptfs.load(p)
    hp = sd["hyper_parameters"]
    assert isinstance(hp, OpaqueValue) and hp.qualname == "ckptfs_test_userclasses.AttributeDict"
    assert hp.items["lr"] == 1e-3
    model.load_state_dict(sd["state_dict"])
    assert torch.equal(sd["optimizer_states"][0]["state"][0]["exp_avg"], ref["optimizer_states"][0]["state"][0]["exp_avg"])
    ckpt.close()


def test_exploit_class_is_never_called(tmp_path):
    with throwaway_module("ckptfs_test_userclasses", USER_CLASSES, tmp_path) as mod:
        p = tmp_path / "exploit.ckpt"
        torch.save({"w": torch.ones(2), "evil": mod.Exploit()}, p)
    marker = "/tmp/ckptfs-pwned"
    import os

    if os.path.exists(marker):
        os.unlink(marker)
    with ckptfs.open(tmp_path / "exploit.ckpt"):
        pass
    with audited(), ckptfs.open(p) as ckpt:
        assert ckpt.numpy("w").tolist() == [1.0, 1.0]
        assert ckpt.meta("evil").type == "posix.system"  # recorded, never called
        assert ckpt.value("evil.__args__.0") == "echo pwned > /tmp/ckptfs-pwned"
        sd = ckptfs.load(p)
        assert isinstance(sd["evil"], OpaqueValue)
    assert not os.path.exists(marker)
    with pytest.raises(ckptfs.UnsafePickleError):
        ckptfs.open(p, strict=True)


@pytest.mark.parametrize("legacy", [False, True])
def test_optimizer_state_dicts(tmp_path, legacy):
    model, adam, sgd, sched = _training_state()
    obj = {"model": model.state_dict(), "adam": adam.state_dict(), "sgd": sgd.state_dict(),
           "sched": sched.state_dict(), "epoch": 7, "best": float("inf"), "rng": torch.get_rng_state()}
    p = tmp_path / "train.pt"
    torch.save(obj, p, _use_new_zipfile_serialization=not legacy)
    ref = torch.load(p, weights_only=True)
    with audited(), ckptfs.open(p) as ckpt:
        assert ckpt.format == ("legacy" if legacy else "zip")
        for i in ckpt.index.tensors():
            assert ckpt.read(ckpt.index.keys[i]) == torch_bytes(lookup(ref, ckpt.index.path(i)))
        assert ckpt.value("epoch") == 7 and ckpt.value("best") == float("inf")
        assert ckpt.meta("adam.state.0.step").shape == ()
        assert ckpt.value("sched.step_size") == 2
        assert not ckpt.unknown_globals  # weights_only-safe content: every global is on the allowlist
