"""How many blocks the shared KV pool gets, and what was subtracted to get there: from GPU
memory, from the pool's bytes, or the block count itself (exactly one source). Memory that
leaves nothing for the cache is a result, not an exception."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kvbudget.daemon.core.spec import KVCacheLayout

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
SOURCE_GPU = "gpu_memory"
SOURCE_KV_BYTES = "kv_cache_memory_bytes"
SOURCE_BLOCKS = "num_gpu_blocks"
# Settings that only mean something when the pool is sized from GPU memory.
GPU_ONLY_SETTINGS = ("weights_bytes", "gpu_memory_utilization", "activation_reserve_bytes")
_SOURCE_SETTINGS = ("kv_cache_memory_bytes", "num_gpu_blocks", "gpu_memory_bytes")


def kv_tokens(num_blocks: int, layout: KVCacheLayout) -> int:
    """Tokens the pool holds, as vLLM's start-up line "GPU KV cache size: N tokens" counts
    them: every token of a request takes a slot in each KV-cache group, so the blocks are
    split across the groups first (num_blocks // groups x block_size). For a hybrid model
    num_blocks x block_size would overstate it by the number of groups."""
    return _kv_tokens(num_blocks, layout.num_groups, layout.block_size)


def _kv_tokens(num_blocks: int, num_groups: int, block_size: int) -> int:
    return num_blocks // max(1, num_groups) * block_size


@dataclass(frozen=True)
class PoolSizing:
    num_blocks: int
    block_size: int
    page_size_bytes: int
    bytes_per_block: int
    num_groups: int  # KV-cache groups drawing on the pool
    source: str  # SOURCE_GPU, SOURCE_KV_BYTES or SOURCE_BLOCKS
    kv_cache_bytes: int  # bytes handed to the pool (>= num_blocks x bytes_per_block)
    gpu_total_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    weights_bytes: int | None = None
    weights_estimated: bool = False
    activation_reserve_bytes: int = 0
    non_torch_overhead_bytes: int = 0
    shortfall_bytes: int = 0  # > 0 when the subtractions exceed the usable memory
    gpu_name: str = ""

    @property
    def kv_tokens(self) -> int:
        """vLLM's "GPU KV cache size" (see `kv_tokens` above), not num_blocks x block_size."""
        return _kv_tokens(self.num_blocks, self.num_groups, self.block_size)

    @property
    def pool_bytes(self) -> int:
        return self.num_blocks * self.bytes_per_block

    @property
    def fits(self) -> bool:
        return self.num_blocks > 0

    def as_dict(self) -> dict[str, object]:
        return {
            "source": self.source,
            "num_blocks": self.num_blocks,
            "block_size": self.block_size,
            "page_size_bytes": self.page_size_bytes,
            "bytes_per_block": self.bytes_per_block,
            "num_groups": self.num_groups,
            "kv_tokens": self.kv_tokens,
            "kv_cache_bytes": self.kv_cache_bytes,
            "pool_bytes": self.pool_bytes,
            "gpu_name": self.gpu_name or None,
            "gpu_total_bytes": self.gpu_total_bytes,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "weights_bytes": self.weights_bytes,
            "weights_estimated": self.weights_estimated,
            "activation_reserve_bytes": self.activation_reserve_bytes,
            "non_torch_overhead_bytes": self.non_torch_overhead_bytes,
            "shortfall_bytes": self.shortfall_bytes,
        }


def _count(name: str, value: object, *, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer number of bytes or blocks, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value}")
    return value


def _geometry(layout: KVCacheLayout) -> dict[str, int]:
    return {
        "block_size": layout.block_size,
        "page_size_bytes": layout.page_size_bytes,
        "bytes_per_block": layout.bytes_per_block,
        "num_groups": layout.num_groups,
    }


@dataclass(frozen=True)
class SourceConflict:
    """Two pool-sizing settings given together that cannot both hold."""

    setting: str  # the one to drop, by config name
    message: str


def memory_source_conflict(
    given: Iterable[str], spell: Callable[[str], str] = str
) -> SourceConflict | None:
    """Why the pool-sizing settings `given` (config names) cannot go together, or None.

    At most one memory source (none: the local GPU), and the GPU-only settings only with
    GPU memory: honouring one source and ignoring the other would size a pool the user
    did not ask for, without a word. `spell` writes a name as the caller's user would
    (`--num-gpu-blocks` for `kvbudget estimate`, the key itself for the daemon's config).
    """
    names = set(given)
    sources = [name for name in _SOURCE_SETTINGS if name in names]
    if len(sources) > 1:
        listed = " and ".join(spell(name) for name in sources)
        return SourceConflict(sources[-1], f"give one memory source, not {listed}")
    if sources and sources[0] != "gpu_memory_bytes":
        gpu = spell("gpu_memory_bytes")
        for name in GPU_ONLY_SETTINGS:
            if name in names:
                return SourceConflict(name, f"{spell(name)} only applies with {gpu} or the local GPU")
    return None


def size_from_gpu_memory(
    layout: KVCacheLayout,
    *,
    gpu_total_bytes: int,
    weights_bytes: int,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    activation_reserve_bytes: int = 0,
    non_torch_overhead_bytes: int = 0,
    weights_estimated: bool = False,
    gpu_name: str = "",
) -> PoolSizing:
    total = _count("gpu_total_bytes", gpu_total_bytes)
    weights = _count("weights_bytes", weights_bytes, allow_zero=True)
    activation = _count("activation_reserve_bytes", activation_reserve_bytes, allow_zero=True)
    overhead = _count("non_torch_overhead_bytes", non_torch_overhead_bytes, allow_zero=True)
    util = gpu_memory_utilization
    if isinstance(util, bool) or not isinstance(util, (int, float)) or not 0 < util <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {util!r}")

    usable = int(total * util)
    left = usable - weights - activation - overhead
    kv_bytes = max(0, left)
    return PoolSizing(
        num_blocks=kv_bytes // layout.bytes_per_block,
        source=SOURCE_GPU,
        kv_cache_bytes=kv_bytes,
        gpu_total_bytes=total,
        gpu_memory_utilization=float(util),
        weights_bytes=weights,
        weights_estimated=weights_estimated,
        activation_reserve_bytes=activation,
        non_torch_overhead_bytes=overhead,
        shortfall_bytes=max(0, -left),
        gpu_name=gpu_name,
        **_geometry(layout),
    )


def size_from_kv_cache_bytes(layout: KVCacheLayout, kv_cache_memory_bytes: int) -> PoolSizing:
    kv_bytes = _count("kv_cache_memory_bytes", kv_cache_memory_bytes)
    return PoolSizing(
        num_blocks=kv_bytes // layout.bytes_per_block,
        source=SOURCE_KV_BYTES,
        kv_cache_bytes=kv_bytes,
        **_geometry(layout),
    )


def size_from_num_blocks(layout: KVCacheLayout, num_gpu_blocks: int) -> PoolSizing:
    blocks = _count("num_gpu_blocks", num_gpu_blocks)
    return PoolSizing(
        num_blocks=blocks,
        source=SOURCE_BLOCKS,
        kv_cache_bytes=blocks * layout.bytes_per_block,
        **_geometry(layout),
    )


def size_pool(
    layout: KVCacheLayout,
    *,
    gpu_total_bytes: int | None = None,
    weights_bytes: int | None = None,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    activation_reserve_bytes: int = 0,
    non_torch_overhead_bytes: int = 0,
    weights_estimated: bool = False,
    kv_cache_memory_bytes: int | None = None,
    num_gpu_blocks: int | None = None,
    gpu_name: str = "",
) -> PoolSizing:
    """Size the pool from exactly one of GPU memory, `kv_cache_memory_bytes`, `num_gpu_blocks`."""
    given = [
        name
        for name, value in (
            ("gpu_total_bytes", gpu_total_bytes),
            ("kv_cache_memory_bytes", kv_cache_memory_bytes),
            ("num_gpu_blocks", num_gpu_blocks),
        )
        if value is not None
    ]
    if len(given) != 1:
        raise ValueError(
            "give exactly one memory source: gpu_total_bytes, kv_cache_memory_bytes or "
            f"num_gpu_blocks (got {', '.join(given) or 'none'})"
        )
    if gpu_total_bytes is None and weights_bytes is not None:
        raise ValueError(f"weights_bytes only applies with gpu_total_bytes, not {given[0]}")
    if num_gpu_blocks is not None:
        return size_from_num_blocks(layout, num_gpu_blocks)
    if kv_cache_memory_bytes is not None:
        return size_from_kv_cache_bytes(layout, kv_cache_memory_bytes)
    if weights_bytes is None:
        raise ValueError("weights_bytes is required when sizing from gpu_total_bytes")
    assert gpu_total_bytes is not None
    return size_from_gpu_memory(
        layout,
        gpu_total_bytes=gpu_total_bytes,
        weights_bytes=weights_bytes,
        gpu_memory_utilization=gpu_memory_utilization,
        activation_reserve_bytes=activation_reserve_bytes,
        non_torch_overhead_bytes=non_torch_overhead_bytes,
        weights_estimated=weights_estimated,
        gpu_name=gpu_name,
    )
