"""`kvbudget admin` against real daemon processes: each action changes what the daemon
reports, bad input is one line and a non-zero exit, and over TCP only an admin token may act.

The daemon is the harness's: llama-3.1-8b, 16-token blocks, 64 usable blocks.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvbudget.cli import main as cli
from kvbudget.client import EngineClient
from kvbudget.daemon.core.records import DecisionKind, RequestSpec

from daemon_harness import DaemonProcess, free_port

pytestmark = pytest.mark.slow
TOKENS = {"observer": "observer-token-123", "admin": "admin-token-123"}


@pytest.fixture(autouse=True)
def _no_ambient_target(monkeypatch: pytest.MonkeyPatch) -> None:
    # --target / --token defaults come from these; the tests name both explicitly.
    monkeypatch.delenv("KVBUDGET_TARGET", raising=False)
    monkeypatch.delenv("KVBUDGET_TOKEN", raising=False)


def admin(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """`kvbudget admin ARGV` in this process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    try:
        code = cli.main(["admin", *argv])
    except SystemExit as exc:  # argparse's own exits
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def status(capsys, target: str, *extra: str) -> dict:
    code, out, err = admin(capsys, "--target", target, *extra, "--json", "status")
    assert code == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with DaemonProcess(tmp_path_factory.mktemp("admin")) as process:
        yield process


# ---------------------------------------------------------------- policy


def test_set_policy_prints_the_switch_status_shows_it_and_the_log_has_it(daemon, capsys) -> None:
    before = status(capsys, daemon.target)["policy"]
    target = "naive" if before != "naive" else "guaranteed"

    code, out, err = admin(capsys, "--target", daemon.target, "set-policy", target)

    assert (code, err) == (0, "")
    assert out == f"policy: {before} -> {target}\n"
    assert status(capsys, daemon.target)["policy"] == target
    # The switch is a POLICY decision in the log, readable by `kvbudget log` without the daemon.
    # Its row is committed before the reply, so it is there now.
    log = subprocess.run(
        [sys.executable, "-m", "kvbudget", "log", "--kind", "policy", "--db", str(daemon.db_path), "--json"],
        capture_output=True, text=True, check=True,
    )
    rows = [json.loads(line) for line in log.stdout.splitlines()]
    assert rows[-1]["kind"] == DecisionKind.POLICY.value
    assert rows[-1]["policy"] == target
    assert rows[-1]["detail"] == f"by unix socket (admin): {before} -> {target}"  # who, before -> after
    # And in the daemon's own log (the journal): who asked, what, before -> after (issue 32).
    assert f"admin change by unix: (admin): policy {before} -> {target}; waiting requests: 0 admitted, 0 rejected" \
        in daemon.stderr()


def test_set_policy_json_gives_previous_and_new(daemon, capsys) -> None:
    admin(capsys, "--target", daemon.target, "set-policy", "optimistic")
    # --json and --target are accepted after the action too
    code, out, err = admin(capsys, "set-policy", "predictive", "--target", daemon.target, "--json")
    assert code == 0, err
    assert json.loads(out) == {
        "target": daemon.target, "action": "set-policy", "previous": "optimistic", "policy": "predictive",
        "changed": True, "admitted": 0, "rejected_by_reason": {},
    }


def _policy_rows(db_path) -> list[dict]:
    log = subprocess.run(
        [sys.executable, "-m", "kvbudget", "log", "--kind", "policy", "--db", str(db_path), "--json"],
        capture_output=True, text=True, check=True,
    )
    return [json.loads(line) for line in log.stdout.splitlines()]


def test_set_policy_to_the_policy_in_force_changes_nothing_and_logs_nothing(daemon, capsys) -> None:
    admin(capsys, "--target", daemon.target, "set-policy", "optimistic")
    rows_before = _policy_rows(daemon.db_path)

    code, out, err = admin(capsys, "--target", daemon.target, "set-policy", "optimistic")

    assert (code, out, err) == (0, "policy: optimistic already (nothing changed)\n", "")
    assert _policy_rows(daemon.db_path) == rows_before  # no no-op POLICY row
    code, out, err = admin(capsys, "--target", daemon.target, "--json", "set-policy", "optimistic")
    assert json.loads(out)["changed"] is False and json.loads(out)["previous"] == "optimistic"


