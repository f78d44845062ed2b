from . import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LoadAdapterRequest(_message.Message):
    __slots__ = ("name", "path")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class LoadAdapterResponse(_message.Message):
    __slots__ = ("adapters",)
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    adapters: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, adapters: _Optional[_Iterable[str]] = ...) -> None: ...

class UnloadAdapterRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class UnloadAdapterResponse(_message.Message):
    __slots__ = ("adapters",)
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    adapters: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, adapters: _Optional[_Iterable[str]] = ...) -> None: ...

class FinishEpisodeRequest(_message.Message):
    __slots__ = ("episode_id", "reward", "group_id")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    reward: float
    group_id: str
    def __init__(self, episode_id: _Optional[str] = ..., reward: _Optional[float] = ..., group_id: _Optional[str] = ...) -> None: ...

class FinishEpisodeResponse(_message.Message):
    __slots__ = ("experiences",)
    EXPERIENCES_FIELD_NUMBER: _ClassVar[int]
    experiences: _containers.RepeatedCompositeFieldContainer[_common_pb2.Experience]
    def __init__(self, experiences: _Optional[_Iterable[_Union[_common_pb2.Experience, _Mapping]]] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class Prompt(_message.Message):
    __slots__ = ("token_ids", "text")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    token_ids: TokenIds
    text: str
    def __init__(self, token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., text: _Optional[str] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompts", "sampling")
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    prompts: _containers.RepeatedCompositeFieldContainer[Prompt]
    sampling: _common_pb2.SamplingParams
    def __init__(self, prompts: _Optional[_Iterable[_Union[Prompt, _Mapping]]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ...) -> None: ...

class PromptCompletions(_message.Message):
    __slots__ = ("completions",)
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    completions: _containers.RepeatedCompositeFieldContainer[_common_pb2.Completion]
    def __init__(self, completions: _Optional[_Iterable[_Union[_common_pb2.Completion, _Mapping]]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("results", "policy_version")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[PromptCompletions]
    policy_version: int
    def __init__(self, results: _Optional[_Iterable[_Union[PromptCompletions, _Mapping]]] = ..., policy_version: _Optional[int] = ...) -> None: ...

class GenerateStreamResponse(_message.Message):
    __slots__ = ("completion",)
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    completion: _common_pb2.Completion
    def __init__(self, completion: _Optional[_Union[_common_pb2.Completion, _Mapping]] = ...) -> None: ...

class WorkflowSpec(_message.Message):
    __slots__ = ("name", "reward_fn", "reward_weights", "max_prompt_tokens", "apply_chat_template", "chat_template", "system_prompt", "args_json", "auxiliary_json", "judge_json", "reasoning_tags", "chat_template_kwargs_json", "reward_model_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REWARD_FN_FIELD_NUMBER: _ClassVar[int]
    REWARD_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    MAX_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    APPLY_CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    ARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    AUXILIARY_JSON_FIELD_NUMBER: _ClassVar[int]
    JUDGE_JSON_FIELD_NUMBER: _ClassVar[int]
    REASONING_TAGS_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_KWARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    REWARD_MODEL_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    reward_fn: _containers.RepeatedScalarFieldContainer[str]
    reward_weights: _containers.RepeatedScalarFieldContainer[float]
    max_prompt_tokens: int
    apply_chat_template: bool
    chat_template: str
    system_prompt: str
    args_json: str
    auxiliary_json: str
    judge_json: str
    reasoning_tags: _containers.RepeatedScalarFieldContainer[str]
    chat_template_kwargs_json: str
    reward_model_json: str
    def __init__(self, name: _Optional[str] = ..., reward_fn: _Optional[_Iterable[str]] = ..., reward_weights: _Optional[_Iterable[float]] = ..., max_prompt_tokens: _Optional[int] = ..., apply_chat_template: _Optional[bool] = ..., chat_template: _Optional[str] = ..., system_prompt: _Optional[str] = ..., args_json: _Optional[str] = ..., auxiliary_json: _Optional[str] = ..., judge_json: _Optional[str] = ..., reasoning_tags: _Optional[_Iterable[str]] = ..., chat_template_kwargs_json: _Optional[str] = ..., reward_model_json: _Optional[str] = ...) -> None: ...

class RunTasksRequest(_message.Message):
    __slots__ = ("tasks", "sampling", "workflow")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[_common_pb2.Task]
    sampling: _common_pb2.SamplingParams
    workflow: WorkflowSpec
    def __init__(self, tasks: _Optional[_Iterable[_Union[_common_pb2.Task, _Mapping]]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., workflow: _Optional[_Union[WorkflowSpec, _Mapping]] = ...) -> None: ...

class RunTasksResponse(_message.Message):
    __slots__ = ("task_index", "experiences")
    TASK_INDEX_FIELD_NUMBER: _ClassVar[int]
    EXPERIENCES_FIELD_NUMBER: _ClassVar[int]
    task_index: int
    experiences: _containers.RepeatedCompositeFieldContainer[_common_pb2.Experience]
    def __init__(self, task_index: _Optional[int] = ..., experiences: _Optional[_Iterable[_Union[_common_pb2.Experience, _Mapping]]] = ...) -> None: ...

class GetInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetInfoResponse(_message.Message):
    __slots__ = ("model_path", "engine", "max_model_len", "max_batch_size", "policy_version", "paused", "active_requests", "completed_requests", "generated_tokens", "vocab_size", "worker_id", "max_message_bytes", "weight_sync_ranks", "busy_s", "busy_span_s", "interrupted_sequences", "adapters")
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_SYNC_RANKS_FIELD_NUMBER: _ClassVar[int]
    BUSY_S_FIELD_NUMBER: _ClassVar[int]
    BUSY_SPAN_S_FIELD_NUMBER: _ClassVar[int]
    INTERRUPTED_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    model_path: str
    engine: str
    max_model_len: int
    max_batch_size: int
    policy_version: int
    paused: bool
    active_requests: int
    completed_requests: int
    generated_tokens: int
    vocab_size: int
    worker_id: str
    max_message_bytes: int
    weight_sync_ranks: int
    busy_s: float
    busy_span_s: float
    interrupted_sequences: int
    adapters: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model_path: _Optional[str] = ..., engine: _Optional[str] = ..., max_model_len: _Optional[int] = ..., max_batch_size: _Optional[int] = ..., policy_version: _Optional[int] = ..., paused: _Optional[bool] = ..., active_requests: _Optional[int] = ..., completed_requests: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., vocab_size: _Optional[int] = ..., worker_id: _Optional[str] = ..., max_message_bytes: _Optional[int] = ..., weight_sync_ranks: _Optional[int] = ..., busy_s: _Optional[float] = ..., busy_span_s: _Optional[float] = ..., interrupted_sequences: _Optional[int] = ..., adapters: _Optional[_Iterable[str]] = ...) -> None: ...

class PauseRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PauseResponse(_message.Message):
    __slots__ = ("policy_version",)
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    def __init__(self, policy_version: _Optional[int] = ...) -> None: ...

class ResumeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResumeResponse(_message.Message):
    __slots__ = ("policy_version",)
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    def __init__(self, policy_version: _Optional[int] = ...) -> None: ...

class InitWeightSyncRequest(_message.Message):
    __slots__ = ("master_address", "master_port", "world_size", "rank", "backend", "timeout_s", "group_name")
    MASTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    GROUP_NAME_FIELD_NUMBER: _ClassVar[int]
    master_address: str
    master_port: int
    world_size: int
    rank: int
    backend: str
    timeout_s: float
    group_name: str
    def __init__(self, master_address: _Optional[str] = ..., master_port: _Optional[int] = ..., world_size: _Optional[int] = ..., rank: _Optional[int] = ..., backend: _Optional[str] = ..., timeout_s: _Optional[float] = ..., group_name: _Optional[str] = ...) -> None: ...

class InitWeightSyncResponse(_message.Message):
    __slots__ = ("rank", "num_ranks")
    RANK_FIELD_NUMBER: _ClassVar[int]
    NUM_RANKS_FIELD_NUMBER: _ClassVar[int]
    rank: int
    num_ranks: int
    def __init__(self, rank: _Optional[int] = ..., num_ranks: _Optional[int] = ...) -> None: ...

class BeginWeightUpdateRequest(_message.Message):
    __slots__ = ("policy_version", "tensors", "bucket_bytes", "checksums", "checkpoint_path")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    BUCKET_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PATH_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    tensors: _containers.RepeatedCompositeFieldContainer[_common_pb2.TensorMeta]
    bucket_bytes: int
    checksums: bool
    checkpoint_path: str
    def __init__(self, policy_version: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[_common_pb2.TensorMeta, _Mapping]]] = ..., bucket_bytes: _Optional[int] = ..., checksums: _Optional[bool] = ..., checkpoint_path: _Optional[str] = ...) -> None: ...

class BeginWeightUpdateResponse(_message.Message):
    __slots__ = ("num_buckets",)
    NUM_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    num_buckets: int
    def __init__(self, num_buckets: _Optional[int] = ...) -> None: ...

class FinishWeightUpdateRequest(_message.Message):
    __slots__ = ("policy_version",)
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    def __init__(self, policy_version: _Optional[int] = ...) -> None: ...

class FinishWeightUpdateResponse(_message.Message):
    __slots__ = ("policy_version", "num_bytes", "receive_s", "load_s", "verified_buckets")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    RECEIVE_S_FIELD_NUMBER: _ClassVar[int]
    LOAD_S_FIELD_NUMBER: _ClassVar[int]
    VERIFIED_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    num_bytes: int
    receive_s: float
    load_s: float
    verified_buckets: int
    def __init__(self, policy_version: _Optional[int] = ..., num_bytes: _Optional[int] = ..., receive_s: _Optional[float] = ..., load_s: _Optional[float] = ..., verified_buckets: _Optional[int] = ...) -> None: ...
