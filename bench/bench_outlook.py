"""Cost of one routing answer (core/outlook.py, what AskAdmission runs on the event loop)
as the waiting queue grows.

    python bench/bench_outlook.py [--asks 50] [--policy optimistic]

A one-group full-attention pool of 1000 blocks (16-token blocks, 8 KV heads of 128), 150
requests of ten tenants submitted (100-token prompts, 1000 new tokens: 140 run, under
optimistic), then 10, 200, 1,000 and 10,000 waiting; asks for a 100 + 100 request of the
second tenant, at priority 0 (behind the queue) and -1 (ahead of it); prints microseconds
per answer (CPU time of this process, `time.process_time`) and its reason. The decision
itself is the queue pass's (a few candidates, the head's expected start over the running
requests); the estimate walks the queue once (the requests ahead and what they need), so
that part grows with it. Last, under guaranteed, 52 requests of growing length (48 run, 4
wait, 4 blocks spare) and a 16 + 16 request backfilled past the blocked head: the
answer works out when the head can start (EASY, over the 48 running), as a submit would.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
from kvbudget.daemon.core.outlook import Shape, outlook
from kvbudget.daemon.core.records import RequestSpec
from kvbudget.daemon.core.spec import KV_DTYPES, AttentionSpec, group_layers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--asks", type=int, default=50)
    parser.add_argument("--policy", default="optimistic")
    args = parser.parse_args()
    layout = group_layers([AttentionSpec(16, 8, 128, KV_DTYPES["bf16"])])
    config = AdmissionConfig(max_model_len=4096, max_num_batched_tokens=512, policy=args.policy)
    ctrl = AdmissionController(layout, 1000, config)
    for i in range(150):
        ctrl.submit(RequestSpec(f"r{i}", 100, 1000, tenant=f"t{i % 10}"), 0.0)
    for waiting in (10, 200, 1000, 10_000):
        while ctrl.num_waiting < waiting:
            ctrl.submit(RequestSpec(f"w{ctrl.num_waiting}", 3000, 1000, tenant=f"t{ctrl.num_waiting % 10}"), 0.0)
        for priority in (0, -1):
            shape = Shape(100, 100, tenant="t1", priority=priority)
            started = time.process_time()
            for _ in range(args.asks):
                answer = outlook(ctrl, shape, 1.0)
            us = (time.process_time() - started) / args.asks * 1e6
            print(f"{ctrl.num_running} running, {ctrl.num_waiting:>6} waiting, priority {priority:>2}: "
                  f"{us:8.0f} us per answer ({answer.reason})")  # fmt: skip

    ctrl = AdmissionController(layout, 1000, dataclasses.replace(config, policy="guaranteed"))
    for i in range(52):
        ctrl.submit(RequestSpec(f"g{i}", 100, 60 + 7 * i, tenant=f"t{i % 10}"), 0.0)
    started = time.process_time()
    for _ in range(args.asks):
        answer = outlook(ctrl, Shape(16, 16, tenant="t1"), 1.0)
    us = (time.process_time() - started) / args.asks * 1e6
    print(f"{ctrl.num_running} running, {ctrl.num_waiting:>6} waiting, backfilled:  {us:8.0f} us per answer ({answer.reason})")


if __name__ == "__main__":
    main()
