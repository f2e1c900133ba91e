"""A simulated inference engine: continuous batching with chunked prefill, in virtual time.

It plays what vLLM's scheduler does with a request's KV blocks, against KVBudget's
admission (in-process or over gRPC), without running a model.

Step-time model (one engine step, in seconds):

    step = step_base + prefill_tokens x per_prefill_token + batch_seqs x per_decode_seq

defaults 20 ms, 50 us and 0: a fixed launch/sampling cost plus compute that grows with
prefill tokens; decode tokens are memory-bound and ride along for (almost) free.

Each step, per engine:
1. arrivals up to the clock are submitted (at most `max_num_seqs` requests in flight at
   the daemon; the rest wait in the engine);
2. running requests are scheduled: every decoding request 1 token, then prefills (and
   recomputes) in admission order, in chunks, within `max_num_batched_tokens` and
   `max_num_seqs`;
3. one backend call carries the step's finishes, progress reports, grows (asked
   `grow_ahead_blocks` blocks ahead, so most decode steps ask nothing) and submits; a step
   with nothing to ask makes no call;
4. the decisions are applied: GROW/DENY (a denied request sits this step out), PREEMPT
   (the request loses its blocks and, once re-admitted, recomputes from scratch), ADMIT
   (requests admitted by this call start prefilling in this step if budget is left);
5. the clock advances by the step time; tokens computed and generated are booked.

Decoding requests are advanced lazily: one counts steps, and a request is touched only
when it must grow or finish (a heap of due steps); runs of decode-only steps in which
nobody asks anything are taken in one go. That keeps a 256-sequence batch cheap.

Several engines (`engines=K`) share the backend and are stepped in virtual-time order.
Live, a request's decisions may reach its engine out of order (its own Step reply before
an event another engine's call caused), so they are applied by `seq`, per request.

Determinism: given the same trace, backend and seed, the run is the same (the seed only
spreads requests that share a quantised timestamp when asked to, see `spread_arrivals`).

The code lives in one module per idea; this one keeps every name importable from here:

- `sim_backend`: `StepOps` (one step's asks) and the `Backend` / `AsyncBackend` protocols;
- `sim_request`: `SimRequest` and its states, `spread_arrivals`;
- `sim_engine`: `EngineConfig` and `SimEngine` (one engine's scheduling step);
- `simulation`: `Simulation` (the multi-engine driver), `SimRun`, `Sample`.
"""

from __future__ import annotations

from kvbudget.daemon.core.step import StepOps
from kvbudget.traces.sim_backend import AsyncBackend, Backend
from kvbudget.traces.sim_engine import EngineConfig, SimEngine
from kvbudget.traces.sim_request import (
    FINISHED,
    LOST,
    PENDING,
    QUEUED,
    REJECTED,
    RUNNING,
    SimRequest,
    spread_arrivals,
)
from kvbudget.traces.simulation import ProgressHook, Sample, Simulation, SimRun

__all__ = [
    "FINISHED",
    "LOST",
    "PENDING",
    "QUEUED",
    "REJECTED",
    "RUNNING",
    "AsyncBackend",
    "Backend",
    "EngineConfig",
    "ProgressHook",
    "Sample",
    "SimEngine",
    "SimRequest",
    "SimRun",
    "Simulation",
    "StepOps",
    "spread_arrivals",
]
