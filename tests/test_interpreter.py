"""The daemon process's CPython settings: the settled heap (gc) and the GIL switch interval.

They are process-wide, so each check runs in a process of its own: a fresh interpreter
for `settle_heap`, a real daemon for the CLI's use of it. The pytest process keeps
CPython's defaults (an in-process Daemon has no on_ready unless given one).
"""

from __future__ import annotations

import gc
import re
import subprocess
import sys
import textwrap

import pytest

from daemon_harness import DaemonProcess, wait_until

SETTLE = textwrap.dedent(
    """
    import gc, sys, weakref
    from kvbudget.daemon.server import interpreter

    assert gc.get_threshold() == (700, 10, 10), gc.get_threshold()  # CPython's defaults
    assert gc.get_freeze_count() == 0

    class Node:
        pass

    garbage = Node(); garbage.self = garbage  # a cycle only the collector can free
    seen = weakref.ref(garbage)
    del garbage
    kept = Node()  # alive: frozen with the rest of start-up

    settled = interpreter.settle_heap()
    assert seen() is None, "garbage made before settling must be collected, not frozen"
    assert settled.frozen_objects == gc.get_freeze_count() > 1000, settled  # the imports at least
    assert settled.thresholds == gc.get_threshold() == (interpreter.GEN0_THRESHOLD, 10, 10)
    assert all(kept is not obj for obj in gc.get_objects()), "the live object is in the permanent generation"

    interpreter.set_switch_interval()
    assert sys.getswitchinterval() == interpreter.GIL_SWITCH_INTERVAL_S
    print("ok")
    """
)


def test_settle_heap_collects_then_freezes_and_raises_the_gen0_threshold() -> None:
    result = subprocess.run([sys.executable, "-c", SETTLE], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


BIG_STEP = textwrap.dedent(
    """
    import gc
    from kvbudget.daemon.server import interpreter

    with interpreter.big_step_heap():  # not settled: nothing changes
        assert gc.isenabled() and gc.get_freeze_count() == 0

    interpreter.settle_heap()
    frozen = gc.get_freeze_count()
    with interpreter.big_step_heap():
        assert not gc.isenabled()  # no pass while a big step runs
        kept = [[i] for i in range(10_000)]  # what the step leaves alive
        with interpreter.big_step_heap():  # (another step meanwhile: nothing more)
            pass
        assert not gc.isenabled()
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen + 10_000  # frozen after it: no later pass walks them
    assert all(kept[0] is not obj for obj in gc.get_objects())
    print("ok")
    """
)


def test_a_big_step_runs_without_gc_passes_and_what_it_leaves_is_frozen() -> None:
    result = subprocess.run([sys.executable, "-c", BIG_STEP], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_the_test_process_keeps_cpythons_defaults() -> None:
    # Importing the daemon (every other test does) must not change them.
    import kvbudget.daemon.server.interpreter  # noqa: F401
    import kvbudget.daemon.server.lifecycle  # noqa: F401

    assert gc.get_threshold()[0] == 700
    assert gc.get_freeze_count() == 0


@pytest.mark.slow
def test_the_daemon_settles_its_heap_once_serving(tmp_path) -> None:
    with DaemonProcess(tmp_path, "--log-level", "info") as daemon:
        line = wait_until(lambda: next(
            (line for line in daemon.stderr().splitlines() if "heap settled" in line), None))
        match = re.fullmatch(
            r"kvbudget daemon: INFO: heap settled: (\d+) objects frozen, gc thresholds \(5000, 10, 10\)", line)
        assert match, line
        assert int(match.group(1)) > 10_000  # grpc, protobuf and the daemon's modules
        lines = daemon.stderr().splitlines()
        serving = next(i for i, text in enumerate(lines) if "INFO: serving llama-3.1-8b" in text)
        assert serving < lines.index(line)  # after start-up, not before the pool and log exist
