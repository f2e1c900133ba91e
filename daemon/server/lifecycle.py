"""The daemon process: size the pool, open the log, serve gRPC, stop cleanly.

Start order matters for the promises the daemon makes:
  the decision log's writer lock (one daemon per log) -> pool sized and (optionally)
  allocated -> controller -> decision log open -> gRPC bound -> health SERVING ->
  sd_notify READY=1.
So a client that sees SERVING can rely on the pool and the log. While writes to the log
fail (a full disk), health says NOT_SERVING and steps are refused; it turns back once the
decisions kept meanwhile are written (decision_unwritten).

Stop (SIGTERM / SIGINT): health NOT_SERVING and STOPPING=1 first (load balancers and
systemd learn it), then streams are ended, the server stops accepting and waits up to
`drain_timeout_s` for in-flight calls (no longer once none is left: `in_flight`), the core
drains and the log is flushed and closed.
Exit status 0.

Listening: unix sockets by default (a stale socket file is removed; a live one means
another daemon and is refused; mode 0660 so only the owner and group may connect).
TCP only when the config allows it (tokens file, TLS, or an explicit insecure opt-in).
"""

from __future__ import annotations

import asyncio
import dataclasses
import contextlib
import logging
import os
import signal
import socket
import sqlite3
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from kvbudget import __version__
from kvbudget.daemon.wire import convert
from kvbudget.daemon.server import sdnotify
from kvbudget.daemon.core.admission import AdmissionController, AdmissionError
from kvbudget.daemon.server.auth import Authorizer
from kvbudget.daemon.config.settings import DaemonConfig, listen_kind, parse_host_port
from kvbudget.daemon.server.service import CoreOptions, CoreService
from kvbudget.daemon.server.in_flight import GIVE_UP_S, InFlightCalls, Stopped, stop_server
from kvbudget.daemon.server.malformed import add_checked
from kvbudget.daemon.config.pool_setup import PoolSetup, setup_pool
from kvbudget.daemon.server.reflection import reflection_pool
from kvbudget.daemon.server.servicers import AdminServicer, EngineServicer, ObserverServicer
from kvbudget.daemon.server.steps import MAX_MESSAGE_BYTES
from kvbudget.daemon.server.sessions import SessionTable
from kvbudget.daemon.server.tls import (
    CertificatePair,
    ClientAuthority,
    ServedCertificate,
    TlsError,
    read_client_ca,
    read_pair,
)
from kvbudget.daemon.server.tokens_file import Roles, load_roles, tokens_file_warnings
from kvbudget.daemon.server.watch import WatchHub
from kvbudget.v1 import admin_pb2, admin_pb2_grpc, engine_pb2, engine_pb2_grpc, observer_pb2, observer_pb2_grpc

if TYPE_CHECKING:
    from kvbudget.daemon.server.reload import ReloadPlan

log = logging.getLogger("kvbudget.daemon")

