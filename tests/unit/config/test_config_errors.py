"""Bad configs through the real CLI: exit code 2 and one stderr line naming the key and what is allowed."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlcore.cli.main import main

TASKSET = "buffer.explorer_input.taskset"
# (overrides, a regex the one stderr line must match after "rlcore: error: ")
BAD_OVERRIDES = [
    (["trainer.strategyy=fsdp2"], r"trainer\.strategyy: unknown key \(did you mean strategy\?\); allowed keys here: strategy, total_steps,"),
    (["strategy=fsdp2"], r"strategy: unknown key \(did you mean trainer\.strategy\?\); allowed keys here: project, name, mode,"),
    (["trainer.save_interval=abc"], r"trainer\.save_interval: expected int, got 'abc'$"),
    (["trainer.total_steps=x"], r"trainer\.total_steps: expected int or null, got 'x'$"),
    (["algorithm.do_old_log_prob_compute=maybe"], r"algorithm\.do_old_log_prob_compute: expected true or false or null, got 'maybe'$"),
    (["algorithm.use_kl_in_reward=maybe"], r"algorithm\.use_kl_in_reward: expected true or false or null, got 'maybe'$"),
    (["monitor.monitor_type=console"], r"monitor\.monitor_type: expected a list of str, got 'console'$"),
    (["trainer=3"], r"trainer: expected a mapping of trainer keys, got 3$"),
    (["algorithm.repeat_times=0"], r"algorithm\.repeat_times must be >= 1; got 0$"),
    (["algorithm.optimizer.lr=-1"], r"algorithm\.optimizer\.lr must be > 0\.0; got -1\.0$"),
    ([f"{TASKSET}.format.reasoning_tags=[<think>]"], rf"{TASKSET}\.format\.reasoning_tags: give \[open, close\], two different non-empty tags such as \['<think>', '</think>'\]; got \['<think>'\]$"),
    (["trainer.router_aux_loss_coef=0.01", "model.scratch.enabled=true"], r"trainer\.router_aux_loss_coef: a llama model has no experts to route; set model\.scratch\.architecture: qwen3_moe \(or trainer\.router_aux_loss_coef: 0\)$"),
    (["trainer.router_aux_loss_coef=0.01", "model.scratch.architecture=qwen3_moe", "trainer.strategy=megatron", "trainer.megatron.pipeline_model_parallel_size=2"], r"trainer\.router_aux_loss_coef: the load-balancing loss on megatron is proven without pipeline, context and tensor parallelism"),
    (["trainer.router_aux_loss_coef=-1"], r"trainer\.router_aux_loss_coef must be >= 0\.0; got -1\.0$"),
    (["algorithm.router_replay=r4"], r"algorithm\.router_replay must be one of none, r2, r3; got 'r4'$"),
    (["algorithm.router_replay=r2", "trainer.strategy=megatron", "trainer.megatron.context_parallel_size=2"], r"algorithm\.router_replay: r2 on megatron is proven without pipeline, context and tensor parallelism"),
    (["algorithm.router_replay=r2", "model.scratch.architecture=qwen3_moe", "algorithm.do_old_log_prob_compute=false"], r"algorithm\.router_replay: r2 records the routing of the trainer's old-log-prob pass, and without recomputed old log-probs .* set algorithm\.do_old_log_prob_compute true, or router_replay r3 or none$"),
    (["algorithm.router_replay=r3", "explorer.rollout_model.engine_type=vllm"], r"algorithm\.router_replay: r3 needs the engine to record each token's experts, which the HF engine does; explorer\.rollout_model\.engine_type is vllm: set it to hf"),
    (["algorithm.router_replay=r3", "trainer.strategy=megatron", "trainer.megatron.pipeline_model_parallel_size=2"], r"algorithm\.router_replay: r3 on megatron is proven without pipeline parallelism \(a recomputed layer must route as its forward did: in a pipeline schedule later micro-batches' forwards come between\); set trainer\.megatron\.pipeline_model_parallel_size to 1 \(or algorithm\.router_replay: none\)$"),
    (["algorithm.router_replay=r3", "model.scratch.enabled=true"], r"algorithm\.router_replay: a llama model has no experts to route; set model\.scratch\.architecture: qwen3_moe"),
    (["algorithm.router_replay=r3", f"{TASKSET}.default_workflow_type=adaptive_teaching"], rf"algorithm\.router_replay: r3 carries the engine's routing in the single_turn, multi_turn, tool_call workflows; {TASKSET}\.default_workflow_type is adaptive_teaching"),
    (["trainer.strategy=fsdp3"], r"trainer\.strategy must be one of fsdp, fsdp2, megatron; got 'fsdp3'$"),
    (["mode=foo"], r"mode must be one of both, colocate, train, explore, bench; got 'foo'$"),
    (["algorithm.algorithm_type=on_policy_distill"], r"algorithm\.distill_coef 1\.0 distills from a teacher: set model\.teacher_model_path \(an HF model folder with the student's tokenizer\) or model\.teacher_service \(an auxiliary model serving one\)$"),
    (["algorithm.distill_coef=0.5", "model.teacher_service=t"], r"model\.teacher_service: 't' is not a configured auxiliary model \(explorer\.auxiliary_models: none; 'external' is model\.external_model\)$"),
    (["algorithm.distill_coef=0.5", "model.teacher_service=t", "model.teacher_model_path=/tmp"], r"model\.teacher_model_path and model\.teacher_service are both set"),
    (["algorithm.distill_coef=0.5", "model.teacher_service=t", "explorer.auxiliary_models=[{name: t, model_name: m, base_url: 'http://h/v1'}]", f"{TASKSET}.rollout_args.temperature=0.7"], rf"{TASKSET}\.rollout_args\.temperature is 0\.7, but a teacher service scores at temperature 1"),
    (["model.teacher_service=t"], r"model\.teacher_service is set, but nothing distills from it"),
    (["algorithm.algorithm_type=on_policy_distill", "algorithm.distill_coef=0"], r"algorithm\.algorithm_type on_policy_distill learns only from its teacher, and distill_coef 0 turns the teacher off"),
    (["model.teacher_model_path=/tmp"], r"model\.teacher_model_path is set, but nothing distills from it: set algorithm\.distill_coef > 0"),
    (["algorithm.distill_coef=0.5", "model.teacher_model_path=/no/such"], r"model\.teacher_model_path: '/no/such' is not an HF model folder \(no config\.json\)$"),
    (["algorithm.rollout_correction.kind=tis", "algorithm.do_old_log_prob_compute=false"], r"algorithm\.rollout_correction\.kind tis weighs tokens by pi_old / pi_engine, and without recomputed old log-probs"),
    (["algorithm.rollout_correction.level=sentence"], r"algorithm\.rollout_correction\.level must be one of token, sequence, geometric; got 'sentence'$"),
    (["monitor.monitor_type=[console,foo]"], r"monitor\.monitor_type\[1\] must be one of console, jsonl, tensorboard, wandb, mlflow; got 'foo'$"),
    ([f"{TASKSET}.path=/no/such/tasks.jsonl"], rf"{TASKSET}\.path: '/no/such/tasks\.jsonl' does not exist"),
    (["model.model_path=/no/such/model"], r"model\.model_path: '/no/such/model' is not a folder"),
    ([f"{TASKSET}.reward_weights=[1,2]"], rf"{TASKSET}\.reward_weights has 2 entries but reward_fn has 1; give one weight per reward function"),
    ([f"{TASKSET}.reward_fn=[exact_match,bogus]"], rf"{TASKSET}\.reward_fn\[1\] must be one of exact_match, numeric, format, math, judge, reward_model or an import path 'pkg\.mod:fn'; got 'bogus'$"),
    ([f"{TASKSET}.default_workflow_type=multi"], rf"{TASKSET}\.default_workflow_type must be one of single_turn, multi_turn, tool_call, adaptive_teaching, verifiers or an import path 'pkg\.mod:Class'; got 'multi'$"),
    ([f"{TASKSET}.format.prompt_type=chat"], rf"{TASKSET}\.format\.prompt_type must be one of plaintext, messages; got 'chat'$"),
    ([f"{TASKSET}.format.prompt_type=messages"], rf"{TASKSET}\.format\.prompt_type: messages need model\.apply_chat_template: true \(the chat template renders them\)$"),
    ([f"{TASKSET}.repeat_times=4"], rf"{TASKSET}\.repeat_times: 4 samples per task are for eval_tasksets; a training taskset samples algorithm\.repeat_times per task \(leave repeat_times 1 here\)$"),
    (["buffer.explorer_input.mixture=[{name: taskset, path: x.jsonl}]"], r"buffer\.explorer_input\.mixture\[0\]\.name: 'taskset' names another training taskset too; give each its own name$"),
    (["buffer.explorer_input.mixture=[{name: b, path: x.jsonl, weight: 0.01}]"], r"buffer\.explorer_input\.mixture\[0\]\.weight: 0\.01 of 1\.01 gives it no task of a batch of \d+; raise its weight or buffer\.batch_size$"),
    (["model.chat_template_path=/no/such/template.jinja"], r"model\.chat_template_path: '/no/such/template\.jinja' is not a file$"),
    (["model.chat_template_path=/etc/hostname", "model.chat_template=x"], r"model\.chat_template_path: give the template inline \(model\.chat_template\) or as a file, not both$"),
    (["model.apply_chat_template=true", "model.chat_template_kwargs={tools: []}"], r"model\.chat_template_kwargs: tools cannot be set here \(rlcore passes it to the chat template itself\)$"),
    (["model.chat_template_kwargs={enable_thinking: false}"], r"model\.chat_template_kwargs: the chat template's variables need model\.apply_chat_template: true$"),
    (["model.scratch.enabled=true", "model.scratch.tokenizer=wordpiece"], r"model\.scratch\.tokenizer must be one of char, bpe; got 'wordpiece'$"),
    ([f"{TASKSET}.workflow_args={{x: .nan}}"], rf"{TASKSET}\.workflow_args must hold JSON values \(it travels with RunTasks\): Out of range float values are not JSON compliant"),
    (["stages.0.mode=train"], r"stages\[0\]: index out of range \(stages is empty; set the whole list: stages=\[\.\.\.\]\)$"),
    (["monitor.monitor_type.x=jsonl"], r"monitor\.monitor_type\.x: expected a list index, got 'x' \(monitor\.monitor_type has 2 elements: 0 to 1\)$"),
    (["trainer.save_interval"], r"override 'trainer\.save_interval' must be written key\.path=value$"),
    (["algorithm.optimizer.betas=[0.9,"], r"override 'algorithm\.optimizer\.betas=\[0\.9,': cannot parse the value"),
    (["model.model_path=${oc.env:X"], r"override 'model\.model_path=\$\{oc\.env:X': cannot parse the value \(missing BRACE_CLOSE"),
]  # fmt: skip


def one_error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run the CLI in-process; assert exit 2 and exactly one stderr line; return that line's message."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("rlcore: error: ")
    return lines[0].removeprefix("rlcore: error: ")


@pytest.mark.parametrize(("overrides", "pattern"), BAD_OVERRIDES, ids=[" ".join(o) for o, _ in BAD_OVERRIDES])
def test_bad_override_is_one_line(
    recipe: str, overrides: list[str], pattern: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in (["config", "validate"], ["launch"]):  # launch validates before importing anything heavy
        message = one_error_line(capsys, [*command, recipe, *overrides])
        assert re.search(pattern, message), message


def test_bad_yaml_files_are_one_line(tmp_path: Path, recipe: str, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "missing.yaml")
    assert one_error_line(capsys, ["config", "validate", missing]) == f"config file '{missing}' not found"

    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  model_path: [unclosed\n")
    message = one_error_line(capsys, ["config", "validate", str(bad)])
    assert message.startswith(f"{bad}: invalid YAML (while parsing a flow sequence")
    assert "line 2, column 15" in message

    nested_unknown = tmp_path / "nested.yaml"
    nested_unknown.write_text(Path(recipe).read_text() + "trainer:\n  strategyy: fsdp2\n")
    message = one_error_line(capsys, ["config", "validate", str(nested_unknown)])
    assert message.startswith(
        "trainer.strategyy: unknown key (did you mean strategy?); allowed keys here: strategy,"
    )

    empty_section = tmp_path / "empty_section.yaml"
    empty_section.write_text(Path(recipe).read_text() + "trainer:\n")
    message = one_error_line(capsys, ["config", "validate", str(empty_section)])
    assert message == "trainer: expected a mapping of trainer keys, got null"

    a_list = tmp_path / "list.yaml"
    a_list.write_text("- model\n")
    message = one_error_line(capsys, ["config", "validate", str(a_list)])
    assert message == f"{a_list}: the top level must be a mapping of sections, got list"


def test_missing_required_path_names_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "model").mkdir()
    path = tmp_path / "no_taskset.yaml"
    path.write_text(f"model:\n  model_path: {tmp_path / 'model'}\n")
    message = one_error_line(capsys, ["config", "validate", str(path)])
    assert message.startswith(f"{TASKSET}.path: required but not set")


def test_missing_monitor_package_fails_validation(
    recipe: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed (find_spec then finds nothing)
    assert importlib.util.find_spec("wandb") is None
    message = one_error_line(capsys, ["config", "validate", recipe, "monitor.monitor_type=[jsonl,wandb]"])
    assert message == "monitor.monitor_type 'wandb' needs the wandb package: pip install 'rlcore[tracking]'"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    code = "from rlcore.cli.main import main; raise SystemExit(main())"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_bad_configs_in_a_real_process(tmp_path: Path, recipe: str) -> None:
    # the process exit code and the whole stderr, as a user sees them
    result = run_cli("config", "validate", recipe, "trainer.strategyy=fsdp2")
    assert result.returncode == 2
    assert result.stderr.startswith("rlcore: error: trainer.strategyy: unknown key")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr

    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: {save_interval: [\n")
    result = run_cli("launch", str(bad))
    assert result.returncode == 2
    assert result.stderr.startswith(f"rlcore: error: {bad}: invalid YAML")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            ["explorer.rollout_model.tensor_parallel_size=2"],
            "explorer.rollout_model.tensor_parallel_size applies to engine_type vllm only",
        ),
        (
            ["explorer.rollout_model.endpoints=[localhost]"],
            "explorer.rollout_model.endpoints[0] must be host:port",
        ),
        (
            ["explorer.rollout_model.endpoints=[a:70000]"],
            "explorer.rollout_model.endpoints[0] must be host:port",
        ),
        (["trainer.remote=nohost"], "trainer.remote must be host:port"),
        (["trainer.remote=tinker://"], "trainer.remote must be tinker://host[:port][/path]"),
        (["explorer.rollout_model.engine_type=tinker"],
         "explorer.rollout_model.engine_type tinker samples from the Tinker service that trains the run: set "
         "trainer.remote=tinker://host:port"),
        (["trainer.remote=tinker://h:1"],
         "trainer.remote tinker://h:1 (a Tinker service) does not go with explorer.rollout_model.engine_type hf"),
        (["trainer.remote=tinker://h:1", "explorer.rollout_model.engine_type=tinker", "synchronizer.sync_method=nccl"],
         "trainer.remote tinker://h:1 (a Tinker service) does not go with synchronizer.sync_method nccl"),
        # one rule for the passes a trainer does not run (plan.TRAINER_PASSES), each named with its way out
        (["trainer.remote=tinker://h:1", "explorer.rollout_model.engine_type=tinker"],
         "trainer.remote tinker://h:1 (a Tinker service) runs no reference pass (the reference model's log-probs, "
         "for the KL loss, the KL in the reward or an advantage that reads them: set algorithm.kl_loss_coef=0 and "
         "use_kl_in_reward false)"),
        (["trainer.remote=tinker://h:1", "explorer.rollout_model.engine_type=tinker", "algorithm.kl_loss_coef=0",
          "algorithm.rollout_correction.kind=tis"],
         "trainer.remote tinker://h:1 (a Tinker service) runs no correction pass (the rollout correction's "
         "weights: set algorithm.rollout_correction.kind none)"),
        (["trainer.remote=tinker://h:1", "explorer.rollout_model.engine_type=tinker", "algorithm.algorithm_type=ppo",
          "algorithm.kl_loss_coef=0", "algorithm.use_kl_in_reward=false"],
         "trainer.remote tinker://h:1 (a Tinker service) runs no critic pass (algorithm_type ppo's own, beside "
         "the policy: train it with rlcore's trainer)"),
        (["trainer.remote=tinker://h:1", "explorer.rollout_model.engine_type=tinker", "algorithm.kl_loss_coef=0",
          "buffer.explorer_input.taskset.rollout_args.temperature=0.7"],
         "trainer.remote tinker://h:1 (a Tinker service) does not go with a training taskset sampled at a "
         "temperature other than 1"),
        (["trainer.remote=tinker://h:1", "explorer.rollout_model.engine_type=tinker", "algorithm.kl_loss_coef=0",
          "algorithm.policy_loss_fn=opmd"],
         "trainer.remote tinker://h:1 (a Tinker service) does not go with algorithm.policy_loss_fn opmd (Tinker's "
         "losses serve ppo_clip, importance_sampling, cispo, gspo)"),
        (["trainer.remote=tinker://h:1", "explorer.rollout_model.engine_type=tinker", "algorithm.kl_loss_coef=0",
          "algorithm.router_replay=r2", "model.scratch.architecture=qwen3_moe"],
         "trainer.remote tinker://h:1 (a Tinker service) runs no routing_replay pass (the routers' choices "
         "replayed or recorded: set algorithm.router_replay none)"),
        (["trainer.remote=tinker://h:1", "explorer.rollout_model.engine_type=tinker", "algorithm.kl_loss_coef=0",
          "trainer.router_aux_loss_coef=0.01", "model.scratch.architecture=qwen3_moe"],
         "trainer.router_aux_loss_coef: a Tinker service (trainer.remote tinker://h:1) adds no load-balancing "
         "loss of rlcore's: set it 0"),
        (
            ["mode=colocate", "explorer.rollout_model.engine_num=2"],
            "mode colocate runs its engines inside the trainer: explorer.rollout_model.engine_num must be 1 (in "
            "rank 0) and endpoints empty; got engine_num 2: use mode both for separate rollout workers",
        ),
        (
            ["mode=colocate", "cluster.ranks_per_node=2", "explorer.rollout_model.engine_num=3"],
            "mode colocate runs its engines inside the trainer: explorer.rollout_model.engine_num must be 1 (in "
            "rank 0) or 2 (one in each trainer rank) and endpoints empty; got engine_num 3",
        ),
        (["mode=colocate", "synchronizer.sync_method=nccl"], "synchronizer.sync_method nccl sends weights"),
        (["synchronizer.sync_method=memory"], "synchronizer.sync_method memory needs the engine"),
        (["control.token_env=not a name"], "control.token_env must name an environment variable"),
        (["control.tls.enabled=true"], "control.tls.cert_file is required"),
        (
            ["control.tls.enabled=true", "control.tls.cert_file=/nope.pem", "control.tls.key_file=/nope.key"],
            "control.tls.cert_file: '/nope.pem' is not a file",
        ),
    ],
)
def test_rollout_sync_and_control_errors_name_the_key(
    recipe: str, override: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "validate", recipe, *override]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"rlcore: error: {expected}"), err


def test_a_run_trains_on_one_tinker_service(tmp_path: Path, monkeypatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RLCORE_CHECKPOINT_DIR", str(tmp_path))
    tinker = str(Path(__file__).resolve().parents[3] / "configs" / "tinker.yaml")
    message = one_error_line(capsys, ["config", "show", tinker, "stages.1.trainer.remote=tinker://other:1"])
    assert message == (
        "stages[1].trainer: a run trains on one Tinker service (stage 0 names tinker://127.0.0.1:8000): give "
        "every stage the same trainer.remote and trainer.tinker"
    )


def test_router_replay_refuses_a_model_folder_without_its_routers(
    tmp_path: Path, recipe: str, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "dense"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    message = one_error_line(capsys, ["config", "validate", recipe, "algorithm.router_replay=r3", f"model.model_path={folder}"])
    assert message == (
        "algorithm.router_replay: r3 replays the routers of qwen3_moe models; model.model_path is a llama model: "
        "set algorithm.router_replay: none"
    )


@pytest.mark.parametrize("layout", ["tensor_model_parallel_size", "context_parallel_size"])
def test_r3_on_megatron_takes_tensor_and_context_parallelism_and_r2_does_not(recipe: str, layout: str) -> None:
    """r3 replays each TP and CP rank's share of the records (proven: test_family_parity.py's -tp2-r3
    and -cp2-r3 layouts); r2's records there are not proven, so it is still refused. (The checks
    alone: megatron itself needs CUDA, which `config validate` asks for on this machine.)"""
    from rlcore.core.config import ConfigError, load_config, resolve_stages

    split = ["model.scratch.architecture=qwen3_moe", "trainer.strategy=megatron", f"trainer.megatron.{layout}=2"]
    (stage,) = resolve_stages(load_config(recipe, ["algorithm.router_replay=r3", *split]), check_paths=False)
    assert stage.config.algorithm.router_replay == "r3"
    with pytest.raises(ConfigError, match=r"^algorithm\.router_replay: r2 on megatron is proven without pipeline, context and tensor"):
        resolve_stages(load_config(recipe, ["algorithm.router_replay=r2", *split]), check_paths=False)
