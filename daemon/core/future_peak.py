"""Future-peak admission: does the running batch plus a candidate stay within the pool at
every future step, if each request decodes one token a step and finishes at its predicted
length? (The Past-Future idea: the output lengths seen so far predict how long each running
request has left.) Model, formulas and figures: docs/architecture/core.md, "future_peak.py".

Each request is an `Item` (d, a, f, s): it finishes after `d` more decode steps; while it
runs it adds `a` blocks beyond its table's linear growth (the rest of its prompt, a window
still filling); at its finish it frees `f` blocks it holds now; `s` free slots are left in
the last block of its growing groups. At step t the requests with d >= t are alive, and
the pool holds, beyond today, in B-token blocks with G growing (full-attention) groups:

    delta(t) = sum_alive a + G * sum_alive (t - s + B - 1) / B - sum_finished f

(the growth of one request is exactly floor((t - s + B - 1) / B) blocks a group; summed
before the floor, so at most one block a request and group too many). Between finishes
delta only grows, so its peak is at some request's last step, t = d_k: one sort by d and
one sweep (`PeakIndex`), then each candidate in O(log n).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import accumulate
from typing import TYPE_CHECKING, NamedTuple

from kvbudget.daemon.core.spec import LayerKind

if TYPE_CHECKING:
    from kvbudget.daemon.core.admission_config import AdmissionConfig
    from kvbudget.daemon.core.decisions import DecisionRecorder
    from kvbudget.daemon.core.fit import FitCheck, Plan
    from kvbudget.daemon.core.ledger import BlockLedger
    from kvbudget.daemon.core.predictor import OutputLengthPredictor
    from kvbudget.daemon.core.requests import RequestState

_GROWING = (LayerKind.FULL, LayerKind.MLA)  # a block every B tokens, none ever released
_NONE = -(1 << 62)  # below any point: every point is >= -B * (blocks held today)


class Item(NamedTuple):
    d: int  # decode steps left, its last one included
    a: int  # blocks it adds now and keeps while it runs, beyond linear growth
    f: int  # blocks it holds now and frees when it finishes
    s: int  # free slots in its growing groups' last block (0 .. B - 1)


def delta_at(items: list[Item], t: int, B: int, G: int) -> int:
    """delta(t) in whole blocks (floor): the curve point by point, for tests and reports."""
    scaled = 0
    for d, a, f, s in items:
        scaled += B * a + G * (t - s + B - 1) if d >= t else -B * f
    return scaled // B


class PeakIndex:
    """The running batch's curve at its finish points, ready for candidates.

    Points are kept scaled by B (integers): D_k = B * delta(d_k)."""

    __slots__ = ("B", "G", "_d", "_m", "_a", "_s", "_f", "_f_total", "_left", "_right", "peak_scaled")

    def __init__(self, items: list[Item], B: int, G: int) -> None:
        self.B, self.G = B, G
        ordered = sorted(items)
        n = len(ordered)
        d = self._d = [it[0] for it in ordered]
        # Suffix sums over the items at or after k (the ones alive at t = d_k), in C loops,
        # with a sentinel 0 at n (nothing alive).
        backwards = ordered[::-1]
        a = self._a = list(accumulate((it[1] for it in backwards), initial=0))[::-1]
        f = self._f = list(accumulate((it[2] for it in backwards), initial=0))[::-1]
        s = self._s = list(accumulate((it[3] for it in backwards), initial=0))[::-1]
        self._m = list(range(n, -1, -1))
        f_total = self._f_total = f[0]
        lift = B - 1
        points = [
            B * (a_k - f_total + f_k) + G * (m_k * (d_k + lift) - s_k)
            for d_k, a_k, f_k, s_k, m_k in zip(d, a, f, s, range(n, 0, -1))
        ]
        # left[k]: max over j < k of D_j + G d_j (a candidate alive there adds the same
        # G d_j + a constant); right[k]: max over j >= k of D_j (a candidate gone by then
        # frees nothing of today's). _NONE: no such point.
        self._left = list(accumulate((p + G * d_k for p, d_k in zip(points, d)), max, initial=_NONE))
        self._right = list(accumulate(reversed(points), max, initial=_NONE))[::-1]
        self.peak_scaled = self._right[0] if n else 0

    def peak(self) -> int:
        """The batch's own peak of delta, in blocks (0 with nothing running)."""
        return max(self.peak_scaled, 0) // self.B

    def peak_with(self, d: int, a: int, s: int) -> int:
        """The peak of delta, in blocks, with a candidate Item(d, a, 0, s) added."""
        B, G = self.B, self.G
        ds = self._d
        upto = bisect_right(ds, d)  # points it is alive at: d_k <= d
        best = self._right[upto]  # the others: it finished before them, freeing nothing of today's
        alive = self._left[upto] + B * a + G * (B - 1 - s)
        if alive > best:
            best = alive
        k = bisect_left(ds, d)  # its own last step: the items with d_k >= d are alive too
        m = self._m[k] + 1
        own = B * (self._a[k] + a - self._f_total + self._f[k]) + G * (m * (d + B - 1) - self._s[k] - s)
        if own > best:
            best = own
        return max(best, 0) // B


