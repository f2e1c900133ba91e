"""The multi-host what-if (traces/multi_host.py, `kvbudget replay --offline --hosts K
--route ...`): one trace across K simulated hosts, routed round-robin or by the outlook
answer, with figures worked by hand for K = 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvbudget.cli import replay_hosts
from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
from kvbudget.daemon.core.outlook import Shape, outlook
from kvbudget.daemon.core.records import RequestSpec
from kvbudget.daemon.server import ask_admission
from kvbudget.traces import multi_host
from kvbudget.traces.multi_host import run_hosts
from kvbudget.traces.replay import ReplaySetup, run_offline
from kvbudget.traces.sim_engine import EngineConfig
from kvbudget.traces.sim_request import SimRequest
from kvbudget.traces.trace_request import TraceRequest

from test_admission_support import SMALL_LAYOUTS, kinds

# One full-attention group, B = 8, 12 blocks a host; a step is 10 ms whatever it holds, a
# prompt is prefilled in one step, each request asks for its own output.
ENGINE = EngineConfig(max_num_seqs=8, max_num_batched_tokens=64, step_base_s=0.01, per_prefill_token_s=0.0,
                      grow_ahead_blocks=0, max_model_len=256, max_new_tokens=1)  # fmt: skip
SETUP = ReplaySetup(layout=SMALL_LAYOUTS["full"], num_blocks=12, engine=ENGINE)
# At 0: long (40 + 40: 10 blocks), short (8 + 8: 2 blocks), long, short.
TRACE = [TraceRequest(0.0, 40, 40), TraceRequest(0.0, 8, 8), TraceRequest(0.0, 40, 40), TraceRequest(0.0, 8, 8)]
FIGURES = ("routed", "finished", "preemptions", "wait_p50_s", "wait_p99_s", "makespan_s", "preempted_requests_per_host")


def figures(policy: str, route: str) -> dict:
    summary = run_hosts(TRACE, SETUP, policy, 2, route).summary
    assert summary["unfinished"] == 0
    return {k: summary[k] for k in FIGURES}


def test_round_robin_puts_both_long_requests_on_one_host():
    # Host 0 gets both longs: guaranteed reserves 10 + 10 > 12, so the second waits for
    # the first's 40 steps (0.40 s) and ends at 0.80; waits 0, 0, 0, 0.40 (p99 by linear
    # interpolation: 0.97 x 0.40 = 0.388).
    assert figures("guaranteed", "round-robin") == {
        "routed": [2, 2], "finished": 4, "preemptions": 0, "wait_p50_s": 0.0, "wait_p99_s": 0.388,
        "makespan_s": 0.8, "preempted_requests_per_host": [0, 0],
    }  # fmt: skip
    # Optimistic admits both, and one is preempted when their growth meets the pool's end.
    optimistic = figures("optimistic", "round-robin")
    assert (optimistic["preemptions"], optimistic["preempted_requests_per_host"]) == (1, [1, 0])


def test_headroom_pairs_a_long_with_a_short_on_each_host():
    # Room: spare - sent there unseen - needed - ahead (guaranteed's figures). Long 1: both
    # hosts idle, room 12 - 10 = 2 each: host 0, first in turn. Short 1: room 0 on host 0
    # (10 sent there), 10 on host 1: host 1. Long 2: host 0 lacks 8, host 1 has room 0:
    # host 1. Short 2: host 0 (room 0; host 1 would be 2 short). All four run at once.
    for policy in ("guaranteed", "optimistic"):
        assert figures(policy, "headroom") == {
            "routed": [2, 2], "finished": 4, "preemptions": 0, "wait_p50_s": 0.0, "wait_p99_s": 0.0,
            "makespan_s": 0.4, "preempted_requests_per_host": [0, 0],
        }  # fmt: skip


def test_headroom_prefers_where_it_fits_to_an_answer_of_no_wait_the_router_has_filled():
    # Two optimistic hosts of 8 blocks, watermark 2 blocks. Host 1 runs a (48 + 16: holds
    # 6), free 2. r1 (64 + 8: 8 blocks) fits only idle host 0: room 8 - 8 = 0; host 1
    # lacks 6. r2 (8 + 8: 1 block): host 0 still answers "admit now, no wait" (its daemon
    # has not seen r1), but room 8 - 8 sent - 1 = -1; host 1 answers watermark (free 2 -
    # 1 < 2), a wait of 16 steps (a's end), room 2 - 1 = 1 >= 0: host 1. (Ranking by the
    # wait first, as the rule before did, sent r2 to host 0, behind r1's 8 blocks.)
    config = AdmissionConfig(max_model_len=64, max_num_batched_tokens=64, watermark=0.25)
    idle, busy = (AdmissionController(SMALL_LAYOUTS["full"], 8, config) for _ in range(2))
    assert kinds(busy.submit(RequestSpec("a", 48, 16), 0.0)) == [("admit", "fits", "a")]
    r1, r2 = (SimRequest(name, TraceRequest(0.0, n, 8), 0, 0.0, 8, 64) for name, n in (("r1", 64), ("r2", 8)))
    assert (outlook(idle, Shape(8, 8), 0.0).wait_steps, outlook(busy, Shape(8, 8), 0.0).wait_steps) == (0, 16)
    router = multi_host.Router("headroom", [idle, busy], 0.02)
    router.unrouted.extend([r1, r2])
    router.route_until(0.0)
    assert (r1.engine, r2.engine, router.routed) == (0, 1, [1, 1])


def test_headroom_where_it_fits_nowhere_takes_the_soonest_wait_over_the_most_room():
    # Two guaranteed hosts of 10 blocks; r (24 + 8: L 32, 4 blocks) fits neither. Host 0
    # runs a (8 + 56: 8 blocks), spare 2, room -2: it lacks 2, which a gives back at its
    # end, 64 - 8 = 56 steps away. Host 1 runs b1 (40 + 24: 8) and b2 (8 + 8: 2), spare 0,
    # room -4: b2 gives back 2 at 8 steps, b1 8 more at 24: the 4 it lacks by 24. Host 1.
    config = AdmissionConfig(max_model_len=64, max_num_batched_tokens=64, policy="guaranteed")
    hosts = [AdmissionController(SMALL_LAYOUTS["full"], 10, config) for _ in range(2)]
    for k, name, prompt, new in ((0, "a", 8, 56), (1, "b1", 40, 24), (1, "b2", 8, 8)):
        assert kinds(hosts[k].submit(RequestSpec(name, prompt, new), 0.0)) == [("admit", "fits", name)]
    answers = [outlook(host, Shape(24, 8), 0.0) for host in hosts]
    assert [(a.blocks_spare, a.wait_steps) for a in answers] == [(2, 56), (0, 24)]
    router = multi_host.Router("headroom", hosts, 0.02)
    r = SimRequest("r", TraceRequest(0.0, 24, 8), 0, 0.0, 8, 64)
    router.unrouted.append(r)
    router.route_until(0.0)
    assert (r.engine, router.routed) == (1, [0, 1])


def test_one_host_is_the_offline_replay():
    one = run_hosts(TRACE, SETUP, "optimistic", 1, "headroom").summary
    offline = run_offline(TRACE, SETUP, "optimistic").summary
    for key in ("finished", "preemptions", "wait_p50_s", "wait_p99_s", "makespan_s", "steps", "decisions_by_kind"):
        assert one[key] == offline[key], key


def test_routing_asks_the_function_the_daemon_answers_with():
    assert multi_host.outlook is ask_admission.outlook
    assert replay_hosts.STRATEGIES == multi_host.STRATEGIES  # --route's names are the what-if's


def test_unknown_strategy_and_hosts_are_named():
    with pytest.raises(ValueError, match="^route: unknown strategy 'random'"):
        run_hosts(TRACE, SETUP, "optimistic", 2, "random")
    with pytest.raises(ValueError, match="^hosts: must be >= 1"):
        run_hosts(TRACE, SETUP, "optimistic", 0, "headroom")


# The same case through the command line: llama-3.1-8b at 8-token blocks is one full group.
FLAGS = ("--offline", "--hosts", "2", "--model", "llama-3.1-8b", "--block-size", "8", "--num-gpu-blocks", "13",
         "--max-model-len", "256", "--max-num-batched-tokens", "64", "--step-base-ms", "10",
         "--per-prefill-token-us", "0", "--grow-ahead-blocks", "0", "--max-new-tokens", "1", "--max-num-seqs", "8")  # fmt: skip


def replay(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvbudget", "replay", *argv], capture_output=True, text=True)


def test_replay_hosts_reports_each_strategy(tmp_path):
    trace = tmp_path / "four.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,40,40\n0,8,8\n0,40,40\n0,8,8\n")
    out = replay(str(trace), *FLAGS, "--policy", "guaranteed", "--json")
    assert out.returncode == 0, out.stderr
    runs = json.loads(out.stdout)
    assert [(r["variant"], r["hosts"], r["wait_p99_s"], r["makespan_s"]) for r in runs] == [
        ("round-robin x2", 2, 0.388, 0.8), ("headroom x2", 2, 0.0, 0.4)]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--route", "random"), "--route: unknown strategy random; expected round-robin,headroom"),
        (("--compare", "optimistic,guaranteed"), "--hosts runs one policy"),
        (("--engines", "2"), "--hosts: one simulated engine per host"),
    ],
)
def test_replay_hosts_misuse_is_one_line(tmp_path, extra, message):
    trace = tmp_path / "one.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,40,40\n")
    out = replay(str(trace), *FLAGS, *extra)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and message in out.stderr


def test_replay_hosts_needs_offline(tmp_path):
    trace = tmp_path / "one.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,40,40\n")
    out = replay(str(trace), "--hosts", "2")
    assert out.returncode != 0 and "--hosts / --route need --offline" in out.stderr
