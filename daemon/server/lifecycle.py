"""The daemon process: size the pool, open the log, serve gRPC, stop cleanly.

Start-up acquires in an order a client can rely on (a SERVING health means the pool and the
log are ready; READY=1 comes last); a stop, SIGTERM or SIGINT, releases in reverse order,
also when start-up fails half-way. SIGHUP reloads the config (reload.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import grpc

from kvbudget import __version__
from kvbudget.daemon.config.pool_setup import PoolSetup, setup_pool, unservable
from kvbudget.daemon.config.settings import DaemonConfig
from kvbudget.daemon.server import sdnotify
from kvbudget.daemon.server.auth import Authorizer
from kvbudget.daemon.server.grpc_server import build_server, served_certificate
from kvbudget.daemon.server.health import Health
from kvbudget.daemon.server.in_flight import GIVE_UP_S, InFlightCalls
from kvbudget.daemon.server.listeners import (
    Listener, open_to_group, prepare_unix_sockets, remove_sockets, warn_if_tcp_is_open_to_all,
)
from kvbudget.daemon.server.notify_loop import notify_loop
from kvbudget.daemon.server.service import CoreOptions, CoreService
from kvbudget.daemon.server.sessions import SessionTable
from kvbudget.daemon.server.stopping import stop_serving
from kvbudget.daemon.server.startup import (
    StartupError, allocate_memory, build_controller, close_left_open, number_on_from_the_log, open_log, probe_gpu,
    serving_summary, start_metrics, take_writer_lock, warn_if_the_log_outgrows_its_disk,
)
from kvbudget.daemon.server.tls import ServedCertificate
from kvbudget.daemon.config.tokens_file import Roles, load_roles, tokens_file_warnings
from kvbudget.daemon.server.watch import WatchHub
from kvbudget.daemon.wire import convert

if TYPE_CHECKING:
    from kvbudget.daemon.core.admission import AdmissionController
    from kvbudget.daemon.log.decision_log import DecisionLog
    from kvbudget.daemon.server.metrics import Metrics
    from kvbudget.daemon.server.reload import ReloadPlan

log = logging.getLogger("kvbudget.daemon")

MAX_SESSIONS = 1024
MAX_WATCHERS = 64
MIN_TICK_S = 0.01  # the core loop's shortest tick (lease expiry, GPU probe, metrics)


def core_tick_s(default_s: float, lease_ttl_s: float) -> float:
    """The core loop's tick: a quarter of the lease TTL at most, so a lapsed lease is seen
    soon after; never under MIN_TICK_S, else an absurd TTL (1e-300) spins the loop."""
    return max(MIN_TICK_S, min(default_s, lease_ttl_s / 4))


class _StoppedWhileStarting(Exception):
    """SIGTERM / SIGINT came during start-up: unwind what was acquired, exit as a stop does."""


class Daemon:
    def __init__(
        self, config: DaemonConfig, *, core_options: CoreOptions | None = None,
        on_ready: Callable[[], None] | None = None,
        reload_config: Callable[[], DaemonConfig] | None = None, owns_process: bool = False,
    ) -> None:
        """`on_ready` runs once start-up is done, just before READY=1 (the CLI settles
        the heap there: interpreter.settle_heap). `reload_config` loads the config again
        on SIGHUP (raising ConfigError / OSError); without it a SIGHUP changes nothing.
        `owns_process` (`kvbudget daemon`): the process ends with the daemon, so once it
        has stopped, later SIGTERM / SIGINT / SIGHUP are ignored (`_release_signals`)."""
        self.config = config
        self._owns_process = owns_process
        self._reload_config = reload_config
        self._reloads: set[asyncio.Task] = set()
        self._reload_lock = asyncio.Lock()
        self._auth: Authorizer | None = None
        self._certificate: ServedCertificate | None = None  # TLS: what the TCP listeners present
        self.core_options = core_options or CoreOptions()
        self._on_ready = on_ready
        self.roles = load_roles(config.tokens_file) if config.tokens_file else Roles({})
        self._stop = asyncio.Event()
        self._listeners: list[Listener] = []
        self._exit_status = 0
        self._health: Health | None = None
        self._core: CoreService | None = None
        self._calls = InFlightCalls()  # (a stop ends once none is left: in_flight)
        self._server_abandoned = False  # a stop gave up waiting for grpc (in_flight.Stopped)
        self._health_updates: set[asyncio.Task] = set()

    @property
    def core(self) -> CoreService | None:
        """The core service once the daemon serves (None while it starts)."""
        return self._core

    def probe_gpu(self) -> object | None:
        """NVML's view of the configured device; None with device=cpu (no probe)."""
        return probe_gpu(self.config)

    # ------------------------------------------------------------------ run and stop
    async def serve(self) -> int:
        """Runs until SIGTERM / SIGINT; every resource acquired is released on the way out,
        in reverse order, also when start-up fails half-way (no shared-memory segment or
        open log is left behind)."""
        # The handlers come first: a signal's default action during start-up (which can
        # take minutes: CUDA, a large pool, a log to upgrade) killed the process, even a
        # SIGHUP from `systemctl reload`, and left what it had acquired to the kernel.
        self._install_signal_handlers()
        try:
            return await self._serve()
        finally:
            self._release_signals()

    async def _serve(self) -> int:
        async with contextlib.AsyncExitStack() as stack:
            try:
                core, health, server, summary = await self._start(stack)
            except _StoppedWhileStarting:
                log.info("stopped before serving (a stop was asked for during start-up)")
                return self._exit_status
            log.info("%s", summary)
            if self._on_ready is not None:
                self._on_ready()
            sdnotify.ready(summary)
            notifier = asyncio.create_task(notify_loop(core))
            stack.push_async_callback(self._cancel, notifier)
            await self._stop.wait()
            await self._stop_serving(core, health, server)
        return self._exit_status

    async def _stop_serving(self, core: CoreService, health: Health, server: grpc.aio.Server) -> None:
        """The stop's steps (stopping.py); the open requests get their last row there."""
        if await stop_serving(core, health, server, self._calls, drain_timeout_s=self.config.drain_timeout_s,
                              db_path=self.config.db_path):
            self._server_abandoned = True

    async def _stop_server_now(self, server: grpc.aio.Server) -> None:
        """On the way out (a start-up that failed half-way, or after the stop): the server
        stopped at once, but not waited for past GIVE_UP_S, nor at all once a stop gave up
        on it (a peer not reading holds grpc's stop for ever)."""
        if not self._server_abandoned:
            await asyncio.wait((asyncio.ensure_future(server.stop(0)),), timeout=GIVE_UP_S)

    def request_stop(self) -> None:
        self._stop.set()

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        loop.add_signal_handler(signal.SIGHUP, self.request_reload)  # systemctl reload

    def _release_signals(self) -> None:
        """Stopped (the log flushed and closed, or start-up undone). asyncio's loop, once
        closed, hands the signals back to their defaults, so a second SIGTERM landing in the
        few ms the process then takes to wind down (threads joined, modules freed) killed it
        (exit 143, not 0). A process that ends with the daemon ignores them from here on,
        process-wide (a mask is per thread, and any thread may be the one a signal reaches);
        one that goes on (a test running the daemon in process) gets its own handlers back."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
            if self._owns_process:
                signal.signal(sig, signal.SIG_IGN)

    def _stop_if_asked(self) -> None:
        """Between the steps of start-up: a SIGTERM that came meanwhile ends it here (what
        was acquired is released, no READY=1 is sent) rather than after a start that may
        still take minutes."""
        if self._stop.is_set():
            raise _StoppedWhileStarting

    # ------------------------------------------------------------------ start-up
    async def _start(self, stack: contextlib.AsyncExitStack):
        config = self.config
        if config.tokens_file:
            for warning in tokens_file_warnings(config.tokens_file, self.roles):
                log.warning("%s", warning)
        # Taken once, before the pool is sized (that can take a while): every snapshot of
        # this process carries it, and a watcher that sees it change knows it restarted.
        started_unix_s = time.time()
        prepare_unix_sockets(config.listen)  # fail fast, before any expensive setup
        stack.callback(take_writer_lock(config).release)  # (last out: after the log is closed)
        gpu, setup, memory = await self._set_up_pool(stack)
        controller = build_controller(config, setup)
        plan = convert.plan_to_proto(
            setup.model.layout,
            controller.snapshot(0.0).num_blocks,
            max_model_len=setup.max_model_len,
            max_num_batched_tokens=config.max_num_batched_tokens,
            memory=memory,
        )
        decision_log = await self._open_log(stack)
        closed = await close_left_open(decision_log, config.db_path, controller.snapshot(0.0).num_free_blocks)
        await number_on_from_the_log(controller, config.db_path)
        warn_if_the_log_outgrows_its_disk(decision_log.figures(), config.db_path)
        metrics = start_metrics(config, plan)
        if metrics is not None:
            stack.callback(metrics.stop)
            metrics.record(closed)  # (kvbudget_decisions_total{kind="expire",reason="daemon_restart"})
        core = self._build_core(controller, decision_log, plan, metrics, gpu,
                                pool_bytes=setup.sizing.pool_bytes if memory is not None else 0,
                                started_unix_s=started_unix_s)
        health, server = await self._start_serving(stack, core, metrics)
        return core, health, server, serving_summary(setup, plan, controller, config)

    async def _set_up_pool(self, stack: contextlib.AsyncExitStack) -> tuple[object | None, PoolSetup, object | None]:
        """The GPU probed, the pool sized and (memory_mode owned) its memory allocated."""
        gpu = await asyncio.to_thread(self.probe_gpu)
        self._stop_if_asked()
        if gpu is None:
            log.info("no GPU probed: device=cpu")
        elif not getattr(gpu, "present", False):
            log.warning("%s", getattr(gpu, "note", "") or "no GPU")
        try:
            setup = setup_pool(self.config, gpu)
        except Exception as exc:
            raise StartupError(str(exc)) from None
        if unfit := unservable(setup, self.config.max_num_batched_tokens):  # starts, but warns
            log.warning("%s", unfit)
        # A large pool can take a while to map; ask systemd for more start time rather than
        # be killed mid-allocation (a no-op outside systemd).
        sdnotify.extend_timeout(120)
        memory = await asyncio.to_thread(allocate_memory, self.config, setup, gpu)
        if memory is not None:
            stack.callback(memory.close)  # unlinks the shared-memory segment
        self._stop_if_asked()
        return gpu, setup, memory

    async def _open_log(self, stack: contextlib.AsyncExitStack) -> DecisionLog:
        loop = asyncio.get_running_loop()
        decision_log = await open_log(
            self.config,
            on_failure=lambda why: loop.call_soon_threadsafe(self._log_writer_stopped, why),
            on_write_trouble=lambda error: loop.call_soon_threadsafe(self._log_write_trouble, error),
        )
        stack.push_async_callback(self._close_log, decision_log)
        self._stop_if_asked()
        return decision_log

    def _build_core(
        self, controller: AdmissionController, decision_log: DecisionLog, plan, metrics: Metrics | None,
        gpu: object | None, *, pool_bytes: int, started_unix_s: float,
    ) -> CoreService:
        config = self.config
        return CoreService(
            controller,
            decision_log,
            plan,
            SessionTable(config.lease_ttl_s, max_ttl_s=3600.0, max_sessions=MAX_SESSIONS),
            WatchHub(MAX_WATCHERS),
            metrics=metrics,
            gpu_probe=self.probe_gpu if config.device != "cpu" else None,
            gpu=gpu,
            options=CoreOptions(
                tick_s=core_tick_s(self.core_options.tick_s, config.lease_ttl_s),
                gpu_refresh_s=config.gpu_probe_interval_s, max_ops_per_step=config.max_ops_per_step,
            ),
            pool_bytes=pool_bytes,
            started_unix_s=started_unix_s,
            daemon_version=__version__,
        )

    async def _start_serving(
        self, stack: contextlib.AsyncExitStack, core: CoreService, metrics: Metrics | None,
    ) -> tuple[Health, grpc.aio.Server]:
        """The gRPC server built and started (NOT_SERVING until the core runs), then SERVING."""
        health = Health()
        await health.set_serving(False)
        server = self._build_server(core, health)
        if metrics is not None and self._certificate is not None:
            metrics.set_certificate_expiry(self._certificate.pair.not_after_unix_s)
            if self._certificate.client_ca is not None:
                metrics.set_client_ca_expiry(self._certificate.client_ca.not_after_unix_s)
        self._stop_if_asked()
        await server.start()
        stack.callback(remove_sockets, self._listeners)
        stack.push_async_callback(self._stop_server_now, server)  # no-op after the graceful stop
        open_to_group(self._listeners)
        await core.start()
        stack.push_async_callback(core.stop)
        await health.set_serving(True)  # pool, log and core are ready
        self._health, self._core = health, core  # (from now on, log trouble turns health)
        return health, server

    def _build_server(self, core: CoreService, health: Health) -> grpc.aio.Server:
        config = self.config
        self._certificate = served_certificate(config)
        warn_if_tcp_is_open_to_all(config)
        # TCP without a tokens file is trusted: only TLS (mutual or not) or allow_insecure_tcp
        # get here. With one, even one that lists no token, a TCP caller needs a role.
        roles = self.roles
        auth = self._auth = Authorizer(roles.tokens, certificate_names=roles.certificate_names, engines=roles.engines,
                                       trust_tcp=not config.tokens_file)
        server, self._listeners = build_server(config, core, health, auth, self._calls, self._certificate,
                                               on_drain=lambda: health.set_serving(False))
        return server

    @staticmethod
    async def _cancel(task: asyncio.Task) -> None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    @staticmethod
    async def _close_log(decision_log) -> None:
        await asyncio.to_thread(decision_log.close)
        log.info("stopped; %s decisions written by this run", getattr(decision_log, "rows_written", "?"))

    # ------------------------------------------------------------------ while serving
    def request_reload(self) -> None:
        reload = asyncio.ensure_future(self._reload())
        self._reloads.add(reload)  # (a task nobody holds may be collected mid-run)
        reload.add_done_callback(self._reloads.discard)

    async def _reload(self) -> None:
        """SIGHUP: read the config again and apply what may change live (daemon/server/reload.py)."""
        from kvbudget.daemon.config.settings import ConfigError
        from kvbudget.daemon.server.reload import model_resolved, plan_reload

        core = self._core
        if core is None or self._stop.is_set():
            log.warning("reload: not serving yet (or stopping); SIGHUP ignored")
            return
        if self._reload_config is None:
            log.warning("reload: this daemon was started without a config to read again; nothing changed")
            return
        async with self._reload_lock:  # (two SIGHUPs in a row: one after the other)
            sdnotify.reloading()
            try:
                served = self._certificate
                resolved = model_resolved(core.plan.block_size_tokens, core.plan.max_model_len_tokens)
                plan = plan_reload(self.config, self._reload_config(), served and served.pair,
                                   served and served.client_ca, resolved)
            except (ConfigError, OSError) as exc:
                log.error("reload failed, nothing changed: %s", exc)
                sdnotify.ready("reload failed, still running the previous config")
                return
            except Exception:  # a bug, not the file: still nothing changed, and systemd hears READY
                log.exception("reload failed, nothing changed")
                sdnotify.ready("reload failed, still running the previous config")
                return
            try:
                await self._apply_reload(core, plan)
            except Exception:  # a bug: systemd, told RELOADING=1, must still hear READY=1
                log.exception("reload failed part-way; what was applied before the error stands")
                sdnotify.ready("reload failed part-way, see the journal")
                return
            sdnotify.ready("reloaded")

    async def _apply_reload(self, core: CoreService, plan: ReloadPlan) -> None:
        """What a reload changes live, from a plan that loaded (daemon/server/reload_apply.py)."""
        from kvbudget.daemon.server.reload_apply import apply_reload, report_reload

        running = self.config
        target, changes = await apply_reload(core, plan, running, self._auth, self._certificate)
        if plan.roles is not None and self._auth is not None:
            self.roles = plan.roles
        self.config = target
        report_reload(plan, changes, running, target, core)

    def _log_writer_stopped(self, why: str) -> None:
        """The decision log can commit nothing more, so nothing can be decided: stop (the
        usual way: NOT_SERVING, drain, close) and exit 1, so that systemd (Restart=on-failure)
        starts a daemon whose log works, rather than one that answers every Step with
        UNAVAILABLE for as long as nobody looks."""
        log.error("stopping: %s", why)
        self._exit_status = 1
        self.request_stop()

    def _log_write_trouble(self, error: str | None) -> None:
        """Writes to the decision log fail (`error`) or work again (None). No step can be
        admitted meanwhile, so health says NOT_SERVING (load balancers and probes learn
        it) and so does systemd's status line, until the kept decisions are written."""
        if self._health is None or self._stop.is_set():
            return  # (start-up or stopping: health is someone else's)
        serving = error is None and not (self._core is not None and self._core.draining)
        update = asyncio.ensure_future(self._health.set_serving(serving))
        self._health_updates.add(update)  # (a task nobody holds may be collected mid-run)
        update.add_done_callback(self._health_updates.discard)
        if error is not None:
            sdnotify.status(f"decision log cannot write, steps refused: {error}")
