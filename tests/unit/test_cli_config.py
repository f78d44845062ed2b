"""`rlcore config show / validate / prepare`: what each prints, checks and refuses, in one line each."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import rlcore.cli.main as cli
from rlcore.cli.main import main
from tests.unit.test_cli import LIGHT_CHECK


def batch_reward(completions: list, **kwargs: object) -> list[float]:
    """TRL's signature: a list of completions in, a list of rewards out."""
    return [float(len(c)) for c in completions]


def batch_reward_of_one_too_many(completions: list, **kwargs: object) -> list[float]:
    return [0.0] * (len(completions) + 1)


def test_validate_prints_ok_with_the_stages(recipe: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "validate", recipe]) == 0
    assert capsys.readouterr().out == f"OK: {recipe} (1 stage(s): main)\n"

    stages = "stages=[{name: sft, mode: train, algorithm: {algorithm_type: sft}}, {name: grpo}]"
    assert main(["config", "validate", "--strategy", "fsdp2", recipe, stages]) == 0
    assert capsys.readouterr().out == f"OK: {recipe} (2 stage(s): sft, grpo)\n"


def test_validate_calls_each_reward_function_once_on_a_real_row(
    recipe: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A reward with a bug, or a TRL batch reward (lists in, a list out) that answers with the wrong
    count, is refused by validate on the taskset's first row, not found by a rollout worker after
    the run started; a TRL batch reward that answers one number per completion passes."""
    key = "buffer.explorer_input.taskset.reward_fn"
    assert main(["config", "validate", recipe, f"{key}=[tests.integration.rewards:fails]"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"rlcore: error: {key}: reward_fn 'tests.integration.rewards:fails' failed on task "
    )
    assert "called once on row 1 of" in err and len(err.strip().splitlines()) == 1
    assert main(["config", "validate", recipe, f"{key}=[{__name__}:batch_reward]"]) == 0
    capsys.readouterr()
    assert main(["config", "validate", recipe, f"{key}=[{__name__}:batch_reward_of_one_too_many]"]) == 2
    err = capsys.readouterr().err
    assert f"reward_fn '{__name__}:batch_reward_of_one_too_many' (a batch reward: it takes completions) returned 2 values for 1" in err
    assert (
        main(["config", "validate", recipe, f"{key}=[tests.integration.rewards:fails_past_the_first_row]"])
        == 0
    )


def test_validate_checks_the_judge_against_the_configured_services(
    recipe: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The `judge` reward: its block names a configured auxiliary model, its template only the
    fields it fills, and it is listed in reward_fn when set; each a one-line error naming the key.
    The service is not asked before the run (its first rollout is)."""
    ts = "buffer.explorer_input.taskset"
    judged = [f"{ts}.reward_fn=[exact_match,judge]", "explorer.auxiliary_models=[{name: grader, model_name: m, base_url: 'http://127.0.0.1:9/v1'}]"]
    assert main(["config", "validate", recipe, *judged, f"{ts}.judge.model=grader"]) == 0
    capsys.readouterr()
    for overrides, error in [
        ([*judged], f"{ts}.judge.model: name the auxiliary model that judges (explorer.auxiliary_models: grader)"),
        ([*judged, f"{ts}.judge.model=other"], f"{ts}.judge.model: 'other' is not a configured auxiliary model"),
        ([*judged, f"{ts}.judge.model=grader", f"{ts}.judge.template='{{response}} {{user}}'"],
         f"{ts}.judge.template names {{user}}; it may name only {{prompt}}, {{response}}, {{answer}}"),
        ([f"{ts}.judge.model=grader"], f"{ts}.judge: model is set but reward_fn does not list 'judge'"),
        ([*judged, f"{ts}.judge.model=grader", f"{ts}.judge.parse=vote"], f"{ts}.judge.parse"),
    ]:  # fmt: skip
        assert main(["config", "validate", recipe, *overrides]) == 2, overrides
        err = capsys.readouterr().err
        assert err.startswith(f"rlcore: error: {error}") and len(err.strip().splitlines()) == 1, err


def test_show_prints_the_resolved_config(recipe: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", recipe, "trainer.save_interval=7"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["algorithm"]["repeat_times"] == 4  # YAML
    assert shown["trainer"]["save_interval"] == 7  # override
    assert shown["trainer"]["strategy"] == "fsdp2"  # schema default
    assert shown["model"]["max_model_len"] == 1024  # schema default


def test_show_prints_each_stage_under_a_header(recipe: str, capsys: pytest.CaptureFixture[str]) -> None:
    stages = "stages=[{name: sft, mode: train, algorithm: {algorithm_type: sft}}, {name: grpo, buffer: {batch_size: 2}}]"
    assert main(["config", "show", recipe, stages]) == 0
    out = capsys.readouterr().out
    base, rest = out.split("# stage 0: sft\n")
    sft, grpo = rest.split("# stage 1: grpo\n")
    base, sft, grpo = yaml.safe_load(base), yaml.safe_load(sft), yaml.safe_load(grpo)
    assert [s["name"] for s in base["stages"]] == ["sft", "grpo"]
    assert (sft["mode"], sft["algorithm"]["algorithm_type"], sft["buffer"]["batch_size"]) == (
        "train",
        "sft",
        16,
    )
    assert (grpo["mode"], grpo["algorithm"]["algorithm_type"], grpo["buffer"]["batch_size"]) == (
        "both",
        "grpo",
        2,
    )
    assert grpo["model"]["model_path"] == "<previous stage>"


def test_show_does_not_check_paths_but_validate_does(recipe: str, capsys: pytest.CaptureFixture[str]) -> None:
    override = "model.model_path=/not/downloaded/yet"
    assert main(["config", "show", recipe, override]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["model"]["model_path"] == "/not/downloaded/yet"
    assert main(["config", "validate", recipe, override]) == 2
    assert capsys.readouterr().err.startswith(
        "rlcore: error: model.model_path: '/not/downloaded/yet' is not a folder"
    )


def test_validate_counts_prompt_tokens_without_importing_torch(recipe: str, tmp_path: Path) -> None:
    """With the model's tokenizer on disk, validate counts the prompts' tokens through the fast
    tokenizer alone: transformers' auto classes would import torch (seconds)."""
    from rlcore.core.config.schema import ScratchModelConfig
    from rlcore.core.scratch_model import build_scratch_model

    build_scratch_model(str(tmp_path / "model"), ScratchModelConfig(enabled=True), max_model_len=256, seed=0)
    check = LIGHT_CHECK.replace("['config', 'show', sys.argv[1]]", "['config', 'validate', sys.argv[1], 'model.max_prompt_tokens=2']")
    result = subprocess.run([sys.executable, "-c", check, recipe], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "prompts of buffer.explorer_input.taskset" in result.stderr  # counted: 1 of 1 longer than 2 tokens
    assert "torch" not in result.stdout.splitlines()[-1], result.stdout


def test_validate_accepts_paths_that_launch_creates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a scratch model and a generated taskset do not exist before `rlcore launch` builds them
    path = tmp_path / "scratch.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": {"model_path": str(tmp_path / "tiny"), "scratch": {"enabled": True}},
                "buffer": {
                    "explorer_input": {
                        "taskset": {"path": str(tmp_path / "t.jsonl"), "generator": "arithmetic"}
                    }
                },
            }
        )
    )
    assert main(["config", "validate", str(path)]) == 0
    assert capsys.readouterr().out == f"OK: {path} (1 stage(s): main)\n"
    assert (
        not (tmp_path / "tiny").exists() and not (tmp_path / "t.jsonl").exists()
    )  # validation writes nothing


def test_show_one_stage_and_one_key(recipe: str, capsys: pytest.CaptureFixture[str]) -> None:
    stages = "stages=[{name: sft, mode: train, algorithm: {algorithm_type: sft}}, {name: grpo, buffer: {batch_size: 2}}]"
    assert main(["config", "show", recipe, stages, "--stage", "grpo", "--key", "buffer.batch_size"]) == 0
    assert capsys.readouterr().out == "# stage 1: grpo\nbuffer.batch_size: 2\n"
    assert main(["config", "show", recipe, stages, "--key", "buffer.batch_size"]) == 0
    assert capsys.readouterr().out == (
        "buffer.batch_size: 16\n# stage 0: sft\nbuffer.batch_size: 16\n# stage 1: grpo\nbuffer.batch_size: 2\n"
    )
    assert main(["config", "show", recipe, stages, "--stage", "0"]) == 0
    assert yaml.safe_load(capsys.readouterr().out.split("\n", 1)[1])["mode"] == "train"
    assert main(["config", "show", recipe, stages, "--stage", "rl"]) == 2
    assert "no stage 'rl'; the stages: 0 (sft), 1 (grpo)" in capsys.readouterr().err
    assert main(["config", "show", recipe, "--key", "algorithm.optimiser.lr"]) == 2
    assert "did you mean 'algorithm.optimizer'?" in capsys.readouterr().err


def test_a_run_wide_override_that_every_stage_sets_again_is_warned(
    recipe: str, capsys: pytest.CaptureFixture[str]
) -> None:
    stages = (
        "stages=[{name: sft, mode: train, algorithm: {algorithm_type: sft, optimizer: {lr: 1e-3}}}, "
        "{name: grpo, algorithm: {optimizer: {lr: 1e-4}}}]"
    )
    assert (
        main(["config", "validate", recipe, stages, "algorithm.optimizer.lr=1e-6", "trainer.grad_clip=0.5"])
        == 0
    )
    err = capsys.readouterr().err
    assert err == (
        "rlcore: warning: the override algorithm.optimizer.lr=... changes no stage: every stage sets "
        "algorithm.optimizer.lr itself (give it to one with stages.N.algorithm.optimizer.lr=...)\n"
    )


def test_validate_refuses_megatron_where_the_launch_would(recipe: str, capsys: pytest.CaptureFixture[str]) -> None:
    import glob
    import importlib.util

    if importlib.util.find_spec("megatron.core") is None or glob.glob("/dev/nvidia[0-9]*"):
        pytest.skip("needs megatron-core installed and no NVIDIA GPU (the CPU CI machine)")
    assert main(["config", "validate", "--strategy", "megatron", recipe]) == 2
    assert capsys.readouterr().err.startswith("rlcore: error: trainer.strategy=megatron needs CUDA")
    assert main(["config", "validate", "--strategy", "megatron", recipe, "cluster.device=cpu"]) == 2


def test_validate_reads_folders_hub_ids_and_nested_keys(
    recipe: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`save_to_disk` folders and Hub ids are read by validate as the run reads them: a split the
    folder lacks, or a column the rewards need that it lacks, is one line here, not at launch or
    35 s into the run; a Hub id that cannot be read from here says so. A format key may name a
    nested field (verl's `reward_model.ground_truth`)."""
    import datasets

    taskset = "buffer.explorer_input.taskset"
    rows = {"prompt": ["1+1=", "2+2="], "answer": ["2", "4"]}
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)}).save_to_disk(str(tmp_path / "dd"))
    assert main(["config", "validate", recipe, f"{taskset}.path={tmp_path / 'dd'}"]) == 0
    assert main(["config", "validate", recipe, f"{taskset}.path={tmp_path / 'dd'}", f"{taskset}.split=test"]) == 2
    assert "split: 'test' is not a split of" in capsys.readouterr().err

    datasets.Dataset.from_dict({"prompt": rows["prompt"]}).save_to_disk(str(tmp_path / "no_answer"))
    capsys.readouterr()  # datasets' progress bars
    assert main(["config", "validate", recipe, f"{taskset}.path={tmp_path / 'no_answer'}"]) == 2
    err = capsys.readouterr().err
    assert "row 1 has no 'answer' column (the answer;" in err and len(err.strip().splitlines()) == 1

    nested = tmp_path / "verl.jsonl"
    nested.write_text('{"prompt": "1+1=", "reward_model": {"ground_truth": "2", "style": "rule"}}\n')
    ok = [recipe, f"{taskset}.path={nested}", f"{taskset}.format.answer_key=reward_model.ground_truth"]
    assert main(["config", "validate", *ok]) == 0
    assert main(["config", "validate", *ok[:2], f"{taskset}.format.answer_key=reward_model.truth"]) == 2
    assert "has no 'reward_model.truth' column" in capsys.readouterr().err
    from rlcore.core.config.schema import TasksetConfig
    from rlcore.core.data.taskset import load_tasks

    ts = TasksetConfig(name="v", path=str(nested))
    ts.format.answer_key = "reward_model.ground_truth"
    assert [t.answer for t in load_tasks(ts, taskset)] == ["2"]

    dotted = tmp_path / "dotted.jsonl"  # a column whose own name has a dot
    dotted.write_text('{"q.text": "1+1=", "answer": "2"}\n')
    ts = TasksetConfig(name="d", path=str(dotted))
    ts.format.prompt_key = "q.text"
    assert [t.prompt for t in load_tasks(ts, taskset)] == ["1+1="]

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)  # a generator's relative path, not written yet, looks like a Hub id
    assert main(["config", "validate", recipe, f"{taskset}.path=gen/arith", f"{taskset}.generator=arithmetic"]) == 0
    assert main(["config", "validate", recipe, f"{taskset}.path=rlcore-test/no-such-dataset"]) == 2
    err = capsys.readouterr().err
    assert "cannot load 'rlcore-test/no-such-dataset' (split 'train') from the Hugging Face Hub" in err


