"""Cost of one routing answer (core/outlook.py, what AskAdmission runs on the event loop)
as the waiting queue grows.

    python bench/bench_outlook.py [--asks 50]

A one-group full-attention pool of 1000 blocks (16-token blocks, 8 KV heads of 128), 300
requests of ten tenants submitted (100-token prompts, 1000 new tokens: 141 run, under
optimistic), then 200, 1,000 and 10,000 waiting;
prints milliseconds per answer (CPU time of this process, `time.process_time`). The answer
walks the queue once (the requests ahead and what they need), so it grows with it.
"""

from __future__ import annotations

import argparse
import time

from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
from kvbudget.daemon.core.outlook import Shape, outlook
from kvbudget.daemon.core.records import RequestSpec
from kvbudget.daemon.core.spec import KV_DTYPES, AttentionSpec, group_layers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--asks", type=int, default=50)
    args = parser.parse_args()
    layout = group_layers([AttentionSpec(16, 8, 128, KV_DTYPES["bf16"])])
    ctrl = AdmissionController(layout, 1000, AdmissionConfig(max_model_len=4096, max_num_batched_tokens=512))
    for i in range(300):
        ctrl.submit(RequestSpec(f"r{i}", 100, 1000, tenant=f"t{i % 10}"), 0.0)
    for waiting in (200, 1000, 10_000):
        while ctrl.num_waiting < waiting:
            ctrl.submit(RequestSpec(f"w{ctrl.num_waiting}", 3000, 1000, tenant=f"t{ctrl.num_waiting % 10}"), 0.0)
        started = time.process_time()
        for _ in range(args.asks):
            outlook(ctrl, Shape(100, 100, tenant="t1"), 1.0)
        ms = (time.process_time() - started) / args.asks * 1e3
        print(f"{ctrl.num_running} running, {ctrl.num_waiting:>6} waiting: {ms:6.2f} ms per answer")


if __name__ == "__main__":
    main()
