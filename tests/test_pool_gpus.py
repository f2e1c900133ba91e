"""NVML across the GPUs a pool spans: an engine at tensor x pipeline parallel holds its KV on
tp x pp GPUs, from the configured device on, in CUDA_VISIBLE_DEVICES order (as vLLM places
its ranks). The daemon reads each: in its snapshot (`gpus`), in its metrics
(`kvbudget_pool_gpu_memory_bytes{gpu, state}`, `gpu` NVML's id) and in doctor's "gpu
memory" line, which judges every GPU and names the one that leaks.

NVML is the stand-in below, the module `import pynvml` finds (the probe's own seam): 8 GPUs
of 80 GiB, GPU i (NVML's numbering) with i + 1 GiB in use. The real NVML path is
test_gpu_probe.py's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import types
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvbudget.cli.doctor_checks import check_gpu_memory
from kvbudget.cli.doctor_samples import GpuSample, PoolSample, Status, Thresholds
from kvbudget.client import ObserverClient
from kvbudget.daemon.config.gpu import GPUProbe, pool_gpus, probe_gpu
from kvbudget.daemon.config.loading import load_config
from kvbudget.daemon.config.pool_setup import PoolSetupError, setup_pool
from kvbudget.daemon.server.metrics import Metrics
from kvbudget.daemon.wire.convert import gpus_to_proto

from daemon_harness import DaemonProcess, free_port, wait_until
from test_metrics import snapshot, value

GiB = 1 << 30
FAKE_NVML = '''"""A stand-in NVML: 8 GPUs of 80 GiB; GPU i has i + 1 GiB in use."""
GiB = 1 << 30


class _Memory:
    def __init__(self, i):
        self.total, self.used = 80 * GiB, (i + 1) * GiB
        self.free = self.total - self.used


def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return 8
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetName(handle): return f"Fake GPU {handle}"
def nvmlDeviceGetMemoryInfo(handle): return _Memory(handle)
def nvmlDeviceGetComputeRunningProcesses(handle): return []
'''


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = types.ModuleType("pynvml")
    exec(FAKE_NVML, module.__dict__)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module


def _figures(probe) -> list[tuple[int, str, str, int]]:
    return [(g.index, g.nvml_device, g.name, g.used_bytes) for g in pool_gpus(probe)]


def test_each_gpu_of_the_pool_is_read_in_cuda_order(nvml) -> None:
    probe = probe_gpu(0, visible="4,5,6,7", count=4)
    assert _figures(probe) == [(0, "4", "Fake GPU 4", 5 * GiB), (1, "5", "Fake GPU 5", 6 * GiB),
                               (2, "6", "Fake GPU 6", 7 * GiB), (3, "7", "Fake GPU 7", 8 * GiB)]
    # the probe itself is the first GPU's, as one GPU's was: sizing and the old fields read it
    assert (probe.nvml_device, probe.used_bytes, probe.gpus[0].gpus) == ("4", 5 * GiB, ())
    one = probe_gpu(1, visible="4,5,6,7")
    assert one.gpus == () and _figures(one) == [(1, "5", "Fake GPU 5", 6 * GiB)]


def test_gpus_past_the_visible_list_are_absent_naming_it(nvml) -> None:
    probe = probe_gpu(2, visible="4,5,6,7", count=4)
    assert [(g.present, g.note) for g in probe.gpus] == [
        (True, "NVML: 8 device(s), cuda:2 is NVML's 6, CUDA_VISIBLE_DEVICES=4,5,6,7"),
        (True, "NVML: 8 device(s), cuda:3 is NVML's 7, CUDA_VISIBLE_DEVICES=4,5,6,7"),
        (False, "no GPU: cuda:4 is not in CUDA_VISIBLE_DEVICES='4,5,6,7'"),
        (False, "no GPU: cuda:5 is not in CUDA_VISIBLE_DEVICES='4,5,6,7'"),
    ]


def test_without_nvml_the_pool_has_one_absent_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    probe = probe_gpu(0, count=4)
    assert len(pool_gpus(probe)) == 1 and not probe.present
    assert probe.note.startswith("no GPU: nvidia-ml-py (pynvml) not importable")


def test_the_snapshot_carries_each_gpu_the_pool_on_the_first(nvml) -> None:
    states = gpus_to_proto(probe_gpu(0, visible="4,5", count=2), pool_bytes=3 * GiB)
    assert [(s.index, s.nvml_device, s.used_bytes, s.pool_bytes) for s in states] == [
        (0, "4", 5 * GiB, 3 * GiB), (1, "5", 6 * GiB, 0)]
    assert gpus_to_proto(None) == []  # device=cpu: no GPU is read


def test_metrics_per_gpu_by_nvml_id_and_the_old_series_unchanged(nvml) -> None:
    metrics = Metrics()
    metrics.update(snapshot(), probe_gpu(0, visible="4,5,6,7", count=4))
    assert value(metrics, "kvbudget_pool_gpu_memory_bytes", gpu="6", state="used") == 7 * GiB
    assert value(metrics, "kvbudget_pool_gpu_memory_bytes", gpu="7", state="free") == 72 * GiB
    assert value(metrics, "kvbudget_gpu_memory_bytes", state="used") == 5 * GiB  # the first GPU's, as before
    # a GPU that can no longer be read loses its series rather than keep its last figures
    metrics.update(snapshot(), probe_gpu(0, visible="4,5,6", count=4))
    assert value(metrics, "kvbudget_pool_gpu_memory_bytes", gpu="6", state="used") == 7 * GiB
    assert value(metrics, "kvbudget_pool_gpu_memory_bytes", gpu="7", state="used") is None


def _gpu(index: int, total_bytes: int) -> GPUProbe:
    return GPUProbe(present=True, index=index, total_bytes=total_bytes, nvml_device=str(4 + index))


def _tp4_config(tmp_path: Path):
    path = tmp_path / "kvbudget.toml"
    path.write_text('[model]\nname = "llama-3.1-70b"\n[pool]\nmemory_mode = "accounting"\n'
                    "[parallel]\ntensor_parallel_size = 4\n")
    return load_config(path)  # (no memory size: the GPUs' memory, read through NVML)


def test_a_pool_over_gpus_is_sized_by_the_smallest(tmp_path: Path) -> None:
    # tp 4: 1,310,720 B per block on each GPU; 35,276,853,248 B of estimated weights on each
    # (141,107,412,992 / 4). The smallest GPU, 84e9 B: 84e9 x 0.9 = 75.6e9 B, minus the
    # weights = 40,323,146,752 B, // 1,310,720 = 30,764 blocks on every GPU (vLLM's minimum).
    h100 = 85_520_809_984
    gpus = (_gpu(0, h100), _gpu(1, h100), _gpu(2, 84_000_000_000), _gpu(3, h100))
    setup = setup_pool(_tp4_config(tmp_path), dataclasses.replace(gpus[0], gpus=gpus))
    assert (setup.sizing.gpu_total_bytes, setup.sizing.weights_bytes) == (84_000_000_000, 35_276_853_248)
    assert setup.num_blocks == 30_764


def test_doctor_config_sizes_by_the_smallest_gpu_the_daemon_reports(tmp_path: Path) -> None:
    from kvbudget.cli.doctor_config import config_expectation

    _tp4_config(tmp_path)  # (writes the file)
    totals = (85_520_809_984, 85_520_809_984, 84_000_000_000, 85_520_809_984)
    gpus = tuple(GpuSample(present=True, total_bytes=t) for t in totals)
    last = PoolSample(time_s=0.0, policy="optimistic", num_blocks=30_763, free=30_763, held=0, reserved=0,
                      running=0, waiting=0, preemptions=0, admits=0, gpu=gpus[0], gpus=gpus)
    expected = config_expectation(str(tmp_path / "kvbudget.toml"), last)
    # as the daemon sized it above: 30,764 blocks of 1,310,720 B, 30,763 usable
    assert expected.max_pool_bytes == 30_763 * 1_310_720
    assert expected.explanation.startswith("84000000000 B x gpu_memory_utilization 0.9")


def test_a_gpu_nvml_cannot_read_stops_the_sizing_naming_it(tmp_path: Path, nvml) -> None:
    with pytest.raises(PoolSetupError) as caught:
        setup_pool(_tp4_config(tmp_path), probe_gpu(0, visible="4,5,6", count=4))
    assert str(caught.value) == ("no GPU: cuda:3 is not in CUDA_VISIBLE_DEVICES='4,5,6'; size the pool with "
                                 "num_gpu_blocks, kv_cache_memory_bytes or gpu_memory_bytes")


def _samples(used_by_gpu: list[list[int]]) -> list[PoolSample]:
    """One sample per time, each with these GPUs' used bytes (the first is also `gpu`)."""
    samples = []
    for t, used in enumerate(zip(*used_by_gpu)):
        gpus = tuple(GpuSample(present=True, total_bytes=80 * GiB, used_bytes=u, label=f"cuda:{i} (NVML {4 + i})")
                     for i, u in enumerate(used))
        samples.append(PoolSample(time_s=float(t), policy="optimistic", num_blocks=100, free=100, held=0,
                                  reserved=0, running=0, waiting=0, preemptions=0, admits=0, gpu=gpus[0], gpus=gpus))
    return samples


