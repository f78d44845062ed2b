"""RL algorithms as pure tensor functions: advantages, KL estimators and controllers, loss
aggregation, and the loss callables the training strategies run on each micro-batch."""

from .advantages import grpo_advantages
from .aggregation import LOSS_AGG_MODES, LossNorm, aggregate, check_loss_agg_mode
from .kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    KLController,
    build_kl_controller,
    kl_estimate,
    kl_penalized_rewards,
)
from .logprob import entropy_from_logits, token_logprobs
from .losses import PolicyLoss, SFTLoss, build_loss

__all__ = [
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "AdaptiveKLController",
    "FixedKLController",
    "KLController",
    "LossNorm",
    "PolicyLoss",
    "SFTLoss",
    "aggregate",
    "build_kl_controller",
    "build_loss",
    "check_loss_agg_mode",
    "entropy_from_logits",
    "grpo_advantages",
    "kl_estimate",
    "kl_penalized_rewards",
    "token_logprobs",
]
