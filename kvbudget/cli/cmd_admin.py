"""`kvbudget admin`: operator actions on a running daemon: policy, tenant quotas, drain, status.

Each action is one call, said in one line (or JSON); the examples, roles and exit codes
are `--help`'s (EPILOG).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import TYPE_CHECKING, Any

from kvbudget.client.tls import channel_credentials, resolve_tls
from kvbudget.client.errors import CLIError
from kvbudget.client.pool_parts import pool_parts  # shared with the dashboard (no textual)
from kvbudget.client.target import (
    add_target_arguments,
    call_metadata,
    channel,
    check_target,
    resolve_target,
    resolve_token,
    rpc_error_line,
)
from kvbudget.client.tenants import tenants_folded  # shared with the dashboard (no textual)

if TYPE_CHECKING:
    import grpc

# The daemon's own names (kvbudget.daemon.wire.convert.POLICY_NAMES); spelled out here so that
# `--help` imports neither grpc nor the daemon package. A test keeps the two equal.
POLICY_NAMES = ("optimistic", "guaranteed", "predictive", "naive")
CALL_TIMEOUT_S = 10.0
DRAIN_POLL_S = 0.2


# `--help`'s epilog, shown as written (RawDescriptionHelpFormatter).
EPILOG = """\
    kvbudget admin status                              # one screen: policy, blocks, requests, tenants
    kvbudget admin set-policy guaranteed               # prints "policy: optimistic -> guaranteed"
                                                       #   and what the switch did to the queue
    kvbudget admin set-policy naive --yes              # even if it rejects waiting requests
    kvbudget admin set-quota team-a --max-share 0.25 --weight 2
    kvbudget admin set-quota team-a --max-share 0      # clears team-a's quota
    kvbudget admin drain --wait --timeout 120          # stop admitting, wait for running requests
    kvbudget admin --target gpu7:50051 --token $ADMIN_TOKEN --json set-policy predictive
    kvbudget admin --target gpu7:50051 --token $ADMIN_TOKEN --tls-ca ca.pem \\
        --tls-cert me.pem --tls-key me.key status      # a daemon with tls_client_ca_file

