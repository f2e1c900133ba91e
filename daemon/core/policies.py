"""Admission policies: what a request reserves when it is admitted (its *base* per group),
and whether it may be preempted when it grows past that and the pool is dry:
optimistic (base 0, preempts), guaranteed (worst case at L, never preempted), predictive
(base 0, admitted only while the predicted peak fits: future_peak.py; or, "reserve", what
it holds decoding at a predicted length) and naive (max_model_len in every group, a
what-if baseline). `chosen` picks the variant the settings name. Each policy in detail:
docs/architecture/core.md.
"""

from __future__ import annotations


class Policy:
    name = ""
    preempts = False  # answer to a denied growth: preempt victims (else DENY)
    uses_watermark = False  # keep config.watermark of the pool free at admission
    uses_lookahead = False  # allocate config.lookahead_tokens beyond the prompt
    uses_prediction = False
    charges_naive = False  # base = budget.request_naive(max_model_len), whatever the request
    # config.admit_on applies: "whole_prompt" admits once the whole prompt fits and reserves
    # nothing, not even for a preempted request (vLLM 0.33's default)
    checks_admit_on = False
    gates_on_peak = False  # admits only while the predicted peak fits (future_peak.py)
    # Holds the engine to its contract: slots at most F ahead of computed tokens, what the
    # window groups' worst case assumes; a grow past that is refused, never denied.
    bounds_ahead = False

    def reserved_length(self, prompt: int, max_len: int, resume_len: int, predicted: int) -> int:
        """Tokens whose worst case (budget.request_worst_case) is the base; 0: none.

        `max_len` is L; `resume_len` is 0 or the length a preempted request had reached."""
        raise NotImplementedError


class Optimistic(Policy):
    name = "optimistic"
    preempts = True
    uses_watermark = True
    uses_lookahead = True
    checks_admit_on = True

    def reserved_length(self, prompt: int, max_len: int, resume_len: int, predicted: int) -> int:
        return resume_len  # admit_on "first_chunk"; with "whole_prompt" FitCheck reserves none


class Guaranteed(Policy):
    name = "guaranteed"
    bounds_ahead = True

    def reserved_length(self, prompt: int, max_len: int, resume_len: int, predicted: int) -> int:
        return max_len


class PeakOptimistic(Optimistic):
    """optimistic, admitting only while the predicted peak fits too (optimistic_peak)."""

    gates_on_peak = True


class Predictive(Policy):
    """Future-peak admission: admitted as optimistic's (admit_on), reserving nothing, and
    only while the predicted peak of the running batch plus it fits; preemption stays
    the safety net."""

    name = "predictive"
    preempts = True
    checks_admit_on = True
    gates_on_peak = True

    def reserved_length(self, prompt: int, max_len: int, resume_len: int, predicted: int) -> int:
        return resume_len  # as optimistic's


class ReservingPredictive(Policy):
    """predictive_admission = "reserve": each request reserves what it holds decoding at
    its predicted length."""

    name = "predictive"
    preempts = True
    uses_prediction = True

    def reserved_length(self, prompt: int, max_len: int, resume_len: int, predicted: int) -> int:
        # The length its reservation is sized for; fit.FitCheck.expected sizes it.
        return min(max_len, max(prompt + predicted, resume_len))


class Naive(Policy):
    name = "naive"
    charges_naive = True

    def reserved_length(self, prompt: int, max_len: int, resume_len: int, predicted: int) -> int:
        return 0


def contract_broken(num_tokens: int, computed: int, limit: int) -> str:
    """Why a grow of a `bounds_ahead` request is refused (validation.py: INVALID_ARGUMENT)."""
    return (
        f"{num_tokens} slots are {num_tokens - computed} ahead of the {computed} computed tokens: "
        f"the engine contract for a guaranteed request is at most max_num_batched_tokens ({limit}) "
        "ahead (report progress in this step or before it)"
    )


POLICIES: dict[str, Policy] = {p.name: p for p in (Optimistic(), Guaranteed(), Predictive(), Naive())}
_VARIANTS = {("optimistic", True): PeakOptimistic(), ("predictive", "reserve"): ReservingPredictive()}


def chosen(name: str, predictive_admission: str, optimistic_peak: bool) -> Policy:
    """The policy `name` as the admission settings shape it."""
    key = (name, predictive_admission if name == "predictive" else optimistic_peak)
    return _VARIANTS.get(key) or POLICIES[name]
