"""The `rlcore` command: parsing, help, exit codes, light imports (`config` subcommands: test_cli_config.py)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

import rlcore.cli.main as cli
from rlcore.cli.main import build_parser, main


def test_launch_arguments_parse_with_strategy_before_or_after(recipe: str) -> None:
    parser = build_parser()
    before = parser.parse_args(["launch", "--strategy", "fsdp2", recipe, "a.b=1", "c=2"])
    after = parser.parse_args(["launch", recipe, "a.b=1", "c=2", "--strategy", "fsdp2"])
    for args in (before, after):
        assert (args.command, args.strategy, args.config, args.overrides) == (
            "launch",
            "fsdp2",
            recipe,
            ["a.b=1", "c=2"],
        )
    plain = parser.parse_args(["launch", recipe])
    assert (plain.strategy, plain.overrides) == (None, [])


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in ([], ["config"], ["launch"], ["launch", "--strategy", "fsdp3", "x.yaml"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'fsdp3' (choose from" in err and "did you mean 'fsdp'?" in err
    assert "positional arguments:" in err  # no arguments at all: the whole help
    with pytest.raises(SystemExit):
        main(["lanch", "x.yaml"])
    assert "invalid choice: 'lanch'" in (err := capsys.readouterr().err) and "did you mean 'launch'?" in err


def test_version_and_defaults_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out == f"rlcore {version('rlcore')}\n"
    with pytest.raises(SystemExit):
        main(["rollout", "serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "sequences per engine call (default: 256)" in out and "(default: None)" not in out


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "launch" in out and "config" in out
    with pytest.raises(SystemExit):
        main(["launch", "--help"])
    assert "--strategy {fsdp,fsdp2,megatron}" in capsys.readouterr().out


def test_keyboard_interrupt_exits_130(
    recipe: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "load_config", interrupted)  # Ctrl-C while the config loads
    assert main(["config", "validate", recipe]) == 130
    assert capsys.readouterr().err == "rlcore: interrupted\n"


LIGHT_CHECK = """
import sys
from rlcore.cli.main import main
for argv in (['config', 'validate', sys.argv[1]], ['config', 'show', sys.argv[1]]):
    assert main(argv) == 0, argv
try:
    main(['--help'])
except SystemExit:
    pass
heavy = sorted(m for m in ('torch', 'transformers', 'vllm', 'megatron', 'tensorboard', 'datasets') if m in sys.modules)
print('HEAVY', heavy)
"""


def test_help_show_and_validate_import_no_heavy_module(recipe: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", LIGHT_CHECK, recipe], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "HEAVY []"


def test_bench_runs_the_named_benchmark_with_its_own_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "nope"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err
    # The flags after the name belong to the benchmark: its own parser refuses a bad one.
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "trl", "--comparisons", "fastest"])
    assert exit_info.value.code == 2
    assert (
        "--comparisons must list some of same_engine, best_engine; got 'fastest'" in capsys.readouterr().err
    )


def test_the_tool_call_format_choices_are_the_workflows() -> None:
    """`rollout serve --tool-call-format` lists its choices without importing the rollout side."""
    from rlcore.rollout.workflows.tool_formats import CHOICES

    serve = next(
        a.choices["serve"]
        for a in build_parser()._actions
        if a.dest == "command" and a.choices and "rollout" in a.choices
        for a in a.choices["rollout"]._actions
        if a.dest == "rollout_command"
    )
    flag = next(a for a in serve._actions if a.dest == "tool_call_format")
    assert tuple(flag.choices) == CHOICES and flag.default == "auto"


def test_short_version_flag_is_an_alias(capsys: pytest.CaptureFixture[str]) -> None:
    for flag in ("-V", "--version"):
        with pytest.raises(SystemExit) as exit_info:
            main([flag])
        assert exit_info.value.code == 0 and capsys.readouterr().out.startswith("rlcore ")


def test_a_missing_config_file_is_named_with_a_usage_line(capsys: pytest.CaptureFixture[str]) -> None:
    for command in (["launch"], ["config", "validate"], ["config", "show"], ["config", "prepare"]):
        with pytest.raises(SystemExit) as exit_info:
            main(command)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        prog = "rlcore " + " ".join(command)
        assert err.startswith(f"usage: {prog} ")
        assert err.splitlines()[-1] == (
            f"{prog}: error: a config file is required: {prog} CONFIG.yaml [key=value ...] "
            "(e.g. configs/quickstart.yaml)"
        )
        assert "key=value" not in err.splitlines()[-1].split("required")[0]  # the overrides are optional


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """`parser` and every parser below it (`rlcore config validate`, ...)."""
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                out += _subparsers(sub)
    return out


def _bench_parsers(monkeypatch: pytest.MonkeyPatch) -> list[argparse.ArgumentParser]:
    """Each benchmark's own parser (built in its main(), so taken where main() parses)."""
    import importlib

    from rlcore.benchmarks import BENCHMARKS

    class Parsed(Exception):
        pass

    def stop(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise Parsed(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop)
    parsers = []
    for module in BENCHMARKS.values():
        with pytest.raises(Parsed) as parsed:
            importlib.import_module(module).main([])
        parsers.append(parsed.value.args[0])
    return parsers


def test_every_flag_with_a_default_shows_it_in_help(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the README promises: every --help (each subcommand's, each benchmark's) lists each
    flag's default; a flag whose default is none or off says what it does instead."""
    parsers = _subparsers(build_parser()) + _bench_parsers(monkeypatch)
    assert len(parsers) > 20
    missing = []
    for parser in parsers:
        for action in parser._actions:
            if not action.option_strings or isinstance(
                action, (argparse._HelpAction, argparse._VersionAction)
            ):
                continue
            formatter = parser.formatter_class(prog=parser.prog)
            shown = formatter._get_help_string(action) if action.help else None  # no help: nothing shown
            if shown is None:
                missing.append(f"{parser.prog} {action.option_strings[0]}: no help")
            elif action.default is not None and action.default is not False and "default" not in shown:
                missing.append(
                    f"{parser.prog} {action.option_strings[0]}: default {action.default!r} not shown"
                )
    assert not missing, missing


def test_zero_and_empty_defaults_are_shown(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["rollout", "serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "engine seed (vllm) (default: 0)" in out
    assert "(tinker only) (default: '')" in out
    assert "--device {auto,cpu,cuda} where the model runs" in out and "(default: auto)" in out


HELP_CHECK = """
import sys, time
from rlcore.benchmarks import BENCHMARKS
from rlcore.cli.main import main
commands = [[], ['launch'], ['config'], ['config', 'show'], ['config', 'validate'], ['config', 'prepare'],
            ['rollout'], ['rollout', 'serve'], ['trainer'], ['trainer', 'serve'], ['tinker'], ['tinker', 'serve'],
            ['bench']] + [['bench', name] for name in BENCHMARKS]
start = time.perf_counter()
for argv in commands:
    try:
        main([*argv, '--help'])
    except SystemExit as e:
        assert e.code == 0, argv
heavy = sorted(m for m in ('torch', 'transformers', 'vllm', 'megatron', 'datasets', 'fastapi', 'openai', 'trl')
               if m in sys.modules)
print('HEAVY', heavy, len(commands))
"""


def test_every_help_imports_no_heavy_module() -> None:
    """`rlcore ... --help` of every subcommand and benchmark answers without torch, vLLM or
    megatron (bench grpc --help took 16.8 s when its module imported torch at the top)."""
    result = subprocess.run(
        [sys.executable, "-c", HELP_CHECK], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-1].startswith("HEAVY [] "), result.stdout.splitlines()[-1]


