"""The controller's controls, as the daemon's operator and lifecycle use them: switch the
policy, set a tenant's quota, retune the queue and the fit margins live, drain, and number
the decisions on from the log's last. `AdmissionController` (admission.py) inherits them;
they only set what its own calls read.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from kvbudget.daemon.core import policies
from kvbudget.daemon.core.admission_config import POLICIES, AdmissionConfig, AdmissionError
from kvbudget.daemon.core.records import Decision, Reason

if TYPE_CHECKING:
    from kvbudget.daemon.core.decisions import DecisionRecorder
    from kvbudget.daemon.core.fit import FitCheck
    from kvbudget.daemon.core.ledger import BlockLedger


class AdmissionControls:
    """The controller's settings, changed live (mixed into AdmissionController)."""

    config: AdmissionConfig
    policy: policies.Policy
    ledger: BlockLedger
    admitting: bool
    _fit: FitCheck
    _record: DecisionRecorder
    _dirty: bool
    _epoch: int

    def schedule(self, now: float, *, full_pass: bool = True) -> list[Decision]:
        raise NotImplementedError  # the controller's

    def number_from(self, seq: int) -> None:
        """Number the decisions on from `seq` (a restarted daemon: the log's last), so each
        seq stays unique in the log. Only before the first decision."""
        if self._record.seq:
            raise AdmissionError("seq", f"decisions are already numbered up to {self._record.seq}")
        if seq < 0:
            raise AdmissionError("seq", f"must not be negative, got {seq}")
        self._record.seq = seq

    def close_admissions(self, now: float) -> list[Decision]:
        """Drain: admit nothing more, ever. Every waiting request is REJECTed `draining`
        now (its engine can send it elsewhere rather than wait for good), and so is any
        later submit or preempted request; running requests keep their promises."""
        self.admitting = False
        return self.schedule(now)

    def set_policy(self, policy: str, now: float) -> list[Decision]:
        """Switch the policy for new admissions; running requests keep their promises.

        The POLICY decision comes first, then what the new policy does to the queue at
        once (a looser one may admit; naive may REJECT what its charge can never fit).
        The policy in force already: no decision at all (a no-op is not a switch)."""
        if policy not in policies.POLICIES:
            raise AdmissionError("policy", f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}")
        previous = self.policy.name
        if policy == previous:
            return []
        config = self.config
        self.policy = policies.chosen(policy, config.predictive_admission, config.optimistic_peak)
        self._dirty = True
        self._epoch += 1
        return [self._record.switched(previous, policy, now), *self.schedule(now)]

    def set_tenant_quota(self, tenant: str, max_share: float | None, weight: float = 1.0) -> None:
        """A tenant's maximum share of the pool (None or 0: no quota) and fair-share weight."""
        self.ledger.set_quota(tenant, max_share, weight)
        self._dirty = True
        self._epoch += 1

    def note_change(self, reason: Reason, tenant: str, detail: str, now: float) -> Decision:
        """The decision that records an operator's change (ADMIN) for the log; changes nothing."""
        return self._record.changed(reason, tenant, detail, now)

    def retune(
        self, *, max_queue_len: int, backfill_depth: int, max_head_wait_s: float, watermark: float,
        lookahead_tokens: int, reject_over_quota: bool,
    ) -> None:
        """The queue's bounds and the fit margins, live (a config reload): what runs or waits
        stays, even past a lower max_queue_len. Raises AdmissionError, changing nothing."""
        config = dataclasses.replace(
            self.config, max_queue_len=max_queue_len, backfill_depth=backfill_depth, max_head_wait_s=max_head_wait_s,
            watermark=watermark, lookahead_tokens=lookahead_tokens, reject_over_quota=reject_over_quota,
        )
        config.validate()
        self.config = config
        self._fit.retune(config)
        self._dirty = True  # a deeper backfill, a longer head wait or a lower watermark may admit at once
        self._epoch += 1
