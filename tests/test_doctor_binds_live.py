"""`kvbudget doctor`'s verdict names the limit that binds, with the figures that show it
(issue 32, point 2): a real daemon staged in each state, the real command's human report.

The daemon of test_doctor_live: llama-3.1-8b, 999 usable blocks of 16 tokens, max_model_len
12,000 tokens. Optimistic holds a prompt's blocks at admission and promises nothing more;
its watermark keeps int(0.01 x 999) = 9 blocks free while anything runs.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import grpc
import pytest
from test_doctor_live import engine, kinds, running_daemon, wait_serving

from kvbudget.daemon.core.records import DecisionKind, RequestSpec

pytestmark = pytest.mark.slow

ADMIT, QUEUE = DecisionKind.ADMIT, DecisionKind.QUEUE


async def report(target: str) -> tuple[str, dict]:
    """The verdict line of the human report and the --json report, from one state."""
    lines = []
    for extra in ((), ("--json",)):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kvbudget", "doctor", "--target", target, "--samples", "2",
            "--interval", "0.2", *extra, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
        assert proc.returncode in (0, 1), err.decode()
        lines.append(out.decode())
    (verdict,) = [line for line in lines[0].splitlines() if line.startswith("verdict:")]
    return verdict, json.loads(lines[1])


async def staged(tmp: Path, policy: str, *steps: list[RequestSpec], quota: float = 0.0):
    """The verdict line and JSON report after `steps` (one engine step each)."""
    with running_daemon(tmp, policy) as (target, proc):
        await asyncio.to_thread(wait_serving, target, proc)
        if quota:
            from kvbudget.v1 import admin_pb2, admin_pb2_grpc

            async with grpc.aio.insecure_channel(target) as channel:
                await admin_pb2_grpc.AdminServiceStub(channel).SetTenantQuota(
                    admin_pb2.SetTenantQuotaRequest(tenant="team-a", max_share=quota))
        async with engine(target) as client:
            decided = [kinds(await client.step(submits=submits)) for submits in steps]
            verdict, data = await report(target)
    return decided, verdict, data


def spec(name: str, prompt: int, new: int | None = 1, tenant: str = "") -> RequestSpec:
    """None: no max new tokens (naive charges max_model_len whatever it is)."""
    if new is None:
        return RequestSpec(name, prompt_tokens=prompt, tenant=tenant)
    return RequestSpec(name, prompt_tokens=prompt, max_new_tokens=new, tenant=tenant)


async def test_nothing_binds_a_pool_with_room(tmp_path: Path) -> None:
    # 4 prompts of 800 tokens: 4 x 50 = 200 of 999 blocks held, nothing waits.
    decided, verdict, data = await staged(tmp_path, "optimistic", [spec(f"r{i}", 800) for i in range(4)])
    assert decided == [[(f"r{i}", ADMIT) for i in range(4)]]
    assert verdict == "verdict: healthy: nothing binds: no queue"
    assert (data["binds"], data["knob"]) == ("nothing", "")


async def test_the_pool_binds_when_its_blocks_are_held(tmp_path: Path) -> None:
    # a 8,000 tokens = 500 blocks, b 6,400 = 400: 900 of 999 held (90.1% >= the 90% bar),
    # 99 free; c, 1,600 tokens = 100 blocks, needs more than there are free.
    decided, verdict, data = await staged(
        tmp_path, "optimistic", [spec("a", 8000), spec("b", 6400)], [spec("c", 1600)])
    assert decided == [[("a", ADMIT), ("b", ADMIT)], [("c", QUEUE)]]
    assert verdict == ("verdict: pool-bound: the pool binds: 1 request waiting (1 for free blocks); "
                       "900 of 999 blocks held now, 90% on the mean; 99 free")
    assert data["binds"] == "pool" and data["knob"].startswith("the pool is really full: give it more memory")


async def test_the_watermark_binds_when_free_blocks_are_kept_back(tmp_path: Path) -> None:
    # The same 900 held; c, 1,456 tokens = 91 blocks, fits the 99 free but would leave 8,
    # under the 9 the watermark keeps free.
    decided, verdict, data = await staged(
        tmp_path, "optimistic", [spec("a", 8000), spec("b", 6400)], [spec("c", 1456)])
    assert decided == [[("a", ADMIT), ("b", ADMIT)], [("c", QUEUE)]]
    assert verdict == ("verdict: pool-bound: the watermark binds: 1 request waiting (1 for the watermark); "
                       "99 free blocks not promised, and admitting the next request would take them below "
                       "the share the watermark keeps free; 900 of 999 blocks held")
    assert data["binds"] == "watermark" and "lower [admission] watermark" in data["knob"]


async def test_promises_bind_when_free_blocks_are_owed(tmp_path: Path) -> None:
    # guaranteed promises prompt + max new tokens and holds the prompt now:
    #   a: 8,000 + 4,000 = 12,000 -> 750 promised, 500 held; b: 3,200 + 400 -> 225, 200 held.
    # 700 held + 275 promised = 975 of 999 (97.6%); 299 free; c needs cdiv(1,000, 16) = 63
    # > 299 - 275 = 24 not promised.
    decided, verdict, data = await staged(
        tmp_path, "guaranteed", [spec("a", 8000, 4000), spec("b", 3200, 400)], [spec("c", 800, 200)])
    assert decided == [[("a", ADMIT), ("b", ADMIT)], [("c", QUEUE)]]
    assert verdict == ("verdict: budget-bound: promises bind: 1 request waiting (1 for blocks promised to "
                       "running requests); 700 held + 275 promised to running requests = 975 of 999 blocks "
                       "(98% on the mean, 70% held); 299 free, 275 of them promised")
    assert data["binds"] == "promises" and "275 reserved" in data["knob"]


async def test_a_quota_binds_when_its_tenant_has_used_its_share(tmp_path: Path) -> None:
    # team-a: 0.5 x 999 = 499 blocks; a and b hold 200 each, c needs 200 more > 99 left.
    decided, verdict, data = await staged(
        tmp_path, "optimistic", [spec(n, 3200, 100, "team-a") for n in "abc"], quota=0.5)
    assert decided == [[("a", ADMIT), ("b", ADMIT), ("c", QUEUE)]]
    assert verdict == ("verdict: budget-bound: a tenant quota binds: 1 request waiting (1 for a tenant quota); "
                       "team-a has 400 of its 499-block quota (400 held, 0 promised), 1 waiting; "
                       "599 of the pool's 999 blocks free")
    assert data["binds"] == "quota" and data["knob"].startswith("tenant(s) team-a at quota")


async def test_promises_bind_a_stuck_queue_on_a_free_pool(tmp_path: Path) -> None:
    # naive charges max_model_len: 750 blocks each. a holds 20 (320 tokens) and is owed 730;
    # b needs 750 > 999 - 20 - 730 = 249 not promised.
    decided, verdict, data = await staged(tmp_path, "naive", [spec("a", 320, None)], [spec("b", 320, None)])
    assert decided == [[("a", ADMIT)], [("b", QUEUE)]]
    assert verdict == ("verdict: stuck queue (formula drift): promises bind: 1 request waiting (1 for blocks "
                       "promised to running requests); nothing admitted through the window with 98% of the "
                       "pool free: 730 blocks promised for 20 held (75% held or promised)")
    assert data["binds"] == "promises" and "lower max new tokens" in data["knob"]
