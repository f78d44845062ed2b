"""Data types that cross module boundaries (and, later, process boundaries through proto/).

Plain dataclasses of Python lists and numbers: no torch here, so they serialise cleanly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal


def routing_tokens(prompt_len: int, response_len: int) -> int:
    """How many tokens a sequence's routing record covers (routed_experts: every token the model ran
    on; the last response token never runs)."""
    return prompt_len + response_len - 1


@dataclass
class Task:
    """One row of a taskset."""

    task_id: str
    prompt: str
    answer: str | None = None
    """Ground truth for reward functions."""
    response: str | None = None
    """Reference response (SFT target)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    """Name of the taskset it came from (a mixture's batches mix several); not sent to workers."""


@dataclass(frozen=True)
class StructuredOutput:
    """What a response must be, held to it token by token (the door's `response_format`)."""

    kind: Literal["json_schema", "json_object", "regex"]
    spec: str = ""
    """json_schema: the schema as JSON text; regex: the pattern; json_object: empty."""
    resumed: int = 0
    """The last `resumed` tokens of each prompt are the response so far (a sequence a weight update
    interrupted, continued): the grammar takes them before anything is drawn."""


@dataclass
class SamplingParams:
    temperature: float = 1.0
    """0 means greedy."""
    top_p: float = 1.0
    top_k: int = -1
    """-1 disables top-k."""
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    n: int = 1
    """Completions per prompt."""
    max_tokens: int = 128
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    """Seeds the sampler for this request; the same seed and weights give the same tokens."""
    presence_penalty: float = 0.0
    """Subtracted from the logit of every token the response already holds (OpenAI's, vLLM's)."""
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per time the response already holds it."""
    logit_bias: dict[int, float] = field(default_factory=dict)
    """Token id -> added to its logit at every step (-100 bans a token, +100 all but forces it)."""
    min_tokens: int = 0
    """EOS and stop_token_ids cannot be sampled, and stop strings are not checked, before the
    response holds this many tokens."""
    ignore_eos: bool = False
    """Go on past the model's EOS tokens (stop_token_ids and stop strings still stop)."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Tokens that end a response besides EOS (kept in token_ids, as EOS is)."""
    return_routed_experts: bool = False
    """An MoE model's engine records the experts each token was routed to (Completion.routed_experts:
    rollout routing replay, algorithm.router_replay r3)."""
    adapter: str = ""
    """A LoRA adapter the engine holds beside its weights to generate with (its name:
    rollout/engines/adapters.py); empty: the engine's own weights."""
    prompt_logprobs: bool = False
    """Also score the prompt: each prompt token's log-prob given the tokens before it, under the
    raw logits (Completion.prompt_logprobs; OpenAI's `echo` with `logprobs`, a teacher's scores)."""
    top_logprobs: int = 0
    """Also report the k likeliest tokens at each sampled position, with their log-probs under
    the distribution `logprobs` are taken from (Completion.top_logprobs)."""
    structured_output: StructuredOutput | None = None
    """Sample only what keeps the response within this grammar (the hf engine, through xgrammar;
    the log-probs stay the policy's own)."""


