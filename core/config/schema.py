"""The config schema: every field, its default and its allowed values live here and only here.

YAML recipes in `configs/` hold overrides only. Field metadata drives validation (see validate.py):
  choices       allowed values (a tuple, or "module:REGISTRY" naming a lazy Registry)
  ge/gt/le/lt   numeric bounds
  must_exist    the value is a path that must exist (unless a generator can create it)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING


def choice(default: Any, choices: tuple[str, ...] | str) -> Any:
    return field(default=default, metadata={"choices": choices})


def bounded(default: Any, **bounds: float) -> Any:
    return field(default=default, metadata=bounds)


# ----------------------------------------------------------------------------------------------
# algorithm


@dataclass
class OptimizerConfig:
    lr: float = bounded(1e-6, gt=0.0)
    """Peak learning rate."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    eps: float = bounded(1e-8, gt=0.0)
    """AdamW epsilon."""
    weight_decay: float = bounded(0.01, ge=0.0)
    """AdamW decoupled weight decay."""
    lr_scheduler_type: str = choice("constant", ("constant", "cosine"))
    """Schedule after warm-up: constant, or cosine decay to `min_lr_ratio * lr` at the last step."""
    lr_warmup_steps: int = bounded(0, ge=0)
    """Linear warm-up from 0 to `lr` over this many optimizer steps."""
    min_lr_ratio: float = bounded(0.0, ge=0.0, le=1.0)
    """Cosine floor as a fraction of `lr`."""


@dataclass
class KLControllerConfig:
    type: str = choice("fixed", ("fixed", "adaptive"))
    """fixed: the coefficient never changes; adaptive: proportional controller towards `target_kl`."""
    kl_coef: float = bounded(0.001, ge=0.0)
    """Initial coefficient of the KL penalty in the reward (used when algorithm.use_kl_in_reward)."""
    target_kl: float = bounded(0.1, gt=0.0)
    """Adaptive controller: the KL per sequence it steers towards."""
    horizon: int = bounded(10000, gt=0)
    """Adaptive controller: number of samples over which the coefficient adapts."""


