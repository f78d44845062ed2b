"""The `buffer` section: tasksets, their formats and rollout arguments, the experience buffer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from .control import TLSConfig
from .fields import bounded, choice


@dataclass
class FormatConfig:
    prompt_key: str = "prompt"
    """Column holding the prompt text."""
    response_key: str = "response"
    """Column holding the reference response (SFT target)."""
    answer_key: str = "answer"
    """Column holding the ground-truth answer for reward functions."""
    chosen_key: str = "chosen"
    """DPO: the column of the preferred response (text, or chat messages whose assistant turns are it)."""
    rejected_key: str = "rejected"
    """DPO: the column of the dispreferred response (text or messages, as chosen_key)."""
    system_prompt: str | None = None
    """System message prepended when model.apply_chat_template is on."""
    prompt_type: str = "plaintext"
    """plaintext: the prompt is text (`prompt_key`); messages: each row holds a chat conversation
    (`messages_key`: a list of {"role": system|user|assistant|tool, "content": ...}), rendered by the
    chat template (model.apply_chat_template must be on). For SFT its assistant turns are trained,
    the rest is context; for rollouts the conversation is the prompt (it must not end on an
    assistant turn)."""
    messages_key: str = "messages"
    """Column holding the conversation (prompt_type: messages)."""
    system_prompt_key: str = "system_prompt"
    """Column (optional) holding a row's own system prompt, in place of `system_prompt`."""
    reasoning_tags: list[str] = field(default_factory=list)
    """[open, close] of the model's reasoning block, e.g. ["<think>", "</think>"] for Qwen3: reward
    functions then score the answer after the block (a response whose block never closes has an
    empty answer) and batch rewards also get the reasoning as the `reasoning` column. Empty: rewards
    see the whole response."""
    tools_key: str = "tools"
    """Column (optional) holding the tools offered for the row, as OpenAI function schemas
    ([{"type": "function", "function": {"name": ..., ...}}]): the chat template declares them in
    place of the workflow's, and tool_call runs only those (by name, among workflow_args.tools)."""


@dataclass
class RolloutArgs:
    temperature: float = bounded(1.0, ge=0.0)
    """0 means greedy decoding."""
    top_p: float = bounded(1.0, gt=0.0, le=1.0)
    """Nucleus sampling: draw from the likeliest tokens whose probabilities sum to this (1.0: all)."""
    top_k: int = bounded(-1, ge=-1)
    """-1 disables top-k."""
    min_p: float = bounded(0.0, ge=0.0, le=1.0)
    """Drop tokens less likely than this times the likeliest token's probability (0: none)."""
    repetition_penalty: float = bounded(1.0, gt=0.0)
    """Divides (or, for negative logits, multiplies) the logit of every token the prompt or response
    holds already (1.0: off; as transformers' and vLLM's)."""
    max_tokens: int | None = bounded(None, gt=0)
    """Generation budget; null: model.max_response_tokens."""
    stop: list[str] = field(default_factory=list)
    """Stop strings (excluded from the returned text, like EOS)."""


JUDGE_TEMPLATE = (
    "Rate the response to the task below from 0 (wrong or useless) to 10 (correct and complete).\n\n"
    "Task:\n{prompt}\n\nReference answer:\n{answer}\n\nResponse:\n{response}\n\n"
    "Reply with the rating alone, a whole number from 0 to 10."
)


