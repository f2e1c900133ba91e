from kvbudget.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OpenSessionRequest(_message.Message):
    __slots__ = ("engine_id", "model_fingerprint", "lease_ttl_s", "replace_existing")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_S_FIELD_NUMBER: _ClassVar[int]
    REPLACE_EXISTING_FIELD_NUMBER: _ClassVar[int]
    engine_id: str
    model_fingerprint: str
    lease_ttl_s: int
    replace_existing: bool
    def __init__(self, engine_id: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., lease_ttl_s: _Optional[int] = ..., replace_existing: _Optional[bool] = ...) -> None: ...

class OpenSessionResponse(_message.Message):
    __slots__ = ("session_id", "plan", "lease_ttl_s")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_S_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    plan: _common_pb2.PoolPlan
    lease_ttl_s: int
    def __init__(self, session_id: _Optional[str] = ..., plan: _Optional[_Union[_common_pb2.PoolPlan, _Mapping]] = ..., lease_ttl_s: _Optional[int] = ...) -> None: ...

class Submit(_message.Message):
    __slots__ = ("request_id", "prompt_tokens", "max_new_tokens", "prefix_hashes", "priority", "tenant", "deadline_unix_s")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HASHES_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_tokens: int
    max_new_tokens: int
    prefix_hashes: _containers.RepeatedScalarFieldContainer[int]
    priority: int
    tenant: str
    deadline_unix_s: float
    def __init__(self, request_id: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., prefix_hashes: _Optional[_Iterable[int]] = ..., priority: _Optional[int] = ..., tenant: _Optional[str] = ..., deadline_unix_s: _Optional[float] = ...) -> None: ...

class Grow(_message.Message):
    __slots__ = ("request_id", "num_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    num_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., num_tokens: _Optional[int] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("request_id", "num_computed_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    num_computed_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., num_computed_tokens: _Optional[int] = ...) -> None: ...

class Finish(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class Abort(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("session_id", "submits", "grows", "progress", "finishes", "aborts", "step_seq", "admit_tokens", "admit_seqs")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SUBMITS_FIELD_NUMBER: _ClassVar[int]
    GROWS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    FINISHES_FIELD_NUMBER: _ClassVar[int]
    ABORTS_FIELD_NUMBER: _ClassVar[int]
    STEP_SEQ_FIELD_NUMBER: _ClassVar[int]
    ADMIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ADMIT_SEQS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    submits: _containers.RepeatedCompositeFieldContainer[Submit]
    grows: _containers.RepeatedCompositeFieldContainer[Grow]
    progress: _containers.RepeatedCompositeFieldContainer[Progress]
    finishes: _containers.RepeatedCompositeFieldContainer[Finish]
    aborts: _containers.RepeatedCompositeFieldContainer[Abort]
    step_seq: int
    admit_tokens: int
    admit_seqs: int
    def __init__(self, session_id: _Optional[str] = ..., submits: _Optional[_Iterable[_Union[Submit, _Mapping]]] = ..., grows: _Optional[_Iterable[_Union[Grow, _Mapping]]] = ..., progress: _Optional[_Iterable[_Union[Progress, _Mapping]]] = ..., finishes: _Optional[_Iterable[_Union[Finish, _Mapping]]] = ..., aborts: _Optional[_Iterable[_Union[Abort, _Mapping]]] = ..., step_seq: _Optional[int] = ..., admit_tokens: _Optional[int] = ..., admit_seqs: _Optional[int] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ("decisions", "num_free_blocks")
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[_common_pb2.Decision]
    num_free_blocks: int
    def __init__(self, decisions: _Optional[_Iterable[_Union[_common_pb2.Decision, _Mapping]]] = ..., num_free_blocks: _Optional[int] = ...) -> None: ...

class EventsRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class EventsResponse(_message.Message):
    __slots__ = ("decision",)
    DECISION_FIELD_NUMBER: _ClassVar[int]
    decision: _common_pb2.Decision
    def __init__(self, decision: _Optional[_Union[_common_pb2.Decision, _Mapping]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("lease_ttl_s",)
    LEASE_TTL_S_FIELD_NUMBER: _ClassVar[int]
    lease_ttl_s: int
    def __init__(self, lease_ttl_s: _Optional[int] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ("released_requests",)
    RELEASED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    released_requests: int
    def __init__(self, released_requests: _Optional[int] = ...) -> None: ...

class EngineServiceReportReplayRequest(_message.Message):
    __slots__ = ("replay",)
    REPLAY_FIELD_NUMBER: _ClassVar[int]
    replay: _common_pb2.ReplayState
    def __init__(self, replay: _Optional[_Union[_common_pb2.ReplayState, _Mapping]] = ...) -> None: ...

class EngineServiceReportReplayResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
