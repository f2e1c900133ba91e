"""Shared test plumbing.

Every BlockPool created during a test is integrity-checked when the test ends, so no
test can leave the pool inconsistent unnoticed (mini-sglang's habit, made mechanical).
"""

from __future__ import annotations

import subprocess
import weakref
from pathlib import Path

import pytest
from hypothesis import settings

from kvbudget.daemon.core import pool as pool_module

settings.register_profile("kvbudget", deadline=None, max_examples=60)
settings.register_profile("ci", deadline=None, max_examples=60, derandomize=True)
settings.load_profile("kvbudget")


@pytest.fixture(autouse=True)
def _check_every_pool(monkeypatch: pytest.MonkeyPatch):
    created: weakref.WeakSet[pool_module.BlockPool] = weakref.WeakSet()
    original_init = pool_module.BlockPool.__init__

    def tracking_init(self: pool_module.BlockPool, *args, **kwargs) -> None:
        original_init(self, *args, **kwargs)
        created.add(self)

    monkeypatch.setattr(pool_module.BlockPool, "__init__", tracking_init)
    yield
    for pool in list(created):
        pool.check_integrity()


@pytest.fixture
def small_disk(tmp_path: Path):
    """An 8 MiB tmpfs of its own, for tests of a really full disk; mounting needs root."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0755", "kvbudget-test", str(mount_point)],
                                 capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("a really full disk needs a small tmpfs of its own, and there is no mount command")
    if mounted.returncode != 0:
        # (CI containers without CAP_SYS_ADMIN; the same paths run on a pinned page count too)
        pytest.skip("a really full disk needs a small tmpfs of its own, and mount was refused: "
                    f"{mounted.stderr.strip() or 'not permitted'}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "--lazy", str(mount_point)], check=False)
