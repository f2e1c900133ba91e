"""`kvbudget admin set-policy`: the switch, asked first when it would reject waiting
requests (`confirm_switch`), and what it did to the queue, said after it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvbudget.client.errors import CLIError

if TYPE_CHECKING:
    from kvbudget.cli.cmd_admin import AdminConnection, Outcome


def set_policy(daemon: AdminConnection, policy: str) -> Outcome:
    from kvbudget.daemon.wire import convert
    from kvbudget.v1 import admin_pb2

    from kvbudget.client import policy_switch

    response = daemon.call(daemon.admin.SetPolicy, admin_pb2.SetPolicyRequest(policy=convert.policy_to_proto(policy)))
    switch = policy_switch(policy, response)
    previous = switch.previous or "unknown"
    result = {
        "previous": previous, "policy": policy, "changed": switch.changed,
        "admitted": switch.num_admitted, "rejected_by_reason": switch.rejected_by_reason,
    }  # fmt: skip
    if not switch.changed:
        return result, f"policy: {policy} already (nothing changed)", 0
    return result, f"policy: {previous} -> {policy}{_queue_moves(switch.num_admitted, switch.rejected_by_reason)}", 0


def confirm_switch(daemon: AdminConnection, policy: str) -> None:
    """CLIError, before anything changes, when `policy` would reject waiting requests at once.

    A switch rejects the waiting requests the new policy's charge can never fit (naive
    charged 251 of them at once on a busy daemon, unasked). The daemon has no dry run; the
    pool's own estimate at max_model_len says whether a request can fit under the charge:
    naive charges every request that, so all waiting would go; guaranteed and predictive
    charge up to it, so some may. Optimistic charges the prompt, already admitted once.
    """
    from kvbudget.daemon.wire import convert
    from kvbudget.v1 import observer_pb2

    s = daemon.snapshot()
    waiting, max_len = s.num_waiting, s.plan.max_model_len_tokens
    if policy == "optimistic" or not waiting or not max_len or convert.policy_from_proto(s.policy) == policy:
        return
    estimate = daemon.call(daemon.observer.Estimate, observer_pb2.EstimateRequest(tokens_per_request=max_len))
    fits = estimate.naive_max_concurrency if policy == "naive" else estimate.max_concurrency
    if fits >= 1:
        return
    requests = f"{waiting} waiting request{'s' if waiting != 1 else ''}"
    how = (f"all {requests} would be rejected" if policy == "naive" else f"up to {requests} may be rejected")
    raise CLIError(
        f"set-policy {policy}: {how} at once (never_fits: a request of max_model_len, {max_len} tokens, "
        f"cannot fit this pool under {policy}); pass --yes to switch anyway"
    )


def _queue_moves(admitted: int, rejected_by_reason: dict[str, int]) -> str:
    """What a switch did to the waiting queue, said after the switch ("" when nothing)."""
    parts = []
    if admitted:
        parts.append(f"{admitted} waiting request{'s' if admitted != 1 else ''} admitted")
    rejected = sum(rejected_by_reason.values())
    if rejected:
        reasons = ", ".join(f"{reason} {count}" for reason, count in rejected_by_reason.items())
        parts.append(f"{rejected} waiting request{'s' if rejected != 1 else ''} rejected ({reasons})")
    return "; " + "; ".join(parts) if parts else ""
