"""A recorded Watch stream for the dashboard tests, and the script that wrote it.

`tests/data/tui_watch_stream.jsonl` holds one `WatchResponse` a line (protobuf JSON). It was
written by `python tests/tui_stream.py`: a deterministic 40-update run of a Gemma-like pool
(one full-attention group, one sliding-window group) that fills up, queues, preempts and
reclaims, with two engines, two tenants, a GPU and a running replay. Tests read the file, so
a change to this script shows up as a diff of the data, not as silently different tests.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import json_format

from kvbudget.v1 import common_pb2, observer_pb2

STREAM_PATH = Path(__file__).parent / "data" / "tui_watch_stream.jsonl"
GIB = 2**30


def load_stream(path: Path = STREAM_PATH) -> list[observer_pb2.WatchResponse]:
    lines = path.read_text().splitlines()
    return [json_format.Parse(line, observer_pb2.WatchResponse()) for line in lines if line]


def _decision(seq: int, t: float, kind: int, reason: str, request: str, engine: str,
              tenant: str, held: tuple[int, int], reserved: tuple[int, int], free: int,
              waiting: int, running: int) -> common_pb2.Decision:
    return common_pb2.Decision(
        seq=seq, time_unix_s=t, kind=kind, reason=reason, request_id=request,
        engine_id=engine, tenant=tenant, policy=common_pb2.POLICY_OPTIMISTIC,
        prompt_tokens=1000 + 16 * (seq % 50), max_new_tokens=256, num_tokens=1024,
        num_computed_tokens=512, blocks_reserved=reserved, blocks_held=held,
        new_blocks=[common_pb2.GroupBlocks(group_index=0, block_ids=[seq % 4096])]
        if kind == common_pb2.DECISION_KIND_ADMIT else [],
        freed_blocks=held[0] + held[1] if kind == common_pb2.DECISION_KIND_RELEASE else 0,
        num_free_blocks=free, num_waiting=waiting, num_running=running,
    )


def synthetic_stream(updates: int = 40) -> list[observer_pb2.WatchResponse]:
    start = 1_764_400_000.0  # a fixed daemon clock
    # The daemon started 2 h 13 min before the recording: the status line says "up 2h13m"
    # throughout its 20 s. A fixed version, not this package's: the recording stays put.
    started = start - (2 * 3600 + 13 * 60)
    capacity = 4096
    plan = common_pb2.PoolPlan(
        model="google/gemma-3-4b-it", block_size_tokens=16, num_blocks=capacity,
        page_size_bytes=8192, layers_per_group=29, bytes_per_block=237568,
        max_model_len_tokens=8192, max_num_batched_tokens=2048,
    )
    kinds = [
        (common_pb2.DECISION_KIND_ADMIT, "fits"),
        (common_pb2.DECISION_KIND_GROW, "fits"),
        (common_pb2.DECISION_KIND_QUEUE, "budget_full"),
        (common_pb2.DECISION_KIND_RECLAIM, "window"),
        (common_pb2.DECISION_KIND_PREEMPT, "growth"),
        (common_pb2.DECISION_KIND_RELEASE, "finished"),
        (common_pb2.DECISION_KIND_REJECT, "never_fits"),
    ]
    stream = []
    seq = 0
    preemptions = 0
    for i in range(updates):
        t = start + 0.5 * i
        held = min(capacity - 40, 600 + 95 * i)
        reserved = min(capacity - held, 300 + 10 * i)
        evictable = 120
        free = capacity - held
        running = min(48, 6 + i)
        waiting = max(0, i - 20)
        if i >= 25:
            preemptions += 2
        decisions = []
        for j in range(5):
            seq += 1
            kind, reason = kinds[seq % len(kinds)]
            decisions.append(_decision(
                seq, t, kind, reason, f"req-{seq:05d}", f"vllm-{seq % 2}",
                ("acme", "globex")[seq % 2], (40 + seq % 30, 8), (64, 9), free, waiting, running,
            ))
        snapshot = common_pb2.Snapshot(
            time_unix_s=t, policy=common_pb2.POLICY_OPTIMISTIC, num_blocks=capacity,
            num_free_blocks=free, num_held_blocks=held, num_reserved_blocks=reserved,
            num_evictable_blocks=evictable, num_running=running, num_waiting=waiting,
            num_preemptions=preemptions,
            preemptions_by_reason={"growth": preemptions} if preemptions else {},
            rejections_by_reason={"never_fits": 3, "tenant_quota": 1 + i // 10},
            decisions_by_kind={"admit": 3 * seq // 5, "grow": seq - 3 * seq // 5},
            groups=[
                common_pb2.GroupState(layer_type="full_attention", description="full_attention",
                                      num_layers=5, blocks_held=held // 3,
                                      blocks_reserved=reserved // 3, blocks_reclaimed=0),
                common_pb2.GroupState(layer_type="sliding_window",
                                      description="sliding_window W=1024", num_layers=29,
                                      blocks_held=held - held // 3,
                                      blocks_reserved=reserved - reserved // 3,
                                      blocks_reclaimed=37 * i),
            ],
            tenants=[
                common_pb2.TenantState(tenant="acme", blocks_held=held // 2,
                                       blocks_reserved=reserved // 2, quota_blocks=2048,
                                       weight=1.0, running=running // 2, waiting=waiting // 2),
                common_pb2.TenantState(tenant="globex", blocks_held=held - held // 2,
                                       blocks_reserved=reserved - reserved // 2,
                                       weight=1.0, running=running - running // 2,
                                       waiting=waiting - waiting // 2),
            ],
            engines=[
                common_pb2.EngineState(engine_id="vllm-0", session_id="s-0a1b2c",
                                       lease_remaining_s=9.5, blocks_held=held // 2,
                                       running=running // 2, waiting=waiting // 2),
                common_pb2.EngineState(engine_id="vllm-1", session_id="s-3d4e5f",
                                       lease_remaining_s=0.0 if i > 35 else 8.0,
                                       blocks_held=held - held // 2,
                                       running=running - running // 2,
                                       waiting=waiting - waiting // 2),
            ],
            gpu=common_pb2.GpuState(present=True, name="NVIDIA H200", total_bytes=141 * GIB,
                                    used_bytes=100 * GIB + 2 * GIB * (i >= 38),
                                    free_bytes=41 * GIB, pool_bytes=80 * GIB),
            replays=[common_pb2.ReplayState(replay_id="r1",
                                            trace="mooncake_fast25_conversation_trace.jsonl",
                                            position=50 * i, total=2000, speed=10.0,
                                            policy="optimistic")],
            prefix_hit_blocks=300, prefix_query_blocks=1200, plan=plan,
            started_unix_s=started, daemon_version="0.1.0",
        )
        stream.append(observer_pb2.WatchResponse(snapshot=snapshot, decisions=decisions))
    return stream


if __name__ == "__main__":
    STREAM_PATH.parent.mkdir(parents=True, exist_ok=True)
    with STREAM_PATH.open("w") as out:
        for response in synthetic_stream():
            out.write(json_format.MessageToJson(response, indent=None) + "\n")
    print(f"wrote {STREAM_PATH}")
