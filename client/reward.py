"""Client of a reward model's server (RewardService, `rlcore reward-model serve`): score (prompt,
response) pairs from anywhere, rendered as the caller's PromptFormat says."""

from __future__ import annotations

import json
from collections.abc import Sequence

from ..core.data.prompts import PromptFormat
from ..proto.v1 import reward_pb2, reward_pb2_grpc
from .base import BlockingClient


def prompt_format_to_proto(fmt: PromptFormat) -> reward_pb2.PromptFormat:
    """`fmt` on the wire (its tools are not: a reward model is not shown them)."""
    return reward_pb2.PromptFormat(
        apply_chat_template=fmt.apply_chat_template, chat_template=fmt.chat_template or "",
        system_prompt=fmt.system_prompt, template_kwargs_json=json.dumps(fmt.template_kwargs or {}),
        max_prompt_tokens=fmt.max_prompt_tokens,
    )  # fmt: skip


class RewardClient(BlockingClient):
    stub_class = reward_pb2_grpc.RewardServiceStub
    role = "reward model server"

    def score(
        self, prompts: Sequence[str], completions: Sequence[str], prompt_format: PromptFormat,
        timeout: float | None = None,
    ) -> list[float]:
        """Each (prompt, completion)'s raw score, in order."""
        request = reward_pb2.ScoreRequest(
            prompts=list(prompts), completions=list(completions), prompt_format=prompt_format_to_proto(prompt_format)
        )
        scores = list(self._unary("Score", request, timeout).scores)
        if len(scores) != len(prompts):
            raise ValueError(f"{self.peer}: Score answered {len(scores)} scores for {len(prompts)} rows")
        return scores

    def info(self, timeout: float | None = None) -> reward_pb2.RewardInfo:
        return self._unary("GetInfo", reward_pb2.GetRewardInfoRequest(), timeout)
