"""Fuzz ckptfs's C scanner (ckptfs/model/_tablescan.c) under AddressSanitizer and UndefinedBehaviorSanitizer.

    python scripts/fuzz_tablescan.py [--n 1000000] [--seed 0]        # make fuzz-c

Builds a sanitized copy of the module in a temporary directory, then scans mutated copies of state_dict
pickles torch wrote (bit flips, overwrites, insertions, deletions, whole opcodes inserted, pieces repeated),
with random budgets, storage-key prefixes and first arena sizes (down to one slot, so that the arena's
collector runs at nearly every tuple). A memory error or undefined behaviour aborts the run with the
sanitizer's report; every pickle the scan accepts is also indexed by the unpickling path (the C unpickler
and ckptfs.model.table.tabulate), and any difference between the two is printed and fails the run.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from collections import OrderedDict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "ckptfs" / "model" / "_tablescan.c"
#: whole opcodes a mutation may insert (each complete, so that more mutants stay parsable)
SNIPPETS = [b"0", b"1", b"2", b"(", b")", b"N", b"\x88", b"\x89", b"K\x05", b"J\xff\xff\xff\xff",
            b"\x8a\x09" + b"\x01" * 9, b"\x8a\x09" + b"\xff" * 9, b"t", b"\x85", b"\x86", b"\x87", b"]", b"a", b"e",
            b"}", b"s", b"u", b"d", b"l", b"q\x03", b"h\x00", b"h\x03", b"\x94", b"R", b"b", b"Q",
            b"X\x01\x00\x00\x00a", b"\x8c\x01b", b"G\x3f\xf0" + b"\x00" * 6, b"C\x01z", b".", b"r\xff\xff\x00\x00",
            b"j\x01\x00\x00\x00", b"\x95\x10" + b"\x00" * 7, b"\x93", b"\x80\x05", b"ccollections\nOrderedDict\n",
            b"ctorch._utils\n_rebuild_tensor_v2\n", b"ctorch\nFloatStorage\n"]


def build(out: Path) -> Path:
    so = out / "_tablescan.so"
    cmd = ["gcc", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
           "-fno-omit-frame-pointer", "-fPIC", "-shared", f"-I{sysconfig.get_paths()['include']}", str(SOURCE),
           "-o", str(so)]
    subprocess.run(cmd, check=True)
    return so


def seeds() -> list[bytes]:
    import torch

    g = torch.Generator().manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.BatchNorm2d(3), torch.nn.LSTM(4, 4),
                              torch.nn.Embedding(5, 4))
    w = torch.randn(6, 4, generator=g)
    meta = OrderedDict([("w", w), ("t", w.t()), ("n", 3), ("s", "x"), ("f", 0.5), ("z", None)])
    meta._metadata = OrderedDict([("", {"version": 1}), ("x", [1, (2, 3), {"y": None}])])  # type: ignore[attr-defined]
    objs = [(net.state_dict(), {}), (net.state_dict(), {"pickle_protocol": 4}), (meta, {}),
            ({f"w{i}": w[i % 6] for i in range(300)}, {}), ({"a": w, "b": w, "c": w[1:], "big": 2**40}, {})]
    out = []
    for obj, kw in objs:
        buf = io.BytesIO()
        torch.save(obj, buf, **kw)
        with zipfile.ZipFile(buf) as z:
            out.append(z.read(next(n for n in z.namelist() if n.endswith("data.pkl"))))
    return out


def mutate(rng: random.Random, data: bytes) -> bytes:
    d = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        kind, at = rng.randrange(6), rng.randrange(len(d) + 1)
        if kind == 0 and at < len(d):
            d[at] ^= 1 << rng.randrange(8)
        elif kind == 1 and at < len(d):
            d[at] = rng.randrange(256)
        elif kind == 2:
            d[at:at] = bytes([rng.randrange(256)])
        elif kind == 3:
            del d[at : at + rng.randint(1, 16)]
        elif kind == 4:
            d[at:at] = rng.choice(SNIPPETS)
        elif kind == 5 and d:
            j = rng.randrange(len(d))
            d[at:at] = d[j : j + rng.randint(1, 64)]
    return bytes(d)


def run(so_dir: Path, n: int, seed: int) -> int:
    sys.path.insert(0, str(so_dir))
    import _tablescan as sanitized  # type: ignore[import-not-found]

    sys.path.insert(0, str(ROOT))
    import ckptfs
    from ckptfs.model import table
    from ckptfs.pickle.nodes import PickledOrderedDict
    from ckptfs.pickle.unpickler import unpickle

    codes, dtype_of, stypes = table._globals()
    pool = seeds()
    rng = random.Random(seed)
    accepted = 0
    start = time.monotonic()
    for i in range(n):
        data = mutate(rng, rng.choice(pool))
        prefix = None if rng.random() < 0.7 else rng.choice(["", "p/", "é/"])
        raw = None if prefix is None else prefix.encode("utf-8", "surrogatepass")
        budget = rng.choice([1 << 12, 1 << 20, 64 << 20])
        arena = rng.choice([1, 3, 16, 1 << 14])
        found = sanitized.scan(data, codes, dtype_of, budget, 254, raw, PickledOrderedDict, arena)
        if found is None:
            continue
        accepted += 1
        table.SCAN_ARENA = arena
        scanned = table.scan(data, prefix)
        try:
            obj, _, sent = unpickle(data, limits=ckptfs.Limits(max_unpickle_seconds=20), key_prefix=prefix,
                                    digest=table.digest)
            ref: object = table.decode(sent) if sent is not None else table.tabulate(obj)
        except (table.Declined, ckptfs.CkptfsError) as e:
            ref = e
        if _columns(scanned) != _columns(ref):
            print(f"DIFFERENCE at example {i}: {data!r} prefix={prefix!r}\n  scan: {scanned}\n  unpickled: {ref}")
            return 1
    print(f"{n} mutated pickles in {time.monotonic() - start:.0f} s: {accepted} accepted, each as the unpickling "
          "path reads it; no sanitizer report")
    return 0


def _columns(t: object) -> object:
    from ckptfs.model import table

    return t.plain() if isinstance(t, table.TensorTable) else repr(t)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="mutated pickles to scan")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--child", metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return run(Path(args.child), args.n, args.seed)
    with tempfile.TemporaryDirectory(prefix="ckptfs-fuzz-c-") as tmp:
        build(Path(tmp))
        libs = [subprocess.run(["gcc", f"-print-file-name={lib}"], check=True, capture_output=True,
                               text=True).stdout.strip() for lib in ("libasan.so", "libubsan.so")]
        env = dict(os.environ, LD_PRELOAD=":".join(libs), ASAN_OPTIONS="detect_leaks=0:abort_on_error=1",
                   UBSAN_OPTIONS="print_stacktrace=1")
        return subprocess.run([sys.executable, __file__, "--child", tmp, "--n", str(args.n), "--seed",
                               str(args.seed)], env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
