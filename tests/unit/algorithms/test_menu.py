"""The algorithm menu: presets by name, advantages and the GSPO loss against values worked out by
hand, and the one-line errors for names and combinations that cannot train."""

from __future__ import annotations

import math

import pytest
import torch
import yaml

from rlcore.core.algorithms import ALGORITHMS, with_preset
from rlcore.core.algorithms.aggregation import LossNorm
from rlcore.core.algorithms.grpo import dr_grpo_advantages
from rlcore.core.algorithms.gspo import gspo_terms
from rlcore.core.algorithms.losses import PolicyLoss
from rlcore.core.algorithms.reinforce import (
    reinforce_plus_plus_baseline_advantages,
    reinforce_plus_plus_baseline_per_response_advantages,
)
from rlcore.core.algorithms.rloo import rloo_advantages
from rlcore.core.algorithms.scored import ScoredBatch
from rlcore.core.config import ConfigError, load_config, resolve_stages
from rlcore.core.config.schema import AlgorithmConfig

GROUPS = ["a", "a", "a", "b", "b", "c"]
REWARDS = torch.tensor([1.0, 0.0, 0.5, 1.0, 1.0, 0.7])


def test_dr_grpo_centres_without_dividing() -> None:
    # group a: mean 0.5 -> 0.5, -0.5, 0; group b all equal -> 0; group c of one -> 0
    assert dr_grpo_advantages(ScoredBatch(REWARDS, GROUPS)).tolist() == [0.5, -0.5, 0.0, 0.0, 0.0, 0.0]


def test_rloo_subtracts_the_mean_of_the_others() -> None:
    # r_0 = 1 against (0 + 0.5)/2 = 0.25 -> 0.75; r_1 = 0 against 0.75 -> -0.75; r_2 = 0.5 against 0.5 -> 0
    got = rloo_advantages(ScoredBatch(REWARDS, GROUPS)).tolist()
    assert got == pytest.approx([0.75, -0.75, 0.0, 0.0, 0.0, 0.0])


def test_reinforce_plus_plus_baseline_whitens_over_the_batchs_tokens_as_the_paper_does() -> None:
    """The paper's Algorithm 1 (and verl, OpenRLHF): group-centred rewards, whitened over every
    trained token; lengths [2, 10, 10, 10 | 3, 3, 10, 4] weigh each response by its tokens."""
    lengths = [2, 10, 10, 10, 3, 3, 10, 4]
    mask = torch.zeros(8, 10)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1.0
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    batch = ScoredBatch(rewards, ["a"] * 4 + ["b"] * 4, response_mask=mask)
    adv = reinforce_plus_plus_baseline_advantages(batch)
    # by hand: centred a = [.75, -.25, -.25, -.25, .25, .25, -.75, .25]; over the 52 tokens
    centred = [0.75, -0.25, -0.25, -0.25, 0.25, 0.25, -0.75, 0.25]
    tokens = [c for c, n in zip(centred, lengths, strict=True) for _ in range(n)]
    mean = sum(tokens) / len(tokens)
    std = math.sqrt(sum((t - mean) ** 2 for t in tokens) / (len(tokens) - 1))
    expected = [(c - mean) / (std + 1e-6) for c in centred]
    assert [float(adv[i, 0]) for i in range(8)] == pytest.approx(expected, abs=1e-6)
    assert [round(x, 2) for x in expected] == [2.61, -0.10, -0.10, -0.10, 1.25, 1.25, -1.46, 1.25]
    assert float((adv * (1 - mask)).abs().sum()) == 0.0  # nothing past a response's end
    assert torch.allclose(adv[0, :2], adv[0, 0].expand(2))  # one value per response, on each token


def test_reinforce_plus_plus_baseline_per_response_counts_each_response_once() -> None:
    centred = [0.5, -0.5, 0.0, 0.0, 0.0, 0.0]  # group mean subtracted (dr_grpo's values)
    mean = sum(centred) / 6
    std = math.sqrt(sum((c - mean) ** 2 for c in centred) / 5)  # unbiased, as torch.std
    expected = [(c - mean) / (std + 1e-6) for c in centred]
    fn = reinforce_plus_plus_baseline_per_response_advantages
    assert fn(ScoredBatch(REWARDS, GROUPS)).tolist() == pytest.approx(expected)
    assert fn(ScoredBatch(torch.tensor([1.0, 1.0]), ["a", "a"])).tolist() == [0.0, 0.0]