async def test_switching_to_naive_says_which_waiting_requests_it_rejected(tmp_path, capsys) -> None:
    # The harness pool: 64 blocks of 16 tokens, max_model_len 2048. Naive charges every
    # request cdiv(2048, 16) = 128 blocks > 64: a waiting request can never fit under it.
    with DaemonProcess(tmp_path, "--policy", "guaranteed") as process:
        async with EngineClient(process.target, "engine-0") as engine:
            # r1: 16 + 1008 = 1024 tokens = 64 blocks reserved, the whole pool; r2 waits.
            [r1, r2] = await engine.step(submits=[RequestSpec("r1", 16, 1008), RequestSpec("r2", 16, 16)])
            assert (r1.kind, r2.kind) == (DecisionKind.ADMIT, DecisionKind.QUEUE)

            # Asked first (issue 32: naive rejected 251 waiting requests at once, unasked):
            # without --yes, one line that says how many, a non-zero exit, nothing changed.
            code, out, err = await asyncio.to_thread(
                admin, capsys, "--target", process.target, "set-policy", "naive")
            assert (code, out) == (2, "")
            assert err == ("kvbudget admin: error: set-policy naive: all 1 waiting request would be rejected at "
                           "once (never_fits: a request of max_model_len, 2048 tokens, cannot fit this pool "
                           "under naive); pass --yes to switch anyway\n")
            before = await asyncio.to_thread(status, capsys, process.target)
            assert (before["policy"], before["requests"]["waiting"]) == ("guaranteed", 1)

            code, out, err = await asyncio.to_thread(
                admin, capsys, "--target", process.target, "set-policy", "naive", "--yes")

            assert (code, err) == (0, "")
            assert out == "policy: guaranteed -> naive; 1 waiting request rejected (never_fits 1)\n"
            # The engine hears of it on its Events stream: r2 is rejected, not left waiting.
            events = engine.events()
            rejected = await asyncio.wait_for(anext(events), 10)
            assert (rejected.kind, rejected.reason.value, rejected.request_id) == (
                DecisionKind.REJECT, "never_fits", "r2")
            await events.aclose()
            snapshot = await asyncio.to_thread(status, capsys, process.target)
            assert snapshot["requests"]["waiting"] == 0 and snapshot["requests"]["running"] == 1


async def test_switching_to_a_looser_policy_says_which_waiting_requests_it_admitted(tmp_path, capsys) -> None:
    with DaemonProcess(tmp_path, "--policy", "guaranteed") as process:
        async with EngineClient(process.target, "engine-0") as engine:
            # r1: 16 + 496 = 512 tokens, 32 blocks reserved (1 held), which it keeps after the
            # switch. r2, r3: 1024 tokens = 64 blocks each > the 32 spare: they wait. Optimistic
            # charges what a request holds at first (16 prompt tokens: 1 block): both fit at once.
            decisions = await engine.step(
                submits=[RequestSpec("r1", 16, 496), RequestSpec("r2", 16, 1008), RequestSpec("r3", 16, 1008)])
            assert [d.kind for d in decisions] == [DecisionKind.ADMIT, DecisionKind.QUEUE, DecisionKind.QUEUE]

            code, out, err = await asyncio.to_thread(
                admin, capsys, "--target", process.target, "--json", "set-policy", "optimistic")

            assert (code, err) == (0, "")
            assert json.loads(out) == {
                "target": process.target, "action": "set-policy", "previous": "guaranteed", "policy": "optimistic",
                "changed": True, "admitted": 2, "rejected_by_reason": {},
            }


