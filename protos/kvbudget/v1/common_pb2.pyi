from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DecisionKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DECISION_KIND_UNSPECIFIED: _ClassVar[DecisionKind]
    DECISION_KIND_ADMIT: _ClassVar[DecisionKind]
    DECISION_KIND_QUEUE: _ClassVar[DecisionKind]
    DECISION_KIND_REJECT: _ClassVar[DecisionKind]
    DECISION_KIND_GROW: _ClassVar[DecisionKind]
    DECISION_KIND_DENY: _ClassVar[DecisionKind]
    DECISION_KIND_PREEMPT: _ClassVar[DecisionKind]
    DECISION_KIND_RECLAIM: _ClassVar[DecisionKind]
    DECISION_KIND_RELEASE: _ClassVar[DecisionKind]
    DECISION_KIND_EXPIRE: _ClassVar[DecisionKind]
    DECISION_KIND_POLICY: _ClassVar[DecisionKind]
    DECISION_KIND_ADMIN: _ClassVar[DecisionKind]

class Policy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POLICY_UNSPECIFIED: _ClassVar[Policy]
    POLICY_OPTIMISTIC: _ClassVar[Policy]
    POLICY_GUARANTEED: _ClassVar[Policy]
    POLICY_PREDICTIVE: _ClassVar[Policy]
    POLICY_NAIVE: _ClassVar[Policy]

class LayerType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LAYER_TYPE_UNSPECIFIED: _ClassVar[LayerType]
    LAYER_TYPE_FULL_ATTENTION: _ClassVar[LayerType]
    LAYER_TYPE_SLIDING_WINDOW: _ClassVar[LayerType]
    LAYER_TYPE_CHUNKED_LOCAL: _ClassVar[LayerType]
    LAYER_TYPE_MLA: _ClassVar[LayerType]
    LAYER_TYPE_MAMBA: _ClassVar[LayerType]
    LAYER_TYPE_CROSS_ATTENTION: _ClassVar[LayerType]
    LAYER_TYPE_CAPPED: _ClassVar[LayerType]
DECISION_KIND_UNSPECIFIED: DecisionKind
DECISION_KIND_ADMIT: DecisionKind
DECISION_KIND_QUEUE: DecisionKind
DECISION_KIND_REJECT: DecisionKind
DECISION_KIND_GROW: DecisionKind
DECISION_KIND_DENY: DecisionKind
DECISION_KIND_PREEMPT: DecisionKind
DECISION_KIND_RECLAIM: DecisionKind
DECISION_KIND_RELEASE: DecisionKind
DECISION_KIND_EXPIRE: DecisionKind
DECISION_KIND_POLICY: DecisionKind
DECISION_KIND_ADMIN: DecisionKind
POLICY_UNSPECIFIED: Policy
POLICY_OPTIMISTIC: Policy
POLICY_GUARANTEED: Policy
POLICY_PREDICTIVE: Policy
POLICY_NAIVE: Policy
LAYER_TYPE_UNSPECIFIED: LayerType
LAYER_TYPE_FULL_ATTENTION: LayerType
LAYER_TYPE_SLIDING_WINDOW: LayerType
LAYER_TYPE_CHUNKED_LOCAL: LayerType
LAYER_TYPE_MLA: LayerType
LAYER_TYPE_MAMBA: LayerType
LAYER_TYPE_CROSS_ATTENTION: LayerType
LAYER_TYPE_CAPPED: LayerType

class GroupBlocks(_message.Message):
    __slots__ = ("group_index", "block_ids")
    GROUP_INDEX_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    group_index: int
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, group_index: _Optional[int] = ..., block_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("seq", "time_unix_s", "kind", "reason", "request_id", "engine_id", "tenant", "policy", "prompt_tokens", "max_new_tokens", "num_tokens", "num_computed_tokens", "blocks_reserved", "blocks_held", "new_blocks", "freed_blocks", "cached_hit_blocks", "num_free_blocks", "num_waiting", "num_running", "detail")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_RESERVED_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_HELD_FIELD_NUMBER: _ClassVar[int]
    NEW_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    FREED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    CACHED_HIT_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    seq: int
    time_unix_s: float
    kind: DecisionKind
    reason: str
    request_id: str
    engine_id: str
    tenant: str
    policy: Policy
    prompt_tokens: int
    max_new_tokens: int
    num_tokens: int
    num_computed_tokens: int
    blocks_reserved: _containers.RepeatedScalarFieldContainer[int]
    blocks_held: _containers.RepeatedScalarFieldContainer[int]
    new_blocks: _containers.RepeatedCompositeFieldContainer[GroupBlocks]
    freed_blocks: int
    cached_hit_blocks: int
    num_free_blocks: int
    num_waiting: int
    num_running: int
    detail: str
    def __init__(self, seq: _Optional[int] = ..., time_unix_s: _Optional[float] = ..., kind: _Optional[_Union[DecisionKind, str]] = ..., reason: _Optional[str] = ..., request_id: _Optional[str] = ..., engine_id: _Optional[str] = ..., tenant: _Optional[str] = ..., policy: _Optional[_Union[Policy, str]] = ..., prompt_tokens: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., num_tokens: _Optional[int] = ..., num_computed_tokens: _Optional[int] = ..., blocks_reserved: _Optional[_Iterable[int]] = ..., blocks_held: _Optional[_Iterable[int]] = ..., new_blocks: _Optional[_Iterable[_Union[GroupBlocks, _Mapping]]] = ..., freed_blocks: _Optional[int] = ..., cached_hit_blocks: _Optional[int] = ..., num_free_blocks: _Optional[int] = ..., num_waiting: _Optional[int] = ..., num_running: _Optional[int] = ..., detail: _Optional[str] = ...) -> None: ...

