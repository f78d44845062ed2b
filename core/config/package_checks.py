"""The optional packages (pyproject's extras) a config needs on this machine, checked with its other
requirements (`config validate`, `config prepare`, `launch`): one line naming the key that needs one
and the pip command that installs it, instead of an ImportError once the run has started."""

from __future__ import annotations

import importlib.util

from .errors import ConfigError
from .schema import RLCoreConfig

EXTRAS = {
    "verifiers": "verifiers",
    "openai": "http",
    "fastapi": "http",
    "uvicorn": "http",
    "peft": "lora",
    "sqlalchemy": "sql",
    "psycopg": "sql",
    "tinker": "tinker",
    "vllm": "vllm",
    "megatron": "megatron",
    "tensorboard": "tracking",
    "wandb": "tracking",
    "mlflow": "tracking",
    "trl": "bench",
    "matplotlib": "bench",
}
"""Import name -> the extra of pyproject.toml that installs it."""


def install_command(module: str) -> str:
    """How to install the package of `module` (an import name, dotted or not)."""
    top = module.split(".")[0]
    return f"pip install 'rlcore[{EXTRAS[top]}]'" if top in EXTRAS else f"pip install {top}"


def missing(modules: tuple[str, ...]) -> str | None:
    """The first of `modules` not installed here, else None."""
    return next((m for m in modules if importlib.util.find_spec(m) is None), None)


VERIFIERS_WORKFLOW = ("verifiers", "fastapi", "uvicorn")
"""The verifiers workflow: the environments, and the loopback OpenAI-compatible door they play against."""


def check_packages(cfg: RLCoreConfig) -> None:
    """Raise ConfigError when this machine lacks a package the config's tasksets or services need."""
    from ..data.taskset import tasksets_of
    from ..services import auxiliary_models

    for key, ts in tasksets_of(cfg):
        needs = [
            (f"{key}.default_workflow_type", "the verifiers workflow", VERIFIERS_WORKFLOW, ts.default_workflow_type),
            (f"{key}.generator", "the verifiers generator", ("verifiers",), ts.generator),
        ]  # fmt: skip
        for where, what, modules, value in needs:
            absent = missing(modules) if value == "verifiers" else None
            if absent is not None:
                raise ConfigError(
                    f"{where}: {what} needs the {absent} package, which is not installed here: "
                    f"{install_command(absent)}"
                )
    services = [spec["name"] for spec in auxiliary_models(cfg)]
    if services and missing(("openai",)) is not None:
        key = "explorer.auxiliary_models" if cfg.explorer.auxiliary_models else "model.external_model"
        raise ConfigError(
            f"{key}: the services ({', '.join(services)}) are reached with the openai package, which is not "
            f"installed here: {install_command('openai')}"
        )
