"""`kvbudget replay --compare`: the runs compared, each a policy with settings of its own.

One syntax, comma between runs, colon between a run's parts:

  --compare optimistic,predictive                          policies with the common settings
  --compare optimistic,optimistic:backfill_depth=0         a policy and KEY=VALUE settings
  --compare strict=optimistic:backfill_depth=0:watermark=0:grow_ahead_blocks=0,optimistic

KEY is an [admission] key of the daemon's config file (as --set takes it) or
grow_ahead_blocks (as --grow-ahead-blocks). A run's settings go over --config's and --set's;
its label (table, JSON `variant`, report legend) is its NAME= or else its text.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from kvbudget.cli.replay_flags import POLICY_NAMES, parse_setting, settable_keys
from kvbudget.client.errors import CLIError

SYNTAX = "[NAME=]POLICY[:KEY=VALUE...]"
ENGINE_KEYS = ("grow_ahead_blocks",)  # the simulated engine's, not the admission core's


@dataclass(frozen=True)
class Variant:
    label: str
    policy: str
    settings: tuple[tuple[str, object], ...] = ()  # admission keys, over --config / --set
    grow_ahead_blocks: int | None = None  # over --grow-ahead-blocks
    named: bool = False  # given with --compare (its label goes into the JSON)


def chosen_variants(args: argparse.Namespace) -> list[Variant]:
    """--compare's runs, or the one run --policy (or nothing: optimistic) asks for."""
    if args.compare is None:
        policy = args.policy or "optimistic"
        return [Variant(policy, policy)]
    if args.policy:
        raise CLIError("--policy and --compare exclude each other")
    items = [item.strip() for item in args.compare.split(",") if item.strip()]
    if not items:
        raise CLIError(f"--compare: no run given; expected {SYNTAX}, comma-separated")
    variants = [parse_variant(item) for item in items]
    labels = [v.label for v in variants]
    for label in labels:
        if labels.count(label) > 1:
            raise CLIError(f"--compare: {label!r} is given twice; name one of them (NAME=POLICY:...)")
    return variants


def parse_variant(item: str) -> Variant:
    head, *pairs = item.split(":")
    name, named, policy = head.rpartition("=")
    if named and not name.strip():
        raise CLIError(f"--compare {item!r}: empty name before '='; expected {SYNTAX}")
    policy = policy.strip()
    if policy not in POLICY_NAMES:
        raise CLIError(f"--compare {item!r}: unknown policy {policy or '(none)'}; "
                       f"choose from {', '.join(POLICY_NAMES)}")  # fmt: skip
    kinds = settable_keys()
    settings: dict[str, object] = {}
    grow_ahead: int | None = None
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip().removeprefix("admission.")
        if not sep or not key:
            raise CLIError(f"--compare {item!r}: {pair!r}: expected KEY=VALUE after the policy")
        if key in settings or (key in ENGINE_KEYS and grow_ahead is not None):
            raise CLIError(f"--compare {item!r}: {key} is given twice")
        if key == "grow_ahead_blocks":
            grow_ahead = _blocks(item, text)
        elif key in kinds:
            settings[key] = parse_setting(kinds[key], key, text.strip(), where=f"--compare {item!r}: {key}")
        else:
            raise CLIError(f"--compare {item!r}: unknown setting {key}; "
                           f"one of {', '.join([*kinds, *ENGINE_KEYS])}")  # fmt: skip
    label = name.strip() if named else item
    return Variant(label, policy, tuple(settings.items()), grow_ahead, named=True)


def _blocks(item: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise CLIError(f"--compare {item!r}: grow_ahead_blocks: expected an integer, got {text!r}") from None
    if value < 0:
        raise CLIError(f"--compare {item!r}: grow_ahead_blocks: must be >= 0, got {text!r}")
    return value