SERVICE_NAMES = (
    engine_pb2.DESCRIPTOR.services_by_name["EngineService"].full_name,
    observer_pb2.DESCRIPTOR.services_by_name["ObserverService"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
)
MAX_SESSIONS = 1024
MAX_WATCHERS = 64
MIN_TICK_S = 0.01  # the core loop's shortest tick (lease expiry, GPU probe, metrics)


def core_tick_s(default_s: float, lease_ttl_s: float) -> float:
    """The core loop's tick: a quarter of the lease TTL at most, so a lapsed lease is seen
    soon after; never under MIN_TICK_S, else an absurd TTL (1e-300) spins the loop."""
    return max(MIN_TICK_S, min(default_s, lease_ttl_s / 4))


class Health(health_aio.HealthServicer):
    """The standard health service, with `List` too (the asyncio servicer of
    grpcio-health-checking leaves it UNIMPLEMENTED though reflection lists it): every
    service's status, as `Check` would answer each."""

    def __init__(self) -> None:
        super().__init__()
        self._statuses: dict[str, int] = {"": health_pb2.HealthCheckResponse.SERVING}
        self._ending = asyncio.Event()

    async def Watch(self, request, context):
        """The standard Watch, ended (OK) once the daemon stops: the standard one never
        returns, so a client watching health (gRPC's client-side health checking does) held
        a stop for the whole drain_timeout_s."""
        watching = asyncio.ensure_future(super().Watch(request, context))
        ending = asyncio.ensure_future(self._ending.wait())
        try:
            await asyncio.wait((watching, ending), return_when=asyncio.FIRST_COMPLETED)
        finally:
            ending.cancel()
            if not watching.done():
                watching.cancel()
        if watching.done() and not watching.cancelled():
            return watching.result()  # (it ended on its own: an error writing, say)
        # Ending: the stream closes, OK. (No last status written here: the stop set NOT_SERVING
        # first, which the watch wrote; a write of ours could meet one of its still pending.)

    def end_watches(self) -> None:
        """Every Watch stream ends, now and from now on."""
        self._ending.set()

    async def set(self, service: str, status: int) -> None:
        self._statuses[service] = status
        await super().set(service, status)

    async def List(self, request, context):
        return health_pb2.HealthListResponse(
            statuses={name: health_pb2.HealthCheckResponse(status=status) for name, status in self._statuses.items()}
        )


class StartupError(Exception):
    """One line for the operator; the CLI prints it and exits non-zero."""


class _StoppedWhileStarting(Exception):
    """SIGTERM / SIGINT came during start-up: unwind what was acquired, exit as a stop does."""


@dataclass(frozen=True)
class Listener:
    address: str  # as configured
    unix_path: str | None  # filesystem socket path, if any


def _unix_path(address: str) -> str | None:
    if address.startswith("unix-abstract:"):
        return None
    if address.startswith("unix://"):
        return address[len("unix://") :]
    return address[len("unix:") :]


def prepare_unix_socket(path: str) -> None:
    """Create the parent folder; remove a stale socket; refuse a live one or a non-socket."""
    target = Path(path)
    try:
        mode = target.lstat().st_mode
    except FileNotFoundError:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # (/proc, a folder this user may not write in)
            raise StartupError(
                f"listen: cannot create {target.parent} for the socket {path}: {exc.strerror or exc}"
            ) from None
        return
    except OSError as exc:  # (a file in the way; as --check-config words it: config_host)
        raise StartupError(f"listen: cannot reach {path}: {exc.strerror or exc}") from None
    if not stat.S_ISSOCK(mode):
        raise StartupError(f"listen: {path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        try:
            target.unlink()  # nobody answers: stale, left by a killed daemon
        except OSError as exc:
            raise StartupError(f"listen: cannot remove the stale socket {path}: {exc.strerror or exc}") from None
        log.info("removed stale socket %s", path)
    else:
        raise StartupError(f"listen: another process is serving on {path}")
    finally:
        probe.close()


def _warn_if_expired(pair: CertificatePair | None, client_ca: ClientAuthority | None = None) -> None:
    now = time.time()
    if pair is not None and pair.expired(now):
        log.warning("tls certificate %s has expired: clients refuse it; renew it, then systemctl reload kvbudget",
                    pair.cert_file)
    if client_ca is not None and client_ca.expired(now):
        log.warning("tls client CA %s: a CA certificate in it has expired: the clients it signed are refused; "
                    "renew it, then systemctl reload kvbudget", client_ca.ca_file)


def _warn_if_tcp_is_open_to_all(config: DaemonConfig) -> None:
    """TLS with neither tokens nor client certificates encrypts, but lets anyone who can
    reach the port in as admin. It is allowed (for a network only trusted hosts reach),
    and said at every start, so that it stays a choice and not an oversight."""
    if config.tokens_file or config.tls_client_ca_file or not config.tls_enabled:
        return
    for address in config.listen:
        if listen_kind(address) == "tcp":
            log.warning("listen %s: TLS without tokens_file or tls_client_ca_file: every client that "
                        "reaches it has the admin role", address)


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
        self._health: health_aio.HealthServicer | None = None
        self._core: CoreService | None = None
        self._calls = InFlightCalls()  # (a stop ends once none is left: in_flight)
        self._server_abandoned = False  # a stop gave up waiting for grpc (in_flight.Stopped)
        self._health_updates: set[asyncio.Task] = set()

    # ------------------------------------------------------------------ setup
    def probe_gpu(self) -> object | None:
        """NVML's view of the configured device; None with device=cpu (no probe)."""
        if self.config.device == "cpu":
            return None
        from kvbudget.daemon.config.gpu import probe_gpu

        index = int(self.config.device.split(":")[1]) if ":" in self.config.device else 0
        return probe_gpu(index)

    def _allocate_memory(self, setup: PoolSetup, gpu: object | None) -> object | None:
        if self.config.memory_mode != "owned":
            log.info("pool memory: accounting only (memory_mode accounting: engines keep their own KV memory)")
            return None
        from kvbudget.daemon.config.pool_memory import PoolMemoryError, allocate_pool_memory, page_layout

        sized = setup.sizing
        layout = page_layout(sized.num_blocks, setup.model.layout.group_size, sized.page_size_bytes)
        device = self.config.device
        if device == "auto" and getattr(gpu, "present", False):
            # The pool was sized from this GPU's memory: it goes there, or start-up fails
            # saying why (a CPU-only torch), rather than land in /dev/shm at a GPU's size.
            device = f"cuda:{getattr(gpu, 'index', 0)}"
        try:
            memory = allocate_pool_memory(sized.pool_bytes, device=device, layout=layout)
        except PoolMemoryError as exc:
            raise StartupError(f"memory_mode owned: {exc} (or use --memory-mode accounting)") from None
        if memory is None:
            log.warning("torch is not available: accounting-only pool (engines keep their memory)")
        elif memory.is_cuda:
            log.info("pool memory: %d bytes on %s, shared with engines by CUDA IPC", memory.size_bytes, memory.device)
        else:
            log.info("pool memory: %d bytes of host shared memory /dev/shm/%s", memory.size_bytes, memory.shm_name)
        return memory

    def _build_server(self, core: CoreService, health: health_aio.HealthServicer) -> grpc.aio.Server:
        config = self.config
        if config.tls_enabled:
            try:
                client_ca = read_client_ca(config.tls_client_ca_file) if config.tls_client_ca_file else None
                self._certificate = ServedCertificate(read_pair(config.tls_cert_file, config.tls_key_file), client_ca)
            except TlsError as exc:  # (the config checked it; the files changed since)
                raise StartupError(f"{exc.field}: {exc}") from None
            log.info("tls certificate %s", self._certificate.pair.describe())
            if client_ca is not None:
                log.info("tls client certificates required, signed by %s", client_ca.describe())
            _warn_if_expired(self._certificate.pair, client_ca)
        _warn_if_tcp_is_open_to_all(config)
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
            ]
        )
        # TCP without a tokens file is trusted: only TLS (mutual or not) or allow_insecure_tcp
        # get here. With one, even one that lists no token, a TCP caller needs a role.
        roles = self.roles
        auth = self._auth = Authorizer(roles.tokens, certificate_names=roles.certificate_names,
                                       trust_tcp=not config.tokens_file)
        calls = self._calls
        add_checked(engine_pb2_grpc.add_EngineServiceServicer_to_server, EngineServicer(core, auth), server, calls)
        add_checked(
            observer_pb2_grpc.add_ObserverServiceServicer_to_server,
            ObserverServicer(core, auth, db_path=config.db_path, watch_max_hz=config.watch_max_hz), server, calls,
        )
        add_checked(
            admin_pb2_grpc.add_AdminServiceServicer_to_server,
            AdminServicer(core, auth, on_drain=lambda: self._set_health(health, False)), server, calls,
        )
        add_checked(health_pb2_grpc.add_HealthServicer_to_server, health, server, calls)  # (bad bytes: INVALID_ARGUMENT)
        # pool: the served descriptors with the .proto comments, so `grpcurl describe` shows the docs
        reflection.enable_server_reflection(
            (*SERVICE_NAMES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            server,
            pool=reflection_pool(),
        )
        for address in config.listen:
            if listen_kind(address) == "unix":
                path = _unix_path(address)
                if path is not None:
                    # Checked again right before the bind: gRPC unlinks whatever socket is at
                    # the path, and start-up (the pool, CUDA, the log) can take minutes since
                    # the first check, time enough for another daemon to bind and serve there.
                    prepare_unix_socket(path)
                try:
                    server.add_insecure_port(address)
                except RuntimeError as exc:
                    raise StartupError(f"listen: cannot bind {address}: {exc}") from None
                self._listeners.append(Listener(address, _unix_path(address)))
                continue
            host_port = parse_host_port(address)
            assert host_port is not None  # the config checked it
            try:
                if self._certificate is not None:
                    server.add_secure_port(address, self._certificate.credentials())
                else:
                    server.add_insecure_port(address)
            except RuntimeError as exc:
                raise StartupError(f"listen: cannot bind {address}: {exc}") from None
            self._listeners.append(Listener(address, None))
        return server

    async def _set_health(self, health: health_aio.HealthServicer, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", *SERVICE_NAMES):
            await health.set(name, status)

    # ------------------------------------------------------------------ run
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
        """What a reload changes live, from a plan that loaded (daemon/server/reload.py)."""
        from kvbudget.daemon.server.reload import RETUNE_KEYS, tenant_updates

        running, target = self.config, plan.config
        if target.policy != running.policy:
            try:
                await core.record(core.set_policy(target.policy))
            except Exception as exc:  # applied; its POLICY decision waits to be written
                log.error("reload: policy %s: decision log: %s", target.policy, exc)
        if any(getattr(target, key) != getattr(running, key) for key in RETUNE_KEYS):
            core.controller.retune(**{key: getattr(target, key) for key in RETUNE_KEYS})
        kept_quotas: list[str] = []  # tenants whose new quota was refused: they keep the old one
        for tenant, max_share, weight in tenant_updates(running, target):
            try:
                core.controller.set_tenant_quota(tenant, max_share, weight)
            except AdmissionError as exc:  # (the rest of the reload stands)
                log.error("reload: tenants.%s.%s; that tenant keeps its quota", tenant, exc)
                kept_quotas.append(tenant)
        changes = plan.changes
        if kept_quotas:
            # What runs is the old quota: the running config says so (the next reload compares
            # with it), and the summary does not claim the change.
            tenants = dict(target.tenants)
            for tenant in kept_quotas:
                if tenant in running.tenants:
                    tenants[tenant] = running.tenants[tenant]
                else:
                    tenants.pop(tenant, None)
            target = dataclasses.replace(target, tenants=tenants)
            changes = [c for c in changes if not any(c.startswith(f"tenant {t} ") for t in kept_quotas)]
        core.log.retention_s = target.retention_s  # (read by the writer at each pass)
        core.log.max_rows = target.retention_rows
        core.log.max_bytes = target.retention_bytes
        core.sessions.default_ttl_s = target.lease_ttl_s  # new sessions; open ones keep theirs
        if plan.roles is not None and self._auth is not None:
            self._auth.replace_tokens(plan.roles.tokens, plan.roles.certificate_names)
            self.roles = plan.roles
        if self._certificate is not None and (plan.certificate or plan.client_ca) is not None:
            self._certificate.replace(plan.certificate, plan.client_ca)  # new connections get them
        _warn_if_expired(plan.certificate, plan.client_ca)
        if core.metrics is not None:
            core.metrics.set_certificate_expiry(plan.certificate.not_after_unix_s if plan.certificate else 0.0)
            core.metrics.set_client_ca_expiry(plan.client_ca.not_after_unix_s if plan.client_ca else 0.0)
        if target.log_level != running.log_level:
            # The process's messages, as `kvbudget daemon` set them up (the root
            # logger); set first, so that the summary below obeys the new level.
            logging.getLogger().setLevel(target.log_level.upper())
        self.config = target
        # (With only restart keys changed, "nothing changed" read against the warning below.)
        for warning in plan.warnings:
            log.warning("%s", warning)
        log.info("reloaded: %s", "; ".join(changes) or ("nothing applied live" if plan.at_restart else "nothing changed"))
        if plan.at_restart:
            log.warning("reload: %s changed; that takes a restart (systemctl restart kvbudget)",
                        ", ".join(plan.at_restart))
        if target.retention_max_bytes != running.retention_max_bytes:
            _warn_if_the_log_outgrows_its_disk(core.log.figures(), target.db_path)

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
        update = asyncio.ensure_future(self._set_health(self._health, serving))
        self._health_updates.add(update)  # (a task nobody holds may be collected mid-run)
        update.add_done_callback(self._health_updates.discard)
        if error is not None:
            sdnotify.status(f"decision log cannot write, steps refused: {error}")

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
            notifier = asyncio.create_task(self._notify_loop(core))
            stack.push_async_callback(self._cancel, notifier)
            await self._stop.wait()
            log.info("stopping: draining in-flight calls and flushing the decision log")
            sdnotify.stopping("stopping: flushing the decision log")
            await self._set_health(health, False)
            core.draining = True
            core.watch_hub.close_all()  # long-lived streams end, so in-flight calls can finish
            core.end_all_streams()  # (expired sessions' too, still waiting for their decisions)
            health.end_watches()
            stopped = await stop_server(server, self._calls, self.config.drain_timeout_s)
            if stopped is Stopped.CUT_SHORT:
                log.info("stopped: no call in flight; closed the connections still open")
            elif stopped is Stopped.ABANDONED:
                self._server_abandoned = True
                log.warning(
                    "stopping without waiting for gRPC any longer: past drain_timeout_s (%gs), a "
                    "connection would not close (a client that stopped reading: frozen or hung); "
                    "its calls were cancelled", self.config.drain_timeout_s,
                )
            await core.stop()
        return self._exit_status

    async def _start(self, stack: contextlib.AsyncExitStack):
        from kvbudget.daemon.log.decision_log import DecisionLog
        from kvbudget.daemon.log.lock import LogInUse, WriterLock
        from kvbudget.daemon.log.schema import DecisionLogError

        config = self.config
        if config.tokens_file:
            for warning in tokens_file_warnings(config.tokens_file, self.roles):
                log.warning("%s", warning)
        # Taken once, before the pool is sized (that can take a while): every snapshot of
        # this process carries it, and a watcher that sees it change knows it restarted.
        started_unix_s = time.time()
        for address in config.listen:  # fail fast, before any expensive setup
            path = _unix_path(address) if listen_kind(address) == "unix" else None
            if path is not None:
                prepare_unix_socket(path)
        # One daemon per decision log (each numbers its rows from its own counter): the log's
        # writer lock is held from here to exit (the OS drops it if the process dies), taken
        # before the pool or the database are touched, so a second daemon fails fast and
        # leaves both alone.
        writer_lock = WriterLock(config.db_path)
        try:
            Path(config.db_path).parent.mkdir(parents=True, exist_ok=True)
            writer_lock.acquire()
        except LogInUse as exc:
            raise StartupError(f"db_path: {exc}") from None
        except OSError as exc:
            raise StartupError(f"db_path: cannot use {config.db_path}: {exc}") from None
        stack.callback(writer_lock.release)  # (last out: after the log is closed)
        gpu = await asyncio.to_thread(self.probe_gpu)
        self._stop_if_asked()
        if gpu is None:
            log.info("no GPU probed: device=cpu")
        elif not getattr(gpu, "present", False):
            log.warning("%s", getattr(gpu, "note", "") or "no GPU")
        try:
            setup = setup_pool(config, gpu)
        except Exception as exc:
            raise StartupError(str(exc)) from None
        # A large pool can take a while to map; ask systemd for more start time rather than
        # be killed mid-allocation (a no-op outside systemd).
        sdnotify.extend_timeout(120)
        memory = await asyncio.to_thread(self._allocate_memory, setup, gpu)
        if memory is not None:
            stack.callback(memory.close)  # unlinks the shared-memory segment
        self._stop_if_asked()
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
        plan = convert.plan_to_proto(
            setup.model.layout,
            controller.snapshot(0.0).num_blocks,
            max_model_len=setup.max_model_len,
            max_num_batched_tokens=config.max_num_batched_tokens,
            memory=memory,
        )
        loop = asyncio.get_running_loop()
        decision_log = DecisionLog(
            config.db_path, retention_s=config.retention_s, max_rows=config.retention_rows,
            max_bytes=config.retention_bytes,
            on_failure=lambda why: loop.call_soon_threadsafe(self._log_writer_stopped, why),
            on_write_trouble=lambda error: loop.call_soon_threadsafe(self._log_write_trouble, error),
        )
        try:
            Path(config.db_path).parent.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(decision_log.start)
        except (DecisionLogError, OSError, sqlite3.Error) as exc:
            # A bad file is the operator's to fix; it is never overwritten or migrated here.
            decision_log.close()
            raise StartupError(f"db_path: cannot use {config.db_path}: {exc}") from None
        stack.push_async_callback(self._close_log, decision_log)
        self._stop_if_asked()
        # A restart numbers its decisions on from the log's last: seq stays unique in the log
        # (from 1 again, a dashboard keyed on it met the same seq twice and crashed).
        from kvbudget.daemon.log.query import newest_seq

        try:
            controller.number_from(await asyncio.to_thread(newest_seq, config.db_path))
        except DecisionLogError as exc:
            raise StartupError(f"db_path: cannot use {config.db_path}: {exc}") from None
        _warn_if_the_log_outgrows_its_disk(decision_log.figures(), config.db_path)
        metrics = self._start_metrics()
        if metrics is not None:
            stack.callback(metrics.stop)
        core = CoreService(
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
                gpu_refresh_s=config.gpu_probe_interval_s,
            ),
            pool_bytes=setup.sizing.pool_bytes if memory is not None else 0,
            started_unix_s=started_unix_s,
            daemon_version=__version__,
        )
        health = Health()
        await self._set_health(health, False)
        server = self._build_server(core, health)
        if metrics is not None and self._certificate is not None:
            metrics.set_certificate_expiry(self._certificate.pair.not_after_unix_s)
            if self._certificate.client_ca is not None:
                metrics.set_client_ca_expiry(self._certificate.client_ca.not_after_unix_s)
        self._stop_if_asked()
        await server.start()
        stack.callback(self._remove_sockets)
        stack.push_async_callback(self._stop_server_now, server)  # no-op after the graceful stop
        for listener in self._listeners:
            if listener.unix_path:
                os.chmod(listener.unix_path, 0o660)
        await core.start()
        stack.push_async_callback(core.stop)
        await self._set_health(health, True)  # pool, log and core are ready
        self._health, self._core = health, core  # (from now on, log trouble turns health)
        summary = (
            f"serving {setup.model.name}: {plan.num_blocks} blocks of {plan.block_size_tokens} tokens "
            f"({plan.kv_tokens} KV tokens{' in every group' if len(plan.groups) > 1 else ''}), "
            f"policy {controller.snapshot(0.0).policy}, "
            f"on {', '.join(config.listen)}"
        )
        return core, health, server, summary

    @staticmethod
    async def _cancel(task: asyncio.Task) -> None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    @staticmethod
    async def _close_log(decision_log) -> None:
        await asyncio.to_thread(decision_log.close)
        log.info("stopped; %s decisions written by this run", getattr(decision_log, "rows_written", "?"))

    def _remove_sockets(self) -> None:
        for listener in self._listeners:
            if listener.unix_path:
                Path(listener.unix_path).unlink(missing_ok=True)

    def _start_metrics(self) -> object | None:
        if not self.config.metrics_address:
            return None
        from kvbudget.daemon.server.metrics import Metrics

        host, port = parse_host_port(self.config.metrics_address)  # type: ignore[misc]
        metrics = Metrics()
        try:
            bound = metrics.start_http(host, port)
        except OSError as exc:
            raise StartupError(f"metrics_address: cannot serve on {host}:{port}: {exc.strerror or exc}") from None
        url_host = f"[{host}]" if ":" in host else host  # an IPv6 address is bracketed in a URL
        log.info("metrics on http://%s:%d/metrics", url_host, bound)
        return metrics

    async def _notify_loop(self, core: CoreService, status_every_s: float = 5.0) -> None:
        """WATCHDOG=1 at half the watchdog interval (when systemd asks for it) and a STATUS=
        line with the pool's state every few seconds; both no-ops without NOTIFY_SOCKET."""
        interval = sdnotify.watchdog_interval_s()
        tick = min(interval / 2, status_every_s) if interval else status_every_s
        last_status = 0.0
        loop = asyncio.get_running_loop()
        while True:
            if interval:
                sdnotify.watchdog()
            if loop.time() - last_status >= status_every_s:
                last_status = loop.time()
                s = core.snapshot()
                unwritten = core.log.num_unwritten
                sdnotify.status(
                    f"{s.num_running} running, {s.num_waiting} waiting, {s.num_held_blocks}/{s.num_blocks} "
                    f"blocks held ({s.usage:.0%}), policy {s.policy}{', draining' if core.draining else ''}"
                    + (f", decision log cannot write ({unwritten} decisions wait), steps refused"
                       if unwritten else "")
                )
            await asyncio.sleep(tick)


def _warn_if_the_log_outgrows_its_disk(figures, db_path: str) -> None:
    """At start: a log that may grow past its disk's free space (a full disk fails every
    commit, and engines get UNAVAILABLE) is said in the journal, with the knob."""
    room = figures.disk_free_bytes
    if not figures.disk_total_bytes:
        return  # (the file system's figures could not be read)
    if figures.max_bytes and figures.max_bytes - figures.database_bytes > room:
        log.warning(
            "db_path: the decision log (%d bytes) may grow to retention_max_bytes (%d) but %s has %d bytes "
            "free: set a lower retention_max_bytes, or move db_path", figures.database_bytes, figures.max_bytes,
            Path(db_path).parent, room,
        )


def run_daemon(config: DaemonConfig) -> int:
    return asyncio.run(Daemon(config).serve())
