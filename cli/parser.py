"""The `rlcore` command line: every subcommand's parser, with each flag's default in its help.
Building it imports nothing heavy (no torch, transformers, vllm, megatron or gRPC), so every
`--help` answers at once; cli/main.py runs what was asked."""

from __future__ import annotations

import argparse
import difflib
import re
from typing import Any, NoReturn

from ..backends import STRATEGIES
from ..rollout.engines import ENGINES


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each flag's default, unless it is none, off, or the help text says it already
    ("(default ..."); 0 is a default like any other (`is`, not `in`: 0 == False)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or action.default == argparse.SUPPRESS:
            return action.help
        if "(default" in (action.help or ""):  # the help text says it in words
            return action.help
        if action.default == "":
            return f"{action.help} (default: '')"
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """The `rlcore` parsers (subcommands' too, which argparse makes of the same class): defaults in
    --help, and a mistyped choice gets the closest one suggested."""

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(**kwargs)

    def error(self, message: str) -> NoReturn:
        if re.match(r"the following arguments are required: config\b", message):
            message = (
                f"a config file is required: {self.prog} CONFIG.yaml [key=value ...] "
                "(e.g. configs/quickstart.yaml)"
            )
        wrong = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if wrong:
            choices = re.findall(r"'([^']*)'", wrong.group(2))
            close = difflib.get_close_matches(wrong.group(1), choices, n=1)
            if close:
                message += f"; did you mean '{close[0]}'?"
        super().error(message)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rlcore")
    except PackageNotFoundError:
        return "unknown (not installed)"


DEVICE_HELP = "where the model runs (auto: cuda when a GPU is visible, else cpu)"
DTYPE_HELP = "compute dtype (auto: bfloat16 on cuda, float32 on cpu)"


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
        default=[],  # else argparse calls the overrides required when the config is missing
        metavar="key=value",
        help="dotted overrides applied after the YAML, later ones win (e.g. trainer.save_interval=10)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="rlcore", description="RL post-training for language models: one config, one command."
    )
    parser.add_argument("-V", "--version", action="version", version=f"rlcore {_version()}")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="{launch,config,rollout,trainer,reward-model,tinker,bench,warm}"
    )

    launch = commands.add_parser("launch", help="validate the config, then run every stage")
    _add_config_args(launch)

    _add_config_parser(commands)
    _add_rollout_parser(commands)
    _add_trainer_parser(commands)
    _add_reward_model_parser(commands)
    _add_tinker_parser(commands)
    _add_bench_parser(commands)
    commands.add_parser(
        "warm", help="keep a warm fork server open: rlcore commands started with the RLCORE_FORK_SERVER it "
        "prints start in a fork of it (torch, transformers, megatron-core and rlcore imported), in seconds",
    )  # fmt: skip
    return parser


def _add_config_parser(commands: Any) -> None:
    config = commands.add_parser("config", help="inspect a config without running it")
    config_commands = config.add_subparsers(dest="config_command", required=True, metavar="{show,validate,prepare,explain}")
    show = config_commands.add_parser(
        "show", help="print the resolved config (and each resolved stage) as YAML; paths are not checked"
    )
    _add_config_args(show)
    show.add_argument("--stage", help="only this stage (its index or name), resolved")
    show.add_argument(
        "--key", help="only this dotted key (e.g. algorithm.optimizer.lr), in every stage shown"
    )
    show.add_argument(
        "--plan", action="store_true",
        help="the run's plan instead: each stage's experience source, engines, weight path, trainer and "
        "algorithm passes, as the launch decides them (mode=explore: the explore launch's)",
    )
    validate = config_commands.add_parser(
        "validate", help="check keys, types, values, paths and monitor packages; print OK on success"
    )
    _add_config_args(validate)
    prepare = config_commands.add_parser(
        "prepare", help="generate the config's synthetic tasksets and scratch model (as a launch would) and print where"
    )
    _add_config_args(prepare)
    explain = config_commands.add_parser(
        "explain", help="what a config key is: its type, default, allowed values and text (a section: its keys too)"
    )
    explain.add_argument("key", help="a dotted key, e.g. algorithm.optimizer.lr or buffer.explorer_input.eval_tasksets[0].name")


