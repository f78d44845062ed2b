"""`trainer.remote`: the stage loop runs in the launch process and drives a TrainerService.

The trainer world (started elsewhere with `rlcore trainer serve`) owns the model, optimizer and
parallelism; this process owns the schedule, the task stream, exploration on the rollout workers,
evaluation, metrics and checkpoint timing:

    Configure(stage config)                      once per stage
    SFT:  ForwardBackward(cross_entropy) per mini-batch + OptimStep
    GRPO: RunTasks on the workers -> TrainStep(experiences) -> SyncWeights(workers)
    SaveCheckpoint (+ HF export at the end: the next stage's model)
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

from ..client.base import ClientOptions
from ..client.trainer import TrainerClient, TrainSequence
from ..rollout.workflows.prompts import PromptFormat
from .config import Stage, inherits_previous_model, to_yaml
from .data.taskset import TaskStream, load_tasks
from .explorer import Explorer
from .synchronizer import judge_probe, probe_tolerance
from .trainer import plan_steps
from .worker import SUMMARY, stage_dir

log = logging.getLogger("rlcore.remote")


class RemoteStage:
    def __init__(
        self,
        stage: Stage,
        sdir: str,
        model_path: str,
        client: TrainerClient,
        endpoints: list[str],
        device: str,
    ):
        from transformers import AutoTokenizer

        self.stage, self.cfg, self.sdir, self.client = stage, stage.config, sdir, client
        self.endpoints = endpoints
        cfg = self.cfg
        ts = cfg.buffer.explorer_input.taskset
        self.is_sft = cfg.algorithm.algorithm_type == "sft"
        self.stream = TaskStream(
            load_tasks(ts, "buffer.explorer_input.taskset"), cfg.buffer.batch_size, cfg.seed, ts.shuffle
        )
        self.train_batch, self.total_explore_steps, self.total_train_steps = plan_steps(
            cfg, len(self.stream.tasks)
        )
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.prompt_format = PromptFormat(
            cfg.model.max_prompt_tokens,
            cfg.model.apply_chat_template,
            cfg.model.chat_template,
            ts.format.system_prompt,
        )
        self.device = device
        self.probe_prompt = self.prompt_format.encode_prompt(self.tokenizer, self.stream.tasks[0].prompt)
        client.configure(to_yaml(cfg), model_path, sdir, self.total_train_steps)
        self.explorer = Explorer(cfg, model_path, device, endpoints) if endpoints else None
        self.global_step = self.explore_step = 0
        self.synced_step = -1

    def _sync(self) -> dict[str, float]:
        """Push the trainer's weights to the workers unless they hold them; with synchronizer.probe,
        check each worker's greedy log-probs against the trainer's (ComputeLogprobs)."""
        if self.explorer is None or self.synced_step == self.global_step:
            return {}
        self.client.sync_weights(self.endpoints)
        self.synced_step = self.global_step
        if not self.cfg.synchronizer.probe:
            return {}
        answers = self.explorer.probe(self.probe_prompt, self.cfg.model.max_response_tokens)
        scored = [a for a in answers if a[1]]  # an empty response has nothing to score
        seqs = [TrainSequence(self.probe_prompt, tokens) for _, tokens, _ in scored]
        ours = self.client.compute_logprobs(seqs) if seqs else []
        return judge_probe(scored, ours, self.global_step, probe_tolerance(self.cfg, self.device))

    def _evaluate(self) -> dict[str, float]:
        if self.explorer is None or not self.cfg.buffer.explorer_input.eval_tasksets:
            return {}
        self._sync()
        return self.explorer.evaluate(seed=self.cfg.seed)

    def _sft_step(self) -> dict[str, float]:
        tasks = self.stream.batch(self.explore_step)
        seqs = []
        for t in tasks:
            if t.response is None:
                raise ValueError(f"SFT needs a reference response: task {t.task_id} has none")
            prompt_ids, response_ids = self.prompt_format.encode_sft_example(
                self.tokenizer, t.prompt, t.response
            )
            seqs.append(TrainSequence(prompt_ids, response_ids))
        metrics: dict[str, float] = {}
        for i in range(0, len(seqs), self.train_batch):
            mini = seqs[i : i + self.train_batch]
            result = self.client.forward_backward(mini, "cross_entropy")
            step = self.client.optim_step()
            self.global_step = step.global_step
            metrics = {
                **result.metrics,
                "actor/loss": result.loss,
                "actor/grad_norm": step.grad_norm,
                "actor/lr": step.lr,
            }
        return metrics

    def _rl_step(self) -> dict[str, float]:
        assert self.explorer is not None
        tasks = self.stream.batch(self.explore_step)
        start = time.perf_counter()
        exps = self.explorer.explore(tasks, seed=self.cfg.seed * 100_003 + self.explore_step)
        generate_s = time.perf_counter() - start
        result = self.client.train_step(exps)
        self.global_step = result.global_step
        return {**result.metrics, "perf/generate_s": generate_s}

    def run(self, monitor: Any, progress: Any, reporter: Any) -> dict[str, Any]:
        cfg, sc = self.cfg, self.cfg.synchronizer
        if self.cfg.explorer.eval_on_startup:
            self._log(self._evaluate(), monitor, progress, reporter)
        last_eval: dict[str, float] = {}
        final_model = None
        while self.explore_step < self.total_explore_steps and self.global_step < self.total_train_steps:
            start = time.perf_counter()
            metrics = self._sft_step() if self.is_sft else self._rl_step()
            self.explore_step += 1
            done = self.explore_step >= self.total_explore_steps or self.global_step >= self.total_train_steps
            if (
                not self.is_sft
                and self.global_step >= sc.sync_offset
                and self.global_step - max(self.synced_step, 0) >= sc.sync_interval
            ):
                sync_start = time.perf_counter()
                metrics.update(self._sync())
                metrics["perf/sync_s"] = time.perf_counter() - sync_start
            interval = cfg.explorer.eval_interval
            if cfg.buffer.explorer_input.eval_tasksets and (
                done or (interval and self.explore_step % interval == 0)
            ):
                last_eval = self._evaluate()
                metrics.update(last_eval)
            save_every = cfg.trainer.save_interval
            if done or (save_every and self.global_step % save_every == 0):
                _, hf = self.client.save_checkpoint(export_hf=done, explore_step=self.explore_step)
                final_model = hf or final_model
            metrics["perf/step_time_s"] = time.perf_counter() - start
            self._log(metrics, monitor, progress, reporter)
            if reporter is not None and not done:
                if (
                    reporter.heartbeat(
                        self.stage.name, self.global_step, self.total_train_steps, self.synced_step
                    )
                    == "stop"
                ):
                    self.client.save_checkpoint(export_hf=False, explore_step=self.explore_step)
                    return self._summary(last_eval, final_model, stopped=True)
        return self._summary(last_eval, final_model, stopped=False)

    def _log(self, metrics: dict[str, float], monitor: Any, progress: Any, reporter: Any) -> None:
        if not metrics:
            return
        monitor.log(metrics, self.global_step)
        progress.update(self.global_step, metrics)
        if reporter is not None:
            reporter.record(self.stage.name, self.global_step, metrics)

    def _summary(self, last_eval: dict[str, float], final_model: str | None, stopped: bool) -> dict[str, Any]:
        summary = {"stage": self.stage.name, "global_step": self.global_step, "stopped": stopped,
                   "eval": last_eval, "final_checkpoint": None, "final_model": final_model}  # fmt: skip
        with open(os.path.join(self.sdir, SUMMARY), "w") as f:
            json.dump(summary, f, indent=2)
        if self.explorer is not None:
            self.explorer.close()
        return summary


def run_remote(stages: list[Stage], run_dir: str, plan: dict[str, Any], device: str) -> int:
    """Every stage against the TrainerService at trainer.remote; returns an exit code."""
    import dataclasses

    from .monitor import build_monitors
    from .monitor.progress import StepProgress
    from .run_reporter import RunReporter

    base = stages[0].config
    assert base.trainer.remote is not None
    options = ClientOptions.from_control(base.control)
    reporter = RunReporter(plan["run_address"], options) if plan.get("run_address") else None
    previous_model = None
    with TrainerClient(base.trainer.remote, options) as client:
        state = client.get_state(timeout=30)
        log.info("remote trainer %s: %d rank(s)", base.trainer.remote, state.world_size)
        for stage in stages:
            cfg = stage.config
            sdir = stage_dir(run_dir, stage, len(stages))
            os.makedirs(sdir, exist_ok=True)
            model_path = previous_model if inherits_previous_model(cfg) else cfg.model.model_path
            assert model_path, f"stage {stage.name} inherits weights but the previous stage exported none"
            runner = RemoteStage(stage, sdir, model_path, client, plan["rollout_endpoints"], device)
            monitor = build_monitors(list(cfg.monitor.monitor_type), sdir, cfg.project, f"{cfg.name}/{stage.name}",
                                     dataclasses.asdict(cfg))  # fmt: skip
            progress = StepProgress(runner.total_train_steps, desc=stage.name)
            try:
                summary = runner.run(monitor, progress, reporter)
            finally:
                progress.close()
                monitor.close()
            previous_model = summary["final_model"]
            if summary["stopped"]:
                break
    if reporter is not None:
        reporter.close()
    return 0
