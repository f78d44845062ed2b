"""The loop behind the conversation workflows (multi_turn, tool_call): the model replies, the other
side (an environment, the tools) answers, until it ends the episode or a limit does.

One experience per episode: the first observation is the prompt; the response is every later
token, the model's replies (loss mask 1, their engine log-probs) and the other side's turns
between them (loss mask 0), all as the engine generated and the template rendered them. Its reward
is the sum of the environment's step rewards plus the taskset's reward functions on the last reply.

Unless the chat template renders the conversation so far differently once the next turn follows (a
thinking template, as Qwen3's, drops the reasoning of the turns before a new user turn): the tokens
the model saw can then not be extended. The episode goes on as a new sample whose prompt is the
template's rendering of the whole conversation (context, never trained), the earlier sample kept
exactly as the engine produced it; its samples share the episode's id, reward and finish reason
(Experience.episode_id: they count once in their group's statistics).

Limits (`workflow_args`): `max_turns` model replies (then finish reason "max_turns");
`max_tokens_per_turn` (default the rollout's max_tokens); `max_total_tokens` for the whole response
(default none), and the model length: a turn gets only the room left, and an episode with no room
for its next observation or reply ends with finish reason "length".
"""

from __future__ import annotations

import time
import uuid
from abc import abstractmethod
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any, cast

from ...core.types import Experience, SamplingParams, Task, routing_tokens
from ..envs.base import TextEnv
from .base import Workflow
from .turns import HistoryRerendered, TurnFormat


@dataclass
class Sample:
    """A finished sample of an episode that went on as a new one (its last reply's text)."""

    prompt: list[int]
    response: list[int]
    logprobs: list[float]
    mask: list[int]
    last_reply: str
    routes: bytes = b""


@dataclass
class Episode:
    """One conversation in progress."""

    task: Task
    env: TextEnv
    prompt: list[int]
    messages: list[dict[str, Any]] = field(default_factory=list)
    """The conversation as messages (the first observation, each reply's text, each turn after it):
    what the chat template renders when the episode goes on as a new sample."""
    response: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    env_reward: float = 0.0
    turns: int = 0
    last_reply: str = ""
    last_reply_ids: list[int] = field(default_factory=list)
    finish: str | None = None
    """Set when the episode is over."""
    earlier: list[Sample] = field(default_factory=list)
    """The samples before the current one (module docstring)."""
    routes: bytes = b""
    """Rollout routing replay: the experts of each token of the current sample (but the last) as the
    engine call that first ran it routed it (the prompt's and an observation's by the next call's
    prefill, a reply's by the decode that generated it): core/moe_routing's layout."""

    @property
    def context(self) -> list[int]:
        return self.prompt + self.response

    @property
    def response_tokens(self) -> int:
        """Response tokens of the whole episode (max_total_tokens counts them)."""
        return len(self.response) + sum(len(s.response) for s in self.earlier)

    def new_sample(self, prompt: list[int]) -> None:
        """Go on from `prompt` (the whole conversation rendered again), the current sample kept."""
        self.earlier.append(
            Sample(self.prompt, self.response, self.logprobs, self.mask, self.last_reply, self.routes)
        )
        self.prompt, self.response, self.logprobs, self.mask, self.routes = prompt, [], [], [], b""

    def add_routes(self, call_prompt: int, completion: Any) -> None:
        """An engine call's record (of `call_prompt` tokens and the completion) for the tokens no
        earlier call of this sample ran."""
        record = completion.routed_experts
        if not record:
            return
        covered = routing_tokens(call_prompt, len(completion.token_ids))
        width = len(record) // covered
        self.routes += record[len(self.routes) : covered * width]

    def add(self, ids: list[int], logprobs: list[float] | None) -> None:
        """Append the model's tokens (with their log-probs) or context tokens (logprobs None)."""
        self.response += ids
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.mask += [1 if logprobs is not None else 0] * len(ids)


def positive_int(args: dict[str, Any], key: str, default: int | None) -> int | None:
    value = args.get(key, default)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"workflow_args.{key} must be a positive integer; got {value!r}")
    return value


LIMITS = ("max_turns", "max_tokens_per_turn", "max_total_tokens")


