from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PromptFormat(_message.Message):
    __slots__ = ("apply_chat_template", "chat_template", "system_prompt", "template_kwargs_json", "max_prompt_tokens")
    APPLY_CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_KWARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    MAX_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    apply_chat_template: bool
    chat_template: str
    system_prompt: str
    template_kwargs_json: str
    max_prompt_tokens: int
    def __init__(self, apply_chat_template: _Optional[bool] = ..., chat_template: _Optional[str] = ..., system_prompt: _Optional[str] = ..., template_kwargs_json: _Optional[str] = ..., max_prompt_tokens: _Optional[int] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("prompts", "completions", "prompt_format")
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    prompts: _containers.RepeatedScalarFieldContainer[str]
    completions: _containers.RepeatedScalarFieldContainer[str]
    prompt_format: PromptFormat
    def __init__(self, prompts: _Optional[_Iterable[str]] = ..., completions: _Optional[_Iterable[str]] = ..., prompt_format: _Optional[_Union[PromptFormat, _Mapping]] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("scores",)
    SCORES_FIELD_NUMBER: _ClassVar[int]
    scores: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, scores: _Optional[_Iterable[float]] = ...) -> None: ...

class GetRewardInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RewardInfo(_message.Message):
    __slots__ = ("model_path", "batch_size", "batch_wait_s", "device", "rows_scored")
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    BATCH_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    ROWS_SCORED_FIELD_NUMBER: _ClassVar[int]
    model_path: str
    batch_size: int
    batch_wait_s: float
    device: str
    rows_scored: int
    def __init__(self, model_path: _Optional[str] = ..., batch_size: _Optional[int] = ..., batch_wait_s: _Optional[float] = ..., device: _Optional[str] = ..., rows_scored: _Optional[int] = ...) -> None: ...
