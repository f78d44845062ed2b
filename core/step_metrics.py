"""What a training step reports besides the update's own numbers: rollout statistics and timings,
how far the engine's log-probs are from the trainer's, this process's memory, and the mean of
per-mini-batch metrics."""

from __future__ import annotations

import os
import random
import resource
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from .algorithms.dapo import informative_groups
from .types import Experience, by_episode


def mean_dicts(dicts: list[dict[str, float]]) -> dict[str, float]:
    sums: dict[str, float] = defaultdict(float)
    for d in dicts:
        for k, v in d.items():
            sums[k] += v
    return {k: v / len(dicts) for k, v in sums.items()}


def rollout_metrics(exps: list[Experience]) -> dict[str, float]:
    """The step's rollouts, each episode counted once (the samples of a split one: its reward, its
    finish, its counts once, its model tokens summed)."""
    episodes = by_episode(exps)
    ends = [samples[-1] for samples in episodes]
    rewards = torch.tensor([e.reward for e in ends], dtype=torch.float32)
    out = {
        "rollout/reward_mean": float(rewards.mean()),
        "rollout/reward_std": float(rewards.std()) if len(ends) > 1 else 0.0,
        "rollout/response_len_mean": sum(e.model_tokens for e in exps) / len(ends),
        "rollout/truncated_frac": sum(e.finish_reason == "length" for e in ends) / len(ends),
        # groups whose rewards differ (the others teach nothing, unless a length term shapes them)
        "rollout/effective_groups": float(len(informative_groups([e.reward for e in ends], [e.group_id for e in ends]))),
    }
    if len(ends) < len(exps):  # a re-rendered history went on as a new sample
        out["rollout/samples_per_episode_mean"] = len(exps) / len(ends)
    if any(e.finish_reason == "max_turns" for e in ends):
        out["rollout/max_turns_frac"] = sum(e.finish_reason == "max_turns" for e in ends) / len(ends)
    if any(e.segments for e in exps):  # partial rollouts: responses a weight update interrupted
        out["rollout/interrupted_frac"] = sum(bool(e.segments) for e in exps) / len(exps)
    # each over the episodes that have it (a mixture's tasksets score with their own functions)
    counted: dict[str, list[float]] = defaultdict(list)
    for e in ends:
        for name, value in [*e.reward_components.items(), *e.metrics.items()]:
            counted[name].append(value)
    for name, values in sorted(counted.items()):
        out[f"rollout/{name}_mean"] = sum(values) / len(values)
    return out


class LogprobGap:
    """How far the engine's log-probs of the sampled tokens are from the trainer's recomputation
    over one step, per response token: `rollout/logprob_diff_mean` and `rollout/logprob_diff_max`.

    Near 0 (numerics only) when the engine generated with the trainer's weights and sampling does
    not reshape the distribution (top-k/top-p/min-p off). It grows when the engine holds other
    weights (a stale or failed sync), or computes differently (another dtype or attention kernel)."""

    def __init__(self) -> None:
        self.sum, self.count, self.max = 0.0, 0.0, 0.0

    def add(self, engine: torch.Tensor, trainer: torch.Tensor, mask: torch.Tensor) -> None:
        diff = (engine.float() - trainer.float()).abs() * mask
        self.sum += float(diff.sum())
        self.count += float(mask.sum())
        self.max = max(self.max, float(diff.max())) if diff.numel() else self.max

    def metrics(self, group: dist.ProcessGroup | None) -> dict[str, float]:
        """Over every data-parallel rank's tokens (a collective of `group`)."""
        totals = torch.tensor([self.sum, self.count], dtype=torch.float64)
        worst = torch.tensor([self.max], dtype=torch.float64)
        dist.all_reduce(totals, group=group)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=group)
        if totals[1] == 0:
            return {}
        return {
            "rollout/logprob_diff_mean": float(totals[0] / totals[1]),
            "rollout/logprob_diff_max": float(worst),
        }


def rollout_report(engines: int, timings: list[dict[str, float]]) -> dict[str, float]:
    """A step's rollout metrics: how many engines generated, and each timing of the slowest one."""
    report = {"rollout/engines": float(engines)}
    for timing in timings:
        for key, seconds in timing.items():
            name = f"perf/rollout_{key}"
            report[name] = max(report.get(name, 0.0), seconds)
    return report


