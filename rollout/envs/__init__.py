"""Text environments for the `multi_turn` workflow (envs/base.py: TextEnv), by registered name or
by import path 'pkg.mod:Class'."""

from __future__ import annotations

from ...core.registry import Registry, import_path
from .base import TextEnv

ENVS = Registry(
    "workflow_args.env", {"arithmetic_chain": "rlcore.rollout.envs.arithmetic_chain:ArithmeticChainEnv"}
)


def resolve_env(name: str) -> type[TextEnv]:
    """A registered environment, or a TextEnv subclass by import path (ValueError otherwise)."""
    if name not in ENVS and ":" not in name:
        raise ValueError(f"'{name}' is not one of {', '.join(ENVS)} (nor an import path 'pkg.mod:Class')")
    cls = ENVS.resolve(name) if name in ENVS else import_path(name, what="environment")
    if not (isinstance(cls, type) and issubclass(cls, TextEnv)):
        raise ValueError(
            f"environment '{name}' is not a TextEnv subclass (got {cls!r}); give a class deriving from "
            "rlcore.rollout.envs.base.TextEnv"
        )
    return cls
