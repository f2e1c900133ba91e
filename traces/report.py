"""Plots and JSON of one or more replays (one line per run), written into a folder.

`<name>.png`: free blocks, running and waiting requests, and preemptions so far, over the
replay's virtual time. `<name>.json`: the summaries and the sampled time series.
matplotlib is imported here only, with the Agg backend (no display needed).

One slow run (`naive` can take 20x the others' makespan) would squeeze the others into a
sliver of the time axis: the axis is then cut where the others end, and the legend gives
the cut runs' makespans (their JSON series are whole).
"""

from __future__ import annotations

import json
from pathlib import Path

from kvbudget.traces.results import ReplayResult, samples_as_dicts

PANELS = (
    ("free_blocks", "free blocks"),
    ("running", "running requests"),
    ("waiting", "waiting requests"),
    ("preemptions", "preemptions so far"),
)
OUTLIER_RATIO = 3.0  # a makespan this many times the next longer one's is cut off


def time_axis_end(makespans: list[float]) -> float | None:
    """Where to cut the time axis, or None for all of it: just past the longest makespan
    that is not OUTLIER_RATIO times beyond the next shorter one (at the widest such gap)."""
    ordered = sorted(m for m in makespans if m > 0)
    gaps = [(ordered[i + 1] / ordered[i], ordered[i]) for i in range(len(ordered) - 1)]
    ratio, below = max(gaps, default=(1.0, 0.0))
    return below * 1.05 if ratio >= OUTLIER_RATIO else None


def write_report(results: list[ReplayResult], out_dir: str | Path, *, name: str = "replay") -> list[Path]:
    """Write `<name>.png` and `<name>.json` into `out_dir` (created); returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    png = folder / f"{name}.png"
    data = folder / f"{name}.json"

    makespans = [float(r.summary.get("makespan_s") or 0.0) for r in results]  # type: ignore[arg-type]
    end = time_axis_end(makespans)
    figure, axes = plt.subplots(len(PANELS), 1, figsize=(12, 2.4 * len(PANELS)), sharex=True)
    tops = [0.0] * len(PANELS)
    for result, makespan in zip(results, makespans):
        # The totals in the legend: runs with no preemption all lie on the panel's axis.
        label = f"{result.label}: {result.summary.get('preemptions', 0):,} preemptions"
        if end is not None and makespan > end:
            label += f", makespan {makespan:,.0f} s (cut)"
        shown = [s for s in result.samples if end is None or s.time_s <= end]
        times = [s.time_s for s in result.samples]
        for i, (axis, (field, _)) in enumerate(zip(axes, PANELS)):
            values = [getattr(s, field) for s in result.samples]
            axis.plot(times, values, label=label, linewidth=1.0)
            tops[i] = max([tops[i], *(getattr(s, field) for s in shown)])
    for axis, (_, title), top in zip(axes, PANELS, tops):
        axis.set_ylabel(title)
        axis.grid(True, alpha=0.3)
        if end is not None:  # the y range of what is shown, not of the cut-off tail
            axis.set_ylim(0, top * 1.05 or 1)
    # Beside the plots, not over the lines.
    axes[0].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
    if end is not None:
        axes[-1].set_xlim(0, end)
        axes[-1].set_xlabel(f"replay time (s), cut at {end:,.0f} s: the runs marked 'cut' go on")
    else:
        axes[-1].set_xlabel("replay time (s)")
    first = results[0].summary if results else {}
    figure.suptitle(
        f"{first.get('trace', '')} · {first.get('model', '')} · {first.get('num_blocks', '')} blocks",
        fontsize="medium",
    )
    figure.tight_layout()
    # No version stamp in the file: the same run writes the same bytes.
    figure.savefig(png, dpi=100, bbox_inches="tight", metadata={"Software": None})
    plt.close(figure)

    payload = [
        {"summary": r.to_json(), "samples": samples_as_dicts(r.samples)} for r in results
    ]
    data.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    return [png, data]
