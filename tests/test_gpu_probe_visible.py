"""The NVML probe under CUDA_VISIBLE_DEVICES: `cuda:N` is the Nth GPU of the list, which
NVML (numbering every GPU of the host) knows by the list's entry, as CUDA does; one daemon
per engine on an 8-GPU host (kvbudget@.service) reads its own GPU, not GPU 0."""

from __future__ import annotations

import sys

from test_gpu_probe import fake_pynvml

from kvbudget.daemon.config.gpu import probe_gpu


def nvml_with_handles(monkeypatch, count=8):
    nvml = fake_pynvml(count=count)
    nvml.nvmlDeviceGetHandleByUUID = lambda uuid: ("uuid", uuid)
    opened = []
    by_index = nvml.nvmlDeviceGetHandleByIndex
    nvml.nvmlDeviceGetHandleByIndex = lambda i: opened.append(i) or by_index(i)
    nvml.nvmlDeviceGetName = lambda handle: f"GPU {handle[1]}"  # says which handle was read
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    return opened


def test_cuda_index_is_the_nth_visible_gpu(monkeypatch):
    opened = nvml_with_handles(monkeypatch)
    probe = probe_gpu(0, visible="4,5,6,7")
    assert probe.present and probe.name == "GPU 4" and opened == [4]
    assert probe.index == 0  # the index stays CUDA's, as configured
    assert probe.note == "NVML: 8 device(s), cuda:0 is NVML's 4, CUDA_VISIBLE_DEVICES=4,5,6,7"
    assert probe_gpu(2, visible="4, 5, 6, 7").name == "GPU 6"


def test_the_environment_is_read_when_not_given(monkeypatch):
    nvml_with_handles(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    assert probe_gpu(0).name == "GPU 3"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert probe_gpu(0).name == "GPU 0"  # unset: every GPU, in NVML's order


def test_a_uuid_entry_is_opened_by_uuid(monkeypatch):
    nvml_with_handles(monkeypatch)
    assert probe_gpu(1, visible="GPU-aaaa,GPU-bbbb").name == "GPU GPU-bbbb"


def test_an_index_past_the_list_is_no_gpu_naming_the_list(monkeypatch):
    opened = nvml_with_handles(monkeypatch)
    probe = probe_gpu(1, visible="3")
    assert not probe.present and opened == []
    assert probe.note == "no GPU: cuda:1 is not in CUDA_VISIBLE_DEVICES='3'"
    # An empty list hides every GPU; CUDA stops reading at the first entry that is no device.
    assert probe_gpu(0, visible="").note == "no GPU: cuda:0 is not in CUDA_VISIBLE_DEVICES=''"
    assert probe_gpu(1, visible="2,x,5").note == "no GPU: cuda:1 is not in CUDA_VISIBLE_DEVICES='2,x,5'"


def test_a_visible_gpu_the_host_lacks_is_out_of_range(monkeypatch):
    nvml_with_handles(monkeypatch, count=2)
    probe = probe_gpu(0, visible="7")
    assert probe.note == "no GPU: GPU index 7 out of range (NVML sees 2, CUDA_VISIBLE_DEVICES=7)"
