"""`kvbudget daemon`: run the KV budget daemon. Every config key has a flag of the same name
(`--num-gpu-blocks` for `pool.num_gpu_blocks`); flags win over the `--config` file, also
when SIGHUP reads it again.

  kvbudget daemon --model llama-3.1-8b --num-gpu-blocks 4096 \\
      --listen unix:kvbudget.sock --db-path decisions.db --memory-mode accounting
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import os
import sys
from typing import TYPE_CHECKING

from kvbudget.client.errors import CLIError

if TYPE_CHECKING:
    from kvbudget.daemon.config.settings import DaemonConfig

def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kvbudget.cli.daemon_flags import add_config_flags

    parser.add_argument("--config", metavar="FILE",
                        help=f"TOML config file (flags override it; default ${CONFIG_ENV}, else "
                             f"{DEFAULT_CONFIG_PATH} when it exists)")
    parser.add_argument(
        "--check-config", action="store_true",
        help="validate the config and pool sizing, report every mistake, then exit (0: valid, 2: not)",
    )
    add_config_flags(parser)


def _tenants(values: list[str] | None) -> dict[str, dict[str, float]] | None:
    if not values:
        return None
    tenants: dict[str, dict[str, float]] = {}
    for value in values:
        name, sep, rest = value.partition("=")
        share, _, weight = rest.partition(":")
        try:
            entry = {"max_share": float(share)}
            if weight:
                entry["weight"] = float(weight)
        except ValueError:
            raise CLIError(f"--tenant: expected NAME=SHARE[:WEIGHT], got {value!r}") from None
        if not sep or not name:
            raise CLIError(f"--tenant: expected NAME=SHARE[:WEIGHT], got {value!r}")
        tenants[name] = entry
    return tenants


def _overrides(args: argparse.Namespace) -> dict[str, object]:
    """The flags given, as config fields (None: not given, the file or the default rules)."""
    from kvbudget.cli.daemon_flags import SPECIAL
    from kvbudget.daemon.config.settings import DaemonConfig

    overrides: dict[str, object] = {
        f.name: getattr(args, f.name, None) for f in dataclasses.fields(DaemonConfig) if f.name not in SPECIAL
    }
    overrides["listen"] = tuple(args.listen) if args.listen else None
    overrides["tenants"] = _tenants(args.tenant)
    return overrides


def load(args: argparse.Namespace):
    from kvbudget.daemon.config.loading import load_config
    from kvbudget.daemon.config.settings import ConfigError

    try:
        # --check-config also looks at what the start would use on this host: whether the
        # log could be created and written where it is set, and the listen sockets (as the
        # user running the check; the start itself finds out by doing it).
        return load_config(args.config, _overrides(args), check_paths=bool(getattr(args, "check_config", False)))
    except ConfigError as exc:
        # Every mistake on a line of its own, as the one a single mistake gets.
        problems = getattr(exc, "problems", (exc,))
        for problem in problems[:-1]:
            print(f"kvbudget daemon: error: {problem}", file=sys.stderr)
        raise CLIError(str(problems[-1])) from None
    except OSError as exc:
        raise CLIError(f"--config: {exc.strerror or exc}: {args.config}") from None


# Where a packaged daemon's config lives (deploy/kvbudget.toml installs there): read when
# `--config` is not given and the file exists, so `kvbudget daemon` on a host set up by the
# operator's guide runs with its config. KVBUDGET_CONFIG (the systemd unit's variable) names
# another default, which then must exist.
DEFAULT_CONFIG_PATH = "/etc/kvbudget/kvbudget.toml"
CONFIG_ENV = "KVBUDGET_CONFIG"


def config_path(given: str | None) -> str | None:
    """The config file to read: `--config`, else $KVBUDGET_CONFIG, else the default path
    when it exists (None: no file, flags and defaults only)."""
    if given is not None:
        return given
    named = os.environ.get(CONFIG_ENV)
    if named:
        if not os.path.exists(named):
            raise CLIError(f"{CONFIG_ENV}={named}: no such file (unset it, or give --config)")
        return named
    return DEFAULT_CONFIG_PATH if os.path.exists(DEFAULT_CONFIG_PATH) else None


# journald's priority of each logging level (sd-daemon(3): <2> crit .. <7> debug).
_JOURNAL_PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6, logging.DEBUG: 7}


class JournalFormatter(logging.Formatter):
    """Each line led by `<N>`: journald files a line at that priority, so `journalctl -p
    warning` shows the daemon's warnings (without it every line is info). Every line, as
    journald reads each line of a stream as its own entry (a traceback too)."""

    def format(self, record: logging.LogRecord) -> str:
        level = max((lv for lv in _JOURNAL_PRIORITY if lv <= record.levelno), default=logging.DEBUG)
        prefix = f"<{_JOURNAL_PRIORITY[level]}>"
        return "\n".join(prefix + line for line in super().format(record).split("\n"))


def stderr_is_journal() -> bool:
    """Whether stderr is the journal's stream: systemd sets JOURNAL_STREAM to its
    `device:inode`, and a redirect (`2>file` in ExecStart) makes it another file."""
    device, _, inode = os.environ.get("JOURNAL_STREAM", "").partition(":")
    try:
        stat = os.fstat(sys.stderr.fileno())
        return (stat.st_dev, stat.st_ino) == (int(device), int(inode))
    except (ValueError, OSError):
        return False


def _set_up_logging(level: str) -> None:
    # The root logger: the daemon's modules log under it, and `systemctl reload` may
    # change its level (server.log_level).
    handler = logging.StreamHandler(sys.stderr)
    formatter = JournalFormatter if stderr_is_journal() else logging.Formatter
    handler.setFormatter(formatter("kvbudget daemon: %(levelname)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])


def run(args: argparse.Namespace) -> int:
    args.config = config_path(args.config)
    config = load(args)
    _set_up_logging(config.log_level)
    from kvbudget.daemon.server import interpreter
    from kvbudget.daemon.server.lifecycle import Daemon
    from kvbudget.daemon.server.startup import StartupError

    from kvbudget.daemon.config.loading import load_config

    # SIGHUP reads the file again, the flags still over it (they were given once, at start).
    daemon = Daemon(config, on_ready=_settle_heap,
                    reload_config=functools.partial(load_config, args.config, _overrides(args)), owns_process=True)
    if args.check_config:
        from kvbudget.daemon.config.pool_setup import PoolSetupError, setup_pool, unservable

        try:
            setup = setup_pool(config, daemon.probe_gpu())
        except PoolSetupError as exc:
            raise CLIError(str(exc)) from None
        print(
            f"config OK: {setup.model.name}, {setup.num_blocks} blocks of {setup.sizing.block_size} tokens "
            f"({setup.num_blocks - 1} usable + the null block; from {setup.sizing.source}), "
            f"listen {', '.join(config.listen)}{tcp_access(config)}, log {config.db_path} "
            f"(kept: {_retention(config)})"
        )
        unfit = unservable(setup, config.max_num_batched_tokens)
        if unfit:  # on stderr, as the start logs it (and the block-size notes of setup_pool)
            logging.getLogger("kvbudget.daemon").warning("%s", unfit)
        if config.tokens_file:
            from kvbudget.daemon.config.tokens_file import tokens_file_warnings

            for warning in tokens_file_warnings(config.tokens_file, daemon.roles):
                print(f"warning: {warning}")
        if config.tls_key_file:
            from kvbudget.daemon.config.tls_files import key_file_warnings

            for warning in key_file_warnings(config.tls_key_file):
                print(f"warning: {warning}")
        for note in (_log_in_use(config.db_path), *_sockets_in_use(config)):
            if note:
                print(note)
        return 0
    import asyncio

    interpreter.set_switch_interval()
    try:
        return asyncio.run(daemon.serve())
    except StartupError as exc:
        raise CLIError(str(exc)) from None


def _log_in_use(db_path: str) -> str:
    """--check-config's note when a daemon holds the log's writer lock ("" when none): not
    an error, as the check is often run beside the daemon it is about (before a reload), but
    a daemon started with this config would refuse to start while that one runs. The lock
    is looked up, never taken: a daemon starting meanwhile must not find it held."""
    from kvbudget.daemon.log.lock import lock_holder, lock_path

    holder = lock_holder(db_path)
    if holder is None:
        return ""
    who = f"pid {holder.pid}" if holder.pid else "another process"
    return (f"note: log {db_path} is in use by a running daemon ({who} holds {lock_path(db_path)}): "
            "another daemon on this db_path refuses to start while it runs")


def _sockets_in_use(config: DaemonConfig) -> list[str]:
    """--check-config's notes for the unix sockets the running daemon that holds this
    config's log serves on (load_config let them pass: the check is run beside that daemon
    before a reload); as for the log, another daemon would refuse to start there."""
    from kvbudget.daemon.config.host import is_log_daemon, socket_server, unix_socket_paths

    notes = []
    for path in unix_socket_paths(config.listen):
        server = socket_server(path)
        if server is not None and is_log_daemon(server, config.db_path):
            notes.append(f"note: listen {path} is served by that running daemon (pid {server.pid}): "
                         "another daemon listening there refuses to start while it runs")
    return notes


def tcp_access(config: DaemonConfig) -> str:
    """How TCP callers get in, for --check-config: `, TCP over mutual TLS, roles from
    PATH`; "" without a TCP listener."""
    from kvbudget.daemon.config.listen import listen_kind

    if not any(listen_kind(address) == "tcp" for address in config.listen):
        return ""
    transport = "mutual TLS" if config.tls_client_ca_file else "TLS" if config.tls_enabled else "plaintext"
    if config.tokens_file:
        who = f"roles from {config.tokens_file}"
    elif config.tls_client_ca_file:
        who = f"every client {config.tls_client_ca_file} signed is admin"
    else:
        who = "every client that reaches it is admin"
    return f", TCP over {transport}, {who}"


def _retention(config: DaemonConfig) -> str:
    """The log's retention in words: `30 days or 10 GiB, whichever comes first`."""
    from kvbudget.units import format_bytes

    limits = []
    if config.retention_days:
        limits.append(f"{config.retention_days:g} days")
    if config.retention_max_rows:
        limits.append(f"{config.retention_max_rows:,} decisions")
    if config.retention_max_bytes:
        limits.append(format_bytes(config.retention_max_bytes, ".3g"))
    if not limits:
        return "forever"
    return limits[0] if len(limits) == 1 else f"{', '.join(limits[:-1])} or {limits[-1]}, whichever comes first"


def _settle_heap() -> None:
    """Start-up is done (the daemon calls this just before READY=1): see interpreter.py."""
    from kvbudget.daemon.server.interpreter import settle_heap

    settled = settle_heap()
    logging.getLogger("kvbudget.daemon").info(
        "heap settled: %d objects frozen, gc thresholds %s", settled.frozen_objects, settled.thresholds
    )
