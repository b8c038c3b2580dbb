"""The hostile corpus (tests/hostile/make_corpus.py): every crafted file through the API and the CLI.

Each case runs in a jailed child (tests/hostile/sandbox.py: audit hook, 1 GiB address-space cap, a budget
of CPU seconds, a wall-clock limit for hangs) and must end in exactly one of two ways: a correct index (the
listed tensors read back byte for byte, the listed bad tensors fail alone with a one-line ckptfs error
naming the file and the key) or one ckptfs error line naming the file. Never a traceback, a signal, a timeout, an audit
violation (import, exec, process, write...) or a marker file.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from helpers import hostile_corpus
from hostile.make_corpus import Case
from hostile.sandbox import Run, Sandbox

CASES, MARKERS = hostile_corpus()  # made once per session, shared with test_hostile_mount/_torch
MEM_CAP = 1 << 30  # RLIMIT_AS of the child
# Most cases take hundredths of a second; the resource-exhaustion cases run against the default limits and the
# legacy DAGs take seconds each (up to a minute for 200k tensors): those are `slow`. The resource cases with
# custom limits stay in the quick run, so every family is in it.
SLOW_CASES = {"legacy_dag_key", "legacy_keys_dag", "legacy_deep_object"}


def _slow(case: Case) -> bool:
    return (case.family == "resource" and case.limits is None) or case.name in SLOW_CASES


def _params(cases: list) -> list:
    return [pytest.param(c, id=c.name, marks=[pytest.mark.slow] if _slow(c) else []) for c in cases]

RSS_CAP_KB = 1 << 20  # peak RSS must stay under 1 GiB


FIGURES: list[dict] = []  # per case: outcome, seconds, peak RSS (CKPTFS_HOSTILE_REPORT=path writes them)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory):
    sb = Sandbox(tmp_path_factory.mktemp("sandbox"))
    assert not sb.missing, f"modules the sandbox could not preload: {sb.missing}"
    yield sb
    sb.close()
    report = os.environ.get("CKPTFS_HOSTILE_REPORT")
    if report:
        Path(report).write_text(json.dumps(FIGURES, indent=1))


@pytest.fixture()
def case_file(request: pytest.FixtureRequest, tmp_path: Path):
    case: Case = request.param
    path = case.materialise(tmp_path)
    yield case, path
    path.unlink(missing_ok=True)


def assert_clean(run: Run, case: Case) -> None:
    """The child ended by itself, in time, under the memory cap, with nothing forbidden done."""
    assert not run.violations, f"audit hook fired: {run.violations}\n{run.describe()}"
    assert not run.timed_out, f"over its {case.timeout} s of CPU time, or hung\n{run.describe()}"
    assert run.signal is None, f"killed by signal {run.signal}\n{run.describe()}"
    assert "Traceback" not in run.stderr and "Traceback" not in run.stdout, run.describe()
    assert "internal error" not in run.stderr, run.describe()
    assert run.maxrss_kb is not None and run.maxrss_kb < RSS_CAP_KB, f"peak RSS {run.maxrss_kb} KiB\n{run.describe()}"
    assert not any(MARKERS.iterdir()), f"a gadget ran: {list(MARKERS.iterdir())}"


def assert_one_line_error(msg: str, path: Path) -> None:
    assert msg and "\n" not in msg.strip(), f"not one line: {msg!r}"
    assert str(path) in msg, f"error does not name the file: {msg!r}"
    assert msg.strip().isprintable(), f"error line has control characters: {msg!r}"


def check_api(run: Run, case: Case, path: Path) -> None:
    assert_clean(run, case)
    assert run.exit == 0, run.describe()
    res = run.result
    assert res is not None, run.describe()
    if case.expect == "error":
        assert not res["ok"], f"expected an error, got an index: {res.get('keys')}"
    if case.expect == "index":
        assert res["ok"], f"expected an index, got: {res.get('error')}"
    kids = res.get("children_maxrss_kb") or 0  # the unpickling probe (a forked child)
    assert kids < RSS_CAP_KB, f"the unpickling child peaked at {kids} KiB"
    FIGURES.append({"case": case.name, "ok": res["ok"], "type": res.get("type"), "elapsed": run.elapsed,
                    "maxrss_kb": run.maxrss_kb, "child_maxrss_kb": kids})
    if case.error_type:
        assert not res["ok"] and res["type"] == case.error_type, f"expected a {case.error_type}: {res.get('error')}"
    if not res["ok"]:
        assert_one_line_error(res["error"], path)
        if case.error_has:
            assert case.error_has.lower() in res["error"].lower(), res["error"]
        return
    tensors = res["tensors"]
    for key, want in case.tensors.items():
        assert key in tensors, f"tensor {key!r} not indexed; keys: {res['keys'][:50]}"
        got = tensors[key]
        assert "error" not in got, f"{key!r}: {got['error']}"
        if want is not None:
            assert got.get("sha256") == hashlib.sha256(want).hexdigest(), f"{key!r}: wrong bytes"
    for key, text in case.tensor_errors.items():
        assert key in tensors, f"tensor {key!r} not indexed; keys: {res['keys'][:50]}"
        got = tensors[key]
        assert "error" in got, f"{key!r} should fail ({text!r}) but read: {got}"
        assert_one_line_error(got["error"], path)
        assert key in got["error"] or "data/" in got["error"] or "storages/" in got["error"], \
            f"error names neither the key {key!r} nor its record: {got['error']}"
        assert text.lower() in got["error"].lower(), got["error"]
    keys = set(res["all_keys"])
    for key in case.keys_present:
        assert key in keys or any(k.startswith(key + ".") for k in keys), f"{key!r} not listed: {sorted(keys)[:50]}"


def check_cli(run: Run, case: Case, path: Path, expect_ok: bool) -> None:
    assert_clean(run, case)
    for line in run.stdout.splitlines() + run.stderr.splitlines():
        assert line.isprintable(), f"unprintable output line (terminal injection?): {line[:200]!r}"
    if expect_ok:
        assert run.exit == 0, run.describe()
    else:
        assert run.exit == 2, run.describe()  # trouble (docs/cli.md)
        assert run.stdout == "", run.describe()
        err = run.stderr.strip()
        assert err.startswith("ckptfs: "), err
        assert_one_line_error(err, path)


@pytest.mark.parametrize("case_file", _params(CASES), indirect=True)
def test_hostile_case(case_file: tuple[Case, Path], sandbox: Sandbox) -> None:
    case, path = case_file
    run = sandbox.run("api", path, limits=case.limits, timeout=case.timeout, mem=MEM_CAP, max_read=case.max_read)
    check_api(run, case, path)
    ok = run.result["ok"]  # type: ignore[index]
    # the CLI agrees: the same outcome, as text
    if case.limits is None:
        for argv in (["ls", str(path)], ["info", str(path)]):
            cli = sandbox.run("cli", path, argv=argv, timeout=case.timeout, mem=MEM_CAP)
            check_cli(cli, case, path, ok)
    if case.strict_error and ok:
        strict = sandbox.run("api", path, strict=True, timeout=case.timeout, mem=MEM_CAP)
        assert_clean(strict, case)
        assert strict.result and not strict.result["ok"], "strict mode indexed a file naming unknown globals"
        assert "allowlist" in strict.result["error"]


def test_hostile_keys_json(sandbox: Sandbox, tmp_path: Path) -> None:
    """`ls --json` and `info --json` on hostile keys and globals: valid JSON lines, nothing unprintable."""
    for name in ("lie_hostile_keys", "exec_nonascii_global", "exec_newobj_allowlisted"):
        case = next(c for c in CASES if c.name == name)
        path = case.materialise(tmp_path)
        for argv in (["ls", "--json", str(path)], ["info", "--json", str(path)], ["ls", "--tree", str(path)]):
            run = sandbox.run("cli", path, argv=argv)
            check_cli(run, case, path, True)
            if "--json" in argv:
                if argv[0] == "ls":
                    for line in run.stdout.splitlines():
                        json.loads(line)
                else:
                    json.loads(run.stdout)


@pytest.mark.parametrize("name", ["exec_os_system", pytest.param("res_dag_tuple_key", marks=pytest.mark.slow),
                                  "zip_duplicate_storage", "lie_hostile_keys"])
def test_real_command(name: str, tmp_path: Path) -> None:
    """The installed entry point (python -m ckptfs.cli), not main() in a fork: same outcome, one line."""
    import subprocess
    import sys

    case = next(c for c in CASES if c.name == name)
    path = case.materialise(tmp_path)
    for cmd in ("ls", "info"):
        p = subprocess.run([sys.executable, "-m", "ckptfs.cli", cmd, str(path)], capture_output=True, text=True,
                           timeout=30, errors="backslashreplace")
        assert "Traceback" not in p.stderr
        if case.expect == "error":
            assert p.returncode == 2 and p.stdout == ""
            assert_one_line_error(p.stderr.strip(), path)
            assert p.stderr.startswith("ckptfs: ")
        else:
            assert p.returncode == 0, p.stderr
            assert all(line.isprintable() for line in p.stdout.splitlines())
    assert not any(MARKERS.iterdir())


def test_check_output_escaped(tmp_path: Path) -> None:
    """`ckptfs check -v` (which compares with torch.load) prints hostile keys escaped too."""
    import subprocess
    import sys

    case = next(c for c in CASES if c.name == "lie_hostile_keys")
    path = case.materialise(tmp_path)
    p = subprocess.run([sys.executable, "-m", "ckptfs.cli", "check", "-v", str(path)], capture_output=True, timeout=120)
    out = p.stdout.decode("utf-8")  # strict: a lone surrogate must not reach the output raw
    assert p.returncode == 0, p.stderr[-2000:]
    assert "20 tensors identical" in out
    assert all(line.isprintable() for line in out.splitlines())
    assert "\\x1b[2J" in out


def test_cli_limit_option(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--limit NAME=VALUE reaches ckptfs.Limits from the command line (ls and info)."""
    from ckptfs.cli import main

    case = next(c for c in CASES if c.name == "res_tensor_count_custom")  # 2001 tensors
    path = case.materialise(tmp_path)
    assert main(["info", str(path)]) == 0
    capsys.readouterr()
    assert main(["ls", "--limit", "max_tensors=2000", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ckptfs: ") and "more than 2000 tensors" in err
    assert main(["info", "--limit", "max_tensors=1k", "--limit", "max_memory=1G", str(path)]) == 2
    assert main(["ls", "--limit", "no_such_limit=1", str(path)]) == 2
    assert "no_such_limit" in capsys.readouterr().err


def test_corpus_covers_families() -> None:
    fams = {c.family for c in CASES}
    assert fams == {"exec", "resource", "lies", "zip", "legacy"}
    assert {c.family for c in CASES if not _slow(c)} == fams  # the quick run has cases of every family
    assert len(CASES) >= 200
    assert os.access(MARKERS, os.W_OK)
