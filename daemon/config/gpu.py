"""What NVML says about the memory of the GPUs a pool spans; never raises.

`pynvml` (the `nvidia-ml-py` distribution) is imported inside `probe_gpu`, so importing
this module costs nothing on a laptop. Without the package, the driver, or a device, the
probe returns `present=False` with a note "no GPU: <why>" that callers can show as is.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class GPUProcess:
    pid: int
    used_bytes: int | None  # None when the driver does not say (e.g. in a container)


@dataclass(frozen=True)
class GPUProbe:
    present: bool
    index: int = 0
    name: str = ""
    total_bytes: int = 0
    used_bytes: int = 0
    free_bytes: int = 0
    processes: tuple[GPUProcess, ...] = ()
    note: str = ""
    nvml_device: str = ""  # NVML's id of cuda:index: its host index, or a UUID; "": not read
    # Every GPU of the pool when it spans several (tensor x pipeline parallel), this one
    # first; () for one GPU: `pool_gpus` reads both.
    gpus: tuple[GPUProbe, ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {
            "present": self.present,
            "index": self.index,
            "nvml_device": self.nvml_device,
            "name": self.name,
            "total_bytes": self.total_bytes,
            "used_bytes": self.used_bytes,
            "free_bytes": self.free_bytes,
            "processes": [{"pid": p.pid, "used_bytes": p.used_bytes} for p in self.processes],
            "note": self.note,
            "gpus": [g.as_dict() for g in self.gpus],
        }


def pool_gpus(probe: object) -> tuple[object, ...]:
    """The probes of every GPU the pool spans, in CUDA order (duck-typed: a GPUProbe, or a
    test's stand-in without `gpus`)."""
    return tuple(getattr(probe, "gpus", ()) or (probe,))


def _absent(index: int, why: str) -> GPUProbe:
    return GPUProbe(present=False, index=index, note=f"no GPU: {why}")


def _why(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def smallest_total(probe: object) -> tuple[int | None, str]:
    """(the smallest total memory of the pool's GPUs, "") to size a pool by, as vLLM gives
    every worker the block count of the one with the least; (None, why) when one of them
    could not be read."""
    gpus = pool_gpus(probe)
    for gpu in gpus:
        if not getattr(gpu, "present", False):
            return None, str(getattr(gpu, "note", "") or "no GPU")
    return min(int(getattr(gpu, "total_bytes")) for gpu in gpus), ""


def probe_gpu(index: int = 0, visible: str | None = None, *, count: int = 1) -> GPUProbe:
    """Memory of GPU `index` and the processes using it, as NVML reports them. `index` is
    CUDA's (`cuda:N`): the Nth of CUDA_VISIBLE_DEVICES (`visible`, default: the environment's)
    where that is set, since NVML numbers every GPU of the host whatever CUDA is shown.
    `count` > 1: the pool spans GPUs index .. index + count - 1 (an engine's tensor x
    pipeline ranks, as vLLM places them on the visible GPUs); each is read, into `gpus`."""
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        nvml = importlib.import_module("pynvml")
    except Exception as exc:  # ImportError, or a broken install
        return _absent(index, f"nvidia-ml-py (pynvml) not importable ({_why(exc)})")
    try:
        nvml.nvmlInit()
    except Exception as exc:
        return _absent(index, f"NVML unavailable ({_why(exc)})")
    try:
        probes = tuple(_read_one(nvml, i, visible) for i in range(index, index + count))
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
    return probes[0] if count == 1 else dataclasses.replace(probes[0], gpus=probes)


def _read_one(nvml: ModuleType, index: int, visible: str | None) -> GPUProbe:
    try:
        return _read_device(nvml, index, visible)
    except Exception as exc:
        return _absent(index, f"NVML query failed ({_why(exc)})")


def _read_device(nvml: ModuleType, index: int, visible: str | None) -> GPUProbe:
    count = nvml.nvmlDeviceGetCount()
    if count <= 0:
        return _absent(index, "NVML sees no devices")
    device, shown = str(index), ""
    if visible is not None:
        # CUDA reads the list up to its first entry that is not a device: so do we.
        entries = []
        for entry in (e.strip() for e in visible.split(",")):
            if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
                break
            entries.append(entry)
        if not 0 <= index < len(entries):
            return _absent(index, f"cuda:{index} is not in CUDA_VISIBLE_DEVICES={visible!r}")
        device, shown = entries[index], f", CUDA_VISIBLE_DEVICES={visible}"
    if device.startswith(("GPU-", "MIG-")):
        handle = nvml.nvmlDeviceGetHandleByUUID(device)
    elif 0 <= int(device) < count:
        handle = nvml.nvmlDeviceGetHandleByIndex(int(device))
    else:
        return _absent(index, f"GPU index {device} out of range (NVML sees {count}{shown})")
    name = nvml.nvmlDeviceGetName(handle)
    if isinstance(name, bytes):  # older bindings return bytes
        name = name.decode(errors="replace")
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    return GPUProbe(
        present=True,
        index=index,
        nvml_device=device,
        name=str(name),
        total_bytes=int(memory.total),
        used_bytes=int(memory.used),
        free_bytes=int(memory.free),
        processes=_processes(nvml, handle),
        note=f"NVML: {count} device(s)" + (f", cuda:{index} is NVML's {device}{shown}" if shown else ""),
    )


def _processes(nvml: ModuleType, handle: object) -> tuple[GPUProcess, ...]:
    try:
        running = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:  # not supported on some drivers / vGPUs: memory figures still stand
        return ()
    return tuple(
        GPUProcess(pid=int(p.pid), used_bytes=_used(getattr(p, "usedGpuMemory", None)))
        for p in running
    )


def _used(value: object) -> int | None:
    # NVML reports "not available" as None in the Python bindings (NVML_VALUE_NOT_AVAILABLE).
    if value is None or not isinstance(value, int) or value < 0 or value >= 2**64 - 1:
        return None
    return value
