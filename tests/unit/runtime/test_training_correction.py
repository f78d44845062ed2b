"""Masked importance sampling as verl's rejection sampling, through the trainer's own steps
(runtime/training.py): the tokens it rejects leave the loss mask, the loss's terms (the KL term
too) and the counts the loss divides by, the same however the rows are split into micro-batches
(over data-parallel ranks: tests/integration/test_rejection_ranks.py); and a real step on the
scratch model divides by the post-rejection count."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
import yaml

from rlcore.core.algorithms.aggregation import LossNorm
from rlcore.core.algorithms.correction import correct
from rlcore.core.algorithms.losses import PolicyLoss
from rlcore.core.batch import Sequence, micro_batches
from rlcore.core.config import load_config, resolve_stages
from rlcore.core.config.plan import filled
from rlcore.core.config.schema import AlgorithmConfig, RolloutCorrectionConfig
from rlcore.core.types import Experience
from rlcore.runtime.scoring import Local
from rlcore.runtime.training import StageTraining, loss_norm, reject_tokens, sequence_spec

ENGINE = -2.0
"""Every response token's engine log-prob; the recomputed old log-prob is ENGINE + log r."""
RATIOS = {"a": [1.5, 3.0, 0.6, 1.0], "b": [1.0, 1.2]}
"""Token ratios r = pi_old / pi_engine of two responses: at C = 2 (low 1/2) token level, a's 3.0 is
rejected; at sequence level a's product 2.7 is, and b's 1.2 is kept."""
ADVANTAGES = {"a": 1.0, "b": -2.0}


@pytest.fixture()
def world():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def rows_named(names: list[str]) -> list[Sequence]:
    return [
        Sequence([5], [6 + t for t in range(len(RATIOS[n]))], [ENGINE] * len(RATIOS[n]), index=i)
        for i, n in enumerate(names)
    ]


def scored_local(names: list[str], seqs: list[Sequence], split: bool, cfg: RolloutCorrectionConfig) -> Local:
    """This rank's micro-batches of `seqs` (named `names`), corrected as StageTraining._score does
    (recomputed old log-probs against the engine's), with their advantages placed."""
    groups = [[s] for s in seqs] if split else [seqs]
    mbs = micro_batches(groups, 0, template=seqs[0])
    names_of = {s.index: n for s, n in zip(seqs, names, strict=True)}
    for mb, group in zip(mbs, groups, strict=True):
        old = mb["old_logprobs"].clone()
        for r, s in enumerate(group):
            n = names_of[s.index]
            old[r, 1 : 1 + len(RATIOS[n])] += torch.tensor(RATIOS[n]).log()
            mb["advantages"][r] = mb["loss_mask"][r] * ADVANTAGES[n]
        correct(mb, old, cfg)
        mb["old_logprobs"] = old
    return [(mbs, [[s.index for s in g] for g in groups])]


def loss_and_grads(
    local: Local, norm: LossNorm, algo: AlgorithmConfig, ref_shift: float = 0.0
) -> tuple[float, list[torch.Tensor]]:
    """The summed loss over the micro-batches at pi = pi_old (ratio 1), and each one's log-prob
    gradients; the reference sits `ref_shift` below the policy."""
    total, grads = 0.0, []
    for mb in local[0][0]:
        lp = mb["old_logprobs"].clone().requires_grad_(True)
        loss, _ = PolicyLoss(algo, norm)(lp, None, {**mb, "ref_logprobs": mb["old_logprobs"] - ref_shift})
        loss.backward()
        total += float(loss.detach())
        assert lp.grad is not None
        grads.append(lp.grad)
    return total, grads


def test_masked_is_rejects_a_token_from_the_loss_and_its_count(world) -> None:
    """verl's rejection sampling on ratios [1.5, 3.0, 0.6, 1.0] at C = 2, advantage 1: -(1 + 1 + 1) / 3."""
    seqs = rows_named(["a"])
    local = scored_local(
        ["a"], seqs, split=False, cfg=RolloutCorrectionConfig(kind="mis", level="token", high=2.0)
    )
    reject_tokens(local, seqs, None)
    assert seqs[0].loss_mask == [1, 0, 1, 1]
    norm = loss_norm(seqs, max_response_len=4)
    assert (norm.num_tokens, norm.num_seqs) == (3.0, 1.0)
    algo = AlgorithmConfig(algorithm_type="grpo", kl_loss_fn="k3", kl_loss_coef=0.1)
    loss, _ = loss_and_grads(local, norm, algo)
    assert loss == -1.0  # exactly: the KL term is 0 at pi = pi_ref
    # with the reference elsewhere the KL term has a gradient on every kept token, none on the rejected one
    _, (grad,) = loss_and_grads(local, norm, algo, ref_shift=0.5)
    kept = (-1.0 + 0.1 * (1.0 - math.exp(-0.5))) / 3  # d/dlp of (-A r + 0.1 k3) / 3 at r = 1
    assert grad[0, 1:5].tolist() == pytest.approx([kept, 0.0, kept, kept], rel=1e-6)
    assert grad[0, 2] == 0.0


