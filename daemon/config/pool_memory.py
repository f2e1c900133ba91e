"""The pool's memory, owned by the daemon and mapped by engines: one flat buffer allocated at
start, on a GPU (shared by CUDA IPC) or in POSIX shared memory, untouched until written.
torch is optional: without it the daemon runs accounting-only."""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import logging
import os
import re
import secrets
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

SHM_DIR = "/dev/shm"
SHM_MODE = 0o660  # the CPU pool: the daemon's user and group read and write it, as its socket
SHM_NAME = re.compile(r"kvbudget_(?P<pid>\d+)_[0-9a-f]{8}")  # what _allocate_shared_cpu names
CUDA_IPC_HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)

log = logging.getLogger("kvbudget.daemon")


class PoolMemoryError(Exception):
    """The pool cannot be allocated as asked (too big for the device or /dev/shm, bad device),
    or an engine cannot map it (no name in the plan, segment gone, wrong device)."""


def page_layout(num_blocks: int, layers_per_group: int, page_size_bytes: int) -> str:
    """The layout string engines read: block b, layer l of the group starts at
    `(b * layers_per_group + l) * page_size_bytes`."""
    return (
        f"[num_blocks={num_blocks}][layers_per_group={layers_per_group}]"
        f"[page_size_bytes={page_size_bytes}] block-major, block 0 = null block"
    )


@dataclass(eq=False)
class PoolMemory:
    """One allocated pool. `close()` frees it (and unlinks the shared-memory name)."""

    device: str  # "cuda:0" or "cpu"
    size_bytes: int
    shm_name: str = ""  # CPU pool
    cuda_ipc_handle: bytes = b""  # GPU pool
    offset_bytes: int = 0  # where the pool starts inside what the handle names
    layout: str = ""
    tensor: Any = None  # torch.Tensor, uint8, size_bytes long
    torch_share: tuple[Any, ...] = ()  # torch's full _share_cuda_ tuple, for torch consumers
    _shm: shared_memory.SharedMemory | None = None

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def close(self) -> None:
        """Free the memory. Idempotent. Engines still mapping it keep their mapping."""
        self.tensor = None  # drop our view first: the shm buffer cannot close while exported
        shm, self._shm = self._shm, None
        if shm is not None:
            try:
                shm.unlink()
            except FileNotFoundError:
                pass
            try:
                shm.close()
            except BufferError:
                pass  # someone still holds a view; the mapping goes with the process

    def __enter__(self) -> PoolMemory:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def allocate_pool_memory(size_bytes: int, *, device: str = "auto", layout: str = "") -> PoolMemory | None:
    """Allocate the pool once. None when torch is not installed (accounting-only)."""
    if size_bytes <= 0:
        raise ValueError(f"size_bytes must be positive, got {size_bytes}")
    try:
        import torch
    except ImportError:
        return None
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        return _allocate_cuda(torch, size_bytes, device, layout)
    if device != "cpu":
        raise PoolMemoryError(f"device must be auto, cpu, cuda or cuda:N, got {device!r}")
    return _allocate_shared_cpu(torch, size_bytes, layout)


