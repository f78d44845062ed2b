from . import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ConfigureRequest(_message.Message):
    __slots__ = ("config_yaml", "model_path", "checkpoint_dir", "total_steps", "plan_json")
    CONFIG_YAML_FIELD_NUMBER: _ClassVar[int]
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_DIR_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    PLAN_JSON_FIELD_NUMBER: _ClassVar[int]
    config_yaml: str
    model_path: str
    checkpoint_dir: str
    total_steps: int
    plan_json: str
    def __init__(self, config_yaml: _Optional[str] = ..., model_path: _Optional[str] = ..., checkpoint_dir: _Optional[str] = ..., total_steps: _Optional[int] = ..., plan_json: _Optional[str] = ...) -> None: ...

class ConfigureResponse(_message.Message):
    __slots__ = ("strategy", "world_size", "num_parameters", "plan_json")
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    PLAN_JSON_FIELD_NUMBER: _ClassVar[int]
    strategy: str
    world_size: int
    num_parameters: int
    plan_json: str
    def __init__(self, strategy: _Optional[str] = ..., world_size: _Optional[int] = ..., num_parameters: _Optional[int] = ..., plan_json: _Optional[str] = ...) -> None: ...

class TrainSequence(_message.Message):
    __slots__ = ("prompt_token_ids", "response_token_ids", "loss_mask", "advantages", "old_logprobs")
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    ADVANTAGES_FIELD_NUMBER: _ClassVar[int]
    OLD_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    response_token_ids: _containers.RepeatedScalarFieldContainer[int]
    loss_mask: _containers.RepeatedScalarFieldContainer[float]
    advantages: _containers.RepeatedScalarFieldContainer[float]
    old_logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, prompt_token_ids: _Optional[_Iterable[int]] = ..., response_token_ids: _Optional[_Iterable[int]] = ..., loss_mask: _Optional[_Iterable[float]] = ..., advantages: _Optional[_Iterable[float]] = ..., old_logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class ForwardBackwardRequest(_message.Message):
    __slots__ = ("sequences", "loss", "temperature", "normalize_tokens", "clip_ratio_low", "clip_ratio_high")
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CLIP_RATIO_LOW_FIELD_NUMBER: _ClassVar[int]
    CLIP_RATIO_HIGH_FIELD_NUMBER: _ClassVar[int]
    sequences: _containers.RepeatedCompositeFieldContainer[TrainSequence]
    loss: str
    temperature: float
    normalize_tokens: float
    clip_ratio_low: float
    clip_ratio_high: float
    def __init__(self, sequences: _Optional[_Iterable[_Union[TrainSequence, _Mapping]]] = ..., loss: _Optional[str] = ..., temperature: _Optional[float] = ..., normalize_tokens: _Optional[float] = ..., clip_ratio_low: _Optional[float] = ..., clip_ratio_high: _Optional[float] = ...) -> None: ...

class ForwardBackwardResponse(_message.Message):
    __slots__ = ("loss", "metrics", "num_tokens")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    LOSS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    loss: float
    metrics: _containers.ScalarMap[str, float]
    num_tokens: int
    def __init__(self, loss: _Optional[float] = ..., metrics: _Optional[_Mapping[str, float]] = ..., num_tokens: _Optional[int] = ...) -> None: ...

class ComputeLogprobsRequest(_message.Message):
    __slots__ = ("sequences", "temperature", "reference")
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    sequences: _containers.RepeatedCompositeFieldContainer[TrainSequence]
    temperature: float
    reference: bool
    def __init__(self, sequences: _Optional[_Iterable[_Union[TrainSequence, _Mapping]]] = ..., temperature: _Optional[float] = ..., reference: _Optional[bool] = ...) -> None: ...

class ResponseLogprobs(_message.Message):
    __slots__ = ("logprobs",)
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class ComputeLogprobsResponse(_message.Message):
    __slots__ = ("sequences",)
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    sequences: _containers.RepeatedCompositeFieldContainer[ResponseLogprobs]
    def __init__(self, sequences: _Optional[_Iterable[_Union[ResponseLogprobs, _Mapping]]] = ...) -> None: ...

class OptimStepRequest(_message.Message):
    __slots__ = ("adam",)
    ADAM_FIELD_NUMBER: _ClassVar[int]
    adam: AdamParams
    def __init__(self, adam: _Optional[_Union[AdamParams, _Mapping]] = ...) -> None: ...