@dataclass
class JudgeConfig:
    """The `judge` reward (list 'judge' in reward_fn): an auxiliary model asked about each response
    (rollout/rewards/judge.py)."""

    model: str | None = None
    """The service that judges: a name in explorer.auxiliary_models ('external': model.external_model)."""
    template: str = JUDGE_TEMPLATE
    """The user message; {prompt}, {response} and {answer} are filled in ({{ and }} for braces)."""
    system_prompt: str | None = None
    """A system message before the template's user message (null: none)."""
    parse: str = choice("score", ("score", "verdict"))
    """score: the last match of score_pattern, mapped from score_range onto [0, 1] and clipped;
    verdict: of the verdicts words, the one said last (whole words, any case), its value."""
    score_pattern: str = r"(-?\d+(?:\.\d+)?)"
    """A regular expression with at most one group (the number)."""
    score_range: list[float] = field(default_factory=lambda: [0.0, 10.0])
    """parse score: the scale the judge scores on, [low, high], mapped onto [0, 1]."""
    verdicts: dict[str, float] = field(default_factory=lambda: {"correct": 1.0, "incorrect": 0.0})
    """parse verdict: each verdict word and its reward."""
    unparsed_reward: float | None = None
    """The reward of a reply with no score or verdict; null: such a reply fails the batch, naming it."""
    max_tokens: int = bounded(256, ge=1)
    """The judge's reply budget, in tokens."""
    temperature: float = bounded(0.0, ge=0.0)
    """The judge's sampling temperature (0: greedy)."""


@dataclass
class RewardModelRewardConfig:
    """The `reward_model` reward (list 'reward_model' in reward_fn): a reward model scores each prompt
    and response, in the process that runs the workflow (`path`) or on a reward model server
    (`address`; rollout/rewards/reward_model.py)."""

    path: str | None = None
    """A folder AutoModelForSequenceClassification loads with one label (an algorithm_type
    reward_model stage's export, or any such model and its tokenizer), or 'stage:<name>': the
    export of the run's earlier reward_model stage of that name."""
    address: str | None = None
    """Instead of path: host:port of `rlcore reward-model serve`, which scores for every worker."""
    token_env: str = "RLCORE_TOKEN"
    """With address: the variable holding that server's token (its --token-env), where workflows run."""
    timeout_s: float = bounded(300.0, gt=0)
    """With address: how long one call may take, retries while the server is unavailable included."""
    normalize: str = choice("none", ("none", "sigmoid"))
    """none: the score as it is; sigmoid: sigmoid(score), in (0, 1) (the Bradley-Terry probability that
    the response beats one scored 0)."""
    batch_size: int = bounded(32, ge=1)
    """Responses scored per forward pass (with address: per call)."""
    tls: TLSConfig = field(default_factory=TLSConfig)
    """With address: call the server over TLS (`enabled`; `ca_file`: the CA its certificate chains
    to, else the system's; `cert_file` and `key_file`: this side's, when the server requires client
    certificates; `server_name` when its certificate names another host)."""


@dataclass
class TasksetConfig:
    name: str = "taskset"
    """Label used in metrics (eval/<name>/...)."""
    path: str = MISSING
    """Local jsonl/json/parquet file or folder, read through HF datasets."""
    split: str = "train"
    """The dataset split to read (load_dataset's `split`)."""
    subset_name: str | None = None
    """The dataset's configuration (load_dataset's `name`) for a Hub id or a folder of data files."""
    format: FormatConfig = field(default_factory=FormatConfig)
    rollout_args: RolloutArgs = field(default_factory=RolloutArgs)
    reward_fn: list[str] = field(default_factory=lambda: ["exact_match"])
    """Reward functions by registered name or import path 'pkg.mod:fn'."""
    reward_weights: list[float] = field(default_factory=list)
    """One weight per reward_fn; empty: all 1.0."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """The `judge` reward's service, template and parse rule (used when reward_fn lists 'judge')."""
    reward_model: RewardModelRewardConfig = field(default_factory=RewardModelRewardConfig)
    """The `reward_model` reward's model (used when reward_fn lists 'reward_model')."""
    shuffle: bool = True
    """Shuffle each epoch (seeded by the global seed and the epoch)."""
    num_samples: int | None = bounded(None, gt=0)
    """Use only the first N rows."""
    generator: str | None = None
    """Writes `path` when it is missing: a registered name (arithmetic) or 'pkg.mod:fn(path, **args)'."""
    generator_args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the generator (arithmetic: part, num_tasks, max_operand, seed, ...)."""
    weight: float = bounded(1.0, gt=0.0)
    """Its share of each batch in a mixture (buffer.explorer_input.mixture), relative to the others'."""
    default_workflow_type: str = "single_turn"
    """How a rollout turns this taskset's tasks into experiences: a registered workflow
    (rlcore.rollout.workflows:WORKFLOWS) or an import path 'pkg.mod:Class' to a Workflow subclass."""
    workflow_args: dict[str, Any] = field(default_factory=dict)
    """Keyword settings the workflow reads (`Workflow.args`); JSON values, sent with every RunTasks."""
    repeat_times: int = bounded(1, ge=1)
    """Eval tasksets: responses sampled per task (n, at rollout_args.temperature), reported as
    eval/<name>/avg@n, pass@k for k = 1, 2, 4, ... and n (the unbiased estimator), and maj@n (the
    most frequent <answer> right); `accuracy` stays the mean over every sample. Training tasksets
    sample algorithm.repeat_times per task: leave it 1 there."""


