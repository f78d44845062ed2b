"""The `algorithm` section: the algorithm, its knobs and the optimizer."""

from __future__ import annotations

from dataclasses import dataclass, field

from .fields import bounded, choice


@dataclass
class OptimizerConfig:
    lr: float = bounded(1e-6, gt=0.0)
    """Peak learning rate."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    eps: float = bounded(1e-8, gt=0.0)
    """AdamW epsilon."""
    weight_decay: float = bounded(0.01, ge=0.0)
    """AdamW decoupled weight decay."""
    lr_scheduler_type: str = choice("constant", ("constant", "cosine"))
    """Schedule after warm-up: constant, or cosine decay to `min_lr_ratio * lr` at the last step."""
    lr_warmup_steps: int = bounded(0, ge=0)
    """Linear warm-up from 0 to `lr` over this many optimizer steps."""
    min_lr_ratio: float = bounded(0.0, ge=0.0, le=1.0)
    """Cosine floor as a fraction of `lr`."""


@dataclass
class KLControllerConfig:
    type: str = choice("fixed", ("fixed", "adaptive"))
    """fixed: the coefficient never changes; adaptive: proportional controller towards `target_kl`."""
    kl_coef: float = bounded(0.001, ge=0.0)
    """Initial coefficient of the KL penalty in the reward (used when algorithm.use_kl_in_reward)."""
    target_kl: float = bounded(0.1, gt=0.0)
    """Adaptive controller: the KL per sequence it steers towards."""
    horizon: int = bounded(10000, gt=0)
    """Adaptive controller: number of samples over which the coefficient adapts."""


@dataclass
class RolloutCorrectionConfig:
    """Weigh each trained token by how far the engine that sampled it (the behaviour policy, its
    log-probs travel with every experience) is from the trainer's policy before the update (the
    proximal policy: the recomputed old log-probs), r = pi_old / pi_engine
    (core/algorithms/correction.py)."""

    kind: str = choice("none", ("none", "tis", "mis"))
    """none; tis: truncated importance sampling, weight min(r, high); mis: masked importance
    sampling as verl's rejection sampling: where low <= r <= high the token weighs 1, else it leaves
    the loss (its policy, KL and entropy terms, and the counts the loss divides by)."""
    level: str = choice("token", ("token", "sequence", "geometric"))
    """Where r is taken: token (each token's own ratio), sequence (the product of the response's
    token ratios, one weight for all its tokens; mis keeps or rejects the whole response) or geometric
    (their geometric mean, exp(mean log r): a length-independent sequence ratio)."""
    high: float = bounded(2.0, gt=1.0)
    """The upper threshold C: tis truncates r at it, mis rejects r above it."""
    low: float | None = bounded(None, gt=0.0, lt=1.0)
    """mis: the lower threshold (unset: 1 / high)."""


@dataclass
class OpmdConfig:
    """algorithm.opmd: online policy mirror descent (core/algorithms/opmd.py)."""

    tau: float = bounded(1.0, gt=0.0)
    """The regulariser's strength: the loss is scaled by 1/(1 + tau), and the logavgexp baseline is
    tau * log(mean exp(r / tau))."""
    baseline: str = choice("mean", ("mean", "logavgexp"))
    """The group baseline: the mean reward, or the tau-softened maximum (logavgexp)."""


@dataclass
class MaxEntConfig:
    """algorithm.maxent_grpo: MaxEnt-GRPO's target distribution (core/algorithms/maxent.py)."""

    tau: float = bounded(0.3, gt=0.0)
    """The entropy temperature: the group's target is q^(1/(tau+beta)) pi_ref^(beta/(tau+beta)),
    beta = algorithm.kl_loss_coef; a smaller tau puts more weight on the best responses."""
    q_temperature: float = bounded(2.0, gt=0.0)
    """q = softmax(reward / q_temperature) over the group."""
    q_epsilon: float = bounded(1e-6, ge=0.0, lt=1.0)
    """q is mixed with this much of the uniform distribution (no candidate gets 0)."""
    length_normalize_ref: bool = True
    """The reference log-prob of a response is its per-token mean (false: its sum)."""


