"""A snapshot's tenant list as the daemon sends it: the one reading `kvbudget admin status`
and the dashboard share.

The daemon lists at most so many tenants besides the configured ones; past that, the last
entry, "(other)", sums the rest, and `num_tenants` says how many there are in all. Both
clients must count the folded tenants the same way, so they read it here. Nothing of the
project (and no textual, torch or protobuf) is imported: the dashboard (`kvbudget.tui`)
and the CLI, which must load no dashboard code, may both import it.
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Protocol


class TenantList(Protocol):
    """What is read of a `Snapshot` (duck-typed: the proto message, or a test's stand-in)."""

    @property
    def num_tenants(self) -> int: ...

    @property
    def tenants(self) -> Sized: ...


def tenants_folded(snapshot: TenantList) -> int:
    """How many tenants the snapshot's last entry ("(other)", their sums) stands for when
    the daemon cut its list; 0 when the list has them all (an older daemon sends no count:
    its list has them all)."""
    left_out = snapshot.num_tenants - len(snapshot.tenants)
    return left_out + 1 if left_out > 0 and snapshot.tenants else 0
