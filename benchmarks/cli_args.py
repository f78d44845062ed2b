"""Command-line pieces the benchmarks share: argparse types (positive integers, comma lists of
integers or CPU ids or names), the model flags (--device, --dtype, --model) and the usage checks
that go with them."""

from __future__ import annotations

import argparse
import os

from .common import MODELS


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1; got {value}")
    return value


def int_list(text: str) -> list[int]:
    """argparse type: comma-separated different integers >= 1, e.g. 2,4,8,16."""
    return _distinct_ints(text, 1, "integers")


def cpu_list(text: str) -> list[int]:
    """argparse type: comma-separated different CPU ids (>= 0), e.g. 0 or 2,3."""
    return _distinct_ints(text, 0, "CPU ids")


def _distinct_ints(text: str, minimum: int, what: str) -> list[int]:
    try:
        values = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated {what}; got '{text}'") from None
    if not values or min(values) < minimum or len(set(values)) < len(values):
        raise argparse.ArgumentTypeError(f"must list different {what} >= {minimum}; got '{text}'")
    return values


def comma_names(parser: argparse.ArgumentParser, flag: str, text: str, choices: tuple[str, ...]) -> list[str]:
    """The comma-separated names of `flag`, each one of `choices` (a usage error otherwise)."""
    picked = [c.strip() for c in text.split(",") if c.strip()]
    if not picked or any(c not in choices for c in picked):
        parser.error(f"{flag} must list some of {', '.join(choices)}; got '{text}'")
    return picked


def missing_packages(*modules: str) -> list[str]:
    """The modules of `modules` that cannot be imported here."""
    import importlib.util

    return [m for m in modules if importlib.util.find_spec(m) is None]


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """--device, --dtype and --model, shared by the benchmarks that train or generate."""
    add_device_args(parser)
    parser.add_argument("--model", default="tiny", choices=tuple(MODELS), help="the scratch model's shape")


def add_device_args(parser: argparse.ArgumentParser) -> None:
    """--device and --dtype."""
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the model runs")
    parser.add_argument(
        "--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
        help="weights and compute of both sides (auto: bfloat16 on cuda, float32 on cpu)",
    )  # fmt: skip


def resolved_dtype(args: argparse.Namespace) -> str:
    from ..core.config.dtypes import compute_dtype

    return compute_dtype(args.dtype, args.device)


def check_device(parser: argparse.ArgumentParser, device: str) -> None:
    """--device cuda needs a GPU this process sees (a usage error otherwise)."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible to torch here")


def check_separate_cpus(parser: argparse.ArgumentParser, trainer: list[int], rollout: list[int]) -> None:
    """--trainer-cpus and --rollout-cpus: usable by this process, and no CPU in both."""
    usable = os.sched_getaffinity(0)
    for flag, cpus in (("--trainer-cpus", trainer), ("--rollout-cpus", rollout)):
        if not set(cpus) <= usable:
            parser.error(f"{flag} {cpus}: this process may use CPUs {sorted(usable)} only")
    if set(trainer) & set(rollout):
        parser.error("--trainer-cpus and --rollout-cpus must not share a CPU: the point is separate devices")