@dataclass
class AlgorithmConfig:
    algorithm_type: str = choice("grpo", "rlcore.core.algorithms:ALGORITHMS")
    """The algorithm's preset (core/algorithms/__init__.py): grpo, dr_grpo, rloo,
    reinforce_plus_plus_baseline and gspo (policy gradient with a group baseline), or sft
    (cross-entropy on the taskset's responses)."""
    advantage_fn: str | None = choice(None, "rlcore.core.algorithms:ADVANTAGE_FNS")
    """Replaces the preset's advantage function: grpo, dr_grpo, rloo, reinforce_plus_plus_baseline."""
    policy_loss_fn: str | None = choice(None, "rlcore.core.algorithms:POLICY_LOSS_FNS")
    """Replaces the preset's policy loss: ppo_clip (token ratios) or gspo (sequence ratios)."""
    repeat_times: int = bounded(8, ge=1)
    """Responses sampled per task (the GRPO group size)."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    kl_loss_fn: str = choice("k3", ("none", "k1", "abs", "k2", "mse", "k3", "low_var_kl"))
    """KL estimator used as a loss term against the reference model ('none' disables it)."""
    kl_loss_coef: float = bounded(0.001, ge=0.0)
    """Weight of the KL loss term."""
    use_kl_in_reward: bool | None = None
    """Subtract `kl_ctrl.kl_coef * KL` (estimator `kl_penalty_fn`) from the token-level reward;
    unset: the preset's (reinforce_plus_plus: true, the others false)."""
    gamma: float = bounded(1.0, ge=0.0, le=1.0)
    """Discount of later token rewards in a token's return (reinforce_plus_plus, ppo's GAE; 1.0: none)."""
    lam: float = bounded(1.0, ge=0.0, le=1.0)
    """GAE's lambda (ppo): 1.0 takes the whole discounted return less the value, 0.0 one TD step."""
    kl_penalty_fn: str = choice("k1", ("k1", "abs", "k2", "mse", "k3", "low_var_kl"))
    """KL estimator used for the reward penalty."""
    kl_ctrl: KLControllerConfig = field(default_factory=KLControllerConfig)
    entropy_coef: float = bounded(0.0, ge=0.0)
    """Weight of the entropy bonus (subtracted from the loss)."""
    clip_ratio_low: float | None = bounded(None, ge=0.0, lt=1.0)
    """The ratio is clipped below at 1 - clip_ratio_low (unset: the preset's, 0.2; gspo 3e-4)."""
    clip_ratio_high: float | None = bounded(None, ge=0.0)
    """The ratio is clipped above at 1 + clip_ratio_high (unset: the preset's, 0.2; gspo 4e-4)."""
    clip_ratio_c: float | None = bounded(None, gt=1.0)
    """Dual-clip PPO (Ye et al. 2020): a token with a negative advantage loses at most
    clip_ratio_c * |A| however large its ratio grows (unset: no second clip; 3.0 is usual)."""
    loss_agg_mode: str | None = choice(
        None, ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
    )
    """How per-token losses become one scalar (over the whole train batch, across ranks); unset: the
    preset's (token-mean; dr_grpo seq-mean-token-sum-norm; gspo seq-mean-token-mean)."""
    do_old_log_prob_compute: bool | None = None
    """The log-probs the policy ratio divides by: recomputed by the trainer before the update (True),
    or the engine's, those of the weights that generated the experience (False: the behaviour
    policy, which corrects for experiences generated by older weights). Unset: True, except in a
    decoupled run (mode train on the experience buffer), where experiences are older by design."""
    sample_strategy: str = choice("default", ("default", "staleness_control"))
    """What a trainer on the experience buffer (mode train, asynchronous both) does with the groups
    it takes: default trains on all of them, whatever their age (rollout/staleness_mean and
    staleness_max show it; a task left running by over-rollout or a replayed group may be older
    than synchronizer.max_staleness); staleness_control leaves out experiences more than
    synchronizer.max_staleness versions older than the weights being trained (rollout/stale_dropped)."""
    sync_ref_model: bool = False
    """Move the reference model towards the policy every ref_model_sync_steps optimizer steps:
    pi_ref <- alpha * pi_theta + (1 - alpha) * pi_ref (the reference then lives in checkpoints)."""
    ref_model_mixup_alpha: float = bounded(0.6, gt=0.0, le=1.0)
    """The policy's share alpha in the reference after a sync (1.0: the reference becomes the policy)."""
    ref_model_sync_steps: int = bounded(512, ge=1)
    """Optimizer steps between reference syncs."""
    opmd_tau: float = bounded(1.0, gt=0.0)
    """OPMD's regulariser strength: the loss is scaled by 1/(1 + tau), and the logavgexp baseline
    is tau * log(mean exp(r / tau))."""
    opmd_baseline: str = choice("mean", ("mean", "logavgexp"))
    """OPMD's group baseline: the mean reward, or the tau-softened maximum (logavgexp)."""
    maxent_tau: float = bounded(0.3, gt=0.0)
    """MaxEnt-GRPO's entropy temperature: the group's target is q^(1/(tau+beta)) pi_ref^(beta/(tau+beta)),
    beta = kl_loss_coef; a smaller tau puts more weight on the best responses."""
    maxent_q_temperature: float = bounded(2.0, gt=0.0)
    """MaxEnt-GRPO: q = softmax(reward / maxent_q_temperature) over the group."""
    maxent_q_epsilon: float = bounded(1e-6, ge=0.0, lt=1.0)
    """MaxEnt-GRPO: q is mixed with this much of the uniform distribution (no candidate gets 0)."""
    maxent_length_normalize_ref: bool = True
    """MaxEnt-GRPO: the reference log-prob of a response is its per-token mean (false: its sum)."""
    mix_mu: float = bounded(0.1, ge=0.0, le=1.0)
    """mix: the weight of the expert rows' NLL; the policy loss on rollouts weighs 1 - mix_mu."""
    mix_expert_ratio: float = bounded(0.5, ge=0.0, lt=1.0)
    """mix: the fraction of each train batch that is expert rows (Trinity-RFT's expert_data_ratio);
    they are added to the explored rollouts, ceil(r / (1 - r)) per rollout."""
    dpo_beta: float = bounded(0.1, gt=0.0)
    """DPO's beta: how far from the reference the implicit reward lets the policy move (larger: less)."""
    dpo_label_smoothing: float = bounded(0.0, ge=0.0, lt=0.5)
    """Conservative DPO: the probability that a pair's preference label is flipped (0: plain DPO)."""
    dpo_nll_coef: float = bounded(0.0, ge=0.0)
    """Weight of the chosen responses' per-token NLL added to DPO's loss (RPO; 0: plain DPO)."""
    overlong_filter: bool | None = None
    """Leave responses the token budget cut off (finish reason 'length') out of the loss (DAPO);
    unset: the preset's (dapo: true, the others false)."""
    overlong_buffer_len: int = bounded(0, ge=0)
    """DAPO's soft overlong punishment: a response longer than max_tokens - overlong_buffer_len
    loses overlong_penalty_factor * (its excess / overlong_buffer_len) of reward (0: off)."""
    overlong_penalty_factor: float = bounded(1.0, ge=0.0)
    """The reward a response at the full token budget loses to the soft overlong punishment."""
    dynamic_sampling: bool | None = None
    """DAPO's dynamic sampling: groups whose responses all got the same reward teach nothing and
    are dropped; more tasks are explored until the step has buffer.batch_size groups again (or
    dynamic_sampling_max_rounds extra rounds ran). Unset: the preset's (dapo: true)."""
    dynamic_sampling_max_rounds: int = bounded(4, ge=1)
    """Extra explore rounds one step may run to refill its dropped groups."""


