"""The algorithm menu: what each RL algorithm computes, by name, without importing torch.

An algorithm is a preset (`AlgorithmSpec`): the advantage function, the policy loss, and the
knobs it sets when the config leaves them unset
(None). `algorithm.algorithm_type` picks a preset; `algorithm.advantage_fn` and
`algorithm.policy_loss_fn` replace its parts. The math lives in one file per family, each naming
its formula and paper: grpo.py (grpo, dr_grpo), rloo.py, reinforce.py (reinforce_plus_plus_baseline),
gspo.py; losses.py applies the policy loss, aggregation.py turns per-token values into one scalar,
kl.py holds the KL estimators and controllers, logprob.py the log-prob and entropy kernels.

Not on the menu yet (open issue): PPO with a critic and GAE, token-level REINFORCE++, DAPO's
dynamic sampling and overlong shaping, OPMD, mix, DPO, MaxEnt-GRPO.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..registry import Registry

ADVANTAGE_FNS = Registry(
    "algorithm.advantage_fn",
    {
        "grpo": "rlcore.core.algorithms.grpo:grpo_advantages",
        "dr_grpo": "rlcore.core.algorithms.grpo:dr_grpo_advantages",
        "rloo": "rlcore.core.algorithms.rloo:rloo_advantages",
        "reinforce_plus_plus_baseline": "rlcore.core.algorithms.reinforce:reinforce_plus_plus_baseline_advantages",
    },
)
"""Sequence-level advantage functions: (rewards [N], group ids) -> advantages [N]."""

GROUP_BASELINES = frozenset({"grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline"})
"""Advantage functions whose baseline is the other responses to the same task (repeat_times >= 2)."""

POLICY_LOSS_FNS = Registry(
    "algorithm.policy_loss_fn",
    {
        "ppo_clip": "rlcore.core.algorithms.losses:ppo_clip_terms",
        "gspo": "rlcore.core.algorithms.gspo:gspo_terms",
    },
)
"""Policy-gradient terms: (logprobs, old logprobs, advantages, mask, clip low, clip high) ->
(per-token loss, per-token clipped indicator), aggregated by algorithm.loss_agg_mode."""


@dataclass(frozen=True)
class AlgorithmSpec:
    advantage_fn: str | None
    """A name in ADVANTAGE_FNS (None: no advantages, e.g. SFT)."""
    policy_loss_fn: str | None
    """A name in POLICY_LOSS_FNS (None: not a policy-gradient algorithm)."""
    defaults: dict[str, Any] = field(default_factory=dict)
    """Values of algorithm.* knobs the config leaves unset (None)."""


_PPO_CLIP = {"loss_agg_mode": "token-mean", "clip_ratio_low": 0.2, "clip_ratio_high": 0.2}

ALGORITHMS: dict[str, AlgorithmSpec] = {
    "grpo": AlgorithmSpec("grpo", "ppo_clip", defaults=_PPO_CLIP),
    "dr_grpo": AlgorithmSpec(
        "dr_grpo", "ppo_clip", defaults={**_PPO_CLIP, "loss_agg_mode": "seq-mean-token-sum-norm"}
    ),
    "rloo": AlgorithmSpec("rloo", "ppo_clip", defaults=_PPO_CLIP),
    "reinforce_plus_plus_baseline": AlgorithmSpec(
        "reinforce_plus_plus_baseline", "ppo_clip", defaults=_PPO_CLIP
    ),
    # GSPO's paper clips the sequence ratio at 1 -/+ (3e-4, 4e-4) and averages tokens per sequence
    "gspo": AlgorithmSpec(
        "grpo", "gspo",
        defaults={"loss_agg_mode": "seq-mean-token-mean", "clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4},
    ),  # fmt: skip
    "sft": AlgorithmSpec(None, None, defaults={"loss_agg_mode": "token-mean", "clip_ratio_low": 0.2, "clip_ratio_high": 0.2}),
}


def with_preset(cfg: Any) -> Any:
    """`cfg` (AlgorithmConfig) with its unset knobs, advantage_fn and policy_loss_fn taken from the
    algorithm_type's preset (a copy; `cfg` itself is not changed)."""
    spec = ALGORITHMS[cfg.algorithm_type]
    filled = {k: v for k, v in spec.defaults.items() if getattr(cfg, k) is None}
    if cfg.advantage_fn is None:
        filled["advantage_fn"] = spec.advantage_fn
    if cfg.policy_loss_fn is None:
        filled["policy_loss_fn"] = spec.policy_loss_fn
    return dataclasses.replace(cfg, **filled)
