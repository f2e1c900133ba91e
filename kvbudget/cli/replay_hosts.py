"""`kvbudget replay --offline --hosts K --route round-robin,headroom`: one trace across K
simulated hosts, one run per routing strategy (traces/multi_host.py; docs/routing.md)."""

from __future__ import annotations

import argparse

from kvbudget.cli.replay_flags import int_flag
from kvbudget.client.errors import CLIError

STRATEGIES = ("round-robin", "headroom")  # traces.multi_host's (a test keeps them equal)


def add_arguments(group) -> None:
    group.add_argument("--hosts", metavar="K",
                       help="offline: K hosts, each its own pool and engine, behind a router (docs/routing.md)")
    group.add_argument("--route", metavar="round-robin,headroom",
                       help="with --hosts: the routing strategies to compare (both)")


def chosen(args: argparse.Namespace) -> tuple[int, list[str]] | None:
    """(hosts, strategies) when --hosts or --route is given, else None; misuse is one line."""
    if args.hosts is None and args.route is None:
        return None
    hosts = int_flag(args.hosts, "--hosts") or 1
    routes = [name.strip() for name in (args.route or ",".join(STRATEGIES)).split(",") if name.strip()]
    unknown = [name for name in routes if name not in STRATEGIES]
    if unknown or not routes:
        raise CLIError(f"--route: unknown strategy {', '.join(unknown) or '(none)'}; expected {','.join(STRATEGIES)}")
    if len(set(routes)) != len(routes):
        raise CLIError("--route: a strategy is named twice")
    if not args.offline:
        raise CLIError("--hosts / --route need --offline (the what-if simulates the hosts)")
    if args.compare:
        raise CLIError("--hosts runs one policy (--policy), compared across --route strategies: drop --compare")
    if (int_flag(args.engines, "--engines") or 1) != 1:
        raise CLIError("--hosts: one simulated engine per host; drop --engines")
    return hosts, routes


def run(trace, setup, policy: str, hosts: int, routes: list[str]):
    from kvbudget.daemon.core.admission import AdmissionError
    from kvbudget.traces.multi_host import run_hosts

    results = []
    for route in routes:
        try:
            result = run_hosts(trace.requests, setup, policy, hosts, route, trace_name=trace.name)
        except AdmissionError as exc:
            raise CLIError(f"--{exc.field.replace('_', '-')}: {exc}") from None
        result.summary["variant"] = f"{route} x{hosts}"
        result.summary["notes"] = list(setup.layout.notes)
        results.append(result)
    return results