def _add_rollout_parser(commands: Any) -> None:
    """`rlcore rollout serve`: its engine flags default to the config's (RolloutModelConfig), the
    values `rlcore launch` starts its workers with."""
    from ..core.config.schema import RolloutModelConfig

    engine = RolloutModelConfig()
    rollout = commands.add_parser("rollout", help="rollout workers")
    rollout_commands = rollout.add_subparsers(dest="rollout_command", required=True, metavar="{serve}")
    serve = rollout_commands.add_parser(
        "serve", help="serve an inference engine over gRPC (RolloutService) until interrupted"
    )
    serve.add_argument("--model", required=True, help="HF model folder")
    serve.add_argument(
        "--engine", default=engine.engine_type, metavar="ENGINE",
        help=f"inference engine: {', '.join(ENGINES)} or a RolloutEngine subclass by import path "
        f"'pkg.mod:Class' (default {engine.engine_type})",
    )  # fmt: skip
    serve.add_argument(
        "--engine-spec", default="", metavar="JSON",
        help="the whole engine as `rlcore launch` resolves it from its config (rollout/engines/spec.py's "
        "EngineSpec); it replaces the engine flags",
    )  # fmt: skip
    serve.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help=DEVICE_HELP)
    serve.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"], help=DTYPE_HELP
    )
    serve.add_argument(
        "--max-model-len", type=int, default=None,
        help="longest prompt + response in tokens (default and most: the model's position limit)",
    )  # fmt: skip
    serve.add_argument(
        "--max-batch-size", type=int, default=engine.max_batch_size, help="sequences per engine call"
    )
    serve.add_argument(
        "--tensor-parallel-size", type=int, default=engine.tensor_parallel_size, help="GPUs one vLLM engine spans (vllm only)"
    )
    serve.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=engine.gpu_memory_utilization,
        help="share of GPU memory vLLM may take (vllm only)",
    )
    serve.add_argument("--enforce-eager", action="store_true", help="vLLM without CUDA graphs (vllm only)")
    serve.add_argument(
        "--partial-rollout", action="store_true",
        help="a weight update interrupts running tasks' generation, which continues under the new weights (hf, vllm)",
    )  # fmt: skip
    serve.add_argument("--seed", type=int, default=0, help="engine seed (vllm)")
    serve.add_argument(
        "--service-url", default="", help="the Tinker service the tinker engine samples from (tinker only)"
    )
    serve.add_argument(
        "--service-model", default="", help="the base model's name at --service-url (default: --model)"
    )
    serve.add_argument(
        "--service-key-env", default="TINKER_API_KEY", help="environment variable holding that service's API key"
    )
    serve.add_argument(
        "--threads", type=int, default=0, help="CPU threads for the engine (0: torch's default)"
    )
    serve.add_argument(
        "--register", metavar="HOST:PORT", help="RunService of a run to join (RegisterWorker + heartbeats)"
    )
    serve.add_argument(
        "--register-timeout", type=float, default=300.0, metavar="S",
        help="how long to wait for that run's controller to answer the first time (a worker may start "
        "before the launch that serves it; default 300 s, as control.worker_start_timeout)",
    )  # fmt: skip
    serve.add_argument("--index", type=int, default=-1, help="worker index given by the launcher")
    _add_lora_args(serve)
    _add_door_args(serve)
    _add_server_args(serve)


def _add_lora_args(serve: argparse.ArgumentParser) -> None:
    """`rlcore rollout serve`'s LoRA adapters held beside the weights (rollout/engines/adapters.py)."""
    serve.add_argument(
        "--lora-modules", nargs="+", default=[], metavar="NAME=PATH",
        help="LoRA adapters (peft folders) to hold beside the weights, each chosen by requests naming it "
        "(sampling.adapter, the HTTP door's model)",
    )  # fmt: skip
    serve.add_argument(
        "--max-loras", type=int, default=None, metavar="N",
        help="LoRA adapters the engine may hold at once (default: hf 8; vllm 0, which holds none: give N to serve any)",
    )  # fmt: skip
    serve.add_argument(
        "--max-lora-rank", type=int, default=None, metavar="R", help="the largest adapter rank vLLM makes room for (vllm; default 16)"
    )


