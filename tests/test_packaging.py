"""The sdist and the wheel build without packaging warnings and ship what an operator needs.

The sdist is built the way `pip` and `python -m build` build it (setuptools' PEP 517 hook),
in a copy of the checkout so the repository's own egg-info is not rewritten. It must carry
the LICENSE that pyproject names, and the systemd and config files of deploy/ that
docs/operators-guide.md installs from.
"""

from __future__ import annotations

import email.parser
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD = "from setuptools import build_meta as b; print(b.build_{}('dist'))"
SKIP = shutil.ignore_patterns(
    ".venv", ".git", "*.egg-info", "__pycache__", "build", "dist", ".hypothesis",
    ".pytest_cache", "node_modules", "out", "*.db", "*.db-wal", "*.db-shm", "bench", "tests",
)


def build(tmp_path_factory, kind: str) -> tuple[Path, str]:
    """(the built file, the build's stderr): `kind` is sdist or wheel."""
    src = tmp_path_factory.mktemp(kind) / "kvbudget"
    shutil.copytree(ROOT, src, ignore=SKIP)
    done = subprocess.run(
        [sys.executable, "-c", BUILD.format(kind)], cwd=src, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    name = done.stdout.strip().splitlines()[-1]
    return src / "dist" / name, done.stderr


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    return build(tmp_path_factory, "sdist")


def test_wheel_builds_without_warnings_and_carries_the_presets(tmp_path_factory):
    # (setuptools warned that it would skip the presets folder, not named as a package;
    # "warning: ... byte-compiling is disabled" lines come from the environment, not the
    # project: the warnings looked for are setuptools' warning classes)
    path, stderr = build(tmp_path_factory, "wheel")
    assert "Warning" not in stderr, stderr
    with zipfile.ZipFile(path) as wheel:
        names = wheel.namelist()
    assert "kvbudget/daemon/config/presets/llama-3.1-8b.json" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


def test_sdist_builds_without_warnings(sdist):
    _path, stderr = sdist
    assert "Warning" not in stderr, stderr


def test_sdist_ships_license_and_deploy_files(sdist):
    path, _ = sdist
    with tarfile.open(path) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        info = tar.extractfile(f"{path.name[:-len('.tar.gz')]}/PKG-INFO").read().decode()
    assert "LICENSE" in names
    for f in ("kvbudget.service", "kvbudget@.service", "kvbudget.sysusers", "kvbudget.tmpfiles", "kvbudget.toml",
              "kvbudget.rules.yml", "grafana-kvbudget-fleet.json"):
        assert f"deploy/{f}" in names
    meta = email.parser.Parser().parsestr(info)
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["License-File"] == "LICENSE"


def test_torch_is_only_in_the_gpu_extra(sdist):
    # 754 MB of a 1.1 GB install, used only for the daemon's owned pool memory.
    path, _ = sdist
    with tarfile.open(path) as tar:
        info = tar.extractfile(f"{path.name[:-len('.tar.gz')]}/PKG-INFO").read().decode()
    requires = email.parser.Parser().parsestr(info).get_all("Requires-Dist")
    torch = [r for r in requires if r.startswith("torch")]
    assert torch == ['torch>=2.1; extra == "gpu"'], requires


def test_license_is_the_apache_2_text():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
