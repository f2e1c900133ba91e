"""A big step read, applied and answered in slices, the event loop free between them.

A 10,000-op step held the loop for most of a second (reading it, applying it, building
its reply), and an engine heartbeating meanwhile waited that long. A step of more than
BIG_STEP_OPS ops is served here in slices of SLICE_OPS, with the loop let go between
them, when slicing it makes exactly the decisions applying it whole does
(`core.step.apply_step` on each slice):

  - submits only, with no admit bound: each submit is decided as the whole step would
    (no queue pass comes between them there either);
  - finishes and aborts only, while no request waits: the queue pass each slice ends with
    finds nothing, as the whole step's one would.

Another big step is applied whole (its reply still built in slices). A big step is read
and validated in a worker thread (steps.py). Nothing else changes the pool meanwhile: the
step holds `SliceGate` from before its validation to its last slice, and every other
change (steps, sessions opened or closed, admin ops, a reload, the ticker) waits for it
or skips a tick. docs/architecture.md, "One request's path".
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from kvbudget.daemon.core.admission import AdmissionController
from kvbudget.daemon.core.step import StepOps
from kvbudget.v1 import engine_pb2

BIG_STEP_OPS = 1_000
# A heartbeat's call takes a few turns of the loop, each behind one slice: 1,000 ops
# (7 ms quiet, 20-25 ms on a loaded machine) made its p99 ~0.2 s; 200 ops, a few ms.
SLICE_OPS = 200


class SliceGate:
    """Held by a sliced step from its validation to its last slice."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def hold(self) -> asyncio.Lock:
        return self._lock

    @contextlib.asynccontextmanager
    async def between_steps(self):
        """A change to the pool waits here while a sliced step runs (at once otherwise)."""
        if not self._lock.locked():
            yield
            return
        async with self._lock:
            yield


def is_big(request: engine_pb2.StepRequest) -> bool:
    return (len(request.submits) + len(request.grows) + len(request.progress) + len(request.finishes)
            + len(request.aborts)) > BIG_STEP_OPS


def slices(ops: StepOps, controller: AdmissionController) -> Iterator[StepOps]:
    """The step as slices whose apply_step makes the whole step's decisions, or whole."""
    bounded = ops.admit_tokens is not None or ops.admit_seqs is not None
    running_ops = ops.progress or ops.grows
    if not bounded and ops.submits and not (running_ops or ops.finishes or ops.aborts):
        for start in range(0, len(ops.submits), SLICE_OPS):
            yield StepOps(submits=ops.submits[start:start + SLICE_OPS])
    elif not bounded and not (running_ops or ops.submits) and not controller.waiting_requests():
        for name in ("finishes", "aborts"):
            ids = getattr(ops, name)
            for start in range(0, len(ids), SLICE_OPS):
                yield StepOps(**{name: ids[start:start + SLICE_OPS]})
    else:
        yield ops
