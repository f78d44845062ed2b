"""fsdp2 with 2 gloo ranks trains exactly like 1 rank; gradient checkpointing gives the same loss.
(A loop resumed from its checkpoint ending on the straight run's weights: test_algorithm_menu.py,
for GRPO with a critic, with expert rows and with a reference that moves.)"""

import os

import pytest

from .launch_utils import launch, read_metrics, tiny_grpo_config

pytestmark = pytest.mark.integration


def first_train_step(run_dir: str) -> dict:
    return next(m for m in read_metrics(run_dir) if "actor/loss" in m)


@pytest.fixture(scope="module")
def one_rank_first_step(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The first step of a plain one-rank run (both tests below compare with it)."""
    root = str(tmp_path_factory.mktemp("one-rank"))
    launch(tiny_grpo_config(root, **{"buffer.total_steps": 1}), root + ".yaml")
    return first_train_step(os.path.join(root, "it", "run"))


def test_two_ranks_match_one_rank_first_step(tmp_path, one_rank_first_step):
    root = str(tmp_path / "r2")
    launch(tiny_grpo_config(root, **{"buffer.total_steps": 1, "cluster.ranks_per_node": 2}), root + ".yaml")
    one, two = one_rank_first_step, first_train_step(os.path.join(root, "it", "run"))
    # Same experiences (rank 0 generates in both runs) ...
    assert one["rollout/reward_mean"] == two["rollout/reward_mean"]
    assert one["rollout/reward_std"] > 0, "degenerate batch: all rewards equal, the loss would be trivially 0"
    # ... and the same loss and gradient norm, whatever the number of ranks.
    assert abs(one["actor/loss"] - two["actor/loss"]) < 1e-5
    assert abs(one["actor/pg_loss"] - two["actor/pg_loss"]) < 1e-5
    assert abs(one["actor/grad_norm"] - two["actor/grad_norm"]) < 1e-4 * max(1.0, one["actor/grad_norm"])


def test_gradient_checkpointing_same_loss_and_old_checkpoints_pruned(tmp_path, one_rank_first_step):
    ckpt = str(tmp_path / "ckpt")
    cfg = tiny_grpo_config(
        ckpt,
        **{"buffer.total_steps": 3, "trainer.gradient_checkpointing": True, "trainer.save_interval": 1,
           "trainer.max_checkpoints_to_keep": 2, "trainer.save_hf_checkpoint": "never"},
    )  # fmt: skip
    launch(cfg, ckpt + ".yaml")
    a, b = one_rank_first_step, first_train_step(os.path.join(ckpt, "it", "run"))
    assert abs(a["actor/loss"] - b["actor/loss"]) < 1e-6
    assert abs(a["actor/grad_norm"] - b["actor/grad_norm"]) < 1e-5
    run_dir = os.path.join(ckpt, "it", "run")
    assert sorted(d for d in os.listdir(run_dir) if d.startswith("global_step_")) == [
        "global_step_2",
        "global_step_3",
    ]
    assert not os.path.exists(os.path.join(run_dir, "global_step_3", "hf"))
    assert open(os.path.join(run_dir, "latest")).read().strip() == "global_step_3"


def test_kl_in_reward_with_adaptive_controller(tmp_path):
    root = str(tmp_path)
    cfg = tiny_grpo_config(
        root,
        **{"algorithm.use_kl_in_reward": True, "algorithm.kl_ctrl": {"type": "adaptive", "kl_coef": 0.1},
           "buffer.total_steps": 3},
    )  # fmt: skip
    launch(cfg, root + ".yaml")
    steps = [m for m in read_metrics(os.path.join(root, "it", "run")) if "rollout/kl_penalty" in m]
    assert steps[0]["rollout/kl_penalty"] == 0.0  # the policy starts equal to the reference
    # after one update the policy has moved; the penalty is a sampled k1 estimate, so its sign is
    # the sample's (with this seed's rollouts it is negative)
    assert steps[1]["rollout/kl_penalty"] != 0.0
    # KL below target_kl (0.1 per sequence at first) makes the adaptive coefficient shrink
    assert steps[2]["rollout/kl_coef"] < steps[1]["rollout/kl_coef"] < steps[0]["rollout/kl_coef"] == 0.1