@dataclass
class Completion:
    """One generated sequence as an engine returns it."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    """Response tokens, EOS included when generation stopped on it; the tokens that completed a
    stop string are kept too (they were generated), only `text` drops the stop string."""
    logprobs: list[float]
    """Log-probability of each sampled token under the temperature-scaled policy
    (log_softmax(logits / temperature); raw logits when greedy). Same length as token_ids."""
    finish_reason: str
    """'stop' (EOS or a stop string) or 'length' (budget reached); inside a rollout worker also
    'interrupted' (a weight update ended the engine call: rollout/batching.py continues it)."""
    text: str = ""
    """Decoded response, special tokens and stop string removed."""
    segments: list[tuple[int, int]] = field(default_factory=list)
    """(policy version, tokens) of each stretch of `token_ids` sampled by one version of the weights,
    in order, when a weight update interrupted the sequence (partial rollouts); empty: one version."""
    routed_experts: bytes = b""
    """The experts each token was routed to, when asked (SamplingParams.return_routed_experts):
    uint8 [prompt + response - 1 tokens, MoE layers, top_k] (core/moe_routing.py); empty otherwise."""
    prompt_logprobs: list[float] = field(default_factory=list)
    """log p(prompt[i] | prompt[:i]) for i >= 1, when asked (SamplingParams.prompt_logprobs)."""
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    """Per response token, the k likeliest (token, log-prob) there, when asked (SamplingParams.top_logprobs)."""


@dataclass
class WorkflowSpec:
    """How a rollout worker turns tasks into scored experiences (RunTasks)."""

    reward_fn: list[str]
    """Reward functions by registered name or import path 'pkg.mod:fn'."""
    reward_weights: list[float] = field(default_factory=list)
    """One weight per reward function; empty: all 1.0."""
    max_prompt_tokens: int = 512
    """Prompts longer than this are truncated from the left."""
    apply_chat_template: bool = False
    chat_template: str | None = None
    system_prompt: str | None = None
    name: str = "single_turn"
    """Registered workflow, or an import path 'pkg.mod:Class' to a Workflow subclass."""
    args: dict[str, Any] = field(default_factory=dict)
    """The workflow's own settings (TasksetConfig.workflow_args), JSON values."""
    auxiliary_models: list[dict[str, Any]] = field(default_factory=list)
    """OpenAI-compatible services the workflow may call, each an AuxiliaryModelConfig as a dict
    (URLs and keys named by environment variable are read on the worker)."""
    judge: dict[str, Any] | None = None
    """The `judge` reward's settings (a taskset's JudgeConfig as a dict), when reward_fn lists it."""
    reasoning_tags: list[str] = field(default_factory=list)
    """[open, close] of the reasoning block rewards do not score (FormatConfig.reasoning_tags)."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """More variables the chat template reads (model.chat_template_kwargs, e.g. enable_thinking)."""
    reward_model: dict[str, Any] | None = None
    """The `reward_model` reward's settings (a taskset's RewardModelRewardConfig as a dict), when
    reward_fn lists it."""


@dataclass
class Experience:
    """A scored completion, the unit the trainer consumes."""

    prompt_token_ids: list[int]
    response_token_ids: list[int]
    logprobs: list[float]
    """Rollout log-probs of response tokens."""
    reward: float
    group_id: str
    """Task id: experiences sampled from the same task form a GRPO group."""
    policy_version: int = 0
    """The trainer step whose weights generated this experience."""
    finish_reason: str = "stop"
    """"stop" (EOS, a stop string, or the environment ended the episode), "length" (a token limit:
    max_tokens, the model length or an episode's token budget), "max_turns" (the turn limit), or
    SKIPPED (no rollout: the place of a task the difficulty filter skipped, `skipped_task`)."""
    response_text: str = ""
    reward_components: dict[str, float] = field(default_factory=dict)
    """Each reward function's unweighted score."""
    loss_mask: list[int] = field(default_factory=list)
    """Per response token: 1 where the model generated it (trained), 0 where the environment, a tool,
    the user or a template put it (kept in the sequence as context, never trained; its `logprobs`
    entry is a placeholder). Empty: every response token is the model's. A multi-turn conversation
    is one experience (its turns' tokens exactly as generated and rendered, never re-tokenized) until
    its chat template renders the history differently from what the model saw (`episode_id`)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """What the workflow counted in this episode (turns, tool calls made and failed...); each name
    is averaged over a step's experiences into `rollout/<name>_mean`."""
    temperature: float | None = None
    """The sampling temperature its response was drawn at (its `logprobs` are of logits / temperature;
    0: greedy, raw logits): the trainer scores it at the same one. None: not recorded (an agent's
    episode through the OpenAI door); the trainer uses the training taskset's rollout_args.temperature."""
    segments: list[tuple[int, int]] = field(default_factory=list)
    """Partial rollouts: (policy version, tokens) of each stretch of the response sampled by one
    version of the weights (Completion.segments); empty: not interrupted. `policy_version` stays the
    first (the oldest weights in it: what staleness counts)."""
    routed_experts: bytes = b""
    """Rollout routing replay: the experts the engine routed each token to (Completion.routed_experts'
    layout, core/moe_routing.py); empty: not recorded."""
    episode_id: str = ""
    """The episode this is one sample of, when an episode gave several: a multi-turn conversation whose
    chat template re-renders its history (a thinking template after a new user turn) goes on as a new
    sample, and the door's episode may hold several conversations. Samples of one episode share its
    reward and count once in their group's statistics (core/algorithms/episodes.py). Empty: this
    experience is a whole episode."""

    @property
    def model_tokens(self) -> int:
        """Response tokens the model generated (context tokens of a multi-turn episode excluded)."""
        return sum(self.loss_mask) if self.loss_mask else len(self.response_token_ids)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Experience:
        e = cls(**d)
        e.segments = [(int(v), int(n)) for v, n in e.segments]  # JSON gives lists
        return e


SKIPPED = "skipped"
"""The finish_reason of a skipped task's place in a buffer (`skipped_task`)."""


def skipped_task(task_id: str, policy_version: int) -> list[Experience]:
    """The group that stands in a buffer for a task the difficulty filter skipped without refill
    (task_selection.difficulty_filter.refill false): no rollout, no tokens. It keeps an explore
    step's batch_size places, so a trainer that takes batch_size groups a step steps on one explore
    step's open tasks, as a lock-step step does; the trainer drops it (`is_skipped`)."""
    return [Experience([], [], [], 0.0, task_id, policy_version=policy_version, finish_reason=SKIPPED)]


def is_skipped(group: list[Experience]) -> bool:
    """Whether `group` is a skipped task's place (`skipped_task`), not rollouts."""
    return len(group) == 1 and group[0].finish_reason == SKIPPED and not group[0].response_token_ids


def by_episode(exps: list[Experience]) -> list[list[Experience]]:
    """`exps` as episodes, in order: the samples of one group sharing an episode_id together (an
    agent names its episodes through the door: two tasks may reuse a name), any other experience an
    episode of its own."""
    episodes: dict[Any, list[Experience]] = {}
    for i, e in enumerate(exps):
        episodes.setdefault(episode_key(e.group_id, e.episode_id, i), []).append(e)
    return list(episodes.values())


def episode_key(group_id: str, episode_id: str, row: int) -> tuple[str, str] | int:
    """What names the episode of the experience at `row`: its group and episode id, or the row itself
    (an experience without an episode id is a whole episode)."""
    return (group_id, episode_id) if episode_id else row


def episode_starts(exps: list[Experience]) -> list[int]:
    """The index in `exps` of each episode's first sample (its samples are consecutive)."""
    starts, index = [], 0
    for samples in by_episode(exps):
        starts.append(index)
        index += len(samples)
    return starts
