"""The RL loop: one schedule for every run, in-process (`rlcore launch`) or against a remote trainer
(trainer.remote). It drives a TrainerHandle (handles.py) and an Explorer, and reads top to bottom:

    per stage:  configure the trainer, resume, sync the engines if they may hold other weights
    per step:   [sync if the engines are too stale]  explore (or take the rollout started ahead)
                -> [start the next rollout ahead]  train (the algorithm step)  -> sync
                -> evaluate -> checkpoint -> log -> heartbeat (pause / stop)

SFT stages train on the taskset's reference responses instead of exploring.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..client.trainer import TrainSequence
from ..core.algorithms.dapo import dynamic_sampling
from ..core.config import Stage, inherits_previous_model
from ..core.data.prompts import PromptFormat, model_chat_template
from ..core.data.taskset import preference_pair, task_stream, training_tasksets
from ..core.hf_export import HF_DIR
from ..core.monitor.jsonl import COMPLETIONS, drop_after
from ..core.step_metrics import completion_rows, mean_dicts, memory_metrics, mixture_metrics
from ..core.sync_schedule import SyncSchedule, judge_probe, probe_tolerance
from ..core.types import Experience, Task
from ..rollout.explorer import Explorer, rollout_seed
from ..rollout.remote import RemoteRollout
from ..rollout.workflows import resolve_workflow
from .handles import TrainerHandle
from .paths import EXPLORER_DIR, SUMMARY, published_dir, stage_dir
from .rollout_ahead import RolloutAhead
from .training import plan_steps

log = logging.getLogger("rlcore.loop")

@dataclass
class RunContext:
    """What every stage of a run shares."""

    run_dir: str
    device: str
    endpoints: list[str]
    """Rollout workers (mode both, or a remote trainer); empty: engines in the trainer's process."""
    reporter: Any = None
    """RunReporter: the link to the run's controller (None without one)."""
    workers: Callable[[], list[str] | None] | None = None
    """The addresses of the rollout workers the launch keeps alive (it restarts those that exit),
    asked before each step (None back: unknown now, keep the current ones); None: the workers
    are the fixed `endpoints`."""


class StopWhileWaiting(Exception):
    """The run asked to stop while the trainer waited for an explorer's experiences."""


def planned_steps(stage: Stage) -> int:
    stream = task_stream(stage.config)
    return plan_steps(stage.config, stream.batches_per_epoch * stage.config.buffer.batch_size)[2]


def run_stages(stages: list[Stage], handle: TrainerHandle, run: RunContext) -> None:
    """Every stage in order; a stage an earlier launch finished is skipped (its export feeds the
    next), and a stage stopped on the run's request ends the run."""
    previous_model = None
    for stage in stages:
        sdir = stage_dir(run.run_dir, stage, len(stages))
        os.makedirs(sdir, exist_ok=True)
        summary_file = os.path.join(sdir, SUMMARY)
        if os.path.isfile(summary_file):  # finished in an earlier run that we are resuming?
            with open(summary_file) as f:
                done = json.load(f)
            if done["global_step"] >= planned_steps(stage):
                previous_model = done["final_model"]
                continue
        model_path = stage.config.model.model_path
        if inherits_previous_model(stage.config):
            if not previous_model:
                raise ValueError(f"stage {stage.name} inherits weights but the previous stage exported none")
            model_path = previous_model
        summary = StageLoop(stage, sdir, model_path, handle, run, is_last=stage is stages[-1]).run()
        previous_model = summary["final_model"]
        if summary["stopped"]:
            break