class KVCacheGroup(_message.Message):
    __slots__ = ("group_index", "layer_type", "description", "layer_ids", "sliding_window_tokens", "attention_chunk_tokens", "token_cap", "max_encoder_tokens", "state_pages_per_request", "layer_kind")
    GROUP_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAYER_TYPE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    LAYER_IDS_FIELD_NUMBER: _ClassVar[int]
    SLIDING_WINDOW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_CHUNK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_CAP_FIELD_NUMBER: _ClassVar[int]
    MAX_ENCODER_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STATE_PAGES_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    LAYER_KIND_FIELD_NUMBER: _ClassVar[int]
    group_index: int
    layer_type: str
    description: str
    layer_ids: _containers.RepeatedScalarFieldContainer[int]
    sliding_window_tokens: int
    attention_chunk_tokens: int
    token_cap: int
    max_encoder_tokens: int
    state_pages_per_request: int
    layer_kind: LayerType
    def __init__(self, group_index: _Optional[int] = ..., layer_type: _Optional[str] = ..., description: _Optional[str] = ..., layer_ids: _Optional[_Iterable[int]] = ..., sliding_window_tokens: _Optional[int] = ..., attention_chunk_tokens: _Optional[int] = ..., token_cap: _Optional[int] = ..., max_encoder_tokens: _Optional[int] = ..., state_pages_per_request: _Optional[int] = ..., layer_kind: _Optional[_Union[LayerType, str]] = ...) -> None: ...

class PoolPlan(_message.Message):
    __slots__ = ("model", "block_size_tokens", "num_blocks", "page_size_bytes", "layers_per_group", "bytes_per_block", "groups", "max_model_len_tokens", "max_num_batched_tokens", "kv_tokens", "memory", "model_fingerprint")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAYERS_PER_GROUP_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_BATCHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    model: str
    block_size_tokens: int
    num_blocks: int
    page_size_bytes: int
    layers_per_group: int
    bytes_per_block: int
    groups: _containers.RepeatedCompositeFieldContainer[KVCacheGroup]
    max_model_len_tokens: int
    max_num_batched_tokens: int
    kv_tokens: int
    memory: MemoryHandle
    model_fingerprint: str
    def __init__(self, model: _Optional[str] = ..., block_size_tokens: _Optional[int] = ..., num_blocks: _Optional[int] = ..., page_size_bytes: _Optional[int] = ..., layers_per_group: _Optional[int] = ..., bytes_per_block: _Optional[int] = ..., groups: _Optional[_Iterable[_Union[KVCacheGroup, _Mapping]]] = ..., max_model_len_tokens: _Optional[int] = ..., max_num_batched_tokens: _Optional[int] = ..., kv_tokens: _Optional[int] = ..., memory: _Optional[_Union[MemoryHandle, _Mapping]] = ..., model_fingerprint: _Optional[str] = ...) -> None: ...

class MemoryHandle(_message.Message):
    __slots__ = ("device", "shm_name", "cuda_ipc_handle", "size_bytes", "offset_bytes", "layout")
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    SHM_NAME_FIELD_NUMBER: _ClassVar[int]
    CUDA_IPC_HANDLE_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    OFFSET_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    device: str
    shm_name: str
    cuda_ipc_handle: bytes
    size_bytes: int
    offset_bytes: int
    layout: str
    def __init__(self, device: _Optional[str] = ..., shm_name: _Optional[str] = ..., cuda_ipc_handle: _Optional[bytes] = ..., size_bytes: _Optional[int] = ..., offset_bytes: _Optional[int] = ..., layout: _Optional[str] = ...) -> None: ...

