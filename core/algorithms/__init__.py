"""The algorithm menu: what each RL algorithm computes, by name, without importing torch.

An algorithm (`Algorithm`) is a preset and its hooks: the advantage function, the policy loss, the
knobs it sets when the config leaves them unset (None), what its steps train on, the step passes it
runs beside the policy (step_pass.py: PPO's critic, mix's expert rows; STEP_PASSES), and how a step
refills the groups that teach nothing (`refill`). The loop and the trainer call these hooks and
never name an algorithm: a new algorithm with a new pass is its pass's file, a line here and its
config fields.
`algorithm.algorithm_type` picks a preset; `algorithm.advantage_fn` and `algorithm.policy_loss_fn`
replace its parts. The math lives in one file per family, each naming its formula and paper:
grpo.py (grpo, dr_grpo), rloo.py, reinforce.py (reinforce_plus_plus and its group-baseline form),
gspo.py, opmd.py, maxent.py (maxent_grpo), ppo.py (GAE and the critic's value loss), dpo.py, mix.py; losses.py applies the policy loss (PPO's clip, dual-clip),
aggregation.py turns per-token values into one scalar, kl.py holds the KL estimators and
controllers, logprob.py the log-prob and entropy kernels, scored.py what an advantage function sees.
DAPO is GRPO's advantage with clip-higher, token-level loss, overlong filtering and soft overlong
punishment (runtime/scoring.py) and dynamic sampling (runtime/loop.py).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..registry import Registry, import_path

ADVANTAGE_FNS = Registry(
    "algorithm.advantage_fn",
    {
        "grpo": "rlcore.core.algorithms.grpo:grpo_advantages",
        "dr_grpo": "rlcore.core.algorithms.grpo:dr_grpo_advantages",
        "rloo": "rlcore.core.algorithms.rloo:rloo_advantages",
        "reinforce_plus_plus": "rlcore.core.algorithms.reinforce:reinforce_plus_plus_advantages",
        "reinforce_plus_plus_baseline": "rlcore.core.algorithms.reinforce:reinforce_plus_plus_baseline_advantages",
        "reinforce_plus_plus_baseline_per_response": (
            "rlcore.core.algorithms.reinforce:reinforce_plus_plus_baseline_per_response_advantages"
        ),
        "opmd": "rlcore.core.algorithms.opmd:opmd_advantages",
        "maxent_grpo": "rlcore.core.algorithms.maxent:maxent_advantages",
        "gae": "rlcore.core.algorithms.ppo:gae_advantages",
        "zero": "rlcore.core.algorithms.distill:zero_advantages",
    },
)
"""fn(batch: scored.ScoredBatch) -> advantages, [N] (one per response) or [N, T] (one per token)."""

GROUP_BASELINES = frozenset(
    {
        "grpo",
        "dr_grpo",
        "rloo",
        "reinforce_plus_plus_baseline",
        "reinforce_plus_plus_baseline_per_response",
        "opmd",
        "maxent_grpo",
    }
)
"""Advantage functions whose baseline is the other responses to the same task (repeat_times >= 2)."""

POLICY_LOSS_FNS = Registry(
    "algorithm.policy_loss_fn",
    {
        "ppo_clip": "rlcore.core.algorithms.losses:ppo_clip_terms",
        "gspo": "rlcore.core.algorithms.gspo:gspo_terms",
        "opmd": "rlcore.core.algorithms.opmd:opmd_terms",
        "weighted_likelihood": "rlcore.core.algorithms.maxent:weighted_likelihood_terms",
        "importance_sampling": "rlcore.core.algorithms.importance:importance_sampling_terms",
        "cispo": "rlcore.core.algorithms.importance:cispo_terms",
    },
)
"""Policy-gradient terms: (logprobs, old logprobs, advantages, mask, algorithm config) ->
(per-token loss, per-token clipped indicator), aggregated by algorithm.loss_agg_mode."""


STEP_PASSES = Registry(
    "algorithm passes",
    {
        "critic": "rlcore.core.algorithms.ppo:CriticPass",
        "experts": "rlcore.core.algorithms.mix:ExpertPass",
        "teacher": "rlcore.core.algorithms.distill:TeacherPass",
    },
)
"""Step passes by name (step_pass.py): a model or data a step runs beside the policy."""


@dataclass(frozen=True)
class Algorithm:
    advantage_fn: str | None
    """A name in ADVANTAGE_FNS (None: no advantages, e.g. SFT)."""
    policy_loss_fn: str | None
    """A name in POLICY_LOSS_FNS (None: not a policy-gradient algorithm)."""
    defaults: dict[str, Any] = field(default_factory=dict)
    """Values of algorithm.* knobs the config leaves unset (None)."""
    reference_in_advantage: bool = False
    """Whether the advantage reads the reference model's log-probs (when kl_loss_coef > 0); the
    KL loss and KL-in-reward ask for that pass by themselves."""
    passes: tuple[str, ...] = ()
    """The step passes a step runs beside the policy, by name in STEP_PASSES (critic: a value model,
    config section `critic`; experts: buffer.expert_taskset's rows in the same step) or by import
    path 'pkg.mod:Class' (a StepPass subclass)."""
    data: str = "rollouts"
    """What a step trains on: rollouts (explored and scored, mode both or colocate), or the
    taskset's own rows in mode train: responses (SFT) or preference pairs (DPO, reward_model)."""
    model: str = "policy"
    """What the stage trains: policy (a causal LM), or reward (a reward model: the policy's trunk
    with a scalar head, on pairs, reward_model.py); a reward model's export feeds no later stage's
    policy."""

    def refills(self, cfg: Any) -> bool:
        """Whether a lock-step replaces the groups that teach nothing (`cfg`: AlgorithmConfig, preset
        filled): DAPO's dynamic sampling, algorithm.dynamic_sampling."""
        return bool(cfg.dynamic_sampling)

    def refill(
        self, cfg: Any, exps: list[Any], want: int, explore_round: Callable[[int], list[Any]],
        metrics: dict[str, float],
    ) -> list[Any]:  # fmt: skip
        """A lock-step's experiences once the groups that teach nothing are replaced (when
        `refills`): `want` groups, from extra `explore_round(r)` rounds as needed (dapo.py)."""
        from .dapo import dynamic_sampling

        return dynamic_sampling(exps, want, cfg.dynamic_sampling_max_rounds, explore_round, metrics)


_OFF = {"use_kl_in_reward": False, "overlong_filter": False, "dynamic_sampling": False, "distill_coef": 0.0}
_PPO_CLIP = {**_OFF, "loss_agg_mode": "token-mean", "clip_ratio_low": 0.2, "clip_ratio_high": 0.2}

ALGORITHMS: dict[str, Algorithm] = {
    "grpo": Algorithm("grpo", "ppo_clip", defaults=_PPO_CLIP),
    "dr_grpo": Algorithm(
        "dr_grpo", "ppo_clip", defaults={**_PPO_CLIP, "loss_agg_mode": "seq-mean-token-sum-norm"}
    ),
    "rloo": Algorithm("rloo", "ppo_clip", defaults=_PPO_CLIP),
    # PPO as RLHF runs it (Ouyang et al. 2022): a critic's values, GAE, the KL in the token reward
    "ppo": Algorithm("gae", "ppo_clip", defaults={**_PPO_CLIP, "use_kl_in_reward": True}, passes=("critic",)),
    # REINFORCE++: the KL to the reference model is part of each token's reward
    "reinforce_plus_plus": Algorithm(
        "reinforce_plus_plus", "ppo_clip", defaults={**_PPO_CLIP, "use_kl_in_reward": True}
    ),
    "reinforce_plus_plus_baseline": Algorithm("reinforce_plus_plus_baseline", "ppo_clip", defaults=_PPO_CLIP),
    # GSPO's paper clips the sequence ratio at 1 -/+ (3e-4, 4e-4) and averages tokens per sequence
    "gspo": Algorithm(
        "grpo",
        "gspo",
        defaults={
            **_OFF,
            "loss_agg_mode": "seq-mean-token-mean",
            "clip_ratio_low": 3e-4,
            "clip_ratio_high": 4e-4,
        },
    ),  # fmt: skip
    # DAPO (Yu et al. 2025, arXiv:2503.14476): clip-higher (0.2, 0.28), token-level loss, truncated
    # responses out of the loss, groups that teach nothing replaced by fresh ones
    "dapo": Algorithm(
        "grpo",
        "ppo_clip",
        defaults={**_PPO_CLIP, "clip_ratio_high": 0.28, "overlong_filter": True, "dynamic_sampling": True},
    ),  # fmt: skip
    "opmd": Algorithm("opmd", "opmd", defaults={**_PPO_CLIP}),
    # the repository's weighted likelihood is length-normalised per response, then summed per group
    "maxent_grpo": Algorithm(
        "maxent_grpo",
        "weighted_likelihood",
        defaults={**_PPO_CLIP, "loss_agg_mode": "seq-mean-token-mean"},
        reference_in_advantage=True,
    ),  # fmt: skip
    # on-policy distillation (distill.py): no reward advantage, the teacher's reverse KL per token
    "on_policy_distill": Algorithm("zero", "ppo_clip", defaults={**_PPO_CLIP, "distill_coef": 1.0}),
    # Trinity-RFT's mix: GRPO on the rollouts plus the expert rows' likelihood in the same step
    "mix": Algorithm("grpo", "ppo_clip", defaults=_PPO_CLIP, passes=("experts",)),
    "sft": Algorithm(None, None, defaults=_PPO_CLIP, data="responses"),
    # DPO reads the reference model by definition (dpo.py), whatever kl_loss_coef says
    "dpo": Algorithm(None, None, defaults=_PPO_CLIP, data="pairs"),
    # a Bradley-Terry reward model on the same pairs (reward_model.py)
    "reward_model": Algorithm(None, None, defaults=_PPO_CLIP, data="pairs", model="reward"),
}


def with_preset(cfg: Any) -> Any:
    """`cfg` (AlgorithmConfig) with its unset knobs, advantage_fn and policy_loss_fn taken from the
    algorithm_type's preset (a copy; `cfg` itself is not changed)."""
    spec = algorithm_of(cfg)
    filled = {k: v for k, v in spec.defaults.items() if getattr(cfg, k) is None}
    if cfg.advantage_fn is None:
        filled["advantage_fn"] = spec.advantage_fn
    if cfg.policy_loss_fn is None:
        filled["policy_loss_fn"] = spec.policy_loss_fn
    return dataclasses.replace(cfg, **filled)


def kl_in_loss(cfg: Any) -> bool:
    """Whether the policy loss has a KL term against the reference model."""
    return trains_on(cfg) == "rollouts" and cfg.kl_loss_fn != "none" and cfg.kl_loss_coef > 0


def algorithm_of(cfg: Any) -> Algorithm:
    """The algorithm `cfg` (AlgorithmConfig) names by algorithm.algorithm_type: a preset, or your own
    by import path (ValueError in one line when it does not name an Algorithm)."""
    name = cfg.algorithm_type
    return ALGORITHMS[name] if name in ALGORITHMS else _algorithm_at(name)


@functools.cache
def _algorithm_at(path: str) -> Algorithm:
    found = import_path(path, what="algorithm.algorithm_type")
    if isinstance(found, type) and issubclass(found, Algorithm):
        try:
            found = found()  # type: ignore[call-arg]  # a subclass whose fields all have defaults
        except TypeError as e:
            raise ValueError(
                f"algorithm.algorithm_type '{path}': cannot build it with no arguments ({e})"
            ) from None
    if not isinstance(found, Algorithm):
        raise ValueError(
            f"algorithm.algorithm_type '{path}' is not an Algorithm (got {found!r}); give one, e.g. "
            "Algorithm('grpo', 'ppo_clip', defaults={...}, passes=(...)) from rlcore.core.algorithms"
        )
    return found


def advantage_fn_of(name: str) -> Callable[..., Any]:
    """The advantage function algorithm.advantage_fn names: registered, or by import path."""
    return (
        ADVANTAGE_FNS.resolve(name)
        if name in ADVANTAGE_FNS
        else import_path(name, what="algorithm.advantage_fn")
    )  # type: ignore[no-any-return]


def policy_terms_of(name: str) -> Callable[..., Any]:
    """The policy-gradient terms algorithm.policy_loss_fn names: registered, or by import path."""
    if name in POLICY_LOSS_FNS:
        return POLICY_LOSS_FNS.resolve(name)  # type: ignore[no-any-return]
    return import_path(name, what="algorithm.policy_loss_fn")  # type: ignore[no-any-return]


def step_passes(cfg: Any) -> tuple[str, ...]:
    """The step passes a step of `cfg`'s algorithm runs beside the policy (Algorithm.passes), with
    the teacher when algorithm.distill_coef (preset filled) adds on-policy distillation."""
    passes = algorithm_of(cfg).passes
    if distills(cfg) and "teacher" not in passes:
        passes = (*passes, "teacher")
    return passes


def distills(cfg: Any) -> bool:
    """Whether a step scores its tokens with a teacher (algorithm.distill_coef > 0, preset filled)."""
    coef = with_preset(cfg).distill_coef
    return bool(coef) and trains_on(cfg) == "rollouts"


def trains_on_experts(cfg: Any) -> bool:
    """Whether each step also trains on expert demonstrations (mix)."""
    return "experts" in step_passes(cfg)


def trains_on(cfg: Any) -> str:
    """rollouts, responses or pairs (Algorithm.data)."""
    return algorithm_of(cfg).data


def trains_reward_model(cfg: Any) -> bool:
    """Whether the stage trains a reward model (Algorithm.model reward), not a policy."""
    return algorithm_of(cfg).model == "reward"


def pairs_from_buffer(cfg: Any) -> bool:
    """Whether DPO trains on the pairs an explorer forms from its groups (algorithm.dpo.pairs: buffer):
    the taskset's rows are then prompts to explore, as an RL algorithm's are."""
    return trains_on(cfg) == "pairs" and not trains_reward_model(cfg) and cfg.dpo.pairs == "buffer"


def reference_in_advantage(cfg: Any) -> bool:
    """Whether the advantage reads the reference model's log-probs (maxent_grpo with beta > 0)."""
    return algorithm_of(cfg).reference_in_advantage and cfg.kl_loss_coef > 0


def trains_critic(cfg: Any) -> bool:
    """Whether the stage trains a value model beside the policy."""
    return "critic" in step_passes(cfg)


def reads_reference(cfg: Any) -> bool:
    """Whether anything reads the reference model: DPO, the KL loss, the KL in the reward, or the
    advantage (`cfg` preset filled, see with_preset)."""
    data = trains_on(cfg)
    return (data == "pairs" and not trains_reward_model(cfg)) or (
        data == "rollouts" and (kl_in_loss(cfg) or bool(cfg.use_kl_in_reward) or reference_in_advantage(cfg))
    )


SECTION_READERS: dict[str, tuple[str, ...]] = {
    "opmd": ("advantage_fn opmd", "policy_loss_fn opmd"),
    "maxent_grpo": ("advantage_fn maxent_grpo",),
    "mix": ("the experts pass",),
    "dpo": ("training a policy on pairs",),
    "reward_model": ("training a reward model",),
    "length_penalty": ("an advantage of rollouts' rewards",),
}
"""The sections of `algorithm` that only some algorithms read, and what reads each: one per
algorithm (schema ALGORITHM_SECTIONS, named after its algorithm_type) and the length term, which
shapes explored rewards (core/config/section_checks.py refuses one set where nothing reads it)."""


def sections_read(cfg: Any) -> frozenset[str] | None:
    """The sections of SECTION_READERS that `cfg` (AlgorithmConfig) reads, or None where a part of
    the algorithm is your own (by import path), which may read any of them."""
    spec, filled = algorithm_of(cfg), with_preset(cfg)
    fns = (filled.advantage_fn, filled.policy_loss_fn)
    if cfg.algorithm_type not in ALGORITHMS or any(f is not None and ":" in f for f in fns):
        return None
    parts = {f"advantage_fn {filled.advantage_fn}", f"policy_loss_fn {filled.policy_loss_fn}"}
    parts |= {f"the {name} pass" for name in step_passes(cfg)}
    parts.add("training a reward model" if spec.model == "reward" else f"training a {spec.model} on {spec.data}")
    if spec.data == "rollouts" and filled.advantage_fn != "zero":  # on_policy_distill's reads no reward
        parts.add("an advantage of rollouts' rewards")
    return frozenset(s for s, readers in SECTION_READERS.items() if parts & set(readers))