def _add_door_args(serve: argparse.ArgumentParser) -> None:
    """`rlcore rollout serve`'s OpenAI-compatible door."""
    serve.add_argument(
        "--http-port", type=int, default=None,
        help="also serve an OpenAI-compatible API (/v1/models, /v1/completions, /v1/chat/completions) on this port (0: any free one)",
    )  # fmt: skip
    serve.add_argument("--http-port-file", help="write host:port of the HTTP door here once it listens")
    serve.add_argument("--http-max-n", type=int, default=64, help="completions one HTTP request may ask for")
    serve.add_argument(
        "--http-max-request-tokens", type=int, default=1 << 18,
        help="n x max_tokens one HTTP request may ask for (it holds the engine meanwhile)",
    )  # fmt: skip
    serve.add_argument(
        "--tool-call-format", default="auto", choices=("auto", "hermes", "llama3_json", "mistral", "response_template"),
        help="how the model writes tool calls, read back into the door's tool_calls (auto: the tokenizer's response "
        "template, else the format its chat template renders)",
    )  # fmt: skip
    serve.add_argument(
        "--http-batch-wait-ms", type=float, default=10.0,
        help="a request that finds the engine idle waits this long for concurrent ones to share its engine call (0: never)",
    )  # fmt: skip
    serve.add_argument(
        "--served-model-name",
        help="the model name the HTTP door answers to (default: the model folder's name)",
    )


def _add_trainer_parser(commands: Any) -> None:
    trainer = commands.add_parser("trainer", help="trainer worlds")
    trainer_commands = trainer.add_subparsers(dest="trainer_command", required=True, metavar="{serve}")
    tserve = trainer_commands.add_parser(
        "serve", help="start a trainer world whose rank 0 serves TrainerService until interrupted"
    )
    tserve.add_argument("--ranks", type=int, default=1, help="trainer processes on this machine")
    tserve.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help=DEVICE_HELP)
    tserve.add_argument("--threads", type=int, default=0, help="CPU threads per rank (0: cores / ranks)")
    nodes = tserve.add_argument_group(
        "across hosts", "every host runs `rlcore trainer serve` with the same --nnodes and --rdzv-endpoint and its "
        "own --node-rank; node 0's first rank serves TrainerService (--host, --port)",
    )  # fmt: skip
    nodes.add_argument(
        "--nnodes", type=int, default=1, help="trainer hosts in the world (each with --ranks ranks)"
    )
    nodes.add_argument(
        "--node-rank", type=int, default=0, help="this host's place: 0 (serves, hosts the rendezvous), 1, ..."
    )
    nodes.add_argument(
        "--rdzv-endpoint", default="", help="host:port of the rendezvous on node 0, reachable from every host"
    )
    nodes.add_argument(
        "--node-address", default="", help="the address the other hosts reach this one at (default: its name)"
    )
    nodes.add_argument(
        "--collective-timeout", type=float, default=1800.0,
        help="seconds a collective waits for a lost node (rank 0's sends too); node K > 0 ends its ranks "
        "after node 0's rendezvous has not answered this long",
    )  # fmt: skip
    nodes.add_argument(
        "--rdzv-timeout",
        type=int,
        default=600,
        help="seconds the hosts wait for each other at the rendezvous",
    )
    _add_server_args(tserve)


def _add_reward_model_parser(commands: Any) -> None:
    reward = commands.add_parser("reward-model", help="reward model servers")
    sub = reward.add_subparsers(dest="reward_model_command", required=True, metavar="{serve}")
    serve = sub.add_parser(
        "serve", help="serve a reward model over gRPC (RewardService) until interrupted: a taskset's "
        "reward_model.address scores with it",
    )  # fmt: skip
    serve.add_argument(
        "--model", required=True,
        help="folder AutoModelForSequenceClassification loads with one label (a reward_model stage's export)",
    )  # fmt: skip
    serve.add_argument("--batch-size", type=int, default=32, help="rows per forward pass (across calls)")
    serve.add_argument(
        "--batch-wait-ms", type=float, default=5.0,
        help="a call that finds the model idle waits this long for concurrent calls to share its pass (0: never)",
    )  # fmt: skip
    _add_server_args(serve)