# ----------------------------------------------------------------------------------------------
# model


@dataclass
class ScratchModelConfig:
    """A tiny Llama-architecture model and character tokenizer built locally (no download)."""

    enabled: bool = False
    """Build the model and tokenizer into `model.model_path` if that folder has no config.json."""
    hidden_size: int = bounded(128, gt=0)
    num_layers: int = bounded(4, gt=0)
    num_attention_heads: int = bounded(4, gt=0)
    num_key_value_heads: int = bounded(2, gt=0)
    intermediate_size: int = bounded(384, gt=0)
    tie_word_embeddings: bool = False
    tokenizer: str = "char"
    """char: single characters plus the answer tags (no chat template); bpe: a byte-level BPE of
    `vocab_size` tokens trained locally, with ChatML special tokens and a chat template that
    declares tools and renders tool calls (core/scratch_model.py)."""
    vocab_size: int = bounded(512, gt=0)
    """The bpe tokenizer's vocabulary size (ignored by char)."""


@dataclass
class AuxiliaryModelConfig:
    """An OpenAI-compatible service a workflow talks to (a teacher, a judge, a user simulator): vLLM's
    server, an rlcore worker's HTTP door, or a hosted API. The URL and key are read where the
    workflow runs (the rollout workers), from the environment when given by variable name."""

    name: str = MISSING
    """How workflows refer to it (`self.auxiliary[name]`, `workflow_args.student`)."""
    model_name: str = MISSING
    """The `model` of its requests."""
    base_url: str | None = None
    """e.g. http://host:8000/v1; or give base_url_env."""
    base_url_env: str | None = None
    """Environment variable holding the base URL."""
    api_key_env: str | None = None
    """Environment variable holding the API key (none: no key)."""
    timeout_s: float = bounded(120.0, gt=0.0)
    """Seconds one request may take."""
    max_retries: int = bounded(2, ge=0)
    """Retries of a failed request (connection errors, 429, 5xx)."""
    max_concurrency: int = bounded(16, ge=1)
    """Requests a workflow keeps in flight at once."""


@dataclass
class LoraConfig:
    """One LoRA adapter (peft) trained in place of the full weights, on strategies fsdp and fsdp2:
    the base model is frozen, the reference policy is the base with the adapter switched off, the
    engines get the merged weights (W + scale * B @ A, one tensor at a time) and checkpoints hold the
    adapter and its optimizer only (plus the adapter in peft's format, `adapter/`)."""

    name: str = "default"
    """The adapter's name inside peft (the key its parameters are stored under)."""
    path: str | None = None
    """A peft adapter folder (adapter_config.json) to start from; its rank, alpha, dropout and target
    modules are used and the fields below ignored. Unset: a fresh adapter (B = 0: the first policy is
    the base model)."""
    lora_rank: int = bounded(32, gt=0)
    """r, the adapter's inner dimension."""
    lora_alpha: int = bounded(32, gt=0)
    """The update is scaled by lora_alpha / lora_rank."""
    lora_dropout: float = bounded(0.0, ge=0.0, lt=1.0)
    """Dropout on the adapter's input while training (log-probs and the engines see none)."""
    target_modules: Any = "all-linear"
    """Which linear layers get an adapter: `all-linear` (every linear layer but the output head) or a
    list of module names (e.g. [q_proj, v_proj])."""
    lora_dtype: str = choice("auto", ("auto", "float32"))
    """The adapter's master weights: float32 (auto), as every master weight here; compute follows
    model.dtype."""


@dataclass
class ExternalModelConfig:
    """`model.external_model`: one OpenAI-compatible service, known to workflows as 'external'."""

    enable: bool = False
    model_name: str | None = None
    base_url: str | None = None
    base_url_env: str | None = None
    api_key_env: str | None = None


