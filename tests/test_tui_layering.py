"""Layering: the dashboard is a pure gRPC client, the daemon knows nothing of the dashboard.

Each import runs in a fresh interpreter, and what it pulled in is read from sys.modules.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def modules_after(statement: str) -> set[str]:
    code = f"import sys, json\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.splitlines()[-1]))


def roots(modules: set[str]) -> set[str]:
    return {name.split(".")[0] for name in modules}


@pytest.mark.parametrize(
    "statement",
    [
        "import kvbudget.tui",
        "import kvbudget.tui.app",
        "import kvbudget.cmd_tui",
        "from kvbudget.tui import panels, state, source, verdict, replays, screens, drawing, decisions",
    ],
)
def test_the_dashboard_pulls_in_neither_torch_nor_nvml_nor_the_daemon(statement):
    loaded = modules_after(statement)
    assert not roots(loaded) & {"torch", "pynvml"}
    assert not {m for m in loaded if m.startswith("kvbudget.daemon")}


def test_the_daemon_pulls_in_no_textual():
    loaded = modules_after(
        "import kvbudget.daemon, kvbudget.daemon.server, kvbudget.cmd_daemon"
    )
    assert "kvbudget.daemon.server" in loaded  # the import did happen
    assert "textual" not in roots(loaded)
