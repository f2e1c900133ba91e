"""`kvbudget doctor --config FILE`: the pool that config means, worked out from the config
alone (its own model, block size and memory source), as the daemon would at start.

It once read the running daemon's model and block size and only the config's size keys,
so a config for another model was "as the config implies", and a config sized from GPU
memory on a host with no GPU was skipped without a word. Now a config that cannot be
worked out says why (a problem: exit 1), and the model is compared too.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbudget.cli.doctor_samples import PoolExpectation, PoolSample
from kvbudget.client.errors import CLIError


@dataclass(frozen=True)
class _ReportedGpu:
    """The GPU as the daemon reports it, in the shape `setup_pool` probes (gpu.GPUProbe)."""

    total_bytes: int
    name: str = ""
    present: bool = True
    note: str = ""


def config_expectation(path: str, last: PoolSample) -> PoolExpectation:
    """What the config at `path` implies; CLIError for a file that does not load."""
    from kvbudget.daemon.config import sizing
    from kvbudget.daemon.config.loading import load_config
    from kvbudget.daemon.config.pool_setup import PoolSetupError, setup_pool
    from kvbudget.daemon.config.settings import ConfigError

    try:
        config = load_config(path, {})
    except ConfigError as exc:
        raise CLIError(str(exc)) from None
    except OSError as exc:
        raise CLIError(f"--config: cannot read {path}: {exc.strerror}") from None
    # Sized from GPU memory with no gpu_memory_bytes: the daemon's GPUs, as it reports them
    # (doctor runs anywhere; the daemon's host is the one whose memory counts), the smallest.
    totals = [g.total_bytes for g in (last.gpus or (last.gpu,)) if g.total_bytes]
    gpu = _ReportedGpu(min(totals)) if totals else None
    try:
        setup = setup_pool(config, gpu)
    except PoolSetupError as exc:
        return PoolExpectation(source="", unavailable=f"{path}: {exc}")
    sized = setup.sizing
    usable = sized.num_blocks - 1  # block 0, the null block, is never handed out
    own = {"model": setup.model.name, "block_size": sized.block_size, "bytes_per_block": sized.bytes_per_block}
    if sized.source == sizing.SOURCE_GPU:
        # The daemon also subtracts the overhead it measures at start: an upper bound only.
        weights = f"{sized.weights_bytes or 0} B{' (estimated)' if sized.weights_estimated else ''}"
        why = (f"{sized.gpu_total_bytes} B x gpu_memory_utilization {sized.gpu_memory_utilization}, minus "
               f"weights {weights} and activation reserve {sized.activation_reserve_bytes} B: "
               f"at most {usable} usable blocks")
        return PoolExpectation(source=sized.source, max_pool_bytes=usable * sized.bytes_per_block,
                               explanation=why, **own)
    if sized.source == sizing.SOURCE_KV_BYTES:
        why = (f"kv_cache_memory_bytes {config.kv_cache_memory_bytes} // {sized.bytes_per_block} B per block "
               f"= {sized.num_blocks}: {usable} usable + the null block")
    else:
        why = f"num_gpu_blocks = {sized.num_blocks}: {usable} usable + the null block"
    return PoolExpectation(source=sized.source, num_blocks=usable, explanation=why, **own)
