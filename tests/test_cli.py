"""The ckptfs command: ls / info / check output, exit codes and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import pytest
import torch


def run(*args: str, check: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ckptfs.cli", *args], capture_output=True, text=True, check=check)


@pytest.fixture()
def model_file(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.LayerNorm(4))
    obj = {"model": model.state_dict(), "epoch": 3, "lr": 0.01, "half": torch.ones(3, dtype=torch.bfloat16)}
    p = tmp_path / "m.pth"
    torch.save(obj, p)
    return p


def test_ls_table_tree_json_and_patterns(model_file):
    r = run("ls", str(model_file), check=True)
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["KEY", "DTYPE", "SHAPE", "SIZE"]
    row = next(line for line in lines if line.startswith("model.0.weight"))
    assert "float32" in row and "[4, 8]" in row and "128 B" in row
    assert any(line.startswith("epoch") and line.rstrip().endswith("3") for line in lines)
    assert "tensors" in r.stderr
    r = run("ls", "--tree", str(model_file), check=True)
    assert "model/" in r.stdout and "├──" in r.stdout
    r = run("ls", "--json", str(model_file), "model.1.*", check=True)
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert {d["key"] for d in rows} == {"model.1.weight", "model.1.bias"}
    assert rows[0]["numpy_dtype"] == "<f4" and rows[0]["shape"] == [4]
    r = run("ls", "-b", str(model_file), "half", check=True)
    assert " 6" in r.stdout.splitlines()[1]


def test_info_text_and_json(model_file):
    r = run("info", str(model_file), check=True)
    assert "format      zip" in r.stdout and "tensors     5" in r.stdout and "bfloat16" in r.stdout
    assert "elements    47\n" in r.stdout  # 8*4 + 4 + 4 + 4 + 3; no "(47)" below a thousand
    info = json.loads(run("info", "--json", str(model_file), check=True).stdout)
    assert info["tensors"] == 5 and info["format"] == "zip" and info["byteorder"] == "little"
    assert info["bytes_per_dtype"]["bfloat16"] == 6


def test_check_green_and_red(model_file, tmp_path):
    r = run("check", "-v", str(model_file))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "5 tensors identical, 0 mismatched" in r.stdout and r.stdout.count("OK ") == 5
    # a record whose bytes were changed after writing: torch reads the new bytes, and so must ckptfs;
    # but a storage whose declared size disagrees with its record is refused by ckptfs while torch
    # (mmap) reads it - the check reports it red.
    bad = tmp_path / "bad.pth"
    with zipfile.ZipFile(model_file) as zin, zipfile.ZipFile(bad, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith("data/0"):
                data = data + b"\x00" * 8  # record longer than the pickle declares
            zout.writestr(info, data)
    r = run("check", str(bad))
    assert r.returncode == 1, r.stdout + r.stderr  # a mismatch: the answer is "no" (docs/cli.md)
    assert "FAIL" in r.stdout and "1 mismatched" in r.stdout


def test_errors_are_one_line_with_exit_status(tmp_path):
    missing = tmp_path / "nope.pth"
    r = run("ls", str(missing))
    assert r.returncode == 2 and r.stdout == ""  # trouble (docs/cli.md: 2 for every error)
    assert r.stderr.strip().count("\n") == 0 and str(missing) in r.stderr and "Traceback" not in r.stderr
    junk = tmp_path / "junk.pth"
    junk.write_bytes(os.urandom(100))
    r = run("info", str(junk))
    assert r.returncode == 2 and "junk.pth" in r.stderr and "Traceback" not in r.stderr
    r = run("--debug", "info", str(junk))
    assert r.returncode != 0 and "Traceback" in r.stderr
    r = run("ls")
    assert r.returncode == 2  # usage


def test_check_refuses_unsafe_pickles_unless_trusted(tmp_path):
    class Custom:
        def __init__(self):
            self.w = torch.ones(2)

    import __main__

    Custom.__module__ = "__main__"
    Custom.__qualname__ = "Custom"
    __main__.Custom = Custom
    p = tmp_path / "custom.pth"
    try:
        torch.save({"obj": Custom(), "t": torch.zeros(2)}, p)
    finally:
        del __main__.Custom
    r = run("check", str(p))
    assert r.returncode == 2 and "torch.load failed" in r.stderr and "--trust" in r.stderr
    r = run("ls", str(p))  # ckptfs itself indexes it: the object is opaque data, its tensor reachable
    assert r.returncode == 0 and "obj.w" in r.stdout


def test_python_dash_m_ckptfs_is_the_command(model_file):
    """``python -m ckptfs`` runs the same CLI as the console script (and, for ls, still without torch)."""
    code = ("import runpy, sys; sys.argv = ['ckptfs', 'ls', '--json', sys.argv[1]]\n"
            "try:\n    runpy.run_module('ckptfs', run_name='__main__')\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "assert 'torch' not in sys.modules, 'python -m ckptfs ls imported torch'\n")
    r = subprocess.run([sys.executable, "-c", code, str(model_file)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert {json.loads(x)["key"] for x in r.stdout.splitlines()} >= {"model.0.weight", "epoch", "half"}
    r = subprocess.run([sys.executable, "-m", "ckptfs", "info", str(model_file)], capture_output=True, text=True)
    assert r.returncode == 0 and "tensors     5" in r.stdout, r.stderr


def test_info_counts_read_like_model_cards():
    from ckptfs.cli.common import count_text as _count

    assert [_count(n) for n in (1_500, 50_414_643, 7_241_732_096, 1_200_000_000_000)] == ["1.5K", "50.4M", "7.2B", "1.2T"]


@pytest.mark.parametrize("command", ["ls", "info", "code", "stats", "diff", "check", "mount", "umount", "export"])
def test_every_command_s_help_ends_with_examples(command):
    r = run(command, "--help")
    assert r.returncode == 0 and r.stderr == ""
    tail = r.stdout.split("examples:\n", 1)
    assert len(tail) == 2, r.stdout
    assert any(line.strip().startswith(f"ckptfs {command} ") for line in tail[1].splitlines()), tail[1]


def test_the_mount_helper_s_help():
    helper = os.path.join(os.path.dirname(sys.executable), "mount.fuse.ckptfs")
    r = subprocess.run([helper, "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("usage: mount.fuse.ckptfs ") and "examples:" in r.stdout
    r = subprocess.run([helper, "--bogus"], capture_output=True, text=True)
    assert r.returncode == 1 and "usage: mount.fuse.ckptfs" in r.stderr  # mount(8)'s status for wrong usage
