"""Workflows behind the Workflow interface (workflows/base.py): RunTasks on a rollout worker and an
engine in the trainer's process build them the same way, by `build_workflow`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...core.registry import Registry

if TYPE_CHECKING:
    from ...core.types import WorkflowSpec
    from ..engines.base import RolloutEngine
    from .base import Workflow, WorkflowContext

WORKFLOWS = Registry(
    "workflow.name",
    {
        "single_turn": "rlcore.rollout.workflows.single_turn:SingleTurnWorkflow",
        "multi_turn": "rlcore.rollout.workflows.multi_turn:MultiTurnWorkflow",
        "tool_call": "rlcore.rollout.workflows.tool_call:ToolCallWorkflow",
        "adaptive_teaching": "rlcore.rollout.workflows.adaptive_teaching:AdaptiveTeachingWorkflow",
        "verifiers": "rlcore.rollout.workflows.verifiers:VerifiersWorkflow",
    },
)


def resolve_workflow(name: str) -> type[Workflow]:
    """A registered workflow name, or an import path 'pkg.mod:Class' to a user's Workflow subclass
    (ValueError otherwise, naming what is allowed)."""
    from .base import Workflow

    if ":" not in name:
        WORKFLOWS.check(name)  # "workflow.name must be one of ...": the names a config may give
    return WORKFLOWS.resolve_class(name, Workflow, "workflow")


def build_workflow(
    spec: WorkflowSpec, engine: RolloutEngine, tokenizer: Any, context: WorkflowContext | None = None
) -> Workflow:
    """The workflow `spec` names, on `engine`, with its reward functions resolved (ValueError for an
    unknown workflow or reward function); `context`: what the calling process hands it."""
    from ...core.data.prompts import PromptFormat
    from ..auxiliary import build_auxiliary
    from ..rewards.compose import build_reward
    from ..rewards.judge import Judge
    from ..rewards.reward_model import RewardModelScorer

    auxiliary = build_auxiliary(spec.auxiliary_models)
    judge = Judge(spec.judge, auxiliary) if spec.judge else None
    prompts = PromptFormat(  # as the workflow renders its prompts (base.Workflow)
        spec.max_prompt_tokens, spec.apply_chat_template, spec.chat_template, spec.system_prompt,
        template_kwargs=spec.chat_template_kwargs or None,
    )  # fmt: skip
    scorer = RewardModelScorer(spec.reward_model, prompts) if spec.reward_model else None
    reward = build_reward(spec.reward_fn, spec.reward_weights or None, judge, spec.reasoning_tags, scorer)
    return resolve_workflow(spec.name)(
        engine, tokenizer, reward,
        max_prompt_tokens=spec.max_prompt_tokens, apply_chat_template=spec.apply_chat_template,
        chat_template=spec.chat_template, system_prompt=spec.system_prompt, args=spec.args,
        auxiliary=auxiliary, chat_template_kwargs=spec.chat_template_kwargs, context=context,
    )  # fmt: skip
