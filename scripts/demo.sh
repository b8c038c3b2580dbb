#!/usr/bin/env bash
# The user story of `ckptfs mount`, end to end (used by `make demo`):
# make example checkpoints with torch, mount them, ls / du / cat a sidecar / getfattr / np.memmap against
# torch.load, unmount. Exits non-zero on any failure and leaves nothing mounted.
set -Eeuo pipefail

PY=${PYTHON:-$(command -v python || command -v python3)}
if command -v ckptfs >/dev/null 2>&1; then CKPTFS=(ckptfs); else CKPTFS=("$PY" -m ckptfs.cli); fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ckptfs-demo.XXXXXX")
MODEL=$WORK/resnet.pth
TRAIN=$WORK/train.ckpt
MNT=$WORK/model
TMNT=$WORK/train

mounted() { grep -qs " $1 fuse" /proc/mounts; }
cleanup() {
    local rc=$?
    for m in "$MNT" "$TMNT"; do
        if mounted "$m"; then
            "${CKPTFS[@]}" umount "$m" >/dev/null 2>&1 || fusermount3 -uz "$m" 2>/dev/null || fusermount -uz "$m" 2>/dev/null || true
        fi
    done
    if mounted "$MNT" || mounted "$TMNT"; then echo "demo: ERROR: something is still mounted" >&2; rc=1; fi
    rm -rf "$WORK"
    exit $rc
}
trap cleanup EXIT
trap 'echo "demo: FAILED at line $LINENO" >&2' ERR

if [ -t 1 ]; then B=$'\033[1m' C=$'\033[36m' R=$'\033[0m'; else B= C= R=; fi
say() { printf '\n%s# %s%s\n' "$B" "$*" "$R"; }
run() { printf '%s$ %s%s\n' "$C" "$*" "$R"; "$@"; }
cmd() { printf '%s$ ckptfs %s%s\n' "$C" "$*" "$R"; "${CKPTFS[@]}" "$@"; }

say "Two example checkpoints, written by torch.save"
"$PY" - "$MODEL" "$TRAIN" <<'EOF'
import sys
import torch
from torch import nn

class Block(nn.Module):
    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

class ResNetish(nn.Module):  # the shape of torchvision's resnet18, smaller
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        widths = [64, 128, 256, 512]
        c = 64
        for i, w in enumerate(widths, 1):
            setattr(self, f"layer{i}", nn.Sequential(Block(c, w, 1 if i == 1 else 2), Block(w, w, 1)))
            c = w
        self.fc = nn.Linear(512, 1000)

torch.manual_seed(0)
model = ResNetish()
torch.save(model.state_dict(), sys.argv[1])
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for p in model.parameters():
    p.grad = torch.randn_like(p) * 1e-3
opt.step()
sched = torch.optim.lr_scheduler.StepLR(opt, 10)
torch.save({"epoch": 12, "global_step": 34567, "model": model.state_dict(), "optimizer": opt.state_dict(),
            "lr_scheduler": sched.state_dict(), "hparams": {"lr": 1e-3, "arch": "resnet-ish", "amp": True},
            "best_metric": 0.7613}, sys.argv[2])
EOF
ls -lh "$MODEL" "$TRAIN" | sed "s#$WORK/##"

say "Mount the model: the command returns once the mount answers"
mkdir "$MNT" "$TMNT"
cmd mount "$MODEL" "$MNT"
run ls "$MNT"
run ls -l "$MNT/layer1/0/conv1" "$MNT/layer2/0/downsample"

say "Per-layer bytes, exact (sidecars excluded with --exclude='*.json')"
(cd "$MNT" && run du -sh --exclude='*.json' -- *)
(cd "$MNT" && run du -sb --exclude='*.json' layer4)

say "A sidecar, and the same as xattrs"
run cat "$MNT/fc/weight.json"
if command -v getfattr >/dev/null 2>&1; then
    run getfattr -d "$MNT/fc/weight"
else
    echo "(getfattr is not installed: the attr package; the xattrs are user.ckptfs.*)"
fi

say "np.memmap of the files equals torch.load's tensors, for every tensor"
"$PY" - "$MODEL" "$MNT" <<'EOF'
import json, os, sys
import numpy as np
import torch
import ckptfs
model, mnt = sys.argv[1], sys.argv[2]
ref = torch.load(model, weights_only=True)
index = json.load(open(os.path.join(mnt, ".ckptfs", "index.json")))
n = total = 0
for e in index["entries"]:
    if e["kind"] != "tensor":
        continue
    path = os.path.join(mnt, e["path"])
    meta = json.load(open(path + ".json"))
    t = ref[e["key"]].numpy()
    a = np.memmap(path, dtype=meta["numpy_dtype"], mode="r", shape=tuple(meta["shape"]))
    assert np.array_equal(a, t) and np.array_equal(ckptfs.memmap(path), t), e["key"]
    n += 1
    total += os.path.getsize(path)
print(f"{n} tensors, {total:,} bytes: np.memmap and ckptfs.memmap through the mount == torch.load")
w = ckptfs.memmap(os.path.join(mnt, "fc", "weight"))
print("fc.weight", w.shape, w.dtype, "sum", float(w.sum()))
EOF

say "A training checkpoint: nested dicts become directories, values are small files"
cmd mount "$TRAIN" "$TMNT"
run ls "$TMNT"
run ls "$TMNT/optimizer/state/0" "$TMNT/optimizer/param_groups/0"
printf 'epoch = %s, global_step = %s, lr = %s, arch = %s\n' "$(cat "$TMNT/epoch")" "$(cat "$TMNT/global_step")" \
    "$(cat "$TMNT/hparams/lr")" "$(cat "$TMNT/hparams/arch")"
run head -c 300 "$TMNT/.ckptfs/index.json"; echo

say "Read-only, whatever is tried"
if touch "$TMNT/epoch" 2>/dev/null || rm "$TMNT/epoch" 2>/dev/null; then
    echo "demo: ERROR: a write succeeded" >&2; exit 1
fi
touch "$TMNT/epoch" 2>&1 | sed 's/^/  /' || true

say "Unmount both"
cmd umount "$MNT"
cmd umount "$TMNT"
if mounted "$MNT" || mounted "$TMNT"; then echo "demo: ERROR: still mounted" >&2; exit 1; fi
echo "demo: OK (nothing left mounted)"
