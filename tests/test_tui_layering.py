"""Layering: the dashboard is a pure gRPC client, the daemon knows nothing of the dashboard,
an engine's client library loads no server, and the core loads only the standard library.

Of the daemon, the dashboard loads the wire room (the one proto <-> record conversion)
and what that room loads, never the server.

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
        "import kvbudget.cli.cmd_tui",
        "from kvbudget.tui import panels, state, source, verdict, replays, screens, drawing, decisions",
    ],
)
def test_the_dashboard_pulls_in_neither_torch_nor_nvml_nor_the_daemon(statement):
    loaded = modules_after(statement)
    assert not roots(loaded) & {"torch", "pynvml"}
    wire_room = modules_after("import kvbudget.daemon.wire.convert")
    assert not {m for m in loaded if m.startswith("kvbudget.daemon")} - wire_room
    assert not {m for m in loaded if m.startswith(("kvbudget.daemon.server", "kvbudget.daemon.log"))}


def test_the_wire_room_loads_only_the_core_sizing_and_the_messages():
    loaded = modules_after("import kvbudget.daemon.wire.convert, kvbudget.daemon.wire.layout")
    daemon = {m for m in loaded if m.startswith("kvbudget.daemon")}
    assert "kvbudget.daemon.wire.convert" in daemon  # the import did happen
    allowed = ("kvbudget.daemon.core", "kvbudget.daemon.wire", "kvbudget.daemon.config.sizing")
    packages = {"kvbudget.daemon", "kvbudget.daemon.config"}
    assert {m for m in daemon - packages if not m.startswith(allowed)} == set()
    assert not roots(loaded) & {"torch", "pynvml", "grpc", "textual", "rich"}


def test_the_daemon_pulls_in_no_textual():
    loaded = modules_after(
        "import kvbudget.daemon, kvbudget.daemon.server.lifecycle, kvbudget.cli.cmd_daemon"
    )
    assert "kvbudget.daemon.server.lifecycle" in loaded  # the import did happen
    assert "textual" not in roots(loaded)


def test_the_admin_command_pulls_in_no_dashboard_code():
    """`kvbudget admin status` reads the snapshot's tenant list as the dashboard does, from a
    shared module (kvbudget.client.tenants), not from the dashboard's."""
    loaded = modules_after("import kvbudget.cli.cmd_admin")
    assert "kvbudget.client.tenants" in loaded  # the import did happen
    assert "textual" not in roots(loaded)
    assert not {m for m in loaded if m.startswith(("kvbudget.tui", "kvbudget.daemon"))}


def test_the_shared_tenant_reading_imports_nothing_of_the_project():
    loaded = modules_after("import kvbudget.client.tenants")
    # (kvbudget.client's own __init__ loads its public names lazily: nothing more comes with it)
    assert {m for m in loaded if m.startswith("kvbudget")} == {"kvbudget", "kvbudget.client", "kvbudget.client.tenants"}
    assert not roots(loaded) & {"textual", "rich", "torch", "pynvml", "grpc", "google"}


def test_the_engine_client_pulls_in_no_server_and_no_dashboard():
    """An engine imports the client library: no server, log or dashboard code comes with it
    (tests/test_layering.py holds the same line in the source; this is what a process loads)."""
    loaded = modules_after("import kvbudget.client.engine")
    assert "kvbudget.client.engine" in loaded  # the import did happen
    assert not {m for m in loaded if m.startswith(("kvbudget.daemon.server", "kvbudget.daemon.log", "kvbudget.tui"))}
    assert not roots(loaded) & {"textual", "torch", "pynvml"}


def test_the_core_pulls_in_nothing_but_the_standard_library():
    loaded = modules_after("import kvbudget.daemon.core.admission, kvbudget.daemon.core.step")
    assert "kvbudget.daemon.core.step" in loaded  # the import did happen
    outside = {
        m for m in loaded
        if m.split(".")[0] not in sys.stdlib_module_names
        and not m.startswith(("kvbudget.daemon.core", "__editable__", "_distutils_hack", "__main__"))
    }  # (the editable install's import hooks aside)
    assert outside <= {"kvbudget", "kvbudget.daemon"}  # the packages above the core: their __init__ only