def test_gspo_clips_whole_sequences_by_their_length_normalised_ratio() -> None:
    # row 0: log-ratios 0.1, 0.3 over 2 tokens -> s = exp(0.2); row 1: one token, log-ratio -0.05 (the rest masked)
    old = torch.zeros(2, 3)
    logprobs = torch.tensor([[0.1, 0.3, 0.0], [-0.05, 0.0, 9.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([[1.0, 1.0, 0.0], [-2.0, 0.0, 0.0]])
    loss, clipped = gspo_terms(
        logprobs, old, adv, mask, AlgorithmConfig(clip_ratio_low=0.1, clip_ratio_high=0.1)
    )
    s0, s1 = math.exp(0.2), math.exp(-0.05)
    # row 0: A > 0, s0 = 1.22 > 1.1 -> clipped at 1.1; row 1: A < 0, s1 = 0.95 inside [0.9, 1.1] -> 2 s1
    assert loss[0, :2].tolist() == pytest.approx([-1.1, -1.1])
    assert loss[1, 0].item() == pytest.approx(2 * s1)
    assert clipped[0, :2].tolist() == [1.0, 1.0] and clipped[1, 0].item() == 0.0
    (loss * mask).sum().backward()
    # the clipped row has no gradient; the other's is A * s (its ratio) on its one token
    assert logprobs.grad is not None
    assert logprobs.grad[0].tolist() == [0.0, 0.0, 0.0]
    assert logprobs.grad[1, 0].item() == pytest.approx(2 * s1)
    assert s0 > 1.1


def test_gspo_preset_and_loss() -> None:
    cfg = with_preset(AlgorithmConfig(algorithm_type="gspo", kl_loss_fn="none"))
    assert (cfg.advantage_fn, cfg.policy_loss_fn, cfg.loss_agg_mode) == (
        "grpo",
        "gspo",
        "seq-mean-token-mean",
    )
    assert (cfg.clip_ratio_low, cfg.clip_ratio_high) == (3e-4, 4e-4)
    mask = torch.ones(1, 2)
    batch = {"loss_mask": mask, "advantages": torch.ones(1, 2), "old_logprobs": torch.zeros(1, 2)}
    loss, metrics = PolicyLoss(cfg, LossNorm.local(mask, 2))(torch.zeros(1, 2), None, batch)
    assert loss.item() == pytest.approx(-1.0) and metrics["actor/pg_clipfrac"] == 0.0
    # a knob the config sets wins over the preset's
    assert with_preset(AlgorithmConfig(algorithm_type="gspo", clip_ratio_low=0.1)).clip_ratio_low == 0.1


def test_every_preset_names_registered_parts() -> None:
    from rlcore.core.algorithms import ADVANTAGE_FNS, POLICY_LOSS_FNS

    for name, spec in ALGORITHMS.items():
        if spec.advantage_fn is not None:
            assert callable(ADVANTAGE_FNS.resolve(spec.advantage_fn)), name
        if spec.policy_loss_fn is not None:
            assert callable(POLICY_LOSS_FNS.resolve(spec.policy_loss_fn)), name


def _validate(
    tmp_path, trainer: dict | None = None, mode: str = "both", keep_taskset: bool = False, **algorithm
) -> None:
    (tmp_path / "m").mkdir(exist_ok=True)
    if not keep_taskset:
        (tmp_path / "t.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    path = tmp_path / "c.yaml"
    cfg = {"model": {"model_path": str(tmp_path / "m")}, "algorithm": algorithm, "trainer": trainer or {},
           "mode": mode, "buffer": {"explorer_input": {"taskset": {"path": str(tmp_path / "t.jsonl")}}}}  # fmt: skip
    path.write_text(yaml.safe_dump(cfg))
    resolve_stages(load_config(str(path), []))


def test_bad_names_and_combinations_are_one_line_errors(tmp_path) -> None:
    with pytest.raises(
        ConfigError, match=r"algorithm\.algorithm_type must be one of grpo, dr_grpo, rloo, .*; got 'ppo2'"
    ):
        _validate(tmp_path, algorithm_type="ppo2")
    with pytest.raises(ConfigError, match=r"algorithm\.advantage_fn must be one of grpo, .*; got 'gea'"):
        _validate(tmp_path, advantage_fn="gea")
    with pytest.raises(
        ConfigError, match=r"algorithm\.advantage_fn: gae needs a critic's values, and grpo trains none"
    ):
        _validate(tmp_path, advantage_fn="gae")
    _validate(tmp_path, algorithm_type="ppo", trainer={"strategy": "megatron"})  # a value head there too
    _validate(tmp_path, algorithm_type="ppo", repeat_times=1)
    with pytest.raises(
        ConfigError, match=r"algorithm\.repeat_times is 1, but rloo .*set algorithm\.repeat_times to 2"
    ):
        _validate(tmp_path, algorithm_type="rloo", repeat_times=1)
    _validate(tmp_path, algorithm_type="rloo", repeat_times=2)
    with pytest.raises(ConfigError, match=r"algorithm\.dynamic_sampling .* set repeat_times to 2 or more"):
        _validate(tmp_path, algorithm_type="reinforce_plus_plus", repeat_times=1, dynamic_sampling=True)
    with pytest.raises(
        ConfigError, match=r"algorithm\.overlong_buffer_len is 512, but responses may have only 512"
    ):
        _validate(tmp_path, algorithm_type="dapo", overlong_buffer_len=512)
    for name in ("reinforce_plus_plus", "dapo", "opmd", "maxent_grpo"):
        _validate(tmp_path, algorithm_type=name)


def test_dpo_runs_in_mode_train_on_pairs_only(tmp_path) -> None:
    (tmp_path / "t.jsonl").write_text('{"prompt": "1+1=", "answer": "2", "chosen": "2", "rejected": "3"}\n')
    with pytest.raises(
        ConfigError,
        match=r"mode 'both' explores, and algorithm\.algorithm_type dpo trains on the taskset's own pairs",
    ):
        _validate(tmp_path, algorithm_type="dpo", keep_taskset=True)
    with pytest.raises(  # mode train with grpo reads a decoupled run's buffer; mode explore writes rollouts
        ConfigError,
        match=r"mode explore writes rollouts for an RL algorithm; algorithm\.algorithm_type dpo .*"
        r" \(or algorithm\.dpo\.pairs buffer: DPO on pairs it explores\)$",
    ):
        _validate(tmp_path, algorithm_type="dpo", mode="explore", keep_taskset=True)
    # the taskset has no chosen/rejected columns
    with pytest.raises(
        ConfigError,
        match=r"row 1 has no 'chosen' column \(the chosen; buffer\.explorer_input\.taskset\.format\.chosen_key",
    ):
        _validate(tmp_path, mode="train", algorithm_type="dpo")
    (tmp_path / "t.jsonl").write_text(
        '{"prompt": "1+1=", "answer": "2", "chosen": "2", "rejected": [{"role": "user", "content": "x"}]}\n'
    )
    with pytest.raises(
        ConfigError, match=r"the rejected \('rejected'\) is a list, neither text nor chat messages"
    ):
        _validate(tmp_path, mode="train", algorithm_type="dpo", keep_taskset=True)
    (tmp_path / "t.jsonl").write_text(
        '{"prompt": "1+1=", "answer": "2", "chosen": "2", "rejected": [{"role": "assistant", "content": "3"}]}\n'
    )
    _validate(tmp_path, mode="train", algorithm_type="dpo", keep_taskset=True)


def test_mix_needs_an_expert_taskset_which_a_stage_may_set(tmp_path) -> None:
    with pytest.raises(
        ConfigError,
        match=r"algorithm_type mix also trains on expert demonstrations: set buffer\.expert_taskset",
    ):
        _validate(tmp_path, algorithm_type="mix")
    (tmp_path / "m").mkdir(exist_ok=True)
    (tmp_path / "t.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    (tmp_path / "e.jsonl").write_text(
        '{"prompt": "1+1=", "response": "2"}\n'
    )  # no answer: experts are not scored
    expert = {"path": str(tmp_path / "e.jsonl"), "generator_args": {"part": "train"}}
    cfg = {"model": {"model_path": str(tmp_path / "m")},
           "buffer": {"explorer_input": {"taskset": {"path": str(tmp_path / "t.jsonl")}}},
           "stages": [{"name": "a", "algorithm": {"algorithm_type": "grpo"}},
                      {"name": "b", "algorithm": {"algorithm_type": "mix"}, "buffer": {"expert_taskset": expert}}]}  # fmt: skip
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    stages = resolve_stages(load_config(str(path), []))
    assert stages[0].config.buffer.expert_taskset is None
    assert stages[1].config.buffer.expert_taskset.generator_args == {"part": "train"}
    (tmp_path / "e.jsonl").write_text('{"prompt": "1+1="}\n')
    with pytest.raises(ConfigError, match=r"buffer\.expert_taskset: .* row 1 has no 'response' column"):
        resolve_stages(load_config(str(path), []))
