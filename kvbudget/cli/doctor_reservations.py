"""`kvbudget doctor`'s reservations check, and its reading of what sizes them.

The snapshot gives only totals, so the cause (max_model_len, the clients' max new
tokens, or either) is judged on bounds that prefix sharing cannot move: docs/architecture/cli.md.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvbudget.cli.doctor_checks import requests_text
from kvbudget.cli.doctor_samples import Finding, PoolSample, Status, Thresholds

# The values of the reservations check's `data["cause"]` (reservation_cause): what sizes
# the reservations. Each, and what an operator does about it: docs/cli-reference.md.
RESERVATION_CAUSES = ("max_model_len", "max_new_tokens", "unknown")


def check_reservations(samples: Sequence[PoolSample], t: Thresholds) -> Finding:
    """Reservations far beyond what requests hold: every request is charged for its whole
    possible length (max_model_len or a large max_new_tokens), most of which never comes."""
    last = samples[-1]
    data: dict[str, object] = {"held": last.held, "reserved": last.reserved, "policy": last.policy}
    if last.reserved and last.reserved >= t.reservation_ratio * max(last.held, 1):
        cause, why = reservation_cause(last)
        data["cause"] = cause
        return Finding(
            "reservations",
            Status.WARN,
            f"{last.reserved} blocks reserved for only {last.held} held "
            f"({last.reserved / max(last.held, 1):.1f}x): {why}",
            knob="lower max new tokens (or max_model_len), or use the layer-aware policy: "
            "[admission] policy = predictive or optimistic (AdminService.SetPolicy switches live)",
            data=data,
        )
    return Finding(
        "reservations",
        Status.OK,
        f"reserved {last.reserved} / held {last.held} blocks",
        data=data,
    )


def reservation_cause(sample: PoolSample) -> tuple[str, str]:
    """What sizes the reservations, "max_model_len", "max_new_tokens" or "unknown" (it may
    be either), and the clause that says so with its figures. The snapshot gives only
    totals: the committed blocks over the running requests are read against what one
    request at max_model_len commits (the reading, step by step: docs/architecture/cli.md)."""
    plan = sample.plan
    max_len = plan.max_model_len if plan is not None else 0
    if sample.policy == "naive":
        return "max_model_len", (
            "max_model_len-sized reservations: the naive policy charges every request "
            + (f"max_model_len {max_len}" if max_len else "max_model_len")
            + ", whatever its max new tokens"
        )
    either = "max_model_len-sized reservations or the clients' large max new tokens, the totals cannot tell which"
    if plan is None or not max_len or plan.block_size <= 0 or not sample.running:
        return "unknown", either
    committed, running = sample.held + sample.reserved, sample.running
    if plan.blocks_at_max_model_len:  # the plan's groups: every group's share, windows capped
        at_max_len = plan.blocks_at_max_model_len
        takes = f"max_model_len {max_len} takes {at_max_len} in all its KV-cache groups"
    else:  # a full-attention group's share only
        at_max_len = -(-max_len // plan.block_size)
        takes = f"max_model_len {max_len} takes cdiv({max_len}, {plan.block_size}) = {at_max_len}"
    figures = f"{committed} blocks committed to {requests_text(running)}, {committed / running:.4g} each; {takes}"

    if committed == at_max_len * running:
        return "max_model_len", (
            f"max_model_len-sized reservations ({figures}: clients send no max new tokens, or ones that reach it)"
        )
    at_most = _most_at_max_model_len(sample, at_max_len)
    if 2 * at_most <= running:
        return "max_new_tokens", f"reservations sized by the clients' max new tokens ({figures})"
    if committed > at_max_len * running:  # (only with a full-attention group's share to go by)
        return "unknown", f"{either} ({figures} in a full-attention group: the model has more groups)"
    if 2 * committed <= at_max_len * running:  # low, but shared prefix blocks may be why
        return "unknown", (
            f"reservations sized by the clients' max new tokens if the requests share no long prompt "
            f"prefix ({figures}; prefix blocks they share count once: up to {at_most} of them may be "
            f"at max_model_len)"
        )
    return "unknown", f"{either} ({figures})"


def _most_at_max_model_len(sample: PoolSample, at_max_len: int) -> int:
    """The most running requests that can be charged for max_model_len (`at_max_len`
    blocks in a full-attention group), whatever prefix blocks they share: each is owed at
    least at_max_len - held, and all of them hold at most running x held blocks in all."""
    held, reserved, running = sample.held, sample.reserved, sample.running
    most = min(running, (reserved + running * held) // at_max_len)
    if held < at_max_len:
        most = min(most, reserved // (at_max_len - held))
    return most
