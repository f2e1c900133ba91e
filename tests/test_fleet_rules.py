"""deploy/kvbudget.rules.yml: Prometheus loads it (`promtool check rules`), every expression
parses and names only what the daemon exports (or a rule above it records), and the
recorded verdict says, on series staged by hand, what `kvbudget doctor` would
(`promtool test rules`). promtool comes with Debian's `prometheus` package
(apt-get install -y --no-install-recommends prometheus); without it those tests skip.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from fleet_exports import PROMETHEUS_SERIES, exported_series, problems, promql

RULES = Path(__file__).resolve().parent.parent / "deploy" / "kvbudget.rules.yml"
PROMTOOL_HINT = "promtool not installed (Debian: apt-get install -y --no-install-recommends prometheus)"


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.skip(PROMTOOL_HINT)
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_prometheus_loads_the_rules() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_promtool_would_refuse_a_broken_expression(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text(RULES.read_text().replace("> 0) * 0 + 4", "> 0) * 0 + "))
    result = promtool("check", "rules", str(broken))
    assert result.returncode != 0 and "FAILED" in result.stdout + result.stderr


def test_every_expression_names_only_what_the_daemon_exports() -> None:
    promql()
    known = {**exported_series(), **PROMETHEUS_SERIES}
    for rule in rules():
        name = rule.get("record") or rule["alert"]
        assert problems(rule["expr"], known) == [], name
        if "record" in rule:  # later rules may read it; it keeps only the scrape's labels
            known[rule["record"]] = {}


def test_the_check_is_not_vacuous() -> None:
    promql()
    known = exported_series()
    assert problems('kvbudget_blocks{state="held"}', known) == []
    assert problems('kvbudget_num_preemptions_total{reason="growth"}', known) == []
    assert problems("kvbudget_block", known) == ["metric 'kvbudget_block' is not exported"]
    assert problems('kvbudget_blocks{state="hold"}', known) == [
        "kvbudget_blocks{state} never takes the value 'hold'"
    ]
    assert problems('kvbudget_decisions_total{kind="queue",reason=~"pool_full|poolfull"}', known) == [
        "kvbudget_decisions_total{reason} never takes the value 'poolfull'"
    ]
    assert problems("sum by (gpu) (kvbudget_num_blocks)", known) == [
        "grouped by 'gpu', a label of none of its metrics"
    ]
    with pytest.raises(ValueError):
        promql().parse("sum(rate(kvbudget_blocks[5m])")


def test_recorded_names_and_alerts_follow_the_conventions() -> None:
    for rule in rules():
        if "record" in rule:
            level, metric, operations = rule["record"].split(":")
            assert level == "instance" and metric.startswith("kvbudget_") and operations, rule["record"]
        else:
            assert rule["alert"].startswith("KVBudget")
            assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
            assert {"summary", "description"} <= rule["annotations"].keys(), rule["alert"]
            assert "{{ $labels.instance }}" in rule["annotations"]["summary"], rule["alert"]


# ------------------------------------------------------------------ the verdict, by hand

# Six instances of one host (ports 9401-9406 in this order), 1,000 blocks each, sampled every minute for 25 minutes.
# Counters grow by the given amount each minute. The verdict at 10 m, over 5 m:
# pool:    950 held (0.95 >= 0.9), 3 waiting                            -> 2 pool-bound
# budget:  500 held, 450 reserved: held 0.5 < 0.9, committed 0.95 >= 0.9, queued only for
#          budget_full, 1 admit a minute                                -> 1 budget-bound
# stuck:   100 held (0.1 < 0.5), 5 waiting throughout, no admission     -> 3 stuck queue
# preempt: 800 held (0.8 < 0.9), none waiting, 2 preemptions a minute, queued for pool_full
#          (the pool ran out), 10 running: pressure from preemptions    -> 2 pool-bound
# healthy: 200 held, none waiting, 3 running                            -> 0 healthy
# log:     as healthy, 12 decisions unwritten                           -> 4 log cannot write
INSTANCES = {
    "pool": dict(held=950, reserved=0, waiting=3, running=10, admits=5, preempts=0, pool_full=10, budget_full=0),
    "budget": dict(held=500, reserved=450, waiting=2, running=4, admits=1, preempts=0, pool_full=0, budget_full=6),
    "stuck": dict(held=100, reserved=0, waiting=5, running=0, admits=0, preempts=0, pool_full=0, budget_full=0),
    "preempt": dict(held=800, reserved=0, waiting=0, running=10, admits=5, preempts=2, pool_full=3, budget_full=0),
    "healthy": dict(held=200, reserved=0, waiting=0, running=3, admits=4, preempts=0, pool_full=0, budget_full=0),
    "log": dict(held=200, reserved=0, waiting=0, running=3, admits=4, preempts=0, pool_full=0, budget_full=0,
                unwritten=12),
}
VERDICTS = {"pool": 2, "budget": 1, "stuck": 3, "preempt": 2, "healthy": 0, "log": 4}


def staged_series(name: str, f: dict[str, int]) -> list[dict[str, str]]:
    target = f'host="gpu-host-1", instance="gpu-host-1:{9401 + list(INSTANCES).index(name)}", job="kvbudget"'

    def gauge(metric: str, value: int, labels: str = "") -> dict[str, str]:
        return {"series": f"{metric}{{{labels}{target}}}", "values": f"{value}+0x25"}

    def counter(metric: str, per_minute: int, labels: str) -> dict[str, str]:
        return {"series": f"{metric}{{{labels}{target}}}", "values": f"0+{per_minute}x25"}

    free = 1000 - f["held"]
    queue = 'kind="queue", reason='
    return [
        gauge("kvbudget_num_blocks", 1000),
        gauge("kvbudget_blocks", free, 'state="free", '),
        gauge("kvbudget_blocks", 0, 'state="evictable", '),
        gauge("kvbudget_blocks", f["held"], 'state="held", '),
        gauge("kvbudget_blocks", f["reserved"], 'state="reserved", '),
        gauge("kvbudget_num_requests_waiting", f["waiting"]),
        gauge("kvbudget_num_requests_running", f["running"]),
        gauge("kvbudget_decision_log_unwritten_decisions", f.get("unwritten", 0)),
        counter("kvbudget_num_preemptions_total", f["preempts"], 'reason="growth", '),
        counter("kvbudget_decisions_total", f["admits"], 'kind="admit", reason="fits", '),
        counter("kvbudget_decisions_total", f["pool_full"], f'{queue}"pool_full", '),
        counter("kvbudget_decisions_total", 0, f'{queue}"watermark", '),
        counter("kvbudget_decisions_total", f["budget_full"], f'{queue}"budget_full", '),
        counter("kvbudget_decisions_total", 0, f'{queue}"tenant_quota", '),
    ]


def expected(metric: str, values: dict[str, float]) -> dict:
    return {
        "expr": metric,
        "eval_time": "10m",
        "exp_samples": [
            {"labels": f'{metric}{{host="gpu-host-1", instance="gpu-host-1:{9401 + i}", job="kvbudget"}}',
             "value": values[name]}
            for i, name in enumerate(INSTANCES)
        ],
    }


def test_the_verdict_and_its_alerts_on_series_staged_by_hand(tmp_path: Path) -> None:
    held = {name: f["held"] / 1000 for name, f in INSTANCES.items()}  # 0.95, 0.5, 0.1, ...
    committed = {name: (f["held"] + f["reserved"]) / 1000 for name, f in INSTANCES.items()}
    pressure = {"pool": 1, "budget": 1, "stuck": 1, "preempt": 1, "healthy": 0, "log": 0}
    test = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [s for name, f in INSTANCES.items() for s in staged_series(name, f)],
            "promql_expr_test": [
                expected("instance:kvbudget_held_share:avg5m", held),
                expected("instance:kvbudget_committed_share:avg5m", committed),
                expected("instance:kvbudget_under_pressure:5m", pressure),
                expected("instance:kvbudget_verdict:code", VERDICTS),
            ],
            "alert_rule_test": [
                {"eval_time": "10m", "alertname": "KVBudgetStuckQueue", "exp_alerts": [{
                    "exp_labels": {"severity": "critical", "host": "gpu-host-1", "instance": "gpu-host-1:9403",
                                   "job": "kvbudget"},
                    "exp_annotations": rule_annotations("KVBudgetStuckQueue", "gpu-host-1:9403"),
                }]},
                # pool-bound for 15 m: not yet at 10 m, firing for both pool-bound instances at 20 m
                {"eval_time": "10m", "alertname": "KVBudgetPoolBound", "exp_alerts": []},
                {"eval_time": "20m", "alertname": "KVBudgetPoolBound", "exp_alerts": [
                    {"exp_labels": {"severity": "warning", "host": "gpu-host-1", "instance": f"gpu-host-1:{port}",
                                    "job": "kvbudget"},
                     "exp_annotations": rule_annotations("KVBudgetPoolBound", f"gpu-host-1:{port}")}
                    for port in (9401, 9404)
                ]},
            ],
        }],
    }
    path = tmp_path / "kvbudget_rules_test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    result = promtool("test", "rules", str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def rule_annotations(alert: str, instance: str) -> dict[str, str]:
    """The alert's annotations as Prometheus fills them in for this instance (these two
    name only the instance)."""
    rule = next(r for r in rules() if r.get("alert") == alert)
    return {key: text.replace("{{ $labels.instance }}", instance) for key, text in rule["annotations"].items()}


def test_the_guides_scrape_config_loads_with_the_rules_and_labels_each_host(tmp_path: Path) -> None:
    from doc_tables import doc_section

    section = doc_section("A fleet in Prometheus and Grafana", RULES.parent.parent / "docs" / "operators-guide.md")
    (config_text,) = re.findall(r"```yaml\n(# prometheus\.yml\n.*?)```", section, flags=re.S)
    (tmp_path / "prometheus.yml").write_text(config_text)
    shutil.copy(RULES, tmp_path / "kvbudget.rules.yml")
    result = promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout
    (job,) = yaml.safe_load(config_text)["scrape_configs"]
    assert job["job_name"] == "kvbudget"  # the job KVBudgetDown watches
    (relabel,) = job["relabel_configs"]
    # Prometheus anchors the regex and writes the first group (its default replacement, $1).
    hosts = {re.fullmatch(relabel["regex"], target).group(1) for target in job["static_configs"][0]["targets"]}
    assert (relabel["source_labels"], relabel["target_label"], hosts) == (
        ["__address__"], "host", {"gpu-host-1", "gpu-host-2"}
    )


def test_the_guides_alert_examples_name_only_what_the_daemon_exports() -> None:
    """The alerts the guide's Prometheus section lists (the rules file has them all) read
    as well as the file's do."""
    from doc_tables import doc_section

    promql()
    section = doc_section("Prometheus", RULES.parent.parent / "docs" / "operators-guide.md")
    (block,) = re.findall(r"```yaml\n(- alert:.*?)```", section, flags=re.S)
    examples = yaml.safe_load(block)
    assert len(examples) >= 8
    known = exported_series()
    for alert in examples:
        assert problems(alert["expr"], known) == [], alert["alert"]
    assert {a["alert"] for a in examples} <= {r.get("alert") for r in rules()}
