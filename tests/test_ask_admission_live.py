"""AskAdmission on a real daemon, over gRPC and through `kvbudget ask` in a subprocess:
the answer worked by hand, nothing changed by asking (log rows, snapshot), bad input
named.

The daemon is the harness's: llama-3.1-8b, one full-attention group, 16-token blocks, 64
usable blocks; guaranteed, so a request reserves its worst case at L = prompt + max.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import grpc
import pytest

from kvbudget.client import EngineClient
from kvbudget.client.observer import ObserverClient
from kvbudget.daemon.core.records import DecisionKind, RequestSpec
from kvbudget.v1 import observer_pb2

from daemon_harness import DaemonProcess

pytestmark = pytest.mark.slow


def ask(target: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvbudget", "ask", "--target", target, *argv], capture_output=True, text=True
    )


def test_a_full_pool_answers_the_wait_and_asking_changes_nothing(tmp_path) -> None:
    async def scenario(target: str, daemon: DaemonProcess) -> None:
        async with EngineClient(target, "engine-0") as engine:
            # Two requests of L = 100 + 412 = 512 reserve 32 blocks each: the pool's 64.
            decisions = await engine.step(submits=[RequestSpec("r1", 100, 412), RequestSpec("r2", 100, 412)])
            assert [d.kind for d in decisions] == [DecisionKind.ADMIT, DecisionKind.ADMIT]
            async with ObserverClient(target) as observer:
                rows = len(daemon.decision_rows())
                before = (await observer.snapshot())
                answer = await observer.ask_admission(observer_pb2.AskAdmissionRequest(prompt_tokens=16, max_new_tokens=16))
                # L 32: 2 blocks. Each holds its 100-token first chunk (7 blocks): 50 free,
                # none spare. Both give back 32 at their expected end, 412 steps from now.
                assert (answer.admit_now, answer.reason, answer.final) == (False, "budget_full", False)
                assert list(answer.blocks_needed) == [2] and answer.blocks_needed_total == 2
                assert (answer.blocks_free, answer.blocks_spare, answer.requests_ahead) == (50, 0, 0)
                assert (answer.wait_steps, answer.wait_s) == (412, pytest.approx(8.24))
                assert len(daemon.decision_rows()) == rows
                after = await observer.snapshot()
                assert (after.num_free_blocks, after.num_running, after.num_waiting) == (
                    before.num_free_blocks, before.num_running, before.num_waiting)
                assert after.decisions_by_kind == before.decisions_by_kind

                out = await asyncio.to_thread(ask, target, "--prompt-tokens", "16", "--max-tokens", "16",
                                              "--step-s", "0.05", "--json")
                assert out.returncode == 0, out.stderr
                fields = json.loads(out.stdout)
                assert (fields["reason"], fields["wait_steps"], fields["wait_s"]) == ("budget_full", 412, pytest.approx(20.6))
                line = await asyncio.to_thread(ask, target, "--prompt-tokens", "16", "--max-tokens", "16")
                assert line.stdout == (  # docs/routing.md's example
                    "waits (budget_full): about 412 decode steps, 8.24 s; needs 2 blocks; 50 free, 0 spare, "
                    "0 cached; 0 requests ahead needing 0\n")
                text = await asyncio.to_thread(ask, target, "--prompt-tokens", "4000")
                assert text.returncode == 0, text.stderr
                assert text.stdout.startswith("not here: prompt_too_long (max_model_len 2048);")
                assert len(daemon.decision_rows()) == rows

    with DaemonProcess(tmp_path, "--policy", "guaranteed") as daemon:
        asyncio.run(scenario(daemon.target, daemon))


def test_an_idle_pool_admits_now_and_bad_input_is_named(tmp_path) -> None:
    with DaemonProcess(tmp_path) as daemon:
        out = ask(daemon.target, "--prompt-tokens", "100", "--max-tokens", "28")
        assert (out.returncode, out.stderr) == (0, "")
        # 128 tokens under optimistic: the 100-token prompt's 7 blocks, of 64 free.
        assert out.stdout == "admitted now; needs 7 blocks; 64 free, 64 spare, 0 cached; 0 requests ahead needing 0\n"

        # docs/routing.md's buf curl example (JSON leaves out zeros and false).
        from test_server_buf import _buf_command, _curl

        answer = json.loads(_curl(_buf_command(), daemon, "-d", '{"prompt_tokens": 100, "max_new_tokens": 28}',
                                  "http://localhost/kvbudget.v1.ObserverService/AskAdmission"))
        assert answer == {"admitNow": True, "reason": "fits", "blocksNeeded": [7], "blocksNeededTotal": 7,
                          "blocksFree": 64, "blocksSpare": 64}

        for argv, flag in [(("--prompt-tokens", "0"), "--prompt-tokens"),
                           (("--prompt-tokens", "5", "--priority", str(2**31)), "--priority"),
                           (("--prompt-tokens", "5", "--step-s", "nan"), "--step-s")]:
            bad = ask(daemon.target, *argv)
            assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
            assert flag in bad.stderr and "Traceback" not in bad.stderr

        channel = grpc.insecure_channel(daemon.target)
        from kvbudget.v1 import observer_pb2_grpc

        stub = observer_pb2_grpc.ObserverServiceStub(channel)
        for request, field in [
            (observer_pb2.AskAdmissionRequest(), "prompt_tokens"),
            (observer_pb2.AskAdmissionRequest(prompt_tokens=10, step_s=-1), "step_s"),
            (observer_pb2.AskAdmissionRequest(prompt_tokens=20, prefix_hashes=[1, 2]), "prefix_hashes"),
        ]:
            with pytest.raises(grpc.RpcError) as info:
                stub.AskAdmission(request, timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert info.value.details().startswith(f"{field}:")
        channel.close()
