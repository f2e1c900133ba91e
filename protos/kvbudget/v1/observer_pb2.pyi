from kvbudget.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WatchRequest(_message.Message):
    __slots__ = ("interval_ms", "max_decisions")
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_DECISIONS_FIELD_NUMBER: _ClassVar[int]
    interval_ms: int
    max_decisions: int
    def __init__(self, interval_ms: _Optional[int] = ..., max_decisions: _Optional[int] = ...) -> None: ...

class WatchResponse(_message.Message):
    __slots__ = ("snapshot", "decisions", "dropped_decisions")
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_DECISIONS_FIELD_NUMBER: _ClassVar[int]
    snapshot: _common_pb2.Snapshot
    decisions: _containers.RepeatedCompositeFieldContainer[_common_pb2.Decision]
    dropped_decisions: int
    def __init__(self, snapshot: _Optional[_Union[_common_pb2.Snapshot, _Mapping]] = ..., decisions: _Optional[_Iterable[_Union[_common_pb2.Decision, _Mapping]]] = ..., dropped_decisions: _Optional[int] = ...) -> None: ...

class GetSnapshotRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetSnapshotResponse(_message.Message):
    __slots__ = ("snapshot",)
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    snapshot: _common_pb2.Snapshot
    def __init__(self, snapshot: _Optional[_Union[_common_pb2.Snapshot, _Mapping]] = ...) -> None: ...

class QueryDecisionsRequest(_message.Message):
    __slots__ = ("request_id", "engine_id", "tenant", "kind", "since_unix_s", "until_unix_s", "limit", "before_seq")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SINCE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    UNTIL_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    BEFORE_SEQ_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    engine_id: str
    tenant: str
    kind: _common_pb2.DecisionKind
    since_unix_s: float
    until_unix_s: float
    limit: int
    before_seq: int
    def __init__(self, request_id: _Optional[str] = ..., engine_id: _Optional[str] = ..., tenant: _Optional[str] = ..., kind: _Optional[_Union[_common_pb2.DecisionKind, str]] = ..., since_unix_s: _Optional[float] = ..., until_unix_s: _Optional[float] = ..., limit: _Optional[int] = ..., before_seq: _Optional[int] = ...) -> None: ...

class QueryDecisionsResponse(_message.Message):
    __slots__ = ("decisions",)
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[_common_pb2.Decision]
    def __init__(self, decisions: _Optional[_Iterable[_Union[_common_pb2.Decision, _Mapping]]] = ...) -> None: ...

class EstimateRequest(_message.Message):
    __slots__ = ("tokens_per_request",)
    TOKENS_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    tokens_per_request: int
    def __init__(self, tokens_per_request: _Optional[int] = ...) -> None: ...

class EstimateResponse(_message.Message):
    __slots__ = ("max_concurrency", "naive_max_concurrency", "blocks_per_request")
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    NAIVE_MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    max_concurrency: float
    naive_max_concurrency: float
    blocks_per_request: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, max_concurrency: _Optional[float] = ..., naive_max_concurrency: _Optional[float] = ..., blocks_per_request: _Optional[_Iterable[int]] = ...) -> None: ...

class ReportReplayRequest(_message.Message):
    __slots__ = ("replay",)
    REPLAY_FIELD_NUMBER: _ClassVar[int]
    replay: _common_pb2.ReplayState
    def __init__(self, replay: _Optional[_Union[_common_pb2.ReplayState, _Mapping]] = ...) -> None: ...

class ReportReplayResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AskAdmissionRequest(_message.Message):
    __slots__ = ("prompt_tokens", "max_new_tokens", "tenant", "priority", "prefix_hashes", "step_s")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HASHES_FIELD_NUMBER: _ClassVar[int]
    STEP_S_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    max_new_tokens: int
    tenant: str
    priority: int
    prefix_hashes: _containers.RepeatedScalarFieldContainer[int]
    step_s: float
    def __init__(self, prompt_tokens: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., tenant: _Optional[str] = ..., priority: _Optional[int] = ..., prefix_hashes: _Optional[_Iterable[int]] = ..., step_s: _Optional[float] = ...) -> None: ...

class AskAdmissionResponse(_message.Message):
    __slots__ = ("admit_now", "reason", "final", "blocks_needed", "blocks_needed_total", "blocks_free", "blocks_spare", "blocks_reclaimable", "requests_ahead", "blocks_ahead", "wait_steps", "wait_s", "detail")
    ADMIT_NOW_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_NEEDED_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_NEEDED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FREE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_SPARE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_RECLAIMABLE_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_AHEAD_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_AHEAD_FIELD_NUMBER: _ClassVar[int]
    WAIT_STEPS_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    admit_now: bool
    reason: str
    final: bool
    blocks_needed: _containers.RepeatedScalarFieldContainer[int]
    blocks_needed_total: int
    blocks_free: int
    blocks_spare: int
    blocks_reclaimable: int
    requests_ahead: int
    blocks_ahead: int
    wait_steps: int
    wait_s: float
    detail: str
    def __init__(self, admit_now: _Optional[bool] = ..., reason: _Optional[str] = ..., final: _Optional[bool] = ..., blocks_needed: _Optional[_Iterable[int]] = ..., blocks_needed_total: _Optional[int] = ..., blocks_free: _Optional[int] = ..., blocks_spare: _Optional[int] = ..., blocks_reclaimable: _Optional[int] = ..., requests_ahead: _Optional[int] = ..., blocks_ahead: _Optional[int] = ..., wait_steps: _Optional[int] = ..., wait_s: _Optional[float] = ..., detail: _Optional[str] = ...) -> None: ...