@dataclass
class ModelConfig:
    model_path: str = MISSING
    """HF model folder (config.json, weights, tokenizer)."""
    max_model_len: int = bounded(1024, gt=0)
    """Longest prompt + response the engines and trainer accept, in tokens."""
    max_prompt_tokens: int = bounded(512, gt=0)
    """Prompts longer than this are truncated from the left."""
    enable_prompt_truncation: bool = True
    """Whether over-long prompts may be truncated: `rlcore launch` counts them per taskset and warns;
    false makes it refuse to start, naming the first one."""
    max_response_tokens: int = bounded(512, gt=0)
    """Default generation budget per response."""
    external_model: ExternalModelConfig = field(default_factory=ExternalModelConfig)
    """An OpenAI-compatible service workflows may use (as auxiliary model 'external')."""
    dtype: str = choice("auto", ("auto", "float32", "bfloat16", "float16"))
    """Compute dtype; auto: bfloat16 on CUDA, float32 on CPU. Master weights stay float32."""
    apply_chat_template: bool = False
    """Wrap prompts with the tokenizer's chat template (False: the prompt text is used as is)."""
    chat_template: str | None = None
    """A Jinja chat template that replaces the tokenizer's own."""
    chat_template_path: str | None = None
    """A file holding that template (read where the run is launched; not with chat_template)."""
    scratch: ScratchModelConfig = field(default_factory=ScratchModelConfig)
    lora_configs: list[LoraConfig] = field(default_factory=list)
    """LoRA: train one adapter instead of the full weights (a list of at most one, as in other
    frameworks' configs); empty: full fine-tuning."""
    critic_model_path: str | None = None
    """HF model folder the critic (algorithm_type ppo) starts from: its trunk, with a value head
    read from the folder when it has one (`score.*`, as AutoModelForTokenClassification saves it) or
    else initialised from the seed; unset: `model_path`."""


@dataclass
class CriticConfig:
    """The value model of algorithm_type ppo: the policy's architecture with a scalar head."""

    optim: OptimizerConfig = field(default_factory=lambda: OptimizerConfig(lr=1e-5))
    """The critic's own optimizer and lr schedule."""
    cliprange_value: float = bounded(0.5, gt=0.0)
    """PPO's value clipping: a new value counts at most this far from the value it had when the
    batch was scored (the loss takes the worse of clipped and unclipped)."""
    critic_warmup: int = bounded(0, ge=0)
    """Optimizer steps in which only the critic trains (the policy waits for useful values)."""


# ----------------------------------------------------------------------------------------------
# cluster


@dataclass
class ClusterConfig:
    device: str = choice("auto", ("auto", "cpu", "cuda"))
    """auto: cuda when available, else cpu."""
    num_nodes: int = bounded(1, ge=1)
    """Trainer nodes."""
    ranks_per_node: int = bounded(1, ge=1)
    """Trainer processes per node (one per GPU on CUDA)."""
    rdzv_endpoint: str = ""
    """host:port of the torchrun rendezvous for multi-node runs (on node 0, reachable from every
    node); empty: single node, standalone."""
    node_rank: int = bounded(0, ge=0)
    """This host's place among the trainer nodes: 0 is the controller's host (it serves the control
    plane, prepares the run and hosts the rendezvous); the others join it with the same
    `rlcore launch` command and this set to 1, 2, ..."""
    node_address: str = ""
    """The address the other hosts reach this one at (torchrun's --local-addr; the weight-sync
    group's master when trainer rank 0 runs here); empty: the host's name."""
    rdzv_timeout_s: int = bounded(600, gt=0)
    """How long trainer nodes wait for each other at the rendezvous (at the start and after a restart)."""
    collective_timeout_s: float = bounded(1800.0, gt=0.0)
    """Timeout of the trainer world's collectives: a trainer node whose link or host is lost fails
    the world's next collective after this long."""
    threads_per_rank: int = bounded(0, ge=0)
    """CPU threads per trainer process; 0: cores divided by ranks."""
    malloc_keep_freed: bool = True
    """glibc malloc in the processes a launch starts keeps freed memory for reuse (no trimming; only
    blocks over 32 MiB are mmapped and returned) instead of handing it back to the OS and faulting it
    in again on the next step, which costs CPU training up to a quarter of its forward/backward.
    Off: glibc's defaults. MALLOC_* or GLIBC_TUNABLES already in the environment win either way."""

    @property
    def ranks(self) -> int:
        """Trainer processes in all: num_nodes x ranks_per_node."""
        return self.num_nodes * self.ranks_per_node


# ----------------------------------------------------------------------------------------------
# buffer


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
    tools_key: str = "tools"
    """Column (optional) holding the tools offered for the row, as OpenAI function schemas
    ([{"type": "function", "function": {"name": ..., ...}}]): the chat template declares them in
    place of the workflow's, and tool_call runs only those (by name, among workflow_args.tools)."""


