"""deploy/grafana-kvbudget-fleet.json: every query parses and names only what the daemon
exports or deploy/kvbudget.rules.yml records; the fleet overview shows free blocks,
waiting, preemptions and the verdict for every instance of the hosts chosen, and the
drill-down one instance, chosen by a variable; the verdict reads as `kvbudget doctor` says it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fleet_exports import PROMETHEUS_SERIES, exported_series, names_in, problems, promql

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
DASHBOARD = DEPLOY / "grafana-kvbudget-fleet.json"
RULES = DEPLOY / "kvbudget.rules.yml"

# What Grafana puts in place of its variables: a regex for the multi-value host (its "All"
# is .*), one instance for the drill-down, and its own intervals.
STAND_INS = {"host": ".*", "instance": "gpu-host-1:9401", "__rate_interval": "1m", "__interval": "15s"}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def rows() -> list[tuple[dict, list[dict]]]:
    """Each row with the panels under it (the panels after it, up to the next row)."""
    found: list[tuple[dict, list[dict]]] = []
    for panel in dashboard()["panels"]:
        if panel["type"] == "row":
            found.append((panel, []))
        else:
            assert found, f"panel {panel['title']!r} is above every row"
            found[-1][1].append(panel)
    return found


def exprs(panel: dict) -> list[str]:
    return [t["expr"] for t in panel["targets"]]


def filled_in(expr: str) -> str:
    return re.sub(r"\$(\w+)", lambda m: STAND_INS[m.group(1)], expr)


def recorded() -> set[str]:
    yaml = pytest.importorskip("yaml", reason="pyyaml not installed")
    return {r["record"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "record" in r}


def metrics_of(panel: dict) -> set[str]:
    return {name for expr in exprs(panel) for name, _ in names_in(promql().parse(filled_in(expr))).selectors}


def test_every_query_names_only_what_the_daemon_exports_or_the_rules_record() -> None:
    promql()
    known = {**exported_series(), **PROMETHEUS_SERIES, **{name: {} for name in recorded()}}
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            inner = re.fullmatch(r"label_values\((.*), (\w+)\)", variable["query"]["query"])
            assert inner, variable["name"]
            assert problems(filled_in(inner.group(1)), known) == [], variable["name"]
    for panel in panels():
        assert panel["targets"], panel["title"]
        for expr in exprs(panel):
            assert problems(filled_in(expr), known) == [], (panel["title"], expr)


def test_every_variable_a_query_uses_is_defined_and_every_panel_uses_the_datasource_variable() -> None:
    defined = {v["name"] for v in dashboard()["templating"]["list"]}
    assert {"datasource", "host", "instance"} <= defined
    for panel in dashboard()["panels"]:
        text = json.dumps(panel)
        for name in re.findall(r"\$(\w+)", text):
            assert name in defined or name.startswith("__"), (panel["title"], name)
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert all(t["datasource"] == panel["datasource"] for t in panel["targets"]), panel["title"]
    ids = [p["id"] for p in dashboard()["panels"]]
    assert len(ids) == len(set(ids))


def test_the_overview_shows_every_instance_of_the_hosts_chosen() -> None:
    (overview, shown), _ = rows()
    assert overview["title"] == "Fleet overview"
    per_instance = [p for p in shown if p["type"] != "stat"]
    wanted = {
        "kvbudget_blocks",  # free + evictable
        "kvbudget_num_requests_waiting",
        "kvbudget_num_preemptions_total",
        "instance:kvbudget_verdict:code",
    }
    assert wanted <= set().union(*(metrics_of(p) for p in per_instance))
    for panel in shown:
        for expr in exprs(panel):
            assert 'host=~"$host"' in expr and "$instance" not in expr, (panel["title"], expr)
    for panel in per_instance:  # one line per instance, named by its host and instance
        assert all(t["legendFormat"] == "{{host}} {{instance}}" for t in panel["targets"]), panel["title"]


def test_the_drill_down_is_the_instance_the_variable_names() -> None:
    _, (drill, detail) = rows()
    assert drill["title"] == "Instance $instance"
    variable = next(v for v in dashboard()["templating"]["list"] if v["name"] == "instance")
    assert variable["multi"] is False and variable["includeAll"] is False  # one instance at a time
    assert "$host" in variable["query"]["query"]  # chosen among the hosts the overview shows
    for panel in detail:
        for expr in exprs(panel):
            assert 'instance="$instance"' in expr, (panel["title"], expr)


def test_the_verdict_reads_as_the_doctor_says_it() -> None:
    from kvbudget.cli.doctor_samples import Verdict

    yaml = pytest.importorskip("yaml", reason="pyyaml not installed")
    rule = next(r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
                if r.get("record") == "instance:kvbudget_verdict:code")
    codes = {"0"} | set(re.findall(r"\* 0 \+ (\d+)", rule["expr"]))  # 0: `kvbudget_num_blocks * 0`
    doctor = {v.value for v in Verdict}
    verdict_panels = [p for p in panels() if "instance:kvbudget_verdict:code" in " ".join(exprs(p))]
    assert len(verdict_panels) == 3  # the overview's timeline and count, the drill-down's stat
    for panel in verdict_panels:
        if panel["title"] == "Not healthy":
            continue
        (mapping,) = panel["fieldConfig"]["defaults"]["mappings"]
        assert set(mapping["options"]) == codes, panel["title"]
        texts = {code: option["text"] for code, option in mapping["options"].items()}
        assert set(texts.values()) <= doctor
        assert (texts["0"], texts["1"], texts["2"]) == ("healthy", "budget-bound", "pool-bound")
