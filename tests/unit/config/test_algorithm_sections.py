"""The knobs one algorithm reads live in its section of `algorithm` (opmd, maxent_grpo, mix, dpo): the
old flat keys (algorithm.dpo_beta) still load, each with a one-line note; a section set where no
algorithm reads it is refused in one line."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from rlcore.core.config import ConfigError, load_config, resolve_stages
from rlcore.core.config.moved_keys import MOVED
from rlcore.core.config.schema import ALGORITHM_SECTIONS, AlgorithmConfig

from .minimal import resolve


def _stages(tmp_path, cfg: dict, *overrides: str) -> list:
    (tmp_path / "m").mkdir(exist_ok=True)
    row = '{"prompt": "1+1=", "answer": "2", "response": "2", "chosen": "2", "rejected": "3"}'
    (tmp_path / "t.jsonl").write_text(row + "\n")
    base = {"model": {"model_path": str(tmp_path / "m")}, "checkpoint_root_dir": str(tmp_path),
            "buffer": {"explorer_input": {"taskset": {"path": str(tmp_path / "t.jsonl")}}}}  # fmt: skip
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**base, **cfg}))
    return resolve_stages(load_config(str(path), list(overrides)))


def test_every_moved_key_lands_in_its_section_with_a_note(tmp_path, capsys) -> None:
    default = AlgorithmConfig()
    for old, (section, key) in MOVED.items():
        assert section in ALGORITHM_SECTIONS and hasattr(getattr(default, section), key), old
        assert not hasattr(default, old), f"algorithm.{old} is still a field of its own"
    # each old key, given a value other than its default, in the recipe and as an override
    changed = {"opmd_tau": 2.0, "opmd_baseline": "logavgexp"}
    cfg = _stages(tmp_path, {"algorithm": {"algorithm_type": "opmd", **changed}})[0].config
    assert (cfg.algorithm.opmd.tau, cfg.algorithm.opmd.baseline) == (2.0, "logavgexp")
    notes = capsys.readouterr().err.splitlines()
    assert sorted(notes) == [
        f"rlcore: note: {tmp_path / 'c.yaml'}: algorithm.opmd_baseline is algorithm.opmd.baseline now (the old "
        "key still works; write the new one)",
        f"rlcore: note: {tmp_path / 'c.yaml'}: algorithm.opmd_tau is algorithm.opmd.tau now (the old key still "
        "works; write the new one)",
    ]
    cfg = resolve(tmp_path, "algorithm.algorithm_type=maxent_grpo", "algorithm.maxent_tau=0.7",
                  "algorithm.maxent_q_temperature=3", "algorithm.maxent_q_epsilon=0.01",
                  "algorithm.maxent_length_normalize_ref=false")  # fmt: skip
    assert dataclasses.astuple(cfg.algorithm.maxent_grpo) == (0.7, 3.0, 0.01, False)
    assert (
        "rlcore: note: override: algorithm.maxent_tau is algorithm.maxent_grpo.tau now"
        in capsys.readouterr().err
    )
    cfg = resolve(
        tmp_path,
        "algorithm.algorithm_type=mix",
        f"buffer.expert_taskset.path={tmp_path / 't.jsonl'}",
        "algorithm.mix_mu=0.3",
        "algorithm.mix_expert_ratio=0.25",
    )
    assert (cfg.algorithm.mix.mu, cfg.algorithm.mix.expert_ratio) == (0.3, 0.25)
    dpo = {"mode": "train", "algorithm": {"algorithm_type": "dpo"}}
    cfg = _stages(tmp_path, dpo, "algorithm.dpo_beta=0.5", "algorithm.dpo_label_smoothing=0.1",
                  "algorithm.dpo_nll_coef=1", "algorithm.dpo_nll_norm=batch_tokens")[0].config  # fmt: skip
    assert (cfg.algorithm.dpo.beta, cfg.algorithm.dpo.label_smoothing) == (0.5, 0.1)
    assert (cfg.algorithm.dpo.nll_coef, cfg.algorithm.dpo.nll_norm) == (1.0, "batch_tokens")


def test_a_stages_old_key_moves_within_that_stage(tmp_path, capsys) -> None:
    stages = [{"name": "sft", "mode": "train", "algorithm": {"algorithm_type": "sft"}},
              {"name": "dpo", "mode": "train", "algorithm": {"algorithm_type": "dpo", "dpo_beta": 0.4}}]  # fmt: skip
    resolved = _stages(tmp_path, {"stages": stages}, "stages.1.algorithm.dpo_nll_coef=2")
    assert (resolved[1].config.algorithm.dpo.beta, resolved[1].config.algorithm.dpo.nll_coef) == (0.4, 2.0)
    assert resolved[0].config.algorithm.dpo == AlgorithmConfig().dpo
    err = capsys.readouterr().err
    assert "stages[1].algorithm.dpo_beta is stages[1].algorithm.dpo.beta now" in err
    assert "override: stages[1].algorithm.dpo_nll_coef is stages[1].algorithm.dpo.nll_coef now" in err


def test_a_key_given_both_ways_with_two_values_is_refused(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"algorithm\.dpo_beta \(0\.3\) and algorithm\.dpo\.beta \(0\.2\) are "
                       r"the same setting: keep algorithm\.dpo\.beta$"):  # fmt: skip
        _stages(
            tmp_path,
            {"mode": "train", "algorithm": {"algorithm_type": "dpo", "dpo_beta": 0.3, "dpo": {"beta": 0.2}}},
        )
    # the same value both ways is one setting
    cfg = _stages(
        tmp_path,
        {"mode": "train", "algorithm": {"algorithm_type": "dpo", "dpo_beta": 0.2, "dpo": {"beta": 0.2}}},
    )
    assert cfg[0].config.algorithm.dpo.beta == 0.2


def test_a_section_no_algorithm_reads_is_refused_in_one_line(tmp_path) -> None:
    with pytest.raises(
        ConfigError,
        match=r"^algorithm\.dpo\.beta: algorithm\.dpo is read only by training on pairs \(algorithm_type dpo's\), "
        r"and algorithm\.algorithm_type is grpo \(it would change nothing\): set algorithm\.algorithm_type dpo, "
        r"or drop algorithm\.dpo$",
    ):
        resolve(tmp_path, "algorithm.dpo.beta=0.2")
    with pytest.raises(ConfigError, match=r"^algorithm\.opmd\.tau: algorithm\.opmd is read only by advantage_fn "
                       r"opmd or policy_loss_fn opmd "):  # fmt: skip
        resolve(tmp_path, "algorithm.algorithm_type=maxent_grpo", "algorithm.opmd_tau=2")
    with pytest.raises(
        ConfigError, match=r"^algorithm\.mix\.mu: algorithm\.mix is read only by the experts pass "
    ):
        resolve(tmp_path, "algorithm.mix.mu=0.2")
    with pytest.raises(ConfigError, match=r"^algorithm\.maxent_grpo\.tau: "):
        _stages(
            tmp_path, {"mode": "train", "algorithm": {"algorithm_type": "dpo", "maxent_grpo": {"tau": 1.0}}}
        )
    # read: by the algorithm_type, or by a part put in its place; its defaults spelt out change nothing
    assert resolve(tmp_path, "algorithm.advantage_fn=opmd", "algorithm.opmd.tau=2").algorithm.opmd.tau == 2.0
    assert resolve(tmp_path, "algorithm.dpo.beta=0.1").algorithm.algorithm_type == "grpo"


def test_a_stage_may_set_only_the_sections_its_algorithm_reads(tmp_path) -> None:
    stages = [{"name": "sft", "mode": "train", "algorithm": {"algorithm_type": "sft", "dpo": {"beta": 0.3}}},
              {"name": "rl"}]  # fmt: skip
    with pytest.raises(ConfigError, match=r"^stages\[0\]\.algorithm\.dpo\.beta: algorithm\.dpo is read only by "
                       r"training on pairs \(algorithm_type dpo's\), and algorithm\.algorithm_type is sft "):  # fmt: skip
        _stages(tmp_path, {"stages": stages})
    # set run-wide, a section is every stage's: one stage that reads it is enough
    stages = [{"name": "sft", "mode": "train", "algorithm": {"algorithm_type": "sft"}},
              {"name": "dpo", "mode": "train", "algorithm": {"algorithm_type": "dpo"}}]  # fmt: skip
    resolved = _stages(tmp_path, {"stages": stages, "algorithm": {"dpo": {"beta": 0.3}}})
    assert resolved[1].config.algorithm.dpo.beta == 0.3
    with pytest.raises(
        ConfigError, match=r"^algorithm\.dpo\.beta: .* and the stages' algorithm_types are sft, grpo "
    ):
        stages[1] = {"name": "rl", "algorithm": {"algorithm_type": "grpo"}}
        _stages(tmp_path, {"stages": stages, "algorithm": {"dpo": {"beta": 0.3}}})


def test_an_algorithm_of_your_own_may_read_any_section(tmp_path) -> None:
    cfg = resolve(
        tmp_path,
        "algorithm.advantage_fn=rlcore.core.algorithms.opmd:opmd_advantages",
        "algorithm.dpo.beta=0.3",
    )
    assert cfg.algorithm.dpo.beta == 0.3