class AdamParams(_message.Message):
    __slots__ = ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm")
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    BETA1_FIELD_NUMBER: _ClassVar[int]
    BETA2_FIELD_NUMBER: _ClassVar[int]
    EPS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    GRAD_CLIP_NORM_FIELD_NUMBER: _ClassVar[int]
    learning_rate: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    grad_clip_norm: float
    def __init__(self, learning_rate: _Optional[float] = ..., beta1: _Optional[float] = ..., beta2: _Optional[float] = ..., eps: _Optional[float] = ..., weight_decay: _Optional[float] = ..., grad_clip_norm: _Optional[float] = ...) -> None: ...

class OptimStepResponse(_message.Message):
    __slots__ = ("grad_norm", "lr", "global_step")
    GRAD_NORM_FIELD_NUMBER: _ClassVar[int]
    LR_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_STEP_FIELD_NUMBER: _ClassVar[int]
    grad_norm: float
    lr: float
    global_step: int
    def __init__(self, grad_norm: _Optional[float] = ..., lr: _Optional[float] = ..., global_step: _Optional[int] = ...) -> None: ...

class TrainStepRequest(_message.Message):
    __slots__ = ("experiences",)
    EXPERIENCES_FIELD_NUMBER: _ClassVar[int]
    experiences: _containers.RepeatedCompositeFieldContainer[_common_pb2.Experience]
    def __init__(self, experiences: _Optional[_Iterable[_Union[_common_pb2.Experience, _Mapping]]] = ...) -> None: ...

class TrainStepResponse(_message.Message):
    __slots__ = ("metrics", "global_step")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    METRICS_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_STEP_FIELD_NUMBER: _ClassVar[int]
    metrics: _containers.ScalarMap[str, float]
    global_step: int
    def __init__(self, metrics: _Optional[_Mapping[str, float]] = ..., global_step: _Optional[int] = ...) -> None: ...

class SaveCheckpointRequest(_message.Message):
    __slots__ = ("export_hf", "explore_step")
    EXPORT_HF_FIELD_NUMBER: _ClassVar[int]
    EXPLORE_STEP_FIELD_NUMBER: _ClassVar[int]
    export_hf: bool
    explore_step: int
    def __init__(self, export_hf: _Optional[bool] = ..., explore_step: _Optional[int] = ...) -> None: ...

class SaveCheckpointResponse(_message.Message):
    __slots__ = ("path", "hf_path")
    PATH_FIELD_NUMBER: _ClassVar[int]
    HF_PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    hf_path: str
    def __init__(self, path: _Optional[str] = ..., hf_path: _Optional[str] = ...) -> None: ...

class LoadCheckpointRequest(_message.Message):
    __slots__ = ("path", "weights_only")
    PATH_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_ONLY_FIELD_NUMBER: _ClassVar[int]
    path: str
    weights_only: bool
    def __init__(self, path: _Optional[str] = ..., weights_only: _Optional[bool] = ...) -> None: ...

class LoadCheckpointResponse(_message.Message):
    __slots__ = ("path", "global_step", "explore_step")
    PATH_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_STEP_FIELD_NUMBER: _ClassVar[int]
    EXPLORE_STEP_FIELD_NUMBER: _ClassVar[int]
    path: str
    global_step: int
    explore_step: int
    def __init__(self, path: _Optional[str] = ..., global_step: _Optional[int] = ..., explore_step: _Optional[int] = ...) -> None: ...

class GetStateRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStateResponse(_message.Message):
    __slots__ = ("configured", "global_step", "policy_version", "strategy", "world_size", "model_path")
    CONFIGURED_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_STEP_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    configured: bool
    global_step: int
    policy_version: int
    strategy: str
    world_size: int
    model_path: str
    def __init__(self, configured: _Optional[bool] = ..., global_step: _Optional[int] = ..., policy_version: _Optional[int] = ..., strategy: _Optional[str] = ..., world_size: _Optional[int] = ..., model_path: _Optional[str] = ...) -> None: ...

class SyncWeightsRequest(_message.Message):
    __slots__ = ("endpoints",)
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    endpoints: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, endpoints: _Optional[_Iterable[str]] = ...) -> None: ...

class SyncWeightsResponse(_message.Message):
    __slots__ = ("policy_version", "num_bytes", "seconds")
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    policy_version: int
    num_bytes: int
    seconds: float
    def __init__(self, policy_version: _Optional[int] = ..., num_bytes: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class ExportWeightsRequest(_message.Message):
    __slots__ = ("folder",)
    FOLDER_FIELD_NUMBER: _ClassVar[int]
    folder: str
    def __init__(self, folder: _Optional[str] = ...) -> None: ...

class ExportWeightsResponse(_message.Message):
    __slots__ = ("folder", "num_bytes")
    FOLDER_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    folder: str
    num_bytes: int
    def __init__(self, folder: _Optional[str] = ..., num_bytes: _Optional[int] = ...) -> None: ...
