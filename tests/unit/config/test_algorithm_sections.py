"""The knobs one algorithm reads live in its section of `algorithm` (opmd, maxent_grpo, mix, dpo): the
old flat keys (algorithm.dpo_beta) still load, each with a one-line note; a section set where no
algorithm reads it is refused in one line."""

from __future__ import annotations

import dataclasses
import os

import pytest
import yaml

from rlcore.core.config import ConfigError, load_config, resolve_stages
from rlcore.core.config.moved_keys import MOVED, move_keys
from rlcore.core.config.schema import ALGORITHM_SECTIONS, AlgorithmConfig

from .minimal import resolve

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


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
    # each old key, given a value other than its default: opmd's in the recipe, the others as overrides
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
        match=r"^algorithm\.dpo\.beta: algorithm\.dpo is read only by training a policy on pairs \(algorithm_type dpo's\), "
        r"and algorithm\.algorithm_type is grpo \(it would change nothing\): set algorithm\.algorithm_type dpo, "
        r"or drop algorithm\.dpo \(or set algorithm\.dpo\.beta back to 0\.1\)$",
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
    # opmd's own parts replaced by others: its section is read by neither
    with pytest.raises(ConfigError, match=r"^algorithm\.opmd\.tau: .* and algorithm\.advantage_fn is grpo and "
                       r"policy_loss_fn is ppo_clip \(it would change nothing\): remove algorithm\.advantage_fn and "
                       r"policy_loss_fn \(algorithm_type opmd's own reads it\), or drop algorithm\.opmd "):  # fmt: skip
        resolve(tmp_path, "algorithm.algorithm_type=opmd", "algorithm.advantage_fn=grpo",
                "algorithm.policy_loss_fn=ppo_clip", "algorithm.opmd.tau=2")  # fmt: skip
    # read: by the algorithm_type, or by a part put in its place; its defaults spelt out change nothing
    assert resolve(tmp_path, "algorithm.advantage_fn=opmd", "algorithm.opmd.tau=2").algorithm.opmd.tau == 2.0
    assert resolve(tmp_path, "algorithm.dpo.beta=0.1").algorithm.algorithm_type == "grpo"


def test_a_stage_may_set_only_the_sections_its_algorithm_reads(tmp_path) -> None:
    stages = [{"name": "sft", "mode": "train", "algorithm": {"algorithm_type": "sft", "dpo": {"beta": 0.3}}},
              {"name": "rl"}]  # fmt: skip
    with pytest.raises(ConfigError, match=r"^stages\[0\]\.algorithm\.dpo\.beta: algorithm\.dpo is read only by "
                       r"training a policy on pairs \(algorithm_type dpo's\), and stages\[0\]\.algorithm\.algorithm_type is "
                       r"sft \(it would change nothing\): set stages\[0\]\.algorithm\.algorithm_type dpo, or drop "
                       r"stages\[0\]\.algorithm\.dpo "):  # fmt: skip
        _stages(tmp_path, {"stages": stages})
    # set run-wide, a section is every stage's: one stage that reads it is enough
    stages = [{"name": "sft", "mode": "train", "algorithm": {"algorithm_type": "sft"}},
              {"name": "dpo", "mode": "train", "algorithm": {"algorithm_type": "dpo"}}]  # fmt: skip
    resolved = _stages(tmp_path, {"stages": stages, "algorithm": {"dpo": {"beta": 0.3}}})
    assert resolved[1].config.algorithm.dpo.beta == 0.3
    with pytest.raises(
        ConfigError,
        match=r"^algorithm\.dpo\.beta: .* and no stage's algorithm_type \(sft, grpo\) reads it \(it "
        r"would change nothing\): set algorithm_type dpo on the stage that should read it \(stages\[N\]\.algorithm\.algorithm_type\)",
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


def test_a_stage_is_blamed_only_for_what_it_sets_itself(tmp_path) -> None:
    # stage 0 spells out dpo.beta's default; the run-wide nll_coef is read by stage 1 (dpo)
    stages = [{"name": "sft", "mode": "train", "algorithm": {"algorithm_type": "sft", "dpo": {"beta": 0.1}}},
              {"name": "dpo", "mode": "train", "algorithm": {"algorithm_type": "dpo"}}]  # fmt: skip
    resolved = _stages(tmp_path, {"stages": stages, "algorithm": {"dpo": {"nll_coef": 1.0}}})
    assert resolved[1].config.algorithm.dpo.nll_coef == 1.0


def test_the_length_term_set_run_wide_is_read_by_the_rl_stage(tmp_path) -> None:
    stages = [{"name": "sft", "mode": "train", "algorithm": {"algorithm_type": "sft"}}, {"name": "rl"}]
    resolved = _stages(tmp_path, {"stages": stages, "algorithm": {"length_penalty": {"kind": "group"}}})
    assert resolved[1].config.algorithm.length_penalty.kind == "group"
    stages[0]["algorithm"]["length_penalty"] = {"kind": "correct"}
    with pytest.raises(ConfigError, match=r"^stages\[0\]\.algorithm\.length_penalty\.kind: algorithm\.length_penalty "
                       r"is read only by an advantage of rollouts' rewards, and stages\[0\]\.algorithm\.algorithm_type sft "
                       r"computes no advantage of rollouts' rewards \(it would change nothing\): move it to stages\[1\]\.algorithm\.length_penalty, or drop "):  # fmt: skip
        _stages(tmp_path, {"stages": stages})


def test_move_keys_moves_every_old_key_of_a_stage_list_or_an_override(tmp_path) -> None:
    old = {k: f"v-{k}" for k in MOVED}
    recipe = {"algorithm": dict(old), "stages": [{"name": "a", "algorithm": {**old, "dpo": None}}]}
    notes = move_keys(recipe)
    assert len(notes) == 2 * len(MOVED)
    for data in (recipe["algorithm"], recipe["stages"][0]["algorithm"]):
        assert {k: data[s][n] for k, (s, n) in MOVED.items()} == old and not set(data) & set(MOVED)
    override = {"stages": {"1": {"algorithm": {"dpo_pairs": "buffer"}}}}
    assert move_keys(override, where="override: ") == [
        "stages[1].algorithm.dpo_pairs is stages[1].algorithm.dpo.pairs now (the old key still works; write the new one)"
    ]
    assert override == {"stages": {"1": {"algorithm": {"dpo": {"pairs": "buffer"}}}}}
    with pytest.raises(ConfigError, match=r"^override: algorithm\.mix_mu \(0\.3\) and algorithm\.mix\.mu"):
        move_keys({"algorithm": {"mix_mu": 0.3, "mix": {"mu": 0.2}}}, where="override: ")


def test_a_config_handed_over_as_yaml_moves_old_keys_too(tmp_path) -> None:
    from rlcore.core.config.loader import from_yaml

    text = yaml.safe_dump({"model": {"model_path": str(tmp_path)}, "algorithm": {"algorithm_type": "dpo", "dpo_beta": 0.3},
                           "buffer": {"explorer_input": {"taskset": {"path": str(tmp_path / "t.jsonl")}}}})  # fmt: skip
    assert from_yaml(text).algorithm.dpo.beta == 0.3


def test_config_show_answers_an_old_key_with_its_new_place(capsys) -> None:
    from rlcore.cli.main import main

    recipe = os.path.join(REPO, "configs", "algorithms", "dpo.yaml")
    assert main(["config", "show", recipe, "--stage", "rl", "--key", "algorithm.dpo_beta"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "algorithm.dpo.beta: 0.1"
