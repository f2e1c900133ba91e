"""The client library: engine and observer clients, targets and TLS for the CLI and the
dashboard, and the readings of a snapshot both show (pool parts, pressure, tenants).

The public names engines use are importable from here. They load on first use, so that
importing a light module of this package (errors, target) does not load grpc: the CLI
sets GRPC_VERBOSITY before grpc loads.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__all__ = [
    "ClientClosed",
    "EngineClient",
    "ObserverClient",
    "PolicySwitch",
    "SessionLost",
    "StepBatch",
    "policy_switch",
    "step_message",
    "submit_message",
]

if TYPE_CHECKING:
    from kvbudget.client.engine import (
        ClientClosed,
        EngineClient,
        ObserverClient,
        PolicySwitch,
        SessionLost,
        StepBatch,
        policy_switch,
        step_message,
        submit_message,
    )


def __getattr__(name: str) -> object:
    if name in __all__:
        return getattr(importlib.import_module("kvbudget.client.engine"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