def test_doctor_judges_each_gpu_and_names_the_one_that_grows() -> None:
    # threshold: max(256 MiB, 1 % of 80 GiB = 819 MiB) = 819 MiB; GPU cuda:1 rises 1 GiB
    finding = check_gpu_memory(_samples([[5 * GiB, 5 * GiB], [6 * GiB, 7 * GiB]]), Thresholds())
    assert finding.status is Status.PROBLEM
    assert finding.summary == ("cuda:1 (NVML 5): GPU memory rose 1024 MiB in the window while the pool stayed "
                               "0 MiB: this host's processes allocate outside the pool (leak?)")
    assert [(g["gpu"], g["rise_bytes"]) for g in finding.data["gpus"]] == [("cuda:0 (NVML 4)", 0),
                                                                          ("cuda:1 (NVML 5)", GiB)]
    flat = check_gpu_memory(_samples([[5 * GiB, 5 * GiB], [6 * GiB, 6 * GiB + 100 * 2**20]]), Thresholds())
    assert (flat.status, flat.summary) == (
        Status.OK, "GPU memory flat on the pool's 2 GPUs (cuda:0 (NVML 4) +0 MiB, cuda:1 (NVML 5) +100 MiB over the "
        "window)")


def _estimate_on(tmp_path: Path, visible: str) -> subprocess.CompletedProcess[str]:
    shadow = tmp_path / "nvml"
    shadow.mkdir(exist_ok=True)
    (shadow / "pynvml.py").write_text(FAKE_NVML)
    env = dict(os.environ, PYTHONPATH=str(shadow), CUDA_VISIBLE_DEVICES=visible)
    return subprocess.run([sys.executable, "-m", "kvbudget", "estimate", "--model", "llama-3.1-70b",
                           "--tensor-parallel-size", "4", "--json"], capture_output=True, text=True, timeout=120,
                          env=env)


