"""When the trainer's weights reach the engines, which experiences are too stale, and whether a
sync arrived intact (pure bookkeeping; the loop in rlcore.runtime.loop acts on it).

    sync_style fixed            after every sync_interval-th optimizer step (after sync_offset)
    sync_style trainer_driven   after every optimizer step: the engines never lag
    sync_style explorer_driven  just before a rollout whose weights would be staler than
                                max_staleness (default 0): the fewest syncs
    probe                       after a sync, the engines' greedy log-probs on a fixed prompt must
                                match the trainer's log-probs of the same tokens

A policy version is the stage's optimizer step whose weights the engines serve, so staleness =
the step being trained - the version that generated an experience.
"""

from __future__ import annotations

import logging

import torch

from ..core.config import RLCoreConfig
from ..core.config.dtypes import engine_dtype, trainer_dtype
from ..core.config.schema import SynchronizerConfig
from ..core.types import Experience
from .wire import WeightSyncError

log = logging.getLogger("rlcore.synchronizer")

PROBE_TOLERANCE = {"float32": 1e-3, "bfloat16": 5e-2, "float16": 5e-2}
"""Mean |engine - trainer| greedy log-prob accepted by the probe when probe_tolerance is 0."""


def judge_probe(
    answers: list[tuple[str, list[int], list[float]]],
    trainer: list[list[float]],
    version: int,
    tolerance: float,
) -> dict[str, float]:
    """Compare each engine's greedy log-probs (engine name, tokens, log-probs) with the trainer's
    log-probs of the same tokens; raises WeightSyncError when an engine's mean difference exceeds
    `tolerance`, else returns the probe's metrics."""
    worst = 0.0
    for (engine, tokens, engine_lp), ours in zip(answers, trainer, strict=True):
        diff = (torch.tensor(ours) - torch.tensor(engine_lp)).abs()
        mean = float(diff.mean()) if len(tokens) else 0.0
        worst = max(worst, mean)
        if mean > tolerance:
            raise WeightSyncError(
                f"probe after the sync of version {version}: engine {engine}'s greedy log-probs differ from "
                f"the trainer's by {mean:.3g} on average (max {float(diff.max()):.3g}) over {len(tokens)} "
                f"tokens; tolerance {tolerance:g} (synchronizer.probe_tolerance): the engine does not hold "
                f"the trainer's weights"
            )
    return {"sync/probe_logprob_diff": worst, "sync/probe_engines": float(len(answers))}


def probe_tolerance(cfg: RLCoreConfig, device: str) -> float:
    """synchronizer.probe_tolerance, or the default for the coarser of the trainer's and the engines'
    dtypes (PROBE_TOLERANCE)."""
    dtypes = (trainer_dtype(cfg, device), engine_dtype(cfg, device))
    return cfg.synchronizer.probe_tolerance or max(PROBE_TOLERANCE[d] for d in dtypes)


class SyncSchedule:
    """When the engines get new weights, and which experiences are too stale to train on: bookkeeping
    over the stage's optimizer step and the step whose weights the engines serve (their policy
    version)."""

    def __init__(self, sc: SynchronizerConfig):
        self.sc = sc
        self.max_staleness = sc.max_staleness

    def due_after_step(self, step: int, version: int) -> bool:
        """Sync now that an optimizer step finished? (fixed and trainer_driven styles)"""
        if step < self.sc.sync_offset or step == version:
            return False
        if self.sc.sync_style == "fixed":
            return step - version >= self.sc.sync_interval
        return self.sc.sync_style == "trainer_driven"

    def due_before_explore(self, step: int, version: int) -> bool:
        """Sync before generating? (explorer_driven: only when the engines are too stale)"""
        if self.sc.sync_style != "explorer_driven":
            return False
        return step >= self.sc.sync_offset and step - version > (self.max_staleness or 0)

    def oldest_for_explore(self, explore_step: int, updates_per_step: int) -> int:
        """The oldest version an explorer on the buffer may explore `explore_step` with (0: any):
        what it explores is trained on from optimizer step explore_step x `updates_per_step` on, and
        must be within max_staleness versions of that step, as `drop_stale` counts."""
        if self.max_staleness is None:
            return 0
        return max(0, explore_step * updates_per_step - self.max_staleness)

    def drop_stale(
        self, exps: list[Experience], versions: list[int], step: int, metrics: dict[str, float],
        enforce: bool = True,
    ) -> list[Experience]:  # fmt: skip
        """Experiences whose generating version (`versions`, one each) is within max_staleness of
        `step`, the step about to be trained; counts the rest in metrics. `enforce` false: all of
        them, the staleness only measured (a trainer on the experience buffer without
        algorithm.sample_strategy staleness_control)."""
        staleness = [step - v for v in versions]
        if exps:
            metrics["rollout/staleness_mean"] = sum(staleness) / len(exps)
        if self.max_staleness is None or not enforce:
            return exps
        kept = [e for e, s in zip(exps, staleness, strict=True) if s <= self.max_staleness]
        metrics["rollout/stale_dropped"] = float(len(exps) - len(kept))
        if len(kept) < len(exps):
            log.warning(
                "dropped %d of %d experiences older than %d version(s) (synchronizer.max_staleness) at step %d",
                len(exps) - len(kept), len(exps), self.max_staleness, step,
            )  # fmt: skip
        return kept
