"""The messages an engine sends (Submit, StepRequest) and the reading of a policy switch.

Pure message building, no grpc: the replayer and the benches build steps with these too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kvbudget.daemon.core.records import RequestSpec
from kvbudget.daemon.wire import convert
from kvbudget.v1 import admin_pb2, engine_pb2


def submit_message(spec: RequestSpec | engine_pb2.Submit) -> engine_pb2.Submit:
    if isinstance(spec, engine_pb2.Submit):
        return spec
    try:
        msg = engine_pb2.Submit(
            request_id=spec.request_id,
            prompt_tokens=spec.prompt_tokens,
            prefix_hashes=spec.prefix_hashes,
            priority=spec.priority,
            tenant=spec.tenant,
            deadline_unix_s=spec.deadline_s or 0.0,
        )
        if spec.max_new_tokens is not None:
            msg.max_new_tokens = spec.max_new_tokens
    except (ValueError, TypeError) as exc:
        # protobuf's own words name no field ("Value out of range: -1"); as the daemon would
        # refuse it, name the field (a count the wire cannot carry never reaches the daemon).
        raise ValueError(f"submit {spec.request_id!r}: {_unsendable_field(spec)}: {exc}") from None
    return msg


def _unsendable_field(spec: RequestSpec) -> str:
    """The first field of `spec` the Submit message cannot carry (uint32 counts, uint64 hashes)."""
    for name in ("prompt_tokens", "max_new_tokens"):
        value = getattr(spec, name)
        if value is not None and not (isinstance(value, int) and 0 <= value < 2**32):
            return name
    if not all(isinstance(h, int) and 0 <= h < 2**64 for h in spec.prefix_hashes):
        return "prefix_hashes"
    if not (isinstance(spec.priority, int) and -(2**31) <= spec.priority < 2**31):
        return "priority"
    return "a field"


def step_message(
    session_id: str,
    submits: Iterable[RequestSpec | engine_pb2.Submit] = (),
    grows: Iterable[tuple[str, int]] = (),
    progress: Iterable[tuple[str, int]] = (),
    finishes: Iterable[str] = (),
    aborts: Iterable[str] = (),
    admit_tokens: int | None = None,
    admit_seqs: int | None = None,
) -> engine_pb2.StepRequest:
    """`admit_tokens` / `admit_seqs`: what the step can still start (StepRequest's comment);
    None: unset, no bound. A negative count is sent as 0."""
    # Each op is built in place with the repeated field's `add`: building them apart and
    # handing lists to the constructor copies every one (twice the cost of a replay step).
    message = engine_pb2.StepRequest(session_id=session_id)
    if submits:
        message.submits.extend([submit_message(s) for s in submits])
    add = message.grows.add
    for request_id, num_tokens in grows:
        add(request_id=request_id, num_tokens=num_tokens)
    add = message.progress.add
    for request_id, num_computed_tokens in progress:
        add(request_id=request_id, num_computed_tokens=num_computed_tokens)
    add = message.finishes.add
    for request_id in finishes:
        add(request_id=request_id)
    add = message.aborts.add
    for request_id in aborts:
        add(request_id=request_id)
    if admit_tokens is not None:
        message.admit_tokens = max(0, admit_tokens)
    if admit_seqs is not None:
        message.admit_seqs = max(0, admit_seqs)
    return message


@dataclass(frozen=True)
class PolicySwitch:
    """What `set_policy` did: the policy before, and what the switch did to the waiting
    queue at once (admitted; rejected by reason). `changed` is False when the policy asked
    for was in force already (nothing logged, nothing moved)."""

    previous: str
    policy: str
    num_admitted: int = 0
    rejected_by_reason: dict[str, int] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return self.previous != self.policy

    @property
    def num_rejected(self) -> int:
        return sum(self.rejected_by_reason.values())


def policy_switch(policy: str, response: admin_pb2.SetPolicyResponse) -> PolicySwitch:
    """A SetPolicy reply as a `PolicySwitch` (the CLI's blocking call reads it too)."""
    return PolicySwitch(
        previous=convert.policy_from_proto(response.previous) or "",
        policy=policy,
        num_admitted=response.num_admitted,
        rejected_by_reason=dict(sorted(response.rejected_by_reason.items())),
    )
