"""The algorithm menu inside real launches: DAPO's dynamic sampling refills dropped groups, the
reference model moves with the policy (sync_ref_model) on every FSDP strategy, PPO's critic, DPO on
generated pairs and mix's expert rows, each through checkpoints where it has state to resume."""

from __future__ import annotations

import os

import pytest
from safetensors.torch import load_file

from .launch_utils import launch, read_metrics, tiny_grpo_config

pytestmark = pytest.mark.integration


def _train_steps(root: str) -> list[dict]:
    return [m for m in read_metrics(os.path.join(root, "it", "run")) if "actor/loss" in m]


def _assert_resumed_like_straight(
    a: list[dict], b: list[dict], keys: tuple[str, ...], roots: tuple[str, str]
) -> None:
    """The resumed run's records `b` equal the straight run's `a` on `keys` (1e-6) at every step, and
    both end on the same weights."""
    assert [m["step"] for m in a] == [m["step"] for m in b]
    for x, y in zip(a, b, strict=True):
        for key in keys:
            assert abs(x[key] - y[key]) < 1e-6, (x["step"], key, x[key], y[key])
    wa, wb = (
        load_file(os.path.join(r, "it", "run", "global_step_4", "hf", "model.safetensors")) for r in roots
    )
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) <= 1e-6


def test_dynamic_sampling_replaces_groups_that_teach_nothing(tmp_path):
    root = str(tmp_path / "dapo")
    reward = {"buffer.explorer_input.taskset.reward_fn": ["tests.integration.rewards:half_constant"]}
    cfg = tiny_grpo_config(root, **{"algorithm.algorithm_type": "dapo", "buffer.total_steps": 2, **reward})
    launch(cfg, root + ".yaml")
    steps = _train_steps(root)
    assert len(steps) == 2
    # even-numbered tasks' groups all score 1.0 and are dropped; extra rounds refill the batch
    assert sum(m["rollout/groups_dropped"] for m in steps) > 0
    assert max(m["rollout/dynamic_sampling_rounds"] for m in steps) >= 1
    assert [m["rollout/groups_kept"] for m in steps] == [4, 4]
    assert all(0.0 <= m["rollout/overlong_filtered"] <= 1.0 for m in steps)


def test_reference_follows_the_policy_and_resumes(tmp_path):
    """On fsdp2 (megatron's in test_megatron_loop.py; fsdp shares NativeStrategy's blend and the
    DCP save of the reference, and ran here too until CI time ran short)."""
    kl = {"trainer.strategy": "fsdp2", "algorithm.kl_loss_coef": 0.1, "algorithm.kl_loss_fn": "k3"}
    sync = {**kl, "algorithm.sync_ref_model": True, "algorithm.ref_model_sync_steps": 1}
    # alpha 1: after every step the reference is the policy, so the next step's KL is exactly 0
    full = str(tmp_path / "full")
    launch(tiny_grpo_config(full, **{**sync, "algorithm.ref_model_mixup_alpha": 1.0, "buffer.total_steps": 3}),
           full + ".yaml")  # fmt: skip
    kls = [m["actor/kl_loss"] for m in _train_steps(full)]
    assert kls[0] == 0.0 and kls[1:] == [0.0, 0.0]

    # alpha 0.5 through a checkpoint: the resumed run restores the moved reference
    half = {**sync, "algorithm.ref_model_mixup_alpha": 0.5}
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    launch(tiny_grpo_config(straight, **{**half, "buffer.total_steps": 4}), straight + ".yaml")
    cfg = tiny_grpo_config(resumed, **{**half, "buffer.total_steps": 2})
    launch(cfg, resumed + ".yaml")
    assert os.path.isdir(os.path.join(resumed, "it", "run", "global_step_2", "model", "reference"))
    launch(cfg, resumed + ".yaml", "buffer.total_steps=4", "continue_from_checkpoint=true")
    _assert_resumed_like_straight(
        _train_steps(straight), _train_steps(resumed), ("actor/kl_loss",), (straight, resumed)
    )
    # half-way: the reference lags the policy, so the KL after the first step is not 0 (the control
    # that alpha 1's zeros above come from the sync, not from a KL that never moves)
    assert all(m["actor/kl_loss"] > 0 for m in _train_steps(straight)[1:])


