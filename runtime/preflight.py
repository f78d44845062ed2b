"""What `rlcore launch` checks and prepares before it starts any process: the device and strategy,
reward functions and monitor packages, the model folder, the assets it may build (scratch model,
synthetic tasksets), and whether the run folder already holds a run."""

from __future__ import annotations

import json
import os
from typing import Any

from ..core.checkpoint import list_checkpoints
from ..core.config import ConfigError, Stage, inherits_previous_model
from ..core.data.taskset import tasksets_of
from .loop import planned_steps
from .paths import SUMMARY, stage_dir


def resolve_device(requested: str) -> str:
    import torch

    if requested == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "cluster.device is cuda but no CUDA device is visible; use cluster.device=cpu (or auto)"
        )
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


def local_device_count() -> int:
    import torch

    return torch.cuda.device_count()


def check_strategies(stages: list[Stage], device: str) -> None:
    """A strategy this machine cannot run (megatron without CUDA) is a one-line error up front."""
    from ..backends import check_strategy_runs

    for s in stages:
        if s.plan.trainer != "local":
            continue  # the remote trainer's own machine decides
        try:
            check_strategy_runs(s.config.trainer.strategy, device)
        except RuntimeError as e:
            raise ConfigError(str(e)) from None


def prepare_assets(stages: list[Stage], model: bool = True) -> None:
    """Generate missing synthetic tasksets and build a missing scratch model (deterministic, so
    doing it once here, before any rank starts, is enough); `model` False: the tasksets only."""
    from ..core.data.taskset import ensure_taskset
    from ..core.scratch_model import ensure_model

    for stage in stages:
        cfg = stage.config
        for key, ts in tasksets_of(cfg):
            ensure_taskset(ts, key)
        if inherits_previous_model(cfg) or not model:
            continue
        if ensure_model(cfg.model.model_path, cfg.model.scratch, cfg.model.max_model_len, cfg.seed):
            print(f"rlcore: built a scratch model in {cfg.model.model_path}", flush=True)


def preflight(stages: list[Stage]) -> None:
    """Resolve everything a rank would otherwise discover minutes later: reward functions (user
    import paths included), monitor packages and the model folder."""
    from ..core.monitor import check_monitor_dependencies
    from ..core.services import auxiliary_models
    from ..rollout.rewards.check import check_rewards
    from ..rollout.workflows import resolve_workflow

    for s in stages:
        cfg = s.config
        check_monitor_dependencies(list(cfg.monitor.monitor_type))
        check_auxiliary_models(cfg)  # before the workflows that name them
        configured = [a["name"] for a in auxiliary_models(cfg)]
        for key, ts in tasksets_of(cfg):
            check_rewards(key, ts, configured)  # built, and called once on the taskset's first row
            try:  # a user's workflow by import path: found here, not minutes later on a worker
                workflow = resolve_workflow(ts.default_workflow_type)
            except ValueError as e:
                raise ConfigError(f"{key}.default_workflow_type: {e}") from None
            try:  # and its args (a multi_turn environment by import path among them)
                workflow.check_args(dict(ts.workflow_args))
            except ValueError as e:
                raise ConfigError(f"{key}.{e}") from None
            for name in workflow.auxiliary_needed(dict(ts.workflow_args)):
                if name not in configured:
                    raise ConfigError(
                        f"{key}.workflow_args: the workflow calls auxiliary model '{name}', which is not configured "
                        f"(explorer.auxiliary_models: {', '.join(configured) or 'none'}; 'external' is model.external_model)"
                    )
        rb = cfg.buffer.trainer_input.experience_buffer.replay_buffer
        if rb.enable:  # a user's priority function by import path, and its args
            from ..buffer.replay import resolve_priority

            try:
                resolve_priority(rb.priority_fn, dict(rb.priority_fn_args))
            except ValueError as e:
                raise ConfigError(str(e)) from None
        model = cfg.model
        if not inherits_previous_model(cfg) and not model.scratch.enabled:
            if not os.path.isfile(os.path.join(model.model_path, "config.json")):
                raise ConfigError(
                    f"model.model_path: '{model.model_path}' has no config.json (is it an HF model folder?)"
                )


def check_auxiliary_models(cfg: Any) -> None:
    """explorer.auxiliary_models and model.external_model name a service each (one line naming
    the key otherwise); whether the service answers is seen when a workflow first calls it."""
    from ..core.services import auxiliary_models, check_auxiliary

    ext = cfg.model.external_model
    if ext.enable and not ext.model_name:
        raise ConfigError("model.external_model.model_name: name the model the service serves")
    if ext.enable and not (ext.base_url or ext.base_url_env):
        raise ConfigError(
            "model.external_model: give base_url or base_url_env (the service's .../v1 address)"
        )
    try:
        check_auxiliary(auxiliary_models(cfg))
    except ValueError as e:
        raise ConfigError(f"explorer.{e}") from None


def check_model_lengths(stages: list[Stage]) -> None:
    """model.max_model_len within the positions the model holds (after prepare_assets: a scratch
    model exists by then), so no engine or trainer sequence runs past what the model learnt."""
    from ..rollout.engines.base import resolve_max_model_len

    for s in stages:
        if not inherits_previous_model(s.config):
            try:
                resolve_max_model_len(
                    s.config.model.model_path, s.config.model.max_model_len, "model.max_model_len"
                )
            except ValueError as e:
                raise ConfigError(str(e)) from None


def check_run_dir(run_dir: str, stages: list[Stage], resume: bool) -> None:
    had_run = any(
        list_checkpoints(stage_dir(run_dir, s, len(stages)))
        or os.path.isfile(os.path.join(stage_dir(run_dir, s, len(stages)), SUMMARY))
        for s in stages
    )
    if had_run and not resume:
        raise ConfigError(
            f"{run_dir} already holds a run: resume it with continue_from_checkpoint=true, "
            f"or start a new one with name=<new name> (or delete the folder)"
        )


def finished(run_dir: str, stages: list[Stage]) -> bool:
    """Whether every stage of the run in `run_dir` has trained all its planned steps (a resume would
    skip them all). Needs the tasksets on disk: the planned steps count their rows."""
    for s in stages:
        path = os.path.join(stage_dir(run_dir, s, len(stages)), SUMMARY)
        if not os.path.isfile(path):
            return False
        with open(path) as f:
            summary = json.load(f)
        if summary.get("stopped") or summary["global_step"] < planned_steps(s):
            return False
    return True
