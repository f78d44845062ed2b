"""The `rlcore` command: parse arguments, validate the config, and only then import heavy modules.

`rlcore --help`, `rlcore config show` and `rlcore config validate` never import torch, transformers,
vllm or megatron, so they answer in well under a second and work on a machine without a GPU stack.
"""

from __future__ import annotations

import argparse
import sys

from omegaconf import DictConfig

from ..backends import STRATEGIES
from ..core.config import ConfigError, Stage, load_config, resolve_stages, to_yaml
from ..core.monitor import check_monitor_dependencies

_EXIT_USAGE = 2  # argparse's code for bad input; a bad config is bad input too
_EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--strategy",
        choices=list(STRATEGIES),
        help="training strategy; overrides trainer.strategy",
    )
    parser.add_argument("config", help="YAML recipe (overrides of the schema defaults)")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="dotted overrides applied after the YAML, later ones win (e.g. trainer.save_interval=10)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlcore", description="RL post-training for language models: one config, one command."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="{launch,config}")

    launch = commands.add_parser("launch", help="validate the config, then run every stage")
    _add_config_args(launch)

    config = commands.add_parser("config", help="inspect a config without running it")
    config_commands = config.add_subparsers(dest="config_command", required=True, metavar="{show,validate}")
    show = config_commands.add_parser(
        "show", help="print the resolved config (and each resolved stage) as YAML; paths are not checked"
    )
    _add_config_args(show)
    validate = config_commands.add_parser(
        "validate", help="check keys, types, values, paths and monitor packages; print OK on success"
    )
    _add_config_args(validate)
    return parser


def _load(args: argparse.Namespace, check_machine: bool = True) -> tuple[DictConfig, list[Stage]]:
    """Load and validate the config: every config error a run could hit at start-up, raised here.

    `check_machine` also checks what this machine must provide: model/taskset paths and the
    monitor packages.
    """
    try:
        cfg = load_config(args.config, args.overrides, args.strategy)
        stages = resolve_stages(cfg, check_paths=check_machine)
        if check_machine:
            for stage in stages:
                check_monitor_dependencies(list(stage.config.monitor.monitor_type))
    except ValueError as e:  # registry errors are user input too; later ValueErrors are bugs
        raise ConfigError(str(e)) from e
    return cfg, stages


def _show(args: argparse.Namespace) -> int:
    cfg, stages = _load(args, check_machine=False)
    print(to_yaml(cfg), end="")
    if cfg.stages:
        for stage in stages:
            print(f"# stage {stage.index}: {stage.name}")
            print(to_yaml(stage.config), end="")
    return 0


def _validate(args: argparse.Namespace) -> int:
    _, stages = _load(args)
    names = ", ".join(stage.name for stage in stages)
    print(f"OK: {args.config} ({len(stages)} stage(s): {names})")
    return 0


def _launch(args: argparse.Namespace) -> int:
    _load(args)
    from ..core.launcher import launch  # heavy: torch, the strategy, the engines

    try:
        return launch(args.config, list(args.overrides), args.strategy)
    except ValueError as e:  # user-facing problems found while preparing the run (data, model, assets)
        raise ConfigError(str(e)) from e


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `rlcore` console script; returns the process exit code."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "launch":
            return _launch(args)
        if args.config_command == "show":
            return _show(args)
        return _validate(args)
    except ConfigError as e:  # user input: one line, no traceback
        print(f"rlcore: error: {e}", file=sys.stderr)
        return _EXIT_USAGE
    except KeyboardInterrupt:
        print("rlcore: interrupted", file=sys.stderr)
        return _EXIT_INTERRUPTED