@dataclass
class DifficultyFilterConfig:
    """Skip (or down-weight) the training tasks whose recent pass rate says they teach nothing:
    always solved (every response right: zero advantage) or never solved."""

    enable: bool = False
    """Turn the filter on."""
    too_easy: float | None = bounded(1.0, ge=0.0, le=1.0)
    """A task whose recent pass rate is at least this is too easy (null: none is)."""
    too_hard: float | None = bounded(0.0, ge=0.0, le=1.0)
    """A task whose recent pass rate is at most this is too hard (null: none is)."""
    readmit_after: int = bounded(8, ge=1)
    """Explore steps after its last exploration before a filtered task is explored again (its
    history then says whether it still is too easy or too hard)."""
    keep_probability: float = bounded(0.0, ge=0.0, lt=1.0)
    """The chance that a filtered task is explored anyway when its turn comes (0: skipped; above 0:
    down-weighted), drawn from the seed, so a resume draws the same."""
    refill: bool = True
    """true: a step explores buffer.batch_size tasks, open ones walked in for those passed over;
    false: a step explores the open tasks among its batch_size turns of the epoch's order (at least
    one), so the rollouts a filtered task would have taken are not spent and the trainer's step
    trains on those groups alone (decoupled and asynchronous runs: the explorer puts a place for
    each skipped task beside them, which the trainer drops; not with the task scheduler,
    algorithm.dynamic_sampling, a train_batch_size below a step's rollouts or the replay buffer
    there)."""


@dataclass
class CurriculumConfig:
    """Easy tasks first: the tasks a step may draw are the easiest `start_fraction` of the taskset,
    growing linearly to all of it over `ramp_steps` explore steps."""

    order: str = choice("none", ("none", "history", "column"))
    """none: no curriculum; history: easiest = highest recent pass rate (a task not explored yet
    counts as `unseen_pass_rate`); column: by a numeric column of the taskset, smallest first."""
    column: str | None = None
    """order column: the taskset's column that holds each task's difficulty (a number, smaller is easier)."""
    start_fraction: float = bounded(0.25, gt=0.0, le=1.0)
    """The share of the tasks open at explore step 0."""
    ramp_steps: int = bounded(50, ge=1)
    """Explore steps until every task is open (the share grows linearly)."""
    unseen_pass_rate: float = bounded(0.5, ge=0.0, le=1.0)
    """order history: the pass rate a task not explored yet counts as."""


@dataclass
class TaskSelectionConfig:
    """Which training tasks a step explores, by each task's history (core/data/task_selection.py):
    the history is kept with the run's checkpoints (a lock-step run's, or the explorer's position in
    a decoupled or asynchronous run), so a resume selects exactly what the run would have."""

    history_window: int = bounded(4, ge=1)
    """A task's recent pass rate is the mean over its last this many explorations."""
    success_reward: float = 1.0
    """A response passes when its reward is at least this (1.0: a right answer of exact_match)."""
    difficulty_filter: DifficultyFilterConfig = field(default_factory=DifficultyFilterConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)