def test_status_text_is_one_screen_with_the_pool_figures(daemon, capsys) -> None:
    admin(capsys, "--target", daemon.target, "set-policy", "guaranteed")
    code, out, err = admin(capsys, "--target", daemon.target, "status")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"kvbudget daemon at {daemon.target}: llama-3.1-8b"
    assert lines[1].split() == ["policy", "guaranteed"]
    # Nothing runs on this daemon: all 64 blocks free, none held, promised or cached.
    assert lines[2].split() == ["blocks", "64", "total:", "0", "held", "(0%),", "0", "reserved,", "0", "cached,",
                                "64", "free"]
    assert lines[3].split() == ["requests", "0", "running,", "0", "waiting,", "0", "preemptions"]
    assert len(lines) <= 24
    assert not any(line.split()[0] == "log" for line in lines[1:])  # said only when writes fail


def test_status_says_when_the_decision_log_cannot_write() -> None:
    from kvbudget.cli.cmd_admin import render_status, status_fields
    from kvbudget.v1 import common_pb2

    snapshot = common_pb2.Snapshot(
        num_blocks=64, num_free_blocks=20, num_held_blocks=44,
        decision_log=common_pb2.DecisionLogState(num_unwritten_decisions=21, write_error="write failed: disk full"),
    )
    assert status_fields(snapshot)["decision_log"] == {"unwritten": 21, "write_error": "write failed: disk full"}
    lines = render_status(snapshot, "unix:///x.sock").splitlines()
    assert lines[4] == "  log        CANNOT WRITE (write failed: disk full): 21 decisions wait, steps are refused"


# ---------------------------------------------------------------- quotas


def _tenant(snapshot: dict, name: str) -> dict:
    return next(t for t in snapshot["tenants"] if t["tenant"] == name)


def test_set_quota_shows_in_the_snapshot_and_zero_clears_it(daemon, capsys) -> None:
    code, out, err = admin(capsys, "--target", daemon.target, "set-quota", "team-a", "--max-share", "0.25",
                           "--weight", "2")
    # quota blocks = int(0.25 * 64 usable blocks) = 16
    assert (code, err) == (0, "")
    assert out == "tenant team-a: max share 0.25 (16 of 64 blocks), weight 2\n"
    row = _tenant(status(capsys, daemon.target), "team-a")
    assert (row["quota_blocks"], row["weight"]) == (16, 2.0)

    code, out, err = admin(capsys, "--target", daemon.target, "--json", "set-quota", "team-a", "--max-share", "0")
    assert code == 0, err
    assert json.loads(out)["quota_blocks"] == 0
    row = _tenant(status(capsys, daemon.target), "team-a")
    assert (row["quota_blocks"], row["weight"]) == (0, 1.0)  # cleared; weight back to the default 1


def test_every_quota_change_is_in_the_daemons_log_with_before_and_after(daemon, capsys) -> None:
    # Issue 32: admin changes appeared in neither log; a quota lasts only until a restart
    # or reload, so the journal must say who set what, from what.
    for share, weight in (("0.5", "3"), ("0", "1")):
        code, out, err = admin(capsys, "--target", daemon.target, "set-quota", "team-j", "--max-share", share,
                               "--weight", weight)
        assert code == 0, err
    journal = daemon.stderr()
    assert "admin change by unix: (admin): tenant 'team-j' no quota weight 1 -> max_share 0.5 weight 3" in journal
    assert "admin change by unix: (admin): tenant 'team-j' max_share 0.5 weight 3 -> no quota weight 1" in journal


@pytest.mark.parametrize("share", ["-0.1", "1.5", "nan", "half"])
def test_a_share_outside_zero_to_one_is_an_argument_error(daemon, capsys, share) -> None:
    code, out, err = admin(capsys, "--target", daemon.target, "set-quota", "team-a", "--max-share", share)
    assert code == 2
    assert out == ""
    assert err.splitlines()[-1].startswith("kvbudget admin set-quota: error: argument --max-share:")
    assert "Traceback" not in err


def test_an_unknown_policy_is_an_argument_error(daemon, capsys) -> None:
    before = status(capsys, daemon.target)["policy"]
    code, out, err = admin(capsys, "--target", daemon.target, "set-policy", "greedy")
    assert code == 2
    assert "argument policy: invalid choice: 'greedy'" in err.splitlines()[-1]
    assert status(capsys, daemon.target)["policy"] == before


