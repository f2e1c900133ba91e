"""What the admission controller is told (AdmissionConfig), and how it says it was misused.

"Does not fit" is a decision, never an exception; exceptions are for misuse (unknown or
duplicate ids, bad numbers) and name the field: AdmissionError, and its UnknownRequest and
DuplicateRequest. `AdmissionConfig.validate` names the first setting out of range the
same way. The controller (admission.py) re-exports all of these.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbudget.daemon.core import policies

POLICIES = tuple(policies.POLICIES)  # ("optimistic", "guaranteed", "predictive", "naive")
# When optimistic admits a waiting request: once its whole prompt (a preempted request: the
# length it had reached) fits in the free blocks, as vLLM 0.33 does by default
# (`scheduler_reserve_full_isl`), or once its first prefill chunk fits (the rest may
# preempt others as it is computed). Either way only the first chunk is allocated.
ADMIT_ON = ("whole_prompt", "first_chunk")
# How predictive admits: "peak", while the predicted peak of the running batch plus the
# request fits (future_peak.py), reserving nothing; "reserve", each request reserves what
# it holds at its predicted length (the policy before future-peak admission).
PREDICTIVE_ADMISSION = ("peak", "reserve")


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
    admit_on: str = "whole_prompt"  # optimistic: one of ADMIT_ON
    enable_prefix_caching: bool = True
    lookahead_tokens: int = 0  # optimistic: slots allocated beyond the prompt at admission
    # optimistic: share of the pool kept free at admission. 1.5%: on issue 28's four rows
    # (docs/replay-compare.md) 1% preempted a third as often as vLLM, 2% lengthened the
    # gemma3 row's tail past vLLM's; the sweep is in the doc.
    watermark: float = 0.015
    max_queue_len: int = 0  # 0: unbounded
    backfill_depth: int = 16  # requests behind a blocked head that may be tried
    # Aging (aging.py): a head may be passed while it has waited less than a multiple of the
    # recent waits' median and, if > 0, less than max_head_wait_s (0: no fixed bound).
    max_head_wait_s: float = 0.0
    reject_over_quota: bool = False  # tenant over quota: reject (True) or queue (False)
    fair_share: bool = True  # across tenants: least charged per weight first (else arrival)
    predictor_quantile: float = 0.9  # predictive: output-length quantile reserved for
    # Future-peak admission (future_peak.py, docs/architecture/core.md).
    predictive_admission: str = "peak"  # one of PREDICTIVE_ADMISSION
    peak_quantile: float = 0.5  # quantile of the lengths seen past a request's own: what it has left
    optimistic_peak: bool = False  # optimistic admits only while the predicted peak fits too

    def validate(self) -> None:
        checks = (
            ("max_model_len", self.max_model_len >= 1, "must be at least 1"),
            ("max_num_batched_tokens", self.max_num_batched_tokens >= 1, "must be at least 1"),
            ("policy", self.policy in policies.POLICIES, f"must be one of {', '.join(POLICIES)}"),
            ("admit_on", self.admit_on in ADMIT_ON, f"must be one of {', '.join(ADMIT_ON)}"),
            ("lookahead_tokens", self.lookahead_tokens >= 0, "must not be negative"),
            ("watermark", 0.0 <= self.watermark < 1.0, "must be in [0, 1)"),
            ("max_queue_len", self.max_queue_len >= 0, "must not be negative"),
            ("backfill_depth", self.backfill_depth >= 0, "must not be negative"),
            ("max_head_wait_s", self.max_head_wait_s >= 0, "must not be negative"),
            ("predictor_quantile", 0.0 < self.predictor_quantile <= 1.0, "must be in (0, 1]"),
            ("predictive_admission", self.predictive_admission in PREDICTIVE_ADMISSION,
             f"must be one of {', '.join(PREDICTIVE_ADMISSION)}"),
            ("peak_quantile", 0.0 < self.peak_quantile <= 1.0, "must be in (0, 1]"),
        )
        for name, ok, message in checks:
            if not ok:
                raise AdmissionError(name, f"{message}, got {getattr(self, name)!r}")
