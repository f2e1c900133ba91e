"""Ordering under load (issue 30, point 3): six engines step at once against one daemon on
a pool small enough that their growths preempt each other, each reading its Events stream
while it steps and applying what `step()` and `events()` give it in arrival order, as the
engine guide's example does. Each engine keeps one view per request (the newest decision
it applied) and acts on it: grows a request it takes for running to its next length and
finishes it once whole, submits new ones. The engines never go wrong: no step is refused
(a grow below what a request holds, from a stale view, is INVALID_ARGUMENT), and once the
traffic stops each engine's view of every request it had is the log's newest row for it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kvbudget.client import EngineClient
from kvbudget.daemon.core.records import Decision, DecisionKind, Reason, RequestSpec

from tests.daemon_harness import DaemonProcess, await_until

pytestmark = pytest.mark.slow

ENGINES, STEPS, LIVE = 6, 120, 3
READER_LAG = 50  # loop turns the reader yields after each event
WAITING = {DecisionKind.QUEUE, DecisionKind.PREEMPT}
ENDED = {DecisionKind.REJECT, DecisionKind.RELEASE, DecisionKind.EXPIRE}


def runs(d: Decision) -> bool:
    return d.kind not in WAITING | ENDED and not (d.kind is DecisionKind.DENY and d.reason is Reason.NOT_RUNNING)


class Traffic:
    """The six engines' shared state: who is done stepping, and the daemon's log."""

    def __init__(self, daemon: DaemonProcess) -> None:
        self.daemon = daemon
        self.done = 0

    async def views_match(self, view: dict[str, Decision]) -> bool:
        """Once every engine stopped stepping: each request's newest row is what the view holds."""
        if self.done < ENGINES:
            return False
        newest = {row["request_id"]: row["seq"] for row in self.daemon.decision_rows("request_id != '' ORDER BY seq")}
        return all(newest[r] == d.seq for r, d in view.items())


async def engine(traffic: Traffic, name: str, view: dict[str, Decision], length: dict[str, int]) -> None:
    async with EngineClient(traffic.daemon.target, name, heartbeat=False) as client:
        async def read() -> None:
            async for d in client.events():
                view[d.request_id] = d
                # A reader slower than the steps (an engine busy elsewhere): the Events the
                # daemon sent meanwhile wait in the client while newer Step replies land.
                for _ in range(READER_LAG):
                    await asyncio.sleep(0)

        reader = asyncio.create_task(read())
        for i in range(STEPS):
            live = [r for r, d in view.items() if d.kind not in ENDED]
            running = [r for r in live if runs(view[r])]
            whole = [r for r in running if view[r].num_tokens >= length[r]]
            grows = [(r, min(view[r].num_tokens + 48, length[r])) for r in running if r not in whole]
            new = [f"{name}-{i}-{j}" for j in range(LIVE - len(live) + len(whole))]
            submits = [RequestSpec(r, prompt_tokens=48 * (1 + (i + j) % 6), max_new_tokens=200, priority=(i + j) % 3)
                       for j, r in enumerate(new)]
            length.update((s.request_id, s.prompt_tokens + 200) for s in submits)
            for d in await client.step(submits=submits, grows=grows, finishes=whole):  # (a refusal raises)
                view[d.request_id] = d
        traffic.done += 1
        await await_until(lambda: traffic.views_match(view), timeout=60.0)  # (the reader reads on meanwhile)
        reader.cancel()


async def test_six_engines_stepping_at_once_never_act_on_a_stale_decision(tmp_path: Path) -> None:
    with DaemonProcess(tmp_path, "--policy", "optimistic", lease_ttl_s=600) as daemon:
        views: dict[str, dict[str, Decision]] = {f"e{k}": {} for k in range(ENGINES)}
        length: dict[str, int] = {}
        traffic = Traffic(daemon)
        await asyncio.gather(*(engine(traffic, name, view, length) for name, view in views.items()))
        rows = daemon.decision_rows()
    kinds = [row["kind"] for row in rows]
    assert kinds.count("preempt") > 0 and kinds.count("queue") > 0  # (the engines did contend)
    assert sum(len(view) for view in views.values()) == len({row["request_id"] for row in rows})
