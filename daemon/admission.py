"""Admission controller: the public face of the pure core (no I/O, no gRPC, no clocks).

Callers pass `now` (seconds, any monotonic origin) to every call, so the same object runs
under the daemon, the offline replayer and the tests, deterministically.

Every mutating call returns the decisions it caused, in order. The caller's own request
comes first; then anything it triggered (a preemption to make room, queued requests
admitted once blocks came back, ...). "Does not fit" is a decision, never an exception;
exceptions are for misuse (unknown or duplicate ids, bad numbers) and name the field.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbudget.daemon.pool import BlockPool
from kvbudget.daemon.records import Decision, RequestSpec, Snapshot
from kvbudget.daemon.spec import KVCacheLayout

POLICIES = ("optimistic", "guaranteed", "predictive", "naive")


class AdmissionError(Exception):
    """Misuse of the controller; `field` names the offending input."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class UnknownRequest(AdmissionError):
    pass


class DuplicateRequest(AdmissionError):
    pass


@dataclass(frozen=True)
class AdmissionConfig:
    max_model_len: int
    max_num_batched_tokens: int = 8192  # F in the budget formulas
    policy: str = "optimistic"
    enable_prefix_caching: bool = True
    lookahead_tokens: int = 0  # optimistic: slots reserved beyond the prompt at admission
    watermark: float = 0.01  # optimistic: share of the pool kept free at admission
    max_queue_len: int = 0  # 0: unbounded
    backfill_depth: int = 16  # requests behind a blocked head that may be tried
    max_head_wait_s: float = 30.0  # aging: after this, nothing may pass the head
    reject_over_quota: bool = False  # tenant over quota: reject (True) or queue (False)


class AdmissionController:
    """See the module docstring. Implementation lives with the admission issue."""

    def __init__(
        self,
        layout: KVCacheLayout,
        num_blocks: int,
        config: AdmissionConfig,
    ) -> None:
        raise NotImplementedError

    pool: BlockPool
    layout: KVCacheLayout
    config: AdmissionConfig

    def submit(self, request: RequestSpec, now: float) -> list[Decision]:
        """ADMIT (with block ids per group), QUEUE or REJECT, then anything it caused."""
        raise NotImplementedError

    def grow(self, request_id: str, num_tokens: int, now: float) -> list[Decision]:
        """Extend a running request to `num_tokens` slots: GROW with new ids, or DENY
        (and, per policy, PREEMPT decisions for victims, possibly the request itself)."""
        raise NotImplementedError

    def progress(self, request_id: str, num_computed: int, now: float) -> list[Decision]:
        """Tokens computed so far: blocks out of the window go back (RECLAIM), full prompt
        blocks enter the prefix cache, queued requests may be admitted."""
        raise NotImplementedError

    def finish(self, request_id: str, now: float) -> list[Decision]:
        """RELEASE the request's blocks (prefix blocks stay cached), then admit from queue."""
        raise NotImplementedError

    def abort(self, request_id: str, now: float) -> list[Decision]:
        """Like finish for a running request; removes a queued one from the queue."""
        raise NotImplementedError

    def expire_engine(self, engine_id: str, now: float) -> list[Decision]:
        """The engine's lease lapsed: EXPIRE each of its requests, running or queued."""
        raise NotImplementedError

    def schedule(self, now: float) -> list[Decision]:
        """Admit what fits from the queue; reject requests whose deadline passed."""
        raise NotImplementedError

    def set_policy(self, policy: str, now: float) -> list[Decision]:
        raise NotImplementedError

    def set_tenant_quota(self, tenant: str, max_share: float | None, weight: float = 1.0) -> None:
        raise NotImplementedError

    def snapshot(self, now: float) -> Snapshot:
        raise NotImplementedError

    def check_integrity(self) -> None:
        raise NotImplementedError
