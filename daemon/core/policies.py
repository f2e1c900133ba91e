"""Admission policies: what a request reserves when it is admitted, and what happens when
it wants to grow past that and the pool is dry.

Each policy names a *base* reservation per KV-cache group, fixed at admission: the budget
worst case (`budget.request_worst_case`) of a token length it picks, or for naive the
layer-unaware `budget.request_naive` at max_model_len. The
request is promised `max(held, base)` blocks per group; admission needs the blocks it does
not get from other requests' shared prefix blocks to be free and unpromised.

  optimistic  base 0: hold the prompt (+ lookahead), grow on demand, preempt when dry
              (vLLM, TensorRT-LLM MAX_UTILIZATION). A request coming back from a
              preemption reserves the worst case of the length it had reached, so it cannot
              be preempted again by its own recompute.
  guaranteed  base = worst case at L (prompt + max new tokens, capped by window / chunk /
              cap per group): never denied, never preempted (GUARANTEED_NO_EVICT).
  predictive  base = what the request holds while decoding at prompt + predicted output
              (predictor.py says how long; fit.FitCheck.expected what that holds: the worst
              case in full-attention groups, the window — not the prefill transient — in
              window groups); preempts only when a request outgrows that and nothing is
              spare.
  naive       base = every group charged for max_model_len (the anti-pattern, as a
              what-if baseline); never preempts.
"""

from __future__ import annotations


class Policy:
    name = ""
    preempts = False  # answer to a denied growth: preempt victims (else DENY)
    uses_watermark = False  # keep config.watermark of the pool free at admission
    uses_lookahead = False  # allocate config.lookahead_tokens beyond the prompt
    uses_prediction = False
    charges_naive = False  # base = budget.request_naive(max_model_len), whatever the request

    def reserved_length(self, prompt: int, max_len: int, resume_len: int, predicted: int) -> int:
        """Tokens whose worst case (budget.request_worst_case) is the base; 0: none.

        `max_len` is L; `resume_len` is 0 or the length a preempted request had reached."""
        raise NotImplementedError


class Optimistic(Policy):
    name = "optimistic"
    preempts = True
    uses_watermark = True
    uses_lookahead = True

    def reserved_length(self, prompt: int, max_len: int, resume_len: int, predicted: int) -> int:
        return resume_len


class Guaranteed(Policy):
    name = "guaranteed"

    def reserved_length(self, prompt: int, max_len: int, resume_len: int, predicted: int) -> int:
        return max_len


class Predictive(Policy):
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


POLICIES: dict[str, Policy] = {p.name: p for p in (Optimistic(), Guaranteed(), Predictive(), Naive())}