def _add_tinker_parser(commands: Any) -> None:
    tinker = commands.add_parser("tinker", help="serve the Tinker API (the official `tinker` SDK's)")
    sub = tinker.add_subparsers(dest="tinker_command", required=True, metavar="{serve}")
    serve = sub.add_parser("serve", help="serve the Tinker API over a trainer world and a sampling engine")
    serve.add_argument(
        "--base-model", action="append", required=True, metavar="NAME=PATH",
        help="a model clients may train and sample: the name they give as base_model, and its HF folder "
        "(PATH alone: named after its folder); repeat for several",
    )  # fmt: skip
    serve.add_argument(
        "--strategy", default="fsdp2", choices=["fsdp", "fsdp2", "megatron"], help="training strategy"
    )
    serve.add_argument("--ranks", type=int, default=1, help="trainer processes")
    serve.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help=DEVICE_HELP)
    serve.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help=DTYPE_HELP)
    serve.add_argument("--threads", type=int, default=0, help="CPU threads per trainer rank (0: cores / ranks)")
    serve.add_argument("--max-model-len", type=int, default=2048, help="longest sequence trained or sampled")
    serve.add_argument(
        "--max-models", type=int, default=8,
        help="training models held at once (each client's create_model is one; they take turns on the trainer)",
    )  # fmt: skip
    serve.add_argument(
        "--max-model-mb", type=float, default=0.0,
        help="the most weights and AdamW state (MB, float32) one model may train: a create_model asking for more "
        "(a larger LoRA rank, full fine-tuning) is refused (0: no limit)",
    )  # fmt: skip
    serve.add_argument(
        "--keep-samplers", type=int, default=3,
        help="unnamed sampler weights (one per save_weights_and_get_sampling_client) kept per model; older ones "
        "are deleted",
    )  # fmt: skip
    serve.add_argument("--trainer", default="", help="host:port of a running `rlcore trainer serve` to use")
    serve.add_argument("--trainer-token-env", default="", help="with --trainer: the variable holding its token")
    serve.add_argument(
        "--workdir", default="checkpoints/tinker", help="checkpoints, sampler weights and the trainer's logs"
    )
    serve.add_argument("--host", default="127.0.0.1", help="interface to bind (127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=8000, help="0: any free port (see --port-file)")
    serve.add_argument("--port-file", default="", help="write host:port here once serving")
    serve.add_argument(
        "--api-key-env", default="TINKER_API_KEY",
        help="the variable holding the key clients must send (X-API-Key; the SDK wants it to start with tml-), or "
        "several separated by commas: each key a tenant, which reaches only what it created",
    )  # fmt: skip


def _add_bench_parser(commands: Any) -> None:
    from ..benchmarks import BENCHMARKS

    bench = commands.add_parser(
        "bench",
        help="run a benchmark; results under runs/bench/ unless --out (`rlcore bench NAME --help` for its flags)",
    )
    bench.add_argument("name", choices=sorted(BENCHMARKS), help="which benchmark")
    bench.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's own flags")


def _add_server_args(parser: argparse.ArgumentParser) -> None:
    """Flags every server takes (the same meaning as the control.* config keys)."""
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: this machine only)")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: any free port)")
    parser.add_argument(
        "--port-file", help="write the bound host:port to this file once serving (for scripts using --port 0)"
    )
    parser.add_argument(
        "--token-env", default="RLCORE_TOKEN", help="environment variable holding the shared token"
    )
    parser.add_argument("--max-message-mb", type=int, default=64, help="largest message sent or received")
    parser.add_argument("--tls-cert", help="PEM certificate chain (enables TLS with --tls-key)")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert")
    parser.add_argument("--tls-ca", help="PEM CA bundle that client certificates must chain to")
    parser.add_argument("--tls-require-client-cert", action="store_true", help="mutual TLS (needs --tls-ca)")
