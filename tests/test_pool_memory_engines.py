"""Owned pool memory from an engine's point of view: a real daemon with a CPU pool, engines
that map it by the plan's handle and layout, what a crash leaves behind, and the engine
helpers' errors. The CUDA path is checked with a stand-in torch (no GPU here)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from daemon_harness import DaemonProcess
from kvbudget.client import EngineClient
from kvbudget.daemon.config.pool_memory import (
    SHM_DIR,
    PoolMemoryError,
    _allocate_cuda,
    allocate_pool_memory,
    map_shared_memory,
)
from kvbudget.daemon.core.records import RequestSpec

MIB = 2**20


def segment_path(name: str) -> str:
    return os.path.join(SHM_DIR, name)


# ------------------------------------------------------------- a real daemon, two engines
def test_two_engines_write_their_own_blocks_of_a_real_daemons_cpu_pool(tmp_path: Path) -> None:
    """The plan's handle and layout, used as docs/engine-integration.md says: the mapping is
    (num_blocks + 1) x bytes_per_block, every (block, layer) page lies inside it, and two
    engines writing their granted blocks never see each other's bytes. A second daemon on
    the same log is refused and leaves the first one's pool alone; SIGTERM unlinks it."""
    # gemma-3-27b: 7 groups of up to 10 layers, a 128 KiB page; 60 blocks = 59 usable + null.
    daemon = DaemonProcess(tmp_path, "--model", "gemma-3-27b", "--num-gpu-blocks", "60",
                           "--memory-mode", "owned", "--max-model-len", "4096")

    async def two_engines() -> list[tuple[object, list[list[int]]]]:
        """Both sessions hold their request while the other is admitted: distinct blocks."""
        clients = [EngineClient(daemon.target, f"engine-{n}", heartbeat=False) for n in "ab"]
        granted = []
        try:
            for client in clients:
                plan = await client.open()
                request = RequestSpec(f"{client.engine_id}-r", prompt_tokens=40, max_new_tokens=8)
                decisions = await client.step(submits=[request])
                (admit,) = [d for d in decisions if d.kind == "admit"]
                granted.append((plan, [list(ids) for ids in admit.new_block_ids]))
        finally:
            for client in clients:
                await client.close()
        return granted

    with daemon:
        (plan_a, blocks_a), (plan_b, blocks_b) = asyncio.run(two_engines())
        memory = plan_a.memory
        assert plan_a.HasField("memory") and memory.device == "cpu" and memory.shm_name
        assert plan_b.memory == memory
        page, layers = plan_a.page_size_bytes, plan_a.layers_per_group
        assert plan_a.bytes_per_block == page * layers
        assert memory.size_bytes == (plan_a.num_blocks + 1) * plan_a.bytes_per_block  # + the null block
        assert memory.offset_bytes == 0
        assert memory.layout.startswith(f"[num_blocks={plan_a.num_blocks + 1}][layers_per_group={layers}]")
        # The highest block id's last layer page ends exactly where the mapping does.
        assert (plan_a.num_blocks * layers + layers - 1) * page + page == memory.size_bytes

        def pages(blocks: list[list[int]]) -> list[int]:
            return [(b * layers + l) * page for group in blocks for b in group for l in range(layers)]

        starts = pages(blocks_a) + pages(blocks_b)
        assert len(set(starts)) == len(starts) and max(starts) + page <= memory.size_bytes
        assert min(starts) >= layers * page  # nothing in the null block

        shm = map_shared_memory(memory.shm_name)
        try:
            assert shm.size == memory.size_bytes
            for value, blocks in ((0xA1, blocks_a), (0xB2, blocks_b)):
                for start in pages(blocks):
                    shm.buf[start:start + page] = bytes([value]) * page
            for value, blocks in ((0xA1, blocks_a), (0xB2, blocks_b)):
                for start in pages(blocks):
                    assert set(shm.buf[start:start + page]) == {value}

            # A second daemon on the same decision log (its own socket) must fail fast.
            second = subprocess.run(
                [f"unix://{tmp_path / 'second.sock'}" if arg == daemon.target else arg for arg in daemon.args],
                capture_output=True, text=True, timeout=60, cwd=tmp_path,
            )
            assert second.returncode != 0 and "in use by another kvbudget daemon" in second.stderr
            assert set(shm.buf[pages(blocks_a)[0]:pages(blocks_a)[0] + page]) == {0xA1}
            assert os.path.exists(segment_path(memory.shm_name))
        finally:
            shm.close()
        assert daemon.stop() == 0
    assert not os.path.exists(segment_path(memory.shm_name))


