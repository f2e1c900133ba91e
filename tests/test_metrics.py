"""Prometheus metrics: vLLM-aligned names, values from decisions and snapshots, /metrics over HTTP."""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass

import pytest

from kvbudget.daemon.server.metrics import Metrics
from kvbudget.daemon.core.records import Decision, DecisionKind, GroupSnapshot, Reason, Snapshot, TenantSnapshot


def decision(seq: int, kind: DecisionKind, reason: Reason) -> Decision:
    return Decision(seq=seq, time_s=float(seq), kind=kind, reason=reason, request_id=f"r{seq}")


def snapshot(**fields: object) -> Snapshot:
    values: dict[str, object] = dict(
        time_s=1.0,
        policy="optimistic",
        num_blocks=1000,
        num_free_blocks=700,  # 600 never cached + 100 evictable
        num_held_blocks=300,
        num_reserved_blocks=50,
        num_evictable_blocks=100,
        num_running=4,
        num_waiting=2,
        num_preemptions=1,
        groups=(
            GroupSnapshot("full_attention", "full_attention", 16, blocks_held=200, blocks_reserved=30,
                          blocks_reclaimed=0),
            GroupSnapshot("sliding_window", "sliding_window W=4096", 16, blocks_held=100, blocks_reserved=20,
                          blocks_reclaimed=40),
        ),
        tenants=(TenantSnapshot("chat", 250, 40, 600, 2.0, 3, 1), TenantSnapshot("batch", 50, 10, None, 1.0, 1, 1)),
        prefix_hit_blocks=4,
        prefix_query_blocks=10,
    )
    values.update(fields)
    return Snapshot(**values)  # type: ignore[arg-type]


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


EXPECTED_NAMES = (
    "kvbudget_kv_cache_usage_perc",
    "kvbudget_num_requests_waiting",
    "kvbudget_num_requests_running",
    "kvbudget_num_preemptions_total",
    "kvbudget_blocks",
    "kvbudget_group_blocks",
    "kvbudget_decisions_total",
    "kvbudget_decision_latency_seconds",
)


def test_names_are_vllm_aligned_and_exposed() -> None:
    metrics = Metrics()
    metrics.record([decision(1, DecisionKind.PREEMPT, Reason.GROWTH)], latency_s=0.001)
    metrics.update(snapshot())
    text = metrics.render().decode()
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    for name in EXPECTED_NAMES:
        assert any(line.startswith((name + " ", name + "{", name + "_bucket")) for line in samples), name
    assert 'kvbudget_num_preemptions_total{reason="growth"} 1.0' in text


def test_decisions_count_by_kind_and_reason_and_preemptions_by_reason() -> None:
    metrics = Metrics()
    metrics.record(
        [
            decision(1, DecisionKind.ADMIT, Reason.FITS),
            decision(2, DecisionKind.ADMIT, Reason.FITS),
            decision(3, DecisionKind.QUEUE, Reason.POOL_FULL),
            decision(4, DecisionKind.PREEMPT, Reason.GROWTH),
        ],
        latency_s=0.0004,
    )
    metrics.record([decision(5, DecisionKind.PREEMPT, Reason.PRIORITY)], latency_s=0.002)
    assert value(metrics, "kvbudget_decisions_total", kind="admit", reason="fits") == 2.0
    assert value(metrics, "kvbudget_decisions_total", kind="queue", reason="pool_full") == 1.0
    assert value(metrics, "kvbudget_num_preemptions_total", reason="growth") == 1.0
    assert value(metrics, "kvbudget_num_preemptions_total", reason="priority") == 1.0
    # One observation per record() call, not per decision.
    assert value(metrics, "kvbudget_decision_latency_seconds_count") == 2.0
    assert value(metrics, "kvbudget_decision_latency_seconds_sum") == pytest.approx(0.0024)
    # 0.0004 s falls in le=0.0005; 0.002 s first in le=0.0025.
    assert value(metrics, "kvbudget_decision_latency_seconds_bucket", le="0.00025") == 0.0
    assert value(metrics, "kvbudget_decision_latency_seconds_bucket", le="0.0005") == 1.0
    assert value(metrics, "kvbudget_decision_latency_seconds_bucket", le="0.0025") == 2.0
    # A commit the log's write stall held for seconds is told apart from one held for ever.
    metrics.record([decision(6, DecisionKind.ADMIT, Reason.FITS)], latency_s=3.0)
    assert value(metrics, "kvbudget_decision_latency_seconds_bucket", le="2.5") == 2.0
    assert value(metrics, "kvbudget_decision_latency_seconds_bucket", le="5.0") == 3.0


