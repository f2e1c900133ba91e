"""A replay's numbers: per-request timings and a time series in, a summary out.

Definitions (all in the replay's virtual seconds, origin = the earliest arrival):
- wait: first admission minus arrival (includes time queued in the engine and the daemon);
- ttft: first output token minus arrival;
- makespan: end of the last step (the last request finished or rejected);
- mean_running / mean_kv_usage: time-weighted over the makespan; kv usage is held blocks
  (the pool minus free and evictable-cached ones) over the pool;
- prefix_hit_ratio: prefix blocks reused / full prompt blocks looked up, at each request's
  first admission (a preempted request finding its own blocks again is not a hit);
- prefill_tokens_recomputed: prefill tokens computed beyond what each request's first
  admission left to compute (recomputes after preemptions; JSON only);
- percentiles interpolate linearly between order statistics (numpy's default).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from kvbudget.traces.sim_request import FINISHED, LOST, REJECTED
from kvbudget.traces.simulation import Sample, SimRun

if TYPE_CHECKING:
    from kvbudget.traces.replay import ReplaySetup

SUMMARY_FIELDS = (
    "requests", "finished", "rejected", "preemptions", "wait_p50_s", "wait_p99_s",
    "ttft_p50_s", "ttft_p99_s", "peak_running", "mean_running", "mean_kv_usage",
    "makespan_s", "output_tokens_per_s", "prefix_hit_ratio",
)  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class ReplayResult:
    summary: dict[str, object]
    samples: tuple[Sample, ...] = field(default=(), repr=False)

    @property
    def policy(self) -> str:
        return str(self.summary.get("policy", ""))

    @property
    def label(self) -> str:
        """The run's name in tables and plots: its --compare label, else its policy."""
        return str(self.summary.get("variant") or self.policy or self.summary.get("mode", "replay"))

    def to_json(self) -> dict[str, object]:
        return dict(self.summary)


def summarize(
    run: SimRun, *, policy: str, trace: str, mode: str, setup: ReplaySetup, wall_s: float
) -> ReplayResult:
    requests = run.requests
    finished = [r for r in requests if r.state == FINISHED]
    waits = [r.admitted_s - r.arrival_s for r in requests if r.admitted_s is not None]
    ttfts = [r.first_token_s - r.arrival_s for r in requests if r.first_token_s is not None]
    makespan = run.end_s
    output_tokens = sum(r.output for r in finished)
    hit = sum(r.hit_blocks for r in requests)
    queried = sum(r.query_blocks for r in requests)
    summary: dict[str, object] = {
        "trace": trace,
        "mode": mode,
        "policy": policy,
        "model": setup.model,
        "num_blocks": setup.num_blocks,
        "block_size": setup.layout.block_size,
        "engines": setup.engines,
        "max_new_tokens": run.max_new_tokens,
        "requests": len(requests),
        "finished": len(finished),
        "rejected": sum(1 for r in requests if r.state == REJECTED),
        "lost": sum(1 for r in requests if r.state == LOST),
        "unfinished": run.stalled,
        "preemptions": run.decisions_by_kind.get("preempt", 0),
        "wait_p50_s": round(percentile(waits, 50), 3),
        "wait_p99_s": round(percentile(waits, 99), 3),
        "ttft_p50_s": round(percentile(ttfts, 50), 3),
        "ttft_p99_s": round(percentile(ttfts, 99), 3),
        "peak_running": run.peak_running,
        "mean_running": round(run.running_area / makespan, 2) if makespan else 0.0,
        "mean_kv_usage": round(run.usage_area / makespan, 4) if makespan else 0.0,
        "makespan_s": round(makespan, 3),
        "output_tokens_per_s": round(output_tokens / makespan, 1) if makespan else 0.0,
        "prefix_hit_ratio": round(hit / queried, 4) if queried else 0.0,
        "prefill_tokens_recomputed": sum(max(0, r.prefilled - r.first_prefill) for r in requests),
        "steps": run.steps,
        "calls": run.calls,
        "wall_s": round(wall_s, 3),
        "decisions_by_kind": dict(sorted(run.decisions_by_kind.items())),
    }
    if mode == "live":
        summary["decisions"] = run.decisions
    else:
        summary["settings"] = run_settings(setup)
    return ReplayResult(summary, tuple(run.samples))


def run_settings(setup: ReplaySetup) -> dict[str, object]:
    """The admission settings that differ from the daemon's defaults (however given: a
    config file, --set, a --compare run), and the engine's grow-ahead."""
    from dataclasses import fields

    from kvbudget.daemon.core.admission import AdmissionConfig

    defaults = {f.name: f.default for f in fields(AdmissionConfig)}
    given = {k: v for k, v in sorted(setup.admission) if defaults.get(k) != v}
    if setup.engine.engine_model != "decodes-first":  # (the default's settings read as before)
        return {**given, "engine_model": setup.engine.engine_model}
    return {**given, "grow_ahead_blocks": setup.engine.grow_ahead_blocks}


# ---------------------------------------------------------------------- rendering

TABLE_ROWS = SUMMARY_FIELDS + ("decisions", "steps", "calls", "wall_s")


def as_json(results: list[ReplayResult]) -> str:
    if len(results) == 1:
        return json.dumps(results[0].to_json(), indent=2)
    return json.dumps([r.to_json() for r in results], indent=2)


def render_table(results: list[ReplayResult]):
    """A rich Table: one column per run (policy), one row per figure."""
    from rich.table import Table

    first = results[0].summary
    title = f"{first.get('trace', '')} · {first.get('model', '')} · {first.get('num_blocks')} blocks"
    if "variant" in first:
        title += f" · {first.get('mode')}"
    table = Table(title=title, title_justify="left")
    table.add_column("")
    for r in results:
        # --compare's runs by their labels (the mode is in the title), a lone run by its policy
        table.add_column(r.label if "variant" in r.summary else f"{r.policy or '?'} ({r.summary.get('mode')})",
                         justify="right")  # fmt: skip
    for key in TABLE_ROWS:
        if not any(key in r.summary for r in results):
            continue
        table.add_row(key, *[_fmt(r.summary.get(key, "")) for r in results])
    return table


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".") if value else "0"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def samples_as_dicts(samples: tuple[Sample, ...]) -> list[dict[str, float]]:
    return [asdict(s) for s in samples]
