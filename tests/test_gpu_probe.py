"""The NVML probe: the real pynvml path as far as this machine allows, and a fake pynvml
at the module boundary for the success path. It never raises."""

from __future__ import annotations

import sys
import types

import pytest

from kvbudget.daemon.config.gpu import GPUProbe, probe_gpu


def test_real_nvml_path():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        # No driver here: the probe must say so, naming NVML's own error.
        probe = probe_gpu()
        assert probe == GPUProbe(
            present=False, note=f"no GPU: NVML unavailable ({type(exc).__name__}: {exc})"
        )
        return
    try:
        expected = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total
    finally:
        pynvml.nvmlShutdown()
    probe = probe_gpu()
    assert probe.present and probe.name
    assert probe.total_bytes == expected
    assert probe.used_bytes + probe.free_bytes <= probe.total_bytes


def test_without_nvidia_ml_py(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    probe = probe_gpu()
    assert not probe.present
    assert probe.note.startswith("no GPU: nvidia-ml-py (pynvml) not importable")


class FakeNVMLError(Exception):
    pass


def fake_pynvml(
    *,
    count=1,
    init_error=None,
    processes=None,
    processes_error=None,
    memory_error=None,
    name=b"NVIDIA H100 80GB HBM3",
):
    calls: list[str] = []
    module = types.ModuleType("pynvml")

    def nvmlInit():
        calls.append("init")
        if init_error:
            raise init_error

    def nvmlShutdown():
        calls.append("shutdown")

    def get_memory(handle):
        if memory_error:
            raise memory_error
        return types.SimpleNamespace(total=85_520_809_984, used=1_000_000_000, free=84_520_809_984)

    def get_processes(handle):
        if processes_error:
            raise processes_error
        return processes or []

    module.nvmlInit = nvmlInit
    module.nvmlShutdown = nvmlShutdown
    module.nvmlDeviceGetCount = lambda: count
    module.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    module.nvmlDeviceGetName = lambda handle: name
    module.nvmlDeviceGetMemoryInfo = get_memory
    module.nvmlDeviceGetComputeRunningProcesses = get_processes
    module.calls = calls
    return module


def test_success_path(monkeypatch):
    procs = [
        types.SimpleNamespace(pid=101, usedGpuMemory=2_000_000),
        types.SimpleNamespace(pid=202, usedGpuMemory=None),  # not available in a container
    ]
    nvml = fake_pynvml(processes=procs)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    probe = probe_gpu()
    assert probe.present
    assert probe.name == "NVIDIA H100 80GB HBM3"  # bytes decoded
    assert (probe.total_bytes, probe.used_bytes, probe.free_bytes) == (
        85_520_809_984,
        1_000_000_000,
        84_520_809_984,
    )
    assert [(p.pid, p.used_bytes) for p in probe.processes] == [(101, 2_000_000), (202, None)]
    assert nvml.calls == ["init", "shutdown"]
    assert probe.as_dict()["processes"][0] == {"pid": 101, "used_bytes": 2_000_000}


def test_str_name_and_unsupported_process_query(monkeypatch):
    nvml = fake_pynvml(name="NVIDIA A10", processes_error=FakeNVMLError("Not Supported"))
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    probe = probe_gpu()
    assert probe.present and probe.name == "NVIDIA A10" and probe.processes == ()


def test_init_failure(monkeypatch):
    nvml = fake_pynvml(init_error=FakeNVMLError("Driver Not Loaded"))
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    probe = probe_gpu()
    assert probe == GPUProbe(
        present=False, note="no GPU: NVML unavailable (FakeNVMLError: Driver Not Loaded)"
    )


def test_no_devices_and_index_out_of_range(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(count=0))
    assert probe_gpu().note == "no GPU: NVML sees no devices"
    nvml = fake_pynvml(count=2)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    probe = probe_gpu(5)
    assert not probe.present and probe.index == 5
    assert probe.note == "no GPU: GPU index 5 out of range (NVML sees 2)"
    assert nvml.calls == ["init", "shutdown"]


def test_query_failure_still_shuts_down(monkeypatch):
    nvml = fake_pynvml(memory_error=FakeNVMLError("GPU is lost"))
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    probe = probe_gpu()
    assert not probe.present
    assert probe.note == "no GPU: NVML query failed (FakeNVMLError: GPU is lost)"
    assert nvml.calls == ["init", "shutdown"]
