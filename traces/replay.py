"""Replay a trace offline: the admission controller runs in this process (no gRPC, no clock).

Fast what-ifs: each policy can run on the same trace, model and pool. `replay_live` plays
the same simulation against a running daemon; `ReplaySetup` serves both.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
from kvbudget.daemon.core.records import Decision
from kvbudget.daemon.core.spec import KVCacheLayout
from kvbudget.daemon.core.step import BrokenStep, StepOps, apply_step
from kvbudget.traces.trace_request import TraceRequest
from kvbudget.traces.results import ReplayResult, summarize
from kvbudget.traces.sim_engine import EngineConfig
from kvbudget.traces.simulation import ProgressHook, Simulation


@dataclass(frozen=True)
class ReplaySetup:
    """Everything but the trace and the policy: model layout, pool and engine limits."""

    layout: KVCacheLayout
    num_blocks: int
    engine: EngineConfig
    model: str = ""
    engines: int = 1
    seed: int = 0
    enable_prefix_caching: bool = True
    sample_interval_s: float = 1.0
    spread_s: float = 0.0  # spread requests sharing a timestamp over this many seconds
    admission: tuple[tuple[str, object], ...] = ()  # AdmissionConfig fields set (the rest: defaults)
    tenants: tuple[tuple[str, float | None, float], ...] = ()  # (name, max_share, weight) quotas
    policy: str = "optimistic"  # a config file's (the CLI runs it unless told another)


class ControllerBackend:
    """The admission controller in this process. A step goes through the core's
    `apply_step`, as the daemon's Step does, so offline and live count the same decisions."""

    def __init__(self, controller: AdmissionController) -> None:
        self.controller = controller
        self.layout = controller.layout
        self.num_blocks = controller.pool.capacity

    def open_engine(self, engine_id: str) -> None:
        pass

    def step(self, engine_id: str, ops: StepOps, now: float) -> list[Decision]:
        try:
            return apply_step(self.controller, ops, now)
        except BrokenStep as broken:
            # Nothing validated the ops before (the daemon's Step does): the controller's
            # refusal is the answer, as its own AdmissionError (the CLI names the field).
            raise broken.__cause__ from None  # type: ignore[misc]

    def poll(self, engine_id: str, now: float) -> list[Decision]:
        return []

    def idle(self, engine_id: str, now: float) -> list[Decision]:
        return self.controller.schedule(now)  # unbounded, as the daemon's own pass

    def num_free_blocks(self) -> int:
        return self.controller.pool.num_free_blocks


def admission_config(setup: ReplaySetup, policy: str) -> AdmissionConfig:
    return AdmissionConfig(
        max_model_len=setup.engine.max_model_len,
        max_num_batched_tokens=setup.engine.max_num_batched_tokens,
        policy=policy,
        enable_prefix_caching=setup.enable_prefix_caching,
        **dict(setup.admission),  # type: ignore[arg-type]
    )


def run_offline(
    trace: Sequence[TraceRequest],
    setup: ReplaySetup,
    policy: str,
    *,
    trace_name: str = "",
    on_progress: ProgressHook | None = None,
) -> ReplayResult:
    controller = AdmissionController(setup.layout, setup.num_blocks, admission_config(setup, policy))
    for name, max_share, weight in setup.tenants:
        controller.set_tenant_quota(name, max_share, weight)
    backend = ControllerBackend(controller)
    simulation = Simulation(
        trace, setup.layout, setup.engine, engines=setup.engines, seed=setup.seed,
        sample_interval_s=setup.sample_interval_s, spread_s=setup.spread_s, on_progress=on_progress,
    )  # fmt: skip
    started = time.perf_counter()
    run = simulation.run(backend)
    wall = time.perf_counter() - started
    controller.check_integrity()
    return summarize(run, policy=policy, trace=trace_name, mode="offline", setup=setup, wall_s=wall)
