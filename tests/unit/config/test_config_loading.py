"""Loading a recipe: schema defaults, YAML and command-line overrides, env interpolation, stages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from omegaconf.errors import ConfigAttributeError

from rlcore.core.config import ConfigError, inherits_previous_model, load_config, resolve_stages


def write_recipe(tmp_path: Path, extra: dict | None = None) -> str:
    """A minimal recipe: only the two required paths, plus `extra` sections merged in."""
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "tasks.jsonl").write_text('{"prompt": "1+1=", "answer": "2", "response": "2"}\n')
    recipe = {
        "model": {"model_path": str(tmp_path / "model")},
        "buffer": {"explorer_input": {"taskset": {"path": str(tmp_path / "tasks.jsonl")}}},
    }
    for section, values in (extra or {}).items():
        if isinstance(values, dict) and isinstance(recipe.get(section), dict):
            recipe[section] = {**recipe[section], **values}
        else:
            recipe[section] = values
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return str(path)


def test_defaults_fill_everything_but_the_two_paths(tmp_path: Path) -> None:
    [stage] = resolve_stages(load_config(write_recipe(tmp_path)))
    cfg = stage.config
    assert (stage.index, stage.name) == (0, "main")
    assert cfg.model.model_path == str(tmp_path / "model")
    assert cfg.buffer.explorer_input.taskset.path == str(tmp_path / "tasks.jsonl")
    # schema defaults (schema.py)
    assert cfg.mode == "both"
    assert cfg.algorithm.algorithm_type == "grpo"
    assert cfg.algorithm.repeat_times == 8
    assert cfg.algorithm.optimizer.lr == 1e-6
    assert cfg.trainer.strategy == "fsdp2"
    assert cfg.monitor.monitor_type == ["console", "jsonl"]
    assert cfg.buffer.explorer_input.taskset.reward_fn == ["exact_match"]


def test_yaml_then_overrides_later_wins(tmp_path: Path) -> None:
    path = write_recipe(tmp_path, {"algorithm": {"repeat_times": 4, "optimizer": {"lr": 3e-6}}})
    cfg = load_config(
        path, ["algorithm.repeat_times=2", "algorithm.repeat_times=6", "trainer.save_interval=10"]
    )
    [stage] = resolve_stages(cfg)
    assert stage.config.algorithm.repeat_times == 6  # default 8 < YAML 4 < first override 2 < last override 6
    assert stage.config.algorithm.optimizer.lr == 3e-6  # from the YAML, untouched by overrides
    assert stage.config.trainer.save_interval == 10
    assert stage.config.algorithm.optimizer.eps == 1e-8  # a sibling of a YAML key keeps its default


def test_strategy_flag_beats_yaml_and_overrides(tmp_path: Path) -> None:
    # the YAML names a strategy that does not exist; --strategy replaces it before validation
    path = write_recipe(tmp_path, {"trainer": {"strategy": "fsdp3"}})
    cfg = load_config(path, ["trainer.strategy=megatron9"], strategy="fsdp2")
    assert resolve_stages(cfg)[0].config.trainer.strategy == "fsdp2"
    with pytest.raises(
        ConfigError, match=r"^trainer.strategy must be one of fsdp, fsdp2, megatron; got 'fsdp3'$"
    ):
        resolve_stages(load_config(path))


def test_env_interpolation_with_and_without_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other_model = tmp_path / "other_model"
    other_model.mkdir()
    path = write_recipe(tmp_path)
    text = (
        Path(path)
        .read_text()
        .replace(
            f"model_path: {tmp_path / 'model'}",
            f"model_path: ${{oc.env:RLX_TEST_MODEL,{tmp_path / 'model'}}}",
        )
    )
    Path(path).write_text(text + "trainer:\n  save_interval: ${oc.env:RLX_TEST_SAVE,5}\n")

    monkeypatch.delenv("RLX_TEST_MODEL", raising=False)
    monkeypatch.delenv("RLX_TEST_SAVE", raising=False)
    cfg = resolve_stages(load_config(path))[0].config
    assert cfg.model.model_path == str(tmp_path / "model")
    assert cfg.trainer.save_interval == 5 and isinstance(cfg.trainer.save_interval, int)

    monkeypatch.setenv("RLX_TEST_MODEL", str(other_model))
    monkeypatch.setenv("RLX_TEST_SAVE", "7")
    cfg = resolve_stages(load_config(path))[0].config
    assert cfg.model.model_path == str(other_model)
    assert cfg.trainer.save_interval == 7

    monkeypatch.setenv("RLX_TEST_SAVE", "abc")
    with pytest.raises(
        ConfigError, match=r"^trainer.save_interval: expected int, got 'abc' \(from an interpolation\)$"
    ):
        resolve_stages(load_config(path))


def test_env_interpolation_without_default_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RLX_TEST_UNSET", raising=False)
    cfg = load_config(write_recipe(tmp_path), ["model.model_path=${oc.env:RLX_TEST_UNSET}"])
    with pytest.raises(ConfigError, match=r"^model.model_path: cannot resolve .*RLX_TEST_UNSET"):
        resolve_stages(cfg)


def test_loaded_config_is_in_struct_mode(tmp_path: Path) -> None:
    cfg = load_config(write_recipe(tmp_path))
    with pytest.raises(ConfigAttributeError):
        _ = cfg.trainer.strategyy
    with pytest.raises(ConfigAttributeError):
        cfg.trainer.strategyy = "fsdp2"


def sft_then_grpo(tmp_path: Path, grpo_stage: dict) -> str:
    return write_recipe(
        tmp_path,
        {
            "stages": [
                {
                    "name": "sft_warmup",
                    "mode": "train",
                    "algorithm": {"algorithm_type": "sft", "optimizer": {"lr": 1e-5}},
                },
                {"name": "grpo", **grpo_stage},
            ]
        },
    )


def test_two_stages_resolve_into_two_full_configs(tmp_path: Path) -> None:
    path = sft_then_grpo(tmp_path, {"algorithm": {"repeat_times": 4}})
    sft, grpo = resolve_stages(load_config(path))
    assert [(s.index, s.name) for s in (sft, grpo)] == [(0, "sft_warmup"), (1, "grpo")]
    assert (sft.config.mode, sft.config.algorithm.algorithm_type) == ("train", "sft")
    assert sft.config.algorithm.optimizer.lr == 1e-5
    assert sft.config.algorithm.repeat_times == 8  # schema default: stage 1's value does not leak back
    # stage 1 starts from the global config, not from stage 0: sft's mode and lr do not leak forward
    assert (grpo.config.mode, grpo.config.algorithm.algorithm_type) == ("both", "grpo")
    assert grpo.config.algorithm.optimizer.lr == 1e-6
    assert grpo.config.algorithm.repeat_times == 4
    assert sft.config.stages == [] and grpo.config.stages == []
    # the first stage takes the global model; a later stage without model.model_path trains on
    # the previous stage's result
    assert sft.config.model.model_path == str(tmp_path / "model")
    assert not inherits_previous_model(sft.config)
    assert inherits_previous_model(grpo.config)


def test_stage_with_its_own_model_path_does_not_inherit(tmp_path: Path) -> None:
    (tmp_path / "base_model").mkdir()
    path = sft_then_grpo(tmp_path, {"model": {"model_path": str(tmp_path / "base_model")}})
    _, grpo = resolve_stages(load_config(path))
    assert grpo.config.model.model_path == str(tmp_path / "base_model")
    assert not inherits_previous_model(grpo.config)


def test_unknown_section_in_a_stage_names_the_stage(tmp_path: Path) -> None:
    path = sft_then_grpo(tmp_path, {"cluster": {"num_nodes": 2}})
    with pytest.raises(
        ConfigError, match=r"^stages\[1\]\.cluster: a stage may override only mode, algorithm,"
    ):
        resolve_stages(load_config(path))


def test_stage_value_errors_carry_the_stage_prefix(tmp_path: Path) -> None:
    path = sft_then_grpo(tmp_path, {"trainer": {"save_intervall": 3}})
    with pytest.raises(
        ConfigError, match=r"^stages\[1\]\.trainer\.save_intervall: unknown key \(did you mean"
    ):
        resolve_stages(load_config(path))
    path = sft_then_grpo(tmp_path, {"algorithm": {"repeat_times": 0}})
    with pytest.raises(ConfigError, match=r"^stages\[1\]\.algorithm\.repeat_times must be >= 1; got 0$"):
        resolve_stages(load_config(path))
    path = sft_then_grpo(tmp_path, {"model": 3})
    with pytest.raises(ConfigError, match=r"^stages\[1\]\.model: expected a mapping of model keys, got 3$"):
        resolve_stages(load_config(path))


def test_errors_inside_list_elements_keep_the_full_path(tmp_path: Path) -> None:
    path = write_recipe(tmp_path)
    key = "buffer.explorer_input.eval_tasksets"
    cases = {
        f"{key}=[{{path: x, shufle: true}}]": rf"^{key}\[0\]\.shufle: unknown key \(did you mean shuffle\?\)",
        f"{key}=[{{path: x, shuffle: maybe}}]": rf"^{key}\[0\]\.shuffle: expected true or false, got 'maybe'$",
        f"{key}=[{{path: x, format: {{bad: 1}}}}]": rf"^{key}\[0\]\.format\.bad: unknown key; allowed keys here: prompt_key,",
        f"{key}=[3]": rf"^{key}\[0\]: expected a mapping of TasksetConfig keys, got 3$",
        f"{key}=[{{name: x}}]": rf"^{key}\[0\]\.path: required but not set",
        "algorithm.optimizer.betas=[0.9, a]": r"^algorithm\.optimizer\.betas\[1\]: expected float, got 'a'$",
    }
    for override, pattern in cases.items():
        with pytest.raises(ConfigError, match=pattern):
            resolve_stages(load_config(path, [override]))


def test_a_recipe_builds_on_its_base(tmp_path) -> None:
    """`base:` merges sections key by key and stages by name; a loop of bases is a one-line error."""
    (tmp_path / "m").mkdir()
    (tmp_path / "t.jsonl").write_text('{"prompt": "1+1=", "answer": "2", "response": "2"}\n')
    base = {
        "model": {"model_path": str(tmp_path / "m"), "max_model_len": 64, "max_response_tokens": 8},
        "buffer": {"batch_size": 1, "explorer_input": {"taskset": {"path": str(tmp_path / "t.jsonl")}}},
        "stages": [
            {"name": "sft", "mode": "train", "algorithm": {"algorithm_type": "sft"}},
            {"name": "rl", "algorithm": {"algorithm_type": "grpo", "repeat_times": 4}},
        ],
    }
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    (tmp_path / "sub").mkdir()
    top = {"base": "../base.yaml", "name": "other", "model": {"max_prompt_tokens": 16},
           "stages": [{"name": "rl", "algorithm": {"algorithm_type": "rloo"}}, {"name": "more"}]}  # fmt: skip
    (tmp_path / "sub" / "top.yaml").write_text(yaml.safe_dump(top))
    sft, rl, more = resolve_stages(load_config(str(tmp_path / "sub" / "top.yaml")))
    assert (
        rl.config.name == "other"
        and rl.config.model.max_model_len == 64
        and rl.config.model.max_prompt_tokens == 16
    )
    assert (rl.config.algorithm.algorithm_type, rl.config.algorithm.repeat_times) == ("rloo", 4)
    assert (sft.name, sft.config.algorithm.algorithm_type, more.name) == ("sft", "sft", "more")
    (tmp_path / "base.yaml").write_text(yaml.safe_dump({**base, "base": "sub/top.yaml"}))
    with pytest.raises(ConfigError, match=r"base 'sub/top.yaml' leads back to itself"):
        load_config(str(tmp_path / "sub" / "top.yaml"))
    with pytest.raises(ConfigError, match=r"config file '.*nowhere.yaml' not found \(the base of"):
        (tmp_path / "x.yaml").write_text("base: nowhere.yaml\n")
        load_config(str(tmp_path / "x.yaml"))


def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path: Path) -> None:
    """YAML's loaders keep the last of two equal keys without a word: a recipe that sets a key twice
    (a pasted block, a merge gone wrong) is refused."""
    path = Path(write_recipe(tmp_path))
    text = path.read_text() + "trainer:\n  save_interval: 5\n  grad_clip: 1.0\n  save_interval: 10\n"
    path.write_text(text)
    with pytest.raises(
        ConfigError,
        match=rf"^{path}: key 'save_interval' is given twice in one mapping \(lines (\d+) and (\d+)\): keep one$",
    ) as e:
        load_config(str(path))
    first, second = (int(n) for n in re.findall(r"lines (\d+) and (\d+)", str(e.value))[0])
    lines = text.splitlines()
    assert lines[first - 1].strip() == "save_interval: 5" and lines[second - 1].strip() == "save_interval: 10"
    # equal keys in different mappings are fine
    path.write_text(
        text.replace("  save_interval: 10\n", "") + "stages:\n- name: a\n  trainer: {save_interval: 3}\n"
    )
    load_config(str(path))


def test_an_optional_section_one_stage_sets_stays_unset_in_the_next(tmp_path: Path) -> None:
    """buffer.expert_taskset (null by default) set by a mix stage does not reach the GRPO stage after
    it (each stage's sections go over the global config, not over the stage before)."""
    expert = {"name": "experts", "path": str(tmp_path / "tasks.jsonl")}
    stages = [
        {"name": "mix", "algorithm": {"algorithm_type": "mix"}, "buffer": {"expert_taskset": expert}},
        {"name": "grpo", "algorithm": {"algorithm_type": "grpo"}},
    ]
    cfg = load_config(write_recipe(tmp_path, {"stages": stages}))
    mix, grpo = resolve_stages(cfg)
    assert mix.config.buffer.expert_taskset is not None and mix.config.buffer.expert_taskset.name == "experts"
    assert grpo.config.buffer.expert_taskset is None
    assert cfg.buffer.expert_taskset is None  # the loaded config is left as it was