@dataclass
class MixConfig:
    """algorithm.mix: GRPO on the rollouts plus the expert rows' likelihood (core/algorithms/mix.py)."""

    mu: float = bounded(0.1, ge=0.0, le=1.0)
    """The weight of the expert rows' NLL; the policy loss on rollouts weighs 1 - mu."""
    expert_ratio: float = bounded(0.5, ge=0.0, lt=1.0)
    """The fraction of each train batch that is expert rows (Trinity-RFT's expert_data_ratio); they
    are added to the explored rollouts, ceil(r / (1 - r)) per rollout."""


@dataclass
class DpoConfig:
    """algorithm.dpo: direct preference optimisation on (chosen, rejected) pairs (core/algorithms/dpo.py)."""

    beta: float = bounded(0.1, gt=0.0)
    """How far from the reference the implicit reward lets the policy move (larger: less)."""
    label_smoothing: float = bounded(0.0, ge=0.0, lt=0.5)
    """Conservative DPO: the probability that a pair's preference label is flipped (0: plain DPO)."""
    nll_coef: float = bounded(0.0, ge=0.0)
    """Weight of the chosen responses' per-token NLL added to DPO's loss (RPO; 0: plain DPO)."""
    pairs: str = choice("taskset", ("taskset", "buffer"))
    """Where the (chosen, rejected) pairs come from: taskset (its rows' chosen and rejected columns)
    or buffer (a decoupled run: the mode-explore launch samples algorithm.repeat_times responses per
    task and writes the best and the worst by reward as a pair, a group whose rewards all tie gives
    none; the mode-train launch trains on them)."""
    nll_norm: str = choice("pair", ("pair", "batch_tokens"))
    """How the NLL term is normalised: pair (RPO's equation: each pair's chosen NLL over its own
    length, averaged over pairs) or batch_tokens (TRL's rpo_alpha: the chosen responses' summed NLL
    over all their tokens together)."""


@dataclass
class RewardModelConfig:
    """algorithm.reward_model: a Bradley-Terry reward model on (chosen, rejected) pairs
    (core/algorithms/reward_model.py); its export loads as AutoModelForSequenceClassification."""

    margin_key: str | None = None
    """The taskset column holding each pair's margin m (how much better the chosen response is; the
    loss is -log sigmoid(r_chosen - r_rejected - m), as Llama 2's); unset: no margin."""
    center_coef: float = bounded(0.0, ge=0.0)
    """Weight of the centring term mean((r_chosen + r_rejected)^2), which keeps the scores near 0
    (TRL's center_rewards_coefficient; 0: none)."""


@dataclass
class LengthPenaltyConfig:
    """algorithm.length_penalty: a reward term that makes a response shorter than the others to its
    task worth more (Kimi k1.5's length reward, core/algorithms/length.py); rollout/length_penalty."""

    kind: str = choice("none", ("none", "group", "correct"))
    """none; group (the paper's rule): lambda = 0.5 - (n - n_min) / (n_max - n_min) over the group's
    response lengths, a correct response gains coef * lambda, a wrong one coef * min(0, lambda);
    correct: only correct responses are shaped, lambda over the group's correct ones alone."""
    coef: float = bounded(0.1, gt=0.0)
    """The term's weight: the shortest response gains coef / 2, the longest loses coef / 2."""
    correct_reward: float = 1.0
    """A response is correct when its reward (before any shaping) is at least this."""


ALGORITHM_SECTIONS = ("opmd", "maxent_grpo", "mix", "dpo", "reward_model")
"""The sections of `algorithm` that one algorithm reads, each named after its algorithm_type
(core/algorithms sections_read says which a stage's algorithm reads; the config check refuses one
set where nothing reads it)."""


