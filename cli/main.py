"""The `rlcore` command: parse arguments, validate the config, and only then import heavy modules.

`--help` (of every subcommand and benchmark), `rlcore config show` and `rlcore config validate` never
import torch, transformers, vllm or megatron, so they answer in well under a second and work on a
machine without a GPU stack.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ..backends import check_strategy_runs
from ..core.config import ConfigError, Stage, load_config, resolve_stages, to_yaml
from ..core.config.moved_keys import MOVED
from ..core.config.package_checks import check_packages, install_command
from ..core.config.schema import STAGE_SECTIONS
from .parser import build_parser

_EXIT_USAGE = 2  # argparse's code for bad input; a bad config is bad input too
_EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C


def _bench(args: argparse.Namespace) -> int:
    import importlib

    from ..benchmarks import BENCHMARKS

    # the benchmark's own parser names its program after argv[0]: `rlcore bench NAME --help`
    sys.argv[0] = f"rlcore bench {args.name}"
    return int(importlib.import_module(BENCHMARKS[args.name]).main(list(args.args)))


def _load(args: argparse.Namespace, check_machine: bool = True) -> tuple[DictConfig, list[Stage]]:
    """Load and validate the config: every config error a run could hit at start-up, raised here.

    `check_machine` also checks what this machine must provide: model/taskset paths and the
    monitor packages.
    """
    from ..core.monitor import check_monitor_dependencies  # here: --help imports no gRPC

    try:
        cfg = load_config(args.config, args.overrides, args.strategy)
        stages = resolve_stages(cfg, check_paths=check_machine)
        if check_machine:
            for stage in stages:
                check_monitor_dependencies(list(stage.config.monitor.monitor_type))
    except ValueError as e:  # registry errors are user input too; later ValueErrors are bugs
        raise ConfigError(str(e)) from e
    for key in shadowed_overrides(cfg, args.overrides):
        print(
            f"rlcore: warning: the override {key}=... changes no stage: every stage sets {key} itself "
            f"(give it to one with stages.N.{key}=...)",
            file=sys.stderr,
        )
    return cfg, stages


def shadowed_overrides(cfg: DictConfig, overrides: list[str]) -> list[str]:
    """Keys of run-wide `key=value` overrides that every stage overrides again (so they change
    nothing that runs, e.g. algorithm.optimizer.lr on the quickstart, whose stages set their own).
    Only the sections a stage may override can be shadowed: `name=...` names the run (a stage's
    own `name` is the stage's)."""
    stages = OmegaConf.to_container(cfg.stages, resolve=False) if cfg.stages else []
    out = []
    for override in overrides:
        key = override.partition("=")[0].strip().lstrip("+~")
        if not stages or key.split(".")[0].split("[")[0] not in STAGE_SECTIONS:
            continue
        if all(_sets(stage, key.split(".")) for stage in stages):
            out.append(key)
    return out


def _sets(node: Any, parts: list[str]) -> bool:
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _prepare(args: argparse.Namespace) -> int:
    """`rlcore config prepare`: the assets a launch generates, made now (e.g. a scratch model for a
    service to serve before the launch that trains on it)."""
    _, stages = _load(args, check_machine=False)
    for stage in stages:  # a generator's package, named before anything heavy is imported
        try:
            check_packages(stage.config)
        except ConfigError as e:
            raise ConfigError(f"stages[{stage.index}].{e}" if len(stages) > 1 else str(e)) from None
    from transformers.utils import logging as transformers_logging

    from ..core.data.taskset import tasksets_of
    from ..runtime.preflight import prepare_assets

    transformers_logging.disable_progress_bar()  # one line per stage below says what was made
    try:
        prepare_assets(stages)
    except ValueError as e:  # user input found while making the assets, as in a launch
        raise ConfigError(str(e)) from e
    except ImportError as e:  # a package the checks above do not know of: still one line
        fix = f": {install_command(e.name)}" if e.name else ""
        raise ConfigError(f"config prepare: {e}{fix}") from e
    for stage in stages:
        paths = [stage.config.model.model_path] + [ts.path for _, ts in tasksets_of(stage.config)]
        print(f"{stage.name}: " + ", ".join(p for p in dict.fromkeys(paths) if os.path.exists(p)))
    return 0


def _show(args: argparse.Namespace) -> int:
    cfg, stages = _load(args, check_machine=False)
    if args.plan:
        import yaml

        from ..core.config.plan import explores_only, plan_launch

        plan = plan_launch([s.plan for s in stages], explores_only(cfg))
        print(yaml.safe_dump(plan.as_dict(), sort_keys=False), end="")
        return 0
    shown: list[tuple[str, Any]] = [("", cfg)] if args.stage is None else []
    if cfg.stages or args.stage is not None:
        picked = [s for s in stages if args.stage in (None, str(s.index), s.name)]
        if not picked:
            names = ", ".join(f"{s.index} ({s.name})" for s in stages)
            raise ConfigError(f"config show --stage: no stage '{args.stage}'; the stages: {names}")
        shown += [(f"# stage {s.index}: {s.name}\n", OmegaConf.structured(s.config)) for s in picked]
    for header, config in shown:
        print(header + (to_yaml(config) if args.key is None else _key_yaml(config, args.key)), end="")
    return 0


def _key_yaml(config: DictConfig, key: str) -> str:
    """`key: value` of a dotted key, as YAML; ConfigError (with the closest key) when there is none."""
    parts = key.split(".")
    if len(parts) >= 2 and parts[-2] == "algorithm" and parts[-1] in MOVED:  # a key that moved
        section, name = MOVED[parts[-1]]
        key = ".".join([*parts[:-1], section, name])
    node: Any = config
    for depth, part in enumerate(key.split(".")):
        if not isinstance(node, DictConfig) or part not in node:
            known = [str(k) for k in node.keys()] if isinstance(node, DictConfig) else []
            close = difflib.get_close_matches(part, known, n=1)
            prefix = ".".join(key.split(".")[:depth] + [close[0]]) if close else ""
            hint = f"; did you mean '{prefix}'?" if close else ""
            raise ConfigError(f"config show --key: '{key}' is not a key of the config{hint}")
        node = node[part]
    return to_yaml(OmegaConf.create({key: node}))


def _validate(args: argparse.Namespace) -> int:
    _, stages = _load(args)
    from ..core.data.prompt_lengths import check_prompt_lengths, has_tokenizer
    from ..core.data.taskset import tasksets_of
    from ..core.services import auxiliary_models
    from ..rollout.rewards.check import check_rewards  # the launch's preflight tries them too

    for stage in stages:
        configured = [a["name"] for a in auxiliary_models(stage.config)]
        for key, ts in tasksets_of(stage.config):
            check_rewards(key if len(stages) == 1 else f"stages[{stage.index}].{key}", ts, configured)
        trainer = stage.config.trainer
        if stage.plan.trainer == "local":  # what launch refuses, said here
            try:
                check_strategy_runs(trainer.strategy, stage.config.cluster.device, without_torch=True)
            except RuntimeError as e:
                raise ConfigError(str(e)) from None
    names = ", ".join(stage.name for stage in stages)
    lengths = ""
    if any(has_tokenizer(s.config.model.model_path) for s in stages):  # else no heavy import at all
        if not check_prompt_lengths(stages, only_on_disk=True):
            lengths = (
                "; prompt lengths of stages whose model or taskset is not on disk yet are checked at launch"
            )
    print(f"OK: {args.config} ({len(stages)} stage(s): {names}){lengths}")
    return 0


def _explain(key: str) -> int:
    """`rlcore config explain KEY`: the key's entry of the configuration reference (core/config/reference.py)."""
    from ..core.config.reference import explain

    try:
        print(explain(key))
    except ValueError as e:
        print(f"rlcore: error: {e}", file=sys.stderr)
        return _EXIT_USAGE
    return 0


def _launch(args: argparse.Namespace) -> int:
    cfg, stages = _load(args)  # the launch's one validation
    from ..runtime.child import QUIET_DATASETS
    from ..runtime.fork_server import ForkServer, wanted

    # stderr is for what goes wrong: no progress bars of the libraries preparing small assets (set
    # before the fork server starts: it compares its forks' start-up environment with its own)
    os.environ.setdefault(QUIET_DATASETS, "1")
    from ..runtime.launcher import launch  # heavy: torch, the strategy, the engines

    # forked now, the server has these imports; it adds the rest while this process prepares the run
    with ForkServer(wanted(stages[0].config.cluster)):
        try:
            return launch(cfg, stages)
        except ValueError as e:  # user-facing problems found while preparing the run (data, model, assets)
            raise ConfigError(str(e)) from e


def _warm() -> int:
    """`rlcore warm`: a warm fork server until Ctrl-C (runtime/warm_server.py)."""
    from ..runtime.fork_client import ENV
    from ..runtime.warm_server import WarmServer

    with WarmServer(export=False) as server:
        print("rlcore: importing torch, transformers, megatron-core and rlcore once...", file=sys.stderr, flush=True)
        server.wait_ready()
        print(f"export {ENV}={server.path}", flush=True)
        print(
            "rlcore: warm: rlcore commands started with that variable set start in a fork of this server; "
            "Ctrl-C ends it (and the runs forked from it)", file=sys.stderr, flush=True,
        )  # fmt: skip
        try:
            return server.wait()
        except KeyboardInterrupt:
            return 0


def entry() -> None:
    """The `rlcore` command (and `python -m rlcore.cli`): `main`, then the process ends without the
    interpreter's finalization (core/fast_exit.py: a second or more of a launch's end, and of each
    rollout worker's). Where RLCORE_FORK_SERVER names a warm fork server, the command runs in a fork
    of it (runtime/fork_client.py), which imported torch and the rest already."""
    from ..runtime.child import thread_settings
    from ..runtime.fork_client import hand_over

    thread_settings()  # before torch is imported, here or in a warm server's fork
    hand_over("rlcore.cli")
    from ..core.fast_exit import exit_now

    try:
        code = main()
    except BrokenPipeError:  # the reader of the output went (`rlcore config explain x | head`)
        code = 0
    exit_now(code)


def main(argv: list[str] | None = None) -> int:
    """What the `rlcore` command runs; returns the process exit code."""
    parser = build_parser()
    if not (sys.argv[1:] if argv is None else argv):  # a usage error, answered with the whole help
        parser.print_help(sys.stderr)
        parser.exit(_EXIT_USAGE)
    args = parser.parse_args(argv)
    try:
        if args.command == "launch":
            return _launch(args)
        if args.command == "rollout":
            from ..rollout.serve import serve_main

            return serve_main(args)
        if args.command == "bench":
            return _bench(args)
        if args.command == "trainer":
            from ..runtime.trainer_serve import serve_main as trainer_serve_main

            return trainer_serve_main(args)
        if args.command == "reward-model":
            from ..rollout.rewards.reward_server import serve_main as reward_serve_main

            return reward_serve_main(args)
        if args.command == "warm":
            return _warm()
        if args.command == "tinker":
            from ..runtime.tinker.serve import serve_main as tinker_serve_main

            return tinker_serve_main(args)
        if args.config_command == "show":
            return _show(args)
        if args.config_command == "prepare":
            return _prepare(args)
        if args.config_command == "explain":
            return _explain(args.key)
        return _validate(args)
    except ConfigError as e:  # user input: one line per problem, no traceback
        for line in str(e).splitlines():
            print(f"rlcore: error: {line}", file=sys.stderr)
        return _EXIT_USAGE
    except KeyboardInterrupt:
        print("rlcore: interrupted", file=sys.stderr)
        return _EXIT_INTERRUPTED
