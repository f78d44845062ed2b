"""The training loop of one stage, run by every rank of the trainer world.

    for each batch of tasks:
        experiences = explore(tasks)              rank 0's engine; broadcast to all ranks (an
                                                  engine in every rank: each its share, gathered)
        (rollout_ahead: rank 0 starts the next batch's rollout on the workers here)
        ref / old log-probs, KL-in-reward, GRPO advantages
        for each mini-batch: forward_backward + optimizer_step
        (rollout_ahead: wait for the next batch's rollout)
        sync weights to the engines (core/synchronizer.py), evaluate, checkpoint, log

SFT stages skip exploration and train on the taskset's reference responses.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

from ..backends import STRATEGIES
from ..rollout.workflows.prompts import PromptFormat
from .algorithms import LossNorm, build_kl_controller, build_loss, grpo_advantages, kl_estimate
from .batch import Batch, Sequence, equalize, micro_batches, plan_micro_batches, shard
from .checkpoint import TrainerState, latest_checkpoint, load_checkpoint, save_checkpoint
from .config import RLCoreConfig, Stage
from .data.taskset import TaskStream, load_tasks
from .explorer import Explorer, engine_in_every_rank
from .hf_export import export_hf
from .rollout_ahead import RolloutAhead
from .step_metrics import LogprobGap, mean_dicts, memory_metrics, rollout_metrics, rollout_report
from .synchronizer import Synchronizer
from .types import Experience, Task

log = logging.getLogger("rlcore.trainer")


class StageTrainer:
    def __init__(
        self,
        stage: Stage,
        stage_dir: str,
        model_path: str,
        device: str,
        export_final_hf: bool,
        *,
        with_explorer: bool = True,
        total_train_steps: int | None = None,
        rollout_endpoints: list[str] | None = None,
        master_address: str = "127.0.0.1",
    ):
        """`with_explorer=False, total_train_steps=N` builds only the training side (the remote
        TrainerService): no engine, no task stream, an lr schedule spanning N optimizer steps."""
        from transformers import AutoTokenizer

        self.stage, self.cfg, self.stage_dir, self.model_path = stage, stage.config, stage_dir, model_path
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = device
        self.export_final_hf = export_final_hf
        cfg, algo = self.cfg, self.cfg.algorithm
        self.is_sft = algo.algorithm_type == "sft"
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        ts = cfg.buffer.explorer_input.taskset
        self.stream: TaskStream | None = None
        self.prompt_format = PromptFormat(
            cfg.model.max_prompt_tokens,
            cfg.model.apply_chat_template,
            cfg.model.chat_template,
            ts.format.system_prompt,
        )
        self.temperature = ts.rollout_args.temperature or 1.0
        self.max_response_len = ts.rollout_args.max_tokens or cfg.model.max_response_tokens

        if total_train_steps is None:
            self.stream = TaskStream(
                load_tasks(ts, "buffer.explorer_input.taskset"), cfg.buffer.batch_size, cfg.seed, ts.shuffle
            )
            self.train_batch, self.total_explore_steps, self.total_train_steps = plan_steps(
                cfg, len(self.stream.tasks)
            )
        else:
            self.train_batch, _, _ = plan_steps(cfg, cfg.buffer.batch_size)
            self.total_explore_steps = self.total_train_steps = total_train_steps

        self.kl_in_loss = not self.is_sft and algo.kl_loss_fn != "none" and algo.kl_loss_coef > 0
        self.needs_ref = self.kl_in_loss or (not self.is_sft and algo.use_kl_in_reward)
        self.kl_ctrl = build_kl_controller(algo.kl_ctrl)
        self.strategy = STRATEGIES.resolve(cfg.trainer.strategy)(
            model_path, cfg.trainer, algo.optimizer, device=device, dtype=cfg.model.dtype,
            total_steps=self.total_train_steps, with_reference=self.needs_ref, seed=cfg.seed,
        )  # fmt: skip
        self.engine_per_rank = engine_in_every_rank(cfg, self.world)
        # an SFT stage runs an engine only to evaluate; the same answer on every rank
        self.has_engine = with_explorer and bool(
            not self.is_sft or cfg.buffer.explorer_input.eval_tasksets or cfg.mode == "bench"
        )
        self.explorer = None
        if self.has_engine and (self.rank == 0 or self.engine_per_rank):
            endpoints = rollout_endpoints if cfg.mode == "both" else None
            self.explorer = Explorer(cfg, model_path, device, endpoints, master_address)
        # Separate rollout workers hold whatever weights they started with, and an in-process
        # engine an earlier stage built holds that stage's: push ours first.
        self.sync_on_start = with_explorer and (cfg.mode == "both" or self._engine_reused())
        self.state = TrainerState()
        probe_prompt = (
            self.prompt_format.encode_prompt(self.tokenizer, self.stream.tasks[0].prompt)
            if self.stream is not None
            else [self.tokenizer.bos_token_id or 0]
        )
        self.synchronizer = Synchronizer(
            cfg, self.strategy, self.explorer, stage_dir, model_path, probe_prompt,
            self.tokenizer.pad_token_id, device, engine_per_rank=self.engine_per_rank,
        )  # fmt: skip
        # synchronizer.rollout_ahead: rank 0's rollout of the next explore step
        self.ahead = RolloutAhead(bool(cfg.synchronizer.rollout_ahead) and self.explorer is not None)
        self._last_saved = 0  # global step of the newest checkpoint
        self.monitor = None
        self.reporter = None  # RunReporter on rank 0 when the run has a controller
        self.stopped = False  # the run asked to stop before the stage's last step

    # ------------------------------------------------------------------ the loop

    def run(self, monitor, progress, reporter=None) -> dict[str, float]:
        cfg = self.cfg
        self.monitor, self.progress, self.reporter = monitor, progress, reporter
        resumed = self._maybe_resume()
        if self.sync_on_start and not resumed:
            self._sync()
        if cfg.mode == "bench":
            result = self.evaluate()
            self._log(result, self.state.global_step)
            return result
        if cfg.explorer.eval_on_startup and self.state.global_step == 0:
            self._log(self.evaluate(), self.state.global_step)
        last_eval: dict[str, float] = {}
        while (
            self.state.explore_step < self.total_explore_steps
            and self.state.global_step < self.total_train_steps
        ):
            start = time.perf_counter()
            assert self.stream is not None
            tasks = self.stream.batch(self.state.explore_step)
            metrics = self.sft_step(tasks) if self.is_sft else self.rl_step(tasks)
            self.state.explore_step += 1
            self._maybe_sync(metrics)
            metrics["perf/step_time_s"] = time.perf_counter() - start
            metrics["perf/tokens_per_s"] = metrics.pop("perf/tokens", 0.0) / metrics["perf/step_time_s"]
            metrics.update(memory_metrics(self.device))
            done = (
                self.state.explore_step >= self.total_explore_steps
                or self.state.global_step >= self.total_train_steps
            )
            if self.explorer_due_eval(done):
                last_eval = self.evaluate()
                metrics.update(last_eval)
            self._maybe_checkpoint(final=done)
            self._log(metrics, self.state.global_step)
            if not done and self._run_wants_stop():
                if self._last_saved != self.state.global_step:
                    self._maybe_checkpoint(final=True)
                self.stopped = True
                if self.rank == 0:
                    log.info("stopped at step %d on the run's request", self.state.global_step)
                return last_eval
        if cfg.buffer.explorer_input.eval_tasksets and not last_eval:  # e.g. resumed a finished stage
            last_eval = self.evaluate()
            self._log(last_eval, self.state.global_step)
        return last_eval

    # ------------------------------------------------------------------ steps

    def sft_step(self, tasks: list[Task]) -> dict[str, float]:
        seqs: list[Sequence] = []
        for t in tasks:
            if t.response is None:
                raise ValueError(
                    f"SFT needs a reference response: task {t.task_id} has no column "
                    f"'{self.cfg.buffer.explorer_input.taskset.format.response_key}'"
                )
            prompt_ids, response_ids = self.prompt_format.encode_sft_example(
                self.tokenizer, t.prompt, t.response
            )
            seqs.append(Sequence(prompt_ids, response_ids, index=len(seqs)))
        metrics = mean_dicts(
            [self._train_on(self._micro(m)[0], m, temperature=1.0) for m in self._minis(seqs)]
        )
        metrics["perf/tokens"] = float(sum(s.length for s in seqs))
        return metrics

    def rl_step(self, tasks: list[Task]) -> dict[str, float]:
        metrics: dict[str, float] = {}
        schedule, state = self.synchronizer.schedule, self.state
        if schedule.due_before_explore(state.global_step, state.policy_version):
            metrics.update(self._sync())
        t0 = time.perf_counter()
        exps, rollout, ahead = self._explore(tasks)
        exps = schedule.drop_stale(exps, [e.policy_version for e in exps], state.global_step, metrics)
        t_gen = time.perf_counter() - t0
        metrics.update(rollout)
        metrics["rollout/generated_ahead"] = float(ahead)
        self._start_ahead(len(exps))
        if exps:
            metrics.update(self.train_experiences(exps))
        metrics.update(self.ahead.wait())  # the sync, evaluation and checkpoint find the engines idle
        metrics["perf/generate_s"] = t_gen
        return metrics

    def train_experiences(self, exps: list[Experience]) -> dict[str, float]:
        """One RL step on scored experiences (the same list on every rank): old and reference
        log-probs, KL-in-reward, GRPO advantages, then one optimizer step per mini-batch."""
        algo = self.cfg.algorithm
        seqs = [
            Sequence(e.prompt_token_ids, e.response_token_ids, list(e.logprobs), index=i)
            for i, e in enumerate(exps)
        ]
        scores = torch.tensor([e.reward for e in exps], dtype=torch.float32)

        # Log-prob passes happen before any update, on this rank's share of every mini-batch.
        minis = self._minis(seqs)
        local = [self._micro(m) for m in minis]
        timers: dict[str, float] = {}
        gap = LogprobGap()  # the engine's log-probs (in old_logprobs until recomputed) against ours
        for mbs, _ in local:
            if self.needs_ref:
                with _timed(timers, "perf/ref_logprobs_s"):
                    ref = self.strategy.compute_logprobs(mbs, self.temperature, reference=True)
                for mb, lp in zip(mbs, ref, strict=True):
                    mb["ref_logprobs"] = lp
            if algo.do_old_log_prob_compute:
                with _timed(timers, "perf/old_logprobs_s"):
                    old = self.strategy.compute_logprobs(mbs, self.temperature)
                for mb, lp in zip(mbs, old, strict=True):
                    gap.add(mb["old_logprobs"], lp, mb["loss_mask"])
                    mb["old_logprobs"] = lp

        metrics = gap.metrics(self.strategy.dp_group) if algo.do_old_log_prob_compute else {}
        rewards = scores
        if algo.use_kl_in_reward:
            seq_kl = torch.zeros(len(seqs), dtype=torch.float64)
            for mbs, idx in local:
                for mb, rows in zip(mbs, idx, strict=True):
                    n = len(rows)
                    kl = kl_estimate(mb["old_logprobs"][:n], mb["ref_logprobs"][:n], algo.kl_penalty_fn)
                    seq_kl[rows] = (kl * mb["loss_mask"][:n]).sum(dim=1).double()
            dist.all_reduce(seq_kl, group=self.strategy.dp_group)  # each DP rank filled its own rows
            rewards = scores - self.kl_ctrl.value * seq_kl.float()
            metrics["rollout/kl_penalty"] = float(seq_kl.mean())
            metrics["rollout/kl_coef"] = self.kl_ctrl.value
            self.kl_ctrl.update(float(seq_kl.mean()), len(seqs))
        adv = grpo_advantages(rewards, [e.group_id for e in exps], algo.advantage_std_normalize)
        for mbs, idx in local:
            for mb, rows in zip(mbs, idx, strict=True):
                mb["advantages"][: len(rows)] = mb["loss_mask"][: len(rows)] * adv[rows].unsqueeze(1)

        t1 = time.perf_counter()
        updates = [
            self._train_on(mbs, mini, timers=timers) for (mbs, _), mini in zip(local, minis, strict=True)
        ]
        metrics.update(mean_dicts(updates))
        metrics.update(rollout_metrics(exps))
        metrics.update(timers)
        metrics["perf/train_s"] = time.perf_counter() - t1
        metrics["perf/tokens"] = float(sum(s.length for s in seqs))
        return metrics

    # ------------------------------------------------------------------ pieces

    def _engine_reused(self) -> bool:
        """Whether this stage's in-process engine came from an earlier stage (rank 0's answer)."""
        box = [self.explorer is not None and self.explorer.engine_reused]
        dist.broadcast_object_list(box, src=0)
        return bool(box[0])

    def _explore(self, tasks: list[Task]) -> tuple[list[Experience], dict[str, float], bool]:
        """This step's experiences on every rank, the rollout's metrics (on rank 0: how many engines
        generated, and the engine/reward seconds), and whether the experiences were generated ahead
        (during the previous step's training)."""
        if self.engine_per_rank:
            return self._explore_every_rank(tasks)
        box: list = [None]
        if self.rank == 0:
            taken = self.ahead.take(self.state.explore_step)
            if taken is not None:
                box[0] = (*taken[0], True)
            else:
                box[0] = (*self._rollout(tasks, self.state.explore_step), False)
        dist.broadcast_object_list(box, src=0)
        exps, timing, ahead_flag = box[0]
        return exps, rollout_report(1, [timing] if self.rank == 0 else []), ahead_flag

    def _explore_every_rank(self, tasks: list[Task]) -> tuple[list[Experience], dict[str, float], bool]:
        """An engine in every rank: each rank rolls out its contiguous share of the tasks (whole
        groups), and every rank gets all experiences in task order; timings are the slowest rank's."""
        mine = shard(tasks, self.rank, self.world)
        local: tuple[list[Experience], dict[str, float]] = ([], {})
        if mine:
            local = self._rollout(mine, self.state.explore_step, seed_offset=self.rank * 1_000_003)
        parts: list = [None] * self.world
        dist.all_gather_object(parts, local)
        exps = [e for part, _ in parts for e in part]
        return exps, rollout_report(sum(1 for part, _ in parts if part), [t for _, t in parts]), False

    def _rollout(
        self, tasks: list[Task], explore_step: int, seed_offset: int = 0
    ) -> tuple[list[Experience], dict[str, float]]:
        """The experiences of one explore step (rank 0, or each rank's share) and the rollout's timings."""
        assert self.explorer is not None
        exps = self.explorer.explore(tasks, seed=self.cfg.seed * 100_003 + explore_step + seed_offset)
        return exps, dict(self.explorer.last_timing())

    def _start_ahead(self, num_experiences: int) -> None:
        """Rank 0 (synchronizer.rollout_ahead): start the next explore step's rollout, unless this
        step is the stage's last."""
        if not self.ahead.enabled or self.stream is None:
            return
        following = self.state.explore_step + 1
        train_steps = math.ceil(num_experiences / self.train_batch)
        if (
            following >= self.total_explore_steps
            or self.state.global_step + train_steps >= self.total_train_steps
        ):
            return
        tasks = self.stream.batch(following)
        self.ahead.start(following, lambda: self._rollout(tasks, following))

    def _micro(self, mini: list[Sequence]) -> tuple[list[Batch], list[list[int]]]:
        """This rank's share of a mini-batch as micro-batches, with the same count on every rank.
        Ranks that hold parts of one model replica (tensor/pipeline parallel) share one share."""
        mine = shard(mini, self.strategy.dp_rank, self.strategy.dp_size)
        groups = plan_micro_batches(mine, self.cfg.trainer.max_token_len_per_gpu)
        count = torch.tensor([len(groups)])
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        groups = equalize(groups, int(count))
        mbs = micro_batches(groups, self.tokenizer.pad_token_id, template=mini[0])
        return mbs, [[s.index for s in g] for g in groups]

    def _minis(self, seqs: list[Sequence]) -> list[list[Sequence]]:
        """Consecutive train batches of `train_batch` sequences: one optimizer step each."""
        return [seqs[i : i + self.train_batch] for i in range(0, len(seqs), self.train_batch)]

    def _train_on(
        self,
        mbs: list[Batch],
        mini: list[Sequence],
        temperature: float | None = None,
        timers: dict[str, float] | None = None,
    ) -> dict[str, float]:
        timers = {} if timers is None else timers
        norm = LossNorm(
            num_tokens=float(sum(len(s.response_ids) for s in mini)), num_seqs=float(len(mini)),
            max_response_len=self.max_response_len,
        )  # fmt: skip
        loss_fn = build_loss(self.cfg.algorithm, norm)
        with _timed(timers, "perf/forward_backward_s"):
            metrics = self.strategy.forward_backward(mbs, loss_fn, temperature or self.temperature)
        with _timed(timers, "perf/optimizer_s"):
            metrics["actor/grad_norm"] = self.strategy.optimizer_step()
        metrics["actor/lr"] = self.strategy.current_lr()
        self.state.global_step += 1
        return metrics

    def _sync(self) -> dict[str, float]:
        metrics = self.synchronizer.sync(self.state.global_step)
        self.state.policy_version = self.state.global_step
        return metrics

    def _maybe_sync(self, metrics: dict[str, float]) -> None:
        if self.is_sft:  # the engine only serves evaluation, which syncs on demand
            return
        if self.synchronizer.schedule.due_after_step(self.state.global_step, self.state.policy_version):
            metrics.update(self._sync())

    def explorer_due_eval(self, done: bool) -> bool:
        if not self.cfg.buffer.explorer_input.eval_tasksets:
            return False
        interval = self.cfg.explorer.eval_interval
        return done or (interval > 0 and self.state.explore_step % interval == 0)

    def evaluate(self) -> dict[str, float]:
        """Rank 0 evaluates with the engine (after making sure it holds the current weights)."""
        if not self.cfg.buffer.explorer_input.eval_tasksets:
            return {}
        if self.state.policy_version != self.state.global_step:
            self._sync()
        box: list = [{}]
        if self.rank == 0:
            assert self.explorer is not None
            box[0] = self.explorer.evaluate(seed=self.cfg.seed)
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _maybe_checkpoint(self, final: bool) -> None:
        interval = self.cfg.trainer.save_interval
        periodic = interval > 0 and self.state.global_step // interval > self._last_saved // interval
        if not (final or periodic):
            return
        mode = self.cfg.trainer.save_hf_checkpoint
        with_hf = mode == "always" or (final and (mode == "last" or self.export_final_hf))
        self.state.kl_ctrl = self.kl_ctrl.state_dict()
        export = None
        if with_hf:

            def export(path: str) -> None:
                export_hf(
                    self.strategy.iter_full_weights(),
                    path,
                    self.strategy.hf_config(),
                    self.model_path,
                    write=self.rank == 0,
                )

        save_checkpoint(
            self.stage_dir, self.strategy, self.state, self.cfg.trainer.max_checkpoints_to_keep, export
        )
        self._last_saved = self.state.global_step

    def _maybe_resume(self) -> bool:
        if not self.cfg.continue_from_checkpoint:
            return False
        path = latest_checkpoint(self.stage_dir)
        if path is None:
            return False
        self.state = load_checkpoint(path, self.strategy)
        self.kl_ctrl.load_state_dict(self.state.kl_ctrl)
        self._last_saved = self.state.global_step
        if self.rank == 0:
            log.info("resumed %s from %s (step %d)", self.stage.name, path, self.state.global_step)
        if self.has_engine:  # with none, nothing holds weights to replace (and nothing to probe)
            self._sync()
        return True

    def _run_wants_stop(self) -> bool:
        """Report the step to the run's controller (rank 0) and agree on every rank whether to stop."""
        box = ["go"]
        if self.rank == 0 and self.reporter is not None:
            box[0] = self.reporter.heartbeat(
                self.stage.name, self.state.global_step, self.total_train_steps, self.state.policy_version
            )
        dist.broadcast_object_list(box, src=0)
        return box[0] == "stop"

    def _log(self, metrics: dict[str, float], step: int) -> None:
        if self.rank != 0 or not metrics:
            return
        if self.reporter is not None:
            self.reporter.record(self.stage.name, step, metrics)
        if self.monitor is not None:
            self.monitor.log(metrics, step)
        if self.progress is not None:
            self.progress.update(step, metrics)


def plan_steps(cfg: RLCoreConfig, num_tasks: int) -> tuple[int, int, int]:
    """(experiences per optimizer step, explore steps, optimizer steps) of a stage."""
    is_sft = cfg.algorithm.algorithm_type == "sft"
    per_step = cfg.buffer.batch_size * (1 if is_sft else cfg.algorithm.repeat_times)
    train_batch = cfg.buffer.train_batch_size or per_step
    updates_per_step = per_step // train_batch
    explore_steps = (num_tasks // cfg.buffer.batch_size) * cfg.buffer.total_epochs
    if cfg.buffer.total_steps is not None:
        explore_steps = min(explore_steps, cfg.buffer.total_steps)
    train_steps = explore_steps * updates_per_step
    if cfg.trainer.total_steps is not None:
        train_steps = min(train_steps, cfg.trainer.total_steps)
    return train_batch, math.ceil(train_steps / updates_per_step), train_steps


@contextmanager
def _timed(timers: dict[str, float], key: str) -> Iterator[None]:
    """Add the seconds spent in the block to timers[key]."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timers[key] = timers.get(key, 0.0) + time.perf_counter() - start