def test_ppo_trains_its_critic_and_resumes_it(tmp_path):
    """PPO's critic in a real launch: during critic_warmup only the critic steps; through a
    checkpoint the critic's weights and optimizer come back (value losses and the policy's final
    weights equal the straight run's)."""
    ppo = {"algorithm.algorithm_type": "ppo", "algorithm.repeat_times": 2, "algorithm.lam": 0.9,
           "critic.critic_warmup": 1, "critic.optim.lr": 1e-3}  # fmt: skip

    def steps(root: str) -> list[dict]:
        return [m for m in read_metrics(os.path.join(root, "it", "run")) if "critic/vf_loss" in m]

    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    launch(tiny_grpo_config(straight, **{**ppo, "buffer.total_steps": 4}), straight + ".yaml")
    a = steps(straight)
    assert [m["step"] for m in a] == [1, 2, 3, 4]
    assert "actor/loss" not in a[0] and all("actor/loss" in m for m in a[1:])  # the warm-up step
    cfg = tiny_grpo_config(resumed, **{**ppo, "buffer.total_steps": 2})
    launch(cfg, resumed + ".yaml")
    assert os.path.isdir(os.path.join(resumed, "it", "run", "global_step_2", "model", "critic"))
    launch(cfg, resumed + ".yaml", "buffer.total_steps=4", "continue_from_checkpoint=true")
    keys = ("critic/vf_loss", "critic/vpred_mean", "critic/returns_mean")
    _assert_resumed_like_straight(a, steps(resumed), keys, (straight, resumed))


def test_dpo_stage_trains_on_generated_preference_pairs(tmp_path):
    """DPO in mode train: no rollouts, the pairs from the taskset; the policy learns to prefer the
    chosen responses (the implicit reward margin grows, the pair loss falls from log 2)."""
    root = str(tmp_path / "dpo")
    pairs = {"generator": "arithmetic", "path": os.path.join(root, "pairs.jsonl"),
             "generator_args": {"num_tasks": 64, "max_operand": 9, "preference_pairs": True}}  # fmt: skip
    cfg = tiny_grpo_config(
        root, **{"mode": "train", "algorithm.algorithm_type": "dpo", "algorithm.dpo.beta": 0.5,
                 "buffer.total_steps": 6, "buffer.explorer_input.taskset": pairs},
    )  # fmt: skip
    launch(cfg, root + ".yaml")
    steps = [m for m in read_metrics(os.path.join(root, "it", "run")) if "dpo/loss" in m]
    assert [m["step"] for m in steps] == [1, 2, 3, 4, 5, 6]
    assert abs(steps[0]["dpo/loss"] - 0.693147) < 1e-4  # the reference is the starting policy
    assert steps[-1]["dpo/loss"] < steps[0]["dpo/loss"] and steps[-1]["dpo/margin"] > 0


def test_mix_trains_on_rollouts_and_expert_rows_and_resumes_the_expert_stream(tmp_path):
    """mix in a real launch: each step adds the configured share of expert rows (here 0.5: as many
    as rollouts) to the policy loss's rollouts; a resumed run reads the same expert batches (the same
    expert NLL at every step) and ends on the same weights."""
    experts = {"path": "", "generator": "arithmetic", "generator_args": {"num_tasks": 64, "max_operand": 9}}
    mix = {"algorithm.algorithm_type": "mix", "algorithm.mix.mu": 0.5, "algorithm.repeat_times": 2}

    def config(root: str, steps: int) -> dict:
        ts = {**experts, "path": os.path.join(root, "experts.jsonl")}
        return tiny_grpo_config(root, **{**mix, "buffer.expert_taskset": ts, "buffer.total_steps": steps})

    def steps(root: str) -> list[dict]:
        return [m for m in read_metrics(os.path.join(root, "it", "run")) if "mix/expert_nll" in m]

    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    launch(config(straight, 4), straight + ".yaml")
    a = steps(straight)
    assert [m["mix/expert_rows"] for m in a] == [8.0] * 4  # 4 tasks x 2 rollouts, ratio 0.5
    assert all(m["mix/expert_nll"] > 0 and "actor/pg_loss" in m for m in a)
    launch(config(resumed, 2), resumed + ".yaml")
    launch(config(resumed, 2), resumed + ".yaml", "buffer.total_steps=4", "continue_from_checkpoint=true")
    _assert_resumed_like_straight(a, steps(resumed), ("mix/expert_nll",), (straight, resumed))