def test_the_daemons_refusal_is_one_line_with_the_status_code(daemon, capsys) -> None:
    # 129 characters: the CLI passes it on, the daemon refuses it (at most 128).
    code, out, err = admin(capsys, "--target", daemon.target, "set-quota", "t" * 129, "--max-share", "0.5")
    assert code == 2
    assert out == ""
    assert err == (
        f"kvbudget admin: error: {daemon.target}: "
        "INVALID_ARGUMENT: tenant: required, printable, at most 128 characters\n"
    )


def test_drain_timeout_without_wait_is_refused_before_anything_drains(daemon, capsys) -> None:
    # --timeout alone did nothing, and the drain (which cannot be undone) went ahead.
    code, out, err = admin(capsys, "--target", daemon.target, "drain", "--timeout", "5")
    assert (code, out, err) == (2, "", "kvbudget admin: error: drain --timeout: only with --wait\n")
    assert status(capsys, daemon.target)["draining"] is False


def test_a_share_of_less_than_one_block_is_refused_not_a_ban(daemon, capsys) -> None:
    # int(1e-300 x 64) = 0 blocks: every request of the tenant was rejected, while the
    # snapshot showed quota 0, which reads "no quota".
    code, out, err = admin(capsys, "--target", daemon.target, "set-quota", "tiny", "--max-share", "1e-300")
    assert code == 2
    assert err == (
        f"kvbudget admin: error: {daemon.target}: "
        "INVALID_ARGUMENT: max_share: 1e-300 of the 64 blocks is less than one block\n"
    )
    assert "tiny" not in [t["tenant"] for t in status(capsys, daemon.target)["tenants"]]


