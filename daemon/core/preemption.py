"""Victims: whom a growth that does not fit preempts, and the length a victim comes back at.

Optimistic and predictive requests only, the worst first (largest priority value, then
the latest admitted, as vLLM's scheduler picks); the growing request stops the search and
may preempt itself. A victim comes back at the length it had reached and reserves its
worst case (docs/architecture/core.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from kvbudget.daemon.core.fit import extra_for_growth
from kvbudget.daemon.core.ledger import BlockLedger
from kvbudget.daemon.core.policies import POLICIES
from kvbudget.daemon.core.records import Decision, Reason
from kvbudget.daemon.core.requests import RequestState

# (victim, reason, now, detail, resume_len) -> its PREEMPT decision: the controller's _preempt
Preempt = Callable[[RequestState, Reason, float, str, int], Decision]


def victims(running: Iterable[RequestState]) -> list[RequestState]:
    """The running requests a growth may preempt, worst first (see the module docstring)."""
    return sorted(
        (v for v in running if POLICIES[v.policy].preempts),
        key=lambda v: (v.spec.priority, v.admitted),
        reverse=True,
    )


def preempt_for(
    r: RequestState,
    num_tokens: int,
    new_held: list[int],
    running: Iterable[RequestState],
    ledger: BlockLedger,
    preempt: Preempt,
    now: float,
) -> list[Decision]:
    """Preempt victims, worst first, until `r`'s growth fits; `r` itself stops the search."""
    decisions: list[Decision] = []
    for v in victims(running):
        if extra_for_growth(r, new_held) <= ledger.spare:
            break
        if v is r:
            detail = "preempted itself: the pool is dry and nothing running ranks below it"
            # It comes back only when the length it asked for fits, not the one it had:
            # else it would be readmitted at once and preempt itself again.
            decisions.append(preempt(r, Reason.GROWTH, now, detail, num_tokens))
            break
        reason = Reason.PRIORITY if v.spec.priority > r.spec.priority else Reason.GROWTH
        decisions.append(preempt(v, reason, now, f"to let {r.request_id!r} grow", 0))
    return decisions


def resume_length(v: RequestState, asked: int = 0) -> int:
    """The length a preempted request is readmitted at (and reserves the worst case of):
    the longest of its prompt, the slots it held and the length it `asked` to grow to
    (its own growth preempted it), capped at its maximum length L."""
    return min(max(v.spec.prompt_tokens, v.num_tokens, asked), v.max_len)
