"""The adapter's books: what the daemon decided about each of this engine's requests, and
what vLLM must do about it in the coming `schedule()`. Pure: no vLLM, no grpc.

`apply` folds one step's decisions (Events ones first) into a `Verdict`: the waiting
requests vLLM may start (in the daemon's order), the running ones to preempt, those whose
growth was denied this step, and those rejected. `drift` compares the daemon's held blocks
with vLLM's, per request and KV-cache group.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter

from kvbudget.daemon.core.records import Decision, DecisionKind

# Decisions that say what a running request holds. (A DENY does not: `not_running` comes
# for a request this very step preempted, and must not make it running again.)
_HOLDS = (DecisionKind.ADMIT, DecisionKind.GROW, DecisionKind.RECLAIM)
_GONE = (DecisionKind.RELEASE, DecisionKind.EXPIRE, DecisionKind.REJECT)
_REQUEST_ID = attrgetter("request_id")


@dataclass
class Verdict:
    admitted: list[str] = field(default_factory=list)  # may start now, in the daemon's order
    preempted: list[str] = field(default_factory=list)
    denied: set[str] = field(default_factory=set)
    rejected: dict[str, str] = field(default_factory=dict)  # request id -> reason
    expired: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Drift:
    request_id: str
    daemon: tuple[int, ...]
    vllm: tuple[int, ...]

    def line(self) -> str:
        return (f"request {self.request_id!r}: the daemon holds {list(self.daemon)} blocks per KV-cache "
                f"group, vLLM {list(self.vllm)}")


class Books:
    def __init__(self, num_groups: int) -> None:
        self.num_groups = num_groups
        self.held: dict[str, tuple[int, ...]] = {}  # running in the daemon: blocks per group
        self.slots: dict[str, int] = {}  # running in the daemon: slots held
        self.computed: dict[str, int] = {}  # last progress reported
        self.known: set[str] = set()  # submitted and not ended in the daemon
        self.ready: dict[str, None] = {}  # admitted by the daemon, not yet started by vLLM: in its order
        self.drift_total = 0

    def apply(self, decisions: Iterable[Decision]) -> Verdict:
        verdict = Verdict()
        for d in decisions:
            rid, kind = d.request_id, d.kind
            if rid not in self.known:
                continue  # (one already ended here: a late event)
            if kind in _HOLDS:
                self.held[rid] = tuple(d.blocks_held) or (0,) * self.num_groups
                self.slots[rid] = d.num_tokens
            if kind is DecisionKind.ADMIT:
                self.ready[rid] = None
                verdict.admitted.append(rid)
            elif kind is DecisionKind.DENY:
                verdict.denied.add(rid)
            elif kind is DecisionKind.PREEMPT:
                self._forget_blocks(rid)
                verdict.preempted.append(rid)
            elif kind in _GONE:
                self.forget(rid)
                if kind is DecisionKind.REJECT:
                    verdict.rejected[rid] = d.reason.value
                elif kind is DecisionKind.EXPIRE:
                    verdict.expired.append(rid)
        return verdict

    def submitted(self, request_id: str) -> None:
        self.known.add(request_id)

    def running(self, request_id: str) -> bool:
        return request_id in self.held

    def _forget_blocks(self, request_id: str) -> None:
        self.held.pop(request_id, None)
        self.slots.pop(request_id, None)
        self.computed.pop(request_id, None)
        self.ready.pop(request_id, None)

    def forget(self, request_id: str) -> None:
        self._forget_blocks(request_id)
        self.known.discard(request_id)

    def forget_all(self) -> None:
        for request_id in list(self.known):
            self.forget(request_id)

    def drift(self, vllm_held: Mapping[str, tuple[int, ...]]) -> list[Drift]:
        """Every request whose blocks differ: vLLM's (non-null, per group) against the daemon's.
        A request only one side holds blocks for counts too."""
        zero, held = (0,) * self.num_groups, self.held
        found = [Drift(rid, held.get(rid, zero), tuple(theirs)) for rid, theirs in vllm_held.items()
                 if held.get(rid, zero) != tuple(theirs)]
        found += [Drift(rid, ours, zero) for rid, ours in held.items() if rid not in vllm_held and ours != zero]
        found.sort(key=_REQUEST_ID)  # (in request id order)
        self.drift_total += len(found)
        return found