_peak_rss_gib = 0.0
"""The highest RSS memory_metrics has seen in this process (statm or ru_maxrss)."""


def memory_metrics(device: str) -> dict[str, float]:
    """This process's resident memory now and at its peak, and on CUDA the peak of allocated
    device memory, in GiB (Linux: /proc and ru_maxrss in KiB).

    The kernel's two counters are kept apart and approximately, so ru_maxrss can read a few hundred
    KiB under statm's current RSS when the process sits at its peak (as it does once malloc keeps
    freed memory); the peak reported is never below an RSS this process reported before."""
    global _peak_rss_gib
    with open("/proc/self/statm") as f:
        resident_pages = int(f.read().split()[1])
    rss_gib = resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**30
    max_rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    _peak_rss_gib = max(_peak_rss_gib, rss_gib, max_rss_gib)
    metrics = {"perf/rss_gib": rss_gib, "perf/peak_rss_gib": _peak_rss_gib}
    if device == "cuda":
        metrics["perf/cuda_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return metrics


def mixture_metrics(
    exps: list[Experience], source_of: dict[str, str], names: Iterable[str]
) -> dict[str, float]:
    """rollout/<taskset>/reward_mean and .../experiences of each taskset of a mixture; `source_of`
    maps a task id to its taskset's name."""
    rewards: dict[str, list[float]] = {name: [] for name in names}
    for e in exps:  # dynamic sampling's rounds tag their groups '<task id>@<round>'
        rewards.setdefault(source_of.get(e.group_id.split("@")[0], ""), []).append(e.reward)
    out = {}
    for name, values in rewards.items():
        if name:
            out[f"rollout/{name}/experiences"] = float(len(values))
            if values:
                out[f"rollout/{name}/reward_mean"] = sum(values) / len(values)
    return out


def completion_rows(
    exps: list[Experience], tokenizer: Any, rng: random.Random, probability: float
) -> list[dict]:
    """monitor.log_completions: each experience, decoded, with probability `probability`."""
    return [
        {"prompt": tokenizer.decode(e.prompt_token_ids), "response": tokenizer.decode(e.response_token_ids),
         "reward": e.reward, "rewards": e.reward_components, "finish_reason": e.finish_reason,
         "group": e.group_id, "policy_version": e.policy_version, "counts": e.metrics}
        for e in exps
        if rng.random() < probability
    ]  # fmt: skip


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from n samples of which c are correct (Chen et al. 2021,
    "Evaluating Large Language Models Trained on Code", arXiv:2107.03374): 1 - C(n-c, k) / C(n, k),
    computed as 1 - prod_{i=n-c+1..n} (1 - k/i) so large n does not overflow."""
    assert 0 <= c <= n and 1 <= k <= n, (n, c, k)
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def sampled_eval_metrics(correct: list[list[bool]], answers: list[list[str]]) -> dict[str, float]:
    """avg@n, pass@k (k = 1, 2, 4, ... and n) and maj@n over tasks of n samples each: `correct[t][j]`
    whether sample j of task t is right, `answers[t][j]` its answer (maj@n votes on them: the most
    frequent answer, the first seen on a tie, is the task's; right if its samples are)."""
    n = len(correct[0])
    assert all(len(c) == n for c in correct), "every task has n samples"
    out = {f"avg@{n}": sum(map(sum, correct)) / (n * len(correct))}
    ks = sorted({2**i for i in range(n.bit_length()) if 2**i <= n} | {n})
    for k in ks:
        out[f"pass@{k}"] = sum(pass_at_k(n, sum(c), k) for c in correct) / len(correct)
    votes = 0
    for right, said in zip(correct, answers, strict=True):
        counts: dict[str, int] = {}
        for a in said:
            counts[a] = counts.get(a, 0) + 1
        top = max(counts.values())
        winner = next(a for a in said if counts[a] == top)
        votes += any(r for r, a in zip(right, said, strict=True) if a == winner)
    out[f"maj@{n}"] = votes / len(correct)
    return out