class GroupState(_message.Message):
    __slots__ = ("layer_type", "description", "num_layers", "blocks_held", "blocks_reserved", "blocks_reclaimed", "layer_kind")
    LAYER_TYPE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_HELD_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_RESERVED_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_RECLAIMED_FIELD_NUMBER: _ClassVar[int]
    LAYER_KIND_FIELD_NUMBER: _ClassVar[int]
    layer_type: str
    description: str
    num_layers: int
    blocks_held: int
    blocks_reserved: int
    blocks_reclaimed: int
    layer_kind: LayerType
    def __init__(self, layer_type: _Optional[str] = ..., description: _Optional[str] = ..., num_layers: _Optional[int] = ..., blocks_held: _Optional[int] = ..., blocks_reserved: _Optional[int] = ..., blocks_reclaimed: _Optional[int] = ..., layer_kind: _Optional[_Union[LayerType, str]] = ...) -> None: ...

class TenantState(_message.Message):
    __slots__ = ("tenant", "blocks_held", "blocks_reserved", "quota_blocks", "weight", "running", "waiting")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_HELD_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_RESERVED_FIELD_NUMBER: _ClassVar[int]
    QUOTA_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    blocks_held: int
    blocks_reserved: int
    quota_blocks: int
    weight: float
    running: int
    waiting: int
    def __init__(self, tenant: _Optional[str] = ..., blocks_held: _Optional[int] = ..., blocks_reserved: _Optional[int] = ..., quota_blocks: _Optional[int] = ..., weight: _Optional[float] = ..., running: _Optional[int] = ..., waiting: _Optional[int] = ...) -> None: ...

class EngineState(_message.Message):
    __slots__ = ("engine_id", "session_id", "lease_remaining_s", "blocks_held", "running", "waiting")
    ENGINE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_REMAINING_S_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_HELD_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    engine_id: str
    session_id: str
    lease_remaining_s: float
    blocks_held: int
    running: int
    waiting: int
    def __init__(self, engine_id: _Optional[str] = ..., session_id: _Optional[str] = ..., lease_remaining_s: _Optional[float] = ..., blocks_held: _Optional[int] = ..., running: _Optional[int] = ..., waiting: _Optional[int] = ...) -> None: ...

class GpuState(_message.Message):
    __slots__ = ("present", "name", "total_bytes", "used_bytes", "free_bytes", "pool_bytes", "other_processes_bytes", "note", "index", "nvml_device")
    PRESENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    POOL_BYTES_FIELD_NUMBER: _ClassVar[int]
    OTHER_PROCESSES_BYTES_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NVML_DEVICE_FIELD_NUMBER: _ClassVar[int]
    present: bool
    name: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    pool_bytes: int
    other_processes_bytes: int
    note: str
    index: int
    nvml_device: str
    def __init__(self, present: _Optional[bool] = ..., name: _Optional[str] = ..., total_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., free_bytes: _Optional[int] = ..., pool_bytes: _Optional[int] = ..., other_processes_bytes: _Optional[int] = ..., note: _Optional[str] = ..., index: _Optional[int] = ..., nvml_device: _Optional[str] = ...) -> None: ...

class DecisionLogState(_message.Message):
    __slots__ = ("rows_written", "rows_folded", "stalls", "stall_s", "database_bytes", "wal_bytes", "disk_free_bytes", "disk_total_bytes", "max_bytes", "num_unwritten_decisions", "write_error", "unwritten_since_unix_s")
    ROWS_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    ROWS_FOLDED_FIELD_NUMBER: _ClassVar[int]
    STALLS_FIELD_NUMBER: _ClassVar[int]
    STALL_S_FIELD_NUMBER: _ClassVar[int]
    DATABASE_BYTES_FIELD_NUMBER: _ClassVar[int]
    WAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_UNWRITTEN_DECISIONS_FIELD_NUMBER: _ClassVar[int]
    WRITE_ERROR_FIELD_NUMBER: _ClassVar[int]
    UNWRITTEN_SINCE_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    rows_written: int
    rows_folded: int
    stalls: int
    stall_s: float
    database_bytes: int
    wal_bytes: int
    disk_free_bytes: int
    disk_total_bytes: int
    max_bytes: int
    num_unwritten_decisions: int
    write_error: str
    unwritten_since_unix_s: float
    def __init__(self, rows_written: _Optional[int] = ..., rows_folded: _Optional[int] = ..., stalls: _Optional[int] = ..., stall_s: _Optional[float] = ..., database_bytes: _Optional[int] = ..., wal_bytes: _Optional[int] = ..., disk_free_bytes: _Optional[int] = ..., disk_total_bytes: _Optional[int] = ..., max_bytes: _Optional[int] = ..., num_unwritten_decisions: _Optional[int] = ..., write_error: _Optional[str] = ..., unwritten_since_unix_s: _Optional[float] = ...) -> None: ...

