"""The client library: engine and observer clients, targets and TLS for the CLI and the
dashboard, and the readings of a snapshot both show (pool parts, pressure, tenants).

The public names engines use are importable from here.
"""

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
