"""The metrics a vLLM user looks for besides the names: model_name (kvbudget_model_info and
the new series), the prefix cache in tokens, and the queue time by tenant, bounded to the
tenants the config names."""

from __future__ import annotations

from kvbudget.daemon.config.settings import DaemonConfig, TenantQuota
from kvbudget.daemon.core.records import OTHER_TENANTS, Decision, DecisionKind, Reason, TenantSnapshot
from kvbudget.daemon.server.metrics import Metrics
from kvbudget.v1 import common_pb2

from test_metrics import snapshot, value

QUEUE_TIME = "kvbudget_tenant_request_queue_time_seconds"


def described(tenants: tuple[str, ...] = ("chat",), model: str = "llama-3.1-70b", block_size: int = 16) -> Metrics:
    metrics = Metrics()
    config = DaemonConfig(model=model, tensor_parallel_size=4, pipeline_parallel_size=2,
                          tenants={name: TenantQuota(max_share=0.5) for name in tenants})
    metrics.describe_pool(common_pb2.PoolPlan(model=model, block_size_tokens=block_size), config)
    return metrics


def at(time_s: float, kind: DecisionKind, request_id: str, tenant: str, reason: Reason = Reason.FITS) -> Decision:
    return Decision(seq=int(time_s * 10), time_s=time_s, kind=kind, reason=reason, request_id=request_id,
                    tenant=tenant)


def test_the_model_and_its_layout_are_an_info_metric() -> None:
    metrics = described()
    assert value(metrics, "kvbudget_model_info", model_name="llama-3.1-70b", block_size="16",
                 tensor_parallel_size="4", pipeline_parallel_size="2") == 1.0
    assert ('kvbudget_model_info{block_size="16",model_name="llama-3.1-70b",pipeline_parallel_size="2",'
            'tensor_parallel_size="4"} 1.0') in metrics.render().decode()


def test_without_a_description_there_is_no_model_info_and_no_token_counts() -> None:
    """A model of "" or a block size of 0 would be a value, not the absence of one."""
    metrics = Metrics()
    metrics.update(snapshot(prefix_query_blocks=10, prefix_hit_blocks=4))
    text = metrics.render().decode()
    assert "kvbudget_model_info" not in text and "kvbudget_prefix_cache_query_tokens" not in text
    assert value(metrics, "kvbudget_prefix_cache_queries_total") == 10.0  # the block counts as before


def test_prefix_cache_in_tokens_beside_the_block_counts() -> None:
    metrics = described(block_size=16)
    assert value(metrics, "kvbudget_prefix_cache_query_tokens_total", model_name="llama-3.1-70b") == 0.0
    metrics.update(snapshot(prefix_query_blocks=10, prefix_hit_blocks=4))
    metrics.update(snapshot(prefix_query_blocks=25, prefix_hit_blocks=9))
    assert value(metrics, "kvbudget_prefix_cache_query_tokens_total", model_name="llama-3.1-70b") == 400.0  # 25 x 16
    assert value(metrics, "kvbudget_prefix_cache_hit_tokens_total", model_name="llama-3.1-70b") == 144.0  # 9 x 16
    assert value(metrics, "kvbudget_prefix_cache_queries_total") == 25.0  # unchanged: blocks
    assert value(metrics, "kvbudget_prefix_cache_hits_total") == 9.0
    metrics.update(snapshot(prefix_query_blocks=3, prefix_hit_blocks=1))  # the core rebuilt: 3 and 1 are new
    assert value(metrics, "kvbudget_prefix_cache_query_tokens_total", model_name="llama-3.1-70b") == 448.0  # + 48
    assert value(metrics, "kvbudget_prefix_cache_hit_tokens_total", model_name="llama-3.1-70b") == 160.0  # + 16


def test_queue_time_by_tenant_named_ones_apart_the_rest_as_other() -> None:
    metrics = described(tenants=("chat",))
    # Both series exist at 0 before any wait (rate() sees the first one).
    for tenant in ("chat", OTHER_TENANTS):
        assert value(metrics, QUEUE_TIME + "_count", model_name="llama-3.1-70b", tenant=tenant) == 0.0
    metrics.record([at(1.0, DecisionKind.QUEUE, "a", "chat", Reason.POOL_FULL),
                    at(1.5, DecisionKind.QUEUE, "b", "user-17", Reason.POOL_FULL),
                    at(2.0, DecisionKind.QUEUE, "c", "user-18", Reason.POOL_FULL)])
    metrics.record([at(4.0, DecisionKind.ADMIT, "a", "chat"), at(5.0, DecisionKind.ADMIT, "b", "user-17"),
                    at(6.0, DecisionKind.ADMIT, "c", "user-18"), at(6.0, DecisionKind.ADMIT, "d", "chat")])
    labels = dict(model_name="llama-3.1-70b")
    assert value(metrics, QUEUE_TIME + "_count", tenant="chat", **labels) == 2.0  # waited 3 and 0
    assert value(metrics, QUEUE_TIME + "_sum", tenant="chat", **labels) == 3.0
    assert value(metrics, QUEUE_TIME + "_count", tenant=OTHER_TENANTS, **labels) == 2.0  # 3.5 and 4
    assert value(metrics, QUEUE_TIME + "_sum", tenant=OTHER_TENANTS, **labels) == 7.5
    assert value(metrics, QUEUE_TIME + "_bucket", tenant=OTHER_TENANTS, le="2.5", **labels) == 0.0
    assert value(metrics, QUEUE_TIME + "_bucket", tenant=OTHER_TENANTS, le="5.0", **labels) == 2.0
    assert value(metrics, QUEUE_TIME + "_count", tenant="user-17", **labels) is None
    # The whole histogram is the sum of the tenants'.
    assert value(metrics, "kvbudget_request_queue_time_seconds_count") == 4.0
    assert value(metrics, "kvbudget_request_queue_time_seconds_sum") == 10.5


def test_a_tenant_a_reload_names_gets_its_series_from_the_next_snapshot() -> None:
    metrics = described(tenants=())
    metrics.record([at(1.0, DecisionKind.ADMIT, "a", "batch")])
    assert value(metrics, QUEUE_TIME + "_count", model_name="llama-3.1-70b", tenant=OTHER_TENANTS) == 1.0
    # batch now has a quota; anon (no quota, weight 1) is not the config's
    metrics.update(snapshot(tenants=(TenantSnapshot("batch", 0, 0, 100, 1.0, 0, 0),
                                     TenantSnapshot("anon", 0, 0, None, 1.0, 0, 0))))
    metrics.record([at(2.0, DecisionKind.ADMIT, "b", "batch"), at(2.0, DecisionKind.ADMIT, "c", "anon")])
    assert value(metrics, QUEUE_TIME + "_count", model_name="llama-3.1-70b", tenant="batch") == 1.0
    assert value(metrics, QUEUE_TIME + "_count", model_name="llama-3.1-70b", tenant=OTHER_TENANTS) == 2.0
    assert value(metrics, QUEUE_TIME + "_count", model_name="llama-3.1-70b", tenant="anon") is None


def test_many_tenants_in_requests_make_no_more_series() -> None:
    metrics = described(tenants=("chat",))
    metrics.record([at(1.0, DecisionKind.ADMIT, f"r{i}", f"user-{i}") for i in range(1000)])
    text = metrics.render().decode()
    assert sum(line.startswith(QUEUE_TIME + "_count{") for line in text.splitlines()) == 2  # chat, (other)
    assert value(metrics, QUEUE_TIME + "_count", model_name="llama-3.1-70b", tenant=OTHER_TENANTS) == 1000.0
