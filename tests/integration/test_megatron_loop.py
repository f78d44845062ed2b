"""The whole training loop (rollouts, advantages, updates, weight sync to the engine, checkpoints,
HF export) on the megatron strategy with TP=2, against the same run on fsdp2, every case with the
test config's KL loss (reference log-probs on megatron): PPO whose critic is a second megatron
strategy in the same world, mix (expert rows beside the rollouts) with on-policy distillation from a
teacher (a third model), and MaxEnt-GRPO with a reference model that follows the policy. Plain GRPO (each case above is GRPO's loss plus one thing), GSPO,
OPMD and DAPO ran here too until CI time ran short: their losses and DAPO's rounds are core's and the loop's, computed
from the log-probs and gradients a strategy gives, which the cases above and the parity harness
(test_strategy_parity.py) compare; the fsdp2 side of each runs in test_algorithm_menu.py.

`rlcore launch` runs the fsdp2 run and writes its plan; the megatron run executes the same plan
(strategy switched) through tests/integration/megatron_worker.py, i.e. rlcore's own rank entry
point under the CPU shim. Mode colocate keeps the engine inside rank 0, so both runs sample with
the same seeds from whatever weights their strategy synced.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml
from safetensors.torch import load_file

from rlcore.core.config.schema import ScratchModelConfig
from rlcore.core.scratch_model import build_scratch_model

from .launch_utils import REPO, launch, read_metrics, tiny_grpo_config, torchrun

pytestmark = pytest.mark.integration

STEPS = 3


def _megatron_plan(plan: dict, run_dir: str, tp: int = 2) -> dict:
    """The fsdp2 run's plan with the strategy switched to megatron TP=`tp` and a fresh run folder."""
    stages = []
    for s in plan["stages"]:
        cfg = yaml.safe_load(s["config"])
        cfg["trainer"]["strategy"] = "megatron"
        cfg["trainer"]["megatron"]["tensor_model_parallel_size"] = tp
        stages.append({**s, "config": yaml.safe_dump(cfg)})
    return {**plan, "run_dir": run_dir, "run_address": None, "rollout_endpoints": [], "stages": stages}


def _both_runs(tmp_path, sections: dict, tp: int) -> tuple[str, str]:
    """The fsdp2 launch of tiny_grpo_config with `sections` (2 ranks, mode colocate), then its plan
    run again on megatron at TP=`tp`: the two runs' folders."""
    root = str(tmp_path / "fsdp2")
    cfg = tiny_grpo_config(
        root, **{"mode": "colocate", "buffer.total_steps": STEPS, "cluster.ranks_per_node": 2, **sections}
    )
    launch(cfg, root + ".yaml")
    fsdp2_dir = os.path.join(root, "it", "run")
    with open(os.path.join(fsdp2_dir, "launch", "plan.json")) as f:
        plan = json.load(f)
    megatron_dir = str(tmp_path / "megatron")
    os.makedirs(megatron_dir)
    plan_path = os.path.join(megatron_dir, "plan.json")
    with open(plan_path, "w") as f:
        json.dump(_megatron_plan(plan, megatron_dir, tp), f)
    cmd = torchrun(2, "tests.integration.megatron_worker", plan_path)
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return fsdp2_dir, megatron_dir


CASES: dict[str, dict] = {
    "ppo": {"algorithm.algorithm_type": "ppo"},  # a megatron critic beside the policy
    # expert micro-batches beside the rollouts' and a teacher's reverse KL in the advantages (below)
    "mix": {"algorithm.algorithm_type": "mix", "algorithm.distill_coef": 0.5},
    # the reference in the advantage, moved halfway to the policy after every step and checkpointed
    "maxent_grpo_ref_sync": {"algorithm.algorithm_type": "maxent_grpo", "algorithm.sync_ref_model": True,
                             "algorithm.ref_model_sync_steps": 1, "algorithm.ref_model_mixup_alpha": 0.5},
}  # fmt: skip