def test_estimate_sizes_by_the_engines_gpus_as_the_daemon(tmp_path: Path) -> None:
    # 80 GiB x 0.9 = 77,309,411,328 B, minus 35,276,853,248 B of weights per GPU =
    # 42,032,558,080 B, // 1,310,720 B per block = 32,068 blocks
    out = json.loads(_estimate_on(tmp_path, "4,5,6,7").stdout)
    assert (out["num_blocks"], out["sizing"]["gpu_total_bytes"]) == (32_068, 80 * GiB)
    short = _estimate_on(tmp_path, "4,5,6")
    assert short.returncode != 0 and short.stderr.splitlines() == [
        "kvbudget estimate: error: no memory source: give --gpu-memory-bytes, --kv-cache-memory-bytes or "
        "--num-gpu-blocks (no GPU: cuda:3 is not in CUDA_VISIBLE_DEVICES='4,5,6')"]


def _scraped(port: int, name: str) -> dict[tuple[str, str], float]:
    """The daemon's /metrics samples of `name`, by (gpu, state)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    return {(sample.labels["gpu"], sample.labels["state"]): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples if sample.name == name}


@pytest.mark.slow
async def test_a_daemon_at_tp2_pp2_reports_its_four_gpus(tmp_path: Path) -> None:
    shadow = tmp_path / "nvml"
    shadow.mkdir()
    (shadow / "pynvml.py").write_text(FAKE_NVML)
    port = free_port()
    args = ("--device", "cuda:0", "--tensor-parallel-size", "2", "--pipeline-parallel-size", "2",
            "--metrics-address", f"127.0.0.1:{port}")
    env = {"PYTHONPATH": str(shadow), "CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    with DaemonProcess(tmp_path, *args, env=env) as daemon:
        async with ObserverClient(daemon.target) as observer:
            s = await observer.snapshot()
        per_gpu = wait_until(lambda: _scraped(port, "kvbudget_pool_gpu_memory_bytes"))  # (after the first tick)
        doctor = [sys.executable, "-m", "kvbudget", "doctor", "--target", daemon.target, "--samples", "1",
                  "--interval", "0"]
        text = subprocess.run(doctor, capture_output=True, text=True, timeout=120, env=daemon.env)
        report = json.loads(subprocess.run([*doctor, "--json"], capture_output=True, text=True, timeout=120,
                                           env=daemon.env).stdout)
    assert [(g.index, g.nvml_device, g.name, g.used_bytes) for g in s.gpus] == [
        (0, "4", "Fake GPU 4", 5 * GiB), (1, "5", "Fake GPU 5", 6 * GiB),
        (2, "6", "Fake GPU 6", 7 * GiB), (3, "7", "Fake GPU 7", 8 * GiB)]
    assert (s.gpu.nvml_device, s.gpu.used_bytes) == ("4", 5 * GiB)  # the first, as before
    assert per_gpu[("7", "used")] == 8 * GiB and per_gpu[("4", "total")] == 80 * GiB and len(per_gpu) == 12
    [line] = [line for line in text.stdout.splitlines() if "gpu memory" in line]
    assert line.split(None, 3)[3] == ("GPU memory flat on the pool's 4 GPUs (cuda:0 (NVML 4) +0 MiB, cuda:1 (NVML 5) "
                                      "+0 MiB, cuda:2 (NVML 6) +0 MiB, cuda:3 (NVML 7) +0 MiB over the window)")
    [memory] = [f for f in report["findings"] if f["check"] == "gpu memory"]
    assert [(g["gpu"], g["used_bytes_last"]) for g in memory["data"]["gpus"]] == [
        ("cuda:0 (NVML 4)", 5 * GiB), ("cuda:1 (NVML 5)", 6 * GiB), ("cuda:2 (NVML 6)", 7 * GiB),
        ("cuda:3 (NVML 7)", 8 * GiB)]
