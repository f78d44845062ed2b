"""The RL loop: one schedule for every run, in-process (`rlcore launch`) or against a remote trainer
(trainer.remote). It drives a TrainerHandle (handles.py) through the stages the run plan describes,
and reads top to bottom:

    per stage:  configure the trainer, link its engines (engine_link.py), resume, sync the engines
                if they may hold other weights
    per step:   take the step's experiences from the stage's source  ->  train  ->  sync (or
                publish)  ->  evaluate  ->  checkpoint  ->  log  ->  heartbeat (pause / stop)

A step is one call whatever the source (plan.source, step_sources.py): rollouts explored in
lock-step (lockstep_source.py, with rollout-ahead and dynamic sampling), an experience buffer
(buffer_source.py), the taskset's rows for SFT and DPO (taskset_rows.py). Where progress goes (monitors,
the progress bar, the controller's heartbeats) is stage_record.py; checkpoints, the resume and the
stage's summary are stage_checkpoints.py.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import Any

from ..core.config import Stage, inherits_previous_model
from ..core.config.stage_refs import with_stage_exports
from ..core.data.taskset import task_stream
from ..core.step_metrics import memory_metrics
from ..core.types import Experience
from ..weights.publisher import Publisher
from ..weights.schedule import SyncSchedule
from .buffer_source import BufferSource, StopWhileWaiting
from .engine_link import EngineLink, RunContext
from .handles import TrainerHandle
from .lockstep_source import LockstepSource
from .paths import SUMMARY, published_dir, stage_dir
from .stage_checkpoints import StageCheckpoints
from .stage_record import StageRecord
from .step_sizes import plan_steps
from .step_sources import StepSource, step_source
from .taskset_rows import PairEvaluation, RowsSource, mixture_report, taskset_formats

log = logging.getLogger("rlcore.loop")

__all__ = ["RunContext", "StageLoop", "planned_steps", "run_stages"]


def planned_steps(stage: Stage) -> int:
    stream = task_stream(stage.config)
    return plan_steps(stage.config, stream.batches_per_epoch * stage.config.buffer.batch_size)[2]


def run_stages(stages: list[Stage], handle: TrainerHandle, run: RunContext) -> None:
    """Every stage in order; a stage an earlier launch finished is skipped (its export feeds the
    next, a reward model's the stages that name it), and a stage stopped on the run's request ends
    the run."""
    previous_model = None
    reward_models: dict[str, str] = {}  # a reward model stage's name -> its export (stage_refs.py)
    for stage in stages:
        sdir = stage_dir(run.run_dir, stage, len(stages))
        os.makedirs(sdir, exist_ok=True)
        is_last = stage is stages[-1]
        stage = dataclasses.replace(stage, config=with_stage_exports(stage.config, reward_models))
        summary = done = _finished(stage, os.path.join(sdir, SUMMARY))  # in an earlier run that we resume?
        if summary is None:
            model_path = stage.config.model.model_path
            if inherits_previous_model(stage.config):
                if not previous_model:
                    raise ValueError(f"stage {stage.name} inherits weights but the previous stage exported none")
                model_path = previous_model
            # a model a service holds (tinker://..., the previous stage's) has the first stage's tokenizer
            tokenizer = stages[0].config.model.model_path if "://" in model_path else None
            summary = StageLoop(stage, sdir, model_path, handle, run, is_last, tokenizer).run()
        if stage.plan.trained_model == "reward":  # a reward model feeds no later stage's policy: the
            reward_models[stage.name] = summary["final_model"]  # next starts where this one started
            previous_model = previous_model or summary.get("start_model")
        else:
            previous_model = summary["final_model"]
        if summary["stopped"] and done is None:
            break


def _finished(stage: Stage, summary_file: str) -> dict[str, Any] | None:
    """The summary of `stage` when an earlier launch of the run finished it, else None."""
    if not os.path.isfile(summary_file):
        return None
    with open(summary_file) as f:
        done: dict[str, Any] = json.load(f)
    return done if done["global_step"] >= planned_steps(stage) else None


class StageLoop:
    def __init__(
        self, stage: Stage, sdir: str, model_path: str, handle: TrainerHandle, run: RunContext, is_last: bool,
        tokenizer_path: str | None = None,
    ):  # fmt: skip
        """`tokenizer_path`: where the model's tokenizer is, when `model_path` has none (a model a
        service holds, tinker://...)."""
        from transformers import AutoTokenizer

        cfg = self.cfg = stage.config
        plan = self.plan = stage.plan
        self.model_path = model_path
        self.stage, self.sdir, self.handle, self.run_ctx = stage, sdir, handle, run
        self.stream = task_stream(cfg)
        self.train_batch, self.total_explore_steps, self.total_train_steps = plan_steps(
            cfg, self.stream.batches_per_epoch * cfg.buffer.batch_size
        )
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path or model_path)
        formats = taskset_formats(cfg)
        self.mixture = mixture_report(self.stream.tasks, formats)
        handle.configure(cfg, plan, model_path, sdir, self.total_train_steps)
        prompt_format = formats[cfg.buffer.explorer_input.taskset.name][2]
        probe_prompt = prompt_format.encode_prompt(tokenizer, self.stream.tasks[0].prompt)
        self.link = EngineLink(cfg, plan, handle, run, probe_prompt)
        self.schedule = SyncSchedule(cfg.synchronizer)
        self.lockstep = LockstepSource(cfg, plan, self.link, self.stream, self.schedule) if plan.explores else None  # fmt: skip
        self.rows = RowsSource(cfg, plan, handle, formats, tokenizer, self.train_batch)
        self.pair_eval = PairEvaluation(cfg, handle, tokenizer) if plan.trained_model == "reward" else None
        self.source: BufferSource | None = None  # plan.reads_buffer: opened with the stage's run
        self.steps: StepSource | None = None
        """The stage's step (step_sources.py), built when the stage runs."""
        self.record = StageRecord(stage, sdir, run, self.total_train_steps, tokenizer)
        self.checkpoints = StageCheckpoints(stage, sdir, handle, is_last)
        self.global_step = self.explore_step = 0
        self.evaluated_step = -1
        """The global step the last evaluation of the loop was at (a step evaluates once)."""
        self.published = -1
        """The newest version published for the explorers (plan.publishes)."""
        self.publisher = Publisher(plan, handle, published_dir(sdir)) if plan.publishes else None

    # ------------------------------------------------------------------ the schedule

    def run(self) -> dict[str, Any]:
        try:
            resumed = self._resume()  # before the monitors open: they take up at the step resumed from
            if self.plan.reads_buffer:
                self.source = BufferSource(
                    self.stage, self.sdir, self.run_ctx.run_dir, lambda: self._heartbeat(False), self._while_waiting
                )  # fmt: skip
            state = self._kept_state()
            if resumed and state is not None:  # an in-memory buffer, a task history, as checkpointed
                state.load_state_dict(self.checkpoints.source_state(self.global_step))
            self.steps = step_source(
                self.plan, self.cfg, self.rows, self.stream, self._train, self.mixture, self.schedule,
                self.record.completions, self.lockstep, self.source, (self.total_explore_steps, self.total_train_steps),
            )  # fmt: skip
            self.record.open(self.checkpoints.resumed_at)
            last_eval, stopped = self._steps(resumed)
            self._heartbeat(wait=False)  # flush the last records
        finally:
            self.record.close()
            if self.lockstep is not None:
                self.lockstep.close()
            self.link.close()
            if self.source is not None:
                self.source.close()
        return self.checkpoints.summary(self.global_step, last_eval, stopped, self.model_path)

    def _steps(self, resumed: bool) -> tuple[dict[str, float], bool]:
        cfg, plan, steps = self.cfg, self.plan, self.steps
        assert steps is not None
        if not resumed and self.link.sync_on_start:
            self.link.sync(self.global_step)
        if plan.source == "evaluation":
            result = self._evaluate(self.global_step)
            self._log(result)
            return result, False
        if plan.publishes:  # the explorers wait for the weights they start from
            published = self._publish()
            if not resumed:  # the step resumed from has its row, with its publish, already
                self._log(published)
        if self.source is not None and plan.source == "explorer_thread":
            registered = self.run_ctx.workers  # None: the workers are not the launch's to restart
            self.source.start_explorer(self.link.explore_endpoints, self.explore_step, registered)
        if cfg.explorer.eval_on_startup and self.global_step == 0:
            self._log(self._evaluate(self.global_step))
        last_eval: dict[str, float] = {}
        while not self._done():
            start, step_before = time.perf_counter(), self.global_step
            try:
                metrics, self.global_step = steps.step(self.explore_step, self.global_step)
            except StopWhileWaiting:  # asked to stop while it waited for experiences
                return last_eval, self._stop()
            self.explore_step = steps.next_explore_step(self.explore_step)
            if plan.explores and self.schedule.due_after_step(self.global_step, self.link.synced_step):
                metrics.update(self.link.sync(self.global_step))
            if plan.publishes and self.schedule.due_after_step(self.global_step, self.published):
                metrics.update(self._publish())
            metrics["perf/step_time_s"] = time.perf_counter() - start
            metrics["perf/tokens_per_s"] = metrics.pop("perf/tokens", 0.0) / metrics["perf/step_time_s"]
            metrics.update(memory_metrics(self.run_ctx.device))
            done = self._done()
            evaluated: dict[str, float] = {}
            if self.link.eval_due(self.explore_step, done) and self.evaluated_step != self.global_step:
                last_eval = evaluated = self._evaluate(self.global_step)
                self.evaluated_step = self.global_step
            metrics.update(evaluated)
            # a step that trained nothing (the buffer was read to its end, or every experience was too
            # stale) has no row of its own: the step before logged its row at this global step.
            # The row before the checkpoint: a launch killed between the two retrains the step from the
            # checkpoint before and logs it again (the monitors keep the row logged last); the other way
            # round the row of a step the checkpoint holds was lost.
            self._log(metrics if self.global_step > step_before else evaluated)
            self.checkpoints.save(self.global_step, self.explore_step, final=done, source=self._kept_state())
            if not done and self._heartbeat(wait=True) == "stop":
                return last_eval, self._stop()
        if cfg.buffer.explorer_input.eval_tasksets and not last_eval:  # e.g. resumed a finished stage
            last_eval = self._evaluate(self.global_step)
            self._log(last_eval)
        return last_eval, False

    def _kept_state(self) -> Any:
        """What keeps state of its own beside the trainer's checkpoint (state_dict, load_state_dict):
        an asynchronous run's in-memory buffer and explorer position, a lock-step run's task selection."""
        if self.source is not None and self.plan.source == "explorer_thread":
            return self.source
        if self.lockstep is not None and self.lockstep.selection is not None:
            return self.lockstep
        return None

    def _stop(self) -> bool:
        """Stopped on the run's request: the step's checkpoint (if it has none yet)."""
        if self.checkpoints.last_saved != self.global_step:
            self.checkpoints.save(self.global_step, self.explore_step, final=True, source=self._kept_state())
        log.info("stopped at step %d on the run's request", self.global_step)
        return True

    def _done(self) -> bool:
        exhausted = self.steps is not None and self.steps.exhausted
        return exhausted or self.explore_step >= self.total_explore_steps or self.global_step >= self.total_train_steps  # fmt: skip

    def _train(self, exps: list[Experience], explore_step: int, global_step: int) -> tuple[dict[str, float], int]:
        """The algorithm's step on explore step `explore_step`'s scored experiences (none: nothing to
        train): its metrics and the global step after it."""
        if not exps:
            return {}, global_step
        metrics, global_step = self.handle.train_step(exps)
        self.record.completions(exps, explore_step, global_step)
        return metrics, global_step

    # ------------------------------------------------------------------ sync, evaluation, resume

    def _evaluate(self, step: int) -> dict[str, float]:
        """The stage's evaluation at `step`: on the engines, or a reward model's on its eval
        tasksets' pairs (taskset_rows.PairEvaluation)."""
        return self.link.evaluate(step) if self.pair_eval is None else self.pair_eval.evaluate()

    def _publish(self) -> dict[str, float]:
        assert self.publisher is not None
        metrics = self.publisher.publish(self.global_step)
        self.published = self.global_step
        return metrics

    def _while_waiting(self) -> None:
        """Between the buffer's polls: an explorer's restarted workers get the newest weights."""
        if self.publisher is not None and (metrics := self.publisher.on_wait()):
            self._log(metrics)

    def _resume(self) -> bool:
        restored = self.checkpoints.resume()
        if restored is None:
            return False
        self.global_step, self.explore_step = restored.global_step, restored.explore_step
        if self.link.explorer is not None:  # with none, nothing holds weights to replace
            self.link.sync(self.global_step)
        return True

    def _heartbeat(self, wait: bool) -> str:
        return self.record.heartbeat(self.global_step, self.link.synced_step, wait)

    def _log(self, metrics: dict[str, float]) -> None:
        self.record.log(metrics, self.global_step)
