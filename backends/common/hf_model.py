"""Loading HF models for training (causal LMs for the policy, the same trunk with a scalar head for a
critic) and computing per-token log-probs or values from them."""

from __future__ import annotations

from typing import Any

import torch

from ...core.algorithms.logprob import at_temperature, entropy_from_logits, token_logprobs
from ...core.config.dtypes import compute_dtype
from .attention import row_kwargs
from .packed import Packed, at_temperature_packed
from .routing import packed_width
from .ulysses import SequenceParallel

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    return DTYPES[compute_dtype(dtype, device)]


HF_ROUTER_SUFFIX = ".mlp.gate.weight"
"""An HF MoE block's router (Qwen3-MoE: `model.layers.N.mlp.gate.weight`, [experts, hidden])."""


def freeze_routers(model: torch.nn.Module, suffix: str = HF_ROUTER_SUFFIX) -> int:
    """trainer.freeze_router: no gradient for the parameters named `*suffix` (the MoE routers);
    how many. A model without any is refused in one line."""
    routers = [p for name, p in model.named_parameters() if name.endswith(suffix)]
    if not routers:
        raise ValueError(
            f"trainer.freeze_router: the model has no MoE router (no parameter named *{suffix}); "
            "set trainer.freeze_router=false"
        )
    for p in routers:
        p.requires_grad_(False)
    return len(routers)


ROUTER_LOGITS_REFUSED = (
    "model config output_router_logits must be false: rlcore adds the router's load-balancing loss "
    "itself, the same on every strategy (set it false in the model's config.json, and "
    "trainer.router_aux_loss_coef to weigh it)"
)
"""One refusal for every strategy: a load-balancing loss one strategy added and another ignored would
make the same config train differently."""


def check_router_logits(config: Any) -> None:
    """Refuse an MoE config asking for the router's logits (its load-balancing loss)."""
    if getattr(config, "output_router_logits", False):
        raise ValueError(ROUTER_LOGITS_REFUSED)


def load_causal_lm(model_path: str, gradient_checkpointing: bool = False) -> torch.nn.Module:
    """Float32 master weights on CPU; strategies shard and move them."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    check_router_logits(model.config)
    model.config.use_cache = False
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


VALUE_HEAD = "score"
"""The critic's head as AutoModelForTokenClassification names it: `score.weight` [1, H], `score.bias` [1]."""


def value_head_init(hidden: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight [1, H], bias [1]) of a fresh value head, the same on every rank and strategy: normal
    with std 1/sqrt(H + 1) from a generator seeded by `seed`, bias 0 (outputs start near 0)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(1, hidden, generator=gen) / (hidden + 1) ** 0.5, torch.zeros(1)


