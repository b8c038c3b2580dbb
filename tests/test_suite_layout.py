"""The test suite's own rules, checked on its sources: shared code lives in tests/helpers.py (and the crafting
libraries craft.py and hostile/), never in a test module or conftest.py that others import; and expected
values are never computed with ckptfs's own comparison helpers (``ckptfs check``'s)."""

from __future__ import annotations

import ast
from pathlib import Path

HERE = Path(__file__).parent
SOURCES = sorted(HERE.glob("*.py")) + sorted((HERE / "hostile").glob("*.py"))
#: ckptfs code that computes torch's side of a comparison: the code under test, never an oracle
ORACLES = {"ckptfs.torchio.check", "ckptfs.torchio.tensors.part_of", "ckptfs.dtypes.numpy_dtype"}


def _imports(path: Path) -> list[str]:
    """Every module (and module.name for ``from m import name``) a source file imports, anywhere in it."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return out


def test_sources_are_found():
    names = {p.name for p in SOURCES}
    assert {"conftest.py", "helpers.py", "craft.py", "test_api.py", "sandbox.py"} <= names, names


def test_no_test_module_or_conftest_is_imported():
    bad = [(p.name, m) for p in SOURCES for m in _imports(p)
           if m.split(".")[0].startswith("test_") or m.split(".")[0] == "conftest"]
    assert not bad, bad


def test_no_expected_value_from_ckptfs_comparison_helpers():
    bad = [(p.name, m) for p in SOURCES for m in _imports(p) if any(m == o or m.startswith(o + ".") for o in ORACLES)]
    assert not bad, bad
