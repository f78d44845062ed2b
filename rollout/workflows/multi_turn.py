"""`multi_turn`: a conversation with a text environment (rollout/envs), on the loop of
conversation.py (its limits, finish reasons and experience layout)."""

from __future__ import annotations

from typing import Any

from ...core.types import Task
from ..envs import resolve_env
from .conversation import LIMITS, ConversationWorkflow, Episode


class MultiTurnWorkflow(ConversationWorkflow):
    """`workflow_args`: env (registered name or 'pkg.mod:Class'), env_args (object), max_turns
    (default 4), max_tokens_per_turn, max_total_tokens."""

    KEYS = ("env", "env_args", *LIMITS)

    @classmethod
    def check_args(cls, args: dict[str, Any]) -> None:
        super().check_args(args)
        if not isinstance(args.get("env"), str):
            raise ValueError(
                "workflow_args.env: name the environment (arithmetic_chain, or 'pkg.mod:Class' of a TextEnv)"
            )
        try:
            resolve_env(args["env"])
        except ValueError as e:
            raise ValueError(f"workflow_args.env: {e}") from None
        if not isinstance(args.get("env_args", {}), dict):
            raise ValueError(f"workflow_args.env_args must be an object; got {args['env_args']!r}")

    def __init__(self, *a: Any, **kw: Any):
        super().__init__(*a, **kw)
        self.env_cls = resolve_env(self.args["env"])
        self.env_args = self.args.get("env_args", {})

    def start(self, task: Task) -> Episode:
        env = self.env_cls(task, self.env_args)
        first = env.reset()
        prompt = self.format_for(task).encode_prompt(self.tokenizer, first)  # its row's system prompt too
        return Episode(task, env, prompt, messages=[{"role": "user", "content": first}])
