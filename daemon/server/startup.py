"""The daemon's start-up steps, each one acquiring one thing or failing with one line
for the operator (`StartupError`): the log's writer lock, the pool's memory, the
controller, the decision log, the metrics server. `lifecycle.Daemon` runs them in order."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from kvbudget.daemon.config.listen import parse_host_port
from kvbudget.daemon.config.pool_setup import PoolSetup
from kvbudget.daemon.config.settings import DaemonConfig
from kvbudget.daemon.core.admission import AdmissionController, AdmissionError

if TYPE_CHECKING:
    from kvbudget.daemon.log.decision_log import DecisionLog
    from kvbudget.daemon.log.lock import WriterLock
    from kvbudget.daemon.server.metrics import Metrics

log = logging.getLogger("kvbudget.daemon")


class StartupError(Exception):
    """One line for the operator; the CLI prints it and exits non-zero."""


def take_writer_lock(config: DaemonConfig) -> WriterLock:
    """One daemon per decision log (each numbers its rows from its own counter): the log's
    writer lock, held from here to exit (the OS drops it if the process dies), taken before
    the pool or the database are touched, so a second daemon fails fast and leaves both alone."""
    from kvbudget.daemon.log.lock import LogInUse, WriterLock

    writer_lock = WriterLock(config.db_path)
    try:
        Path(config.db_path).parent.mkdir(parents=True, exist_ok=True)
        writer_lock.acquire()
    except LogInUse as exc:
        raise StartupError(f"db_path: {exc}") from None
    except OSError as exc:
        raise StartupError(f"db_path: cannot use {config.db_path}: {exc}") from None
    return writer_lock


def probe_gpu(config: DaemonConfig) -> object | None:
    """NVML's view of the configured device, and of each GPU the pool spans from it on
    (tensor x pipeline parallel); None with device=cpu (no probe)."""
    if config.device == "cpu":
        return None
    from kvbudget.daemon.config.gpu import probe_gpu as probe

    index = int(config.device.split(":")[1]) if ":" in config.device else 0
    return probe(index, count=config.tensor_parallel_size * config.pipeline_parallel_size)


def allocate_memory(config: DaemonConfig, setup: PoolSetup, gpu: object | None) -> object | None:
    """The pool's memory with memory_mode owned (None: accounting only, or no torch)."""
    if config.memory_mode != "owned":
        log.info("pool memory: accounting only (memory_mode accounting: engines keep their own KV memory)")
        return None
    from kvbudget.daemon.config.pool_memory import PoolMemoryError, allocate_pool_memory, page_layout

    sized = setup.sizing
    layout = page_layout(sized.num_blocks, setup.model.layout.group_size, sized.page_size_bytes)
    device = config.device
    if device == "auto" and getattr(gpu, "present", False):
        # The pool was sized from this GPU's memory: it goes there, or start-up fails
        # saying why (a CPU-only torch), rather than land in /dev/shm at a GPU's size.
        device = f"cuda:{getattr(gpu, 'index', 0)}"
    try:
        memory = allocate_pool_memory(sized.pool_bytes, device=device, layout=layout)
    except PoolMemoryError as exc:
        raise StartupError(f"memory_mode owned: {exc} (or use --memory-mode accounting)") from None
    if memory is None:
        log.warning("torch is not installed: accounting-only pool (engines keep their memory); for an "
                    "owned pool, install the extra: pip install 'kvbudget[gpu]'")
    elif memory.is_cuda:
        log.info("pool memory: %d bytes on %s, shared with engines by CUDA IPC", memory.size_bytes, memory.device)
    else:
        log.info("pool memory: %d bytes of host shared memory /dev/shm/%s", memory.size_bytes, memory.shm_name)
    return memory


def build_controller(config: DaemonConfig, setup: PoolSetup) -> AdmissionController:
    """The admission core over the sized pool, with the config's tenant quotas."""
    # Sizing counts blocks as vLLM's num_gpu_blocks does (the null block included);
    # the controller takes the usable ones.
    try:
        controller = AdmissionController(
            setup.model.layout, setup.num_blocks - 1, config.admission_config(setup.model.max_model_len)
        )
    except MemoryError:  # (the pool's free list and block tables live in this process)
        raise StartupError(
            f"{setup.num_blocks} blocks ({setup.sizing.source}): this host has not the memory to track "
            "that many blocks; lower num_gpu_blocks or kv_cache_memory_bytes"
        ) from None
    for tenant, quota in config.tenants.items():
        try:
            controller.set_tenant_quota(tenant, quota.max_share, quota.weight)
        except AdmissionError as exc:
            raise StartupError(f"tenants.{tenant}.{exc}") from None
    return controller


