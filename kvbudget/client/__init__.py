"""The client library: engine and observer clients, targets and TLS for the CLI and the
dashboard, the readings of a snapshot both show (pool parts, pressure, tenants), and the
details of a daemon's refusal (refusals).

The public names engines use are importable from here. They load on first use, so that
importing a light module of this package (errors, target) does not load grpc: the CLI
sets GRPC_VERBOSITY before grpc loads.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# Each public name and the module it lives in.
_HOMES = {
    "ClientClosed": "engine",
    "EngineClient": "engine",
    "SessionLost": "engine",
    "StepBatch": "engine",
    "ObserverClient": "observer",
    "PolicySwitch": "messages",
    "RefusalDetails": "refusals",
    "Resubmitted": "resubmit",
    "refusal_details": "refusals",
    "policy_switch": "messages",
    "step_message": "messages",
    "submit_message": "messages",
}
__all__ = sorted(_HOMES)

if TYPE_CHECKING:
    from kvbudget.client.engine import ClientClosed, EngineClient, SessionLost, StepBatch
    from kvbudget.client.messages import PolicySwitch, policy_switch, step_message, submit_message
    from kvbudget.client.observer import ObserverClient
    from kvbudget.client.refusals import RefusalDetails, refusal_details
    from kvbudget.client.resubmit import Resubmitted


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"kvbudget.client.{home}"), name)
