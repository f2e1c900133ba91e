"""`kvbudget doctor`: sample a running daemon and say what limits it, and which knob to turn.

Exit status: 0 healthy, 1 a problem was found (the verdict is not "healthy", or a check
failed), 2 the daemon could not be asked (unreachable, refused, bad arguments).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING

from kvbudget.cli import doctor, doctor_samples
from kvbudget.cli.doctor_binds import binds_clause
from kvbudget.client.tls import channel_credentials, resolve_tls
from kvbudget.client.errors import CLIError
from kvbudget.client.target import (
    add_target_arguments,
    call_metadata,
    channel,
    check_target,
    resolve_target,
    resolve_token,
    rpc_error_line,
)
from kvbudget.units import format_duration

if TYPE_CHECKING:
    import grpc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser, token_help="bearer token for TCP (observer role is enough)")
    parser.add_argument("--samples", type=int, default=5, help="snapshots to take (default %(default)s)")
    parser.add_argument(
        "--interval", type=float, default=1.0, help="seconds between snapshots (default %(default)s)"
    )
    parser.add_argument(
        "--config", metavar="FILE", help="the daemon's TOML config: also check the pool size it implies"
    )
    parser.add_argument("--json", action="store_true", help="print the diagnosis as JSON")


def run(args: argparse.Namespace) -> int:
    if args.samples < 1:
        raise CLIError(f"--samples must be at least 1, got {args.samples}")
    if not 0 <= args.interval <= 3600:  # (nan fails both; an hour between samples is a typo)
        raise CLIError(f"--interval must be 0 to 3600 seconds, got {args.interval}")

    target = check_target(resolve_target(args.target))
    credentials = channel_credentials(resolve_tls(target, args.tls_ca, args.tls_cert, args.tls_key))
    messages = sample_snapshots(target, resolve_token(args.token), credentials, args.samples, args.interval)
    samples = [doctor_samples.sample_from_snapshot(m) for m in messages]
    expected = None
    if args.config:
        from kvbudget.cli.doctor_config import config_expectation

        expected = config_expectation(args.config, samples[-1])
    diagnosis = doctor.diagnose(samples, expected)
    if args.json:
        print(json.dumps(json_report(diagnosis, target), indent=2))
    else:
        print(render(diagnosis, target))
    return 0 if diagnosis.ok else 1


def json_report(diagnosis: doctor_samples.Diagnosis, target: str) -> dict[str, object]:
    """What `--json` prints: the target asked, then the diagnosis. Every field is listed in
    docs/cli-reference.md (tests/test_doctor_json_fields.py keeps the two in step)."""
    return {"target": target, **diagnosis.as_dict()}


def sample_snapshots(
    target: str, token: str | None, credentials: grpc.ChannelCredentials | None, count: int, interval_s: float
) -> list[object]:
    """`count` GetSnapshot answers, `interval_s` apart; CLIError if the daemon cannot answer."""
    import grpc

    from kvbudget.v1 import observer_pb2, observer_pb2_grpc

    to_daemon = channel(target, credentials)
    metadata = call_metadata(token)
    stub = observer_pb2_grpc.ObserverServiceStub(to_daemon)
    messages: list[object] = []
    try:
        for index in range(count):
            if index:
                time.sleep(interval_s)
            try:
                response = stub.GetSnapshot(observer_pb2.GetSnapshotRequest(), metadata=metadata, timeout=5.0)
            except grpc.RpcError as exc:
                raise CLIError(rpc_error_line(target, exc)) from None
            messages.append(response.snapshot)
    finally:
        to_daemon.close()
    return messages


def render(diagnosis: doctor_samples.Diagnosis, target: str) -> str:
    """The human report: one line per check, the knob under each that has one, the verdict."""
    daemon = _daemon_facts(diagnosis)
    lines = [
        f"kvbudget doctor: {target}{f' ({daemon})' if daemon else ''}, "
        f"{diagnosis.num_samples} samples over {diagnosis.window_s:.1f} s",
        "",
    ]
    width = max(len(f.check) for f in diagnosis.findings)
    for finding in diagnosis.findings:
        lines.append(f"  {finding.status.value:<8} {finding.check:<{width}}  {finding.summary}")
        # the verdict's knob is printed once, at the end
        if finding.knob and finding.knob != diagnosis.knob and finding.status.value in ("warn", "problem"):
            lines.append(f"  {'':<8} {'':<{width}}  -> {finding.knob}")
    lines.append("")
    problems = [f.check for f in diagnosis.findings if f.status is doctor_samples.Status.PROBLEM]
    if problems and diagnosis.verdict is doctor_samples.Verdict.HEALTHY:
        # Nothing limits admission, yet the exit status is 1: say why beside "healthy".
        lines.append(f"verdict: {diagnosis.verdict.value} (nothing limits admission), "
                     f"but {len(problems)} check{'s' if len(problems) > 1 else ''} found a problem: "
                     f"{', '.join(problems)} (above)")
    elif diagnosis.because:
        lines.append(f"verdict: {diagnosis.verdict.value}: {binds_clause(diagnosis.binds, diagnosis.because)}")
    else:
        lines.append(f"verdict: {diagnosis.verdict.value}")
    if diagnosis.knob:
        lines.append(f"knob:    {diagnosis.knob}")
    return "\n".join(lines)


def _daemon_facts(diagnosis: doctor_samples.Diagnosis) -> str:
    """"daemon 0.4.0, up 2h13m": which daemon answered (a host still on an old version after
    an upgrade; one that restarted a minute ago). What it does not say is left out."""
    facts = []
    if diagnosis.daemon_version:
        facts.append(f"daemon {diagnosis.daemon_version}")
    if diagnosis.daemon_uptime_s is not None:
        facts.append(f"up {format_duration(diagnosis.daemon_uptime_s)}")
    return ", ".join(facts)