class ReplayState(_message.Message):
    __slots__ = ("replay_id", "trace", "position", "total", "speed", "policy", "done", "admission_policy")
    REPLAY_ID_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    SPEED_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_POLICY_FIELD_NUMBER: _ClassVar[int]
    replay_id: str
    trace: str
    position: int
    total: int
    speed: float
    policy: str
    done: bool
    admission_policy: Policy
    def __init__(self, replay_id: _Optional[str] = ..., trace: _Optional[str] = ..., position: _Optional[int] = ..., total: _Optional[int] = ..., speed: _Optional[float] = ..., policy: _Optional[str] = ..., done: _Optional[bool] = ..., admission_policy: _Optional[_Union[Policy, str]] = ...) -> None: ...

class Snapshot(_message.Message):
    __slots__ = ("time_unix_s", "policy", "num_blocks", "num_free_blocks", "num_held_blocks", "num_reserved_blocks", "num_evictable_blocks", "num_running", "num_waiting", "num_preemptions", "preemptions_by_reason", "rejections_by_reason", "decisions_by_kind", "groups", "tenants", "engines", "gpu", "replays", "prefix_hit_blocks", "prefix_query_blocks", "draining", "plan", "decision_log", "waiting_by_reason", "started_unix_s", "daemon_version", "num_tenants", "gpus")
    class PreemptionsByReasonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class RejectionsByReasonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class DecisionsByKindEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class WaitingByReasonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    TIME_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_HELD_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_RESERVED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_EVICTABLE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    NUM_PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_BY_REASON_FIELD_NUMBER: _ClassVar[int]
    REJECTIONS_BY_REASON_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_BY_KIND_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    REPLAYS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HIT_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_QUERY_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    DECISION_LOG_FIELD_NUMBER: _ClassVar[int]
    WAITING_BY_REASON_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_S_FIELD_NUMBER: _ClassVar[int]
    DAEMON_VERSION_FIELD_NUMBER: _ClassVar[int]
    NUM_TENANTS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    time_unix_s: float
    policy: Policy
    num_blocks: int
    num_free_blocks: int
    num_held_blocks: int
    num_reserved_blocks: int
    num_evictable_blocks: int
    num_running: int
    num_waiting: int
    num_preemptions: int
    preemptions_by_reason: _containers.ScalarMap[str, int]
    rejections_by_reason: _containers.ScalarMap[str, int]
    decisions_by_kind: _containers.ScalarMap[str, int]
    groups: _containers.RepeatedCompositeFieldContainer[GroupState]
    tenants: _containers.RepeatedCompositeFieldContainer[TenantState]
    engines: _containers.RepeatedCompositeFieldContainer[EngineState]
    gpu: GpuState
    replays: _containers.RepeatedCompositeFieldContainer[ReplayState]
    prefix_hit_blocks: int
    prefix_query_blocks: int
    draining: bool
    plan: PoolPlan
    decision_log: DecisionLogState
    waiting_by_reason: _containers.ScalarMap[str, int]
    started_unix_s: float
    daemon_version: str
    num_tenants: int
    gpus: _containers.RepeatedCompositeFieldContainer[GpuState]
    def __init__(self, time_unix_s: _Optional[float] = ..., policy: _Optional[_Union[Policy, str]] = ..., num_blocks: _Optional[int] = ..., num_free_blocks: _Optional[int] = ..., num_held_blocks: _Optional[int] = ..., num_reserved_blocks: _Optional[int] = ..., num_evictable_blocks: _Optional[int] = ..., num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., num_preemptions: _Optional[int] = ..., preemptions_by_reason: _Optional[_Mapping[str, int]] = ..., rejections_by_reason: _Optional[_Mapping[str, int]] = ..., decisions_by_kind: _Optional[_Mapping[str, int]] = ..., groups: _Optional[_Iterable[_Union[GroupState, _Mapping]]] = ..., tenants: _Optional[_Iterable[_Union[TenantState, _Mapping]]] = ..., engines: _Optional[_Iterable[_Union[EngineState, _Mapping]]] = ..., gpu: _Optional[_Union[GpuState, _Mapping]] = ..., replays: _Optional[_Iterable[_Union[ReplayState, _Mapping]]] = ..., prefix_hit_blocks: _Optional[int] = ..., prefix_query_blocks: _Optional[int] = ..., draining: _Optional[bool] = ..., plan: _Optional[_Union[PoolPlan, _Mapping]] = ..., decision_log: _Optional[_Union[DecisionLogState, _Mapping]] = ..., waiting_by_reason: _Optional[_Mapping[str, int]] = ..., started_unix_s: _Optional[float] = ..., daemon_version: _Optional[str] = ..., num_tenants: _Optional[int] = ..., gpus: _Optional[_Iterable[_Union[GpuState, _Mapping]]] = ...) -> None: ...