def test_snapshot_gauges() -> None:
    metrics = Metrics()
    metrics.update(snapshot())
    assert value(metrics, "kvbudget_kv_cache_usage_perc") == 0.3  # 300 held / 1000 blocks
    assert value(metrics, "kvbudget_num_requests_running") == 4.0
    assert value(metrics, "kvbudget_num_requests_waiting") == 2.0
    assert value(metrics, "kvbudget_num_blocks") == 1000.0
    assert value(metrics, "kvbudget_blocks", state="free") == 600.0  # 700 free+evictable - 100 evictable
    assert value(metrics, "kvbudget_blocks", state="evictable") == 100.0
    assert value(metrics, "kvbudget_blocks", state="held") == 300.0
    assert value(metrics, "kvbudget_blocks", state="reserved") == 50.0  # (deprecated: sums to 1050)
    # the pool's states sum to its blocks (600 + 100 + 300 = 1000); what is reserved apart
    assert {state: value(metrics, "kvbudget_pool_blocks", state=state) for state in ("free", "evictable", "held")} \
        == {"free": 600.0, "evictable": 100.0, "held": 300.0}
    assert value(metrics, "kvbudget_reserved_blocks") == 50.0
    assert value(metrics, "kvbudget_group_blocks", layer_type="sliding_window", group="1", state="held") == 100.0
    assert value(metrics, "kvbudget_group_blocks", layer_type="full_attention", group="0", state="reserved") == 30.0
    assert value(metrics, "kvbudget_group_blocks_reclaimed_total", layer_type="sliding_window", group="1") == 40.0
    assert value(metrics, "kvbudget_tenant_blocks", tenant="chat", state="held") == 250.0
    assert value(metrics, "kvbudget_tenant_requests", tenant="batch", state="waiting") == 1.0
    assert value(metrics, "kvbudget_policy", policy="optimistic") == 1.0


def test_cumulative_snapshot_figures_become_counters() -> None:
    metrics = Metrics()
    metrics.update(snapshot(prefix_query_blocks=10, prefix_hit_blocks=4))
    metrics.update(snapshot(prefix_query_blocks=25, prefix_hit_blocks=9))
    assert value(metrics, "kvbudget_prefix_cache_queries_total") == 25.0
    assert value(metrics, "kvbudget_prefix_cache_hits_total") == 9.0
    # The core restarted: its figure went back to 3, which is all new.
    metrics.update(snapshot(prefix_query_blocks=3, prefix_hit_blocks=1))
    assert value(metrics, "kvbudget_prefix_cache_queries_total") == 28.0  # 25 + 3
    assert value(metrics, "kvbudget_prefix_cache_hits_total") == 10.0  # 9 + 1


def test_series_that_disappear_are_removed_not_frozen() -> None:
    metrics = Metrics()
    metrics.update(snapshot())
    metrics.update(snapshot(policy="guaranteed", tenants=(TenantSnapshot("chat", 1, 0, None, 1.0, 1, 0),)))
    assert value(metrics, "kvbudget_policy", policy="optimistic") is None
    assert value(metrics, "kvbudget_policy", policy="guaranteed") == 1.0
    assert value(metrics, "kvbudget_tenant_blocks", tenant="batch", state="held") is None
    assert value(metrics, "kvbudget_tenant_blocks", tenant="chat", state="held") == 1.0


@dataclass
class FakeGpu:
    present: bool = True
    total_bytes: int = 80 * 2**30
    used_bytes: int = 70 * 2**30
    free_bytes: int = 10 * 2**30


def test_gpu_memory() -> None:
    metrics = Metrics()
    metrics.update(snapshot(), FakeGpu())
    assert value(metrics, "kvbudget_gpu_present") == 1.0
    assert value(metrics, "kvbudget_gpu_memory_bytes", state="used") == 70 * 2**30
    metrics.update(snapshot(), FakeGpu(present=False))
    assert value(metrics, "kvbudget_gpu_present") == 0.0


