"""Keys of the configs rlcore's users port from (Trinity-RFT, NexRL, TRL's GRPOConfig) that rlcore
spells differently: an unknown key found here is answered with rlcore's key ("did you mean rlcore's
cluster.num_nodes? (Trinity-RFT's name)") instead of the closest spelling in its section.

Paths are the source project's, dotted from its config's top level; `{taskset}.` stands for any of
rlcore's tasksets (buffer.explorer_input.taskset, eval_tasksets[i], mixture[i], buffer.expert_taskset)
and `[]` for any list index. The same names under rlcore's own paths need no entry."""

from __future__ import annotations

import re
from typing import NamedTuple


class Renamed(NamedTuple):
    key: str
    """rlcore's key (`{taskset}.` and `[]` as in the source path)."""
    source: str
    """The project that spells it the source path's way."""
    note: str = ""
    """What differs besides the name (units, counting), when something does."""


def _trinity(key: str, note: str = "") -> Renamed:
    return Renamed(key, "Trinity-RFT", note)


def _nexrl(key: str, note: str = "") -> Renamed:
    return Renamed(key, "NexRL", note)


def _trl(key: str, note: str = "") -> Renamed:
    return Renamed(key, "TRL", note)


_ACTOR = "service.train_service.actor"  # NexRL's policy settings
_ROLLOUT_ARGS = "buffer.explorer_input.taskset.rollout_args"
_STAGES_NOTE = (
    "rlcore runs an SFT warm-up as a stage of its own: stages: [{name: sft, mode: train, algorithm: "
    "{algorithm_type: sft}, ...}, {name: rl}]"
)

