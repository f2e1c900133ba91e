"""`guaranteed` keeps its word (issue 28, point 4): within the engine contract (slots at most
F = max_num_batched_tokens ahead of the computed tokens) a guaranteed request is never
denied up to its maximum length; a grow past the contract is refused as INVALID_ARGUMENT
naming it, where it used to be answered DENY `over_reservation` with hundreds of blocks free.

The issue's case: gemma-3-27b (6 sliding-window groups of window 1024 and one full group,
16-token blocks), F = 512, max_model_len 4096. Each request of L = 600 + 3496 = 4096 tokens
reserves, per window group, cdiv(1023 + 512, 16) + 1 = 97 blocks (its window plus a chunk
in flight), and 256 in the full group. Grown to 3000 slots with nothing computed, a window
group would hold cdiv(3000, 16) = 188 blocks: 91 past its reservation in each.
"""

from __future__ import annotations

import grpc
import pytest

from kvbudget.daemon.config.hf_config import load_model
from kvbudget.daemon.core.admission import AdmissionConfig, AdmissionController
from kvbudget.daemon.core.records import DecisionKind, Reason, RequestSpec
from kvbudget.daemon.core.step import StepOps, apply_step
from kvbudget.daemon.core.validation import Problem, StepRejected, validate_step
from kvbudget.v1 import common_pb2, engine_pb2, engine_pb2_grpc, observer_pb2, observer_pb2_grpc

from daemon_harness import DaemonProcess

F = 512
L = 4096
POOL = 2000
CONTRACT = "the engine contract for a guaranteed request is at most max_num_batched_tokens (512) ahead"


def controller() -> AdmissionController:
    """Two guaranteed requests "a" and "b" of engine e1, each 600 + 3496 tokens, admitted
    with their first chunk (512 slots, nothing computed)."""
    layout = load_model("gemma-3-27b").layout
    config = AdmissionConfig(max_model_len=L, max_num_batched_tokens=F, policy="guaranteed")
    ctrl = AdmissionController(layout, POOL, config)
    for rid in ("a", "b"):
        [admit] = ctrl.submit(RequestSpec(rid, 600, 3496, engine_id="e1"), 0.0)
        assert (admit.kind, ctrl.find(rid).num_tokens) == (DecisionKind.ADMIT, F)
    return ctrl


def test_a_grow_past_the_contract_is_refused_naming_it_not_denied() -> None:
    ctrl = controller()
    free = ctrl.pool.num_free_blocks
    assert free > 1000  # hundreds of blocks free (promised to the two requests' windows)
    # Never reported progress: 3000 slots are 3000 ahead of nothing computed.
    with pytest.raises(StepRejected) as refused:
        validate_step(StepOps(grows=[("a", 3000)]), "e1", ctrl.find, 16)
    assert refused.value.kind is Problem.INVALID
    assert refused.value.field == "grows[0].num_tokens"
    assert CONTRACT in str(refused.value)
    assert "3000 slots are 3000 ahead of the 0 computed tokens" in str(refused.value)
    # Progress reported in the same step counts (applied before the grows): 512 computed.
    with pytest.raises(StepRejected, match="1025 slots are 513 ahead of the 512 computed"):
        validate_step(StepOps(progress=[("a", 512)], grows=[("a", 1025)]), "e1", ctrl.find, 16)
    validate_step(StepOps(progress=[("a", 512)], grows=[("a", 1024)]), "e1", ctrl.find, 16)  # exactly F ahead
    # What the daemon used to answer for that grow (the controller itself still does, for
    # direct users of the core: the refusal is at the step's edge).
    [deny] = ctrl.grow("a", 3000, 0.0)
    assert (deny.kind, deny.reason, ctrl.pool.num_free_blocks) == (DecisionKind.DENY, Reason.OVER_RESERVATION, free)


def test_within_the_contract_a_guaranteed_request_is_never_denied_up_to_its_maximum() -> None:
    # Both requests grow as far ahead as the contract allows, every step, to L: every grow
    # fits its reservation (window blocks that left the window go back on the way).
    ctrl = controller()
    kinds: set[DecisionKind] = set()
    while ctrl.num_running:
        ops = StepOps()
        for r in ctrl.running_requests():
            if r.num_tokens == r.max_len:
                ops.finishes.append(r.request_id)
            else:
                ops.progress.append((r.request_id, r.num_tokens))
                ops.grows.append((r.request_id, min(r.max_len, r.num_tokens + F)))
        validate_step(ops, "e1", ctrl.find, 16)
        kinds.update(d.kind for d in apply_step(ctrl, ops, 1.0))
        ctrl.check_integrity()
    assert kinds == {DecisionKind.GROW, DecisionKind.RECLAIM, DecisionKind.RELEASE}


@pytest.mark.slow
def test_the_daemon_answers_a_grow_past_the_contract_invalid_argument(tmp_path) -> None:
    args = ("--model", "gemma-3-27b", "--max-model-len", str(L), "--max-num-batched-tokens", str(F),
            "--num-gpu-blocks", str(POOL + 1), "--policy", "guaranteed")
    with DaemonProcess(tmp_path, *args) as process, grpc.insecure_channel(process.target) as channel:
        engine = engine_pb2_grpc.EngineServiceStub(channel)
        observer = observer_pb2_grpc.ObserverServiceStub(channel)
        session = engine.OpenSession(engine_pb2.OpenSessionRequest(engine_id="e1", lease_ttl_s=600)).session_id
        submits = [engine_pb2.Submit(request_id=rid, prompt_tokens=600, max_new_tokens=3496) for rid in "ab"]
        reply = engine.Step(engine_pb2.StepRequest(session_id=session, submits=submits))
        assert [d.kind for d in reply.decisions] == [common_pb2.DECISION_KIND_ADMIT] * 2
        free = observer.GetSnapshot(observer_pb2.GetSnapshotRequest()).snapshot.num_free_blocks
        with pytest.raises(grpc.RpcError) as refused:
            engine.Step(engine_pb2.StepRequest(session_id=session, grows=[engine_pb2.Grow(request_id="a", num_tokens=3000)]))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details().startswith("grows[0].num_tokens: 3000 slots are 3000 ahead")
        assert CONTRACT in refused.value.details()
        assert observer.GetSnapshot(observer_pb2.GetSnapshotRequest()).snapshot.num_free_blocks == free
        # With its progress reported, the same request grows F ahead of it.
        [grow] = engine.Step(engine_pb2.StepRequest(
            session_id=session, progress=[engine_pb2.Progress(request_id="a", num_computed_tokens=512)],
            grows=[engine_pb2.Grow(request_id="a", num_tokens=1024)],
        )).decisions
        assert (grow.kind, grow.reason) == (common_pb2.DECISION_KIND_GROW, "fits")
