"""Predicted output length for the predictive policy, learned online from finished requests.

A high quantile (default p90) of recent output lengths, per tenant once it has
`min_samples`, else over all tenants, else the request's own max new tokens; each
preemption moves the quantile toward 1 and each finish decays it back. Why a quantile,
and why p90 (measured): docs/architecture/core.md.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections import OrderedDict, deque


class _Window:
    __slots__ = ("values", "_sorted")

    def __init__(self, size: int) -> None:
        self.values: deque[int] = deque(maxlen=size)
        # The values sorted, built by the first quantile() and from then on kept sorted
        # by add: a predictive submit after every finish would otherwise re-sort the
        # whole window (~10 us for 256 mixed lengths); a window nobody asks a quantile of
        # (every policy but predictive) never pays for it.
        self._sorted: list[int] | None = None

    def add(self, value: int) -> None:
        values, ordered = self.values, self._sorted
        if ordered is not None and values.maxlen:  # (a window of size 0 keeps nothing)
            if len(values) == values.maxlen:  # the deque drops its oldest value
                del ordered[bisect_left(ordered, values[0])]
            insort(ordered, value)
        values.append(value)

    def ordered(self) -> list[int]:
        if self._sorted is None:
            self._sorted = sorted(self.values)
        return self._sorted

    def quantile(self, q: float) -> int:
        values = self.ordered()
        # nearest-rank quantile: the smallest value with at least q of the samples at or below it
        rank = max(1, math.ceil(q * len(values)))
        return values[rank - 1]


class OutputLengthPredictor:
    def __init__(
        self,
        quantile: float = 0.9,
        window: int = 256,
        min_samples: int = 16,
        decay: float = 0.002,
        max_tenant_windows: int = 1024,
    ) -> None:
        if not 0.0 < quantile <= 1.0:
            raise ValueError(f"quantile must be in (0, 1], got {quantile}")
        if max_tenant_windows < 1:
            raise ValueError(f"max_tenant_windows must be >= 1, got {max_tenant_windows}")
        self.base_quantile = quantile
        self.quantile = quantile  # current, raised by preemptions
        self.window = window
        self.min_samples = min_samples
        self.decay = decay
        self._all = _Window(window)
        # Tenant names are whatever engines send (a user, an API key, an adapter), so over a
        # daemon's weeks they need not repeat: a window per name ever seen grew without
        # bound (~1.5 KB a tenant at 20 samples, ~11 KB with a full window: 100,000 tenants of 20
        # samples took 155 MB, 1.7 MB now).
        # Only the `max_tenant_windows` tenants that finished a request most recently keep
        # one; a tenant whose window went is predicted from everyone's until it has
        # `min_samples` again.
        self.max_tenant_windows = max_tenant_windows
        self._by_tenant: OrderedDict[str, _Window] = OrderedDict()  # least recently finished first
        self._latest_tenant: str | None = None  # the last key of _by_tenant

    def observe(self, tenant: str, output_tokens: int) -> None:
        """A request finished after `output_tokens` new tokens.

        Called on every finish whatever the policy (a switch to predictive must find the
        samples)."""
        # _Window.add, inlined where it has no sorted copy to keep up (every window, unless
        # the policy is predictive).
        everyone = self._all
        if everyone._sorted is None:
            everyone.values.append(output_tokens)
        else:
            everyone.add(output_tokens)
        by_tenant = self._by_tenant
        window = by_tenant.get(tenant)
        if window is not None:
            if tenant != self._latest_tenant:  # (already the most recent: most finishes, one tenant)
                by_tenant.move_to_end(tenant)
                self._latest_tenant = tenant
        else:
            self._latest_tenant = tenant
            if len(by_tenant) >= self.max_tenant_windows:
                by_tenant.popitem(last=False)  # the tenant that finished a request least recently
            window = by_tenant[tenant] = _Window(self.window)
        if window._sorted is None:
            window.values.append(output_tokens)
        else:
            window.add(output_tokens)
        quantile = self.quantile - self.decay  # max(base_quantile, ...) without the call
        self.quantile = quantile if quantile > self.base_quantile else self.base_quantile

    def on_preemption(self) -> None:
        """A predicted request ran out: reserve more for the ones admitted next."""
        self.quantile = (self.quantile + 1.0) / 2.0

    def predict(self, tenant: str, max_new_tokens: int) -> int:
        """Output tokens to reserve for a new request (never above its own maximum)."""
        window = self._by_tenant.get(tenant)
        if window is None or len(window.values) < self.min_samples:
            window = self._all
        if len(window.values) < self.min_samples:
            return max_new_tokens
        return min(max_new_tokens, window.quantile(self.quantile))

    def remaining(self, tenant: str, generated: int, max_remaining: int, quantile: float) -> int:
        """Output tokens a running request that has `generated` is predicted to have left
        (future_peak.py): the `quantile` of the lengths seen that are longer than that,
        minus it (as the preemptions raised `self.quantile`, the quantile is raised the same
        share of its way to 1). Nothing longer seen, or too few samples: `max_remaining`."""
        window = self._by_tenant.get(tenant)
        if window is None or len(window.values) < self.min_samples:
            window = self._all
        if len(window.values) < self.min_samples:
            return max_remaining
        values = window.ordered()
        first = bisect_right(values, generated)
        longer = len(values) - first
        if not longer:
            return max_remaining
        if self.quantile > self.base_quantile:  # raised by preemptions (base < 1 then)
            quantile = 1.0 - (1.0 - quantile) * (1.0 - self.quantile) / (1.0 - self.base_quantile)
        rest = values[first + max(1, math.ceil(quantile * longer)) - 1] - generated
        return rest if rest < max_remaining else max_remaining

    def num_samples(self, tenant: str | None = None) -> int:
        if tenant is None:
            return len(self._all.values)
        window = self._by_tenant.get(tenant)
        return len(window.values) if window else 0
