"""Owned pool memory: a CPU pool in POSIX shared memory that another process maps by name
(for real, here), and the CUDA IPC path (only on a GPU host)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap

import pytest
import torch

from kvbudget.daemon.config.pool_memory import (
    SHM_DIR,
    PoolMemoryError,
    allocate_pool_memory,
    page_layout,
)

MIB = 2**20


def run_python(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_cpu_pool_is_shared_memory_another_process_maps_by_name() -> None:
    size = 64 * MIB
    pool = allocate_pool_memory(size, device="cpu", layout=page_layout(4, 2, 8 * MIB))
    assert pool is not None
    try:
        assert pool.device == "cpu" and not pool.is_cuda
        assert pool.size_bytes == size and pool.cuda_ipc_handle == b""
        assert pool.tensor.dtype == torch.uint8 and pool.tensor.numel() == size
        assert pool.layout.startswith("[num_blocks=4][layers_per_group=2][page_size_bytes=8388608]")
        # Engines of the daemon's group map it too (Python alone would create it 0600).
        assert stat.S_IMODE(os.stat(os.path.join(SHM_DIR, pool.shm_name)).st_mode) == 0o660
        pool.tensor[:4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)
        pool.tensor[-2:] = torch.tensor([254, 255], dtype=torch.uint8)
        # The engine's side: a separate process attaches by name, reads what the daemon
        # wrote, and writes where the daemon will look.
        out = run_python(
            f"""
            from kvbudget.daemon.config.pool_memory import map_shared_memory
            shm = map_shared_memory({pool.shm_name!r})
            print(list(shm.buf[:4]), list(shm.buf[{size} - 2:{size}]), shm.size >= {size})
            shm.buf[100] = 42
            shm.close()
            """
        )
        assert out == "[1, 2, 3, 4] [254, 255] True"
        assert int(pool.tensor[100]) == 42
        # The engine exiting must not have unlinked the daemon's pool.
        assert os.path.exists(os.path.join(SHM_DIR, pool.shm_name))
    finally:
        pool.close()
    assert not os.path.exists(os.path.join(SHM_DIR, pool.shm_name))
    pool.close()  # idempotent


def test_a_large_pool_is_not_touched_at_allocation() -> None:
    size = 1024 * MIB
    stats = os.statvfs(SHM_DIR)
    if stats.f_bavail * stats.f_frsize < 2 * size:
        pytest.skip(f"{SHM_DIR} has less than 2 GiB free")
    pool = allocate_pool_memory(size, device="cpu")
    assert pool is not None
    try:
        # st_blocks counts pages actually backed: none were written, so none exist.
        assert os.stat(os.path.join(SHM_DIR, pool.shm_name)).st_blocks == 0
        assert pool.tensor.numel() == size
    finally:
        pool.close()


def test_a_pool_larger_than_dev_shm_is_refused_up_front() -> None:
    stats = os.statvfs(SHM_DIR)
    too_big = stats.f_bavail * stats.f_frsize + 1024 * MIB
    with pytest.raises(PoolMemoryError, match=f"does not fit in {SHM_DIR}"):
        allocate_pool_memory(too_big, device="cpu")


def test_without_torch_it_is_accounting_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    assert allocate_pool_memory(MIB, device="auto") is None


def test_misuse() -> None:
    with pytest.raises(ValueError, match="size_bytes"):
        allocate_pool_memory(0)
    with pytest.raises(PoolMemoryError, match="device must be"):
        allocate_pool_memory(MIB, device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(PoolMemoryError, match="sees no CUDA device"):
            allocate_pool_memory(MIB, device="cuda:0")


def test_auto_picks_cpu_without_a_gpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: auto picks it (covered by the CUDA test)")
    pool = allocate_pool_memory(MIB, device="auto")
    assert pool is not None
    with pool:
        assert pool.device == "cpu" and pool.shm_name


@pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device (torch.cuda.is_available() is False): the GPU pool and its CUDA IPC "
    "handle can only be tested on a GPU host",
)
def test_cuda_pool_is_mapped_by_another_process_through_its_ipc_handle() -> None:
    size = 64 * MIB
    pool = allocate_pool_memory(size, device="cuda:0")
    assert pool is not None
    try:
        assert pool.is_cuda and pool.shm_name == ""
        assert len(pool.cuda_ipc_handle) == 64  # cudaIpcMemHandle_t
        pool.tensor[:4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8, device=pool.device)
        torch.cuda.synchronize()
        out = run_python(
            f"""
            import torch
            from kvbudget.daemon.config.pool_memory import map_cuda_pool
            pool = map_cuda_pool({pool.cuda_ipc_handle!r}, {pool.offset_bytes}, {size}, 0)
            print(pool[:4].tolist(), pool.numel())
            pool[100] = 42
            torch.cuda.synchronize()
            """
        )
        assert out == f"[1, 2, 3, 4] {size}"
        assert int(pool.tensor[100]) == 42
    finally:
        pool.close()


def test_a_pool_sized_from_a_gpu_goes_to_that_gpu_or_start_up_says_why(tmp_path) -> None:
    """device = auto, NVML finds GPU 0, but this torch has no CUDA (a CPU-only wheel): the
    pool was sized from the GPU's memory, so it must not quietly land in /dev/shm at that
    size; start-up fails naming the device and the way out."""
    from kvbudget.daemon.config.loading import load_config
    from kvbudget.daemon.config.gpu import GPUProbe
    from kvbudget.daemon.config.pool_setup import setup_pool
    from kvbudget.daemon.server.startup import StartupError, allocate_memory

    config = load_config(None, {"model": "llama-3.1-8b", "num_gpu_blocks": 9, "memory_mode": "owned",
                                "device": "auto", "db_path": str(tmp_path / "d.db")})
    gpu = GPUProbe(present=True, index=0)
    setup = setup_pool(config, None)
    with pytest.raises(StartupError) as info:
        allocate_memory(config, setup, gpu)
    assert "cuda:0" in str(info.value) and "--memory-mode accounting" in str(info.value)
    # Without a GPU, the same config puts the pool in host shared memory.
    memory = allocate_memory(config, setup, GPUProbe(present=False, index=0))
    try:
        assert memory is not None and memory.device == "cpu" and memory.shm_name
    finally:
        memory.close()
