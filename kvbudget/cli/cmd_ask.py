"""`kvbudget ask`: how soon could a request of this shape be admitted by a running daemon?

One AskAdmission call (observer role), said in one line or JSON. The daemon changes
nothing to answer. What the figures mean and how a router uses them: docs/routing.md.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from kvbudget.client.target import add_target_arguments, check_target, resolve_target, resolve_token

EPILOG = """\
    kvbudget ask --prompt-tokens 2000 --max-tokens 500
    kvbudget ask --prompt-tokens 2000 --max-tokens 500 --tenant team-a --priority -1 --json
    kvbudget ask --target gpu7:50051 --token $OBSERVER_TOKEN --prompt-tokens 800 --step-s 0.035

Exit status: 0 answered (whatever the answer); 2 bad arguments, or the daemon could not be
reached or refused the call."""


def _whole(minimum: int, maximum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be between {minimum} and {maximum}, got {text}")
        return value

    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    add_target_arguments(parser, token_help="bearer token for TCP, observer role")
    parser.add_argument("--prompt-tokens", type=_whole(1, 2**32 - 1), required=True, metavar="N", help="prompt tokens")
    parser.add_argument(
        "--max-tokens", "--max-new-tokens", dest="max_tokens", type=_whole(0, 2**32 - 1), default=None, metavar="M",
        help="most output tokens (default: up to max_model_len)",
    )  # fmt: skip
    parser.add_argument("--tenant", default="", help="tenant, as engines send it")
    parser.add_argument("--priority", type=_whole(-(2**31), 2**31 - 1), default=0, metavar="P", help="lower is more important (default 0)")
    parser.add_argument(
        "--step-s", type=_seconds, default=0.0, metavar="S", help="a decode step's seconds (default: the daemon's 0.02)"
    )
    parser.add_argument("--json", action="store_true", help="print the answer as JSON")


def run(args: argparse.Namespace) -> int:
    from kvbudget.cli.cmd_admin import AdminConnection
    from kvbudget.client.tls import channel_credentials, resolve_tls
    from kvbudget.v1 import observer_pb2

    target = check_target(resolve_target(args.target))
    credentials = channel_credentials(resolve_tls(target, args.tls_ca, args.tls_cert, args.tls_key))
    request = observer_pb2.AskAdmissionRequest(
        prompt_tokens=args.prompt_tokens, max_new_tokens=args.max_tokens, tenant=args.tenant,
        priority=args.priority, step_s=args.step_s,
    )  # fmt: skip
    with AdminConnection(target, resolve_token(args.token), credentials) as daemon:
        answer = daemon.call(daemon.observer.AskAdmission, request)
    fields = answer_fields(answer)
    if args.json:
        print(json.dumps({"target": target, **fields}, indent=2))
    else:
        print(render(fields))
    return 0


def answer_fields(answer: Any) -> dict[str, Any]:
    names = ("admit_now", "reason", "final", "blocks_needed_total", "blocks_free", "blocks_spare",
             "blocks_reclaimable", "requests_ahead", "blocks_ahead", "wait_steps", "wait_s", "detail")  # fmt: skip
    fields = {name: getattr(answer, name) for name in names}
    fields["blocks_needed"] = list(answer.blocks_needed)
    return fields


def render(f: dict[str, Any]) -> str:
    if f["final"]:
        head = f"not here: {f['reason']}" + (f" ({f['detail']})" if f["detail"] else "")
    elif f["admit_now"]:
        head = "admitted now" + (" (prefix_hit)" if f["reason"] == "prefix_hit" else "")  # (else "fits")
    elif f["wait_steps"] >= 0:
        head = f"waits ({f['reason']}): about {f['wait_steps']} decode steps, {f['wait_s']:.2f} s"
    else:
        head = f"waits ({f['reason']}): longer than what runs now frees"
    ahead = f["requests_ahead"]
    return (
        f"{head}; needs {f['blocks_needed_total']} blocks; {f['blocks_free']} free, {f['blocks_spare']} spare, "
        f"{f['blocks_reclaimable']} cached; {ahead} request{'s' if ahead != 1 else ''} ahead "
        f"needing {f['blocks_ahead']}"
    )
