"""Checks of the `model` section: lengths, the chat template, the scratch model, the model folder and
LoRA (`model.lora_configs`); and how the trainer lays the model's sequences out (packing, Ulysses)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
from collections.abc import Sequence

from ..lora_files import per_layer, unsupported
from ..strategy_capabilities import MEGATRON_LORA_TARGETS, has, strategies_with
from .errors import ConfigError
from .schema import LoraConfig, MegatronConfig, RLCoreConfig


def check_model(cfg: RLCoreConfig, check_paths: bool) -> None:
    model = cfg.model
    if model.max_prompt_tokens + model.max_response_tokens > model.max_model_len:
        raise ConfigError(
            f"model.max_prompt_tokens + model.max_response_tokens ({model.max_prompt_tokens} + "
            f"{model.max_response_tokens}) must be <= model.max_model_len ({model.max_model_len})"
        )
    if model.chat_template_path is not None:
        if model.chat_template is not None:
            raise ConfigError(
                "model.chat_template_path: give the template inline (model.chat_template) or as a file, not both"
            )
        if check_paths and not os.path.isfile(model.chat_template_path):
            raise ConfigError(f"model.chat_template_path: '{model.chat_template_path}' is not a file")
    if model.chat_template_kwargs:
        from ..data.prompts import template_kwargs_problem

        why = template_kwargs_problem(model.chat_template_kwargs)
        if why is not None:
            raise ConfigError(f"model.chat_template_kwargs: {why}")
        if not model.apply_chat_template:
            raise ConfigError(
                "model.chat_template_kwargs: the chat template's variables need model.apply_chat_template: true"
            )
    sc = model.scratch
    if sc.enabled:
        if sc.tokenizer not in ("char", "bpe"):
            raise ConfigError(f"model.scratch.tokenizer must be one of char, bpe; got '{sc.tokenizer}'")
        if sc.num_experts_per_tok > sc.num_experts:
            raise ConfigError(
                f"model.scratch.num_experts_per_tok ({sc.num_experts_per_tok}) must be <= "
                f"model.scratch.num_experts ({sc.num_experts})"
            )
        if sc.hidden_size % sc.num_attention_heads:
            raise ConfigError(
                "model.scratch.hidden_size must be divisible by model.scratch.num_attention_heads"
            )
        if sc.num_attention_heads % sc.num_key_value_heads:
            raise ConfigError(
                "model.scratch.num_attention_heads must be divisible by model.scratch.num_key_value_heads"
            )
    elif check_paths and model.model_path != "<previous stage>" and not os.path.isdir(model.model_path):
        raise ConfigError(
            f"model.model_path: '{model.model_path}' is not a folder (give an HF model folder, "
            f"or set model.scratch.enabled=true to build a tiny model there)"
        )
    if model.lora_configs:
        _check_lora(cfg, check_paths)
    _check_sequence_parallel(cfg)
    _check_context_parallel(cfg)
    _check_offload(cfg)
    _check_megatron_section(cfg)
    if cfg.algorithm.router_replay != "none":
        _check_router_replay(cfg, check_paths)
    if cfg.trainer.router_aux_loss_coef > 0:
        _check_router_aux_loss(cfg, check_paths)


ROUTER_REPLAY_MODELS = ("qwen3_moe",)
"""model_type of the models whose routers routing replay records and replays (core/moe_routing.py)."""


def _check_router_replay(cfg: RLCoreConfig, check_paths: bool) -> None:
    """algorithm.router_replay r2 and r3: an MoE model; on megatron r3 replays each tensor- and
    context-parallel rank's share of the records, without pipeline parallelism (a recomputed layer of
    one micro-batch runs after later micro-batches' forwards), and r2 without pipeline, context or
    tensor parallelism (its records at those layouts are not proven); r3 also the HF engine (it
    records the routing) and the workflows that carry its records."""
    key = "algorithm.router_replay"
    mode = cfg.algorithm.router_replay
    _check_router_layout(
        cfg, key, f"{mode} on megatron",
        "a recomputed layer must route as its forward did"
        + (": in a pipeline schedule later micro-batches' forwards come between" if mode == "r3" else ""),
        f"{key}: none", allowed=("tensor_model_parallel_size", "context_parallel_size") if mode == "r3" else (),
    )  # fmt: skip
    _check_moe_model(cfg, key, f"{mode} replays the routers of", f"{key}: none", check_paths)
    if mode == "r3":
        _check_rollout_routing(cfg, key)


def _check_router_aux_loss(cfg: RLCoreConfig, check_paths: bool) -> None:
    """trainer.router_aux_loss_coef > 0: an MoE model, whole rows on each rank (no Ulysses; megatron
    without pipeline, context or tensor parallelism: the loss is computed from one rank's routers)."""
    key, off = "trainer.router_aux_loss_coef", "trainer.router_aux_loss_coef: 0"
    _check_router_layout(
        cfg, key, "the load-balancing loss on megatron",
        "the loss joins the last stage's, from whole rows: with CP or TP each rank's routers see a slice",
        off,
    )  # fmt: skip
    if cfg.trainer.ulysses_sequence_parallel_size > 1:
        raise ConfigError(
            f"{key}: with trainer.ulysses_sequence_parallel_size > 1 each rank's routers see a slice of the "
            f"tokens, which the loss does not combine yet; set ulysses_sequence_parallel_size to 1 (or {off})"
        )
    _check_moe_model(cfg, key, "the load-balancing loss is computed on the routers of", off, check_paths)


LAYOUT_SIZES = ("pipeline_model_parallel_size", "context_parallel_size", "tensor_model_parallel_size")
"""trainer.megatron's parallel sizes that split a layer's tokens or its micro-batches' order."""


def _check_router_layout(
    cfg: RLCoreConfig, key: str, what: str, why: str, off: str, allowed: tuple[str, ...] = ()
) -> None:
    """`what` on megatron refused where a LAYOUT_SIZES size not in `allowed` is above 1."""
    mc = cfg.trainer.megatron
    refused = [name for name in LAYOUT_SIZES if name not in allowed]
    if cfg.trainer.strategy == "megatron" and any(getattr(mc, name) > 1 for name in refused):
        names = [n.removesuffix("_model_parallel_size").removesuffix("_parallel_size") for n in refused]
        listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        sizes = refused[0] if len(refused) == 1 else f"{', '.join(refused[:-1])} and {refused[-1]}"
        raise ConfigError(
            f"{key}: {what} is proven without {listed} parallelism ({why}); set trainer.megatron.{sizes} to 1 "
            f"(or {off})"
        )


def _check_moe_model(cfg: RLCoreConfig, key: str, what: str, off: str, check_paths: bool) -> None:
    """The model has routers rlcore knows (a scratch qwen3_moe, or a model folder of that type)."""
    sc = cfg.model.scratch
    if sc.enabled and sc.architecture != "qwen3_moe":
        raise ConfigError(
            f"{key}: a {sc.architecture} model has no experts to route; set "
            f"model.scratch.architecture: qwen3_moe (or {off})"
        )
    config = os.path.join(cfg.model.model_path, "config.json")
    if not sc.enabled and check_paths and os.path.isfile(config):
        with open(config) as f:
            model_type = json.load(f).get("model_type")
        if model_type not in ROUTER_REPLAY_MODELS:
            raise ConfigError(
                f"{key}: {what} {', '.join(ROUTER_REPLAY_MODELS)} models; model.model_path is "
                f"a {model_type} model: set {off}"
            )


ROUTING_WORKFLOWS = ("single_turn", "multi_turn", "tool_call")
"""The workflows whose experiences carry the engine's routing records (r3): one engine call, or the
conversation loop that joins its calls' records (rollout/workflows/conversation.py)."""


def _check_rollout_routing(cfg: RLCoreConfig, key: str) -> None:
    """r3: the HF engine records the routing, in the workflows that carry it."""
    engine = cfg.explorer.rollout_model.engine_type
    if engine != "hf":
        raise ConfigError(
            f"{key}: r3 needs the engine to record each token's experts, which the HF engine does; "
            f"explorer.rollout_model.engine_type is {engine}: set it to hf (or {key}: none)"
        )
    inputs = cfg.buffer.explorer_input
    for path, ts in [("buffer.explorer_input.taskset", inputs.taskset)] + [
        (f"buffer.explorer_input.mixture[{i}]", t) for i, t in enumerate(inputs.mixture)
    ]:
        if ts.default_workflow_type not in ROUTING_WORKFLOWS:
            raise ConfigError(
                f"{key}: r3 carries the engine's routing in the {', '.join(ROUTING_WORKFLOWS)} workflows; "
                f"{path}.default_workflow_type is {ts.default_workflow_type}: use one of them, or {key}: none"
            )


def _check_sequence_parallel(cfg: RLCoreConfig) -> None:
    t = cfg.trainer
    size = t.ulysses_sequence_parallel_size
    if size == 1:
        return
    if not has(t.strategy, "ulysses"):
        raise ConfigError(
            f"trainer.ulysses_sequence_parallel_size: Ulysses runs on {' and '.join(strategies_with('ulysses'))}, "
            f"not {t.strategy}; use --strategy fsdp2, or set it to 1"
        )
    if not t.use_remove_padding:
        raise ConfigError(
            f"trainer.ulysses_sequence_parallel_size: {size} slices packed sequences; set "
            "trainer.use_remove_padding=true (or the size to 1)"
        )
    if cfg.model.scratch.enabled and cfg.model.scratch.num_attention_heads % size:
        raise ConfigError(
            f"trainer.ulysses_sequence_parallel_size: {size} must divide model.scratch.num_attention_heads "
            f"({cfg.model.scratch.num_attention_heads})"
        )


def _check_context_parallel(cfg: RLCoreConfig) -> None:
    t = cfg.trainer
    size = t.megatron.context_parallel_size
    if size == 1:
        return
    if not has(t.strategy, "context_parallel"):
        raise ConfigError(
            f"trainer.megatron.context_parallel_size: context parallelism runs on "
            f"{' and '.join(strategies_with('context_parallel'))}, not {t.strategy}; "
            "use --strategy megatron, or trainer.ulysses_sequence_parallel_size on fsdp/fsdp2"
        )
    if not t.use_remove_padding:
        raise ConfigError(
            f"trainer.megatron.context_parallel_size: {size} splits packed sequences; set "
            "trainer.use_remove_padding=true (or the size to 1)"
        )


def _check_offload(cfg: RLCoreConfig) -> None:
    t = cfg.trainer
    for key, on in (("fsdp_config.param_offload", t.fsdp_config.param_offload),
                    ("offload_untrained_models", t.offload_untrained_models)):  # fmt: skip
        if on and not has(t.strategy, "offload"):
            raise ConfigError(
                f"trainer.{key}: offloading a model to the CPU runs on {' and '.join(strategies_with('offload'))}, "
                f"not {t.strategy}; use --strategy fsdp2, or set it false (megatron offloads its "
                "optimizer: trainer.megatron.optimizer_offload_fraction)"
            )
        if on and t.strategy == "fsdp" and cfg.cluster.device == "cpu":  # "auto": the strategy says it
            raise ConfigError(
                f"trainer.{key}: FSDP1's CPU offload needs a GPU (torch refuses it on a CPU device); "
                "use --strategy fsdp2 with cluster.device=cpu, or set it false"
            )

    offload = t.megatron.optimizer_offload_fraction
    if (
        offload > 0
        and t.strategy == "megatron"
        and (cfg.cluster.device == "cpu" or cfg.model.dtype == "float32")
    ):
        raise ConfigError(
            f"trainer.megatron.optimizer_offload_fraction={offload}: megatron-core offloads the optimizer "
            f"of 16-bit parameters on a GPU only (here model.dtype={cfg.model.dtype}, "
            f"cluster.device={cfg.cluster.device}); use model.dtype=bfloat16 on cuda, or set it 0"
        )


def _check_lora(cfg: RLCoreConfig, check_paths: bool) -> None:
    adapters = cfg.model.lora_configs
    if len(adapters) > 1:
        raise ConfigError(
            f"model.lora_configs: one adapter is trained at a time; got {len(adapters)} (keep one entry)"
        )
    if not has(cfg.trainer.strategy, "lora"):
        raise ConfigError(
            f"model.lora_configs: LoRA trains on strategies {', '.join(strategies_with('lora'))}; "
            f"{cfg.trainer.strategy} has none: use --strategy fsdp2, or leave model.lora_configs empty for "
            "full fine-tuning"
        )
    if cfg.algorithm.sync_ref_model:
        raise ConfigError(
            "algorithm.sync_ref_model: with LoRA the reference policy is the base model with the adapter "
            "switched off, which does not move; set sync_ref_model false or leave model.lora_configs empty"
        )
    if importlib.util.find_spec("peft") is None:
        raise ConfigError("model.lora_configs: LoRA needs the peft package: pip install 'rlcore[lora]'")
    _check_adapter(adapters[0], "model.lora_configs[0]", check_paths)
    targets = adapters[0].target_modules
    if check_paths and not isinstance(targets, str) and "lm_head" in targets and _ties_head(cfg.model.model_path):
        raise ConfigError(
            "model.lora_configs[0].target_modules: lm_head shares its weight with the embedding in "
            f"{cfg.model.model_path} (tie_word_embeddings): an adapter on it would move the embedding too "
            "where the merged weights load; leave lm_head out"
        )
    if cfg.trainer.strategy == "megatron":
        _check_megatron_lora(cfg, adapters[0], check_paths)


def _check_megatron_lora(cfg: RLCoreConfig, lora: LoraConfig, check_paths: bool) -> None:
    """What megatron's adapters (backends/megatron/lora.py) cover: the linear layers of dense
    decoder layers, one rank and alpha, no dropout."""
    saved: dict = {}
    if lora.path is not None and check_paths:
        with open(os.path.join(lora.path, "adapter_config.json")) as f:
            saved = json.load(f)
    where = "model.lora_configs[0]" + (".path" if saved else "")
    targets = saved.get("target_modules", lora.target_modules) if saved else lora.target_modules
    if saved and isinstance(targets, str) and targets != "all-linear":
        targets = ()  # peft's regex: the strategy reads the layers from the adapter's weights
    names = {targets} if isinstance(targets, str) else set(targets or ())
    unknown = sorted(names - {"all-linear", *MEGATRON_LORA_TARGETS})
    dropout = saved.get("lora_dropout", 0.0) if saved else lora.lora_dropout
    patterns = per_layer(saved)
    layers = [k for k in ("layers_to_transform", "layers_pattern", "exclude_modules") if saved.get(k)]
    refused = [
        what for what, on in (
            (f"target_modules {', '.join(unknown)} (its adapters sit on {', '.join(MEGATRON_LORA_TARGETS)})", unknown),
            (f"lora_dropout {dropout} (its adapters apply no dropout)", dropout),
            (f"{', '.join(patterns)} (its adapters take one rank and alpha)", patterns),
            (f"{', '.join(layers)} (its adapters sit on a projection in every layer or in none)", layers),
        ) if on
    ]  # fmt: skip
    if refused:
        raise ConfigError(
            f"{where}: --strategy megatron cannot train {'; '.join(refused)}: change it, or use --strategy fsdp2"
        )
    if check_paths and _config_of(cfg.model.model_path).get("num_experts"):
        raise ConfigError(
            f"model.lora_configs: {cfg.model.model_path} is a mixture-of-experts model; megatron's LoRA adapts "
            "dense models: use --strategy fsdp2, or leave model.lora_configs empty"
        )


def _config_of(model_path: str) -> dict:
    """The model folder's config.json ({} where there is none to read)."""
    try:
        with open(os.path.join(model_path, "config.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _ties_head(model_path: str) -> bool:
    """Whether the model folder's config.json ties the output head to the embedding."""
    config = _config_of(model_path)
    return bool(config.get("tie_word_embeddings", (config.get("text_config") or {}).get("tie_word_embeddings")))


def _check_adapter(lora: LoraConfig, path: str, check_paths: bool) -> None:
    targets = lora.target_modules
    if isinstance(targets, str):
        if targets != "all-linear":
            raise ConfigError(
                f"{path}.target_modules: 'all-linear' or a list of module names (e.g. [q_proj, v_proj]); "
                f"got '{targets}'"
            )
    elif not (isinstance(targets, Sequence) and targets and all(isinstance(n, str) and n for n in targets)):
        raise ConfigError(
            f"{path}.target_modules: 'all-linear' or a non-empty list of module names (e.g. [q_proj, v_proj]); "
            f"got {targets!r}"
        )
    if lora.path is None or not check_paths:
        return
    config_file = os.path.join(lora.path, "adapter_config.json")
    if not os.path.isfile(config_file):
        raise ConfigError(
            f"{path}.path: '{lora.path}' has no adapter_config.json (give a folder peft's save_pretrained wrote)"
        )
    with open(config_file) as f:
        saved = json.load(f)
    beyond = unsupported(saved)
    if beyond:
        raise ConfigError(
            f"{path}.path: the adapter at '{lora.path}' uses {', '.join(beyond)}; rlcore trains plain LoRA "
            "adapters (r, alpha, dropout, target modules)"
        )


def _check_megatron_section(cfg: RLCoreConfig) -> None:
    """trainer.megatron is read by strategy megatron alone: a value set there under fsdp or fsdp2
    would change nothing, so it is refused (as context_parallel_size above is)."""
    t = cfg.trainer
    if t.strategy == "megatron":
        return
    default = MegatronConfig()
    for f in dataclasses.fields(MegatronConfig):
        if getattr(t.megatron, f.name) != getattr(default, f.name):
            raise ConfigError(
                f"trainer.megatron.{f.name}: trainer.megatron is read by strategy megatron only, and "
                f"trainer.strategy is {t.strategy} (it would change nothing): use --strategy megatron, or "
                "drop trainer.megatron"
            )