def test_a_missing_socket_is_one_line_and_exit_2(tmp_path) -> None:
    # A real `kvbudget` process: nothing but one line on stderr, no traceback, no call made.
    target = f"unix://{tmp_path}/nobody-here.sock"
    done = subprocess.run(
        [sys.executable, "-m", "kvbudget", "admin", "--target", target, "set-policy", "naive"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (
        f"kvbudget admin: error: --target {target}: no daemon socket at {tmp_path}/nobody-here.sock "
        "(is `kvbudget daemon` running?)\n"
    )


def test_a_socket_nobody_listens_on_is_unavailable_in_one_line(tmp_path, capsys) -> None:
    # A stale socket file (bound, never listening): the call is refused, UNAVAILABLE.
    path = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX) as stale:
        stale.bind(str(path))
        code, out, err = admin(capsys, "--target", f"unix://{path}", "status")
    assert (code, out) == (2, "")
    assert err.startswith(f"kvbudget admin: error: unix://{path}: UNAVAILABLE: ")
    assert err.count("\n") == 1


def test_a_malformed_target_is_refused_before_any_call(capsys) -> None:
    code, out, err = admin(capsys, "--target", "localhost", "status")
    assert code == 2
    assert err.startswith("kvbudget admin: error: --target 'localhost':")


def test_the_cli_lists_the_daemons_policies() -> None:
    from kvbudget.cli import cmd_admin
    from kvbudget.daemon.wire import convert

    assert cmd_admin.POLICY_NAMES == convert.POLICY_NAMES


async def test_status_says_why_the_waiting_requests_wait(tmp_path, capsys) -> None:
    with DaemonProcess(tmp_path, "--policy", "guaranteed") as process:
        async with EngineClient(process.target, "engine-0") as engine:
            # r1: 8 of the 64 blocks; r2: 512 + 512 tokens = 64 blocks > the 56 left: waits for room
            await engine.step(submits=[RequestSpec("r1", 100, 28), RequestSpec("r2", 512, 512)])
            code, out, err = await asyncio.to_thread(admin, capsys, "--target", process.target, "status")
            assert out.splitlines()[3].split() == [
                "requests", "1", "running,", "1", "waiting", "(1", "pool_full),", "0", "preemptions"]
            snapshot = await asyncio.to_thread(status, capsys, process.target)
            assert snapshot["requests"]["waiting_by_reason"] == {"pool_full": 1}


# ---------------------------------------------------------------- drain


def _health(target: str) -> int:
    with grpc.insecure_channel(target) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status


async def test_drain_refuses_new_submits_lets_running_ones_finish(tmp_path, capsys) -> None:
    with DaemonProcess(tmp_path) as process:
        target = process.target

        def run(*argv: str) -> tuple[int, str, str]:
            return admin(capsys, "--target", target, *argv)

        async with EngineClient(target, "engine-0") as engine:
            # 100 prompt + 28 new tokens = 128 tokens = 8 blocks of 16: admitted at once.
            [decision] = await engine.step(submits=[RequestSpec("r1", prompt_tokens=100, max_new_tokens=28)])
            assert decision.kind == DecisionKind.ADMIT

            code, out, err = await asyncio.to_thread(run, "drain")
            assert (code, out, err) == (0, "draining: 1 request still running\n", "")
            assert "admin change by unix: (admin): draining: 0 waiting requests rejected, 1 running" \
                in process.stderr()

            assert _health(target) == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await engine.step(submits=[RequestSpec("r2", prompt_tokens=10, max_new_tokens=10)])
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE

            snapshot = await asyncio.to_thread(status, capsys, target)
            assert snapshot["draining"] is True
            assert snapshot["requests"]["running"] == 1
            code, out, err = await asyncio.to_thread(run, "status")
            assert "DRAINING" in out.splitlines()[1]

            # r1 never finishes while we wait: --wait gives up and says so, exit 1.
            code, out, err = await asyncio.to_thread(run, "drain", "--wait", "--timeout", "0.3")
            assert (code, out) == (1, "draining: 1 request still running after 0.3 s\n")

            # A running request may still finish; then the drain is complete.
            await engine.step(finishes=["r1"])
            code, out, err = await asyncio.to_thread(run, "--json", "drain", "--wait", "--timeout", "30")
            assert code == 0, err
            assert json.loads(out) == {"target": target, "action": "drain", "draining": True, "running": 0}


# ---------------------------------------------------------------- roles over TCP



@pytest.fixture(scope="module")
def tcp(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("admin-tcp")
    tokens = workdir / "tokens.toml"
    tokens.write_text("".join(f'{role} = ["{token}"]\n' for role, token in TOKENS.items()))
    address = f"127.0.0.1:{free_port()}"
    with DaemonProcess(workdir, "--tokens-file", str(tokens), listen=(f"unix://{workdir}/kvbudget.sock", address)) as p:
        yield p, address


def test_an_observer_token_may_read_but_not_act(tcp, capsys) -> None:
    process, address = tcp
    before = status(capsys, process.target)["policy"]
    other = "naive" if before != "naive" else "guaranteed"

    assert status(capsys, address, "--token", TOKENS["observer"])["policy"] == before
    code, out, err = admin(capsys, "--target", address, "--token", TOKENS["observer"], "set-policy", other)
    assert (code, out) == (2, "")
    assert len(err.splitlines()) == 1
    assert err.startswith(f"kvbudget admin: error: {address}: PERMISSION_DENIED: authorization: role 'observer'")
    code, out, err = admin(capsys, "--target", address, "--token", TOKENS["observer"], "drain")
    assert code == 2 and "PERMISSION_DENIED" in err
    after = status(capsys, process.target)
    assert (after["policy"], after["draining"]) == (before, False)


def test_without_a_token_tcp_is_unauthenticated(tcp, capsys) -> None:
    _, address = tcp
    code, out, err = admin(capsys, "--target", address, "status")
    assert code == 2
    assert err == f"kvbudget admin: error: {address}: UNAUTHENTICATED: authorization: bearer token required\n"


def test_an_admin_token_may_act(tcp, capsys) -> None:
    process, address = tcp
    admin(capsys, "--target", process.target, "set-policy", "optimistic")
    code, out, err = admin(capsys, "--target", address, "--token", TOKENS["admin"], "set-policy", "naive")
    assert (code, out, err) == (0, "policy: optimistic -> naive\n", "")
    assert status(capsys, process.target)["policy"] == "naive"
