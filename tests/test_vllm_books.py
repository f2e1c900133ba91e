"""The vLLM adapter's pure parts, without vLLM: the books that fold the daemon's decisions
into what vLLM must do, the drift check, and the settings read from the environment."""

from __future__ import annotations

import pytest

from kvbudget.daemon.core.records import Decision, DecisionKind, Reason
from kvbudget.vllm.books import Books
from kvbudget.vllm.settings import SettingError, read_settings


def decision(seq, kind, rid, reason=Reason.FITS, held=(), num_tokens=0):
    return Decision(seq=seq, time_s=0.0, kind=kind, reason=reason, request_id=rid,
                    blocks_held=held, num_tokens=num_tokens)


def test_admitted_requests_may_start_in_the_daemons_order_queued_ones_wait():
    books = Books(num_groups=2)
    for rid in ("a", "b", "c"):
        books.submitted(rid)
    verdict = books.apply([
        decision(1, DecisionKind.ADMIT, "b", held=(3, 2), num_tokens=40),
        decision(2, DecisionKind.QUEUE, "c", Reason.POOL_FULL),
        decision(3, DecisionKind.ADMIT, "a", held=(1, 1), num_tokens=10),
    ])
    assert verdict.admitted == ["b", "a"]
    assert list(books.ready) == ["b", "a"] and not books.running("c")
    assert books.held == {"b": (3, 2), "a": (1, 1)} and books.slots == {"b": 40, "a": 10}


def test_a_request_preempted_then_denied_in_the_same_step_stays_preempted():
    # The grow of a request preempted earlier in the step is answered DENY not_running:
    # it must not count as running again (vLLM would keep running it, the daemon not).
    books = Books(num_groups=1)
    books.submitted("v")
    books.apply([decision(1, DecisionKind.ADMIT, "v", held=(5,), num_tokens=80)])
    verdict = books.apply([
        decision(2, DecisionKind.PREEMPT, "v", Reason.GROWTH),
        decision(3, DecisionKind.DENY, "v", Reason.NOT_RUNNING),
    ])
    assert verdict.preempted == ["v"] and verdict.denied == {"v"}
    assert not books.running("v") and "v" in books.known


def test_reject_release_and_expire_forget_the_request():
    books = Books(num_groups=1)
    for rid in ("r", "f", "e"):
        books.submitted(rid)
    books.apply([decision(1, DecisionKind.ADMIT, "f", held=(2,)), decision(2, DecisionKind.ADMIT, "e", held=(1,))])
    verdict = books.apply([
        decision(3, DecisionKind.REJECT, "r", Reason.PROMPT_TOO_LONG),
        decision(4, DecisionKind.RELEASE, "f", Reason.FINISHED),
        decision(5, DecisionKind.EXPIRE, "e", Reason.LEASE_EXPIRED),
        decision(6, DecisionKind.GROW, "f", held=(9,)),  # late: ignored, f is gone
    ])
    assert verdict.rejected == {"r": "prompt_too_long"} and verdict.expired == ["e"]
    assert books.known == set() and books.held == {}


def test_drift_names_each_request_whose_blocks_differ_per_group():
    books = Books(num_groups=2)
    for rid in ("same", "more", "only_daemon"):
        books.submitted(rid)
    books.apply([decision(1, DecisionKind.ADMIT, "same", held=(4, 2)),
                 decision(2, DecisionKind.ADMIT, "more", held=(4, 2)),
                 decision(3, DecisionKind.ADMIT, "only_daemon", held=(1, 1))])
    drifts = books.drift({"same": (4, 2), "more": (5, 2), "only_vllm": (3, 0)})
    assert [d.request_id for d in drifts] == ["more", "only_daemon", "only_vllm"]
    assert drifts[0].line() == "request 'more': the daemon holds [4, 2] blocks per KV-cache group, vLLM [5, 2]"
    assert (drifts[1].vllm, drifts[2].daemon) == ((0, 0), (0, 0))
    assert books.drift_total == 3


def test_settings_from_the_environment():
    s = read_settings({"KVBUDGET_TARGET": "gpu7:50051", "KVBUDGET_ENGINE_ID": "vllm-a", "KVBUDGET_FAIL_MODE": "Closed",
                       "KVBUDGET_STEP_TIMEOUT_S": "0.5", "KVBUDGET_TENANT": "team-x", "KVBUDGET_CHECK_ACCOUNTING": "off"})
    assert (s.target, s.engine_id, s.fail_mode, s.step_timeout_s, s.tenant, s.check_accounting) == (
        "gpu7:50051", "vllm-a", "closed", 0.5, "team-x", False)
    defaults = read_settings({})
    assert (defaults.target, defaults.fail_mode, defaults.tenant_field) == (
        "unix:///run/kvbudget/kvbudget.sock", "open", "tenant")
    assert defaults.engine_id.startswith("vllm-")


@pytest.mark.parametrize("name, value, says", [
    ("FAIL_MODE", "sometimes", "KVBUDGET_FAIL_MODE='sometimes': use open or closed"),
    ("STEP_TIMEOUT_S", "soon", "KVBUDGET_STEP_TIMEOUT_S='soon': not a number of seconds"),
    ("STEP_TIMEOUT_S", "0", "KVBUDGET_STEP_TIMEOUT_S='0': must be above 0"),
    ("CHECK_ACCOUNTING", "maybe", "KVBUDGET_CHECK_ACCOUNTING='maybe': use 1/0"),
])
def test_a_bad_setting_names_its_variable(name, value, says):
    with pytest.raises(SettingError) as error:
        read_settings({f"KVBUDGET_{name}": value})
    assert str(error.value).startswith(says)


class FakeRequest:  # the fields of vLLM's Request the adapter reads
    def __init__(self, prompt, outputs=0, extra=None, hashes=()):
        from types import SimpleNamespace

        self.request_id, self.num_prompt_tokens, self.max_tokens, self.priority = "q1", prompt, 100, 3
        self.num_tokens = prompt + outputs
        self.sampling_params = SimpleNamespace(extra_args=extra)
        self.block_hashes = list(hashes)


def test_a_submit_carries_vllms_numbers_tenant_and_block_hashes():
    from kvbudget.vllm.plan import request_tenant, submit_spec

    hashes = [bytes([i]) * 32 for i in (1, 2, 3)]  # vLLM's 32-byte hashes of full blocks
    request = FakeRequest(40, extra={"tenant": "team-a"}, hashes=hashes)
    spec = submit_spec(request, "vllm-a", request_tenant(request, "tenant", "default"), (16, 16))
    assert (spec.request_id, spec.prompt_tokens, spec.max_new_tokens, spec.priority, spec.tenant, spec.engine_id) == (
        "q1", 40, 100, 3, "team-a", "vllm-a")
    # 40 tokens: 2 full blocks; each hash's first 8 bytes, little-endian.
    assert spec.prefix_hashes == (0x0101010101010101, 0x0202020202020202)
    # No tenant of its own: the default. vLLM hashing at another size than the daemon's blocks: no hashes.
    plain = FakeRequest(40, hashes=hashes)
    other = submit_spec(plain, "vllm-a", request_tenant(plain, "tenant", "default"), (16, 32))
    assert (other.tenant, other.prefix_hashes) == ("default", ())


def test_a_request_submitted_again_comes_at_the_length_it_reached():
    from kvbudget.vllm.plan import submit_spec

    spec = submit_spec(FakeRequest(40, outputs=25), "vllm-a", "", (16, 16), resume=True)
    assert (spec.prompt_tokens, spec.max_new_tokens) == (65, 75)  # 100 new tokens in all, 25 made
