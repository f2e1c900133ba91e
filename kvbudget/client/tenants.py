"""A snapshot's tenant list as the daemon sends it, its last entry "(other)" summing those
it left out: the one reading `kvbudget admin status` and the dashboard share.
Imports nothing of the project: the dashboard and the CLI may both import it.
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