@dataclass
class ExplorerInput:
    taskset: TasksetConfig = field(default_factory=TasksetConfig)
    eval_tasksets: list[TasksetConfig] = field(default_factory=list)
    mixture: list[TasksetConfig] = field(default_factory=list)
    """More training tasksets, sampled with `taskset` into every batch by their `weight`s (each
    taskset's share of buffer.batch_size, by largest remainder); each keeps its own format,
    workflow, reward functions and rollout_args (its sampling temperature too: each experience
    carries the one it was sampled at, and the trainer scores it at that one).
    An epoch ends when the taskset that takes longest has been seen once."""
    task_selection: TaskSelectionConfig = field(default_factory=TaskSelectionConfig)
    """Difficulty filtering and curriculum over the training tasks, by their history."""


@dataclass
class ReplayBufferConfig:
    """Train on groups again (storage_type queue: a mode-train launch's, or asynchronous both's):
    each step takes the ready groups of highest priority among the new ones and those trained on
    before (buffer/replay.py)."""

    enable: bool = False
    """Turn the replay buffer on."""
    priority_fn: str = "linear_decay"
    """fn(group, uses, **priority_fn_args) -> float, higher first: linear_decay (the generating
    policy version less `decay` (2.0) per use), reward_spread (the spread of the group's rewards less
    `decay` (1.0) per use), or an import path 'pkg.mod:fn'."""
    priority_fn_args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of priority_fn (e.g. decay)."""
    reuse_cooldown_time: float | None = bounded(None, ge=0.0)
    """Seconds before a group taken by a step is ready again; null: it is not taken again (the
    replay buffer only orders the groups)."""
    capacity: int = bounded(10000, ge=1)
    """Groups held; past it the lowest-priority ones leave (unread ones too)."""


@dataclass
class ExperienceBufferConfig:
    """Where mode explore writes experiences and mode train reads them (buffer/)."""

    name: str = "experiences"
    """The buffer's name (several can share a queue server or a database)."""
    storage_type: str = choice("queue", "rlcore.buffer:STORAGES")
    """queue: in memory in the mode-train launch's controller, over gRPC (gone when it ends);
    file: append-only JSONL files in a folder on a shared file system; sql: a database through
    SQLAlchemy (an SQLite file, or e.g. postgresql+psycopg://user:password@host/db)."""
    path: str | None = None
    """queue: host:port of the controller that serves it (null: the mode-train launch's, found
    through <run folder>/buffer/<name>.address); file: the folder (null: <run folder>/buffer/<name>);
    sql: a SQLAlchemy URL (null: sqlite:///<run folder>/buffer/<name>.db). The run folder is
    checkpoint_root_dir/project/name, the same for the explore and the train launch."""
    max_wait_s: float = bounded(1800.0, gt=0.0)
    """How long mode train waits for a step's experiences (and mode explore for the trainer's
    weights) before it stops with an error."""
    replay_buffer: ReplayBufferConfig = field(default_factory=ReplayBufferConfig)


@dataclass
class TrainerInput:
    experience_buffer: ExperienceBufferConfig = field(default_factory=ExperienceBufferConfig)


@dataclass
class BufferConfig:
    batch_size: int = bounded(16, ge=1)
    """Tasks per explore step."""
    train_batch_size: int = bounded(0, ge=0)
    """Experiences per optimizer step; 0: everything one explore step produced (one update per step)."""
    total_epochs: int = bounded(1, ge=1)
    """Passes over the taskset."""
    total_steps: int | None = bounded(None, ge=1)
    """Stop after this many explore steps (null: when the epochs are done)."""
    explorer_input: ExplorerInput = field(default_factory=ExplorerInput)
    trainer_input: TrainerInput = field(default_factory=TrainerInput)
    """Decoupled runs: the experience buffer between a mode-explore and a mode-train launch."""
    expert_taskset: TasksetConfig | None = None
    """mix: demonstrations (prompt and response columns, as SFT reads them) trained on beside the
    rollouts, in seeded batches that a resume continues."""