@dataclass
class RolloutArgs:
    temperature: float = bounded(1.0, ge=0.0)
    """0 means greedy decoding."""
    top_p: float = bounded(1.0, gt=0.0, le=1.0)
    top_k: int = bounded(-1, ge=-1)
    """-1 disables top-k."""
    min_p: float = bounded(0.0, ge=0.0, le=1.0)
    repetition_penalty: float = bounded(1.0, gt=0.0)
    max_tokens: int | None = bounded(None, gt=0)
    """Generation budget; null: model.max_response_tokens."""
    stop: list[str] = field(default_factory=list)
    """Stop strings (excluded from the returned text, like EOS)."""


@dataclass
class TasksetConfig:
    name: str = "taskset"
    """Label used in metrics (eval/<name>/...)."""
    path: str = MISSING
    """Local jsonl/json/parquet file or folder, read through HF datasets."""
    split: str = "train"
    subset_name: str | None = None
    """The dataset's configuration (load_dataset's `name`) for a Hub id or a folder of data files."""
    format: FormatConfig = field(default_factory=FormatConfig)
    rollout_args: RolloutArgs = field(default_factory=RolloutArgs)
    reward_fn: list[str] = field(default_factory=lambda: ["exact_match"])
    """Reward functions by registered name or import path 'pkg.mod:fn'."""
    reward_weights: list[float] = field(default_factory=list)
    """One weight per reward_fn; empty: all 1.0."""
    shuffle: bool = True
    """Shuffle each epoch (seeded by the global seed and the epoch)."""
    num_samples: int | None = bounded(None, gt=0)
    """Use only the first N rows."""
    generator: str | None = None
    """Writes `path` when it is missing: a registered name (arithmetic) or 'pkg.mod:fn(path, **args)'."""
    generator_args: dict[str, Any] = field(default_factory=dict)
    weight: float = bounded(1.0, gt=0.0)
    """Its share of each batch in a mixture (buffer.explorer_input.mixture), relative to the others'."""
    default_workflow_type: str = "single_turn"
    """How a rollout turns this taskset's tasks into experiences: a registered workflow
    (rlcore.rollout.workflows:WORKFLOWS) or an import path 'pkg.mod:Class' to a Workflow subclass."""
    workflow_args: dict[str, Any] = field(default_factory=dict)
    """Keyword settings the workflow reads (`Workflow.args`); JSON values, sent with every RunTasks."""


@dataclass
class ExplorerInput:
    taskset: TasksetConfig = field(default_factory=TasksetConfig)
    eval_tasksets: list[TasksetConfig] = field(default_factory=list)
    mixture: list[TasksetConfig] = field(default_factory=list)
    """More training tasksets, sampled with `taskset` into every batch by their `weight`s (each
    taskset's share of buffer.batch_size, by largest remainder); each keeps its own format,
    workflow, reward functions and rollout_args (the sampling temperature must be the taskset's).
    An epoch ends when the taskset that takes longest has been seen once."""


@dataclass
class ReplayBufferConfig:
    """Train on groups again (storage_type queue: a mode-train launch's, or asynchronous both's):
    each step takes the ready groups of highest priority among the new ones and those trained on
    before (buffer/replay.py)."""

    enable: bool = False
    priority_fn: str = "linear_decay"
    """fn(group, uses, **priority_fn_args) -> float, higher first: linear_decay (the generating
    policy version less `decay` (2.0) per use), reward_spread (the spread of the group's rewards less
    `decay` (1.0) per use), or an import path 'pkg.mod:fn'."""
    priority_fn_args: dict[str, Any] = field(default_factory=dict)
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


# ----------------------------------------------------------------------------------------------
# explorer / trainer / synchronizer