@dataclass
class AlgorithmConfig:
    algorithm_type: str = choice("grpo", "rlcore.core.algorithms:ALGORITHMS", by_path=True)
    """The algorithm's preset (core/algorithms/__init__.py): grpo, dr_grpo, rloo,
    reinforce_plus_plus_baseline and gspo (policy gradient with a group baseline), or sft
    (cross-entropy on the taskset's responses)... Or your own, by import path 'pkg.mod:NAME': an
    `Algorithm` (or a subclass of it, built with no arguments), with its step passes."""
    advantage_fn: str | None = choice(None, "rlcore.core.algorithms:ADVANTAGE_FNS", by_path=True)
    """Replaces the preset's advantage function: grpo, dr_grpo, rloo, reinforce_plus_plus_baseline...,
    or your own by import path 'pkg.mod:fn': fn(batch: ScoredBatch) -> [N] (one advantage per
    response) or [N, T] (per response token) tensor; checked on a small batch at validate time."""
    policy_loss_fn: str | None = choice(None, "rlcore.core.algorithms:POLICY_LOSS_FNS", by_path=True)
    """Replaces the preset's policy loss: ppo_clip (token ratios) or gspo (sequence ratios)..., or
    your own by import path 'pkg.mod:fn': fn(logprobs, old_logprobs, advantages, mask, cfg) ->
    (per-token loss, per-token clipped indicator), [B, T] each, aggregated by loss_agg_mode;
    checked on a small batch at validate time."""
    repeat_times: int = bounded(8, ge=1)
    """Responses sampled per task (the GRPO group size)."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    kl_loss_fn: str = choice("k3", ("none", "k1", "abs", "k2", "mse", "k3", "low_var_kl"))
    """KL estimator used as a loss term against the reference model ('none' disables it)."""
    kl_loss_coef: float = bounded(0.001, ge=0.0)
    """Weight of the KL loss term."""
    use_kl_in_reward: bool | None = None
    """Subtract `kl_ctrl.kl_coef * KL` (estimator `kl_penalty_fn`) from the token-level reward;
    unset: the preset's (reinforce_plus_plus: true, the others false)."""
    gamma: float = bounded(1.0, ge=0.0, le=1.0)
    """Discount of later token rewards in a token's return (reinforce_plus_plus, ppo's GAE; 1.0: none)."""
    lam: float = bounded(1.0, ge=0.0, le=1.0)
    """GAE's lambda (ppo): 1.0 takes the whole discounted return less the value, 0.0 one TD step."""
    kl_penalty_fn: str = choice("k1", ("k1", "abs", "k2", "mse", "k3", "low_var_kl"))
    """KL estimator used for the reward penalty."""
    kl_ctrl: KLControllerConfig = field(default_factory=KLControllerConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """Rollout-training mismatch correction: truncated or masked importance weights of the engine's
    log-probs against the trainer's (needs do_old_log_prob_compute); metrics rollout_correction/*."""
    router_replay: str = choice("none", ("none", "r2", "r3"))
    """MoE models: r3 (rollout routing replay, arXiv 2510.11370) has the engine record the experts it
    routed each token to, and the trainer's forwards route the same tokens to the same experts (the
    router still trains, through their probabilities), closing the engine/trainer log-prob gap that
    routing differences open (the HF engine; single_turn, multi_turn and tool_call workflows); r2 (routing replay, as GSPO's
    authors and verl name it) records the routing of the trainer's own old-log-prob pass and replays
    it in the update's forwards, so every mini-batch of a step routes as the policy that computed its
    old log-probs did (any engine and workflow; needs the recomputed old log-probs); none: the
    trainer routes by itself. fsdp, fsdp2, or megatron without pipeline, context or tensor parallelism."""
    entropy_coef: float = bounded(0.0, ge=0.0)
    """Weight of the entropy bonus (subtracted from the loss)."""
    clip_ratio_low: float | None = bounded(None, ge=0.0, lt=1.0)
    """The ratio is clipped below at 1 - clip_ratio_low (unset: the preset's, 0.2; gspo 3e-4)."""
    clip_ratio_high: float | None = bounded(None, ge=0.0)
    """The ratio is clipped above at 1 + clip_ratio_high (unset: the preset's, 0.2; gspo 4e-4)."""
    clip_ratio_c: float | None = bounded(None, gt=1.0)
    """Dual-clip PPO (Ye et al. 2020): a token with a negative advantage loses at most
    clip_ratio_c * |A| however large its ratio grows (unset: no second clip; 3.0 is usual)."""
    loss_agg_mode: str | None = choice(
        None, ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
    )
    """How per-token losses become one scalar (over the whole train batch, across ranks); unset: the
    preset's (token-mean; dr_grpo seq-mean-token-sum-norm; gspo seq-mean-token-mean)."""
    do_old_log_prob_compute: bool | None = None
    """The log-probs the policy ratio divides by: recomputed by the trainer before the update (True),
    or the engine's, those of the weights that generated the experience (False: the behaviour
    policy, which corrects for experiences generated by older weights). Unset: True, except in a
    decoupled run (mode train on the experience buffer), where experiences are older by design."""
    sample_strategy: str = choice("default", ("default", "staleness_control"))
    """What a trainer on the experience buffer (mode train, asynchronous both) does with the groups
    it takes: default trains on all of them, whatever their age (rollout/staleness_mean and
    staleness_max show it; a task left running by over-rollout or a replayed group may be older
    than synchronizer.max_staleness); staleness_control leaves out experiences more than
    synchronizer.max_staleness versions older than the weights being trained (rollout/stale_dropped)."""
    sync_ref_model: bool = False
    """Move the reference model towards the policy every ref_model_sync_steps optimizer steps:
    pi_ref <- alpha * pi_theta + (1 - alpha) * pi_ref (the reference then lives in checkpoints)."""
    ref_model_mixup_alpha: float = bounded(0.6, gt=0.0, le=1.0)
    """The policy's share alpha in the reference after a sync (1.0: the reference becomes the policy)."""
    ref_model_sync_steps: int = bounded(512, ge=1)
    """Optimizer steps between reference syncs."""
    opmd: OpmdConfig = field(default_factory=OpmdConfig)
    """OPMD's knobs (read where algorithm_type is opmd, or advantage_fn / policy_loss_fn opmd)."""
    maxent_grpo: MaxEntConfig = field(default_factory=MaxEntConfig)
    """MaxEnt-GRPO's knobs (read where algorithm_type, or advantage_fn, is maxent_grpo)."""
    mix: MixConfig = field(default_factory=MixConfig)
    """mix's knobs (read where algorithm_type is mix: a step also trains on expert rows)."""
    distill_coef: float | None = bounded(None, ge=0.0)
    """On-policy distillation's weight: each token's advantage gains -distill_coef x (log pi_student
    - log pi_teacher), the teacher being model.teacher_model_path (core/algorithms/distill.py); unset:
    the preset's (on_policy_distill 1, the others 0: no teacher)."""
    dpo: DpoConfig = field(default_factory=DpoConfig)
    """DPO's knobs (read where algorithm_type is dpo: the step trains on pairs)."""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """A reward model's knobs (read where algorithm_type is reward_model)."""
    length_penalty: LengthPenaltyConfig = field(default_factory=LengthPenaltyConfig)
    overlong_filter: bool | None = None
    """Leave responses the token budget cut off (finish reason 'length') out of the loss (DAPO);
    unset: the preset's (dapo: true, the others false)."""
    overlong_buffer_len: int = bounded(0, ge=0)
    """DAPO's soft overlong punishment: a response longer than max_tokens - overlong_buffer_len
    loses overlong_penalty_factor * (its excess / overlong_buffer_len) of reward (0: off)."""
    overlong_penalty_factor: float = bounded(1.0, ge=0.0)
    """The reward a response at the full token budget loses to the soft overlong punishment."""
    dynamic_sampling: bool | None = None
    """DAPO's dynamic sampling: groups whose responses all got the same reward teach nothing and
    are dropped; more tasks are explored until the step has buffer.batch_size groups again (or
    dynamic_sampling_max_rounds extra rounds ran). Unset: the preset's (dapo: true)."""
    dynamic_sampling_max_rounds: int = bounded(4, ge=1)
    """Extra explore rounds one step may run to refill its dropped groups."""
