"""Conversion cases: `ckptfs export` against safetensors' own conversion and `cp`; the first tensor through
safe_open on the mounted `--view safetensors` file against an exported file; a tiny transformers model loaded
from the view against its .bin directory. ckptfs is driven through its CLI (`ckptfs export SRC DST`,
`ckptfs mount --view safetensors SRC MNT`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

from .cases_mount import Mount
from .core import PKG_PARENT, CaseResult, Context, MeasureError, Row, judge, repeat
from .util import drop_file_cache, first_line, script, warm_file

#: Runs a command, prints its wall time and peak RSS. A small process of its own starts the command: one forked
#: from a big parent would carry the parent's RSS into its ru_maxrss (the kernel keeps the high-water mark of the
#: memory a process leaves at exec).
MEASURE = r"""
import json, os, subprocess, sys, time
t0 = time.perf_counter()
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
err = proc.stderr.read().decode(errors="replace")
_, status, usage = os.wait4(proc.pid, 0)
print(json.dumps({"seconds": time.perf_counter() - t0, "maxrss": usage.ru_maxrss * 1024,
                  "rc": os.waitstatus_to_exitcode(status), "stderr": err[-500:]}))
"""


def measured(cmd: list[str], timeout: float = 3600) -> dict:
    r = subprocess.run([sys.executable, "-c", MEASURE, *cmd], capture_output=True, text=True, timeout=timeout,
                       cwd=PKG_PARENT)
    if r.returncode != 0:
        raise MeasureError(first_line(r.stderr) or "the measuring process failed")
    out = json.loads(r.stdout)
    if out["rc"] != 0:
        raise MeasureError(f"{os.path.basename(cmd[0])} exited {out['rc']}: {first_line(out['stderr'])}")
    return out


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rm(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.unlink(path)


class ViewMount(Mount):
    """A `ckptfs mount --view safetensors` mount."""

    def command(self) -> list[str]:
        exe = script("ckptfs")
        if exe is None:
            raise MeasureError("the ckptfs command is not installed")
        return [exe, "mount", "--view", "safetensors", self.ckpt, self.mnt]


SAVE_FILE = """
import os, sys, torch
from safetensors.torch import save_file
src, dst = sys.argv[1], sys.argv[2]
sd = torch.load(src, weights_only=True)
save_file({k: v.contiguous() for k, v in sd.items()}, dst, metadata={"format": "pt"})
fd = os.open(dst, os.O_RDONLY); os.fsync(fd); os.close(fd)
"""


# --- export ----------------------------------------------------------------------------------------------------


def export_big(ctx: Context) -> CaseResult:
    src = ctx.data.get("big")
    size = os.path.getsize(src)
    res = CaseResult("export-1gb", f"`ckptfs export` of a {size / 1e9:.2f} GB checkpoint ({ctx.cfg.big_n} tensors) to "
                     "one .safetensors file, whole command",
                     "wall time, command start to exit, the output fsynced (the source warm in the page cache; "
                     "the output deleted before each run)", "s", 1.0, "lower",
                     "≥ 0.8× the speed of cp + fsync of the same bytes (ratio ckptfs/cp ≤ 1.25)",
                     extra_cols=[("maxrss", "peak RSS MB", 1e-6), ("gbps", "GB/s", 1.0)])
    exe = script("ckptfs")
    out = os.path.join(ctx.work, "export-out.safetensors")
    runs = []

    def timed(cmd: list[str], extra=None):
        def fn() -> dict:
            _rm(out)
            warm_file(src)
            r = measured(cmd)
            if extra is not None:
                t0 = time.perf_counter()
                extra()
                r["seconds"] += time.perf_counter() - t0
            r["gbps"] = size / r["seconds"] / 1e9
            return r
        return fn

    row = Row("ckptfs export", is_ckptfs=True)
    res.rows.append(row)
    if exe is None:
        row.error = "the ckptfs command is not installed"
    else:
        runs.append((row, timed([exe, "export", src, out, "-q"]), "seconds", None))
    cp_sync = Row("cp + fsync (same bytes)", note="coreutils cp of the .pth, then fsync of the copy: the floor for "
                  "writing these bytes durably")
    res.rows.append(cp_sync)
    runs.append((cp_sync, timed(["cp", src, out], lambda: _fsync(out)), "seconds", None))
    cp = Row("cp (no fsync)", note="returns before the data is on disk: not like for like")
    res.rows.append(cp)
    runs.append((cp, timed(["cp", src, out]), "seconds", None))
    peer = Row("safetensors.torch.save_file(torch.load(...)) + fsync",
               note="python -c, torch imported in the timed command")
    res.rows.append(peer)
    runs.append((peer, timed([sys.executable, "-c", SAVE_FILE, src, out]), "seconds", None))
    repeat(ctx, res, runs)
    _rm(out)
    judge(res, [("ckptfs/(cp + fsync)", lambda: res.ratio(cp_sync), lambda v: v <= 1.25, "≤ 1.25"),
                ("ckptfs peak RSS MB", lambda: (res.ckptfs.extra_median("maxrss") or 0) / 1e6, lambda v: v < 200,
                 "< 200")])
    return res


# --- first tensor: the view vs an exported file ---------------------------------------------------------------------

FIRST_TENSOR = r"""
import json, os, sys, time
from safetensors import safe_open
import torch  # (imported before the clock starts)
path, drop = sys.argv[1], sys.argv[2] == "1"
if drop:  # the file's own pages out of the page cache (a FUSE file has a page cache of its own)
    fd = os.open(path, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
t0 = time.perf_counter()
with safe_open(path, "pt") as f:
    key = next(iter(f.keys()))
    t = f.get_tensor(key)
    float(t.float().sum())
print(json.dumps({"seconds": time.perf_counter() - t0}))
"""


def _first_tensor(path: str, drop: bool) -> dict:
    r = subprocess.run([sys.executable, "-c", FIRST_TENSOR, path, "1" if drop else "0"], capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0:
        raise MeasureError(first_line(r.stderr))
    return json.loads(r.stdout.strip().splitlines()[-1])


def first_tensor(ctx: Context) -> CaseResult:
    src = ctx.data.get("big")
    res = CaseResult("view-first-tensor", f"first tensor through safe_open: the mounted view of a "
                     f"{os.path.getsize(src) / 1e9:.2f} GB .pth vs an exported .safetensors",
                     "safe_open + get_tensor(first key) + sum, in a fresh process (imports excluded); the .pth and "
                     "the exported file warm in the page cache, the mounted file's own cache dropped; the last two "
                     "rows start from nothing (mount, or export, included)", "ms", 1e3, "lower",
                     "view ≤ 5× the exported file; mount + first tensor < export + first tensor")
    exported = os.path.join(ctx.work, "first-exported.safetensors")
    exe = script("ckptfs")
    if exe is None:
        res.rows.append(Row("view", is_ckptfs=True, error="the ckptfs command is not installed"))
        return res
    _rm(exported)
    subprocess.run([exe, "export", src, exported, "-q"], check=True)
    warm_file(src)
    warm_file(exported)
    mnt = os.path.join(ctx.work, "mnt", "view-first")
    view = ViewMount(ctx, "ckptfs", src, mnt)
    try:
        view.start()
        name = os.path.splitext(os.path.basename(src))[0] + ".safetensors"
        vfile = os.path.join(mnt, name)
        with open(vfile, "rb") as a, open(exported, "rb") as b:  # the premise: the same bytes
            if a.read(1 << 20) != b.read(1 << 20):
                raise MeasureError("the view and the exported file differ")
        r_view = Row("safe_open on the mounted view", is_ckptfs=True)
        r_file = Row("safe_open on the exported file")
        res.rows += [r_view, r_file]
        runs = [(r_view, lambda: _first_tensor(vfile, True), "seconds", None),
                (r_file, lambda: _first_tensor(exported, False), "seconds", None)]
        repeat(ctx, res, runs)
    except MeasureError as e:
        res.rows.append(Row("safe_open on the mounted view", is_ckptfs=True, error=str(e)))
    finally:
        view.stop()

    if ctx.cfg.quick:  # (--quick keeps the harness alive; the rows below cost a mount and an export per run)
        judge(res, [("view/exported file", lambda: res.ratio(res.rows[1]), lambda v: v <= 5, "≤ 5")])
        _rm(exported)
        return res
    # from nothing: mount then first tensor, vs export then first tensor
    r_mount = Row("ckptfs mount --view safetensors + first tensor")
    r_export = Row("ckptfs export + first tensor")
    res.rows += [r_mount, r_export]

    def from_mount() -> dict:
        m = ViewMount(ctx, "ckptfs", src, mnt)
        try:
            t = m.start()
            name = os.path.splitext(os.path.basename(src))[0] + ".safetensors"
            return {"seconds": t + _first_tensor(os.path.join(mnt, name), False)["seconds"]}
        finally:
            m.stop()

    def from_export() -> dict:
        _rm(exported)
        t0 = time.perf_counter()
        subprocess.run([exe, "export", src, exported, "-q"], check=True)
        t = time.perf_counter() - t0
        return {"seconds": t + _first_tensor(exported, False)["seconds"]}

    repeat(ctx, res, [(r_mount, from_mount, "seconds", None), (r_export, from_export, "seconds", None)])
    _rm(exported)
    judge(res, [("view/exported file", lambda: res.ratio(res.rows[1]), lambda v: v <= 5, "≤ 5"),
                ("(mount + first)/(export + first)", lambda: r_mount.median / r_export.median, lambda v: v < 1, "< 1")])
    return res


# --- transformers: from_pretrained on the view ----------------------------------------------------------------------

MAKE_MODEL = r"""
import json, os, sys, torch, transformers
from huggingface_hub import split_torch_state_dict_into_shards
d, layers, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cfg = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=4, vocab_size=5000, n_positions=256,
                              bos_token_id=0, eos_token_id=0)
