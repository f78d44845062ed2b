"""The Workflow interface: a batch of tasks + an engine -> scored experiences."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ...core.data.prompts import PromptFormat
from ...core.types import Experience, SamplingParams, Task
from ..auxiliary import AuxiliaryModel
from ..engines.base import RolloutEngine
from ..rewards.compose import RewardComposer


class Door(Protocol):
    """An OpenAI-compatible door over an engine on loopback (rollout/loopback_door.py), for the
    programs of a workflow that call the model over HTTP: each request carries its episode id
    (X-Episode-Id) and `recorder` (rollout/episodes.py) keeps the episode's turns token by token."""

    base_url: str
    key_env: str
    """The environment variable of this process that holds the door's token."""
    model_name: str
    recorder: Any


@dataclass(frozen=True)
class WorkflowContext:
    """What the process that runs a workflow hands it (a rollout worker, an engine in the trainer's
    process): `open_door(engine)`, a Door over `engine` (None: this process serves none)."""

    open_door: Callable[[RolloutEngine], Door] | None = None


class Workflow(ABC):
    """Built once per distinct WorkflowSpec on an engine (rollout workers cache them), then run on
    batch after batch. Construction: `Workflow(engine, tokenizer, reward, *, max_prompt_tokens,
    apply_chat_template, chat_template, system_prompt, args, auxiliary, chat_template_kwargs, context)`;
    `context` is what the process running it hands it (WorkflowContext); `args` holds the taskset's
    `workflow_args` (JSON values), which a workflow reads and checks itself (ValueError naming the
    key). A user's workflow is a subclass named by import path in `default_workflow_type`."""

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer: Any,
        reward: RewardComposer,
        *,
        max_prompt_tokens: int,
        apply_chat_template: bool = False,
        chat_template: str | None = None,
        system_prompt: str | None = None,
        args: dict[str, Any] | None = None,
        auxiliary: dict[str, AuxiliaryModel] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        context: WorkflowContext | None = None,
    ):
        self.engine = engine
        self.context = context or WorkflowContext()
        self.auxiliary: dict[str, AuxiliaryModel] = dict(auxiliary or {})
        """OpenAI-compatible services by name (explorer.auxiliary_models; 'external')."""
        self.tokenizer = tokenizer
        self.reward = reward
        self.prompt_format = PromptFormat(
            max_prompt_tokens, apply_chat_template, chat_template, system_prompt,
            template_kwargs=chat_template_kwargs or None,
        )  # fmt: skip
        self.args: dict[str, Any] = dict(args or {})
        self.timing: dict[str, float] = {}
        """Seconds the last batch spent in the engine (engine_s) and in reward functions (reward_s)."""

    KEYS: tuple[str, ...] | None = None
    """The `workflow_args` keys this workflow reads; None: any (a workflow that reads none ignores them)."""

    @classmethod
    def check_args(cls, args: dict[str, Any]) -> None:
        """Refuse bad `workflow_args` before any rollout (ValueError naming `workflow_args.<key>`):
        launch calls it for every taskset, a rollout worker when it builds the workflow. The base
        refuses keys outside KEYS; subclasses check their values after it."""
        unknown = sorted(set(args) - set(cls.KEYS)) if cls.KEYS is not None else []
        if unknown:
            raise ValueError(
                f"workflow_args: unknown key(s) {', '.join(unknown)}; this workflow takes {', '.join(cls.KEYS or ())}"
            )

    @classmethod
    def auxiliary_needed(cls, args: dict[str, Any]) -> list[str]:
        """Names of the auxiliary models these args make the workflow call (launch checks that
        each is configured)."""
        return []

    @classmethod
    def tool_schemas(cls, args: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The tools (OpenAI function schemas) this workflow declares to the model with these
        args: an SFT stage on the same taskset renders its conversations with them."""
        return None

    def encode_prompt(self, task: Task) -> list[int]:
        """The token ids the engine is given for `task`: its prompt as a user turn, or a messages
        taskset's conversation (raises on a prompt the template refuses)."""
        return self.format_for(task).encode_prompt(self.tokenizer, task.prompt, task.metadata.get("messages"))

    def format_for(self, task: Task) -> PromptFormat:
        """The prompt format of `task`: the workflow's, with its row's own system prompt and tools."""
        return self.prompt_format.for_task(task)

    @abstractmethod
    def run(self, tasks: list[Task], sampling: SamplingParams, policy_version: int) -> list[Experience]:
        """Experiences task by task (`sampling.n` episodes each, in order), tagged with
        `policy_version`; an episode is one experience, or several consecutive ones sharing an
        Experience.episode_id."""


def sampled_at(experiences: list[Experience], sampling: SamplingParams) -> list[Experience]:
    """`experiences` with the temperature their responses were sampled at (a workflow's run with
    `sampling`) where the workflow recorded none: the trainer scores each at its own."""
    for e in experiences:
        if e.temperature is None:
            e.temperature = sampling.temperature
    return experiences
