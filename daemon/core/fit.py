"""Does a request fit now, and with what? The admission test, free of side effects.

`plan` works out what admitting a waiting request would take under a policy (its hits,
base, first chunk, held blocks, charge, and `need`: what the pool must find); `refusal`
says why it cannot be admitted now, or for good, or None. The formulas are budget.py's;
the memos only remember their answers (docs/architecture/core.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbudget.daemon.core.admission_config import AdmissionConfig
from kvbudget.daemon.core.budget import blocks_held, request_naive, request_worst_case
from kvbudget.daemon.core.ledger import BlockLedger
from kvbudget.daemon.core.policies import Policy
from kvbudget.daemon.core.predictor import OutputLengthPredictor
from kvbudget.daemon.core.prefix_hits import (
    PrefixHit,
    find_prefix_hit,
    hit_ids,
    layout_supports_prefix_cache,
    no_hit,
)
from kvbudget.daemon.core.records import Reason
from kvbudget.daemon.core.requests import RequestState
from kvbudget.daemon.core.spec import KVCacheLayout

_MEMO_LIMIT = 65536


@dataclass(slots=True)  # not frozen: built on every admission attempt, frozen init is slow
class Plan:
    hit: PrefixHit
    base: tuple[int, ...]  # the policy's reservation per group
    num_tokens: int  # slots of the first chunk
    held: list[int]  # blocks per group for those slots, hits included (the request's own list)
    held_tuple: tuple[int, ...]  # the same, shared: the ADMIT decision's blocks_held
    reserved: tuple[int, ...]  # max(held, base) per group: the ADMIT decision's blocks_reserved
    predicted: int  # predictive: output tokens reserved for
    charge: int  # Σ max(held, base): what the request is charged (its tenant: less shared hits)
    need: int  # what the pool must find: charge - hits held by others (full groups)


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: Reason
    final: bool  # True: reject for good; False: wait
    detail: str = ""


class Memo(dict):
    """A dict that fills a missing entry with `compute(key)`, forgetting all past
    _MEMO_LIMIT entries. A hit is the dict's own lookup, in C: no Python frame, which
    matters on the paths every submit and admission attempt takes."""

    __slots__ = ("_compute",)

    def __init__(self, compute) -> None:
        super().__init__()
        self._compute = compute

    def __missing__(self, key):
        if len(self) > _MEMO_LIMIT:
            self.clear()
        value = self[key] = self._compute(key)
        return value


class FitCheck:
    """Whether a request fits now (`plan`, then `refusal`), with the margins the config sets."""

    def __init__(
        self, layout: KVCacheLayout, ledger: BlockLedger, predictor: OutputLengthPredictor, config: AdmissionConfig
    ) -> None:
        self.layout = layout
        self.ledger = ledger
        self.predictor = predictor
        self.F = config.max_num_batched_tokens
        self.prefix_caching = config.enable_prefix_caching and layout_supports_prefix_cache(layout)
        self.whole_prompt = config.admit_on == "whole_prompt"
        self.budget: list[int] | None = None  # [tokens, sequences] the engine's step can still start
        self.capacity = ledger.pool.capacity  # fixed for the pool's life; read on every test
        self.retune(config)
        self.naive_base = request_naive(layout, config.max_model_len).per_group
        self._no_hit = no_hit(len(layout.groups))
        self._no_base = (0,) * len(layout.groups)  # == worst(0): a request of no tokens holds nothing
        # The budget formulas' answers, remembered: `worst[n]` per group and `worst_total[n]`
        # for n tokens, `held[(n, computed)]` per group (shared tuples: do not mutate).
        self.worst: Memo[int, tuple[int, ...]] = Memo(self._worst)
        self.worst_total: Memo[int, int] = Memo(lambda n: sum(self.worst[n]))
        self.held: Memo[tuple[int, int], tuple[int, ...]] = Memo(self._held)
        self._expected: dict[tuple[int, int, int], tuple[int, ...]] = {}
        self.decode_ahead_tokens = layout.block_size  # learned: see observe_decode_growth

    def retune(self, config: AdmissionConfig) -> None:
        """The margins a config reload may change: each is read when a request is tried."""
        self.lookahead_tokens = config.lookahead_tokens
        self.watermark_blocks = int(config.watermark * self.capacity)
        self.reject_over_quota = config.reject_over_quota

    # ------------------------------------------------------------------ memos
    def _worst(self, num_tokens: int) -> tuple[int, ...]:
        return request_worst_case(self.layout, num_tokens, self.F).per_group

    def _held(self, key: tuple[int, int]) -> tuple[int, ...]:
        num_tokens, num_computed = key
        return tuple(blocks_held(s, num_tokens, num_computed) for s in self.ledger.specs)

    def observe_decode_growth(self, tokens_ahead: int) -> None:
        """A decoding request asked for slots `tokens_ahead` past what it computed: an
        engine that grows several blocks at a time holds that many more in a window."""
        if tokens_ahead > self.decode_ahead_tokens:
            self.decode_ahead_tokens = min(tokens_ahead, self.F)

    def expected(self, prompt: int, predicted: int, resume_len: int, max_len: int) -> tuple[int, ...]:
        """The predictive base per group: what the request holds while it decodes at its
        predicted length n = prompt + predicted — `blocks_held(n + ahead, n - 1)`, ahead
        being the most the engine was seen to grow past its computed tokens while decoding
        (one block until then). In a full-attention group that is the worst case at n; in
        a window group only the window, not the prefill transient (the whole first chunk),
        which the first chunk holds anyway (charged as held) and which the worst case would
        keep promised for the request's whole life: that alone cost predictive ~40% of
        optimistic's throughput on a sliding-window model (Azure, gpt-oss-120b).
        The transient is reserved where a later allocation must find it: a prompt longer
        than one chunk (F) grows chunk by chunk, and a request coming back from a
        preemption reserves at least the worst case of the length it had reached (as
        under the other policies), so their prefill is covered."""
        n = min(max_len, prompt + predicted)
        prefill = max(resume_len, prompt if prompt > self.F else 0)
        key = (n, prefill, self.decode_ahead_tokens)
        base = self._expected.get(key)
        if base is None:
            if len(self._expected) > _MEMO_LIMIT:
                self._expected.clear()
            decoding = map(min, self.worst[n], self.held[n + self.decode_ahead_tokens, n - 1])
            if prefill:
                decoding = map(max, decoding, self.worst[min(prefill, max_len)])
            base = self._expected[key] = tuple(decoding)
        return base

    # ------------------------------------------------------------------ the test
    def set_budget(self, tokens: int | None, seqs: int | None) -> None:
        """Until called again with (None, None): admit while the engine can still start
        `tokens` tokens and `seqs` sequences in this step, each first chunk within the
        tokens left (vLLM admits while its step's token budget lasts). None: no bound."""
        if tokens is None and seqs is None:
            self.budget = None
        else:
            self.budget = [1 << 62 if tokens is None else tokens, 1 << 62 if seqs is None else seqs]

    def _base(self, r: RequestState, policy: Policy, prompt: int) -> tuple[int, tuple[int, ...]]:
        """(predicted output, the policy's base per group): what `plan` reserves whatever
        the prefix cache holds (plan works it out inline, alike: its hot path)."""
        if policy.uses_prediction:
            predicted = self.predictor.predict(r.spec.tenant, r.max_len - prompt)
            return predicted, self.expected(prompt, predicted, r.resume_len, r.max_len)
        if policy.charges_naive:
            return 0, self.naive_base
        # length 0 (optimistic, not preempted): nothing reserved, no memo lookup
        whole = policy.checks_admit_on and self.whole_prompt
        length = 0 if whole else policy.reserved_length(prompt, r.max_len, r.resume_len, 0)
        return 0, self.worst[length] if length else self._no_base

    def surely_unrefused(self, r: RequestState, policy: Policy, anything_running: bool) -> bool:
        """Whether `refusal(r, plan(r))` is None whatever the prefix cache holds: the
        tenant has no quota, and the most the plan can need (nothing of it shared, every
        slot up to its target held: a hit only lowers `held` below blocks_held(target, 0))
        fits the pool and the spare with the watermark. The controller then asks backfill
        before the plan, sparing a kept-back request its prefix lookup (admission.py)."""
        if self.ledger.tenants[r.spec.tenant].max_share is not None:
            return False
        prompt = r.spec.prompt_tokens
        base = self._base(r, policy, prompt)[1]
        full = target = r.resume_len or prompt
        if policy.uses_lookahead:
            target = min(target + self.lookahead_tokens, r.max_len)
        most = self.held[target, 0]
        need = charge = sum(most) if base is self._no_base else sum(map(max, most, base))
        if base is self._no_base and policy.checks_admit_on and self.whole_prompt:
            need = max(need, self.worst_total[full])
        spare = self.ledger.spare
        if charge > self.capacity or need > spare:
            return False
        return not (policy.uses_watermark and anything_running and spare - need < self.watermark_blocks)

    def plan(self, r: RequestState, policy: Policy) -> Plan:
        spec = r.spec
        prompt = spec.prompt_tokens
        if self.prefix_caching and spec.prefix_hashes:
            hit = find_prefix_hit(self.ledger.pool, self.layout, spec.prefix_hashes, prompt)
        else:
            hit = self._no_hit
        hit_tokens = hit.num_tokens
        # _base's answer, worked out here (a call less on every admission attempt)
        if policy.uses_prediction:
            predicted = self.predictor.predict(spec.tenant, r.max_len - prompt)
            base = self.expected(prompt, predicted, r.resume_len, r.max_len)
        elif policy.charges_naive:
            predicted = 0
            base = self.naive_base
        else:  # length 0 (optimistic, not preempted): nothing reserved, no memo lookup
            predicted = 0
            whole = policy.checks_admit_on and self.whole_prompt
            length = 0 if whole else policy.reserved_length(prompt, r.max_len, r.resume_len, 0)
            base = self.worst[length] if length else self._no_base
        target = r.resume_len or prompt
        full = target  # whole_prompt: this length must fit now, only its first chunk is allocated
        if policy.uses_lookahead:
            target = min(target + self.lookahead_tokens, r.max_len)
        budget = self.budget  # the first chunk: F tokens, or what the step has left
        first_chunk = hit_tokens + (self.F if budget is None or budget[0] > self.F else budget[0])
        num_tokens = target if target < first_chunk else first_chunk
        held = self.held[num_tokens, hit_tokens]
        # Built once here: the charge and, if admitted, the ADMIT decision use it. With no
        # base (optimistic) it is `held` itself: the map of max costs a third of a plan;
        # with one group (most models) it is whichever of the two tuples is larger.
        if base is self._no_base:
            reserved = held
            charge = sum(held)
        elif len(held) == 1:
            reserved = held if held[0] >= base[0] else base
            charge = reserved[0]
        else:
            reserved = tuple(map(max, held, base))
            charge = sum(reserved)
        need = charge
        if base is self._no_base and policy.checks_admit_on and self.whole_prompt and full > num_tokens:
            # vLLM's full-sequence check: the whole length's blocks (a window group's capped
            # at what chunked prefill holds at once), hits included, must be free now.
            need = self.worst_total[full]
        if hit.num_blocks:  # window-group hits are not free for good: see ledger.py
            need -= sum(hit.shared[g] for g in self.ledger.prefix_groups)
        return Plan(hit, base, num_tokens, list(held), held, reserved, predicted, charge, need)

    def refusal(self, r: RequestState, plan: Plan, policy: Policy, anything_running: bool) -> Refusal | None:
        ledger = self.ledger
        capacity = self.capacity
        charge = plan.charge
        if charge > capacity:
            return Refusal(Reason.NEVER_FITS, True, f"{policy.name} charges {charge} > pool {capacity}")
        account = ledger.tenants[r.spec.tenant]
        if account.max_share is not None:  # most tenants have no quota: skip the call
            quota = account.quota_blocks(capacity)
            more = charge  # what the tenant's charge would grow by
            if plan.hit.num_blocks and account.prefix_blocks:  # full-group hits it holds already
                more -= len(account.prefix_blocks.intersection(hit_ids(plan.hit, ledger.prefix_groups)))
            if quota is not None and account.charged + more > quota:
                detail = f"tenant {r.tenant!r} at {account.charged} + {more} > quota {quota}"
                return Refusal(Reason.TENANT_QUOTA, charge > quota or self.reject_over_quota, detail)
        spare = ledger.pool.num_free_blocks - ledger.owed - ledger.window_share_reserve  # ledger.spare
        if plan.need > spare:
            reason = Reason.POOL_FULL if plan.need > ledger.pool.num_free_blocks else Reason.BUDGET_FULL
            return Refusal(reason, False)
        # The watermark never blocks an idle pool: that would stall admission for good.
        if policy.uses_watermark and anything_running and spare - plan.need < self.watermark_blocks:
            return Refusal(Reason.WATERMARK, False)
        return None


def extra_for_growth(r: RequestState, new_held: list[int]) -> int:
    """Blocks growing to `new_held` takes beyond what `r` was promised (may be <= 0)."""
    delta = owed_after = 0
    for h, nh, b in zip(r.held, new_held, r.base):
        delta += nh - h
        if b > nh:
            owed_after += b - nh
    return delta - (r.owed - owed_after)