@dataclass
class FakeLog:
    database_bytes: int = 5 * 2**20
    wal_bytes: int = 2**20
    rows_written: int = 100
    rows_folded: int = 90
    wal_resets: int = 1
    stalls: int = 2
    stall_seconds: float = 0.25
    num_unwritten: int = 0


def test_decision_log_sizes_and_counts() -> None:
    metrics = Metrics()
    metrics.update(snapshot(), log=FakeLog())
    assert value(metrics, "kvbudget_decision_log_bytes", file="database") == 5 * 2**20
    assert value(metrics, "kvbudget_decision_log_bytes", file="wal") == 2**20
    assert value(metrics, "kvbudget_decision_log_rows_total", state="written") == 100
    assert value(metrics, "kvbudget_decision_log_rows_total", state="folded") == 90
    assert value(metrics, "kvbudget_decision_log_rows_written_total") == 100  # each row once: 100, not 190
    assert value(metrics, "kvbudget_decision_log_rows_folded_total") == 90
    assert value(metrics, "kvbudget_decision_log_wal_resets_total") == 1
    assert value(metrics, "kvbudget_decision_log_stalls_total") == 2
    assert value(metrics, "kvbudget_decision_log_stall_seconds_total") == 0.25
    metrics.update(snapshot(), log=FakeLog(wal_bytes=0, rows_written=150, rows_folded=150, wal_resets=3,
                                           stalls=3, stall_seconds=1.0))
    assert value(metrics, "kvbudget_decision_log_bytes", file="wal") == 0
    assert value(metrics, "kvbudget_decision_log_rows_total", state="written") == 150  # counters: the increase
    assert value(metrics, "kvbudget_decision_log_rows_written_total") == 150
    assert value(metrics, "kvbudget_decision_log_wal_resets_total") == 3
    assert value(metrics, "kvbudget_decision_log_stalls_total") == 3
    assert value(metrics, "kvbudget_decision_log_stall_seconds_total") == 1.0
    assert value(metrics, "kvbudget_decision_log_unwritten_decisions") == 0
    same = dict(wal_bytes=0, rows_written=150, rows_folded=150, wal_resets=3, stalls=3, stall_seconds=1.0)
    metrics.update(snapshot(), log=FakeLog(num_unwritten=40, **same))  # a full disk: decisions wait
    assert value(metrics, "kvbudget_decision_log_unwritten_decisions") == 40
    metrics.update(snapshot(), log=FakeLog(num_unwritten=0, **same))
    assert value(metrics, "kvbudget_decision_log_unwritten_decisions") == 0
    metrics.update(snapshot())  # no log given: its figures stay as they were
    assert value(metrics, "kvbudget_decision_log_rows_total", state="folded") == 150


def test_each_instance_has_its_own_registry() -> None:
    first, second = Metrics(), Metrics()
    first.record([decision(1, DecisionKind.ADMIT, Reason.FITS)])
    assert value(first, "kvbudget_decisions_total", kind="admit", reason="fits") == 1.0
    assert value(second, "kvbudget_decisions_total", kind="admit", reason="fits") == 0.0  # (at 0 from the start)


