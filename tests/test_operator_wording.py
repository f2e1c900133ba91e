"""What the operator-facing commands say, where a figure read two ways misled:

- `kvbudget admin status` splits the pool as the dashboard does (held, reserved, cached,
  free: each block once), from one shared function;
- `kvbudget doctor` names what makes reservations large: max_model_len, the clients' max
  new tokens, or, when the totals cannot tell, both;
- `kvbudget estimate` says what the daemon will have usable (vLLM's count less the null
  block) beside vLLM's own figure.

Every figure is worked out by hand in the comment above it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

from test_estimate_cli import run, run_json
from tui_helpers import snapshot, state_of, text_of

from kvbudget.cli import doctor, doctor_samples
from kvbudget.cli.cmd_admin import render_status, status_fields
from kvbudget.cli.doctor_samples import PlanView, PoolSample, Status
from kvbudget.tui import panels
from kvbudget.v1 import common_pb2

# ------------------------------------------------------------------ admin status


def _promised_pool() -> common_pb2.Snapshot:
    # 64 blocks: 4 held, 60 not held (the daemon's free count), 12 of them evictable cached;
    # 50 promised to running requests.
    return snapshot(num_blocks=64, num_held_blocks=4, num_free_blocks=60, num_reserved_blocks=50,
                    num_evictable_blocks=12)


def test_admin_status_splits_the_pool_as_the_dashboard_does() -> None:
    # The 50 promised take the 60 - 12 = 48 uncached free blocks and 2 cached ones:
    # cached = min(12, 64 - 4 - 50) = 10, free = 64 - 4 - 50 - 10 = 0. Held 4/64 = 6.25 % -> 6%.
    # (It said "64 total, 60 free (12 evictable), 4 held (6%), 50 reserved": 114 of 64.)
    s = _promised_pool()
    lines = render_status(s, "unix:///x.sock").splitlines()
    assert lines[2] == "  blocks     64 total: 4 held (6%), 50 reserved, 10 cached, 0 free"
    # The dashboard's pool panel, on the same snapshot: the same four figures.
    dashboard = text_of(panels.pool_panel(state_of(s))).splitlines()
    assert dashboard[1:3] == ["held 4  reserved 50", "cached 10  free 0 /64"]


def test_admin_status_json_uses_the_texts_words_for_the_texts_numbers() -> None:
    # Issue 32: the text said "350 free, 3,745 cached" where JSON's blocks.free was 4,095
    # (the daemon's free count). Each figure the text names has the JSON key of that name.
    s = _promised_pool()
    blocks = json.loads(json.dumps(status_fields(s)))["blocks"]
    line = render_status(s, "unix:///x.sock").splitlines()[2]
    said = {word: int(number) for number, word in re.findall(r"(\d+) ([a-z]+)", line)}
    assert said == {"total": 64, "held": 4, "reserved": 50, "cached": 10, "free": 0}
    assert {key: blocks[key] for key in said} == said
    # the parts, as above, still given apart; they add up to the total: 4 + 50 + 10 + 0 = 64
    assert blocks["parts"] == {"held": 4, "reserved": 50, "cached": 10, "free": 0}
    assert sum(blocks["parts"].values()) == blocks["total"] == 64
    # the daemon's own counts, under names of their own: 60 not held, 12 evictable
    assert (blocks["not_held"], blocks["evictable"]) == (60, 12)


def test_the_shared_pool_split_imports_nothing_of_the_project() -> None:
    # `kvbudget admin` may load no dashboard code, the dashboard no daemon server: the split
    # both read lives apart from either (its package's __init__ loads nothing on its own).
    code = "import sys, json\nimport kvbudget.client.pool_parts\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout.splitlines()[-1]))
    # (kvbudget.client, its package, loads its public names on first use: nothing here)
    expected = {"kvbudget", "kvbudget.client", "kvbudget.client.pool_parts"}
    assert {m for m in loaded if m.startswith("kvbudget")} == expected
    assert not {m.split(".")[0] for m in loaded} & {"textual", "rich", "torch", "pynvml", "grpc", "google"}


# ------------------------------------------------------------------ doctor: reservations

# max_model_len 4096 in 16-token blocks: cdiv(4096, 16) = 256 blocks a request at most
# (one full-attention group); every prompt below is 256 tokens, 16 blocks held.
PLAN_4K = PlanView(num_blocks=1000, bytes_per_block=2 << 20, block_size=16, max_model_len=4096)


def _reservations(*, held: int, reserved: int, running: int, policy: str = "guaranteed") -> doctor_samples.Finding:
    sample = PoolSample(time_s=1000.0, policy=policy, num_blocks=1000, free=1000 - held, held=held,
                        reserved=reserved, running=running, waiting=0, preemptions=0, admits=10, plan=PLAN_4K)
    (found,) = [f for f in doctor.diagnose([sample]).findings if f.check == "reservations"]
    assert found.status is Status.WARN
    return found


def test_reservations_as_large_as_max_model_len_name_it() -> None:
    # 3 requests sent no max new tokens: L = max_model_len, 256 blocks each, 768 committed
    # = 3 x 256; 48 held, 720 reserved (15.0x).
    found = _reservations(held=48, reserved=720, running=3)
    assert found.summary == (
        "720 blocks reserved for only 48 held (15.0x): max_model_len-sized reservations "
        "(768 blocks committed to 3 requests, 256 each; max_model_len 4096 takes cdiv(4096, 16) = 256: "
        "clients send no max new tokens, or ones that reach it)"
    )
    assert found.data["cause"] == "max_model_len"


def test_reservations_sized_by_max_new_tokens_name_them_not_max_model_len() -> None:
    # 8 requests of 256 + 1024 max new tokens: L = 1280, cdiv(1280, 16) = 80 blocks each,
    # 640 committed; 128 held, 512 reserved (4.0x). 80 <= 256 / 2: at most half could be at
    # max_model_len. (It said "max_model_len-sized reservations (max_model_len 4096)".)
    found = _reservations(held=128, reserved=512, running=8)
    assert found.summary == (
        "512 blocks reserved for only 128 held (4.0x): reservations sized by the clients' max new tokens "
        "(640 blocks committed to 8 requests, 80 each; max_model_len 4096 takes cdiv(4096, 16) = 256)"
    )
    assert found.data["cause"] == "max_new_tokens"


def test_reservations_the_totals_cannot_explain_name_both() -> None:
    # 2 requests at max_model_len (256 blocks) and 2 at L = 1280 (80): 672 committed, 168 a
    # request, between 256 / 2 and 256 -- or 4 requests of 168 blocks each: either.
    # 64 held, 608 reserved (9.5x).
    found = _reservations(held=64, reserved=608, running=4)
    assert found.summary == (
        "608 blocks reserved for only 64 held (9.5x): max_model_len-sized reservations or the clients' "
        "large max new tokens, the totals cannot tell which (672 blocks committed to 4 requests, 168 each; "
        "max_model_len 4096 takes cdiv(4096, 16) = 256)"
    )
    assert found.data["cause"] == "unknown"
    # 600 committed to 2 requests: 300 each, more than 256 -- a hybrid model's window groups
    # add theirs to the full-attention group's; 40 held, 560 reserved (14.0x).
    found = _reservations(held=40, reserved=560, running=2)
    assert found.summary.endswith(
        "the totals cannot tell which (600 blocks committed to 2 requests, 300 each; max_model_len 4096 "
        "takes cdiv(4096, 16) = 256 in a full-attention group: the model has more groups)"
    )
    assert found.data["cause"] == "unknown"


def test_the_naive_policy_is_max_model_len_whatever_the_requests_ask() -> None:
    # naive charges every request max_model_len: 8 x 256 would be 2,048 blocks, whatever
    # 640 committed say; 128 held, 512 reserved (4.0x).
    found = _reservations(held=128, reserved=512, running=8, policy="naive")
    assert found.summary == (
        "512 blocks reserved for only 128 held (4.0x): max_model_len-sized reservations: the naive "
        "policy charges every request max_model_len 4096, whatever its max new tokens"
    )


def test_the_cause_from_a_real_controller_snapshot() -> None:
    from kvbudget.daemon.wire import convert
    from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
    from kvbudget.daemon.core.records import DecisionKind, RequestSpec
    from test_admission_support import SMALL_LAYOUTS

    # One full-attention group, 8-token blocks; max_model_len 128: cdiv(128, 8) = 16 blocks.
    plan = common_pb2.PoolPlan(block_size_tokens=8, num_blocks=20, max_model_len_tokens=128)

    def cause(*requests: RequestSpec) -> tuple[str, str]:
        config = AdmissionConfig(max_model_len=128, max_num_batched_tokens=64, watermark=0.0, policy="guaranteed")
        ctrl = AdmissionController(SMALL_LAYOUTS["full"], 20, config)
        for r in requests:
            assert ctrl.submit(r, 0.0)[0].kind is DecisionKind.ADMIT
        ctrl.check_integrity()
        sample = doctor_samples.sample_from_snapshot(convert.snapshot_to_proto(ctrl.snapshot(0.0), plan=plan))
        (found,) = [f for f in doctor.diagnose([sample]).findings if f.check == "reservations"]
        assert found.status is Status.WARN
        return str(found.data["cause"]), found.summary

    # No max new tokens: L = 128, 16 blocks promised, 1 held (an 8-token prompt), 15 reserved.
    assert cause(RequestSpec("a", 8)) == ("max_model_len", (
        "15 blocks reserved for only 1 held (15.0x): max_model_len-sized reservations (16 blocks committed "
        "to 1 request, 16 each; max_model_len 128 takes cdiv(128, 8) = 16: clients send no max new tokens, "
        "or ones that reach it)"))
    # 8 + 32 max new tokens: L = 40, 5 blocks each, 1 held; 2 requests: 10 committed, 2 held, 8
    # reserved (4.0x); 5 <= 16 / 2.
    assert cause(RequestSpec("a", 8, 32), RequestSpec("b", 8, 32))[0] == "max_new_tokens"


# ------------------------------------------------------------------ estimate


def test_estimate_says_what_the_daemon_has_usable_beside_vllms_figure(tmp_path) -> None:
    # 100 blocks (vLLM's count); block 0 is the null block: the daemon hands out 99.
    # 1,600 tokens: cdiv(1600, 16) = 100 blocks a request. vLLM: 100 / 100 = 1.00 at once;
    # the daemon: 99 / 100 = 0.99 -- not even one (it rejects one as never fitting).
    args = ("--model", "llama-3.1-8b", "--num-gpu-blocks", "100", "--tokens-per-request", "1600")
    out = run_json(*args)
    assert (out["num_blocks"], out["daemon_usable_blocks"]) == (100, 99)
    assert out["max_concurrency"] == out["vllm_max_concurrency"] == 1.0  # kept: vLLM's figure
    assert out["daemon_max_concurrency"] == 0.99
    assert out["daemon_naive_max_concurrency"] == 0.99  # one group: naive is the same 100 blocks

    text = run(*args)
    assert text.returncode == 0, text.stderr
    assert "        99 usable by kvbudget daemon (block 0 is the null block)\n" in text.stdout
    row = next(line for line in text.stdout.splitlines() if "1,600 " in line and "│" in line)
    # layer-aware, naive (daemon's), gain 100 / 100, vLLM's figure
    assert [cell.strip() for cell in row.split("│")[1:-1]] == ["1,600", "0.99", "0.99", "x1.00", "1.00"]
    assert "layer-aware, naive: on the daemon's 99 usable blocks; vLLM's: on 100\n" in text.stdout

    # The daemon itself, on the same setting, says the same.
    check = subprocess.run(
        [sys.executable, "-m", "kvbudget", "daemon", "--check-config", "--model", "llama-3.1-8b",
         "--num-gpu-blocks", "100", "--db-path", str(tmp_path / "log.db"), "--listen",
         f"unix://{tmp_path}/kvbudget.sock"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert check.returncode == 0, check.stderr
    assert "(99 usable + the null block; from num_gpu_blocks)" in check.stdout


def test_estimate_trace_points_give_the_daemons_figure_too(tmp_path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,1500,500\n")
    out = run_json("--model", "llama-3.1-8b", "--num-gpu-blocks", "1000", "--max-model-len", "4096",
                   "--trace", str(trace))
    # one request of 2,000 tokens: cdiv(2000, 16) = 125 blocks; vLLM 1000 / 125 = 8.0,
    # the daemon 999 / 125 = 7.992
    p50 = out["trace"]["p50"]
    assert (p50["tokens"], p50["max_concurrency"], p50["daemon_max_concurrency"]) == (2000, 8.0, 7.992)
    assert p50["daemon_naive_max_concurrency"] == 7.992
