from . import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ExperienceGroup(_message.Message):
    __slots__ = ("experiences",)
    EXPERIENCES_FIELD_NUMBER: _ClassVar[int]
    experiences: _containers.RepeatedCompositeFieldContainer[_common_pb2.Experience]
    def __init__(self, experiences: _Optional[_Iterable[_Union[_common_pb2.Experience, _Mapping]]] = ...) -> None: ...

class PutExperiencesRequest(_message.Message):
    __slots__ = ("buffer", "writer", "groups")
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    WRITER_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    buffer: str
    writer: str
    groups: _containers.RepeatedCompositeFieldContainer[ExperienceGroup]
    def __init__(self, buffer: _Optional[str] = ..., writer: _Optional[str] = ..., groups: _Optional[_Iterable[_Union[ExperienceGroup, _Mapping]]] = ...) -> None: ...

class PutExperiencesResponse(_message.Message):
    __slots__ = ("available",)
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    available: int
    def __init__(self, available: _Optional[int] = ...) -> None: ...

class TakeExperiencesRequest(_message.Message):
    __slots__ = ("buffer", "step", "num_groups", "timeout_s")
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    NUM_GROUPS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    buffer: str
    step: int
    num_groups: int
    timeout_s: float
    def __init__(self, buffer: _Optional[str] = ..., step: _Optional[int] = ..., num_groups: _Optional[int] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class TakeExperiencesResponse(_message.Message):
    __slots__ = ("groups", "exhausted")
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[ExperienceGroup]
    exhausted: bool
    def __init__(self, groups: _Optional[_Iterable[_Union[ExperienceGroup, _Mapping]]] = ..., exhausted: _Optional[bool] = ...) -> None: ...

class FinishWriterRequest(_message.Message):
    __slots__ = ("buffer", "writer")
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    WRITER_FIELD_NUMBER: _ClassVar[int]
    buffer: str
    writer: str
    def __init__(self, buffer: _Optional[str] = ..., writer: _Optional[str] = ...) -> None: ...

class FinishWriterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetBufferStatsRequest(_message.Message):
    __slots__ = ("buffer",)
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    buffer: str
    def __init__(self, buffer: _Optional[str] = ...) -> None: ...

class BufferStats(_message.Message):
    __slots__ = ("groups_written", "experiences_written", "groups_taken", "experiences_taken", "available", "writers", "writers_finished", "steps_taken")
    GROUPS_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    EXPERIENCES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    GROUPS_TAKEN_FIELD_NUMBER: _ClassVar[int]
    EXPERIENCES_TAKEN_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    WRITERS_FIELD_NUMBER: _ClassVar[int]
    WRITERS_FINISHED_FIELD_NUMBER: _ClassVar[int]
    STEPS_TAKEN_FIELD_NUMBER: _ClassVar[int]
    groups_written: int
    experiences_written: int
    groups_taken: int
    experiences_taken: int
    available: int
    writers: int
    writers_finished: int
    steps_taken: int
    def __init__(self, groups_written: _Optional[int] = ..., experiences_written: _Optional[int] = ..., groups_taken: _Optional[int] = ..., experiences_taken: _Optional[int] = ..., available: _Optional[int] = ..., writers: _Optional[int] = ..., writers_finished: _Optional[int] = ..., steps_taken: _Optional[int] = ...) -> None: ...