Over the unix socket every caller may do everything (the socket's file mode is the guard);
over TCP the token must have the admin role (`status` only needs an observer token).
A drain cannot be undone: restart the daemon to admit again. A policy or quota set here
lasts until the daemon restarts, or a reload whose config file changes that value.

Exit status: 0 done; 1 `drain --wait` timed out with requests still running; 2 bad
arguments, or the daemon could not be reached or refused the call."""


def _share(text: str) -> float:
    """A pool share for --max-share: 0 (no quota) up to 1 (the whole pool)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1, got {text!r}") from None
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (0 clears the quota), got {text}")
    return value


def _weight(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0.0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0.0:
        raise argparse.ArgumentTypeError(f"must be 0 (no limit) or more seconds, got {text}")
    return value


def _connection_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """--target, --token, --tls-ca, --tls-cert, --tls-key, --json. Accepted before and after
    the action: the action's copies default to SUPPRESS so they never overwrite what was
    given before it."""
    add_target_arguments(
        parser, token_help="bearer token for TCP, admin role (status: any role)", suppress=not defaults
    )
    json_default = False if defaults else argparse.SUPPRESS
    parser.add_argument("--json", action="store_true", default=json_default, help="print the result as JSON")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    _connection_options(parser, defaults=True)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    status_parser = actions.add_parser("status", help="policy, blocks, requests, tenants, draining")
    status_parser.add_argument(
        "--config", metavar="FILE", default=None,
        help="say where the live settings differ from this config file (default: the daemon's: "
        "$KVBUDGET_CONFIG, else /etc/kvbudget/kvbudget.toml when it exists)",
    )  # fmt: skip
    _connection_options(status_parser, defaults=False)

    policy = actions.add_parser("set-policy", help="switch the admission policy for new requests")
    policy.add_argument("policy", choices=POLICY_NAMES, help="the new policy")
    policy.add_argument(
        "--yes", action="store_true",
        help="switch even if the new policy would reject waiting requests at once",
    )  # fmt: skip
    _connection_options(policy, defaults=False)

    quota = actions.add_parser("set-quota", help="a tenant's maximum pool share and fair-share weight")
    quota.add_argument("tenant", help="tenant name, as engines send it")
    quota.add_argument(
        "--max-share", type=_share, required=True, metavar="F", help="share of the pool, 0-1 (0: no quota)"
    )
    quota.add_argument(
        "--weight", type=_weight, default=1.0, metavar="W", help="fair-share weight, > 0 (default %(default)s)"
    )
    _connection_options(quota, defaults=False)

    drain_parser = actions.add_parser("drain", help="stop admitting; running requests finish (cannot be undone)")
    drain_parser.add_argument("--wait", action="store_true", help="wait until no request is running")
    drain_parser.add_argument(
        "--timeout", type=_seconds, default=None, metavar="S", help="with --wait: give up after S seconds (0: never)"
    )
    _connection_options(drain_parser, defaults=False)


def run(args: argparse.Namespace) -> int:
    if args.action == "drain" and args.timeout is not None and not args.wait:
        # (a drain cannot be undone: not started on a flag that does nothing without --wait)
        raise CLIError("drain --timeout: only with --wait")
    target = check_target(resolve_target(args.target))
    credentials = channel_credentials(resolve_tls(target, args.tls_ca, args.tls_cert, args.tls_key))
    with AdminConnection(target, resolve_token(args.token), credentials) as daemon:
        if args.action == "status":
            result, text, code = status(daemon, args.config)
        elif args.action == "set-policy":
            from kvbudget.cli.admin_policy import confirm_switch, set_policy

            if not args.yes:
                confirm_switch(daemon, args.policy)
            result, text, code = set_policy(daemon, args.policy)
        elif args.action == "set-quota":
            result, text, code = set_quota(daemon, args.tenant, args.max_share, args.weight)
        else:
            result, text, code = drain(daemon, args.wait, args.timeout or 0.0)
    if args.json:
        print(json.dumps({"target": target, "action": args.action, **result}, indent=2))
    else:
        print(text)
    return code


class AdminConnection:
    """One channel to the daemon; each call returns the response or raises a one-line CLIError."""

    def __init__(self, target: str, token: str | None, credentials: grpc.ChannelCredentials | None) -> None:
        from kvbudget.v1 import admin_pb2_grpc, observer_pb2_grpc

        self.target = target
        self._metadata = call_metadata(token)
        self._channel = channel(target, credentials)
        self.admin = admin_pb2_grpc.AdminServiceStub(self._channel)
        self.observer = observer_pb2_grpc.ObserverServiceStub(self._channel)

    def __enter__(self) -> AdminConnection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._channel.close()

    def call(self, method: Any, request: Any) -> Any:
        import grpc

        try:
            return method(request, metadata=self._metadata, timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as exc:
            raise CLIError(rpc_error_line(self.target, exc)) from None

    def snapshot(self) -> Any:
        from kvbudget.v1 import observer_pb2

        return self.call(self.observer.GetSnapshot, observer_pb2.GetSnapshotRequest()).snapshot


# Each action returns (JSON fields, text for a person, exit status).
Outcome = tuple[dict[str, Any], str, int]


def set_quota(daemon: AdminConnection, tenant: str, max_share: float, weight: float) -> Outcome:
    from kvbudget.v1 import admin_pb2

    request = admin_pb2.SetTenantQuotaRequest(tenant=tenant, max_share=max_share, weight=weight)
    daemon.call(daemon.admin.SetTenantQuota, request)
    # Read it back: the snapshot says what the daemon now enforces, in blocks.
    snapshot = daemon.snapshot()
    # (a cut list's last entry sums the tenants left out: not the tenant, whatever its name)
    listed = snapshot.tenants[:-1] if tenants_folded(snapshot) else snapshot.tenants
    state = next((t for t in listed if t.tenant == tenant), None)
    quota_blocks = state.quota_blocks if state is not None else None if max_share else 0
    result = {"tenant": tenant, "max_share": max_share, "weight": weight, "quota_blocks": quota_blocks}
    if max_share and quota_blocks is None:  # set, but not in the snapshot's list to read back
        text = f"tenant {tenant}: max share {max_share:g} of {snapshot.num_blocks} blocks, weight {weight:g}"
    elif max_share:
        text = (
            f"tenant {tenant}: max share {max_share:g} "
            f"({quota_blocks} of {snapshot.num_blocks} blocks), weight {weight:g}"
        )
    else:
        text = f"tenant {tenant}: no quota, weight {weight:g}"
    return result, text, 0


def drain(daemon: AdminConnection, wait: bool, timeout_s: float) -> Outcome:
    from kvbudget.v1 import admin_pb2

    running = daemon.call(daemon.admin.Drain, admin_pb2.DrainRequest()).running
    if wait:
        deadline = time.monotonic() + timeout_s if timeout_s else math.inf
        while running and time.monotonic() < deadline:
            time.sleep(DRAIN_POLL_S)
            running = daemon.snapshot().num_running
    result = {"draining": True, "running": running}
    if not running:
        return result, "draining: no request running", 0
    text = f"draining: {running} request{'s' if running != 1 else ''} still running"
    if wait:
        return result, f"{text} after {timeout_s:g} s", 1
    return result, text, 0


def status(daemon: AdminConnection, config: str | None = None) -> Outcome:
    """The status, and where its live settings differ from the config file (`config`, else
    the one the daemon reads by default, if any)."""
    from kvbudget.cli import admin_file
    from kvbudget.cli.cmd_daemon import config_path

    path = config_path(config)
    s = daemon.snapshot()
    fields, lines = admin_file.compared(s, path, given=config is not None)
    return {**status_fields(s), **fields}, "\n".join([render_status(s, daemon.target), *lines]), 0


def status_fields(s: Any) -> dict[str, Any]:
    """The snapshot's operator-facing figures, as plain JSON values.

    "blocks": held, reserved, cached and free are the text's four figures, the pool split as
    the dashboard's pool panel splits it (they add up to "total"; kvbudget.client.pool_parts),
    under the same words: "free" was the daemon's free count once, 4,095 in JSON where the
    text said 350 free. That count is "not_held" (it takes in reserved and evictable cached
    blocks); "evictable" is every evictable block (a promise may have taken some: "cached"
    is what is left). "parts" repeats the four, for scripts that read it."""
    from kvbudget.daemon.wire import convert

    folded = tenants_folded(s)
    parts = pool_parts(s)
    return {
        "model": s.plan.model,
        "policy": convert.policy_from_proto(s.policy) or "unknown",
        "draining": s.draining,
        "blocks": {
            "total": s.num_blocks,
            **parts._asdict(),  # held, reserved, cached, free: the text's words and numbers
            "not_held": s.num_free_blocks,
            "evictable": s.num_evictable_blocks,
            "parts": parts._asdict(),
        },
        "requests": {"running": s.num_running, "waiting": s.num_waiting, "preemptions": s.num_preemptions,
                     # why the waiting ones wait: what their last try lacked (queue_ahead: not tried)
                     "waiting_by_reason": dict(sorted(s.waiting_by_reason.items(), key=lambda kv: -kv[1]))},
        # decisions a failed write left (a full disk): while any wait, steps are refused
        "decision_log": {"unwritten": s.decision_log.num_unwritten_decisions,
                         "write_error": s.decision_log.write_error},
        # The daemon lists at most 100 tenants besides the configured ones; past that its last
        # entry, "(other)", sums the rest: given apart (other_tenants), never as a tenant.
        "num_tenants": max(s.num_tenants, len(s.tenants)),
        "tenants": [_tenant_fields(t) for t in (s.tenants[:-1] if folded else s.tenants)],
        "other_tenants": (
            {"tenants": folded, **{k: v for k, v in _tenant_fields(s.tenants[-1]).items()
                                   if k not in ("tenant", "quota_blocks", "weight")}}
            if folded else None
        ),
        "engines": [
            {"engine_id": e.engine_id, "blocks_held": e.blocks_held, "running": e.running, "waiting": e.waiting}
            for e in s.engines
        ],
    }


def _tenant_fields(t: Any) -> dict[str, Any]:
    return {
        "tenant": t.tenant,
        "blocks_held": t.blocks_held,
        "blocks_reserved": t.blocks_reserved,
        "quota_blocks": t.quota_blocks,
        "weight": t.weight,
        "running": t.running,
        "waiting": t.waiting,
    }


def render_status(s: Any, target: str) -> str:
    """One screen: the figures an operator checks before and after an admin action."""
    f = status_fields(s)
    blocks, requests = f["blocks"], f["requests"]
    parts = blocks["parts"]
    usage = parts["held"] / blocks["total"] if blocks["total"] else 0.0
    lines = [
        f"kvbudget daemon at {target}: {f['model'] or 'unknown model'}",
        f"  policy     {f['policy']}{'  (DRAINING: no new requests)' if f['draining'] else ''}",
        # the dashboard's four parts, in its order: each block counted once
        f"  blocks     {blocks['total']} total: {parts['held']} held ({usage:.0%}), {parts['reserved']} reserved, "
        f"{parts['cached']} cached, {parts['free']} free",
        f"  requests   {requests['running']} running, {requests['waiting']} waiting"
        + (" (" + ", ".join(f"{n} {why}" for why, n in requests["waiting_by_reason"].items()) + ")"
           if requests["waiting_by_reason"] else "")
        + f", {requests['preemptions']} preemptions",
    ]
    if f["decision_log"]["unwritten"]:
        lines.append(
            f"  log        CANNOT WRITE ({f['decision_log']['write_error']}): "
            f"{f['decision_log']['unwritten']} decisions wait, steps are refused"
        )
    other = f["other_tenants"]
    if f["tenants"] or other:
        if other:  # a cut list: say how many there are and how many rows stand for them
            lines.append(f"  tenants    {f['num_tenants']} in all: {len(f['tenants'])} listed, "
                         f"the other {other['tenants']} summed")
        label = "           " if other else "  tenants  "
        lines.append(f"{label}  name              held  reserved  quota  weight  running  waiting")
        for t in f["tenants"]:
            quota = str(t["quota_blocks"]) if t["quota_blocks"] else "-"
            lines.append(
                f"             {t['tenant'] or '(default)':<16} {t['blocks_held']:>5} {t['blocks_reserved']:>9} "
                f"{quota:>6} {t['weight']:>7g} {t['running']:>8} {t['waiting']:>8}"
            )
        if other:
            lines.append(
                f"             {'+' + str(other['tenants']) + ' more':<16} {other['blocks_held']:>5} "
                f"{other['blocks_reserved']:>9} {'-':>6} {'':>7} {other['running']:>8} {other['waiting']:>8}"
            )
    engines = f["engines"]
    names = ", ".join(e["engine_id"] for e in engines[:6]) + (", ..." if len(engines) > 6 else "")
    lines.append(f"  engines    {len(engines)}{': ' + names if engines else ''}")
    return "\n".join(lines)
