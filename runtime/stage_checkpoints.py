"""A stage's checkpoints as the loop keeps them: when to save (trainer.save_interval, the final
step), with an HF export or not (trainer.save_hf_checkpoint), the state of the stage's experience
source where it lives only in this process (an asynchronous run's in-memory buffer and explorer
position: `source_state/step_N.json`, written before the trainer's checkpoint of step N), the resume
(`resumed_at`: the monitors drop what was logged past it, to be logged again), and the stage's
summary (summary.json: what a later launch skips and what the next stage starts from)."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from ..core.config import Stage
from ..core.hf_export import HF_DIR
from ..core.rpc.cli import write_atomic
from .handles import Restored, TrainerHandle
from .paths import SUMMARY

SOURCE_STATE = "source_state"

log = logging.getLogger("rlcore.loop")


class StageCheckpoints:
    def __init__(self, stage: Stage, sdir: str, handle: TrainerHandle, is_last: bool):
        self.stage, self.sdir, self.handle, self.is_last = stage, sdir, handle, is_last
        self.last_saved = 0
        self.final_checkpoint: str | None = None
        self.final_model: str | None = None
        self.resumed_at: int | None = None
        """continue_from_checkpoint: the step resumed from (0 when the stage starts over); the monitors
        drop what was logged past it, which is logged again."""

    def save(self, global_step: int, explore_step: int, final: bool, source: Any = None) -> None:
        """A checkpoint when `final` or trainer.save_interval says so; `source.state_dict()` (the
        stage's experience source, if it keeps one) is written first, beside it."""
        cfg = self.stage.config.trainer
        interval = cfg.save_interval
        periodic = interval > 0 and global_step // interval > self.last_saved // interval
        if not (final or periodic):
            return
        state = source.state_dict() if source is not None else None
        if state is not None:
            os.makedirs(os.path.join(self.sdir, SOURCE_STATE), exist_ok=True)
            write_atomic(self._source_file(global_step), json.dumps(state))
        mode = cfg.save_hf_checkpoint
        with_hf = mode == "always" or (final and (mode == "last" or not self.is_last))
        self.final_checkpoint, hf = self.handle.save_checkpoint(with_hf, explore_step)
        self.final_model = hf or None
        self.last_saved = global_step

    def _source_file(self, global_step: int) -> str:
        return os.path.join(self.sdir, SOURCE_STATE, f"step_{global_step}.json")

    def source_state(self, global_step: int) -> dict[str, Any]:
        """The experience source's state saved with the checkpoint of `global_step`."""
        path = self._source_file(global_step)
        try:
            with open(path) as f:
                return json.load(f)  # type: ignore[no-any-return]
        except FileNotFoundError:
            raise ValueError(
                f"stage {self.stage.name}: the checkpoint of step {global_step} has no saved state of its experience "
                f"source ({path}): an asynchronous run's explorer position and in-memory buffer (written since rlcore "
                "2026-11-29), or the task history of buffer.explorer_input.task_selection (kept only while the filter "
                "or the curriculum is on), so the run cannot resume exactly from it: resume with the settings it "
                "was saved with, or start it again without continue_from_checkpoint (or with a new name=)"
            ) from None

    def resume(self) -> Restored | None:
        """The checkpoint the trainer resumed from (continue_from_checkpoint), if any; `resumed_at` says
        where the monitors take up (step 0 when the stage starts over)."""
        if not self.stage.config.continue_from_checkpoint:
            return None
        restored = self.handle.load_checkpoint()
        self.resumed_at = 0 if restored is None else restored.global_step
        if restored is None:
            return None
        self.last_saved = restored.global_step
        self.final_checkpoint = restored.path
        hf = os.path.join(restored.path, HF_DIR)
        if "://" in restored.path:  # a checkpoint a service holds (tinker://...) is the model itself
            self.final_model = restored.path
        else:
            self.final_model = hf if os.path.isdir(hf) else None
        log.info("resumed %s from %s (step %d)", self.stage.name, restored.path, restored.global_step)
        return restored

    def summary(self, global_step: int, last_eval: dict[str, float], stopped: bool, start_model: str) -> dict[str, Any]:
        """The stage's summary, also written to its folder: its steps, last evaluation, final
        checkpoint and model, and the model it started from (`start_model`)."""
        summary = {
            "stage": self.stage.name, "global_step": global_step, "stopped": stopped, "eval": last_eval,
            "final_checkpoint": self.final_checkpoint, "final_model": self.final_model, "start_model": start_model,
        }  # fmt: skip
        with open(os.path.join(self.sdir, SUMMARY), "w") as f:
            json.dump(summary, f, indent=2)
        return summary
