"""One trace across K simulated hosts, each its own pool, admission controller and engine,
behind a router: `round-robin`, or `headroom` (the host whose `outlook` answer, the one
the daemon's AskAdmission gives, leaves the most room, else admits it soonest). The
simulated engines and the step loop are the offline replay's (simulation.py): only where
each request goes differs. docs/routing.md has the what-if's figures.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from collections.abc import Sequence

from kvbudget.daemon.core.admission import AdmissionController
from kvbudget.daemon.core.outlook import DEFAULT_STEP_S, Outlook, Shape, outlook
from kvbudget.traces.replay import ControllerBackend, ReplaySetup, admission_config
from kvbudget.traces.results import ReplayResult, summarize
from kvbudget.traces.sim_request import SimRequest
from kvbudget.traces.simulation import Simulation
from kvbudget.traces.trace_request import TraceRequest

STRATEGIES = ("round-robin", "headroom")


def headroom_key(answer: Outlook, sent_unseen: int, turn: int) -> tuple:
    """The headroom rule's rank of one host (lowest wins), from its AskAdmission answer,
    the blocks the router sent there that its daemon has not seen yet, and the host's
    place in a round-robin turn (ties). `room` is what stays spare once those, the queue
    ahead of the request and the request itself are served. Hosts where it fits (room
    >= 0) come first, those that admit it now before the others, the most room first;
    where it fits nowhere, the soonest wait, then the most room. Room before admit_now:
    "admits now" may be backfill past a queue needing more than is spare, and it does
    not count what the router sent meanwhile (docs/routing.md)."""
    room = answer.blocks_spare - sent_unseen - answer.blocks_needed_total - answer.blocks_ahead
    if room >= 0:
        return (answer.final, False, not answer.admit_now, -room, turn)
    wait = math.inf if answer.wait_steps < 0 else answer.wait_steps
    return (answer.final, True, wait, -room, turn)


class Router:
    """Sends each request, once the simulation's clock reaches its arrival, to a host."""

    def __init__(self, strategy: str, controllers: list[AdmissionController], step_s: float) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"route: unknown strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
        self.strategy = strategy
        self.controllers = controllers
        self.step_s = step_s
        self.unrouted: deque[SimRequest] = deque()
        self.queues: list[deque[SimRequest]] = [deque() for _ in controllers]
        # Blocks of the requests sent to a host that its controller has not seen yet: a
        # burst routed at one instant must not all go where the first one went.
        self.pending_blocks = [0] * len(controllers)
        self.need: dict[str, int] = {}
        self.routed = [0] * len(controllers)

    def route_until(self, now: float) -> None:
        unrouted = self.unrouted
        while unrouted and unrouted[0].arrival_s <= now:
            r = unrouted.popleft()
            k = self.choose(r, now)
            r.engine = k
            self.queues[k].append(r)
            self.routed[k] += 1

    def choose(self, r: SimRequest, now: float) -> int:
        n = sum(self.routed)
        if self.strategy == "round-robin":
            return n % len(self.controllers)
        shape = Shape(r.prompt, r.max_new, r.trace.tenant, r.trace.priority, r.hashes)
        best: tuple | None = None
        for k, controller in enumerate(self.controllers):
            answer = outlook(controller, shape, now, self.step_s)
            key = headroom_key(answer, self.pending_blocks[k], (k - n) % len(self.controllers))
            if best is None or key < best[0]:
                best = (key, k, answer.blocks_needed_total)
        assert best is not None
        _, k, need = best
        self.pending_blocks[k] += need
        self.need[r.request_id] = need
        return k

    def handed_over(self, k: int, r: SimRequest) -> None:
        self.pending_blocks[k] -= self.need.pop(r.request_id, 0)


