"""Write the DCP test checkpoints with torch.distributed.checkpoint itself: ``python tests/dcp_save.py OUT``.

One interpreter imports torch, writes the single-process checkpoint, then starts 4 rank processes (fork:
they need not import torch again) that join a gloo group on CPU through a file store and write, with
``dcp.save``: a world-size-2 checkpoint (ranks 0-1, a subgroup), a world-size-4 one (1-D and 2-D device
meshes), the same compressed with the zstd stream transform and saved without rank coordination
(``use_collectives=False``: a ``__<rank>.metadata`` per rank), and an FSDP2 (``fully_shard``) model with its
Adam state. Every rank builds the same full tensors from a fixed seed; ``OUT/<name>.expected`` would be
redundant: the tests read the checkpoints back with ``dcp_to_torch_save``. Tiny tensors: the whole run
takes a few seconds after the import.
"""

from __future__ import annotations

import os
import sys
import types

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

WORLD = 4


def full_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    return {
        "rows": torch.randn(8, 6, generator=g),  # Shard(0): 2 rows per rank
        "cols": (torch.randn(6, 8, generator=g) * 10).to(torch.bfloat16),  # Shard(1)
        "grid": torch.arange(8 * 6, dtype=torch.int32).reshape(8, 6),  # 2-D mesh: Shard(0), Shard(1)
        "uneven": torch.randn(7, 3, generator=g),  # 7 rows over 4 ranks: 2, 2, 2, 1
        "few": torch.randn(3, 5, generator=g),  # 3 rows over 4 ranks: a rank holds nothing
        "rep": torch.arange(5, dtype=torch.int64),  # replicated: saved once
        "flags": torch.tensor([True, False, True]),
        "cube": torch.randn(4, 4, 4, generator=g),  # Shard(2): chunks of the last dimension
    }


def single(out: str) -> None:
    """World size 1 (no process group): plain tensors, views, values and a real optimizer's state."""
    g = torch.Generator().manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(5, 4, generator=g)).sum().backward()
    opt.step()
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    sd = {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "views": {"transposed": base.t(), "sliced": base[1:3, 2:], "scalar": torch.tensor(2.5),
                  "empty": torch.zeros(0, 3), "half": torch.randn(3, 3, generator=g).half()},
        "listed": [torch.ones(2), torch.zeros(3)],
        "epoch": 3, "lr": 0.5, "name": "run-1", "tags": ["a", "b"], "nothing": None, "raw": b"\x00\x01",
        # objects DCP does not look into are values: torch.save'd whole, tensors and all
        "objects": {"ns": types.SimpleNamespace(w=torch.arange(6.0).reshape(2, 3), k="v"),
                    "pair": {1: torch.ones(2, dtype=torch.int8)}.items().__iter__().__next__()},
    }
    dcp.save(sd, checkpoint_id=os.path.join(out, "w1"), no_dist=True)


def rank_main(rank: int, out: str, store: str) -> None:
    from torch.distributed.checkpoint._extension import ZStandard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor, init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    full = full_tensors()
    mesh = init_device_mesh("cpu", (WORLD,))
    mesh2 = init_device_mesh("cpu", (2, 2))
    sd4 = {
        "model": {
            "rows": distribute_tensor(full["rows"], mesh, [Shard(0)]),
            "cols": distribute_tensor(full["cols"], mesh, [Shard(1)]),
            "grid": distribute_tensor(full["grid"], mesh2, [Shard(0), Shard(1)]),
            "uneven": distribute_tensor(full["uneven"], mesh, [Shard(0)]),
            "few": distribute_tensor(full["few"], mesh, [Shard(0)]),
            "rep": distribute_tensor(full["rep"], mesh, [Replicate()]),
            "cube": distribute_tensor(full["cube"], mesh, [Shard(2)]),
            "flags": full["flags"],
        },
        "optim": {"state": {"rows": {"exp_avg": distribute_tensor(full["rows"] * 2, mesh, [Shard(0)]),
                                    "step": torch.tensor(3.0)}},
                  "param_groups": [{"lr": 0.01, "betas": (0.9, 0.999), "params": ["rows"]}]},
        "step": 11,
    }
    dcp.save(sd4, checkpoint_id=os.path.join(out, "w4"))
    dcp.save(sd4, storage_writer=dcp.FileSystemWriter(os.path.join(out, "w4z"), _extensions=[ZStandard()]))
    # without rank coordination: each rank writes its own __<rank>.metadata (replicated tensors once per rank)
    dcp.save(sd4, checkpoint_id=os.path.join(out, "w4nc"), use_collectives=False)
    # world size 2: ranks 0 and 1 in a subgroup (ranks 2 and 3 only take part in creating it)
    pair = dist.new_group([0, 1])
    if rank < 2:
        from torch.distributed.device_mesh import DeviceMesh

        mesh_pair = DeviceMesh("cpu", [0, 1])
        sd2 = {"rows": distribute_tensor(full["rows"], mesh_pair, [Shard(0)]),
               "cols": distribute_tensor(full["cols"], mesh_pair, [Shard(1)]),
               "rep": distribute_tensor(full["rep"], mesh_pair, [Replicate()]),
               "uneven": distribute_tensor(full["uneven"], mesh_pair, [Shard(0)]),
               "meta": {"epoch": 2, "loss": 0.25}}
        dcp.save(sd2, checkpoint_id=os.path.join(out, "w2"), process_group=pair)
    dist.barrier()
    fsdp(out, rank)
    dist.destroy_process_group()


def fsdp(out: str, rank: int) -> None:
    """A model sharded with FSDP2 and its Adam state, saved as training code does (get_state_dict)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 4))
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.001)
    model(torch.randn(3, 6, generator=torch.Generator().manual_seed(rank))).sum().backward()
    opt.step()
    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=os.path.join(out, "fsdp"))


def main() -> None:
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    single(out)
    store = os.path.join(out, ".store")
    mp.start_processes(rank_main, args=(out, store), nprocs=WORLD, start_method="fork")
    os.unlink(store) if os.path.exists(store) else None


if __name__ == "__main__":
    main()