def test_http_endpoint_on_an_ephemeral_loopback_port() -> None:
    metrics = Metrics()
    metrics.update(snapshot())
    port = metrics.start_http("127.0.0.1", 0)
    try:
        assert port > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain")
            body = response.read().decode()
        assert "kvbudget_kv_cache_usage_perc 0.3" in body
        with pytest.raises(RuntimeError, match="already started"):
            metrics.start_http("127.0.0.1", 0)
    finally:
        metrics.stop()
    metrics.stop()  # idempotent
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_labelled_children_are_looked_up_once_per_pair_not_per_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = Metrics()
    lookups: list[dict[str, str]] = []
    real_decisions_labels, real_preemptions_labels = metrics.families.decisions.labels, metrics.families.preemptions.labels

    def counting(real):
        def labels(*args: str, **kwargs: str):
            lookups.append(kwargs)
            return real(*args, **kwargs)
        return labels

    monkeypatch.setattr(metrics.families.decisions, "labels", counting(real_decisions_labels))
    monkeypatch.setattr(metrics.families.preemptions, "labels", counting(real_preemptions_labels))
    # Pairs outside DECISION_PAIRS (those exist from the start, and are looked up then).
    batch = [decision(i, DecisionKind.ADMIT, Reason.NONE) for i in range(50)]
    batch += [decision(50 + i, DecisionKind.PREEMPT, Reason.WINDOW) for i in range(3)]
    metrics.record(batch)
    # Two pairs: (admit, none) and (preempt, window), plus the preemptions child: 3 lookups.
    assert len(lookups) == 3
    metrics.record(batch)
    metrics.record([decision(99, "admit", "none")])  # plain strings are the same series
    metrics.record([decision(100, DecisionKind.ADMIT, Reason.FITS)])  # made at the start
    assert len(lookups) == 3  # the children are kept
    # 50 + 50 + 1 admits; 3 + 3 preempts.
    assert value(metrics, "kvbudget_decisions_total", kind="admit", reason="none") == 101.0
    assert value(metrics, "kvbudget_decisions_total", kind="preempt", reason="window") == 6.0
    assert value(metrics, "kvbudget_num_preemptions_total", reason="window") == 6.0
    assert value(metrics, "kvbudget_decisions_total", kind="admit", reason="fits") == 1.0


def test_decision_and_preemption_series_exist_at_zero_before_the_first_decision() -> None:
    """A series born at 37 has its first 37 lost to rate() and increase(): the first
    preemption burst would not show, and the guide's stuck-queue alert (no admit in 5
    minutes) had no series to compare while nothing had ever been admitted."""
    metrics = Metrics()
    assert value(metrics, "kvbudget_num_preemptions_total", reason="growth") == 0.0
    assert value(metrics, "kvbudget_num_preemptions_total", reason="priority") == 0.0
    assert value(metrics, "kvbudget_decisions_total", kind="admit", reason="fits") == 0.0
    assert value(metrics, "kvbudget_decisions_total", kind="preempt", reason="growth") == 0.0
    assert value(metrics, "kvbudget_decisions_total", kind="reject", reason="draining") == 0.0
    # Only the preempt reasons are preemptions: no admit reason there.
    assert value(metrics, "kvbudget_num_preemptions_total", reason="fits") is None
    metrics.record([decision(1, DecisionKind.PREEMPT, Reason.GROWTH)])
    assert value(metrics, "kvbudget_num_preemptions_total", reason="growth") == 1.0


def tenants(count: int, **overrides: TenantSnapshot) -> tuple[TenantSnapshot, ...]:
    """`count` tenants "u0".."u{count-1}": tenant i holds i blocks and reserves 1, runs 1
    request and has 2 waiting; `overrides` replace some by name."""
    made = {f"u{i}": TenantSnapshot(f"u{i}", i, 1, None, 1.0, 1, 2) for i in range(count)}
    made.update(overrides)
    return tuple(made.values())


def tenant_label_values(metrics: Metrics) -> set[str]:
    return {sample.labels["tenant"] for family in metrics.registry.collect()
            if family.name in ("kvbudget_tenant_blocks", "kvbudget_tenant_requests") for sample in family.samples}


def test_tenant_series_are_bounded_and_the_rest_summed() -> None:
    """Tenant names come from requests: 200 tenants waiting must not make 800 series."""
    from kvbudget.daemon.server.metrics import MAX_TENANT_SERIES, OTHER_TENANTS

    assert MAX_TENANT_SERIES == 50
    # u3 is small but the config gives it a quota: the operator's dashboards name it.
    quota = TenantSnapshot("u3", 3, 1, 100, 1.0, 1, 2)
    metrics = Metrics()
    metrics.update(snapshot(tenants=tenants(200, u3=quota)))
    # u3, then the 48 largest (u199..u152), and the sum of the other 151.
    expected = {"u3", OTHER_TENANTS} | {f"u{i}" for i in range(152, 200)}
    assert tenant_label_values(metrics) == expected
    assert value(metrics, "kvbudget_tenant_blocks", tenant="u199", state="held") == 199.0
    assert value(metrics, "kvbudget_tenant_blocks", tenant="u3", state="held") == 3.0
    # The rest, u0..u151 without u3: sums stay exact.
    assert value(metrics, "kvbudget_tenant_blocks", tenant=OTHER_TENANTS, state="held") == sum(range(152)) - 3
    assert value(metrics, "kvbudget_tenant_blocks", tenant=OTHER_TENANTS, state="reserved") == 151.0
    assert value(metrics, "kvbudget_tenant_requests", tenant=OTHER_TENANTS, state="running") == 151.0
    assert value(metrics, "kvbudget_tenant_requests", tenant=OTHER_TENANTS, state="waiting") == 302.0

    # Back under the bound: every tenant by name again, and no sum left behind.
    metrics.update(snapshot(tenants=tenants(3)))
    assert tenant_label_values(metrics) == {"u0", "u1", "u2"}
    # At the bound exactly, no tenant is folded.
    metrics.update(snapshot(tenants=tenants(MAX_TENANT_SERIES)))
    assert len(tenant_label_values(metrics)) == MAX_TENANT_SERIES
    assert OTHER_TENANTS not in tenant_label_values(metrics)