@pytest.mark.parametrize("split", [False, True])
def test_the_post_rejection_counts_are_the_same_however_the_rows_are_split(world, split: bool) -> None:
    # token level: a keeps 3 tokens (A = 1), b its 2 (A = -2): (-3 + 4) / 5
    seqs = rows_named(["a", "b"])
    local = scored_local(
        ["a", "b"], seqs, split, RolloutCorrectionConfig(kind="mis", level="token", high=2.0)
    )
    reject_tokens(local, seqs, None)
    algo = AlgorithmConfig(algorithm_type="grpo", kl_loss_coef=0.0, loss_agg_mode="token-mean")
    assert loss_and_grads(local, loss_norm(seqs, 4), algo)[0] == pytest.approx(0.2, rel=1e-6)
    # sequence level: a's product 2.7 > 2 leaves whole, and leaves the response count; b's mean is 2
    seqs = rows_named(["a", "b"])
    local = scored_local(
        ["a", "b"], seqs, split, RolloutCorrectionConfig(kind="mis", level="sequence", high=2.0)
    )
    reject_tokens(local, seqs, None)
    norm = loss_norm(seqs, 4)
    assert (norm.num_tokens, norm.num_seqs) == (2.0, 1.0)
    algo = AlgorithmConfig(algorithm_type="grpo", kl_loss_coef=0.0, loss_agg_mode="seq-mean-token-mean")
    loss, grads = loss_and_grads(local, norm, algo)
    assert loss == pytest.approx(2.0, rel=1e-6)
    assert float(grads[0][0].abs().sum()) == 0.0  # a's row (the first of the first micro-batch): no gradient


def test_a_step_divides_by_the_tokens_rejection_sampling_kept(tiny_model_path, tmp_path, world) -> None:
    """A real step on the scratch model: four 4-token responses, one with ratios [1.5, 3.0, 0.6, 1.0]
    (the others 1), dr_grpo's advantages +-1/2 averaged over the 15 kept tokens."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"prompt": "1+1=", "answer": "2"}\n' * 4)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({
        "model": {"model_path": tiny_model_path, "max_prompt_tokens": 8, "max_response_tokens": 4},
        "cluster": {"device": "cpu"},
        "algorithm": {"repeat_times": 2, "advantage_fn": "dr_grpo", "loss_agg_mode": "token-mean",
                      "rollout_correction": {"kind": "mis", "level": "token", "high": 2.0}},
        "buffer": {"batch_size": 2, "explorer_input": {"taskset": {"path": str(tasks)}}},
    }))  # fmt: skip
    stage = resolve_stages(load_config(str(path), []))[0]
    training = StageTraining(
        filled(stage.config), str(tmp_path / "stage"), tiny_model_path, "cpu", 2, stage.plan.passes
    )
    prompt, response = [5, 6, 7], [8, 9, 10, 11]
    spec = sequence_spec(prompt, response, [], [0.0], None)
    (old,) = training.logprobs([spec], training.temperature, reference=False)
    ratios = [RATIOS["a"]] + [[1.0] * 4] * 3
    exps = [
        Experience(prompt, response, [o - math.log(r) for o, r in zip(old, rs, strict=True)], reward=float(i % 2),
                   group_id=f"g{i // 2}")
        for i, rs in enumerate(ratios)
    ]  # fmt: skip
    metrics = training.train_experiences(exps)
    assert metrics["rollout_correction/tokens_masked"] == pytest.approx(1 / 16)
    assert metrics["rollout_correction/seqs_masked"] == pytest.approx(1 / 4)
    # A = -1/2 on rows 0 and 2, +1/2 on 1 and 3: -(3 * -1/2 + 4 / 2 - 4 / 2 + 4 / 2) / 15 at ratio 1
    assert metrics["actor/pg_loss"] == pytest.approx(-0.5 / 15, rel=1e-4)
