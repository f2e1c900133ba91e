"""Golden decisions: a fixed, seeded call sequence must yield exactly the recorded decisions.

This pins the controller's observable behaviour (every field of every decision, and the
final snapshot) while its internals are optimised for speed: any change in what it decides,
in what order, with which block ids or counts, fails here. The sequences mix submits (with
and without prefix hashes, priorities, tenants with a quota, deadlines), grows, progress,
finishes and aborts on a small pool so that queueing, backfill, preemption, reclamation and
prefix hits all happen, for each policy on a hybrid (sliding + full) and a full-only layout.

A deliberate behaviour change re-records the file:
    python tests/test_admission_golden.py --record
and the diff of the JSON file is then the review of what changed.
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys
from pathlib import Path

import pytest

from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
from kvbudget.daemon.core.policies import POLICIES
from kvbudget.daemon.core.records import Decision, RequestSpec
from kvbudget.daemon.core.requests import Status

sys.path.insert(0, str(Path(__file__).parent))
from test_admission_support import B, SMALL_LAYOUTS  # noqa: E402

GOLDEN = Path(__file__).parent / "data" / "admission_golden.json"
CALLS = 150  # per scenario; 2 layouts x 4 policies = 1,200 calls
FIELDS = tuple(f.name for f in dataclasses.fields(Decision))
SCENARIOS = [(layout, policy) for layout in ("hybrid", "full") for policy in POLICIES]


def _plain(value: object) -> object:
    """JSON-ready: enums as their values, tuples as lists, recursively."""
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "value") and isinstance(value, str):  # str-valued enum member
        return value.value
    return value


def _row(d: Decision) -> list[object]:
    return [_plain(getattr(d, name)) for name in FIELDS]


def run_scenario(layout_name: str, policy: str, seed: int) -> dict[str, object]:
    """Play CALLS seeded random calls; return every decision and the final snapshot."""
    rng = random.Random(seed)
    config = AdmissionConfig(
        max_model_len=96,
        max_num_batched_tokens=16,
        policy=policy,
        lookahead_tokens=4,
        watermark=0.05,
        backfill_depth=2,
        max_head_wait_s=5.0,
    )
    ctrl = AdmissionController(SMALL_LAYOUTS[layout_name], 40, config)
    ctrl.set_tenant_quota("b", 0.5)
    rows: list[list[object]] = []
    now = 0.0
    next_id = 0
    for _ in range(CALLS):
        now += 0.5
        running = sorted(ctrl.running_requests(), key=lambda r: r.order)
        known = running + ctrl.waiting_requests()
        op = rng.choices(("submit", "grow", "progress", "finish", "abort"), (4, 4, 3, 2, 1))[0]
        if op == "submit" or not known:
            next_id += 1
            prompt = rng.randint(1, 60)
            family = rng.randint(1, 3)
            hashes = tuple(family * 1000 + i for i in range(prompt // B)) if rng.random() < 0.5 else ()
            spec = RequestSpec(
                f"r{next_id}",
                prompt,
                rng.choice((None, 0, 5, 20, 40)),
                hashes,
                priority=rng.randint(0, 1),
                tenant=rng.choice(("a", "b")),
                deadline_s=now + rng.choice((1.0, 10.0)) if rng.random() < 0.2 else None,
            )
            decisions = ctrl.submit(spec, now)
        elif op in ("grow", "progress") and running:
            r = rng.choice(running)
            if op == "grow" and rng.random() < 0.1:  # a waiting one: DENY not_running
                r = rng.choice(known)
            if op == "grow" and r.status is not Status.RUNNING:
                decisions = ctrl.grow(r.request_id, r.spec.prompt_tokens, now)
            elif op == "grow":
                top = min(r.max_len, r.num_computed + 40)
                target = rng.randint(r.num_tokens, max(r.num_tokens, top))
                decisions = ctrl.grow(r.request_id, target, now)
            else:
                decisions = ctrl.progress(r.request_id, rng.randint(r.num_computed, r.num_tokens), now)
        elif op == "abort":
            decisions = ctrl.abort(rng.choice(known).request_id, now)
        else:
            pick = rng.choice(running or known)
            decisions = ctrl.finish(pick.request_id, now)
        rows += (_row(d) for d in decisions)
        ctrl.check_integrity()
    snapshot = _plain(dataclasses.asdict(ctrl.snapshot(now)))
    statuses = {r.request_id: r.status is Status.RUNNING for r in ctrl.running_requests()}
    return {"decisions": rows, "snapshot": snapshot, "running": sorted(statuses)}


def record_all() -> dict[str, object]:
    return {
        "fields": list(FIELDS),
        "scenarios": {
            f"{layout}/{policy}": run_scenario(layout, policy, seed)
            for seed, (layout, policy) in enumerate(SCENARIOS)
        },
    }


def _load() -> dict[str, object]:
    return json.loads(GOLDEN.read_text())


def test_golden_fields_match_decision() -> None:
    assert _load()["fields"] == list(FIELDS)


@pytest.mark.parametrize("seed,layout,policy", [(s, lay, p) for s, (lay, p) in enumerate(SCENARIOS)])
def test_decisions_match_golden(seed: int, layout: str, policy: str) -> None:
    expected = _load()["scenarios"][f"{layout}/{policy}"]
    got = run_scenario(layout, policy, seed)
    for i, (want, have) in enumerate(zip(expected["decisions"], got["decisions"])):
        assert have == want, f"decision {i} differs: {dict(zip(FIELDS, have))} != {dict(zip(FIELDS, want))}"
    assert len(got["decisions"]) == len(expected["decisions"]), "number of decisions"
    assert got["snapshot"] == expected["snapshot"]
    assert got["running"] == expected["running"]


def test_scenarios_exercise_every_path() -> None:
    """The golden file is only worth something if the sequences reach the interesting paths."""
    kinds: set[str] = set()
    reasons: set[str] = set()
    kind_i, reason_i = FIELDS.index("kind"), FIELDS.index("reason")
    for scenario in _load()["scenarios"].values():
        kinds.update(row[kind_i] for row in scenario["decisions"])
        reasons.update(row[reason_i] for row in scenario["decisions"])
    assert {"admit", "queue", "grow", "deny", "preempt", "reclaim", "release"} <= kinds
    assert {"prefix_hit", "pool_full", "budget_full", "queue_ahead", "tenant_quota", "deadline", "watermark",
            "not_running", "growth", "priority", "finished", "aborted", "window"} <= reasons


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    data = record_all()
    lines = ['{"fields": ' + json.dumps(data["fields"]) + ', "scenarios": {']
    names = list(data["scenarios"])
    for n, name in enumerate(names):
        scenario = data["scenarios"][name]
        lines.append(f"{json.dumps(name)}: {{\"decisions\": [")
        rows = scenario["decisions"]
        lines += [json.dumps(row) + ("," if i < len(rows) - 1 else "") for i, row in enumerate(rows)]
        lines.append(
            f"], \"snapshot\": {json.dumps(scenario['snapshot'])}, \"running\": {json.dumps(scenario['running'])}}}"
            + ("," if n < len(names) - 1 else "")
        )
    lines.append("}}")
    GOLDEN.write_text("\n".join(lines) + "\n")
    print(f"recorded {sum(len(s['decisions']) for s in data['scenarios'].values())} decisions")
