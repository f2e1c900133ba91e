"""A short live replay against a real daemon process on a unix socket.

The replayer counts every distinct decision it received (Step replies and event streams);
the daemon's SQLite log must hold exactly that many rows, since a fresh daemon decides
only for this replay's requests."""

from __future__ import annotations

import asyncio
import json

import pytest
from daemon_harness import DaemonProcess

from kvbudget.cli import main
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
    from kvbudget import cmd_replay

    monkeypatch.setattr(cmd_replay, "_load", lambda args: pytest.fail("the trace was read"))
    assert main(["replay", "azure", "--target", target, "--limit", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvbudget replay: error: --target ") and message in err
    assert err.count("\n") == 1


def test_live_replay_reads_target_and_token_from_the_environment(tmp_path, capsys, monkeypatch):
    from kvbudget import cmd_replay

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
    monkeypatch.setattr(cmd_replay, "_run_live", run_live)
    assert main(["replay", "azure", "--limit", "3"]) == 2
    assert seen == {"target": "localhost:50051", "token": "env-token"}
    # a flag wins over the environment
    assert main(["replay", "azure", "--limit", "3", "--token", "flag-token"]) == 2
    assert seen["token"] == "flag-token"