def _allocate_cuda(torch: Any, size_bytes: int, device: str, layout: str) -> PoolMemory:
    if not torch.cuda.is_available():
        raise PoolMemoryError(f"device {device!r} asked for, but torch sees no CUDA device")
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    count = torch.cuda.device_count()
    if not 0 <= index < count:  # (torch would only say "invalid device ordinal", with a traceback)
        raise PoolMemoryError(f"device cuda:{index} asked for, but torch sees {count} CUDA device(s)")
    try:
        tensor = torch.empty(size_bytes, dtype=torch.uint8, device=f"cuda:{index}")
    except torch.cuda.OutOfMemoryError as exc:
        raise PoolMemoryError(f"cannot allocate a {size_bytes}-byte pool on cuda:{index}: {exc}") from None
    share = tensor.untyped_storage()._share_cuda_()
    # (device, handle, size_bytes, offset_bytes, ref_counter_handle, ref_counter_offset,
    #  event_handle, event_sync_required): the handle names the caching allocator's whole
    # segment; our buffer starts offset_bytes into it.
    handle, offset = bytes(share[1]), int(share[3])
    if len(handle) != CUDA_IPC_HANDLE_BYTES:
        # Expandable segments share another kind of handle, which cudaIpcOpenMemHandle (and
        # so every engine) refuses: say it once here rather than to every engine later.
        raise PoolMemoryError(
            f"torch shares the pool on cuda:{index} with a {len(handle)}-byte handle, not a "
            f"{CUDA_IPC_HANDLE_BYTES}-byte cudaIpcMemHandle_t engines can open: turn off expandable "
            "segments for the daemon (PYTORCH_CUDA_ALLOC_CONF without expandable_segments:True)"
        )
    return PoolMemory(
        device=f"cuda:{index}",
        size_bytes=size_bytes,
        cuda_ipc_handle=handle,
        offset_bytes=offset,
        layout=layout,
        tensor=tensor,
        torch_share=tuple(share),
    )


def _allocate_shared_cpu(torch: Any, size_bytes: int, layout: str) -> PoolMemory:
    if os.path.isdir(SHM_DIR):
        for name, stale_bytes in remove_stale_segments():  # first: their space counts below
            log.warning("removed stale pool segment %s/%s (%d bytes): its daemon stopped without "
                        "removing it", SHM_DIR, name, stale_bytes)
        stats = os.statvfs(SHM_DIR)
        available = stats.f_bavail * stats.f_frsize
        if size_bytes > available:
            raise PoolMemoryError(
                f"a {size_bytes}-byte CPU pool does not fit in {SHM_DIR} ({available} bytes free); "
                "lower the pool size or use memory_mode = \"accounting\""
            )
    name = f"kvbudget_{os.getpid()}_{secrets.token_hex(4)}"
    shm = shared_memory.SharedMemory(name=name, create=True, size=size_bytes)
    # Python creates it 0600: only the daemon's user could map it. Engines run as other
    # users in the daemon's group (the systemd unit's socket is 0660 for them): same here.
    os.fchmod(shm._fd, SHM_MODE)  # type: ignore[attr-defined]
    # Held while the segment is open here (the OS drops it when this process dies): the mark
    # by which the next daemon tells this live segment from a stale one.
    fcntl.flock(shm._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # type: ignore[attr-defined]
    tensor = torch.frombuffer(shm.buf, dtype=torch.uint8, count=size_bytes)
    return PoolMemory(
        device="cpu", size_bytes=size_bytes, shm_name=shm.name, layout=layout, tensor=tensor, _shm=shm
    )


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def remove_stale_segments(shm_dir: str = SHM_DIR) -> list[tuple[str, int]]:
    """Unlink the CPU pool segments that daemons left behind; returns (name, size) of each.

    Stale means both: the pid in its name is gone, and no process holds the segment's lock
    (a live daemon in another PID namespace sharing /dev/shm still holds it). Engines that
    still map a removed segment keep their mapping; only the name goes."""
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return []
    removed = []
    for name in names:
        match = SHM_NAME.fullmatch(name)
        if match is None or _process_exists(int(match["pid"])):
            continue
        path = os.path.join(shm_dir, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # gone meanwhile, or another user's
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            size = os.fstat(fd).st_size
            os.unlink(path)
        except OSError:
            continue  # locked: its daemon lives; or not ours to unlink
        finally:
            os.close(fd)
        removed.append((name, size))
    return removed


# --------------------------------------------------------------------- the engine's side
def map_shared_memory(shm_name: str) -> shared_memory.SharedMemory:
    """Attach to a CPU pool by name (the engine's side). The daemon owns the name: attaching
    must not register it for clean-up, or this process's exit would unlink the daemon's pool."""
    if not shm_name:
        raise PoolMemoryError(
            "no shm_name: the plan has no CPU pool (accounting mode: no memory at all; a GPU pool: "
            "use map_cuda_pool)"
        )
    try:
        shm = shared_memory.SharedMemory(name=shm_name, create=False)
    except FileNotFoundError:
        raise PoolMemoryError(
            f"no shared-memory segment {shm_name} in {SHM_DIR}: the daemon that named it has stopped "
            "(open a new session for the current plan), or this process has another /dev/shm "
            "(a container or a service with PrivateIPC / PrivateDevices)"
        ) from None
    try:  # Python < 3.13 registers every attach with the resource tracker
        from multiprocessing import resource_tracker

        resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    except Exception:
        pass
    return shm


class _CudaIpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * CUDA_IPC_HANDLE_BYTES)]