@dataclass
class RolloutModelConfig:
    engine_type: str = choice("hf", "rlcore.rollout.engines:ENGINES")
    """Inference engine."""
    engine_num: int = bounded(1, ge=1)
    """Engines: rollout workers (mode both), or in mode colocate 1 (in trainer rank 0) or the trainer's
    ranks (one in each, every rank generating its share of a batch). An in-process vLLM engine is
    in every rank whenever there are several (it joins the trainer's world), and serves every stage
    of the launch."""
    tensor_parallel_size: int = bounded(1, ge=1)
    """GPUs one vLLM engine splits its model over (vllm only)."""
    max_batch_size: int = bounded(256, ge=1)
    """Sequences generated together in one engine call."""
    gpu_memory_utilization: float = bounded(0.9, gt=0.0, le=1.0)
    """Share of each GPU's memory vLLM may take for weights and KV cache (vllm on GPU)."""
    enforce_eager: bool = False
    """Decode without CUDA graphs: vLLM without CUDA graphs / torch.compile (always on CPU); the HF
    engine with its eager loop over a dynamic cache instead of graph replays over a static one (always
    on CPU). Slower decoding, faster start."""
    enable_sleep_mode: bool = False
    """Mode colocate on one GPU: vLLM frees its KV cache and offloads its weights while the trainer
    works, then wakes for the weight load and the next rollout (vllm on GPU). Also allowed in mode
    train, whose in-process engine only evaluates: it sleeps between evaluations."""
    max_restarts: int = bounded(3, ge=0)
    """How often `rlcore launch` restarts each rollout worker it started that exits unexpectedly
    (after 1, 2, 4, ... s); meanwhile its tasks go to the other workers, and it gets the current
    weights before it serves again. 0: never."""
    endpoints: list[str] = field(default_factory=list)
    """Rollout workers already running (host:port each, e.g. started with `rlcore rollout serve`);
    empty: `rlcore launch` starts `engine_num` workers on this machine (or, start_workers false,
    waits for them to join). Mode both only."""
    start_workers: bool = True
    """false: `rlcore launch` starts no rollout workers but waits (control.worker_start_timeout)
    for engine_num of them to join the run from other hosts (`rlcore rollout serve --register
    <controller host>:<control.run_port>`); they are followed like its own: one that stops
    answering is left out, and it rejoins when it answers again."""


@dataclass
class OverRolloutConfig:
    """Explore steps that do not wait for their slowest tasks (mode explore, and asynchronous
    `both`): a step proceeds once (1 - ratio) of a batch's tasks are done; the rest go on running
    and feed the next step."""

    ratio: float = bounded(0.0, ge=0.0, lt=1.0)
    """Share of a step's tasks it may leave running (0: a step waits for all of them)."""
    wait_after_min: float = bounded(0.0, ge=0.0)
    """Seconds a step still waits for the rest once that minimum is done."""


@dataclass
class DynamicTimeoutConfig:
    """A task's timeout follows the tasks seen so far (mode explore, and asynchronous `both`)."""

    enable: bool = False
    ratio: float = bounded(3.0, gt=1.0)
    """A task may take this many times the running mean of the finished tasks' seconds (at
    least 1 s, at most explorer.max_timeout); one that takes longer is cut and retried."""


@dataclass
class ExplorerConfig:
    rollout_model: RolloutModelConfig = field(default_factory=RolloutModelConfig)
    eval_interval: int = bounded(0, ge=0)
    """Evaluate every N explore steps (0: only at the end of the stage)."""
    eval_on_startup: bool = False
    """Evaluate before the first step."""
    max_timeout: float = bounded(900.0, gt=0.0)
    """Seconds one rollout batch may take before it is an error; with the task scheduler (over_rollout
    or dynamic_timeout on), seconds one task may take before it is cut and retried."""
    max_retry_times: int = bounded(2, ge=0)
    """Retries of a failed rollout batch; with the task scheduler, of a failed or cut task, which
    is then left out of the run (counted in rollout/tasks_dropped)."""
    over_rollout: OverRolloutConfig = field(default_factory=OverRolloutConfig)
    dynamic_timeout: DynamicTimeoutConfig = field(default_factory=DynamicTimeoutConfig)
    auxiliary_models: list[AuxiliaryModelConfig] = field(default_factory=list)
    """OpenAI-compatible services workflows talk to, by name (a teacher, a judge, a user simulator)."""


@dataclass
class MegatronConfig:
    """Parallel layout of `trainer.strategy: megatron`; the data-parallel size is what remains:
    ranks / (tensor_model_parallel_size * pipeline_model_parallel_size)."""

    tensor_model_parallel_size: int = bounded(1, ge=1)
    """Ranks that split each layer's matrices (attention heads, MLP columns, vocabulary)."""
    pipeline_model_parallel_size: int = bounded(1, ge=1)
    """Ranks that split the layers into consecutive stages."""
    use_distributed_optimizer: bool = True
    """Shard optimizer state and master weights over the data-parallel ranks (ZeRO-1)."""