class ConversationWorkflow(Workflow):
    """Subclasses name their `workflow_args` keys (KEYS, LIMITS among them), check them in
    `check_args` and start an episode in `start`."""

    KEYS: tuple[str, ...] = LIMITS

    @classmethod
    def check_args(cls, args: dict[str, Any]) -> None:
        super().check_args(args)
        for key in LIMITS:
            positive_int(args, key, None)

    def __init__(self, *a: Any, **kw: Any):
        super().__init__(*a, **kw)
        self.check_args(self.args)
        self.max_turns = positive_int(self.args, "max_turns", 4)
        self.max_tokens_per_turn = positive_int(self.args, "max_tokens_per_turn", None)
        self.max_total_tokens = positive_int(self.args, "max_total_tokens", None)
        self.max_model_len: int = cast(
            Any, self.engine
        ).max_model_len  # every engine has one (engines/base.py)

    @property
    def turns(self) -> TurnFormat:
        """How the other side's turns are rendered (built on first use: a subclass may set
        prompt_format.tools first)."""
        if getattr(self, "_turns", None) is None:
            pf = self.prompt_format
            self._turns = TurnFormat(
                self.tokenizer, pf.apply_chat_template, pf.chat_template, pf.system_prompt, pf.tools,
                pf.template_kwargs,
            )  # fmt: skip
        return self._turns

    @abstractmethod
    def start(self, task: Task) -> Episode:
        """A new episode of `task`: its environment, reset, and the first observation encoded."""

    def room(self, ep: Episode, per_turn: int) -> int:
        """Tokens the episode's next reply may take."""
        room = min(per_turn, self.max_model_len - len(ep.context))
        if self.max_total_tokens is not None:
            room = min(room, self.max_total_tokens - ep.response_tokens)
        return room

    def run(self, tasks: list[Task], sampling: SamplingParams, policy_version: int) -> list[Experience]:
        start = time.perf_counter()
        engine_s = 0.0
        episodes = [self.start(task) for task in tasks for _ in range(sampling.n)]
        per_turn = self.max_tokens_per_turn or sampling.max_tokens
        while True:
            live = [ep for ep in episodes if ep.finish is None]
            for ep in live:
                if self.room(ep, per_turn) < 1:
                    ep.finish = "length"
            live = [ep for ep in live if ep.finish is None]
            if not live:
                break
            t0 = time.perf_counter()
            self.reply(live, sampling, per_turn)
            engine_s += time.perf_counter() - t0
            for ep in live:
                self.observe(ep)
        for ep in episodes:
            if not ep.response:
                raise ValueError(
                    f"task {ep.task.task_id}: its first observation ({len(ep.prompt)} tokens) leaves no room for a "
                    f"reply within max_model_len {self.max_model_len}"
                )
        # the last replies scored as one batch (a judge asks about them in one concurrent round)
        scored = self.reward.score_batch([ep.last_reply for ep in episodes], [ep.task for ep in episodes])
        experiences = [
            e for ep, s in zip(episodes, scored, strict=True) for e in self.experiences(ep, policy_version, *s)
        ]
        self.timing = {"engine_s": engine_s, "reward_s": time.perf_counter() - start - engine_s}
        return experiences

    def reply(self, live: list[Episode], sampling: SamplingParams, per_turn: int) -> None:
        """One model turn for every live episode. Episodes at the same context sample together as
        one prompt's n samples (a seeded prompt's samples differ from each other, and depend on the
        prompt alone), in one engine call per (room, n)."""
        same: dict[tuple[tuple[int, ...], int], list[Episode]] = defaultdict(list)
        for ep in live:
            same[(tuple(ep.context), self.room(ep, per_turn))].append(ep)
        calls: dict[tuple[int, int], list[list[Episode]]] = defaultdict(list)
        for (_, room), group in same.items():
            calls[(room, len(group))].append(group)
        for (room, n), groups in calls.items():
            prompts = [groups_[0].context for groups_ in groups]
            completions = self.engine.generate(prompts, replace(sampling, n=n, max_tokens=room))
            for group, samples in zip(groups, completions, strict=True):
                for ep, c in zip(group, samples, strict=True):
                    ep.add_routes(len(ep.context), c)
                    ep.add(c.token_ids, c.logprobs)
                    ep.turns += 1
                    ep.last_reply, ep.last_reply_ids = c.text, c.token_ids
                    ep.messages.append({"role": "assistant", "content": c.text})

    def observe(self, ep: Episode) -> None:
        """The environment's answer to the episode's last reply, appended unless the episode ends."""
        result = ep.env.step(ep.last_reply)
        ep.env_reward += float(result.reward)
        if result.done:
            ep.finish = "stop"
            return
        if ep.turns == self.max_turns:  # no reply would follow the observation
            ep.finish = "max_turns"
            return
        messages = result.messages or [{"role": "user", "content": result.observation}]
        try:
            ids: list[int] | None = self.turns.after_reply(ep.last_reply_ids, messages, ep.messages)
        except HistoryRerendered:
            ids = None
        ep.messages += messages
        if ids is None:
            self.go_on_as_new_sample(ep)
            return
        if len(ep.context) + len(ids) >= self.max_model_len or (
            self.max_total_tokens is not None and ep.response_tokens + len(ids) >= self.max_total_tokens
        ):
            ep.finish = "length"  # no room for the observation and a reply to it
            return
        ep.add(ids, None)

    def go_on_as_new_sample(self, ep: Episode) -> None:
        """The template rendered the history anew once the last turns followed: a new sample from
        the whole conversation rendered again, or the end ("length") when it leaves no room for a reply."""
        prompt = self.tokenizer(
            self.format_for(ep.task).render(self.tokenizer, ep.messages, True),
            add_special_tokens=False,
        )["input_ids"]
        if len(prompt) >= self.max_model_len or (
            self.max_total_tokens is not None and ep.response_tokens >= self.max_total_tokens
        ):
            ep.finish = "length"
            return
        ep.new_sample(list(prompt))

    def experiences(
        self, ep: Episode, policy_version: int, reward: float, components: dict[str, float]
    ) -> list[Experience]:
        """The episode as one experience per sample; `reward` and `components`: the taskset's
        rewards of its last reply. Its samples share the episode's reward, finish and counts."""
        components = {"env": ep.env_reward, **components}
        current = Sample(ep.prompt, ep.response, ep.logprobs, ep.mask, ep.last_reply, ep.routes)
        samples = [*ep.earlier, current]
        episode_id = f"{ep.task.task_id}/{uuid.uuid4().hex}" if len(samples) > 1 else ""
        return [
            Experience(
                prompt_token_ids=s.prompt,
                response_token_ids=s.response,
                logprobs=s.logprobs,
                reward=ep.env_reward + reward,
                group_id=ep.task.task_id,
                policy_version=policy_version,
                finish_reason=ep.finish or "stop",
                response_text=s.last_reply,
                reward_components=components,
                loss_mask=s.mask if 0 in s.mask else [],
                metrics={"turns": float(ep.turns), **ep.env.metrics},
                episode_id=episode_id,
                routed_experts=s.routes,
            )
            for s in samples
        ]
