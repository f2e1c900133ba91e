"""What `Metrics.record` costs per decision, and how much of it the queue-time histogram's
tracking adds (each request's wait, from its first QUEUE to its first ADMIT, counted under
its tenant: 7 tenants here, none of them named, so all under "(other)").

    python bench/bench_metrics_record.py [--batch 64] [--rounds 2000]

Batches of one kind of decision each: grows (not tracked), admit + release pairs (an
admission observed, a release forgotten), and queue + admit pairs (a wait started and
observed). The baseline is record's counting loop alone, as it was before the histogram
(the same dict of (kind, reason) counts, the same counter increments). Best of 7, in ns
per decision; the machine's own drift moves both alike.
"""

from __future__ import annotations

import argparse
import time

from kvbudget.daemon.core.records import Decision, DecisionKind, Reason
from kvbudget.daemon.server.metrics import Metrics


def counting_only(metrics: Metrics, decisions: list[Decision]) -> None:
    """record() without the queue-time tracking: the baseline."""
    counts: dict[tuple[str, str], int] = {}
    get = counts.get
    for decision in decisions:
        key = (decision.kind, decision.reason)
        counts[key] = get(key, 0) + 1
    children = metrics._decision_children
    for key, count in counts.items():
        pair = children.get(key) or metrics._children_of(*key)
        pair[0].inc(count)
        if pair[1] is not None:
            pair[1].inc(count)
    metrics.families.decision_latency.observe(0.001)


def batches(size: int) -> dict[str, list[Decision]]:
    def of(i: int, kind: DecisionKind, reason: Reason) -> Decision:
        return Decision(seq=i, time_s=float(i), kind=kind, reason=reason, request_id=f"r{i // 2}",
                        tenant=f"user-{i % 7}")

    return {
        "grow": [of(i, DecisionKind.GROW, Reason.FITS) for i in range(size)],
        "admit+release": [of(i, DecisionKind.ADMIT, Reason.FITS) if i % 2 == 0
                          else of(i, DecisionKind.RELEASE, Reason.FINISHED) for i in range(size)],
        "queue+admit": [of(i, DecisionKind.QUEUE, Reason.POOL_FULL) if i % 2 == 0
                        else of(i, DecisionKind.ADMIT, Reason.FITS) for i in range(size)],
    }


def best_ns(call, decisions: list[Decision], rounds: int) -> float:
    best = float("inf")
    for _ in range(7):
        started = time.perf_counter()
        for _ in range(rounds):
            call(decisions)
        best = min(best, (time.perf_counter() - started) / rounds / len(decisions) * 1e9)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64, help="decisions per record() call")
    parser.add_argument("--rounds", type=int, default=2000, help="calls per timing")
    args = parser.parse_args()
    for name, decisions in batches(args.batch).items():
        metrics = Metrics()
        base = best_ns(lambda d: counting_only(metrics, d), decisions, args.rounds)
        full = best_ns(lambda d: metrics.record(d, 0.001), decisions, args.rounds)
        print(f"{name:14} counting only {base:6.0f} ns   record() {full:6.0f} ns   (+{full - base:.0f} ns per decision)")


if __name__ == "__main__":
    main()