@dataclass
class TrainerConfig:
    strategy: str = choice("fsdp2", "rlcore.backends:STRATEGIES")
    """Training strategy (`--strategy` on the command line overrides it)."""
    total_steps: int | None = bounded(None, ge=1)
    """Stop after this many optimizer steps (null: when the buffer is exhausted)."""
    save_interval: int = bounded(0, ge=0)
    """Checkpoint every N optimizer steps (0: only at the end of the stage)."""
    max_checkpoints_to_keep: int | None = bounded(None, ge=1)
    """Delete older checkpoints beyond this many (null: keep all)."""
    resume_fallback: bool = True
    """On resume, a newest checkpoint that fails verification (a file missing, truncated or
    changed since it was written) is named in a warning and the previous good one is used; false:
    stop with that error instead."""
    save_hf_checkpoint: str = choice("last", ("last", "always", "never"))
    """Also export HF format (loadable by from_pretrained): with the last checkpoint, every one, or never."""
    grad_clip: float = bounded(1.0, ge=0.0)
    """Max global gradient norm (0 disables clipping)."""
    max_token_len_per_gpu: int = bounded(16384, gt=0)
    """Micro-batch token budget per rank: sequences are grouped so each forward stays under it."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory."""
    max_restarts: int = bounded(0, ge=0)
    """How often a failed trainer world is restarted (every node's ranks, by torchrun) to resume
    from its last verified checkpoint, the explorer's and the experience buffer's position
    included; the launch's rollout workers keep running. 0: a failure ends the launch."""
    remote: str | None = None
    """host:port of a TrainerService started with `rlcore trainer serve`: the loop runs in the
    launch process and drives that trainer over gRPC instead of starting a trainer world."""
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    """Only read by `strategy: megatron`."""


@dataclass
class SynchronizerConfig:
    sync_method: str = choice("auto", "rlcore.weights:SYNC_METHODS")
    """How weights reach the engines: nccl (a process group between trainer rank 0 and the rollout
    workers' engine processes: NCCL on GPU, gloo on CPU), checkpoint (rank 0 writes an HF folder
    the workers load: a shared file system instead of a group), memory (engine in trainer rank 0's
    process, mode colocate), auto (memory for colocate, nccl otherwise)."""
    bucket_mb: int = bounded(64, gt=0)
    """Weights are packed into buckets of this many MiB, one broadcast each."""
    sync_interval: int = bounded(1, ge=1)
    """Sync after every N optimizer steps (sync_style fixed)."""
    sync_offset: int = bounded(0, ge=0)
    """Delay the first sync by this many steps."""
    sync_timeout: float = bounded(1200.0, gt=0.0)
    """Seconds each phase of a sync (group forming, announce, transfer, load) may take before it is
    an error naming the worker and the phase."""
    sync_style: str = choice("fixed", ("fixed", "explorer_driven", "trainer_driven"))
    """Who decides when to sync: fixed (every sync_interval steps after sync_offset),
    trainer_driven (after every optimizer step: the engines never lag), explorer_driven (just
    before the explorer would generate with weights older than max_staleness allows: the fewest
    syncs)."""
    max_staleness: int | None = bounded(None, ge=0)
    """Train only on experiences at most this many policy versions older than the weights being
    trained; older ones are dropped and counted (rollout/stale_dropped). None: no bound. A run on
    the experience buffer (mode explore/train, asynchronous both): the explorer runs at most this
    many steps ahead of the weights it holds, and the trainer drops older experiences only with
    algorithm.sample_strategy: staleness_control."""
    rollout_ahead: int = bounded(0, ge=0, le=1)
    """1: the rollout workers generate the next step's experiences while the trainer trains on this
    step's (one step off-policy: they are sync_interval versions old when trained on); the step then
    takes about the longer of the two instead of their sum. 0: generate, then train. Mode both."""
    asynchronous: bool = False
    """Mode both: explore in a thread of the trainer's process, on the rollout workers, up to
    max_staleness steps (default 1) ahead of the weights they hold, while the trainer trains on what
    came before; the two meet in an in-memory experience buffer, and the workers load the weights
    the trainer publishes after each sync_interval steps (as in a decoupled run, within one launch).
    The trainer evaluates on an engine of its own."""
    checksums: bool = False
    """Every bucket carries a CRC-32 that each engine checks before loading anything; a mismatch
    fails the sync and the engine keeps its last good version (nccl only)."""
    probe: bool = False
    """After each sync, compare the engine's greedy log-probs on a fixed prompt with the trainer's
    (with trainer.remote, the trainer's come from its ComputeLogprobs)."""
    probe_tolerance: float = bounded(0.0, ge=0.0)
    """Largest mean |log-prob difference| the probe accepts; 0: by dtype (1e-3 float32, 5e-2
    bfloat16/float16)."""


@dataclass
class MonitorConfig:
    monitor_type: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    """Any of console, jsonl, tensorboard, wandb, mlflow."""
    log_completions: bool = False
    """Log a sample of each training step's rollouts: prompt, response (tool and environment turns
    included), reward and its components, finish reason and the workflow's counters (tool calls,
    turns), to completions.jsonl beside metrics.jsonl, a TensorBoard text table and a W&B table."""
    save_completions_probability: float = bounded(0.1, ge=0.0, le=1.0)
    """With log_completions: the chance each rollout is in the sample (drawn from the run's seed and
    the step, so a resumed run logs the same ones)."""


