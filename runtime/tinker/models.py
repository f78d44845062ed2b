"""What a Tinker client's training model is (ModelSpec, from its create_model's LoraConfig) and the
rlcore config its turn on the trainer world is built from."""

from __future__ import annotations

from typing import Any

from ...core.config.schema import LoraConfig, RLCoreConfig
from .errors import UserError
from .records import ModelSpec

LORA_ALPHA = 32
"""Every adapter's alpha (Tinker's LoraConfig has a rank only): the update is scaled by 32 / rank."""
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
UNEMBED = ["lm_head"]


def spec_of(base_model: str, lora: Any, base_path: str) -> ModelSpec:
    """The model a create_model asks for (`lora`: its LoraConfig, None for full fine-tuning) on the
    served base model `base_model`, whose folder is `base_path`."""
    if lora is None:
        return ModelSpec(base_model, 0)
    if lora.rank < 0:
        raise UserError(f"lora_config.rank: must be >= 0 (0: full fine-tuning); got {lora.rank}")
    if lora.rank and not (lora.train_attn or lora.train_mlp or lora.train_unembed):
        raise UserError("lora_config: train_attn, train_mlp and train_unembed are all false: the adapter "
                        "would train nothing")  # fmt: skip
    # the SDK asks for the head by default: a head tied to the embedding gets none (weights_info says so)
    unembed = bool(lora.rank and lora.train_unembed and not _tied(base_path))
    if lora.rank and not (lora.train_attn or lora.train_mlp or unembed):
        raise UserError(f"lora_config.train_unembed: {base_model} ties its unembedding to its embedding, which "
                        "gets no adapter here, and train_attn and train_mlp are false: nothing would train")  # fmt: skip
    return ModelSpec(base_model, lora.rank, lora.train_attn, lora.train_mlp, lora.seed or 0, unembed)


BYTES_PER_TRAINED = 12
"""What one trained parameter holds while its model trains: a float32 master weight and AdamW's two
float32 moments (the gradient comes and goes within a step)."""


def state_mb(spec: ModelSpec, base_path: str) -> float:
    """The weights and optimizer state a model trains (MB): a LoRA adapter's r x (in + out) per adapted
    linear layer, or every parameter in full fine-tuning, counted on the base model built without
    memory (meta tensors)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base_path))
    if not spec.lora_rank:
        return sum(p.numel() for p in model.parameters()) * BYTES_PER_TRAINED / 2**20
    wanted = targets(spec)
    names = set() if isinstance(wanted, str) else set(wanted)
    every = wanted == "all-linear" or "all-linear" in names
    head = model.get_output_embeddings()
    count = sum(
        spec.lora_rank * (m.in_features + m.out_features)
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear)
        and (name.rsplit(".", 1)[-1] in names or (every and m is not head))
    )
    return count * BYTES_PER_TRAINED / 2**20


def _tied(base_path: str) -> bool:
    """Whether the base model's unembedding (lm_head) shares its embedding's weight."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(base_path)
    return bool(getattr(config.get_text_config(), "tie_word_embeddings", False))


def targets(spec: ModelSpec) -> Any:
    """The adapted layers of a LoRA model: every linear layer but the head (peft's all-linear) when
    attention and MLP both train, else the named ones; lm_head too with train_unembed."""
    head = UNEMBED if spec.train_unembed else []
    if spec.train_attn and spec.train_mlp:
        return ["all-linear", *head] if head else "all-linear"
    return (ATTENTION if spec.train_attn else []) + (MLP if spec.train_mlp else []) + head


def model_config(
    model_id: str, spec: ModelSpec, base_path: str, max_model_len: int, dtype: str, strategy: str, device: str
) -> RLCoreConfig:
    """The config the trainer world builds `model_id` from: Tinker's losses are sums over tokens
    (token-mean with normalize_tokens 1), the lr is each optim_step's own, no KL, no export."""
    cfg = RLCoreConfig(seed=spec.seed, project="tinker", name=model_id)
    m = cfg.model
    m.model_path = base_path
    m.max_model_len, m.dtype = max_model_len, dtype
    m.max_prompt_tokens = m.max_response_tokens = max_model_len // 2
    if spec.lora_rank:
        m.lora_configs = [LoraConfig(lora_rank=spec.lora_rank, lora_alpha=LORA_ALPHA, target_modules=targets(spec))]
    cfg.algorithm.algorithm_type, cfg.algorithm.kl_loss_coef = "grpo", 0.0
    cfg.algorithm.loss_agg_mode = "token-mean"  # with normalize_tokens 1: Tinker's sums
    cfg.algorithm.optimizer.lr_scheduler_type = "constant"
    cfg.trainer.strategy, cfg.trainer.save_hf_checkpoint = strategy, "never"
    cfg.cluster.device = device
    cfg.buffer.explorer_input.taskset.path = "(a Tinker client sends the data)"
    return cfg
