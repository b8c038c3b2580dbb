"""Every command the README shows exists on this machine (after `make setup`: getfattr is Debian's attr), and
every `ckptfs` line in it parses with the real command line parser (its subcommands and options exist)."""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def shell_lines() -> list[str]:
    out = []
    for block in re.findall(r"```sh\n(.*?)```", README.read_text(), re.S):
        for line in block.splitlines():
            line = line.split("  #", 1)[0].strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def test_the_readme_has_shell_examples():
    lines = shell_lines()
    assert len(lines) >= 12 and any(ln.startswith("ckptfs diff") for ln in lines), lines


def test_every_program_it_shows_is_installed():
    missing = []
    for line in shell_lines():
        program = shlex.split(line)[0]
        if program in ("ckptfs", "python", "make"):
            continue  # ckptfs: the package's own script (python -m ckptfs where not on PATH); checked below
        if shutil.which(program) is None:
            missing.append((program, line))
    assert not missing, f"the README shows programs this machine lacks (add them to APT_PACKAGES): {missing}"


def test_every_ckptfs_line_parses(monkeypatch):
    from ckptfs.cli import build_parser

    parser = build_parser()
    for line in shell_lines():
        argv = shlex.split(line.replace("~", "/home/user"))
        if argv[0] != "ckptfs":
            continue
        monkeypatch.setattr(sys, "argv", argv)
        args, extra = parser.parse_known_args(argv[1:])
        assert not [x for x in extra if x.startswith("-")], (line, extra)
        assert callable(args.func), line


def test_every_command_is_in_the_readme():
    """Where the README lists the commands (the CLI bullet and "The command line"), every subcommand is there."""
    from ckptfs.cli import COMMAND_NAMES, build_parser

    build_parser()
    text = README.read_text()
    bullet = text.split("* **a CLI**:", 1)[1].split("\n\n", 1)[0]
    synopsis = text.split("## The command line", 1)[1].split("```", 2)[1]
    for name in COMMAND_NAMES:
        assert f"`ckptfs {name}`" in bullet, name
        assert f"ckptfs {name} " in synopsis, name


def test_the_readme_says_where_the_command_is_after_make_setup():
    text = README.read_text()
    assert "make setup" in text and ".venv/bin/ckptfs" in text and ". .venv/bin/activate" in text
