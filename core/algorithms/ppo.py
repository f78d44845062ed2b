"""PPO with a learned critic (Schulman et al. 2017, arXiv:1707.06347), advantages by GAE
(Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
Estimation", arXiv:1506.02438).

The critic V is the policy's architecture with a scalar head; V_t is its value of the state before
response token t (the prompt and the response's first t tokens). With the token rewards r_t (the
task reward on the last token, less the KL penalty with use_kl_in_reward),

    delta_t = r_t + gamma * V_{t+1} - V_t          (V past the last token is 0)
    A_t = delta_t + gamma * lam * A_{t+1},         R_t = A_t + V_t,

the policy trains on A whitened over the batch's trained tokens (PPO's clipped surrogate, losses.py)
and the critic regresses onto the returns R with PPO's clipped value loss

    L_V = 1/2 * max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)    (c: critic.cliprange_value)

averaged over the trained tokens, V_old being the critic's values when the batch was scored.

`CriticPass` is the critic as a step pass (step_pass.py): a second model of the policy's strategy
(trainer.strategy), built with a value head from model.critic_model_path, its own optimizer
(critic.optim) and lr schedule. It scores the policy's micro-batches before the advantages
(`values`), trains on the returns written beside them (`returns`) before the policy steps, holds
the policy back for critic.critic_warmup steps, and keeps its state in a checkpoint's `critic/`.
"""

from __future__ import annotations

import torch

from ..batch import Batch
from .aggregation import LossNorm, aggregate
from .reinforce import whiten_tokens
from .scored import ScoredBatch
from .step_pass import PassContext, StepPass, StepRows


def gae(
    rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), both [N, T], of response-aligned token rewards and values (zero past
    each response's end, so the recursion starts from V = 0 there). With `mask`, the steps are the
    tokens it marks: a multi-turn response's context tokens (0 inside it) are passed over, so the
    model's last token of one turn bootstraps from its first token of the next; there A = R = 0."""
    rewards, values = rewards.double(), values.double()
    step = torch.ones_like(rewards, dtype=torch.bool) if mask is None else mask > 0
    adv = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype)
    next_value = torch.zeros_like(running)
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = torch.where(step[:, t], delta + gamma * lam * running, running)
        next_value = torch.where(step[:, t], values[:, t], next_value)
        adv[:, t] = running * step[:, t]
    return adv, (adv + values) * step


def _gae_of(batch: ScoredBatch) -> tuple[torch.Tensor, torch.Tensor]:
    mask = batch.need("response_mask", "gae")
    values = batch.need("values", "gae") * mask
    cfg = batch.cfg
    gamma, lam = (1.0, 1.0) if cfg is None else (cfg.gamma, cfg.lam)
    return gae(batch.token_rewards(), values, gamma, lam, mask)


def gae_advantages(batch: ScoredBatch, eps: float = 1e-6) -> torch.Tensor:
    """[N, T] GAE advantages whitened over the batch's trained tokens (module docstring)."""
    mask = batch.need("response_mask", "gae")
    adv, _ = _gae_of(batch)
    return whiten_tokens(adv, mask, eps).to(mask.dtype)


def value_targets(batch: ScoredBatch) -> torch.Tensor:
    """[N, T] the returns R = A + V the critic regresses onto (before A is whitened)."""
    mask = batch.need("response_mask", "gae")
    _, returns = _gae_of(batch)
    return (returns * mask).to(mask.dtype)


class ValueLoss:
    """The critic's clipped value loss on one micro-batch (the `LossFn` protocol of backends/base.py,
    fed the critic's values where a policy's loss is fed log-probs)."""

    needs_entropy = False
    needs_reference = False

    def __init__(self, cliprange_value: float, norm: LossNorm):
        self.clip, self.norm = cliprange_value, norm

    def __call__(
        self, values: torch.Tensor, entropy: torch.Tensor | None, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mask, old, returns = batch["loss_mask"], batch["values"], batch["returns"]
        clipped = old + (values - old).clamp(-self.clip, self.clip)
        unclipped_err, clipped_err = (values - returns).square(), (clipped - returns).square()
        loss = 0.5 * aggregate(torch.maximum(unclipped_err, clipped_err), mask, "token-mean", self.norm)
        metrics = torch.stack([
            loss.detach(),
            aggregate((clipped_err > unclipped_err).float(), mask, "token-mean", self.norm),
            aggregate(values.detach(), mask, "token-mean", self.norm),
        ]).tolist()  # fmt: skip
        return loss, dict(
            zip(("critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean"), metrics, strict=True)
        )


class CriticPass(StepPass):
    name = "critic"
    folder = "critic"

    def __init__(self, ctx: PassContext):
        super().__init__(ctx)
        cfg = ctx.cfg
        self.cfg = cfg.critic
        self.strategy = ctx.build_model(
            cfg.model.critic_model_path or ctx.model_path, cfg.critic.optim, value_head=True
        )

    def score(self, mbs: list[Batch], temperature: float) -> None:
        """Write the critic's values of every position into each micro-batch (`values`)."""
        for mb, values in zip(mbs, self.strategy.compute_values(mbs), strict=True):
            mb["values"] = values

    def before_advantages(self, batch: ScoredBatch, rows: StepRows) -> None:
        width = batch.need("response_mask", "ppo").shape[1]
        batch.values = rows.gather([mb["values"] for mb in rows.micro_batches()], width)

    def after_advantages(self, batch: ScoredBatch, rows: StepRows, metrics: dict[str, float]) -> None:
        returns = value_targets(batch)
        rows.place(returns, "returns")
        metrics["critic/returns_mean"] = float(
            returns.sum() / batch.need("response_mask", "ppo").sum().clamp(min=1)
        )

    def update(self, mbs: list[Batch], norm: LossNorm) -> dict[str, float]:
        """One optimizer step of the value loss on the micro-batches' `returns`."""
        metrics = self.strategy.forward_backward(mbs, ValueLoss(self.cfg.cliprange_value, norm), 1.0)
        metrics["critic/lr"] = self.strategy.current_lr()
        metrics["critic/grad_norm"] = self.strategy.optimizer_step()
        return metrics

    def holds_policy(self, step: int) -> bool:
        """During critic.critic_warmup the policy waits for the critic's values to mean something."""
        return step < self.cfg.critic_warmup

    def save(self, path: str) -> None:
        self.strategy.save_checkpoint(path)

    def load(self, path: str) -> None:
        self.strategy.load_checkpoint(path)
