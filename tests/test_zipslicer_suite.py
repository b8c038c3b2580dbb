"""zipslicer's own test suite, run against ckptfs.load (the drop-in claim of docs/api.md).

The suite is taken from zipslicer's source distribution on PyPI at test time (not copied into this
repository); a shim package named `zipslicer` (tests/zipslicer_shim) maps its calls to ckptfs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ZIPSLICER = "zipslicer==0.8.1"
HERE = Path(__file__).parent


def _sdist(tmp: Path) -> Path | None:
    cached = os.environ.get("CKPTFS_ZIPSLICER_SDIST")
    if cached and Path(cached).exists():
        return Path(cached)
    r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        "-d", str(tmp), ZIPSLICER], capture_output=True, text=True)
    found = sorted(tmp.glob("zipslicer-*.tar.gz"))
    return found[0] if r.returncode == 0 and found else None


@pytest.mark.slow  # downloads the sdist and runs a pytest of its own (~15 s)
def test_zipslicer_suite_passes_against_ckptfs(tmp_path):
    sdist = _sdist(tmp_path)
    if sdist is None:
        if os.environ.get("CKPTFS_CI"):
            pytest.fail("could not download zipslicer's source distribution from the package index")
        pytest.skip("zipslicer's source distribution is not downloadable here")
    with tarfile.open(sdist) as tf:
        members = [m for m in tf.getmembers() if "/tests/" in m.name and m.name.endswith(".py")]
        tf.extractall(tmp_path / "src", members=members, filter="data")
    tests = next((tmp_path / "src").glob("zipslicer-*/tests"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE / "zipslicer_shim"),
                                                       os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "5 passed" in r.stdout and "failed" not in r.stdout  # the 5 tests of zipslicer 0.8.1
    # the shim really was the module under test
    probe = subprocess.run([sys.executable, "-c", "import zipslicer; print(zipslicer.load.__module__)"],
                           env=env, capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "ckptfs"