def test_a_tenant_named_like_the_sum_is_part_of_the_sum() -> None:
    from kvbudget.daemon.server.metrics import OTHER_TENANTS

    big = TenantSnapshot(OTHER_TENANTS, 1000, 0, None, 1.0, 1, 0)  # the largest: ranked first
    metrics = Metrics()
    metrics.update(snapshot(tenants=tenants(60, **{OTHER_TENANTS: big})))
    # It and the eleven smallest (u0..u10): one series, their sum.
    assert value(metrics, "kvbudget_tenant_blocks", tenant=OTHER_TENANTS, state="held") == 1000 + sum(range(11))
    assert len(tenant_label_values(metrics)) == 50


def test_every_metric_the_operators_guide_alerts_on_is_exposed() -> None:
    """The guide's alert rules name real series: a renamed metric would silence an alert."""
    import re
    from pathlib import Path

    guide = (Path(__file__).resolve().parent.parent / "docs" / "operators-guide.md").read_text()
    rules = guide.split("Useful alerts", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    named = set(re.findall(r"\b(kvbudget_[a-z_]+)", rules))
    assert "kvbudget_decision_log_unwritten_decisions" in named
    metrics = Metrics()
    metrics.record([decision(1, DecisionKind.PREEMPT, Reason.GROWTH)], latency_s=0.001)
    metrics.update(snapshot(), FakeGpu(), FakeLog())
    metrics.set_certificate_expiry(1_800_000_000.0)  # (a daemon with TLS)
    metrics.set_client_ca_expiry(1_800_000_000.0)  # (and client certificates)
    exposed = {line.split("{")[0].split(" ")[0] for line in metrics.render().decode().splitlines()
               if line and not line.startswith("#")}
    assert named <= exposed, named - exposed



def test_the_tls_certificate_expiry_is_exported_only_once_known() -> None:
    """Without TLS there is no series: a 0 would read as a certificate long expired."""
    metrics = Metrics()
    metrics.update(snapshot(), FakeGpu(), FakeLog())
    assert "kvbudget_tls_certificate_expiry" not in metrics.render().decode()
    metrics.set_certificate_expiry(0.0)  # its expiry could not be read: still nothing
    assert "kvbudget_tls_certificate_expiry" not in metrics.render().decode()
    metrics.set_certificate_expiry(1_800_000_000.0)
    metrics.set_certificate_expiry(1_900_000_000.0)  # a reload served a renewed one
    assert "kvbudget_tls_certificate_expiry_timestamp_seconds 1.9e+09" in metrics.render().decode()


def test_the_client_ca_expiry_is_exported_only_with_mutual_tls() -> None:
    metrics = Metrics()
    metrics.set_certificate_expiry(1_800_000_000.0)  # TLS, no client certificates
    assert "kvbudget_tls_client_ca_expiry" not in metrics.render().decode()
    metrics.set_client_ca_expiry(0.0)  # could not be read: still nothing
    assert "kvbudget_tls_client_ca_expiry" not in metrics.render().decode()
    metrics.set_client_ca_expiry(1_700_000_000.0)
    metrics.set_client_ca_expiry(1_750_000_000.0)  # a reload read a renewed bundle
    assert "kvbudget_tls_client_ca_expiry_timestamp_seconds 1.75e+09" in metrics.render().decode()


def test_the_version_the_daemon_runs_is_an_info_metric() -> None:
    """vLLM's form: always 1, the fact in a label (joined onto other series by instance)."""
    from kvbudget import __version__

    metrics = Metrics()  # before any feed: known from the start
    assert value(metrics, "kvbudget_build_info", version=__version__) == 1.0
    assert f'kvbudget_build_info{{version="{__version__}"}} 1.0' in metrics.render().decode()


def test_the_operators_guide_table_lists_every_metric_with_its_type() -> None:
    """The Prometheus table is what operators build dashboards from: a metric left out of
    it (the log's unwritten decisions were, though an alert reads them) is one nobody finds."""
    import re
    from pathlib import Path

    from prometheus_client.parser import text_string_to_metric_families

    guide = (Path(__file__).resolve().parent.parent / "docs" / "operators-guide.md").read_text()
    section = guide.split("\n## Prometheus", 1)[1].split("\n## ", 1)[0]
    documented: dict[str, str] = {}
    for row in section.splitlines():
        if row.startswith("| `kvbudget_"):
            names, kind = (cell.strip() for cell in row.strip("|").split("|")[:2])
            documented.update(dict.fromkeys(re.findall(r"`(kvbudget_[a-z_]+)", names), kind))
    metrics = full_metrics()
    families = list(text_string_to_metric_families(metrics.render().decode()))
    # (No `_created` companion of a counter or histogram is exported: nothing to leave out.)
    exposed = {f.name + ("_total" if f.type == "counter" else ""): f.type for f in families
               if f.name.startswith("kvbudget_")}
    assert documented == exposed


def test_snapshot_gauges_are_absent_until_the_first_snapshot_not_zero() -> None:
    """/metrics serves before the core starts reading the pool: a scrape then read a pool of 0
    blocks and no GPU. Absent is the truth: nothing is known yet."""
    metrics = Metrics()
    unknown = ("kvbudget_num_blocks", "kvbudget_reserved_blocks", "kvbudget_kv_cache_usage_perc",
               "kvbudget_num_requests_waiting",
               "kvbudget_num_requests_running", "kvbudget_gpu_present", "kvbudget_decision_log_unwritten_decisions")
    for name in unknown:
        assert value(metrics, name) is None, name
    assert f"\n{unknown[0]} " not in metrics.render().decode()
    metrics.update(snapshot())  # a snapshot, without the GPU probe or the log's figures yet
    assert value(metrics, "kvbudget_num_blocks") == 1000.0
    assert value(metrics, "kvbudget_num_requests_waiting") == 2.0
    assert value(metrics, "kvbudget_gpu_present") is None
    assert value(metrics, "kvbudget_decision_log_unwritten_decisions") is None
    metrics.update(snapshot(), FakeGpu(present=False), FakeLog())
    metrics.update(snapshot(), FakeGpu(present=False), FakeLog())  # registered once, not twice
    assert value(metrics, "kvbudget_gpu_present") == 0.0
    assert value(metrics, "kvbudget_decision_log_unwritten_decisions") == 0.0
    assert metrics.render().decode().count("# TYPE kvbudget_num_blocks gauge") == 1


# Every sample name of ours in the exposition (with TLS, mutual TLS, a GPU and the log's
# figures), as operators' dashboards and alerts name them: none may go or change, but for a
# deprecated one, in the release its HELP and the operator's guide name.
EXPOSED_NAMES = {
    "kvbudget_blocks", "kvbudget_pool_blocks", "kvbudget_reserved_blocks",
    "kvbudget_decision_log_rows_written_total", "kvbudget_decision_log_rows_folded_total", "kvbudget_build_info",
    "kvbudget_request_queue_time_seconds_bucket", "kvbudget_request_queue_time_seconds_count",
    "kvbudget_request_queue_time_seconds_sum", "kvbudget_decision_latency_seconds_bucket",
    "kvbudget_decision_latency_seconds_count", "kvbudget_decision_latency_seconds_sum", "kvbudget_decision_log_bytes",
    "kvbudget_decision_log_rows_total", "kvbudget_decision_log_stall_seconds_total",
    "kvbudget_decision_log_stalls_total", "kvbudget_decision_log_unwritten_decisions",
    "kvbudget_decision_log_wal_resets_total", "kvbudget_decisions_total", "kvbudget_gpu_memory_bytes",
    "kvbudget_gpu_present", "kvbudget_group_blocks", "kvbudget_group_blocks_reclaimed_total",
    "kvbudget_kv_cache_usage_perc", "kvbudget_num_blocks", "kvbudget_num_preemptions_total",
    "kvbudget_num_requests_running", "kvbudget_num_requests_waiting", "kvbudget_policy",
    "kvbudget_pool_gpu_memory_bytes",
    "kvbudget_prefix_cache_hits_total", "kvbudget_prefix_cache_queries_total", "kvbudget_tenant_blocks",
    "kvbudget_tenant_requests", "kvbudget_tls_certificate_expiry_timestamp_seconds",
    "kvbudget_tls_client_ca_expiry_timestamp_seconds",
    "kvbudget_model_info", "kvbudget_prefix_cache_query_tokens_total", "kvbudget_prefix_cache_hit_tokens_total",
    "kvbudget_tenant_request_queue_time_seconds_bucket", "kvbudget_tenant_request_queue_time_seconds_count",
    "kvbudget_tenant_request_queue_time_seconds_sum",
}


def describe(metrics: Metrics) -> None:
    """What the daemon tells its metrics at start (startup.start_metrics)."""
    from kvbudget.daemon.config.settings import DaemonConfig, TenantQuota
    from kvbudget.v1 import common_pb2

    metrics.describe_pool(common_pb2.PoolPlan(model="llama-3.1-8b", block_size_tokens=16),
                          DaemonConfig(model="llama-3.1-8b", tenants={"chat": TenantQuota(max_share=0.6)}))


def full_metrics() -> Metrics:
    metrics = Metrics()
    describe(metrics)
    metrics.record([decision(1, DecisionKind.PREEMPT, Reason.GROWTH)], latency_s=0.001)
    metrics.update(snapshot(), FakeGpu(), FakeLog())
    metrics.set_certificate_expiry(1_800_000_000.0)
    metrics.set_client_ca_expiry(1_800_000_000.0)
    return metrics


def exposition_names(text: str) -> tuple[set[str], set[str]]:
    """(the names on HELP/TYPE/UNIT lines, the names of the sample lines) of an exposition,
    text or OpenMetrics format."""
    described: set[str] = set()
    sampled: set[str] = set()
    for line in text.splitlines():
        if line.startswith(("# HELP ", "# TYPE ", "# UNIT ")):
            described.add(line.split()[2])
        elif line and not line.startswith("#"):
            sampled.add(line.split("{")[0].split(" ")[0])
    return described, sampled


def test_no_created_series_and_every_other_series_kept() -> None:
    """prometheus-client adds a `*_created` gauge beside each counter and histogram: clutter
    that vLLM's /metrics users don't see. It is left out; every series of ours stays."""
    import sys

    from kvbudget.daemon.server.metrics import DECISION_PAIRS
    from kvbudget.daemon.server.metrics_registry import LATENCY_BUCKETS_S

    metrics = full_metrics()
    text = metrics.render().decode()
    described, sampled = exposition_names(text)
    assert sorted(name for name in described | sampled if name.endswith("_created")) == []
    assert {name for name in sampled if name.startswith("kvbudget_")} == EXPOSED_NAMES
    # Every series, labels and all, not only every name.
    lines = text.splitlines()
    assert sum(line.startswith("kvbudget_decisions_total{") for line in lines) == len(DECISION_PAIRS)
    assert sum(line.startswith("kvbudget_decision_latency_seconds_bucket{") for line in lines) == (
        len(LATENCY_BUCKETS_S) + 1)
    assert 'kvbudget_num_preemptions_total{reason="growth"} 1.0' in lines
    assert "kvbudget_decision_log_stall_seconds_total 0.25" in lines
    assert "kvbudget_decision_latency_seconds_count 1.0" in lines
    # The exporter's usual series (they have no `_created` either way), as vLLM's.
    assert {"python_gc_collections_total", "python_gc_objects_collected_total", "python_info"} <= sampled
    if sys.platform.startswith("linux"):
        assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"} <= sampled
    # The registry's own view (what get_sample_value reads) is the exposition's.
    assert value(metrics, "kvbudget_decisions_created", kind="preempt", reason="growth") is None
    assert value(metrics, "kvbudget_decisions_total", kind="preempt", reason="growth") == 1.0


def test_no_created_series_over_http_in_either_format_or_by_name() -> None:
    """What /metrics serves: the text format, OpenMetrics (where `_created` is part of the
    counter's family) and a scrape that names the series it wants (`?name[]=`)."""
    metrics = full_metrics()
    port = metrics.start_http("127.0.0.1", 0)

    def scrape(query: str = "", accept: str | None = None) -> str:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics{query}")
        if accept is not None:
            request.add_header("Accept", accept)
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.read().decode()

    try:
        for accept in (None, "application/openmetrics-text; version=1.0.0"):
            described, sampled = exposition_names(scrape(accept=accept))
            assert sorted(name for name in described | sampled if name.endswith("_created")) == [], accept
            assert {name for name in sampled if name.startswith("kvbudget_")} == EXPOSED_NAMES, accept
            named = scrape("?name[]=kvbudget_decisions_created&name[]=kvbudget_decisions_total"
                           "&name[]=kvbudget_decision_latency_seconds_created", accept)
            described, sampled = exposition_names(named)
            assert sampled == {"kvbudget_decisions_total"}, (accept, named)
            assert not any(name.startswith("kvbudget_decision_latency") for name in described), (accept, named)
    finally:
        metrics.stop()


def test_a_deprecated_metric_says_so_and_names_what_replaces_it() -> None:
    """Renamed, never changed in place: the old name is served beside the new ones until the
    release its HELP names (docs/operators-guide.md, "Deprecated metrics")."""
    text = full_metrics().render().decode()
    helps = {line.split(" ", 3)[2]: line.split(" ", 3)[3] for line in text.splitlines()
             if line.startswith("# HELP kvbudget_")}
    deprecated = {name for name, help_text in helps.items()
                  if help_text.startswith("Deprecated since 0.2, removed in 0.3: use ")}
    assert deprecated == {"kvbudget_blocks", "kvbudget_decision_log_rows_total"}
    for old, new in (("kvbudget_blocks", ("kvbudget_pool_blocks", "kvbudget_reserved_blocks")),
                     ("kvbudget_decision_log_rows_total", ("kvbudget_decision_log_rows_written_total",
                                                           "kvbudget_decision_log_rows_folded_total"))):
        for successor in new:
            assert successor in helps[old] and successor in helps, (old, successor)


def test_queue_time_is_each_requests_wait_for_its_first_admission() -> None:
    def at(time_s: float, kind: DecisionKind, request_id: str, reason: Reason = Reason.FITS) -> Decision:
        return Decision(seq=int(time_s * 10), time_s=time_s, kind=kind, reason=reason, request_id=request_id)

    metrics = Metrics()
    metrics.record([at(1.0, DecisionKind.ADMIT, "now")])  # admitted as it came: waited 0
    metrics.record([at(2.0, DecisionKind.QUEUE, "w", Reason.POOL_FULL), at(4.0, DecisionKind.QUEUE, "gone", Reason.POOL_FULL)])
    metrics.record([at(3.0, DecisionKind.QUEUE, "w", Reason.QUEUE_AHEAD)])  # still the wait that began at 2
    metrics.record([at(6.0, DecisionKind.REJECT, "gone", Reason.DEADLINE)])  # never admitted: not observed
    metrics.record([at(7.0, DecisionKind.ADMIT, "w")])  # waited 7 - 2 = 5
    metrics.record([at(8.0, DecisionKind.PREEMPT, "w", Reason.GROWTH), at(9.0, DecisionKind.ADMIT, "w")])  # no new wait
    metrics.record([at(10.0, DecisionKind.ADMIT, "gone")])  # the id again, a new request: waited 0
    name = "kvbudget_request_queue_time_seconds"
    assert (value(metrics, name + "_count"), value(metrics, name + "_sum")) == (3.0, 5.0)
    assert [value(metrics, name + "_bucket", le=le) for le in ("0.0", "2.5", "5.0")] == [2.0, 2.0, 3.0]
