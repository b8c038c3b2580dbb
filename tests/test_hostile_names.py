"""Names a hostile file gives to things other than its keys: TorchScript code/ members, a directory's other
files. In the mount they follow docs/layout.md (1.3, 1.5): no name over NAME_MAX; on the terminal they are
escaped like keys."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import torch
from helpers import run_ckptfs

import ckptfs
from ckptfs.views.namespace import DIR, MAX_NAME
from ckptfs.views.tree import TreeView

CODE_NAMES = ["a" * 300, "%" * 200, "\u00e9" * 200, "x/" + "b" * 250, "\x1b[2J", "line\nforged"]


@pytest.fixture()
def scripted(tmp_path: Path) -> Path:
    """A TorchScript archive with extra code/ members of hostile names."""
    plain, out = tmp_path / "plain.pt", tmp_path / "ts.pt"
    torch.jit.script(torch.nn.Linear(2, 2)).save(str(plain))
    with zipfile.ZipFile(plain) as zin, zipfile.ZipFile(out, "w") as z:
        root = zin.namelist()[0].split("/")[0]
        for info in zin.infolist():
            z.writestr(info, zin.read(info))
        for name in CODE_NAMES:
            z.writestr(f"{root}/code/{name}.py", f"# {len(name)}\n")
    return out


def _walk(view: TreeView, node: int) -> tuple[list[str], int]:
    """Every name under ``node``, and how many files."""
    names, files = [], 0
    for name, child in view.listdir(node):
        names.append(name)
        if view.node_type(child) == DIR:
            sub, n = _walk(view, child)
            names, files = names + sub, files + n
        else:
            files += 1
    return names, files


def test_long_code_file_names_fit_in_name_max(scripted: Path) -> None:
    """Code files named with 300-605 bytes were served under those names (over NAME_MAX: `cp -r` of the
    mount fails, statfs says 255); they are shortened as long keys are, and every one is still there."""
    with ckptfs.open(scripted) as ckpt:
        view = TreeView(ckpt.catalog)
        code = view.lookup(".ckptfs/code")
        assert code is not None
        names, files = _walk(view, code)
        assert files == len(ckpt.code_files()) == len(CODE_NAMES) + 1  # (+ torch's own)
        assert max(len(n.encode()) for n in names) <= MAX_NAME, sorted(len(n.encode()) for n in names)
        assert sum("%#" in n for n in names) == 4


def test_code_list_escapes_names(scripted: Path) -> None:
    """`ckptfs code CKPT` printed member names raw: an ESC sequence reached the terminal, a newline forged a
    second line. They are escaped as `ls` escapes keys, and the escaped form names the file."""
    r = run_ckptfs("code", str(scripted))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "\\x1b[2J.py" in lines and "line\\nforged.py" in lines
    assert len(lines) == len(CODE_NAMES) + 1 and all(line.isprintable() for line in lines)
    r = run_ckptfs("code", str(scripted), "line\\nforged.py")
    assert r.returncode == 0 and r.stdout == "# 11\n", r.stderr
    r = run_ckptfs("code", str(scripted), "\x1b[2J.py")
    assert r.returncode == 0 and r.stdout == "# 4\n", r.stderr


def test_member_named_with_invalid_utf8_keeps_its_tensors(tmp_path: Path) -> None:
    """A directory file named with bytes that are not UTF-8 (`\\xff\\xfe.pt`): its safetensors view file named
    its tensor `w` but left it out, "its name is not valid UTF-8" — the check saw the directory's key
    (`\\udcff\\udcfe.w`), not the name in that file. Names are judged as the file names them."""
    from ckptfs.views.model_dir import member_files, open_model

    d = tmp_path / "runs"
    d.mkdir()
    torch.save({"w": torch.ones(2)}, d / "ok.pt")
    with open(bytes(d) + b"/\xff\xfe.pt", "wb") as f:
        torch.save({"w": torch.full((2,), 3.0), "\udcff": torch.ones(1)}, f)
    model = open_model(str(d))
    try:
        files, omitted = member_files(model)
        by_name = {name: f for name, f in files}
        odd = by_name["\udcff\udcfe.safetensors"]
        assert [e.name for e in odd.tensors] == ["w"]
        assert omitted == {"\udcff\udcfe.\udcff": "its name is not valid UTF-8 (a lone surrogate): safetensors "
                                                  "names are UTF-8"}
    finally:
        model.catalog.close()
