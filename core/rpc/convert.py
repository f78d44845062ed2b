"""proto <-> rlcore.core.types, with request validation that names the offending field."""

from __future__ import annotations

import json
import math

from ...proto.v1 import common_pb2
from ..types import SKIPPED, Completion, Experience, SamplingParams, Task, routing_tokens
from .errors import require

_FINISH = {
    "stop": common_pb2.FINISH_REASON_STOP,
    "length": common_pb2.FINISH_REASON_LENGTH,
    "max_turns": common_pb2.FINISH_REASON_MAX_TURNS,
    SKIPPED: common_pb2.FINISH_REASON_SKIPPED,  # an experience buffer's place (types.skipped_task)
}
_FINISH_NAME: dict[int, str] = {v: k for k, v in _FINISH.items()}


def sampling_to_proto(s: SamplingParams) -> common_pb2.SamplingParams:
    msg = common_pb2.SamplingParams(
        temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, min_p=s.min_p,
        repetition_penalty=s.repetition_penalty, n=s.n, max_tokens=s.max_tokens, stop=list(s.stop),
        presence_penalty=s.presence_penalty, frequency_penalty=s.frequency_penalty, logit_bias=s.logit_bias,
        min_tokens=s.min_tokens, ignore_eos=s.ignore_eos, stop_token_ids=list(s.stop_token_ids),
        return_routed_experts=s.return_routed_experts, adapter=s.adapter,
    )  # fmt: skip
    if s.seed is not None:
        msg.seed = s.seed
    return msg


def sampling_from_proto(msg: common_pb2.SamplingParams, field: str = "sampling") -> SamplingParams:
    """Validated SamplingParams; unset top_p / repetition_penalty mean 1 and unset top_k means off."""
    require(
        math.isfinite(msg.temperature) and msg.temperature >= 0,
        f"{field}.temperature",
        f"must be >= 0; got {msg.temperature}",
    )
    top_p = msg.top_p or 1.0
    require(0 < top_p <= 1, f"{field}.top_p", f"must be in (0, 1]; got {msg.top_p}")
    require(msg.top_k >= -1, f"{field}.top_k", f"must be >= 1, or 0/-1 to disable; got {msg.top_k}")
    require(0 <= msg.min_p <= 1, f"{field}.min_p", f"must be in [0, 1]; got {msg.min_p}")
    penalty = msg.repetition_penalty or 1.0
    require(penalty > 0, f"{field}.repetition_penalty", f"must be > 0; got {msg.repetition_penalty}")
    require(msg.n >= 1, f"{field}.n", f"must be >= 1; got {msg.n}")
    require(msg.max_tokens >= 1, f"{field}.max_tokens", f"must be >= 1; got {msg.max_tokens}")
    require(all(msg.stop), f"{field}.stop", "stop strings must be non-empty")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(msg, name)
        require(
            math.isfinite(value) and -2 <= value <= 2, f"{field}.{name}", f"must be in [-2, 2]; got {value}"
        )
    for token, bias in msg.logit_bias.items():
        require(math.isfinite(bias) and -100 <= bias <= 100, f"{field}.logit_bias",
                f"token {token}: the bias must be in [-100, 100]; got {bias}")  # fmt: skip
    require(
        0 <= msg.min_tokens <= msg.max_tokens,
        f"{field}.min_tokens",
        f"must be in [0, max_tokens {msg.max_tokens}]; got {msg.min_tokens}",
    )
    return SamplingParams(
        temperature=msg.temperature, top_p=top_p, top_k=msg.top_k if msg.top_k > 0 else -1,
        min_p=msg.min_p, repetition_penalty=penalty, n=msg.n, max_tokens=msg.max_tokens,
        stop=list(msg.stop), seed=msg.seed if msg.HasField("seed") else None,
        presence_penalty=msg.presence_penalty, frequency_penalty=msg.frequency_penalty,
        logit_bias=dict(sorted(msg.logit_bias.items())), min_tokens=msg.min_tokens, ignore_eos=msg.ignore_eos,
        stop_token_ids=list(msg.stop_token_ids), return_routed_experts=msg.return_routed_experts,
        adapter=msg.adapter,
    )  # fmt: skip


def task_to_proto(t: Task) -> common_pb2.Task:
    msg = common_pb2.Task(
        task_id=t.task_id, prompt=t.prompt, metadata_json=json.dumps(t.metadata) if t.metadata else ""
    )
    if t.answer is not None:
        msg.answer = t.answer
    if t.response is not None:
        msg.response = t.response
    return msg


def task_from_proto(msg: common_pb2.Task, field: str) -> Task:
    require(bool(msg.task_id), f"{field}.task_id", "must be non-empty")
    metadata = {}
    if msg.metadata_json:
        try:
            metadata = json.loads(msg.metadata_json)
        except json.JSONDecodeError as e:
            require(False, f"{field}.metadata_json", f"is not valid JSON ({e})")
        require(isinstance(metadata, dict), f"{field}.metadata_json", "must be a JSON object")
    return Task(
        task_id=msg.task_id,
        prompt=msg.prompt,
        answer=msg.answer if msg.HasField("answer") else None,
        response=msg.response if msg.HasField("response") else None,
        metadata=metadata,
    )


