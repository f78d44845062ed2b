"""SingleTurnWorkflow: prompt encoding, experience order and grouping, rewards from the composer."""

from __future__ import annotations

import pytest

from rlcore.core.types import SamplingParams, Task
from rlcore.rollout.engines.hf import HFEngine
from rlcore.rollout.rewards.answer import format_reward
from rlcore.rollout.rewards.compose import build_reward
from rlcore.rollout.workflows.single_turn import SingleTurnWorkflow

# `__name__` is this module's import name whatever pytest's import mode ('tests.unit.rollout.
# test_single_turn' from the repository root), so the path below is what a user would write.
LEN_REWARD = f"{__name__}:len_reward"

TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def len_reward(response: str, task: Task) -> float:
    """A user reward: a tenth of the response length."""
    return len(response) / 10


@pytest.fixture(scope="module")
def engine(tiny_model_path: str) -> HFEngine:
    return HFEngine(tiny_model_path, max_model_len=256)


def workflow(engine: HFEngine, **kwargs) -> SingleTurnWorkflow:
    kwargs.setdefault("max_prompt_tokens", 64)
    reward = build_reward(["format", LEN_REWARD], [0.5, 2.0])
    return SingleTurnWorkflow(engine, engine.tokenizer, reward, **kwargs)


def test_run_orders_experiences_by_task_then_sample(engine: HFEngine) -> None:
    wf = workflow(engine)
    tasks = [Task(task_id=f"t{i}", prompt=p, answer="3") for i, p in enumerate(["1+2=", "2*2=", "9-4="])]
    sampling = SamplingParams(temperature=1.0, n=2, max_tokens=6, seed=0)
    experiences = wf.run(tasks, sampling, policy_version=4)

    assert [e.group_id for e in experiences] == ["t0", "t0", "t1", "t1", "t2", "t2"]
    # The same seed and prompts give the engine's own completions, in the same order.
    direct = engine.generate([wf.encode_prompt(t) for t in tasks], sampling)
    for e, c in zip(experiences, [c for samples in direct for c in samples], strict=True):
        assert e.prompt_token_ids == c.prompt_token_ids
        assert e.response_token_ids == c.token_ids and e.logprobs == c.logprobs
        assert e.response_text == c.text and e.finish_reason == c.finish_reason
        assert e.policy_version == 4
        # Weighted sum by hand: 0.5 * format + 2.0 * len / 10.
        parts = {"format": format_reward(c.text, Task("x", "")), LEN_REWARD: len(c.text) / 10}
        assert e.reward_components == parts
        assert e.reward == pytest.approx(0.5 * parts["format"] + 2.0 * parts[LEN_REWARD])
    assert any(e.reward > 0 for e in experiences)  # the user reward is really in the sum


def test_encode_prompt_truncates_from_the_left(engine: HFEngine) -> None:
    wf = workflow(engine, max_prompt_tokens=4)
    ids = wf.encode_prompt(Task("t", "abcdefg"))
    # Char tokenizer: one token per character and no special tokens added, so the last 4 survive.
    assert engine.tokenizer.decode(ids) == "defg"
    assert workflow(engine).encode_prompt(Task("t", "abcdefg")) == engine.tokenizer("abcdefg")["input_ids"]


def test_encode_prompt_applies_chat_template_and_system_prompt(engine: HFEngine) -> None:
    wf = workflow(engine, apply_chat_template=True, chat_template=TEMPLATE, system_prompt="Be brief.")
    ids = wf.encode_prompt(Task("t", "1+1?"))
    assert engine.tokenizer.decode(ids) == "system: Be brief.\nuser: 1+1?\nassistant:"
    wf = workflow(engine, apply_chat_template=True, chat_template=TEMPLATE)
    assert engine.tokenizer.decode(wf.encode_prompt(Task("t", "1+1?"))) == "user: 1+1?\nassistant:"
    # Without the template the system prompt has no place to go and the prompt is used as is.
    wf = workflow(engine, system_prompt="Be brief.")
    assert engine.tokenizer.decode(wf.encode_prompt(Task("t", "1+1?"))) == "1+1?"
