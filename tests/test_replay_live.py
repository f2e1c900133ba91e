"""A short live replay against a real daemon process on a unix socket.

The replayer counts every distinct decision it received (Step replies and event streams);
the daemon's SQLite log must hold exactly that many rows, since a fresh daemon decides
only for this replay's requests."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys

import pytest
from daemon_harness import DaemonProcess, wait_until

from kvbudget.cli.main import main
from kvbudget.client import ObserverClient

pytestmark = pytest.mark.slow


def _snapshot(target: str):
    async def get():
        async with ObserverClient(target) as observer:
            return await observer.snapshot()

    return asyncio.run(get())


@pytest.mark.parametrize("trace, engines", [("azure", 1), ("mooncake", 2)])
def test_live_replay_decisions_all_in_the_log(tmp_path, capsys, trace, engines):
    # A pool small enough that requests queue and (optimistic) get preempted:
    # 1,500 blocks x 16 tokens = 24,000 KV tokens for ~1k-token Azure prompts / ~7k Mooncake.
    daemon = DaemonProcess(tmp_path, "--num-gpu-blocks", "1500", "--max-model-len", "131072")
    with daemon:
        code = main([
            "replay", trace, "--target", daemon.target, "--limit", "40", "--as-fast-as-possible",
            "--engines", str(engines), "--json",
        ])  # fmt: skip
        assert code == 0
        summary = json.loads(capsys.readouterr().out)
        assert summary["mode"] == "live" and summary["requests"] == 40
        assert summary["finished"] + summary["rejected"] == 40
        assert summary["unfinished"] == 0
        # the dashboard's feed: the replay reported its progress, and its end
        replays = _snapshot(daemon.target).replays
        assert [(r.total, r.position, r.done) for r in replays] == [(40, 40, True)]
        rows = daemon.decision_rows()
        assert summary["decisions"] == len(rows) > 0
        by_kind: dict[str, int] = {}
        for row in rows:
            by_kind[row["kind"]] = by_kind.get(row["kind"], 0) + 1
        assert by_kind == summary["decisions_by_kind"]
        assert by_kind["release"] == summary["finished"]


def test_live_replay_unreachable_daemon_is_one_line(tmp_path, capsys):
    target = f"unix://{tmp_path}/nobody.sock"
    assert main(["replay", "azure", "--target", target, "--limit", "3"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"kvbudget replay: error: --target {target}: no daemon socket at {tmp_path}/nobody.sock "
        "(is `kvbudget daemon` running?)\n"
    )


@pytest.mark.parametrize("target, message", [
    ("unix:/nope/kvbudget.sock", "no daemon socket at /nope/kvbudget.sock"),
    ("bogus::addr", "expected unix:///path/to.sock or host:port"),
])
def test_a_bad_target_is_refused_before_the_trace_is_read(target, message, capsys, monkeypatch):
    # Checked before anything else: the trace loader must never run.
    from kvbudget.cli import cmd_replay

    monkeypatch.setattr(cmd_replay, "_load", lambda args: pytest.fail("the trace was read"))
    assert main(["replay", "azure", "--target", target, "--limit", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvbudget replay: error: --target ") and message in err
    assert err.count("\n") == 1


def test_live_replay_reads_target_and_token_from_the_environment(tmp_path, capsys, monkeypatch):
    from kvbudget.cli import cmd_replay, replay_live

    target = f"unix://{tmp_path}/from-env.sock"
    monkeypatch.setenv("KVBUDGET_TARGET", target)
    assert main(["replay", "azure", "--limit", "3"]) == 2
    assert f"--target {target}: no daemon socket" in capsys.readouterr().err

    seen = {}

    def run_live(args, trace):
        seen.update(target=args.target, token=args.token)
        raise cmd_replay.CLIError("stop here")

    monkeypatch.setenv("KVBUDGET_TARGET", "localhost:50051")
    monkeypatch.setenv("KVBUDGET_TOKEN", "env-token")
    monkeypatch.setattr(replay_live, "run", run_live)
    assert main(["replay", "azure", "--limit", "3"]) == 2
    assert seen == {"target": "localhost:50051", "token": "env-token"}
    # a flag wins over the environment
    assert main(["replay", "azure", "--limit", "3", "--token", "flag-token"]) == 2
    assert seen["token"] == "flag-token"


def _csv(tmp_path, name: str, rows: str) -> str:
    path = tmp_path / name
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + rows)
    return str(path)


def test_live_unsorted_trace_is_paced_from_its_earliest_arrival(tmp_path, capsys):
    # File order 3 s, 0 s, 2 s; --limit 2 takes the two earliest (0 s, 2 s), so at speed 4
    # the replay lasts >= 0.5 s of wall time. Measured from the first row, the earlier
    # rows "arrived" in the past and the replay finished at once. The longest output
    # (50, the 3 s row, outside the window) is what each request asks for, as offline.
    trace = _csv(tmp_path, "unsorted.csv", "3,100,50\n0,100,10\n2,100,10\n")
    with DaemonProcess(tmp_path):
        code = main(["replay", trace, "--target", f"unix://{tmp_path}/kvbudget.sock", "--limit", "2",
                     "--speed", "4", "--json"])  # fmt: skip
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["finished"] == 2 and summary["wait_p99_s"] < 0.5
    assert summary["makespan_s"] >= 2.0 and summary["wall_s"] >= 0.45
    assert summary["max_new_tokens"] == 50


def test_live_and_offline_pools_agree_for_the_same_num_gpu_blocks(tmp_path, capsys):
    # The daemon keeps block 0 as the null block: --num-gpu-blocks 100 is 99 usable, and a
    # 1,590 + 10 token request (100 blocks) is rejected under guaranteed. Offline, the same.
    trace = _csv(tmp_path, "one.csv", "0,1590,10\n")
    with DaemonProcess(tmp_path, "--num-gpu-blocks", "100") as daemon:
        assert main(["replay", trace, "--target", daemon.target, "--policy", "guaranteed",
                     "--as-fast-as-possible", "--json"]) == 0  # fmt: skip
        live = json.loads(capsys.readouterr().out)
    assert main(["replay", trace, "--offline", "--num-gpu-blocks", "100", "--max-model-len", "2048",
                 "--policy", "guaranteed", "--json"]) == 0  # fmt: skip
    offline = json.loads(capsys.readouterr().out)
    for key in ("num_blocks", "requests", "finished", "rejected"):
        assert live[key] == offline[key], key
    assert (live["num_blocks"], live["rejected"]) == (99, 1)


def test_live_and_offline_decide_alike_under_pressure(tmp_path, capsys):
    """A tight pool with preemptions, strict FCFS, as fast as possible: the same decisions
    live and offline. The daemon's tick between two steps admits nothing a step left to
    the next (a step that preempted, or ran out of what it could start), so its timing
    cannot change a decision."""
    run = ["--limit", "150", "--grow-ahead-blocks", "4", "--json"]
    with DaemonProcess(tmp_path, "--num-gpu-blocks", "600", "--max-num-batched-tokens", "512",
                       "--max-model-len", "16384", "--backfill-depth", "0") as daemon:  # fmt: skip
        assert main(["replay", "azure", "--target", daemon.target, "--as-fast-as-possible", *run]) == 0
        live = json.loads(capsys.readouterr().out)
    assert main(["replay", "azure", "--offline", "--num-gpu-blocks", "600", "--max-num-batched-tokens", "512",
                 "--max-model-len", "16384", "--set", "admission.backfill_depth=0", *run]) == 0  # fmt: skip
    offline = json.loads(capsys.readouterr().out)
    assert offline["preemptions"] > 0
    for key in ("preemptions", "wait_p50_s", "wait_p99_s", "makespan_s", "decisions_by_kind"):
        assert live[key] == offline[key], key


def test_live_summary_names_every_policy_that_decided(tmp_path):
    # The first request runs under optimistic; the policy is switched to guaranteed before
    # the second arrives (3 s later). The daemon's policy at the end alone would say
    # "guaranteed"; the decisions say both.
    import subprocess
    import sys

    from daemon_harness import wait_until

    trace = _csv(tmp_path, "two.csv", "0,100,10\n3,100,10\n")

    def released() -> bool:
        try:
            return bool(daemon.decision_rows("kind = 'release'"))
        except Exception:  # the log is not there yet
            return False

    async def switch(policy: str) -> None:
        async with ObserverClient(daemon.target) as observer:
            await observer.set_policy(policy)

    with DaemonProcess(tmp_path) as daemon:
        replay = subprocess.Popen(
            [sys.executable, "-m", "kvbudget", "replay", trace, "--target", daemon.target,
             "--policy", "optimistic", "--speed", "1", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            wait_until(released)
            asyncio.run(switch("guaranteed"))
            out, err = replay.communicate(timeout=60)
        finally:
            if replay.poll() is None:
                replay.kill()
    assert replay.returncode == 0, err
    summary = json.loads(out)
    assert summary["finished"] == 2
    assert summary["policy"] == "optimistic -> guaranteed"


def test_policies_in_seq_order_whatever_order_decisions_arrive_in():
    # An event stream can deliver a decision after a later one from a Step reply: ordered
    # by seq, runs merged, a decision seen twice counted once.
    from kvbudget.daemon.wire import convert
    from kvbudget.daemon.core.records import DecisionKind, Reason
    from kvbudget.daemon.core.spec import AttentionSpec, group_layers, kv_dtype
    from kvbudget.traces.replay_live import DaemonBackend, LiveDecision, ReplyReader
    from kvbudget.v1 import common_pb2

    layout = group_layers([AttentionSpec(16, 1, 1, kv_dtype("bf16"))], model_name="toy")
    backend = DaemonBackend("unix:///nowhere.sock", None, layout, 10, speed=None)

    def d(seq: int, policy: str) -> LiveDecision:
        return LiveDecision(seq, DecisionKind.ADMIT, Reason.FITS, f"r{seq}", 0, 0, 0, 0, policy)

    backend.note([d(1, "optimistic"), d(2, "optimistic")])
    assert backend.policies() == ["optimistic"]
    backend.note([d(5, "predictive"), d(3, "optimistic"), d(4, "guaranteed")])
    backend.note([d(4, "optimistic"), d(6, "predictive")])  # seq 4 again: already counted
    assert backend.policies() == ["optimistic", "guaranteed", "predictive"]
    # a Step reply's decision carries its policy
    message = common_pb2.Decision(seq=7, policy=convert.policy_to_proto("guaranteed"))
    (light,) = ReplyReader().read([message])
    assert light.policy == "guaranteed"


def test_a_daemon_restarted_under_a_live_replay_ends_it_with_one_line(tmp_path):
    # The replay's engine session dies with the daemon: the new one knows nothing of its
    # requests, so the replay cannot go on faithfully. It says so in one line, exit 2, no
    # traceback (it was a SessionLost traceback). Requests every 0.1 s for a minute, each
    # 500 tokens of decode: the replay is mid-flight whenever the daemon goes.
    import signal
    import subprocess
    import sys

    from daemon_harness import wait_until

    trace = _csv(tmp_path, "long.csv", "".join(f"{i / 10:.1f},100,500\n" for i in range(600)))
    first = DaemonProcess(tmp_path).start()
    replay = subprocess.Popen(
        [sys.executable, "-m", "kvbudget", "replay", trace, "--target", first.target, "--speed", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    second = DaemonProcess(tmp_path)
    try:
        wait_until(lambda: len(first.decision_rows("kind = 'admit'")) >= 3)
        first.signal(signal.SIGKILL)
        first.wait()
        second.start()
        _, err = replay.communicate(timeout=120)
    finally:
        if replay.poll() is None:
            replay.kill()
        first.stop()
        second.stop()
    assert replay.returncode == 2, err  # a CLIError, as every one-line refusal
    assert "Traceback" not in err
    [line] = [x for x in err.splitlines() if x.startswith("kvbudget")]
    assert "lost this replay's engine session mid-replay" in line
    assert line.endswith("start the replay again")


# `kvbudget ...` as a terminal's shell starts it, SIGINT at its default. Started in the
# background (`... &` from a script, nohup, some CI runners) the test inherits SIGINT
# ignored, and so did the replay: Ctrl-C is not the user's there, so it rightly kept it
# ignored, and the SIGINT case waited out its timeout.
AS_FROM_A_TERMINAL = (
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "runpy.run_module('kvbudget', run_name='__main__')"
)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_live_replay_stopped_by_a_signal_releases_its_requests(tmp_path, signum):
    """SIGTERM is how the dashboard and the demo stop a replay, SIGHUP what a closed terminal
    sends: either ends it as Ctrl-C does, its requests released (`release aborted`) at once,
    where the default action killed it and left them held until the lease lapsed. Each
    says how far it got, in one line (it ended silently)."""
    daemon = DaemonProcess(tmp_path, "--num-gpu-blocks", "1500", "--max-model-len", "131072", lease_ttl_s=600)
    with daemon:
        replay = subprocess.Popen(
            [sys.executable, "-c", AS_FROM_A_TERMINAL, "replay", "azure", "--target", daemon.target, "--speed", "1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        try:
            wait_until(lambda: _snapshot(daemon.target).num_running > 0, timeout=60)
            replay.send_signal(signum)
            assert replay.wait(60) == 128 + signum, replay.stderr.read()
            err = replay.stderr.read()
            assert "Traceback" not in err
            [said] = err.splitlines()
            assert re.fullmatch(r"kvbudget replay: stopped after [\d,]+ of 19,366 requests; the daemon releases "
                                r"those still held \(release aborted\)", said), said
        finally:
            if replay.poll() is None:
                replay.kill()
                replay.wait()
        # Released by the replay on its way out (a 600 s lease would keep them held).
        snapshot = _snapshot(daemon.target)
        assert (snapshot.num_running, snapshot.num_waiting, snapshot.num_held_blocks) == (0, 0, 0)
        kinds = {(row["kind"], row["reason"]) for row in daemon.decision_rows()}
        assert ("release", "aborted") in kinds and not any(kind == "expire" for kind, _ in kinds)
