"""Shared test plumbing.

Every BlockPool created during a test is integrity-checked when the test ends, so no
test can leave the pool inconsistent unnoticed (mini-sglang's habit, made mechanical).
"""

from __future__ import annotations

import weakref

import pytest
from hypothesis import settings

from kvbudget.daemon import pool as pool_module

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
