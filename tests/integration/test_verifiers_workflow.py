"""default_workflow_type verifiers: a `verifiers` v1 environment (tests/envs/vf_digits.py: two turns,
the environment playing the user) runs as verifiers runs it (its null harness program in a
subprocess runtime) against the workflow's loopback door on the HF engine. Each episode becomes one
experience: the model's replies as the engine generated them (trained), the environment's turn as
context, the environment's reward."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("verifiers", reason="the verifiers workflow: pip install 'rlcore[verifiers]'")

from rlcore.core.data.verifiers_tasks import write_verifiers_taskset  # noqa: E402
from rlcore.core.types import SamplingParams, Task, WorkflowSpec  # noqa: E402
from rlcore.rollout.engines.hf import HFEngine  # noqa: E402
from rlcore.rollout.loopback_door import workflow_context  # noqa: E402
from rlcore.rollout.workflows import build_workflow  # noqa: E402
from tests.envs.vf_digits import score  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ENV = {"env": "tests.envs.vf_digits", "env_args": {"num_tasks": 8}}


def _segments(mask: list[int]) -> list[tuple[int, int, int]]:
    """(start, end, value) of each run of equal mask values."""
    runs, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((start, i, mask[start]))
            start = i
    return runs


def test_verifiers_episodes_are_the_engines_tokens_and_the_environments_reward(bpe_model_path, tmp_path) -> None:
    path = str(tmp_path / "tasks.jsonl")
    write_verifiers_taskset(path, ENV["env"], ENV["env_args"], skip=2, take=3)
    rows = [json.loads(line) for line in open(path)]
    assert [r["verifiers_index"] for r in rows] == [2, 3, 4] and all(r["prompt"].startswith("Say ") for r in rows)
    tasks = [Task(f"t{r['verifiers_index']}", r["prompt"], metadata={"verifiers_index": r["verifiers_index"]}) for r in rows]

    engine = HFEngine(bpe_model_path, max_model_len=256)
    spec = WorkflowSpec(["exact_match"], [], 128, True, None, None, "verifiers", ENV)
    workflow = build_workflow(spec, engine, engine.tokenizer, workflow_context())
    exps = workflow.run(tasks, SamplingParams(n=2, max_tokens=8, seed=3), policy_version=0)

    assert [e.group_id for e in exps] == ["t2", "t2", "t3", "t3", "t4", "t4"]
    turns = []
    for e in exps:
        mask = e.loss_mask or [1] * len(e.response_token_ids)
        runs = _segments(mask)
        replies = [e.response_token_ids[a:b] for a, b, v in runs if v]
        context = [engine.tokenizer.decode(e.response_token_ids[a:b]) for a, b, v in runs if not v]
        turns.append(len(replies))
        scores = [score(engine.tokenizer.decode(r, skip_special_tokens=True)) for r in replies]
        # the environment's reward of exactly these replies, and its turn between them as context
        expected = scores[0] if len(scores) == 1 else (2 * scores[0] + scores[1]) / 3
        assert e.reward == pytest.approx(expected, abs=1e-9) and e.reward_components == {"digits": e.reward}
        assert (len(replies) == 2) == (scores[0] < 0.9) and e.metrics["turns"] == len(replies)
        assert all("Just the number, please." in c for c in context)
        assert len(e.logprobs) == len(e.response_token_ids) and all(lp <= 0 for lp, m in zip(e.logprobs, mask, strict=True) if m)
        assert e.temperature == 1.0
    assert 2 in turns  # a scratch model's replies are rarely a short number: the second turn is played