def value_model_config(model_path: str) -> Any:
    """The HF config of a critic from `model_path` (a causal LM's folder or a critic's export): one
    label, no dropout in the head; what a critic's HF export writes, so that it loads back with
    AutoModelForTokenClassification."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path, num_labels=1)
    config.classifier_dropout = 0.0  # (a from_pretrained keyword the config class may not know is dropped)
    return config


def load_value_model(
    model_path: str, seed: int, gradient_checkpointing: bool = False, head_bias: bool = True
) -> torch.nn.Module:
    """A critic: the model's trunk with a scalar head per position (AutoModelForTokenClassification,
    one label), float32 on CPU. A folder without a value head (a causal LM) gets `value_head_init`'s;
    the head's dropout is off, so the values are a deterministic function of the weights. Without
    `head_bias` the head has none (a reward model, whose pairwise loss cannot move a bias: its
    export is AutoModelForSequenceClassification's head, `score.weight` alone)."""
    from transformers import AutoModelForTokenClassification

    config = value_model_config(model_path)
    check_router_logits(config)
    model, info = AutoModelForTokenClassification.from_pretrained(
        model_path, config=config, dtype=torch.float32, output_loading_info=True
    )
    assert all(m.p == 0 for m in model.modules() if isinstance(m, torch.nn.Dropout)), (
        "a critic without dropout"
    )
    head = getattr(model, VALUE_HEAD)
    if VALUE_HEAD + ".weight" in info["missing_keys"]:
        weight, bias = value_head_init(head.in_features, seed)
        with torch.no_grad():
            head.weight.copy_(weight)
            head.bias.copy_(bias)
    if not head_bias:
        bare = torch.nn.Linear(head.in_features, 1, bias=False)
        with torch.no_grad():
            bare.weight.copy_(head.weight)
        setattr(model, VALUE_HEAD, bare)
    model.config.use_cache = False
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def forward_values(
    model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    packed: bool = False,
    sp: SequenceParallel | None = None,
) -> torch.Tensor:
    """Per-token values [B, T] in the layout of `forward_logprobs`: position t holds the value of the
    state before input_ids[t] (the head's output at t - 1); position 0 is 0. Causal attention without
    a mask, as there (padding only ever comes after the real tokens); `packed`: the model runs on the
    real tokens only (packed.py); `sp`: sliced over a sequence-parallel group (ulysses.py)."""
    if packed or sp is not None:
        layout = Packed.of(batch)
        out, _, _ = _row_outputs(model, layout, sp)
        return layout.from_predictions(_gathered(out[:, 0].float(), sp)[: layout.num_tokens - 1])
    out = model(input_ids=batch["input_ids"], use_cache=False).logits[:, :-1, 0].float()
    return torch.cat([out.new_zeros((out.shape[0], 1)), out], dim=1)


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated decoder blocks, found by HF's `_no_split_modules` class names."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        raise ValueError(f"cannot find the decoder blocks of {type(model).__name__} (no _no_split_modules)")
    return blocks


def forward_logprobs(
    model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    temperature: float,
    with_entropy: bool,
    packed: bool = False,
    sp: SequenceParallel | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probs [B, T] (position t: log p(input_ids[t] | <t)); position 0 is 0.

    Logits are divided by the sampling temperature so the trainer scores the same distribution the
    engine sampled from (each row's, when the batch holds several: logprob.at_temperature).

    Batches are right-padded (core/batch.py), so plain causal attention gives every real position
    exactly what the padding mask would: padding only ever comes after it. Leaving the mask out lets
    SDPA run its causal kernel without building a [B, 1, T, T] mask (10% of a small model's
    forward/backward on CPU); padding positions get values the loss mask ignores.

    `packed`: the model runs on the rows' real tokens laid end to end (packed.py); the results come
    back in the same [B, T] layout, 0 at padding. `sp`: packed and sliced over a sequence-parallel
    group (ulysses.py); every rank of the group gets the whole micro-batch's results.
    """
    if packed or sp is not None:
        return _packed_logprobs(model, batch, temperature, with_entropy, sp)
    input_ids = batch["input_ids"]
    logits = model(input_ids=input_ids, use_cache=False).logits
    logits = at_temperature(logits[:, :-1], temperature, batch)
    lp = token_logprobs(logits, input_ids[:, 1:])
    zeros = lp.new_zeros((lp.shape[0], 1))
    logprobs = torch.cat([zeros, lp], dim=1)
    entropy = None
    if with_entropy:
        ent = entropy_from_logits(logits)
        entropy = torch.cat([zeros, ent], dim=1)
    return logprobs, entropy


def _row_outputs(
    model: torch.nn.Module, layout: Packed, sp: SequenceParallel | None
) -> tuple[torch.Tensor, slice, torch.Tensor]:
    """The model's outputs [n, ...] on the packed row, or with `sp` on this rank's slice of it (the
    row padded to a multiple of the group's size: Packed.padded), attending within each sequence:
    through attention.packed_attention once the strategy has switched the model to it (told where
    the sequences start by row_kwargs), else through the block-diagonal mask HF derives from
    restarting position ids (other attentions ignore the extra keywords). Also the slice of the row
    they cover and the row's ids [M]."""
    ids, positions, cu = layout.padded(packed_width(layout, sp))
    part = slice(0, ids.shape[1]) if sp is None else sp.slice_of(ids.shape[1])
    rows = row_kwargs(cu, sp)
    out = model(input_ids=ids[:, part], position_ids=positions[:, part], use_cache=False, **rows).logits
    return out[0], part, ids[0]


def _gathered(local: torch.Tensor, sp: SequenceParallel | None) -> torch.Tensor:
    """The row's per-position values from each rank's slice of them (the slice itself without `sp`)."""
    return local if sp is None else sp.gather(local)


def _packed_logprobs(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], temperature: float, with_entropy: bool,
    sp: SequenceParallel | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """forward_logprobs on the packed row: each position scores the token after it (over a
    sequence-parallel group each rank its slice's positions, then the group gathers the row)."""
    layout = Packed.of(batch)
    logits, part, ids = _row_outputs(model, layout, sp)
    logits = at_temperature_packed(logits, temperature, layout, batch, part.start)
    nexts = torch.cat([ids[1:], ids.new_zeros(1)])[part]  # the token after each position
    n = layout.num_tokens - 1  # the row's predictions (the last token's and a tail's are dropped)
    logprobs = layout.from_predictions(_gathered(token_logprobs(logits[None], nexts[None])[0], sp)[:n])
    entropy = None
    if with_entropy:
        entropy = layout.from_predictions(_gathered(entropy_from_logits(logits[None])[0], sp)[:n])
    return logprobs, entropy
