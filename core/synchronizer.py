"""When and how the trainer's weights reach the engines, and whether they arrived intact.

    sync_style fixed            after every sync_interval-th optimizer step (after sync_offset)
    sync_style trainer_driven   after every optimizer step: the engines never lag
    sync_style explorer_driven  just before a rollout whose weights would be staler than
                                max_staleness (default 0): the fewest syncs
    sync_method nccl|memory     the explorer's transport (process group to the workers, or an
                                in-process copy); checkpoint: rank 0 writes an HF folder the
                                workers load
    probe                       after a sync, the engines' greedy log-probs on a fixed prompt must
                                match the trainer's log-probs of the same tokens

Every rank of the trainer world runs these methods (walking the weights is collective); rank 0
holds the explorer (with an engine in every rank, explorer.engine_in_every_rank: each rank loads
and probes its own). The experiences' policy versions are optimizer steps of the stage, so
staleness = the step being trained - the version that generated it. SyncSchedule (when, and what
is too stale) is shared with the trainer.remote loop (core/remote_loop.py).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from .batch import Sequence, micro_batches
from .config import RLCoreConfig
from .config.schema import SynchronizerConfig
from .hf_export import export_hf
from .types import Experience
from .watchdog import deadline
from .weight_sync import WeightSyncError, spec_of

if TYPE_CHECKING:
    from ..backends.base import TrainingStrategy
    from .explorer import Explorer

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
    """synchronizer.probe_tolerance, or the default for the trainer's dtype (PROBE_TOLERANCE)."""
    dtype = cfg.model.dtype if cfg.model.dtype != "auto" else ("bfloat16" if device == "cuda" else "float32")
    return cfg.synchronizer.probe_tolerance or PROBE_TOLERANCE[dtype]


class SyncSchedule:
    """When the engines get new weights, and which experiences are too stale to train on: bookkeeping
    over the stage's optimizer step and the step whose weights the engines serve (their policy
    version), shared by the in-process loop and the remote one (core/remote_loop.py)."""

    def __init__(self, sc: SynchronizerConfig, rank: int = 0):
        self.sc, self.rank = sc, rank
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

    def drop_stale(
        self, exps: list[Experience], versions: list[int], step: int, metrics: dict[str, float]
    ) -> list[Experience]:
        """Experiences whose generating version (`versions`, one each) is within max_staleness of
        `step`, the step about to be trained; counts the rest in metrics."""
        staleness = [step - v for v in versions]
        if exps:
            metrics["rollout/staleness_mean"] = sum(staleness) / len(exps)
        if self.max_staleness is None:
            return exps
        kept = [e for e, s in zip(exps, staleness, strict=True) if s <= self.max_staleness]
        metrics["rollout/stale_dropped"] = float(len(exps) - len(kept))
        if len(kept) < len(exps) and self.rank == 0:
            log.warning(
                "dropped %d of %d experiences older than %d version(s) (synchronizer.max_staleness) at step %d",
                len(exps) - len(kept), len(exps), self.max_staleness, step,
            )  # fmt: skip
        return kept


class Synchronizer:
    def __init__(
        self,
        cfg: RLCoreConfig,
        strategy: TrainingStrategy,
        explorer: Explorer | None,
        stage_dir: str,
        model_path: str,
        probe_prompt: list[int],
        pad_token_id: int,
        device: str,
        engine_per_rank: bool = False,
    ):
        self.cfg, self.sc = cfg, cfg.synchronizer
        self.strategy, self.explorer = strategy, explorer
        self.stage_dir, self.model_path = stage_dir, model_path
        self.probe_prompt, self.pad_token_id = probe_prompt, pad_token_id
        self.tolerance = probe_tolerance(cfg, device)
        self.rank = dist.get_rank()
        self.engine_per_rank = engine_per_rank
        method = self.sc.sync_method
        self.method = ("memory" if cfg.mode == "colocate" else "nccl") if method == "auto" else method
        self.schedule = SyncSchedule(self.sc, self.rank)

    # ------------------------------------------------------------------ how

    def sync(self, version: int) -> dict[str, float]:
        """Push the current weights to every engine as `version` (the global step); returns metrics."""
        start = time.perf_counter()
        stats: dict[str, float] = {}
        with deadline(self.sc.sync_timeout, "a weight sync", "synchronizer.sync_timeout"):
            if self.method == "checkpoint":
                stats = self._sync_checkpoint(version)
            else:
                weights = self.strategy.iter_full_weights()
                if self.explorer is not None:
                    specs = [spec_of(*s) for s in self.strategy.weight_specs()]
                    stats = self.explorer.load_weights(specs, weights, version)
                else:
                    for _ in weights:  # collective: every rank walks the iterator
                        pass
        metrics = {"perf/sync_s": time.perf_counter() - start}
        if "num_bytes" in stats:
            metrics["perf/sync_gb_per_s"] = stats["num_bytes"] / 1e9 / max(stats["total_s"], 1e-9)
        if self.sc.probe:
            metrics.update(self.probe(version))
        return metrics

    def _sync_checkpoint(self, version: int) -> dict[str, float]:
        path = self.export_for_workers(version)
        stats: dict[str, float] = {}
        if self.explorer is not None:
            stats = self.explorer.load_checkpoint(path, version)
            self.prune_exports(keep=path)  # the workers hold this version now: older folders can go
        return stats

    def export_for_workers(self, version: int) -> str:
        """Write the current weights as an HF folder for rollout workers to load (sync_method
        checkpoint); collective, rank 0 writes. Returns the folder."""
        path = os.path.join(self.stage_dir, "weight_sync", f"version_{version}")
        if self.rank == 0:
            os.makedirs(path, exist_ok=True)
        export_hf(
            self.strategy.iter_full_weights(), path, self.strategy.hf_config(), self.model_path,
            write=self.rank == 0,
        )  # fmt: skip
        dist.barrier()
        return path

    def prune_exports(self, keep: str) -> None:
        """Remove every exported version but `keep` (one the workers have loaded)."""
        root = os.path.dirname(keep)
        for name in os.listdir(root):
            if name != os.path.basename(keep):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)

    # ------------------------------------------------------------------ verification

    def probe(self, version: int) -> dict[str, float]:
        """Greedy-decode the probe prompt on every engine, score the same tokens with the trainer
        and compare; raises WeightSyncError past the tolerance."""
        answers: list[tuple[str, list[int], list[float]]]
        if self.engine_per_rank:  # every rank's engine answers
            assert self.explorer is not None
            mine = self.explorer.probe(self.probe_prompt, self.cfg.model.max_response_tokens)
            parts: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(parts, [(f"rank {self.rank}", tokens, lp) for _, tokens, lp in mine])
            answers = [a for part in parts for a in part]
        else:
            box: list[Any] = [None]
            if self.rank == 0:
                assert self.explorer is not None
                box[0] = self.explorer.probe(self.probe_prompt, self.cfg.model.max_response_tokens)
            dist.broadcast_object_list(box, src=0)
            answers = box[0]
        seqs = [Sequence(self.probe_prompt, tokens, index=i) for i, (_, tokens, _) in enumerate(answers)]
        mbs = micro_batches([seqs], self.pad_token_id, template=seqs[0])
        trainer_lp = self.strategy.compute_logprobs(mbs, temperature=1.0)[0].float()
        start = len(self.probe_prompt)  # log-probs sit at the response's columns of the packed row
        ours = [
            trainer_lp[row, start : start + len(tokens)].tolist()
            for row, (_, tokens, _) in enumerate(answers)
        ]
        return judge_probe(answers, ours, version, self.tolerance)
