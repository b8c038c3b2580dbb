"""TorchScript archives (torch.jit.save): parameters and buffers indexed from the pickles, code/ as text,
nothing compiled or run."""

from __future__ import annotations

import zipfile

import pytest
import torch

import ckptfs
import ckptfs.container.torchscript  # noqa: F401 - imported before the audit window
import ckptfs.torchio.tensors  # noqa: F401 - ckpt.tensor() would import it (ckptfs's own code) inside audited()
from ckptfs.cli import EXIT_ERROR, EXIT_OK, main
from helpers import audited, lookup, torch_bytes


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 4)
        self.bn = torch.nn.BatchNorm1d(4)
        self.register_buffer("steps", torch.arange(5, dtype=torch.int32))
        self.scale = torch.nn.Parameter(torch.tensor([0.5, 2.0]))
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(2)])
        self.name = "block"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(self.fc(x))
        for b in self.blocks:
            y = b(y)
        return y * self.scale.sum() + self.steps.sum()


class Traced(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 3, 3)
        self.lin16 = torch.nn.Linear(3, 2).half()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).mean() * torch.tensor([1.5, 2.5])


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    d = tmp_path_factory.mktemp("ts")
    scripted = torch.jit.script(Block().eval())
    torch.jit.save(scripted, d / "scripted.pt")
    traced = torch.jit.trace(Traced(), torch.randn(1, 2, 5, 5))
    torch.jit.save(traced, d / "traced.pt", _extra_files={"notes.txt": "hello"})
    return {"scripted": d / "scripted.pt", "traced": d / "traced.pt"}


@pytest.mark.parametrize("name", ["scripted", "traced"])
def test_parameters_and_buffers_as_a_tree(archives, name):
    p = archives[name]
    ref = torch.jit.load(p, map_location="cpu")  # the test may run it; ckptfs does not
    expected = dict(ref.named_parameters()) | dict(ref.named_buffers())
    with audited(), ckptfs.open(p) as ckpt:
        assert ckpt.format == "torchscript"
        keys = set(ckpt.tensor_keys())
        assert set(expected) <= keys  # every parameter and buffer, by its dotted name
        for key in keys:
            want = lookup(ref, ckpt.meta(key).path)
            assert ckpt.read(key) == torch_bytes(want), key
            assert torch.equal(ckpt.tensor(key), want.detach())
        info = ckpt.info()
        files = ckpt.code_files()
    assert info["container"]["code_files"] == len(files) > 0
    assert info["container"]["compressed_records"] > 0  # code/ is deflated
    with zipfile.ZipFile(p) as z:
        root = z.namelist()[0].split("/")[0]
        for path, text in files.items():
            assert text == z.read(f"{root}/code/{path}")
    assert any(b"def forward" in text for text in files.values())


def test_module_objects_are_opaque_data(archives):
    with ckptfs.open(archives["scripted"]) as ckpt:
        # TorchScript mangles a class scripted twice in one process (``...linear.___torch_mangle_0.Linear``)
        assert ckpt.meta("").type.startswith("__torch__.test_formats_torchscript.")
        assert ckpt.meta("").type.endswith(".Block")
        fc = ckpt.meta("fc").type
        assert fc.startswith("__torch__.torch.nn.modules.linear.") and fc.endswith(".Linear")
        assert ckpt.value("name") == "block" and ckpt.value("training") is False
        assert ckpt.meta("blocks.1.weight").shape == (4, 4)
        assert ckpt.meta("").type in ckpt.unknown_globals and fc in ckpt.unknown_globals


def test_traced_archive_extra_files_and_half(archives):
    with ckptfs.open(archives["traced"]) as ckpt:
        c = ckpt.info()["container"]
        assert c["extra_files"] == ["notes.txt"] and c["constants"] == 1
        assert ckpt.meta("lin16.weight").dtype == "float16"


def test_cli_code_and_check(archives, capsys):
    p = str(archives["scripted"])
    assert main(["code", p]) == EXIT_OK
    listing = capsys.readouterr().out.split()
    assert "__torch__/test_formats_torchscript.py" in listing
    assert main(["code", p, "__torch__/test_formats_torchscript.py"]) == EXIT_OK
    assert "class Block(Module):" in capsys.readouterr().out
    assert main(["check", p, "--no-progress"]) == EXIT_ERROR  # torch could only compare by running it
    assert "CVE-2025-32434" in capsys.readouterr().err
    assert main(["check", p, "--trust", "--no-progress"]) == EXIT_OK
    assert "0 mismatched" in capsys.readouterr().out
    assert main(["info", p]) == EXIT_OK
    assert "torchscript archive" in capsys.readouterr().out


def test_pre_1_4_torchscript_is_refused_with_its_reason(tmp_path):
    p = tmp_path / "old_ts.pt"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("old_ts/version", "1\n")
        z.writestr("old_ts/model.json", "{}")
        z.writestr("old_ts/tensors/0", b"\0" * 8)
    with pytest.raises(ckptfs.UnsupportedError, match="TorchScript archive of torch < 1.4"):
        ckptfs.open(p)