def test_config_prepare_makes_the_assets_a_launch_would(tmp_path, monkeypatch, capsys) -> None:
    """`rlcore config prepare`: the scratch model and generated tasksets exist before any launch (a
    Tinker service serves the model before the launch that trains it starts)."""
    monkeypatch.setenv("RLCORE_CHECKPOINT_DIR", str(tmp_path))
    recipe = str(Path(__file__).resolve().parents[2] / "configs" / "tinker.yaml")
    assert main(["config", "prepare", recipe, "model.scratch.num_layers=1"]) == 0
    out = capsys.readouterr().out
    model = tmp_path / "assets" / "tiny-llama-char"
    assert (model / "config.json").is_file() and (tmp_path / "assets" / "arithmetic" / "test.jsonl").is_file()
    assert f"\nsft_warmup: {model}, " in out and "\nrl: " in out


def test_a_run_name_override_is_not_called_shadowed(recipe: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`name=<new>` (the README's second run) names the run; each stage's own `name` is the stage's."""
    stages = "stages=[{name: sft, mode: train, algorithm: {algorithm_type: sft}}, {name: grpo}]"
    assert main(["config", "validate", recipe, stages, "name=second_run", "project=p"]) == 0
    assert capsys.readouterr().err == ""
    cfg = cli.load_config(recipe, [stages, "name=second_run"])
    assert cli.shadowed_overrides(cfg, ["name=second_run", "seed=3"]) == []


def test_every_unknown_key_of_a_file_is_reported_in_one_run(
    recipe: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ported.yaml"
    data = yaml.safe_load(Path(recipe).read_text())
    data["cluster"] = {"node_num": 2}
    data["trainer"] = {"actor_grad_clip": 1.0, "strategyy": "fsdp2"}
    data["num_generations"] = 8
    path.write_text(yaml.safe_dump(data))
    assert main(["config", "validate", str(path)]) == 2
    lines = capsys.readouterr().err.splitlines()  # one line each, as every error
    assert len(lines) == 4 and all(line.startswith("rlcore: error: ") for line in lines)
    keys = [line.removeprefix("rlcore: error: ").split(":")[0] for line in lines]
    assert sorted(keys) == [
        "cluster.node_num",
        "num_generations",
        "trainer.actor_grad_clip",
        "trainer.strategyy",
    ]
    assert "did you mean rlcore's cluster.num_nodes? (Trinity-RFT's name)" in lines[0]


def test_prepare_says_in_one_line_that_a_package_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RLCORE_CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.setitem(sys.modules, "verifiers", None)  # not installed, as far as imports can tell
    recipe = str(Path(__file__).resolve().parents[2] / "configs" / "verifiers.yaml")
    expected = (
        "rlcore: error: buffer.explorer_input.taskset.default_workflow_type: the verifiers workflow needs the "
        "verifiers package, which is not installed here: pip install 'rlcore[verifiers]'\n"
    )
    for command in ("validate", "prepare"):
        assert main(["config", command, recipe]) == 2
        assert capsys.readouterr().err == expected


def test_prepare_turns_a_generator_error_into_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fails(stages: object) -> None:
        raise ImportError("No module named 'sqlalchemy'", name="sqlalchemy")

    import rlcore.runtime.preflight as preflight

    monkeypatch.setattr(preflight, "prepare_assets", fails)
    monkeypatch.setenv("RLCORE_CHECKPOINT_DIR", str(tmp_path))
    recipe = str(Path(__file__).resolve().parents[2] / "configs" / "tinker.yaml")
    assert main(["config", "prepare", recipe]) == 2
    assert capsys.readouterr().err == (
        "rlcore: error: config prepare: No module named 'sqlalchemy': pip install 'rlcore[sql]'\n"
    )
