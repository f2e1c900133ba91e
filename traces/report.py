"""Plots and JSON of one or more replays (one line per policy), written into a folder.

`<name>.png`: free blocks, running and waiting requests over the replay's virtual time.
`<name>.json`: the summaries and the sampled time series.
matplotlib is imported here only, with the Agg backend (no display needed).
"""

from __future__ import annotations

import json
from pathlib import Path

from kvbudget.traces.results import ReplayResult, samples_as_dicts

PANELS = (
    ("free_blocks", "free blocks"),
    ("running", "running requests"),
    ("waiting", "waiting requests"),
)


def write_report(results: list[ReplayResult], out_dir: str | Path, *, name: str = "replay") -> list[Path]:
    """Write `<name>.png` and `<name>.json` into `out_dir` (created); returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    png = folder / f"{name}.png"
    data = folder / f"{name}.json"

    figure, axes = plt.subplots(len(PANELS), 1, figsize=(10, 2.6 * len(PANELS)), sharex=True)
    for result in results:
        label = result.policy or result.summary.get("mode", "replay")
        times = [s.time_s for s in result.samples]
        for axis, (field, _) in zip(axes, PANELS):
            axis.plot(times, [getattr(s, field) for s in result.samples], label=str(label), linewidth=1.0)
    for axis, (_, title) in zip(axes, PANELS):
        axis.set_ylabel(title)
        axis.grid(True, alpha=0.3)
    axes[0].legend(loc="upper right", fontsize="small")
    axes[-1].set_xlabel("replay time (s)")
    first = results[0].summary if results else {}
    figure.suptitle(
        f"{first.get('trace', '')} · {first.get('model', '')} · {first.get('num_blocks', '')} blocks",
        fontsize="medium",
    )
    figure.tight_layout()
    figure.savefig(png, dpi=110)
    plt.close(figure)

    payload = [
        {"summary": r.to_json(), "samples": samples_as_dicts(r.samples)} for r in results
    ]
    data.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    return [png, data]
