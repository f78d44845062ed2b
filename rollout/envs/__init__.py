"""Text environments for the `multi_turn` workflow (envs/base.py: TextEnv), by registered name or
by import path 'pkg.mod:Class'."""

from __future__ import annotations

from ...core.registry import Registry
from .base import TextEnv

ENVS = Registry(
    "workflow_args.env", {"arithmetic_chain": "rlcore.rollout.envs.arithmetic_chain:ArithmeticChainEnv"}
)


def resolve_env(name: str) -> type[TextEnv]:
    """A registered environment, or a TextEnv subclass by import path (ValueError otherwise)."""
    return ENVS.resolve_class(name, TextEnv, "environment")
