"""When a blocked head of the queue is expected to start, and whether a request admitted
past it would delay that start (EASY backfilling; the model and why: docs/architecture/core.md).

Time counts in engine steps: a request computes up to F prompt tokens a step, then one
output token a step, until its predicted output length; it grows on the way (linearly,
to the blocks of its final length) and frees what it was charged when it ends. The head
starts at the first end after which the spare blocks cover its need. Pure arithmetic on
the requests' numbers: no pool reads, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kvbudget.daemon.core.requests import RequestState


@dataclass(frozen=True, slots=True)
class HeadStart:
    steps: int  # from now until the head is expected to fit
    extra: int  # blocks spare then beyond the head's need (< 0: it fits only once all end)


def expected_run(r: RequestState, predicted_output: int, F: int) -> tuple[int, int]:
    """(steps left, final length) of `r` if it produces `predicted_output` tokens in all.

    One that already produced more is expected to run to its maximum length: its end is
    no longer predictable, and counting on it early would let others take the blocks the
    head is waiting for."""
    prompt = r.spec.prompt_tokens
    target = r.resume_len if r.resume_len > prompt else prompt
    computed = r.num_computed
    steps = -(-(target - computed) // F) if computed < target else 0
    reached = computed if computed > target else target
    final = prompt + predicted_output
    if final <= reached or final > r.max_len:
        final = r.max_len
    return steps + (final - reached if final > reached else 0), final


def head_start(ends: Iterable[tuple[int, int, int]], spare: int, need: int) -> HeadStart:
    """`ends`: (steps left, blocks it frees when it ends, blocks it will still take before
    then) per running request; `spare`: blocks free now and promised to no one; `need`:
    what the head must find. O(n log n) in the running requests."""
    if spare >= need:
        return HeadStart(0, spare - need)
    order = sorted(ends)
    rate = 0.0  # blocks a step the requests still running take, together
    for steps, _, grows in order:
        if steps > 0:
            rate += grows / steps
    freed = t = 0
    free = spare
    i, n = 0, len(order)
    while i < n:
        t = order[i][0]
        while i < n and order[i][0] == t:  # every request ending at step t
            steps, frees, grows = order[i]
            freed += frees
            if steps > 0:
                rate -= grows / steps
            i += 1
        # (+1e-9: a sum of float rates may land a hair under a whole block)
        free = spare + freed - int(t * rate + 1e-9)
        if free >= need:
            return HeadStart(t, free - need)
    return HeadStart(t, free - need)


def blocks_at(target: int, prompt_steps: int, final: int, at: int, total_at: Callable[[int], int]) -> int:
    """Blocks held `at` steps from now by a request not started yet, of prompt (or
    resume) length `target` computed in `prompt_steps` steps, on its way to `final` tokens
    (`total_at(n)`: the blocks of n tokens)."""
    if at < prompt_steps:
        length = target * (at + 1) // prompt_steps
    else:
        length = target + at - prompt_steps
    return total_at(final if length > final else length)
