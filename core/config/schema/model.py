"""The `model` section (with its scratch model, LoRA, auxiliary and external models) and `critic`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from .algorithm import OptimizerConfig
from .fields import bounded, choice


@dataclass
class ScratchModelConfig:
    """A tiny random model and its tokenizer built locally (no download): a Llama by default."""

    enabled: bool = False
    """Build the model and tokenizer into `model.model_path` if that folder has no config.json."""
    architecture: str = choice("llama", ("llama", "qwen2", "qwen3", "qwen3_moe"))
    """transformers' model class: llama; qwen2 (biases on the query, key and value projections);
    qwen3 (RMSNorms of each head's queries and keys); qwen3_moe
    (Qwen3's attention, every MLP a mixture of `num_experts` experts of which each token takes
    `num_experts_per_tok`)."""
    hidden_size: int = bounded(128, gt=0)
    """The model's width."""
    num_layers: int = bounded(4, gt=0)
    """Decoder layers."""
    num_attention_heads: int = bounded(4, gt=0)
    """Query heads per layer (hidden_size / heads: each head's width)."""
    num_key_value_heads: int = bounded(2, gt=0)
    """Key/value heads per layer (grouped-query attention: a divisor of num_attention_heads)."""
    intermediate_size: int = bounded(384, gt=0)
    """The MLP's inner width."""
    tie_word_embeddings: bool = False
    """The output projection shares the input embeddings' weights."""
    tokenizer: str = "char"
    """char: single characters plus the answer tags (no chat template); bpe: a byte-level BPE of
    `vocab_size` tokens trained locally, with ChatML special tokens and a chat template that
    declares tools and renders tool calls (core/scratch_model.py)."""
    vocab_size: int = bounded(512, gt=0)
    """The bpe tokenizer's vocabulary size (ignored by char)."""
    chat_template: str = choice("chatml", ("chatml", "chatml_thinking"))
    """The bpe tokenizer's chat template: chatml (tools), or chatml_thinking (tools and `<think>`
    reasoning blocks, rendered as Qwen3's template renders them: core/scratch_model.py)."""
    num_experts: int = bounded(4, gt=0)
    """qwen3_moe: experts per MoE layer (each `intermediate_size` wide)."""
    num_experts_per_tok: int = bounded(2, gt=0)
    """qwen3_moe: experts each token is routed to (their weights renormalised to sum to 1)."""


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
    """One LoRA adapter (peft's format) trained in place of the full weights, on every strategy
    (megatron: dense models, backends/megatron/lora.py): the base model is frozen, the reference
    policy is the base with the adapter switched off, the engines get the merged weights
    (W + scale * B @ A, one tensor at a time) or the adapter alone (synchronizer.lora_sync), and
    checkpoints hold the adapter and its optimizer only (plus the adapter in peft's format, `adapter/`)."""

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
    list of module names (e.g. [q_proj, v_proj]), which may hold `all-linear` beside others (e.g.
    [all-linear, lm_head]: the head too)."""
    lora_dtype: str = choice("auto", ("auto", "float32"))
    """The adapter's master weights: float32 (auto), as every master weight here; compute follows
    model.dtype."""


@dataclass
class ExternalModelConfig:
    """`model.external_model`: one OpenAI-compatible service, known to workflows as 'external'."""

    enable: bool = False
    """Make the service known to workflows (as 'external', and to the `judge` reward)."""
    model_name: str | None = None
    """The `model` of its requests."""
    base_url: str | None = None
    """e.g. http://host:8000/v1; or give base_url_env."""
    base_url_env: str | None = None
    """Environment variable holding the base URL."""
    api_key_env: str | None = None
    """Environment variable holding the API key (none: no key)."""


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
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """More variables the chat template reads wherever rlcore renders prompts (rollouts, multi-turn
    turns, SFT, evaluation; the door's requests carry their own chat_template_kwargs), e.g.
    {enable_thinking: false} for Qwen3's; needs apply_chat_template."""
    scratch: ScratchModelConfig = field(default_factory=ScratchModelConfig)
    lora_configs: list[LoraConfig] = field(default_factory=list)
    """LoRA: train one adapter instead of the full weights (a list of at most one, as in other
    frameworks' configs); empty: full fine-tuning."""
    teacher_model_path: str | None = None
    """HF model folder of the teacher that on-policy distillation scores the student's tokens with
    (algorithm_type on_policy_distill, or algorithm.distill_coef > 0): frozen, built in the trainer
    world beside the policy, with the student's tokenizer."""
    teacher_service: str | None = None
    """Instead of a folder: the teacher behind an OpenAI-compatible service, a name in
    explorer.auxiliary_models ('external': model.external_model) whose /v1/completions returns the
    log-prob of each prompt token (echo with logprobs: vLLM's and SGLang's servers), serving a model
    with the student's tokenizer; scored at temperature 1 (core/algorithms/teacher_service.py)."""
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