class StageLoop:
    def __init__(
        self, stage: Stage, sdir: str, model_path: str, handle: TrainerHandle, run: RunContext, is_last: bool
    ):
        from transformers import AutoTokenizer

        cfg = self.cfg = stage.config
        plan = self.plan = stage.plan
        self.stage, self.sdir, self.handle, self.run_ctx, self.is_last = stage, sdir, handle, run, is_last
        self.trains_on = plan.trains_on  # rollouts, or the taskset's responses or pairs
        # the rollouts come from the explorers of a decoupled run (mode train with an RL algorithm),
        # or from this stage's own explorer thread (synchronizer.asynchronous)
        self.own_explorer = plan.source == "explorer_thread"
        self.reads_buffer = plan.reads_buffer
        self.explores = plan.explores
        ts = cfg.buffer.explorer_input.taskset
        self.stream = task_stream(cfg)
        self.train_batch, self.total_explore_steps, self.total_train_steps = plan_steps(
            cfg, self.stream.batches_per_epoch * cfg.buffer.batch_size
        )
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        # each training taskset's format (a mixture's keep theirs): how SFT and DPO encode its rows
        self.formats = {
            t.name: (key, t, PromptFormat(
                cfg.model.max_prompt_tokens, cfg.model.apply_chat_template, model_chat_template(cfg.model),
                t.format.system_prompt,
                # an SFT stage renders its conversations with the tools its taskset's workflow declares
                resolve_workflow(t.default_workflow_type).tool_schemas(dict(t.workflow_args)),
            ))
            for key, t in training_tasksets(cfg)
        }  # fmt: skip
        self.prompt_format = self.formats[ts.name][2]
        self.source_of = {t.task_id: t.source for t in self.stream.tasks}  # a mixture's metrics
        on_workers = "workers" in (plan.engines, plan.explorer_engines)
        endpoints = (self._registered() or run.endpoints) if on_workers else []
        self.endpoints = endpoints if plan.engines == "workers" else []
        self.explore_endpoints = endpoints if plan.explorer_engines == "workers" else []
        self.ahead_explorer: Any = None  # synchronizer.asynchronous: the explorer thread, on these workers
        self.explore_launch: Any = None  # mode train on a buffer: the explore launch, watched through its lock
        handle.configure(cfg, model_path, sdir, self.total_train_steps)

        self.explorer: Explorer | None = None
        self.workers: RemoteRollout | None = None  # their clients close with the stage
        # Rollout workers hold whatever weights they served before, and an in-process engine an
        # earlier stage built holds that stage's: push ours first.
        self.sync_on_start = bool(self.endpoints)
        if self.endpoints:
            self.workers = RemoteRollout(cfg, self.endpoints)
            self.explorer = Explorer(cfg, self.workers)
        elif plan.engines == "in_process":  # an SFT or DPO stage runs one only to evaluate
            engines = handle.start_engines(plan)
            self.explorer = Explorer(cfg, engines.rollout, engines.evaluation)
            self.sync_on_start = engines.reused
        self.schedule = SyncSchedule(cfg.synchronizer)
        self.probe_prompt = self.prompt_format.encode_prompt(self.tokenizer, self.stream.tasks[0].prompt)
        self.ahead = RolloutAhead(bool(cfg.synchronizer.rollout_ahead) and self.explorer is not None)
        self.global_step = self.explore_step = 0
        self.synced_step = 0
        """The step whose weights the engines serve (rollouts run only between syncs, so every
        experience of a rollout was generated by the weights of one step)."""
        self.last_saved = 0
        self.buffer: Any = None  # mode train's experience buffer, opened with the stage's run
        replay = self.cfg.buffer.trainer_input.experience_buffer.replay_buffer.enable
        self.buffer_keys: set[tuple] | None = set() if replay else None
        """With the replay buffer: the groups trained on so far (to count the reused ones)."""
        self.published = -1
        """The newest version published for the explorers (mode train on a buffer)."""
        self.exhausted = False
        """Every explorer finished and the buffer is read (mode train on a buffer)."""
        self.final_checkpoint: str | None = None
        self.final_model: str | None = None
        self.monitor: Any = None
        self.progress: Any = None

    # ------------------------------------------------------------------ the schedule

    def run(self) -> dict[str, Any]:
        from ..core.monitor import build_monitors
        from ..core.monitor.progress import StepProgress

        cfg = self.cfg
        try:
            resumed = self._resume()  # before the monitors open metrics.jsonl, which it rewinds
            if self.own_explorer:
                from ..buffer import memory_buffer

                self.buffer = memory_buffer(cfg.buffer.trainer_input.experience_buffer)
            elif self.reads_buffer:
                from ..buffer import open_buffer
                from .run_lock import PeerLaunch

                self.buffer = open_buffer(cfg, wait_s=30.0)
                self.explore_launch = PeerLaunch(os.path.join(self.run_ctx.run_dir, EXPLORER_DIR), "explore launch")
                log.info("reading experiences from %s", self.buffer.describe())
            self.monitor = build_monitors(
                list(cfg.monitor.monitor_type), self.sdir, cfg.project, f"{cfg.name}/{self.stage.name}",
                dataclasses.asdict(cfg),
            )  # fmt: skip
            # stdout: a run's stderr is for what went wrong (trainer ranks send it to a log file)
            self.progress = StepProgress(self.total_train_steps, desc=self.stage.name, file=sys.stdout)
            last_eval, stopped = self._steps(resumed)
            self._heartbeat(wait=False)  # flush the last records
        finally:
            if self.progress is not None:
                self.progress.close()
            if self.monitor is not None:
                self.monitor.close()
            self.ahead.close()
            if self.workers is not None:
                self.workers.close()
            if self.ahead_explorer is not None:
                self.ahead_explorer.close()
            if self.buffer is not None:
                self.buffer.close()
        return self._summary(last_eval, stopped)

    def _steps(self, resumed: bool) -> tuple[dict[str, float], bool]:
        cfg = self.cfg
        if not resumed and self.sync_on_start:
            self._sync()
        if self.plan.source == "evaluation":
            result = self.evaluate()
            self._log(result)
            return result, False
        if self.reads_buffer:  # the explorers wait for the weights they start from
            self._log(self._publish())
        if self.own_explorer:
            from .explore_loop import ExploreLoop

            self.ahead_explorer = ExploreLoop(
                self.stage, os.path.join(self.sdir, "explorer"), published_dir(self.sdir), self.explore_endpoints,
                buffer=self.buffer, start_step=self.explore_step,
            )  # fmt: skip
            self.ahead_explorer.start()
        if cfg.explorer.eval_on_startup and self.global_step == 0:
            self._log(self.evaluate())
        last_eval: dict[str, float] = {}
        while not self._done():
            start = time.perf_counter()
            tasks = self.stream.batch(self.explore_step)
            if self.reads_buffer:
                try:
                    metrics = self.buffer_step()
                except StopWhileWaiting:  # asked to stop while it waited for experiences
                    if self.last_saved != self.global_step:
                        self._checkpoint(final=True)
                    log.info("stopped at step %d on the run's request", self.global_step)
                    return last_eval, True
            else:
                metrics = self.rl_step(tasks) if self.explores else self.offline_step(tasks)
            self.explore_step += 1
            if self.explores and self.schedule.due_after_step(self.global_step, self.synced_step):
                metrics.update(self._sync())
            if self.reads_buffer and self.schedule.due_after_step(self.global_step, self.published):
                metrics.update(self._publish())
            metrics["perf/step_time_s"] = time.perf_counter() - start
            metrics["perf/tokens_per_s"] = metrics.pop("perf/tokens", 0.0) / metrics["perf/step_time_s"]
            metrics.update(memory_metrics(self.run_ctx.device))
            done = self._done()
            if self._eval_due(done):
                last_eval = self.evaluate()
                metrics.update(last_eval)
            self._checkpoint(final=done)
            self._log(metrics)
            if not done and self._heartbeat(wait=True) == "stop":
                if self.last_saved != self.global_step:
                    self._checkpoint(final=True)
                log.info("stopped at step %d on the run's request", self.global_step)
                return last_eval, True
        if cfg.buffer.explorer_input.eval_tasksets and not last_eval:  # e.g. resumed a finished stage
            last_eval = self.evaluate()
            self._log(last_eval)
        return last_eval, False

    def _done(self) -> bool:
        return (
            self.exhausted
            or self.explore_step >= self.total_explore_steps
            or self.global_step >= self.total_train_steps
        )

    # ------------------------------------------------------------------ steps

    def offline_step(self, tasks: list[Task]) -> dict[str, float]:
        """SFT on the tasks' reference responses, or DPO on their (chosen, rejected) pairs: one
        optimizer step per train batch of tasks."""
        pairs = self.trains_on == "pairs"
        seqs = []
        for t in tasks:
            key, ts, prompt_format = (
                self.formats.get(t.source) or self.formats[self.cfg.buffer.explorer_input.taskset.name]
            )
            fmt = ts.format
            prompt_format = prompt_format.for_task(t)  # its row's own system prompt and tools
            if pairs:
                responses = list(preference_pair(t, fmt, key))
            elif "messages" in t.metadata and fmt.prompt_type == "messages":
                prompt_ids, response_ids, mask = prompt_format.encode_sft_messages(
                    self.tokenizer, t.metadata["messages"]
                )
                seqs.append(TrainSequence(prompt_ids, response_ids, loss_mask=[float(m) for m in mask]))
                continue
            elif t.response is None:
                raise ValueError(
                    f"SFT needs a reference response: task {t.task_id} has no column '{fmt.response_key}'"
                )
            else:
                responses = [t.response]
            for response in responses:
                prompt_ids, response_ids = prompt_format.encode_sft_example(
                    self.tokenizer, t.prompt, response
                )
                seqs.append(TrainSequence(prompt_ids, response_ids))
        per_update = self.train_batch * (2 if pairs else 1)  # a pair's two sequences stay together
        updates = []
        for i in range(0, len(seqs), per_update):
            result = self.handle.forward_backward(
                seqs[i : i + per_update], "dpo" if pairs else "cross_entropy"
            )
            step = self.handle.optim_step()
            updates.append({**result.metrics, "actor/grad_norm": step.grad_norm, "actor/lr": step.lr})
            self.global_step = step.global_step
        metrics = mean_dicts(updates)
        metrics["perf/tokens"] = float(sum(len(s.prompt_token_ids) + len(s.response_token_ids) for s in seqs))
        return metrics

    def rl_step(self, tasks: list[Task]) -> dict[str, float]:
        metrics = self._follow_workers()
        if self.schedule.due_before_explore(self.global_step, self.synced_step):
            metrics.update(self._sync())
        start = time.perf_counter()
        taken = self.ahead.take(self.explore_step)  # generated during the previous step, by older weights
        (exps, report), version = taken or (self._explore_now(tasks), self.synced_step)
        exps = self.schedule.drop_stale(exps, [version] * len(exps), self.global_step, metrics)
        if self.cfg.algorithm.dynamic_sampling:  # DAPO: refill the groups whose rewards all agree
            exps = dynamic_sampling(
                exps, self.cfg.buffer.batch_size, self.cfg.algorithm.dynamic_sampling_max_rounds,
                lambda r: self._explore(self.stream.extra(self.explore_step, r), self.explore_step, r)[0], metrics,
            )  # fmt: skip
        if len(self.formats) > 1:  # a mixture: each taskset's rewards and count of its own
            metrics.update(mixture_metrics(exps, self.source_of, self.formats))
        metrics["perf/generate_s"] = time.perf_counter() - start
        metrics.update(report)
        metrics["rollout/generated_ahead"] = float(taken is not None)
        self._start_ahead(len(exps))
        if exps:
            train_metrics, self.global_step = self.handle.train_step(exps)
            metrics.update(train_metrics)
            self._log_completions(exps)
        metrics.update(self.ahead.wait())  # the sync, evaluation and checkpoint find the engines idle
        return metrics

    def buffer_step(self) -> dict[str, float]:
        """Mode train in a decoupled run: the step's groups from the experience buffer (the explorers
        tagged each experience with the version of the weights that generated it), trained on like
        explored ones. The step's position in the buffer is explore_step, which checkpoints keep: a
        resumed trainer gets the same groups for the steps it retrains."""
        eb = self.cfg.buffer.trainer_input.experience_buffer
        start = time.perf_counter()
        taken = self._take(eb.max_wait_s)
        self.exhausted = taken.exhausted
        exps = [e for g in taken.groups for e in g]
        metrics = {
            "perf/buffer_wait_s": time.perf_counter() - start,
            "buffer/groups": float(len(taken.groups)),
            "buffer/experiences": float(len(exps)),
        }
        if taken.exhausted:
            log.info(
                "the explorers finished: the buffer's last %d group(s) at step %d",
                len(taken.groups),
                self.global_step,
            )
        exps = self.schedule.drop_stale(
            exps, [e.policy_version for e in exps], self.global_step, metrics,
            enforce=self.cfg.algorithm.sample_strategy == "staleness_control",
        )  # fmt: skip
        if self.buffer_keys is not None:  # replay: groups trained on before
            keys = [(g[0].group_id, g[0].policy_version, tuple(g[0].response_token_ids)) for g in taken.groups]
            metrics["buffer/groups_reused"] = float(sum(k in self.buffer_keys for k in keys))
            self.buffer_keys.update(keys)
        if len(self.formats) > 1:
            metrics.update(mixture_metrics(exps, self.source_of, self.formats))
        if exps:
            train_metrics, self.global_step = self.handle.train_step(exps)
            metrics.update(train_metrics)
            self._log_completions(exps)
        return metrics

    def _log_completions(self, exps: list[Experience]) -> None:
        """monitor.log_completions: a seeded sample of the step's rollouts."""
        if self.cfg.monitor.log_completions:
            rng = random.Random(f"{self.cfg.seed}/{self.explore_step}")
            probability = self.cfg.monitor.save_completions_probability
            if rows := completion_rows(exps, self.tokenizer, rng, probability):
                self.monitor.log_completions(rows, self.global_step)

    def _take(self, wait_s: float) -> Any:
        """The step's groups from the buffer; an explorer thread that failed meanwhile raises here."""
        from ..buffer.base import BufferTimeout

        deadline = time.monotonic() + wait_s
        while True:
            thread, peer = self.ahead_explorer, self.explore_launch
            if thread is not None and thread.error is not None:
                raise RuntimeError(f"the explorer thread failed: {thread.error}") from thread.error
            if peer is not None:
                if (change := peer.poll(wait_s)) is not None:
                    log.warning("%s", change)  # said within seconds, not after max_wait_s
                if self._heartbeat(wait=False) == "stop":  # a Ctrl-C reaches the waiting trainer too
                    raise StopWhileWaiting
            left = deadline - time.monotonic()
            chunk = 1.0 if peer is not None else 5.0 if thread is not None else left  # how often to look
            try:
                return self.buffer.take(self.explore_step, self.cfg.buffer.batch_size, min(left, chunk))
            except BufferTimeout:
                if left <= chunk:
                    raise

    def _publish(self) -> dict[str, float]:
        """Publish the trainer's weights for the explorers (mode train on a buffer)."""
        version, synced = self.handle.publish_weights(published_dir(self.sdir))
        self.published = self.global_step
        log.info("published version %d of the weights for the explorers", version)
        return {"perf/publish_s": synced.seconds, "sync/published_version": float(version)}

    def _explore(
        self, tasks: list[Task], explore_step: int, round_: int = 0
    ) -> tuple[list[Experience], dict[str, float]]:
        """An explore step's experiences, tagged with the version of the weights that generate
        them (rollouts run only between syncs), and the rollout's metrics. Round 1, 2, ... are
        dynamic sampling's extra rounds of the step, sampled with seeds of their own."""
        assert self.explorer is not None
        version = self.synced_step
        exps = self.explorer.explore(tasks, seed=rollout_seed(self.cfg.seed, explore_step, round_))
        for e in exps:
            e.policy_version = version
        return exps, self.explorer.report()

    def _start_ahead(self, num_experiences: int) -> None:
        """synchronizer.rollout_ahead: start the next explore step's rollout, unless this step is the
        stage's last."""
        following = self.explore_step + 1
        train_steps = -(-num_experiences // self.train_batch)
        if (
            not self.ahead.enabled
            or following >= self.total_explore_steps
            or self.global_step + train_steps >= self.total_train_steps
        ):
            return
        tasks = self.stream.batch(following)
        self.ahead.start(following, lambda: self._explore(tasks, following), version=self.synced_step)

    # ------------------------------------------------------------------ sync, evaluation, checkpoints

    def _registered(self) -> list[str] | None:
        """The workers the launch keeps alive, as the run controller lists them now (None: it does
        not answer), else the configured ones (explorer.rollout_model.endpoints: not restarted, but
        one that stops answering is left out all the same)."""
        return self.run_ctx.endpoints if self.run_ctx.workers is None else self.run_ctx.workers()

    def _follow_workers(self, retry: bool = True, force: bool = False) -> dict[str, float]:
        """Take the launch's rollout workers as they are now: without the ones that stopped
        answering, with the restarted ones, which get the current weights before they serve."""
        if self.workers is None:
            return {}
        registered = self._registered()
        if registered is None:  # the controller does not answer: the workers we have, less the lost
            registered = self.endpoints
        addresses = [a for a in registered if a not in self.workers.lost]
        if not addresses:
            addresses = self._await_restarted()
        if addresses == self.endpoints and not force:
            return {}
        self.workers.close()
        self.workers = RemoteRollout(self.cfg, addresses, skip_unreachable=True)
        if not self.workers.clients:
            rm = self.cfg.explorer.rollout_model
            raise RuntimeError(
                f"no rollout worker answers: {', '.join(self.endpoints)} stopped, and "
                + (
                    f"{', '.join(addresses)} do(es) not answer"
                    if addresses
                    else "none is registered with the run"
                    + (
                        f" (the launch restarts each at most {rm.max_restarts} time(s): "
                        "explorer.rollout_model.max_restarts)"
                        if self.run_ctx.workers is not None
                        else ""
                    )
                )
            )
        assert self.explorer is not None
        self.explorer.rollout = self.explorer.eval_rollout = self.workers
        were, self.endpoints = self.endpoints, [c.address for c in self.workers.clients]
        log.info("rollout workers now: %s (were: %s)", ", ".join(self.endpoints), ", ".join(were))
        return self._sync(retry=retry)

    def _await_restarted(self) -> list[str]:
        """Every rollout worker stopped: the addresses of those the launch restarts meanwhile,
        waited for as long as its restarts may take (backoff 1, 2, ... 2^max_restarts s, each
        worker's start within control.worker_start_timeout); [] at once for configured endpoints,
        which nothing restarts."""
        rm, lost = self.cfg.explorer.rollout_model, self.workers.lost if self.workers else []
        if self.run_ctx.workers is None or rm.max_restarts == 0:
            return []
        budget_s = 2.0**rm.max_restarts + self.cfg.control.worker_start_timeout
        log.warning(
            "no rollout worker answers (%s stopped): waiting up to %.0f s for the launch to restart one",
            ", ".join(lost), budget_s,
        )  # fmt: skip
        deadline = time.monotonic() + budget_s
        while time.monotonic() < deadline:
            alive = [a for a in self._registered() or [] if a not in lost]
            if alive:
                return alive
            time.sleep(0.5)
        return []

    def _explore_now(self, tasks: list[Task]) -> tuple[list[Experience], dict[str, float]]:
        """This step's rollout; when it failed because every worker stopped, once more on the
        workers the launch restarted (with the current weights)."""
        try:
            return self._explore(tasks, self.explore_step)
        except RuntimeError:
            if self.workers is None or self.workers.clients:
                raise
            self._follow_workers(retry=False, force=True)
            return self._explore(tasks, self.explore_step)

    def _sync(self, retry: bool = True) -> dict[str, float]:
        """Push the trainer's weights to the engines; with synchronizer.probe, check each engine's
        greedy log-probs against the trainer's. A launch's worker lost meanwhile is left out."""
        start = time.perf_counter()
        try:
            synced = self.handle.sync_weights(self.endpoints)
        except Exception as e:
            if not retry or self.workers is None:
                raise
            log.warning("weight sync failed (%s); again with the rollout workers that answer", e)
            time.sleep(1.0)  # the launch notices a worker that exited within a second
            return self._follow_workers(retry=False, force=True)
        self.synced_step = self.global_step
        metrics = {"perf/sync_s": time.perf_counter() - start}
        if synced.num_bytes:
            metrics["perf/sync_gb_per_s"] = synced.num_bytes / 1e9 / max(synced.seconds, 1e-9)
        if self.cfg.synchronizer.probe and self.explorer is not None:
            answers = self.explorer.probe(self.probe_prompt, self.cfg.model.max_response_tokens)
            scored = [tokens for _, tokens, _ in answers if tokens]  # an empty response has nothing to score
            ours = iter(
                self.handle.compute_logprobs([TrainSequence(self.probe_prompt, t) for t in scored])
                if scored
                else []
            )
            trainer = [next(ours) if tokens else [] for _, tokens, _ in answers]
            tolerance = probe_tolerance(self.cfg, self.run_ctx.device)
            metrics.update(judge_probe(answers, trainer, self.global_step, tolerance))
        return metrics

    def _eval_due(self, done: bool) -> bool:
        if not self.cfg.buffer.explorer_input.eval_tasksets:
            return False
        interval = self.cfg.explorer.eval_interval
        return done or (interval > 0 and self.explore_step % interval == 0)

    def evaluate(self) -> dict[str, float]:
        """Evaluate on the engines, after making sure they hold the current weights."""
        if self.explorer is None or not self.cfg.buffer.explorer_input.eval_tasksets:
            return {}
        self._follow_workers()
        if self.synced_step != self.global_step:
            self._sync()
        return self.explorer.evaluate(seed=self.cfg.seed)

    def _checkpoint(self, final: bool) -> None:
        interval = self.cfg.trainer.save_interval
        periodic = interval > 0 and self.global_step // interval > self.last_saved // interval
        if not (final or periodic):
            return
        mode = self.cfg.trainer.save_hf_checkpoint
        with_hf = mode == "always" or (final and (mode == "last" or not self.is_last))
        self.final_checkpoint, hf = self.handle.save_checkpoint(with_hf, self.explore_step)
        self.final_model = hf or None
        self.last_saved = self.global_step

    def _resume(self) -> bool:
        if not self.cfg.continue_from_checkpoint:
            return False
        restored = self.handle.load_checkpoint()
        # what was logged past the checkpoint (past step 0 when the stage starts over) is logged again
        step = 0 if restored is None else restored.global_step
        dropped = drop_after(self.sdir, step)
        drop_after(self.sdir, step, COMPLETIONS)
        if restored is None:
            return False
        self.global_step, self.explore_step = restored.global_step, restored.explore_step
        self.last_saved = self.global_step
        self.final_checkpoint = restored.path
        hf = os.path.join(restored.path, HF_DIR)
        self.final_model = hf if os.path.isdir(hf) else None
        log.info(
            "resumed %s from %s (step %d)%s", self.stage.name, restored.path, self.global_step,
            f"; dropped {dropped} metrics.jsonl line(s) past it" if dropped else "",
        )  # fmt: skip
        if self.explorer is not None:  # with none, nothing holds weights to replace
            self._sync()
        return True

    # ------------------------------------------------------------------ reporting

    def _heartbeat(self, wait: bool) -> str:
        """Report the step to the run's controller; 'stop' when the run asks to stop."""
        reporter = self.run_ctx.reporter
        if reporter is None:
            return "go"
        return reporter.heartbeat(  # type: ignore[no-any-return]
            self.stage.name, self.global_step, self.total_train_steps, self.synced_step, wait=wait
        )

    def _log(self, metrics: dict[str, float]) -> None:
        if not metrics:
            return
        if self.run_ctx.reporter is not None:
            self.run_ctx.reporter.record(self.stage.name, self.global_step, metrics)
        self.monitor.log(metrics, self.global_step)
        self.progress.update(self.global_step, metrics)

    def _summary(self, last_eval: dict[str, float], stopped: bool) -> dict[str, Any]:
        summary = {
            "stage": self.stage.name, "global_step": self.global_step, "stopped": stopped,
            "eval": last_eval, "final_checkpoint": self.final_checkpoint, "final_model": self.final_model,
        }  # fmt: skip
        with open(os.path.join(self.sdir, SUMMARY), "w") as f:
            json.dump(summary, f, indent=2)
        return summary