async def open_log(
    config: DaemonConfig, on_failure: Callable[[str], None], on_write_trouble: Callable[[str | None], None],
) -> DecisionLog:
    """The decision log, opened (created, or checked and upgraded) on a worker thread."""
    from kvbudget.daemon.log.decision_log import DecisionLog
    from kvbudget.daemon.log.schema import DecisionLogError

    decision_log = DecisionLog(
        config.db_path, retention_s=config.retention_s, max_rows=config.retention_rows,
        max_bytes=config.retention_bytes, on_failure=on_failure, on_write_trouble=on_write_trouble,
    )
    try:
        Path(config.db_path).parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(decision_log.start)
    except (DecisionLogError, OSError, sqlite3.Error) as exc:
        # A bad file is the operator's to fix; it is never overwritten or migrated here.
        decision_log.close()
        raise StartupError(f"db_path: cannot use {config.db_path}: {exc}") from None
    return decision_log


async def close_left_open(decision_log: DecisionLog, db_path: str, num_free_blocks: int) -> list:
    """Each request a killed daemon left open in the log gets its closing row (closing.py);
    returns those decisions (the metrics count them once they start)."""
    from kvbudget.daemon.log.schema import DecisionLogError
    from kvbudget.daemon.server.closing import close_left_open_at_start

    try:
        return await close_left_open_at_start(decision_log, db_path, num_free_blocks)
    except DecisionLogError as exc:
        raise StartupError(f"db_path: cannot close the requests left open in {db_path}: {exc}") from None


async def number_on_from_the_log(controller: AdmissionController, db_path: str) -> None:
    """A restart numbers its decisions on from the log's last: seq stays unique in the log
    (from 1 again, a dashboard keyed on it met the same seq twice and crashed)."""
    from kvbudget.daemon.log.query import newest_seq
    from kvbudget.daemon.log.schema import DecisionLogError

    try:
        controller.number_from(await asyncio.to_thread(newest_seq, db_path))
    except DecisionLogError as exc:
        raise StartupError(f"db_path: cannot use {db_path}: {exc}") from None


def warn_if_the_log_outgrows_its_disk(figures, db_path: str) -> None:
    """At start (and at a reload that changes retention_max_bytes): a log that may grow past
    its disk's free space (a full disk fails every commit, and engines get UNAVAILABLE) is
    said in the journal, with the knob."""
    room = figures.disk_free_bytes
    if not figures.disk_total_bytes:
        return  # (the file system's figures could not be read)
    if figures.max_bytes and figures.max_bytes - figures.database_bytes > room:
        log.warning(
            "db_path: the decision log (%d bytes) may grow to retention_max_bytes (%d) but %s has %d bytes "
            "free: set a lower retention_max_bytes, or move db_path", figures.database_bytes, figures.max_bytes,
            Path(db_path).parent, room,
        )


def start_metrics(config: DaemonConfig, plan) -> Metrics | None:
    """The /metrics HTTP server, when metrics_address is set, describing the pool `plan` sizes."""
    if not config.metrics_address:
        return None
    from kvbudget.daemon.server.metrics import Metrics

    host, port = parse_host_port(config.metrics_address)  # type: ignore[misc]
    metrics = Metrics()
    metrics.describe_pool(plan, config)
    try:
        bound = metrics.start_http(host, port)
    except OSError as exc:
        raise StartupError(f"metrics_address: cannot serve on {host}:{port}: {exc.strerror or exc}") from None
    url_host = f"[{host}]" if ":" in host else host  # an IPv6 address is bracketed in a URL
    log.info("metrics on http://%s:%d/metrics", url_host, bound)
    return metrics


def serving_summary(setup: PoolSetup, plan, controller: AdmissionController, config: DaemonConfig) -> str:
    """The journal's line (and READY=1's STATUS=) once serving."""
    return (
        f"serving {setup.model.name}: {plan.num_blocks} blocks of {plan.block_size_tokens} tokens "
        f"({plan.kv_tokens} KV tokens{' in every group' if len(plan.groups) > 1 else ''}), "
        f"policy {controller.snapshot(0.0).policy}, "
        f"on {', '.join(config.listen)}"
    )