@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", list(CASES))
def test_loop_on_megatron_matches_fsdp2(tmp_path, case):
    root = str(tmp_path / "fsdp2")
    sections = dict(CASES[case])
    if case == "mix":
        sections["buffer.expert_taskset"] = {
            "path": os.path.join(root, "experts.jsonl"), "generator": "arithmetic",
            "generator_args": {"num_tasks": 64, "max_operand": 9},
        }  # fmt: skip
        teacher = str(tmp_path / "teacher")  # the student's shape and tokenizer, another seed
        build_scratch_model(teacher, ScratchModelConfig(
            enabled=True, hidden_size=64, num_layers=2, num_attention_heads=2, num_key_value_heads=2,
            intermediate_size=128,
        ), max_model_len=48, seed=5)  # fmt: skip
        sections["model.teacher_model_path"] = teacher
    fsdp2_dir, megatron_dir = _both_runs(
        tmp_path, {"model.scratch.num_key_value_heads": 2, **sections}, tp=2  # TP=2 splits the KV heads
    )

    a = [m for m in read_metrics(fsdp2_dir) if "actor/loss" in m]
    b = [m for m in read_metrics(megatron_dir) if "actor/loss" in m]
    assert [m["step"] for m in b] == [m["step"] for m in a] == list(range(1, STEPS + 1))
    assert a[0]["rollout/reward_std"] > 0, "degenerate batch: the loss would be trivially 0"
    # same first rollouts (same initial weights), same loss; later rollouts come from the weights
    # each strategy synced to the engine, so equal rewards mean equal synced weights
    assert abs(a[0]["actor/loss"] - b[0]["actor/loss"]) <= 1e-5
    for x, y in zip(a, b, strict=True):
        assert x["rollout/reward_mean"] == y["rollout/reward_mean"], (x["step"], x, y)
        assert abs(x["actor/loss"] - y["actor/loss"]) <= 1e-4, (x["step"], x["actor/loss"], y["actor/loss"])
        assert abs(x["actor/grad_norm"] - y["actor/grad_norm"]) <= 1e-3 * max(1.0, x["actor/grad_norm"])
        if case == "ppo":  # the critic's values feed the advantages, so the losses above agree too
            assert abs(x["critic/vf_loss"] - y["critic/vf_loss"]) <= 1e-4, (x["step"], x, y)
        if case == "mix":
            assert abs(x["mix/expert_nll"] - y["mix/expert_nll"]) <= 1e-4, (x["step"], x, y)
            assert x["distill/reverse_kl"] != 0.0
            assert abs(x["distill/reverse_kl"] - y["distill/reverse_kl"]) <= 1e-4, (x["step"], x, y)

    # the loop's checkpoint and final HF export came out of the megatron strategy
    final = f"global_step_{STEPS}"
    assert os.path.isfile(os.path.join(megatron_dir, final, "model", "metadata.json"))
    extra = {"ppo": "critic", "maxent_grpo_ref_sync": "reference"}.get(case)
    if extra is not None:
        assert os.path.isfile(os.path.join(megatron_dir, final, "model", extra, "metadata.json"))
    wa = load_file(os.path.join(fsdp2_dir, final, "hf", "model.safetensors"))
    wb = load_file(os.path.join(megatron_dir, final, "hf", "model.safetensors"))
    assert wa.keys() == wb.keys()
    for name in wa:
        assert (wa[name] - wb[name]).abs().max().item() <= 1e-4, name


@pytest.mark.timeout(900)
def test_r2_and_the_router_aux_loss_on_megatron_train_as_on_fsdp2(tmp_path):
    """algorithm.router_replay r2 and trainer.router_aux_loss_coef on a tiny Qwen3-MoE, 2 mini-batches
    a step (the second one's update after the first moved the weights, the learning rate raised so
    the routers move): megatron-core's routers record the old-log-prob pass and replay it in each
    update as transformers' do on fsdp2, and the load-balancing loss joins each update the same way,
    step for step (the same losses, gradient norms, rewards, aux loss and share of replayed routes the
    updated router would have changed, which is not 0)."""
    fsdp2_dir, megatron_dir = _both_runs(
        tmp_path,
        {"model.scratch.architecture": "qwen3_moe", "model.scratch.num_experts": 4,
         "model.scratch.num_experts_per_tok": 2, "model.scratch.num_key_value_heads": 1,
         "algorithm.router_replay": "r2", "algorithm.optimizer.lr": 0.02, "buffer.train_batch_size": 8,
         "trainer.router_aux_loss_coef": 0.1},
        tp=1,
    )  # fmt: skip
    a = [m for m in read_metrics(fsdp2_dir) if "actor/loss" in m]
    b = [m for m in read_metrics(megatron_dir) if "actor/loss" in m]
    assert len(a) == len(b) == STEPS
    assert max(m["actor/routing_drift"] for m in a) > 0, a
    for x, y in zip(a, b, strict=True):
        assert x["rollout/reward_mean"] == y["rollout/reward_mean"], (x, y)
        assert abs(x["actor/loss"] - y["actor/loss"]) <= 1e-4, (x["actor/loss"], y["actor/loss"])
        assert abs(x["actor/routing_drift"] - y["actor/routing_drift"]) <= 0.02, (x, y)
        assert abs(x["actor/router_aux_loss"] - y["actor/router_aux_loss"]) <= 1e-5, (x, y)
        assert x["actor/router_aux_loss"] > 0.9  # about 1 (balanced routing) at this size
        assert abs(x["actor/grad_norm"] - y["actor/grad_norm"]) <= 1e-3 * max(1.0, x["actor/grad_norm"])
