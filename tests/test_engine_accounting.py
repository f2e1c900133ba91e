"""Per-engine figures in the snapshot (EngineState): an engine's blocks held are its distinct
pool blocks, so a prefix block its requests share counts once (core_service._engine_tally).

Every figure below is worked out by hand; `check_integrity` recounts the pool from the block
tables after every operation.
"""

from __future__ import annotations

import time

import pytest

from kvbudget.daemon.admission import AdmissionConfig, AdmissionController
from kvbudget.daemon.core_service import CoreService
from kvbudget.daemon.decision_log import DecisionLog
from kvbudget.daemon.records import RequestSpec
from kvbudget.daemon.sessions import SessionTable
from kvbudget.daemon.spec import group_layers
from kvbudget.daemon.watch import WatchHub
from kvbudget.v1 import common_pb2

from test_admission_support import full_spec, kinds

BLOCK_SIZE = 16
PREFIX = (101, 102)  # a 32-token prefix: 2 full prompt blocks every request below shares


@pytest.fixture
def core(tmp_path):
    layout = group_layers([full_spec(BLOCK_SIZE)])  # one full-attention group
    config = AdmissionConfig(max_model_len=256, max_num_batched_tokens=256, watermark=0.0, policy="guaranteed")
    controller = AdmissionController(layout, 20, config)
    decision_log = DecisionLog(tmp_path / "decisions.db")
    decision_log.start()
    service = CoreService(
        controller, decision_log, common_pb2.PoolPlan(block_size_tokens=BLOCK_SIZE),
        SessionTable(600.0, max_ttl_s=3600.0, max_sessions=8), WatchHub(4),
    )
    for engine_id in ("e", "f"):
        service.sessions.open(engine_id, 600.0, time.monotonic())
    yield service
    decision_log.close()
    controller.check_integrity()


def shared(request_id: str, engine_id: str) -> RequestSpec:
    """40 tokens: the 2 shared prefix blocks (hits once published) and 1 block of its own."""
    return RequestSpec(request_id, 40, 0, PREFIX, engine_id=engine_id)


def engines(core: CoreService) -> dict[str, tuple[int, int, int]]:
    """(blocks held, running, waiting) per engine, as the snapshot says."""
    return {e.engine_id: (e.blocks_held, e.running, e.waiting) for e in core.snapshot_proto(fresh=True).engines}


def test_a_prefix_two_requests_of_one_engine_share_counts_once(core: CoreService) -> None:
    ctrl = core.controller
    # a: cdiv(40, 16) = 3 blocks; its progress publishes its 2 full prompt blocks.
    assert kinds(ctrl.submit(shared("a", "e"), 0.0)) == [("admit", "fits", "a")]
    ctrl.progress("a", 40, 0.0)
    ctrl.check_integrity()
    assert engines(core)["e"] == (3, 1, 0)
    # b hits a's 2 blocks and takes 1 of its own: the pool holds 3 + 1 = 4, and so does
    # engine e (summing each request's 3 would say 6, more than the pool holds).
    assert kinds(ctrl.submit(shared("b", "e"), 0.0)) == [("admit", "prefix_hit", "b")]
    ctrl.check_integrity()
    assert ctrl.pool.num_held_blocks == 4
    assert engines(core) == {"e": (4, 2, 0), "f": (0, 0, 0)}
    # a ends: its own block goes, the 2 shared stay with b: 2 + 1 = 3.
    assert kinds(ctrl.finish("a", 1.0)) == [("release", "finished", "a")]
    ctrl.check_integrity()
    assert ctrl.pool.num_held_blocks == 3
    assert engines(core)["e"] == (3, 1, 0)


def test_a_prefix_two_engines_share_counts_once_for_each(core: CoreService) -> None:
    ctrl = core.controller
    ctrl.submit(shared("a", "e"), 0.0)
    ctrl.progress("a", 40, 0.0)
    ctrl.submit(shared("b", "e"), 0.0)
    # c (engine f) hits the same 2 blocks and takes 1 of its own: the pool holds 4 + 1 = 5;
    # e holds 4 (2 shared + a's 1 + b's 1), f holds 3 (2 shared + c's 1). 4 + 3 = 7 is the
    # pool's 5 plus the 2 blocks the two engines share, each counted by both.
    assert kinds(ctrl.submit(shared("c", "f"), 0.0)) == [("admit", "prefix_hit", "c")]
    ctrl.check_integrity()
    assert ctrl.pool.num_held_blocks == 5
    assert engines(core) == {"e": (4, 2, 0), "f": (3, 1, 0)}
    # e's requests end: f's figure does not move (no block changes hands).
    ctrl.finish("a", 1.0)
    ctrl.finish("b", 1.0)
    ctrl.check_integrity()
    assert ctrl.pool.num_held_blocks == 3
    assert engines(core) == {"e": (0, 0, 0), "f": (3, 1, 0)}