def test_accounting_mode_hands_out_no_memory(tmp_path: Path) -> None:
    with DaemonProcess(tmp_path) as daemon:  # the harness runs --memory-mode accounting

        async def plan() -> object:
            async with EngineClient(daemon.target, "engine-a", heartbeat=False) as client:
                return client.plan

        assert not asyncio.run(plan()).HasField("memory")


# ------------------------------------------------------------- what a crash leaves behind
ALLOCATE_AND_WAIT = textwrap.dedent(
    """
    import sys
    from kvbudget.daemon.config.pool_memory import allocate_pool_memory
    pool = allocate_pool_memory(4 * 2**20, device="cpu")
    pool.tensor[:] = 7  # an engine wrote KV: the tmpfs pages are committed
    print(pool.shm_name, flush=True)
    sys.stdin.read()
    """
)


def start_allocating_process() -> tuple[subprocess.Popen, str]:
    # Its own session: killing the group kills its resource tracker too, as systemd's
    # SIGKILL of the cgroup or the OOM killer would; the tracker cannot clean up then.
    process = subprocess.Popen([sys.executable, "-c", ALLOCATE_AND_WAIT], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert process.stdout is not None
    name = process.stdout.readline().strip()
    assert name.startswith("kvbudget_"), name
    return process, name


def test_a_segment_left_by_a_killed_daemon_is_removed_by_the_next_one() -> None:
    process, stale = start_allocating_process()
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    try:
        assert os.path.exists(segment_path(stale))  # nobody unlinked it
        pool = allocate_pool_memory(MIB, device="cpu")
        assert pool is not None
        with pool:
            assert not os.path.exists(segment_path(stale))
            assert os.path.exists(segment_path(pool.shm_name))
    finally:
        if os.path.exists(segment_path(stale)):
            os.unlink(segment_path(stale))


def test_a_live_daemons_segment_is_left_alone() -> None:
    process, live = start_allocating_process()
    try:
        pool = allocate_pool_memory(MIB, device="cpu")
        assert pool is not None
        with pool:
            assert os.path.exists(segment_path(live))
    finally:
        process.communicate("")  # it closes its pool and exits
    assert not os.path.exists(segment_path(live))


# ------------------------------------------------------------- the engine helpers' errors
def test_mapping_without_a_name_or_a_gone_segment_says_why() -> None:
    with pytest.raises(PoolMemoryError, match="no shm_name"):
        map_shared_memory("")  # an accounting-only plan, or a GPU pool
    with pytest.raises(PoolMemoryError, match="no shared-memory segment kvbudget_1_00000000"):
        map_shared_memory("kvbudget_1_00000000")


# ------------------------------------------------------------- the CUDA path, torch stood in
class _OutOfMemory(RuntimeError):
    pass


def fake_torch(*, device_count: int = 1, handle: bytes = b"h" * 64) -> SimpleNamespace:
    """What `_allocate_cuda` uses of torch, with `_share_cuda_` returning `handle`."""
    storage = SimpleNamespace(_share_cuda_=lambda: (0, handle, MIB, 512, b"r", 0, b"e", False))
    tensor = SimpleNamespace(untyped_storage=lambda: storage)

    def empty(size: int, *, dtype: object, device: str) -> SimpleNamespace:
        index = int(device.split(":")[1])
        if index >= device_count:  # what CUDA says, as a bare RuntimeError
            raise RuntimeError("CUDA error: invalid device ordinal")
        return tensor

    cuda = SimpleNamespace(is_available=lambda: True, current_device=lambda: 0, device_count=lambda: device_count,
                           OutOfMemoryError=_OutOfMemory)
    device = lambda spec: SimpleNamespace(index=int(spec.split(":")[1]) if ":" in spec else None)  # noqa: E731
    return SimpleNamespace(cuda=cuda, device=device, empty=empty, uint8="uint8")


def test_cuda_pool_reports_its_handle_and_offset() -> None:
    pool = _allocate_cuda(fake_torch(), MIB, "cuda", "layout")
    assert pool.device == "cuda:0" and pool.cuda_ipc_handle == b"h" * 64 and pool.offset_bytes == 512


def test_cuda_device_that_is_not_there_is_a_clear_error() -> None:
    with pytest.raises(PoolMemoryError, match=r"cuda:3 .* 1 CUDA device"):
        _allocate_cuda(fake_torch(device_count=1), MIB, "cuda:3", "")


def test_cuda_handle_engines_cannot_open_is_refused_at_start() -> None:
    # With expandable segments torch shares a handle that is no cudaIpcMemHandle_t: the
    # daemon must say so at start, not hand it to every engine to fail on.
    with pytest.raises(PoolMemoryError, match="expandable"):
        _allocate_cuda(fake_torch(handle=b"x" * 90), MIB, "cuda:0", "")