MONITOR_TYPES = ("console", "jsonl", "tensorboard", "wandb", "mlflow")


@dataclass
class TLSConfig:
    enabled: bool = False
    """Serve and call over TLS instead of plaintext."""
    cert_file: str | None = None
    """PEM certificate chain this process presents (servers; clients too under mutual TLS)."""
    key_file: str | None = None
    """PEM private key of cert_file."""
    ca_file: str | None = None
    """PEM CA bundle peers are verified against (clients check servers; servers check clients
    when require_client_cert)."""
    require_client_cert: bool = False
    """Mutual TLS: servers refuse clients without a certificate signed by ca_file."""
    server_name: str | None = None
    """Name clients expect in the server certificate when it differs from the host dialled."""


@dataclass
class ControlConfig:
    """The gRPC control plane: every server rlcore starts and every client it uses."""

    host: str = "127.0.0.1"
    """Interface servers bind (127.0.0.1: this machine only; 0.0.0.0: every interface)."""
    run_port: int = bounded(0, ge=0, le=65535)
    """Port of the launch process's RunService (0: any free port)."""
    token_env: str = "RLCORE_TOKEN"
    """Environment variable holding the shared token every RPC (but health) must carry; when it is
    unset, `rlcore launch` makes a random one for the processes it starts."""
    max_message_mb: int = bounded(64, gt=0, le=2047)
    """Largest gRPC message sent or received, in MiB (larger requests get RESOURCE_EXHAUSTED)."""
    rpc_timeout: float = bounded(600.0, gt=0.0)
    """Default deadline of one call in seconds (rollout calls use explorer.max_timeout)."""
    retry_attempts: int = bounded(5, ge=1)
    """Attempts of a call that fails with UNAVAILABLE (a server restarting or not up yet)."""
    retry_backoff: float = bounded(0.2, gt=0.0)
    """First wait between attempts in seconds; doubles each time, at most 5 s."""
    worker_start_timeout: float = bounded(300.0, gt=0.0)
    """Seconds rollout workers may take to start and register before the launch fails."""
    stop_grace_s: float = bounded(60.0, gt=0.0)
    """SIGINT or SIGTERM to `rlcore launch`: how long the run may take to finish its current step and
    write a checkpoint before its processes are ended (a second signal ends them at once)."""
    heartbeat_interval: float = bounded(5.0, gt=0.0)
    """Seconds between a rollout worker's heartbeats to the run; also the most a call from the trainer
    to a run controller that does not answer may cost a training step (after a failure it waits
    this long, doubling up to 12 times, before it tries again)."""
    tls: TLSConfig = field(default_factory=TLSConfig)


@dataclass
class LogConfig:
    level: str = choice("INFO", ("DEBUG", "INFO", "WARNING", "ERROR"))


# ----------------------------------------------------------------------------------------------
# root


@dataclass
class RLCoreConfig:
    project: str = "rlcore"
    name: str = "run"
    mode: str = choice("both", ("both", "colocate", "train", "explore", "bench"))
    """both: explore on rollout workers (separate processes, spawned or at explorer.rollout_model.
    endpoints) and train in turn; colocate: the engine lives in trainer rank 0's process; train: SFT
    or DPO on the taskset's rows, or an RL algorithm on the experiences a mode-explore launch writes
    to buffer.trainer_input.experience_buffer (publishing its weights for it); explore: rollout
    workers only, writing experiences to that buffer and loading the weights the trainer publishes;
    bench: evaluate the model on the eval tasksets only."""
    checkpoint_root_dir: str = "./checkpoints"
    """Runs live in <checkpoint_root_dir>/<project>/<name>/."""
    continue_from_checkpoint: bool = False
    """Resume from the latest checkpoint of this run (stages already finished are skipped)."""
    seed: int = 42
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)
    explorer: ExplorerConfig = field(default_factory=ExplorerConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    synchronizer: SynchronizerConfig = field(default_factory=SynchronizerConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    log: LogConfig = field(default_factory=LogConfig)
    stages: list[Any] = field(default_factory=list)
    """Sequential stages; each is {name: ..., <section>: {overrides}} applied on top of this config."""


# sections a stage may override (everything but the run identity and the stage list itself)
STAGE_SECTIONS = (
    "mode", "algorithm", "model", "buffer", "explorer", "trainer", "critic", "synchronizer", "monitor"
)  # fmt: skip
