from kvbudget.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SetPolicyRequest(_message.Message):
    __slots__ = ("policy",)
    POLICY_FIELD_NUMBER: _ClassVar[int]
    policy: _common_pb2.Policy
    def __init__(self, policy: _Optional[_Union[_common_pb2.Policy, str]] = ...) -> None: ...

class SetPolicyResponse(_message.Message):
    __slots__ = ("previous", "num_admitted", "rejected_by_reason")
    class RejectedByReasonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    NUM_ADMITTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_BY_REASON_FIELD_NUMBER: _ClassVar[int]
    previous: _common_pb2.Policy
    num_admitted: int
    rejected_by_reason: _containers.ScalarMap[str, int]
    def __init__(self, previous: _Optional[_Union[_common_pb2.Policy, str]] = ..., num_admitted: _Optional[int] = ..., rejected_by_reason: _Optional[_Mapping[str, int]] = ...) -> None: ...

class SetTenantQuotaRequest(_message.Message):
    __slots__ = ("tenant", "max_share", "weight")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    MAX_SHARE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    max_share: float
    weight: float
    def __init__(self, tenant: _Optional[str] = ..., max_share: _Optional[float] = ..., weight: _Optional[float] = ...) -> None: ...

class SetTenantQuotaResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ("running",)
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    running: int
    def __init__(self, running: _Optional[int] = ...) -> None: ...
