"""One trace request as a simulated engine sees it, and when requests arrive."""

from __future__ import annotations

import random
from collections.abc import Sequence

from kvbudget.traces.trace_request import TraceRequest


PENDING, QUEUED, RUNNING, FINISHED, REJECTED, LOST = range(6)


class SimRequest:
    """One trace request as the engine sees it (mutable; engine-internal)."""

    __slots__ = (
        "request_id", "trace", "engine", "arrival_s", "prompt", "output", "max_new", "cap",
        "state", "granted", "computed", "generated", "admitted_s", "first_token_s",
        "finished_s", "preemptions", "hit_blocks", "query_blocks", "decode_anchor",
        "version", "reject_reason", "hashes", "last_seq", "prefilled", "first_prefill",
    )  # fmt: skip

    def __init__(self, request_id: str, trace: TraceRequest, engine: int, arrival_s: float,
                 max_new: int, max_model_len: int) -> None:  # fmt: skip
        self.request_id = request_id
        self.trace = trace
        self.engine = engine
        self.arrival_s = arrival_s
        self.prompt = trace.prompt_tokens
        # Like vLLM, generation stops at max_model_len (a longer prompt is rejected anyway).
        room = max(1, max_model_len - self.prompt)
        self.output = min(trace.output_tokens, room)
        self.max_new = min(max_new, room)
        self.cap = min(self.prompt + self.max_new, max_model_len)  # slots it may ever ask for
        self.state = PENDING
        self.granted = 0  # slots the daemon has granted
        self.computed = 0  # tokens whose KV is written
        self.generated = 0  # output tokens produced (kept across preemptions)
        self.admitted_s: float | None = None
        self.first_token_s: float | None = None
        self.finished_s: float | None = None
        self.preemptions = 0
        self.hit_blocks = 0
        self.query_blocks = 0
        self.decode_anchor = 0  # while decoding lazily: generated = step_index - anchor
        self.version = 0  # bumps invalidate heap entries
        self.reject_reason = ""
        self.hashes: tuple[int, ...] = ()
        self.last_seq = -1  # the newest decision applied to it
        self.prefilled = 0  # prefill tokens computed, recomputes after preemptions included
        self.first_prefill = 0  # prefill tokens its first admission left to compute (no hits)


def spread_arrivals(requests: Sequence[TraceRequest], seed: int, max_gap_s: float = 3.0) -> list[float]:
    """Arrival seconds, with requests sharing a timestamp spread uniformly over the gap to
    the next distinct timestamp (at most `max_gap_s`; Mooncake quantises into ~3 s buckets).

    Traces with distinct timestamps (Azure) come back unchanged. One value per request, in
    the order given; the requests need not be in time order (buckets are found in time
    order, ties in the order given), and the earliest time is kept.
    """
    rng = random.Random(seed)
    order = sorted(range(len(requests)), key=lambda k: requests[k].arrival_s)  # stable
    times = [requests[k].arrival_s for k in order]
    spread: list[float] = []
    i = 0
    while i < len(times):
        j = i
        while j + 1 < len(times) and times[j + 1] == times[i]:
            j += 1
        if j == i:
            spread.append(times[i])
        else:
            gap = min(max_gap_s, times[j + 1] - times[i]) if j + 1 < len(times) else max_gap_s
            offsets = sorted(rng.random() * gap for _ in range(j - i + 1))
            offsets[0] = 0.0  # the bucket's first request keeps the bucket's time
            spread.extend(times[i] + o for o in offsets)
        i = j + 1
    out = [0.0] * len(times)
    for k, value in zip(order, spread):
        out[k] = value
    return out
