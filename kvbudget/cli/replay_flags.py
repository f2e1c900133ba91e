"""Reading `kvbudget replay`'s flags: numbers with one-line errors, the policies, and the
simulated engine they describe (offline and live alike)."""

from __future__ import annotations

import argparse

from kvbudget.client.errors import CLIError

POLICY_NAMES = ("optimistic", "guaranteed", "predictive", "naive")


# Counts past these are mistakes, not what-ifs: `--engines 2147483648` built engines until
# memory ran out. Any other integer flag stops at the wire's int64.
MAXIMUMS = {"--engines": 1024}
MAX_INT64 = 2**63 - 1


def int_flag(text: str | None, flag: str, *, minimum: int = 1) -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:  # (also an integer of more than 4,300 digits)
        raise CLIError(f"{flag} {_shown(text)}: expected an integer") from None
    if value < minimum:
        raise CLIError(f"{flag} must be >= {minimum}, got {_shown(text)}")
    maximum = MAXIMUMS.get(flag, MAX_INT64)
    if value > maximum:
        raise CLIError(f"{flag} must be at most {maximum:,}, got {_shown(text)}")
    return value


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 40 else f"{text[:30]!r}... ({len(text):,} characters)"


def float_flag(text: str | None, flag: str, *, positive: bool = False) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise CLIError(f"{flag} {text!r}: expected a number") from None
    if not (value == value and value != float("inf")) or value < 0 or (positive and value == 0):
        raise CLIError(f"{flag} must be {'> 0' if positive else '>= 0'} and finite, got {text!r}")
    return value


# Live, each ask is a round trip, so asking further ahead buys speed; offline, asking ahead
# costs nothing but ties up blocks, which on tight pools shows up as preemptions
# (docs/replay-compare.md's Azure gpt-oss-120b run at 3,000 blocks: 25 optimistic
# preemptions and 1,060 output tok/s at 4 blocks ahead, 63 and 928 at 16).
LIVE_GROW_AHEAD_BLOCKS = 16
OFFLINE_GROW_AHEAD_BLOCKS = 4


def add_engine_model(group) -> None:
    group.add_argument(
        "--engine-model", choices=("decodes-first", "vllm"), default="decodes-first",
        help="how a step is built: decodes-first (grows a token at a time, decodes before prefills) "
        "or vllm (as vLLM 0.33 under kvbudget.vllm.Scheduler: a block at a time, in vLLM's order; "
        "docs/vllm.md)",
    )


def grow_ahead_blocks(args: argparse.Namespace) -> int:
    if getattr(args, "engine_model", None) == "vllm":  # (it grows to the end of a block, as the adapter)
        if args.grow_ahead_blocks is not None:
            raise CLIError("--grow-ahead-blocks: the vllm engine model grows to the end of each block, "
                           "as kvbudget.vllm does; drop it")
        return 0
    if args.grow_ahead_blocks is None:
        return OFFLINE_GROW_AHEAD_BLOCKS if args.offline else LIVE_GROW_AHEAD_BLOCKS
    return int_flag(args.grow_ahead_blocks, "--grow-ahead-blocks", minimum=0) or 0


def engine_config(args: argparse.Namespace, trace, *, max_model_len: int, max_num_batched_tokens: int):
    from kvbudget.traces.sim_engine import EngineConfig

    try:
        return EngineConfig(
            max_num_seqs=int_flag(args.max_num_seqs, "--max-num-seqs") or 256,
            max_num_batched_tokens=max_num_batched_tokens,
            step_base_s=(float_flag(args.step_base_ms, "--step-base-ms") or 0.0) / 1e3,
            per_prefill_token_s=(float_flag(args.per_prefill_token_us, "--per-prefill-token-us") or 0.0) / 1e6,
            per_decode_seq_s=(float_flag(args.per_decode_seq_us, "--per-decode-seq-us") or 0.0) / 1e6,
            grow_ahead_blocks=grow_ahead_blocks(args),
            max_model_len=max_model_len,
            engine_model=getattr(args, "engine_model", None) or "decodes-first",
            # The whole file's longest output, not the slice's: what the service evidently
            # capped at, so a what-if does not change with --start / --limit.
            max_new_tokens=int_flag(args.max_new_tokens, "--max-new-tokens") or trace.max_output_tokens or None,
        )
    except ValueError as exc:
        raise CLIError(str(exc)) from None


def settable_keys() -> dict[str, type]:
    """The daemon's [admission] keys an offline replay takes (by --set, --compare), with
    their kinds: all but those with flags of their own (--policy / --compare,
    --no-prefix-caching)."""
    from kvbudget.daemon.config.settings import KEYS

    own_flags = ("policy", "enable_prefix_caching")
    return {k.name: k.kind for k in KEYS if k.section == "admission" and k.name not in own_flags}


def parse_setting(kind: type, key: str, text: str, *, where: str) -> object:
    """One setting's text as its kind; `where` starts the one-line error."""
    if kind is bool:
        if text.lower() not in ("true", "false"):
            raise CLIError(f"{where}: expected true or false, got {text!r}")
        return text.lower() == "true"
    try:
        return kind(text)
    except ValueError:
        expected = "an integer" if kind is int else "a number"
        raise CLIError(f"{where}: expected {expected}, got {text!r}") from None


def admission_settings(values: list[str] | None) -> tuple[tuple[str, object], ...]:
    """`--set admission.KEY=VALUE` (repeatable), as (AdmissionConfig field, value) pairs."""
    kinds = settable_keys()
    out: dict[str, object] = {}
    for value in values or ():
        key, sep, text = value.partition("=")
        section, _, name = key.partition(".")
        if not sep or section != "admission" or name not in kinds:
            raise CLIError(f"--set {value!r}: expected admission.KEY=VALUE, KEY one of {', '.join(kinds)}")
        out[name] = parse_setting(kinds[name], name, text, where=f"--set {key}")
    return tuple(out.items())
