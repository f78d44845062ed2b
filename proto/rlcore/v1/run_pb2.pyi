from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_STATE_UNSPECIFIED: _ClassVar[RunState]
    RUN_STATE_STARTING: _ClassVar[RunState]
    RUN_STATE_RUNNING: _ClassVar[RunState]
    RUN_STATE_PAUSED: _ClassVar[RunState]
    RUN_STATE_STOPPING: _ClassVar[RunState]
    RUN_STATE_FINISHED: _ClassVar[RunState]
    RUN_STATE_FAILED: _ClassVar[RunState]

class WorkerRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_ROLE_UNSPECIFIED: _ClassVar[WorkerRole]
    WORKER_ROLE_ROLLOUT: _ClassVar[WorkerRole]
    WORKER_ROLE_TRAINER: _ClassVar[WorkerRole]
    WORKER_ROLE_TRAINER_NODE: _ClassVar[WorkerRole]
RUN_STATE_UNSPECIFIED: RunState
RUN_STATE_STARTING: RunState
RUN_STATE_RUNNING: RunState
RUN_STATE_PAUSED: RunState
RUN_STATE_STOPPING: RunState
RUN_STATE_FINISHED: RunState
RUN_STATE_FAILED: RunState
WORKER_ROLE_UNSPECIFIED: WorkerRole
WORKER_ROLE_ROLLOUT: WorkerRole
WORKER_ROLE_TRAINER: WorkerRole
WORKER_ROLE_TRAINER_NODE: WorkerRole

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerStatus(_message.Message):
    __slots__ = ("worker_id", "role", "address", "last_seen_s", "policy_version")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_S_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    role: WorkerRole
    address: str
    last_seen_s: float
    policy_version: int
    def __init__(self, worker_id: _Optional[str] = ..., role: _Optional[_Union[WorkerRole, str]] = ..., address: _Optional[str] = ..., last_seen_s: _Optional[float] = ..., policy_version: _Optional[int] = ...) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("run", "state", "stage", "step", "total_steps", "workers", "uptime_s", "error")
    RUN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    run: str
    state: RunState
    stage: str
    step: int
    total_steps: int
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStatus]
    uptime_s: float
    error: str
    def __init__(self, run: _Optional[str] = ..., state: _Optional[_Union[RunState, str]] = ..., stage: _Optional[str] = ..., step: _Optional[int] = ..., total_steps: _Optional[int] = ..., workers: _Optional[_Iterable[_Union[WorkerStatus, _Mapping]]] = ..., uptime_s: _Optional[float] = ..., error: _Optional[str] = ...) -> None: ...

class StreamMetricsRequest(_message.Message):
    __slots__ = ("include_history",)
    INCLUDE_HISTORY_FIELD_NUMBER: _ClassVar[int]
    include_history: bool
    def __init__(self, include_history: _Optional[bool] = ...) -> None: ...

class MetricsRecord(_message.Message):
    __slots__ = ("stage", "step", "metrics", "time")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STAGE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    stage: str
    step: int
    metrics: _containers.ScalarMap[str, float]
    time: float
    def __init__(self, stage: _Optional[str] = ..., step: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ..., time: _Optional[float] = ...) -> None: ...

class PauseRunRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResumeRunRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StopRunRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RunControlResponse(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: RunState
    def __init__(self, state: _Optional[_Union[RunState, str]] = ...) -> None: ...

class RegisterWorkerRequest(_message.Message):
    __slots__ = ("role", "address", "index")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    role: WorkerRole
    address: str
    index: int
    def __init__(self, role: _Optional[_Union[WorkerRole, str]] = ..., address: _Optional[str] = ..., index: _Optional[int] = ...) -> None: ...

class RegisterWorkerResponse(_message.Message):
    __slots__ = ("worker_id", "heartbeat_interval_s")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    heartbeat_interval_s: float
    def __init__(self, worker_id: _Optional[str] = ..., heartbeat_interval_s: _Optional[float] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("worker_id", "stage", "step", "total_steps", "policy_version", "records", "world_attempt", "world_failure")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    WORLD_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    WORLD_FAILURE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    stage: str
    step: int
    total_steps: int
    policy_version: int
    records: _containers.RepeatedCompositeFieldContainer[MetricsRecord]
    world_attempt: int
    world_failure: str
    def __init__(self, worker_id: _Optional[str] = ..., stage: _Optional[str] = ..., step: _Optional[int] = ..., total_steps: _Optional[int] = ..., policy_version: _Optional[int] = ..., records: _Optional[_Iterable[_Union[MetricsRecord, _Mapping]]] = ..., world_attempt: _Optional[int] = ..., world_failure: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: RunState
    def __init__(self, state: _Optional[_Union[RunState, str]] = ...) -> None: ...