class HostArrivals:
    """Host k's engine's arrivals, as the simulated engine reads them (truth, [0], popleft,
    append). Peeking routes what has arrived by the earliest engine clock: the simulation
    steps the engine with the earliest clock, so every request is routed when time reaches
    it. While
    requests remain unrouted, the head is the next of them (the engine sleeps until it)."""

    def __init__(self, router: Router, k: int, engines: list) -> None:
        self.router, self.k, self.engines = router, k, engines

    def _route(self) -> None:
        # Up to the earliest engine clock: an engine ahead (skipping quiet steps) must not
        # route a request by hosts the simulation has not yet brought to its arrival.
        if self.router.unrouted:
            self.router.route_until(min(e.clock for e in self.engines))

    def __bool__(self) -> bool:
        self._route()  # (so that a true answer still holds at the [0] that follows)
        return bool(self.router.queues[self.k] or self.router.unrouted)

    def __getitem__(self, i: int) -> SimRequest:
        self._route()
        queue = self.router.queues[self.k]
        return queue[i] if queue else self.router.unrouted[i]

    def popleft(self) -> SimRequest:
        r = self.router.queues[self.k].popleft()
        self.router.handed_over(self.k, r)
        return r

    def append(self, r: SimRequest) -> None:
        self.router.unrouted.append(r)


class HostsBackend:
    """Engine k's calls go to host k's controller (one ControllerBackend each)."""

    def __init__(self, controllers: list[AdmissionController]) -> None:
        self.hosts = [ControllerBackend(c) for c in controllers]
        self.layout = controllers[0].layout
        self.num_blocks = sum(h.num_blocks for h in self.hosts)

    def _host(self, engine_id: str) -> ControllerBackend:
        return self.hosts[int(engine_id.rsplit("-", 1)[1])]

    def open_engine(self, engine_id: str) -> None:
        pass

    def step(self, engine_id, ops, now):
        return self._host(engine_id).step(engine_id, ops, now)

    def poll(self, engine_id, now):
        return []

    def idle(self, engine_id, now):
        return self._host(engine_id).idle(engine_id, now)

    def num_free_blocks(self) -> int:
        return sum(h.num_free_blocks() for h in self.hosts)


def run_hosts(
    trace: Sequence[TraceRequest], setup: ReplaySetup, policy: str, hosts: int, strategy: str, *,
    trace_name: str = "", step_s: float = DEFAULT_STEP_S,
) -> ReplayResult:
    """The trace across `hosts` hosts of `setup`'s pool and engine each, routed by `strategy`."""
    if hosts < 1:
        raise ValueError(f"hosts: must be >= 1, got {hosts}")
    controllers = [AdmissionController(setup.layout, setup.num_blocks, admission_config(setup, policy))
                   for _ in range(hosts)]  # fmt: skip
    for k, controller in enumerate(controllers):
        # The simulation counts each decision once by its seq: the hosts' must not meet.
        controller.number_from(k << 40)
        for name, max_share, weight in setup.tenants:
            controller.set_tenant_quota(name, max_share, weight)
    simulation = Simulation(trace, setup.layout, setup.engine, engines=hosts, seed=setup.seed,
                            sample_interval_s=setup.sample_interval_s, spread_s=setup.spread_s)  # fmt: skip
    router = Router(strategy, controllers, step_s)
    router.unrouted.extend(simulation.requests.values())  # (in arrival order)
    for k, engine in enumerate(simulation.engines):
        engine.arrivals = HostArrivals(router, k, simulation.engines)  # type: ignore[assignment]
    started = time.perf_counter()
    run = simulation.run(HostsBackend(controllers))
    wall = time.perf_counter() - started
    for controller in controllers:
        controller.check_integrity()
    result = summarize(run, policy=policy, trace=trace_name, mode="offline",
                       setup=dataclasses.replace(setup, engines=hosts), wall_s=wall)  # fmt: skip
    per_host = [sum(1 for r in run.requests if r.engine == k and r.preemptions) for k in range(hosts)]
    summary = {**result.summary, "hosts": hosts, "route": strategy, "variant": strategy,
               "routed": list(router.routed), "preempted_requests_per_host": per_host}  # fmt: skip
    return ReplayResult(summary, result.samples)