RENAMED: dict[str, Renamed] = {
    # Trinity-RFT (trinity/common/config.py)
    "cluster.node_num": _trinity("cluster.num_nodes"),
    "cluster.gpu_per_node": _trinity("cluster.ranks_per_node", "trainer processes per node, one per GPU"),
    "model.custom_chat_template": _trinity("model.chat_template"),
    "model.temperature": _trinity(f"{_ROLLOUT_ARGS}.temperature", "each taskset samples at its own"),
    "model.top_p": _trinity(f"{_ROLLOUT_ARGS}.top_p", "each taskset samples with its own"),
    "model.top_k": _trinity(f"{_ROLLOUT_ARGS}.top_k", "each taskset samples with its own"),
    "algorithm.optimizer.warmup_style": _trinity("algorithm.optimizer.lr_scheduler_type"),
    "algorithm.optimizer.lr_warmup_steps_ratio": _trinity(
        "algorithm.optimizer.lr_warmup_steps", "a number of optimizer steps, not a share of them"
    ),
    "algorithm.policy_loss_fn_args.clip_range": _trinity(
        "algorithm.clip_ratio_low", "and algorithm.clip_ratio_high"
    ),
    "algorithm.policy_loss_fn_args.clip_range_low": _trinity("algorithm.clip_ratio_low"),
    "algorithm.policy_loss_fn_args.clip_range_high": _trinity("algorithm.clip_ratio_high"),
    "algorithm.kl_loss_fn_args.kl_coef": _trinity("algorithm.kl_loss_coef"),
    "algorithm.kl_penalty_fn_args.kl_coef": _trinity("algorithm.kl_ctrl.kl_coef"),
    "algorithm.entropy_loss_fn_args.entropy_coef": _trinity("algorithm.entropy_coef"),
    "algorithm.advantage_fn_args.gamma": _trinity("algorithm.gamma"),
    "algorithm.advantage_fn_args.lam": _trinity("algorithm.lam"),
    "trainer.actor_grad_clip": _trinity("trainer.grad_clip"),
    "trainer.trainer_type": _trinity("trainer.strategy", "rlcore trains itself: fsdp, fsdp2 or megatron"),
    "trainer.trainer_config": _trinity(
        "trainer.strategy", "rlcore has no verl config: its training keys are trainer.* and algorithm.*"
    ),
    "explorer.rollout_model.seed": _trinity("seed"),
    "explorer.auxiliary_models[].model_path": _trinity(
        "explorer.auxiliary_models[].base_url",
        "rlcore reaches an auxiliary model as an OpenAI-compatible "
        "service: base_url (or base_url_env) and model_name",
    ),  # fmt: skip
    "buffer.explorer_input.tasksets": _trinity(
        "buffer.explorer_input.mixture", "the first one is buffer.explorer_input.taskset"
    ),
    "buffer.explorer_input.default_workflow_type": _trinity(
        "buffer.explorer_input.taskset.default_workflow_type", "set on each taskset"
    ),
    "buffer.explorer_input.default_eval_workflow_type": _trinity(
        "buffer.explorer_input.eval_tasksets[].default_workflow_type", "set on each taskset"
    ),
    "buffer.explorer_input.default_reward_fn_type": _trinity(
        "buffer.explorer_input.taskset.reward_fn", "a list of names, set on each taskset"
    ),
    "buffer.explorer_input.system_prompt": _trinity(
        "buffer.explorer_input.taskset.format.system_prompt", "set on each taskset"
    ),
    "{taskset}.default_reward_fn_type": _trinity("{taskset}.reward_fn", "a list of names"),
    "{taskset}.default_eval_workflow_type": _trinity("{taskset}.default_workflow_type"),
    "{taskset}.rollout_args.n": _trinity(
        "algorithm.repeat_times", "an eval taskset's samples per task: its repeat_times"
    ),
    "buffer.trainer_input.experience_buffer.max_read_timeout": _trinity(
        "buffer.trainer_input.experience_buffer.max_wait_s"
    ),
    "buffer.trainer_input.experience_buffer.use_priority_queue": _trinity(
        "buffer.trainer_input.experience_buffer.replay_buffer.enable"
    ),
    "buffer.trainer_input.experience_buffer.replay_buffer_kwargs": _trinity(
        "buffer.trainer_input.experience_buffer.replay_buffer.priority_fn_args"
    ),
    "buffer.trainer_input.sft_warmup_dataset": _trinity("stages", _STAGES_NOTE),
    "buffer.trainer_input.sft_warmup_steps": _trinity("stages", _STAGES_NOTE),
    "buffer.trainer_input.auxiliary_buffers": _trinity(
        "buffer.expert_taskset", "the expert rows algorithm_type mix trains on"
    ),
    "stages[].stage_name": _trinity("stages[].name"),
    # NexRL (nexrl/config/rl_train.yaml)
    "project_name": _nexrl("project"),
    "experiment_name": _nexrl("name"),
    "logger.backend": _nexrl("monitor.monitor_type"),
    "resume.mode": _nexrl("continue_from_checkpoint", "true resumes from the run's latest checkpoint"),
    "data.batch_size": _nexrl("buffer.batch_size"),
    "data.rollout_repeat_n": _nexrl("algorithm.repeat_times"),
    "data.data_files": _nexrl("buffer.explorer_input.taskset.path"),
    "data.prompt_key": _nexrl("buffer.explorer_input.taskset.format.prompt_key"),
    "data.seed": _nexrl("seed"),
    "data.shuffle": _nexrl("buffer.explorer_input.taskset.shuffle"),
    "data.max_prompt_length": _nexrl("model.max_prompt_tokens"),
    "data.tokenizer_path": _nexrl("model.model_path", "the tokenizer is read from the model folder"),
    "rollout_worker.type": _nexrl("buffer.explorer_input.taskset.default_workflow_type"),
    "rollout_worker.num_workers": _nexrl("explorer.rollout_model.engine_num"),
    "rollout_worker.temperature": _nexrl(f"{_ROLLOUT_ARGS}.temperature"),
    "rollout_worker.max_prompt_length": _nexrl("model.max_prompt_tokens"),
    "rollout_worker.max_response_length": _nexrl("model.max_response_tokens"),
    "algorithm.type": _nexrl("algorithm.algorithm_type"),
    "algorithm.kl_penalty": _nexrl("algorithm.kl_penalty_fn"),
    "algorithm.kl_ctrl.kl_reward_coef": _nexrl("algorithm.kl_ctrl.kl_coef"),
    "train_worker.total_train_steps": _nexrl("trainer.total_steps"),
    "train_worker.save_freq": _nexrl("trainer.save_interval"),
    "train_worker.checkpoint_path": _nexrl("checkpoint_root_dir"),
    "train_worker.remove_previous_ckpt": _nexrl("trainer.max_checkpoints_to_keep", "1 keeps the latest only"),
    "weight.sync_mode": _nexrl("synchronizer.asynchronous", "fully-async and batch-async: true"),
    "weight.staleness_threshold": _nexrl("synchronizer.max_staleness"),
    "weight.sync_method": _nexrl("synchronizer.sync_method"),
    "validate.validate_before_train": _nexrl("explorer.eval_on_startup"),
    "validate.eval.validate_freq": _nexrl("explorer.eval_interval"),
    "validate.data.data_files": _nexrl("buffer.explorer_input.eval_tasksets[].path"),
    "service.inference_service.backend": _nexrl("explorer.rollout_model.engine_type"),
    "service.inference_service.base_url": _nexrl("explorer.rollout_model.endpoints", "a list of host:port"),
    "service.inference_service.model": _nexrl("model.model_path"),
    "service.inference_service.max_tokens": _nexrl("model.max_response_tokens"),
    "service.train_service.backend": _nexrl(
        "trainer.remote", "backend tinker with url http://host:port is trainer.remote: tinker://host:port"
    ),
    "service.train_service.url": _nexrl("trainer.remote", "tinker://host:port for a Tinker service"),
    f"{_ACTOR}.model.path": _nexrl("model.model_path"),
    f"{_ACTOR}.model.use_remove_padding": _nexrl("trainer.use_remove_padding"),
    f"{_ACTOR}.grad_clip": _nexrl("trainer.grad_clip"),
    f"{_ACTOR}.clip_ratio": _nexrl("algorithm.clip_ratio_low", "and algorithm.clip_ratio_high"),
    f"{_ACTOR}.clip_ratio_low": _nexrl("algorithm.clip_ratio_low"),
    f"{_ACTOR}.clip_ratio_high": _nexrl("algorithm.clip_ratio_high"),
    f"{_ACTOR}.clip_ratio_c": _nexrl("algorithm.clip_ratio_c"),
    f"{_ACTOR}.loss_agg_mode": _nexrl("algorithm.loss_agg_mode"),
    f"{_ACTOR}.entropy_coeff": _nexrl("algorithm.entropy_coef"),
    f"{_ACTOR}.use_kl_loss": _nexrl("algorithm.kl_loss_coef", "> 0 turns the KL loss on"),
    f"{_ACTOR}.kl_loss_type": _nexrl("algorithm.kl_loss_fn"),
    f"{_ACTOR}.kl_loss_coef": _nexrl("algorithm.kl_loss_coef"),
    f"{_ACTOR}.ulysses_sequence_parallel_size": _nexrl("trainer.ulysses_sequence_parallel_size"),
    f"{_ACTOR}.ppo_max_token_len_per_gpu": _nexrl("trainer.max_token_len_per_gpu"),
    f"{_ACTOR}.ppo_mini_batch_size": _nexrl("buffer.train_batch_size", "experiences per optimizer step"),
    f"{_ACTOR}.do_old_log_prob_compute": _nexrl("algorithm.do_old_log_prob_compute"),
    f"{_ACTOR}.optim.lr": _nexrl("algorithm.optimizer.lr"),
    f"{_ACTOR}.optim.warmup_style": _nexrl("algorithm.optimizer.lr_scheduler_type"),
    f"{_ACTOR}.fsdp_config.param_offload": _nexrl("trainer.fsdp_config.param_offload"),
    # TRL (GRPOConfig and its scripts' arguments, flat at the top level)
    "model_name_or_path": _trl("model.model_path"),
    "dataset_name": _trl("buffer.explorer_input.taskset.path"),
    "dataset_train_split": _trl("buffer.explorer_input.taskset.split"),
    "output_dir": _trl("checkpoint_root_dir"),
    "run_name": _trl("name"),
    "report_to": _trl("monitor.monitor_type"),
    "resume_from_checkpoint": _trl("continue_from_checkpoint"),
    "num_generations": _trl("algorithm.repeat_times"),
    "per_device_train_batch_size": _trl(
        "buffer.batch_size",
        "rlcore counts tasks per step, TRL completions per device: "
        "buffer.batch_size = its value x devices / num_generations",
    ),  # fmt: skip
    "gradient_accumulation_steps": _trl(
        "buffer.train_batch_size", "experiences per optimizer step (0: all of a step's)"
    ),
    "num_train_epochs": _trl("buffer.total_epochs"),
    "max_steps": _trl("trainer.total_steps"),
    "save_steps": _trl("trainer.save_interval"),
    "save_total_limit": _trl("trainer.max_checkpoints_to_keep"),
    "eval_steps": _trl("explorer.eval_interval"),
    "learning_rate": _trl("algorithm.optimizer.lr"),
    "lr_scheduler_type": _trl("algorithm.optimizer.lr_scheduler_type"),
    "warmup_steps": _trl("algorithm.optimizer.lr_warmup_steps"),
    "warmup_ratio": _trl("algorithm.optimizer.lr_warmup_steps", "a number of optimizer steps, not a share"),
    "weight_decay": _trl("algorithm.optimizer.weight_decay"),
    "adam_beta1": _trl("algorithm.optimizer.betas", "[beta1, beta2]"),
    "adam_beta2": _trl("algorithm.optimizer.betas", "[beta1, beta2]"),
    "adam_epsilon": _trl("algorithm.optimizer.eps"),
    "max_grad_norm": _trl("trainer.grad_clip"),
    "bf16": _trl("model.dtype", "bfloat16"),
    "max_prompt_length": _trl("model.max_prompt_tokens"),
    "max_completion_length": _trl("model.max_response_tokens"),
    "temperature": _trl(f"{_ROLLOUT_ARGS}.temperature"),
    "top_p": _trl(f"{_ROLLOUT_ARGS}.top_p"),
    "top_k": _trl(f"{_ROLLOUT_ARGS}.top_k"),
    "min_p": _trl(f"{_ROLLOUT_ARGS}.min_p"),
    "repetition_penalty": _trl(f"{_ROLLOUT_ARGS}.repetition_penalty"),
    "beta": _trl("algorithm.kl_loss_coef"),
    "epsilon": _trl("algorithm.clip_ratio_low"),
    "epsilon_high": _trl("algorithm.clip_ratio_high"),
    "loss_type": _trl("algorithm.loss_agg_mode", "dr_grpo is seq-mean-token-sum-norm, dapo token-mean"),
    "mask_truncated_completions": _trl("algorithm.overlong_filter"),
    "reward_funcs": _trl("buffer.explorer_input.taskset.reward_fn"),
    "reward_weights": _trl("buffer.explorer_input.taskset.reward_weights"),
    "use_vllm": _trl("explorer.rollout_model.engine_type", "vllm"),
    "vllm_gpu_memory_utilization": _trl("explorer.rollout_model.gpu_memory_utilization"),
    "vllm_tensor_parallel_size": _trl("explorer.rollout_model.tensor_parallel_size"),
}

_STAGE = re.compile(r"stages\[\d+\]\.")
_TASKSET = re.compile(
    r"buffer\.(explorer_input\.(taskset|eval_tasksets\[\d+\]|mixture\[\d+\])|expert_taskset)\."
)


def renamed(path: str) -> tuple[str, Renamed] | None:
    """rlcore's key for the unknown key at `path` (rlcore's path to it: `stages[1].cluster.node_num`)
    with its entry, written for that place (that stage, that taskset); None when it is no known name."""
    stage = _STAGE.match(path)
    prefix = stage.group(0) if stage else ""
    rest = path[len(prefix) :]
    if stage and rest == "stage_name":
        return f"{prefix}name", RENAMED["stages[].stage_name"]
    taskset = _TASKSET.match(rest)
    in_taskset = RENAMED.get("{taskset}." + rest[taskset.end() :]) if taskset else None
    if taskset and in_taskset is not None:
        return prefix + in_taskset.key.replace("{taskset}.", taskset.group(0)), in_taskset
    entry = RENAMED.get(re.sub(r"\[\d+\]", "[]", rest))
    return (prefix + entry.key, entry) if entry is not None else None
