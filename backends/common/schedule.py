"""Learning-rate schedules as LambdaLR multipliers."""

from __future__ import annotations

import math

import torch

from ...core.config.schema import OptimizerConfig


def lr_lambda(cfg: OptimizerConfig, total_steps: int):
    """Multiplier of the peak lr at optimizer step `step` (0-based): linear warm-up, then constant or
    cosine decay to `min_lr_ratio` at `total_steps`."""
    warmup = cfg.lr_warmup_steps

    def fn(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if cfg.lr_scheduler_type == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return fn


def build_optimizer(params, cfg: OptimizerConfig, total_steps: int):
    optimizer = torch.optim.AdamW(
        params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg, total_steps))
    return optimizer, scheduler
