"""The records the core emits: requests in, decisions and snapshots out.

These are plain frozen dataclasses so the decision log, metrics, gRPC server, replayer and
tests all consume the same stream without knowing the controller's internals.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class DecisionKind(str, enum.Enum):
    ADMIT = "admit"  # request admitted: blocks granted (and possibly reserved)
    QUEUE = "queue"  # request put in the waiting queue
    REJECT = "reject"  # request refused for good
    GROW = "grow"  # more blocks granted to a running request
    DENY = "deny"  # growth refused (the engine must wait, or the policy preempts)
    PREEMPT = "preempt"  # running request stopped, its blocks taken back, queued to recompute
    RECLAIM = "reclaim"  # blocks that left a sliding window / chunk went back to the pool
    RELEASE = "release"  # request finished or aborted: its blocks went back
    EXPIRE = "expire"  # the engine's lease lapsed: the request's blocks went back
    POLICY = "policy"  # the admission policy was switched
    ADMIN = "admin"  # an operator changed a setting (a quota, a drain): detail is "by WHO: BEFORE -> AFTER"


class Reason(str, enum.Enum):
    NONE = "none"
    FITS = "fits"  # admitted / grown within the pool
    PREFIX_HIT = "prefix_hit"  # admitted, part of it from the prefix cache
    POOL_FULL = "pool_full"  # not enough free blocks now
    BUDGET_FULL = "budget_full"  # blocks are free but promised (reserved) to running requests
    WATERMARK = "watermark"  # would dip below the optimistic watermark
    QUEUE_AHEAD = "queue_ahead"  # FCFS: earlier requests are waiting
    TENANT_QUOTA = "tenant_quota"  # tenant at its share of the pool
    NEVER_FITS = "never_fits"  # worst case exceeds the whole pool
    PROMPT_TOO_LONG = "prompt_too_long"  # prompt longer than max_model_len
    QUEUE_FULL = "queue_full"
    DEADLINE = "deadline"  # deadline passed while waiting
    GROWTH = "growth"  # preempted to let another request grow
    PRIORITY = "priority"  # preempted for a higher-priority request
    WINDOW = "window"  # blocks left the sliding window / chunk
    FINISHED = "finished"
    ABORTED = "aborted"
    LEASE_EXPIRED = "lease_expired"
    DAEMON_RESTART = "daemon_restart"  # left open by a daemon that was killed or crashed
    DRAINING = "draining"
    # Grew past what was reserved, nothing spare. Never a guaranteed request's over the
    # wire: a grow past the engine contract is refused there (validation.py), not denied.
    OVER_RESERVATION = "over_reservation"
    SWITCH = "switch"
    QUOTA = "quota"  # ADMIN: a tenant's quota or weight changed
    NOT_RUNNING = "not_running"  # grow for a request that is waiting (e.g. preempted this step)


@dataclass(frozen=True)
class RequestSpec:
    """What an engine tells us about a request when it submits it."""

    request_id: str
    prompt_tokens: int
    max_new_tokens: int | None = None  # None: up to max_model_len
    prefix_hashes: tuple[int, ...] = ()  # chained hashes of full prompt blocks, in order
    priority: int = 0  # lower value = more important (vLLM's convention)
    tenant: str = ""
    engine_id: str = ""
    deadline_s: float | None = None  # absolute time by which it must be admitted
    arrival_s: float = 0.0


@dataclass(frozen=True)
class Decision:
    """One state change, as the log, metrics and dashboard see it."""

    seq: int
    time_s: float
    kind: DecisionKind
    reason: Reason
    request_id: str
    engine_id: str = ""
    tenant: str = ""
    policy: str = ""
    prompt_tokens: int = 0
    max_new_tokens: int = 0
    num_tokens: int = 0  # slots the request holds after this decision
    num_computed: int = 0
    blocks_reserved: tuple[int, ...] = ()  # per group: promised, including held
    blocks_held: tuple[int, ...] = ()  # per group: actually allocated
    new_block_ids: tuple[tuple[int, ...], ...] = ()  # per group: ids granted by this decision
    freed_blocks: int = 0  # blocks returned by this decision
    cached_hit_blocks: int = 0  # prefix blocks reused (per request, not per group)
    num_free_blocks: int = 0  # pool after the decision (free + evictable)
    num_waiting: int = 0
    num_running: int = 0
    detail: str = ""


@dataclass(frozen=True)
class GroupSnapshot:
    kind: str  # LayerKind value
    description: str  # e.g. "sliding_window W=4096"
    num_layers: int
    blocks_held: int
    blocks_reserved: int  # promised but not yet held
    blocks_reclaimed: int  # cumulative, left a window / chunk


# A snapshot lists every tenant the config names (a quota or a weight) and, of the others,
# at most MAX_SNAPSHOT_TENANTS entries: the largest (blocks held and reserved, then requests
# running and waiting, then name) and, when there are more, one entry OTHER_TENANTS summing
# the rest. Tenant names come from the engines' requests (often a user id), so 20,000 of them
# made every snapshot, and every Watch update at up to 10 Hz, carry 20,000 entries.
# `Snapshot.num_tenants` says how many there are. The order is /metrics' own
# (metrics._tenant_rank), and the cap above its MAX_TENANT_SERIES, so its named series, read
# from a snapshot, are the true largest and its "(other)" sum stays exact.
MAX_SNAPSHOT_TENANTS = 100
MAX_TENANT_CHARS = 128  # a tenant name engines may send: printable, at most this many characters
OTHER_TENANTS = "(other)"  # the sum of the tenants past a snapshot's (and /metrics') list
RESERVED_TENANT = f"{OTHER_TENANTS!r} is reserved: it names the sum of the tenants past the snapshot's list"


@dataclass(frozen=True)
class TenantSnapshot:
    tenant: str
    blocks_held: int
    blocks_reserved: int
    quota_blocks: int | None
    weight: float
    running: int
    waiting: int


@dataclass(frozen=True)
class Snapshot:
    time_s: float
    policy: str
    num_blocks: int  # capacity, null block excluded
    num_free_blocks: int  # free + evictable
    num_held_blocks: int
    num_reserved_blocks: int  # promised but not yet held
    num_evictable_blocks: int
    num_running: int
    num_waiting: int
    num_preemptions: int
    preemptions_by_reason: dict[str, int] = field(default_factory=dict)
    rejections_by_reason: dict[str, int] = field(default_factory=dict)
    decisions_by_kind: dict[str, int] = field(default_factory=dict)
    groups: tuple[GroupSnapshot, ...] = ()
    tenants: tuple[TenantSnapshot, ...] = ()  # bounded: see MAX_SNAPSHOT_TENANTS
    prefix_hit_blocks: int = 0
    prefix_query_blocks: int = 0
    # Waiting requests by why their last try failed (pool_full, budget_full, watermark,
    # tenant_quota; queue_ahead: not tried yet, others are ahead): what holds the queue.
    waiting_by_reason: dict[str, int] = field(default_factory=dict)
    waiting_by_engine: dict[str, int] = field(default_factory=dict)  # engine id -> waiting requests
    # How many tenants the daemon knows: more than len(tenants) when the list was cut (its
    # last entry is then OTHER_TENANTS). None: not given (len(tenants) is all of them).
    num_tenants: int | None = None

    @property
    def usage(self) -> float:
        return self.num_held_blocks / self.num_blocks if self.num_blocks else 0.0


_new_object = object.__new__
_set_attribute = object.__setattr__
# Every Decision field, in order: new_decision copies this and fills it in.
_DECISION_FIELDS = dict.fromkeys(Decision.__dataclass_fields__)


def new_decision(
    seq: int, time_s: float, kind: DecisionKind, reason: Reason, request_id: str,
    engine_id: str, tenant: str, policy: str, prompt_tokens: int, max_new_tokens: int,
    num_tokens: int, num_computed: int, blocks_reserved: tuple[int, ...],
    blocks_held: tuple[int, ...], new_block_ids: tuple[tuple[int, ...], ...],
    freed_blocks: int, cached_hit_blocks: int, num_free_blocks: int, num_waiting: int,
    num_running: int, detail: str,
) -> Decision:
    """`Decision(...)` with every field given, at a quarter of the cost.

    The controller makes two decisions per submit + finish; the frozen dataclass __init__
    pays one `object.__setattr__` per field (21). This sets the instance dict in one go,
    filling a copy of a dict that has the keys already: a 21-key dict display is built key
    by key (too long for one BUILD_CONST_KEY_MAP), growing as it goes, which costs about a
    third more. The result is an ordinary Decision: equal, hashable, frozen,
    `dataclasses.replace`-able.
    """
    fields = _DECISION_FIELDS.copy()
    fields["seq"] = seq
    fields["time_s"] = time_s
    fields["kind"] = kind
    fields["reason"] = reason
    fields["request_id"] = request_id
    fields["engine_id"] = engine_id
    fields["tenant"] = tenant
    fields["policy"] = policy
    fields["prompt_tokens"] = prompt_tokens
    fields["max_new_tokens"] = max_new_tokens
    fields["num_tokens"] = num_tokens
    fields["num_computed"] = num_computed
    fields["blocks_reserved"] = blocks_reserved
    fields["blocks_held"] = blocks_held
    fields["new_block_ids"] = new_block_ids
    fields["freed_blocks"] = freed_blocks
    fields["cached_hit_blocks"] = cached_hit_blocks
    fields["num_free_blocks"] = num_free_blocks
    fields["num_waiting"] = num_waiting
    fields["num_running"] = num_running
    fields["detail"] = detail
    decision = _new_object(Decision)
    _set_attribute(decision, "__dict__", fields)
    return decision


# new_decision spells the fields out for speed; make sure it follows the dataclass.
assert new_decision.__code__.co_varnames[: new_decision.__code__.co_argcount] == tuple(
    Decision.__dataclass_fields__
), "records.Decision changed: update new_decision"
assert vars(new_decision(*range(21))) == dict(zip(Decision.__dataclass_fields__, range(21))), (
    "new_decision: a field is misspelt"
)


def new_request_spec(
    request_id: str, prompt_tokens: int, max_new_tokens: int | None, prefix_hashes: tuple[int, ...],
    priority: int, tenant: str, engine_id: str, deadline_s: float | None, arrival_s: float,
) -> RequestSpec:
    """`RequestSpec(...)` with every field given, cheaper (one per submit of every Step);
    see new_decision. The result is an ordinary RequestSpec."""
    spec = _new_object(RequestSpec)
    _set_attribute(spec, "__dict__", {
        "request_id": request_id, "prompt_tokens": prompt_tokens, "max_new_tokens": max_new_tokens,
        "prefix_hashes": prefix_hashes, "priority": priority, "tenant": tenant, "engine_id": engine_id,
        "deadline_s": deadline_s, "arrival_s": arrival_s,
    })
    return spec


assert new_request_spec.__code__.co_varnames[: new_request_spec.__code__.co_argcount] == tuple(
    RequestSpec.__dataclass_fields__
), "records.RequestSpec changed: update new_request_spec"