torch.manual_seed(0)
model = transformers.GPT2LMHeadModel(cfg)
cfg.save_pretrained(d)
sd = model.state_dict()
split = split_torch_state_dict_into_shards(sd, filename_pattern="pytorch_model{suffix}.bin", max_shard_size="20MB")
for name, keys in split.filename_to_tensors.items():
    torch.save({k: sd[k] for k in keys}, os.path.join(d, name))
if split.is_sharded:
    with open(os.path.join(d, "pytorch_model.bin.index.json"), "w") as f:
        f.write(json.dumps({"metadata": split.metadata, "weight_map": split.tensor_to_filename}, indent=2,
                           sort_keys=True) + "\n")
"""

LOAD_MODEL = r"""
import json, sys, time, warnings
warnings.filterwarnings("ignore")
import torch, transformers  # (imported before the clock starts)
transformers.logging.set_verbosity_error()
t0 = time.perf_counter()
model = transformers.GPT2LMHeadModel.from_pretrained(sys.argv[1])
t = time.perf_counter() - t0
print(json.dumps({"seconds": t, "params": sum(p.numel() for p in model.parameters())}))
"""


def _load(path: str) -> dict:
    r = subprocess.run([sys.executable, "-c", LOAD_MODEL, path], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise MeasureError(first_line(r.stderr))
    return json.loads(r.stdout.strip().splitlines()[-1])


def hf_load(ctx: Context) -> CaseResult:
    layers, width = (2, 64) if ctx.cfg.quick else (6, 256)
    d = os.path.join(ctx.work, "hf-gpt2")
    _rm(d)
    os.makedirs(d)
    r = subprocess.run([sys.executable, "-c", MAKE_MODEL, d, str(layers), str(width)], capture_output=True, text=True)
    size = sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d))
    res = CaseResult("view-hf-load", f"transformers from_pretrained of a small GPT-2 ({layers} layers, width {width}, "
                     f"{size / 1e6:.0f} MB of sharded .bin): the mounted --view safetensors directory vs the .bin "
                     "directory", "from_pretrained wall time in a fresh process (imports excluded), files warm",
                     "ms", 1e3, "lower", "view ≤ 1.5× the .bin directory", extra_cols=[("params", "parameters", 1.0)])
    if r.returncode != 0:
        res.rows.append(Row("view", is_ckptfs=True, error=first_line(r.stderr)))
        return res
    for n in os.listdir(d):
        warm_file(os.path.join(d, n))
    mnt = os.path.join(ctx.work, "mnt", "view-hf")
    view = ViewMount(ctx, "ckptfs", d, mnt)
    exported = os.path.join(ctx.work, "hf-exported")
    try:
        view.start()
        exe = script("ckptfs")
        _rm(exported)
        if not ctx.cfg.quick:
            subprocess.run([exe or "ckptfs", "export", d, exported, "-q"], check=True)
        r_view = Row("from_pretrained(mounted view)", is_ckptfs=True)
        r_bin = Row("from_pretrained(.bin directory)")
        r_exp = Row("from_pretrained(exported safetensors directory)")
        res.rows += [r_view, r_bin] + ([] if ctx.cfg.quick else [r_exp])

        def on_view() -> dict:
            for n in os.listdir(mnt):
                p = os.path.join(mnt, n)
                if os.path.isfile(p):
                    drop_file_cache(p)
            return _load(mnt)

        runs = [(r_view, on_view, "seconds", None), (r_bin, lambda: _load(d), "seconds", None)]
        if not ctx.cfg.quick:
            runs.append((r_exp, lambda: _load(exported), "seconds", None))
        repeat(ctx, res, runs)
    except MeasureError as e:
        res.rows.append(Row("from_pretrained(mounted view)", is_ckptfs=True, error=str(e)))
    finally:
        view.stop()
        _rm(exported)
    judge(res, [("view/.bin", lambda: res.ratio(res.rows[1]), lambda v: v <= 1.5, "≤ 1.5")])
    return res


CASES = {"export-1gb": export_big, "view-first-tensor": first_tensor, "view-hf-load": hf_load}