def finish_reason_to_proto(reason: str) -> int:
    return _FINISH[reason]


def finish_reason_from_proto(value: int) -> str:
    return _FINISH_NAME.get(value, "stop")


def completion_to_proto(
    c: Completion, prompt_index: int, sample_index: int, policy_version: int
) -> common_pb2.Completion:
    return common_pb2.Completion(
        prompt_index=prompt_index, sample_index=sample_index, prompt_token_ids=c.prompt_token_ids,
        token_ids=c.token_ids, logprobs=c.logprobs, finish_reason=_FINISH[c.finish_reason], text=c.text,
        policy_version=policy_version, routed_experts=c.routed_experts,
    )  # fmt: skip


def completion_from_proto(msg: common_pb2.Completion) -> Completion:
    return Completion(
        prompt_token_ids=list(msg.prompt_token_ids),
        token_ids=list(msg.token_ids),
        logprobs=list(msg.logprobs),
        finish_reason=finish_reason_from_proto(msg.finish_reason),
        text=msg.text,
        routed_experts=msg.routed_experts,
    )


def experience_to_proto(e: Experience) -> common_pb2.Experience:
    return common_pb2.Experience(
        prompt_token_ids=e.prompt_token_ids, response_token_ids=e.response_token_ids, logprobs=e.logprobs,
        reward=e.reward, group_id=e.group_id, policy_version=e.policy_version,
        finish_reason=_FINISH[e.finish_reason], response_text=e.response_text,
        reward_components=e.reward_components, loss_mask=e.loss_mask, metrics=e.metrics, temperature=e.temperature,
        segments=[common_pb2.VersionSegment(policy_version=v, num_tokens=n) for v, n in e.segments],
        routed_experts=e.routed_experts, episode_id=e.episode_id,
    )  # fmt: skip


def experience_from_proto(msg: common_pb2.Experience, field: str = "experience") -> Experience:
    if msg.finish_reason == common_pb2.FINISH_REASON_SKIPPED:  # a skipped task's place: no tokens at all
        require(
            not msg.response_token_ids and not msg.logprobs, f"{field}.response_token_ids",
            "must be empty with finish_reason SKIPPED (a skipped task's place holds no rollout)",
        )  # fmt: skip
    else:
        require(len(msg.response_token_ids) > 0, f"{field}.response_token_ids", "must be non-empty")
    require(
        len(msg.logprobs) == len(msg.response_token_ids),
        f"{field}.logprobs",
        f"has {len(msg.logprobs)} values for {len(msg.response_token_ids)} response tokens",
    )
    require(math.isfinite(msg.reward), f"{field}.reward", f"must be finite; got {msg.reward}")
    require(bool(msg.group_id), f"{field}.group_id", "must be non-empty")
    mask = list(msg.loss_mask)
    require(
        not mask or len(mask) == len(msg.response_token_ids),
        f"{field}.loss_mask",
        f"has {len(mask)} values for {len(msg.response_token_ids)} response tokens (give one each, or none)",
    )
    require(
        set(mask) <= {0, 1}, f"{field}.loss_mask", f"must hold only 0 and 1; got {sorted(set(mask) - {0, 1})}"
    )
    require(not mask or any(mask), f"{field}.loss_mask", "marks no token as the model's: nothing would train")
    bad = sorted(k for k, v in msg.metrics.items() if not math.isfinite(v))
    require(not bad, f"{field}.metrics", f"must be finite; {', '.join(bad)} are not")
    temperature = msg.temperature if msg.HasField("temperature") else None
    require(
        temperature is None or (math.isfinite(temperature) and temperature >= 0), f"{field}.temperature",
        f"must be a finite number >= 0 (0: greedy); got {temperature}",
    )  # fmt: skip
    segments = [(s.policy_version, s.num_tokens) for s in msg.segments]
    require(
        not segments or (sum(n for _, n in segments) == len(msg.response_token_ids) and min(n for _, n in segments) >= 0),
        f"{field}.segments", f"must count the {len(msg.response_token_ids)} response tokens; got {segments}",
    )  # fmt: skip
    tokens = routing_tokens(len(msg.prompt_token_ids), len(msg.response_token_ids))
    require(
        len(msg.routed_experts) % max(tokens, 1) == 0, f"{field}.routed_experts",
        f"holds {len(msg.routed_experts)} bytes: not [layers x top_k] for each of its {tokens} tokens",
    )  # fmt: skip
    return Experience(
        prompt_token_ids=list(msg.prompt_token_ids), response_token_ids=list(msg.response_token_ids),
        logprobs=list(msg.logprobs), reward=msg.reward, group_id=msg.group_id,
        policy_version=msg.policy_version, finish_reason=finish_reason_from_proto(msg.finish_reason),
        response_text=msg.response_text, reward_components=dict(msg.reward_components), loss_mask=mask,
        metrics=dict(msg.metrics), temperature=temperature, segments=segments,
        routed_experts=msg.routed_experts, episode_id=msg.episode_id,
    )  # fmt: skip