def _load_cudart() -> ctypes.CDLL:
    candidates = ["libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"]
    found = ctypes.util.find_library("cudart")
    if found:
        candidates.insert(0, found)
    try:  # torch's CUDA wheels ship the runtime in nvidia/cuda_runtime/lib
        import nvidia.cuda_runtime  # type: ignore[import-not-found]

        for directory in nvidia.cuda_runtime.__path__:
            lib_dir = os.path.join(directory, "lib")
            if os.path.isdir(lib_dir):
                candidates += [os.path.join(lib_dir, f) for f in sorted(os.listdir(lib_dir)) if "cudart" in f]
    except ImportError:
        pass
    for candidate in candidates:
        try:
            return ctypes.CDLL(candidate)
        except OSError:
            continue
    raise PoolMemoryError("cannot find the CUDA runtime library (libcudart)")


def map_cuda_pool(handle: bytes, offset_bytes: int, size_bytes: int, device_index: int = 0) -> Any:
    """Map a GPU pool from its raw IPC handle as a uint8 torch tensor (the engine's side).

    Uses only what the proto carries (handle, offset, size), so a non-torch engine can do
    the same with `cudaIpcOpenMemHandle`. Must run in another process than the daemon
    (CUDA refuses to open a process's own handle).
    """
    import torch

    if len(handle) != CUDA_IPC_HANDLE_BYTES:
        raise PoolMemoryError(
            f"expected a {CUDA_IPC_HANDLE_BYTES}-byte cudaIpcMemHandle_t, got {len(handle)} bytes "
            "(the daemon's torch may use expandable segments; disable them for IPC)"
        )
    torch.cuda.set_device(device_index)
    torch.cuda.init()
    cudart = _load_cudart()
    base = ctypes.c_void_p()
    raw = _CudaIpcHandle()
    ctypes.memmove(ctypes.addressof(raw), handle, CUDA_IPC_HANDLE_BYTES)
    # The cudart found here may be another copy than torch's, with its own current device
    # (0): open the handle on the device the caller named, not wherever that copy points.
    status = cudart.cudaSetDevice(device_index)
    if status != 0:
        raise PoolMemoryError(f"cudaSetDevice({device_index}) failed with CUDA error {status}")
    cuda_ipc_mem_lazy_enable_peer_access = 1
    status = cudart.cudaIpcOpenMemHandle(ctypes.byref(base), raw, cuda_ipc_mem_lazy_enable_peer_access)
    if status != 0:
        raise PoolMemoryError(f"cudaIpcOpenMemHandle failed with CUDA error {status}")

    class _Mapped:  # __cuda_array_interface__ lets torch wrap the pointer without a copy
        __cuda_array_interface__ = {
            "shape": (size_bytes,),
            "typestr": "|u1",
            "data": (base.value + offset_bytes, False),
            "version": 2,
        }

    pool = torch.as_tensor(_Mapped(), device=f"cuda:{device_index}")
    # as_tensor copies when the pointer is on another device than asked: the engine would
    # then write into a private copy nobody else sees.
    if pool.data_ptr() != base.value + offset_bytes:
        raise PoolMemoryError(
            f"the pool's memory is not on cuda:{device_index} as mapped; pass the device_index "
            "of the daemon's GPU as this process numbers it"
        )
    return pool
