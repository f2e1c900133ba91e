"""`./dev` on a fresh clone: the first run says what it does before the long, quiet install.

The script is run for real, in a copy of the repository's top level, with a stand-in
`python3` whose venv's pip records its arguments instead of downloading anything.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

FAKE_PYTHON = """#!/usr/bin/env bash
# `python3 -m venv DIR`: a venv whose python and pip only log their arguments.
dir="$3"
mkdir -p "$dir/bin"
for tool in python pip; do
  printf '#!/usr/bin/env bash\\necho "ran $(basename "$0") $*" >&2\\n' > "$dir/bin/$tool"
  chmod +x "$dir/bin/$tool"
done
"""


def _clone(tmp_path: Path) -> tuple[Path, Path]:
    clone = tmp_path / "clone"
    clone.mkdir()
    shutil.copy2(ROOT / "dev", clone / "dev")
    shutil.copy2(ROOT / "pyproject.toml", clone / "pyproject.toml")
    python = tmp_path / "fake-python3"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return clone, python


def _dev(clone: Path, python: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": str(python)}
    return subprocess.run(["bash", str(clone / "dev"), *args], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=60)


def test_the_first_run_says_what_it_installs_and_how_long_it_may_take(tmp_path: Path):
    clone, python = _clone(tmp_path)
    run = _dev(clone, python, "setup")
    assert run.returncode == 0, run.stderr
    err = run.stderr
    assert "dev: first run: creating the virtual environment in .venv" in err
    assert "dev: installing torch" in err and "may take 2-10 minutes" in err
    # said before the install, not after it
    assert err.index("dev: installing torch") < err.index("ran pip install") < err.index("dev: set up")
    assert "dev: set up; later runs skip this" in err

    again = _dev(clone, python, "setup")  # set up already: nothing to say, nothing done
    assert again.returncode == 0 and again.stderr == ""
