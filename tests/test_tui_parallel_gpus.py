"""The dashboard of a tensor-parallel pool (Textual's Pilot, the recorded stream): the
physical panel has a line for each GPU the pool spans, and the verdict stays on screen."""

from __future__ import annotations

import pytest
from test_tui_app import STREAM, played, recorded_app
from tui_helpers import screen_text

from kvbudget.tui.source import RecordedSource
from kvbudget.v1 import common_pb2, observer_pb2

GIB = 2**30


def on_gpu(index: int, nvml_device: str, used_gib: float) -> common_pb2.GpuState:
    gpu = common_pb2.GpuState()
    gpu.CopyFrom(STREAM[-1].snapshot.gpu)  # an H200: 141 GiB, the pool's 80 GiB on the first
    gpu.index, gpu.nvml_device, gpu.used_bytes = index, nvml_device, int(used_gib * GIB)
    if index:
        gpu.pool_bytes = 0
    return gpu


def across_gpus(count: int) -> list[observer_pb2.WatchResponse]:
    """The recorded stream, its last snapshot from a pool on the host's GPUs 4, 5, ...
    (the first as recorded, 102 GiB used; each next one 10 GiB less)."""
    stream = [observer_pb2.WatchResponse.FromString(r.SerializeToString()) for r in STREAM]
    last = stream[-1].snapshot
    gpus = [on_gpu(i, str(4 + i), 102.0 - 10 * i) for i in range(count)]
    last.gpu.CopyFrom(gpus[0])
    last.gpus.extend(gpus)
    return stream


@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
async def test_each_gpu_of_a_tensor_parallel_pool_has_its_line(size):
    # 92 of 141 GiB = 65.2% -> "65%"; at 80x24 the names are left out (compact).
    app = recorded_app(source=RecordedSource(across_gpus(2)))
    async with app.run_test(size=size) as pilot:
        await played(pilot)
        text = screen_text(app)
    assert "GPU4  102.0 GiB of 141.0 GiB 72%" in text
    assert "GPU5  92.0 GiB of 141.0 GiB 65%" in text
    assert "⇒ memory growing outside" in text  # the verdict, above them


async def test_eight_gpus_leave_the_verdict_on_screen():
    app = recorded_app(source=RecordedSource(across_gpus(8)))
    async with app.run_test(size=(120, 40)) as pilot:
        await played(pilot)
        text = screen_text(app)
    assert "⇒ memory growing outside" in text
    assert "GPU4  102.0 GiB of 141.0 GiB 72%" in text