class PeakGate:
    """Future-peak admission over the controller's running requests (`admits`).

    The running batch's index is rebuilt only when a decision was made since the last one
    (the recorder's seq: every change to a running request's blocks, every finish and
    preemption is one), so the candidates of one queue pass share it."""

    def __init__(
        self, ledger: BlockLedger, fit: FitCheck, predictor: OutputLengthPredictor, config: AdmissionConfig,
        running: dict[str, RequestState], recorder: DecisionRecorder,
    ) -> None:
        self.ledger, self.fit, self.predictor = ledger, fit, predictor
        self.running, self.recorder = running, recorder
        self.quantile = config.peak_quantile
        self.max_model_len = config.max_model_len
        specs = ledger.specs
        self.B = ledger.layout.block_size
        self.G = sum(1 for spec in specs if spec.kind in _GROWING)
        self.others = tuple(g for g, spec in enumerate(specs) if spec.kind not in _GROWING)
        self.shared_groups = len(ledger.prefix_groups)  # the groups whose prefix hits are shared
        self._seq = -1
        self._index: PeakIndex | None = None

    def remaining(self, r: RequestState, start: int) -> int:
        """Decode steps `r` is predicted to have left once it holds `start` tokens: its
        prediction stands until it is outlived, then the lengths seen past what it has
        generated are asked again (kept in `r.predicted_output`)."""
        prompt = r.spec.prompt_tokens
        total = prompt + r.predicted_output
        if total <= start:
            generated = start - prompt
            rest = self.predictor.remaining(r.spec.tenant, generated, r.max_len - start, self.quantile)
            r.predicted_output = generated + rest
            total = start + rest
        return (total if total < r.max_len else r.max_len) - start

    def _later(self, start: int, d: int) -> tuple[int, ...]:
        """Blocks per group while decoding at its last length (a window group's window)."""
        n = start + d
        return self.fit.held[n + self.fit.decode_ahead_tokens, n - 1]

    def items(self) -> list[tuple[int, int, int, int]]:
        """The running requests as Items (plain tuples: this runs once per change of the
        batch, for every running request): a prompt not computed yet is added at once."""
        B, G, others, shared = self.B, self.G, self.others, self.shared_groups
        remaining, later = self.remaining, self._later
        out = []
        append = out.append
        for r in self.running.values():
            n = r.num_tokens
            prompt = r.spec.prompt_tokens
            start = r.resume_len if r.resume_len > prompt else prompt
            if n > start:
                start = n
            total = prompt + r.predicted_output
            if total <= start:
                d = remaining(r, start)
            else:
                d = (total if total < r.max_len else r.max_len) - start
            blocks = -(-start // B)
            a = G * (blocks + (-n // B))  # the prompt's blocks not held yet
            held = r.held
            if others:
                final = later(start, d)
                for g in others:
                    if final[g] > held[g]:
                        a += final[g] - held[g]
            f = sum(held) - r.hit_blocks * shared
            append((d, a, f if f > 0 else 0, blocks * B - start))
        return out

    def index(self) -> PeakIndex:
        seq = self.recorder.seq
        if self._index is None or seq != self._seq:
            self._index = PeakIndex(self.items(), self.B, self.G)  # type: ignore[arg-type]
            self._seq = seq
        return self._index

    def admits(self, r: RequestState, plan: Plan, spare: int) -> bool:
        """Whether the predicted peak with `r` admitted stays within `spare` blocks."""
        running = self.running
        if not running:  # never stall an idle pool
            return True
        if (len(running) + 1) * self.fit.worst_total[self.max_model_len] <= spare:
            return True  # every request at its longest fits: no need to predict
        B = self.B
        start = r.spec.prompt_tokens
        if r.resume_len > start:
            start = r.resume_len
        d = self.remaining(r, start)
        blocks = -(-start // B)
        a = self.G * blocks
        if self.others:
            later = self._later(start, d)
            for g in self.others:
                a += later[g]
        hit = plan.hit
        if hit.num_blocks:  # full-group hits others hold cost nothing (fit.plan's need)
            a -= sum(hit.shared[g] for g in self.ledger.prefix_groups)
        return self.index().peak_with(d, a, blocks * B - start) <= spare

    def admits_read_only(self, r: RequestState, plan: Plan, spare: int) -> bool:
        """`admits`, changing nothing (outlook.py, a router's ask): building the index may
        renew running requests' outlived predictions; if it did, they and the index are put
        back, so the next pass predicts as if nobody had asked."""
        kept = self._seq, self._index
        outputs = [x.predicted_output for x in self.running.values()] if self.recorder.seq != kept[0] else None
        try:
            return self.admits(r, plan, spare)
        finally:
            if outputs is not None and outputs != [x.predicted_output for x in self.running.values()]:
                for x, value in zip(self.running.values(), outputs):
                    x.predicted_output = value
                self._seq, self._index = kept
