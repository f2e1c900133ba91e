"""`kvbudget replay --offline --compare` with settings, as a user runs it (a subprocess):
each run is labelled, each is the run it would be alone, bad syntax is one line, exit 2;
`--report` plots preemptions and keeps a slow run from squeezing the others."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# A tight pool (799 usable blocks of llama-3.1-8b, ~12.8k tokens) so that the settings
# change the run: 200 Azure requests queue and preempt.
BASE = ["replay", "azure", "--offline", "--num-gpu-blocks", "800", "--max-model-len", "8192", "--limit", "200"]
STRICT = "strict=optimistic:backfill_depth=0:watermark=0:grow_ahead_blocks=0"


def kvbudget(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvbudget", *args], capture_output=True, text=True, timeout=300)


def _json(*args: str):
    done = kvbudget(*BASE, *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _same_run(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k not in ("wall_s", "variant")}


def test_each_variant_is_labelled_and_is_the_run_it_would_be_alone():
    runs = _json("--compare", f"optimistic,{STRICT},optimistic:backfill_depth=0,predictive")
    assert [r["variant"] for r in runs] == ["optimistic", "strict", "optimistic:backfill_depth=0", "predictive"]
    assert [r["policy"] for r in runs] == ["optimistic", "optimistic", "optimistic", "predictive"]
    assert runs[1]["settings"] == {"backfill_depth": 0, "watermark": 0.0, "grow_ahead_blocks": 0}
    assert runs[2]["settings"] == {"backfill_depth": 0, "grow_ahead_blocks": 4}  # 4: the offline default
    alone = [
        _json("--policy", "optimistic"),
        _json("--set", "admission.backfill_depth=0", "--set", "admission.watermark=0", "--grow-ahead-blocks", "0"),
        _json("--set", "admission.backfill_depth=0"),
        _json("--policy", "predictive"),
    ]
    assert "variant" not in alone[0]
    assert [_same_run(r) for r in runs] == [_same_run(r) for r in alone]
    # The settings changed the runs (else the comparison above proves little).
    assert len({(r["preemptions"], r["wait_p50_s"], r["makespan_s"]) for r in runs}) == 4


def test_a_variants_settings_go_over_set_and_grow_ahead_flags():
    common = ("--set", "admission.watermark=0", "--grow-ahead-blocks", "0")
    runs = _json(*common, "--compare", "optimistic,deep=optimistic:backfill_depth=0:grow_ahead_blocks=2")
    assert runs[0]["settings"] == {"watermark": 0.0, "grow_ahead_blocks": 0}
    assert runs[1]["settings"] == {"watermark": 0.0, "backfill_depth": 0, "grow_ahead_blocks": 2}
    alone = _json("--set", "admission.watermark=0", "--set", "admission.backfill_depth=0", "--grow-ahead-blocks", "2")
    assert _same_run(runs[1]) == _same_run(alone)


def test_the_table_names_each_variant():
    done = kvbudget(*BASE, "--limit", "20", "--compare", f"naive,{STRICT}")
    assert done.returncode == 0, done.stderr
    header = next(line for line in done.stdout.splitlines() if "strict" in line)
    assert "naive" in header and "offline" in done.stdout.split("┏")[0]  # the mode is in the title


@pytest.mark.parametrize(
    "compare, message",
    [
        ("optimistic,bogus", "--compare 'bogus': unknown policy bogus; choose from"),
        ("optimistic:backfill_depth", "--compare 'optimistic:backfill_depth': 'backfill_depth': expected KEY=VALUE"),
        ("optimistic:nope=1", "--compare 'optimistic:nope=1': unknown setting nope; one of"),
        ("optimistic:backfill_depth=x", "--compare 'optimistic:backfill_depth=x': backfill_depth: expected an integer, got 'x'"),
        ("optimistic:watermark=lots", "--compare 'optimistic:watermark=lots': watermark: expected a number"),
        ("optimistic:grow_ahead_blocks=-1", "--compare 'optimistic:grow_ahead_blocks=-1': grow_ahead_blocks: must be >= 0"),
        ("a=optimistic:backfill_depth=-1", "--compare 'a': backfill_depth: must not be negative, got -1"),
        ("optimistic:backfill_depth=1:backfill_depth=2", "backfill_depth is given twice"),
        ("optimistic,optimistic", "--compare: 'optimistic' is given twice; name one of them"),
        ("=optimistic", "--compare '=optimistic': empty name before '='"),
        (",", "--compare: no run given; expected [NAME=]POLICY[:KEY=VALUE...]"),
    ],
)
def test_bad_variant_is_one_line_naming_the_bad_part(compare, message):
    done = kvbudget(*BASE, "--compare", compare)
    assert done.returncode == 2
    assert message in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr and done.stdout == ""


def test_live_compare_is_refused_with_what_to_do_instead():
    done = kvbudget("replay", "azure", "--compare", STRICT)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "--compare needs --offline" in done.stderr and "--policy" in done.stderr


def test_report_plots_preemptions_and_agrees_with_the_json(tmp_path):
    done = kvbudget(*BASE, "--compare", f"naive,optimistic,{STRICT}", "--report", str(tmp_path), "--json")
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    report = json.loads((tmp_path / "replay.json").read_text())
    assert (tmp_path / "replay.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [_same_run(r["summary"]) for r in report] == [_same_run(r) for r in printed]
    assert [r["summary"]["variant"] for r in report] == ["naive", "optimistic", "strict"]
    for run in report:  # the series: cumulative, never down, ending at the run's count
        series = [s["preemptions"] for s in run["samples"]]
        assert series == sorted(series) and series[-1] == run["summary"]["preemptions"]
    assert report[1]["summary"]["preemptions"] > 0


def test_a_slow_run_does_not_squeeze_the_others_time_axis():
    from kvbudget.traces.report import time_axis_end

    # naive at 2,677.52 s against the others' 140.9-188.2 s (Azure, llama31_8b, 2,499
    # blocks): the axis ends 5% past 188.166 s, guaranteed's makespan.
    assert time_axis_end([2677.52, 140.863, 188.166, 153.018, 144.093]) == 188.166 * 1.05
    assert time_axis_end([100.0, 2000.0]) == 105.0
    assert time_axis_end([100.0, 250.0, 600.0]) is None  # no gap of 3x: the whole axis
    assert time_axis_end([0.0, 100.0]) is None and time_axis_end([]) is None
