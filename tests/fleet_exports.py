"""What the fleet's PromQL (deploy/kvbudget.rules.yml, deploy/grafana-kvbudget-fleet.json)
may name, and a reader of PromQL that says what an expression names.

The daemon's series are read from its own metrics registry with every feed given (a
snapshot, a GPU probe, the log's figures, TLS expiries), rendered as /metrics serves it and
parsed back: the names and label values a scrape of a daemon with a GPU and TLS would
show. Prometheus adds `instance` and `job` to every scraped series; the guide's scrape
config adds `host`. `up` is Prometheus's own series for each target.

promql_parser (the `promql-parser` package: Rust bindings of a PromQL parser) reads the
expressions; a test that needs it skips, saying so, where it is not installed.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvbudget.daemon.server.metrics import Metrics

from test_metrics import snapshot

SCRAPE_LABELS = frozenset({"instance", "job", "host"})
PROMETHEUS_SERIES = {"up": set()}  # per target, from the scrape itself: no label of its own


def promql():
    return pytest.importorskip("promql_parser", reason="promql-parser not installed (pip install promql-parser)")


def exported_series() -> dict[str, dict[str, set[str]]]:
    """Every sample name the daemon exports, with the values each of its labels takes."""
    metrics = Metrics()
    gpu = types.SimpleNamespace(present=True, total_bytes=80 << 30, used_bytes=10 << 30, free_bytes=70 << 30)
    log = types.SimpleNamespace(database_bytes=1, wal_bytes=1, rows_written=1, rows_folded=1, wal_resets=1,
                                stalls=1, stall_seconds=0.5, num_unwritten=0)
    metrics.update(snapshot(), gpu=gpu, log=log)
    metrics.record([], latency_s=0.001)
    metrics.set_certificate_expiry(2e9)
    metrics.set_client_ca_expiry(2e9)
    series: dict[str, dict[str, set[str]]] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            labels = series.setdefault(sample.name, {})
            for name, value in sample.labels.items():
                labels.setdefault(name, set()).add(value)
    return series


@dataclass
class Names:
    """What one expression names: its selectors (metric name, matchers) and the labels it
    groups or matches by."""

    selectors: list[tuple[str, list[tuple[str, str, str]]]] = field(default_factory=list)
    grouping: set[str] = field(default_factory=set)


def names_in(expr: object) -> Names:
    found = Names()
    for node in _walk(expr):
        kind = type(node).__name__
        if kind == "VectorSelector":
            matchers = [(m.name, str(m.op).rsplit(".", 1)[-1], m.value) for m in node.matchers.matchers]
            name = node.name or next((v for n, _, v in matchers if n == "__name__"), "")
            found.selectors.append((name, [m for m in matchers if m[0] != "__name__"]))
        elif kind == "AggregateExpr" and node.modifier is not None:
            found.grouping.update(node.modifier.labels)
        elif kind == "BinaryExpr" and node.modifier is not None:
            if node.modifier.matching is not None:
                found.grouping.update(node.modifier.matching.labels)
            found.grouping.update(getattr(node.modifier, "group_labels", None) or ())
    return found


def _walk(node: object) -> Iterator[object]:
    yield node
    kind = type(node).__name__
    children: list[object] = []
    if kind in ("AggregateExpr",):
        children = [node.expr] + ([node.param] if node.param is not None else [])
    elif kind == "BinaryExpr":
        children = [node.lhs, node.rhs]
    elif kind == "Call":
        children = list(node.args)
    elif kind == "MatrixSelector":
        children = [node.vector_selector]
    elif kind in ("ParenExpr", "SubqueryExpr", "UnaryExpr"):
        children = [node.expr]
    for child in children:
        yield from _walk(child)


def problems(expr_text: str, known: dict[str, dict[str, set[str]]]) -> list[str]:
    """What in `expr_text` the daemon (or the scrape, or `known`'s recorded series) does not
    export: an unknown metric, a label it does not have, a value its label never takes."""
    names = names_in(promql().parse(expr_text))
    found: list[str] = []
    labels_named: set[str] = set()
    for metric, matchers in names.selectors:
        if metric not in known:
            found.append(f"metric {metric!r} is not exported")
            continue
        labels_named.update(known[metric])
        for label, op, value in matchers:
            if label in SCRAPE_LABELS:
                continue
            if label not in known[metric]:
                found.append(f"{metric} has no label {label!r}")
            elif op in ("Equal", "Re"):
                for wanted in value.split("|") if op == "Re" else [value]:
                    if wanted not in known[metric][label]:
                        found.append(f"{metric}{{{label}}} never takes the value {wanted!r}")
    for label in names.grouping - SCRAPE_LABELS - labels_named:
        found.append(f"grouped by {label!r}, a label of none of its metrics")
    return found
