"""MultiTurnWorkflow on the HF engine: token ids and loss masks of a conversation, its limits and
finish reasons, seeding, chat-template turns, bad workflow_args; the arithmetic_chain game."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rlcore.core.types import SamplingParams, Task
from rlcore.rollout.engines.hf import HFEngine
from rlcore.rollout.envs.arithmetic_chain import ArithmeticChainEnv
from rlcore.rollout.envs.base import StepResult, TextEnv
from rlcore.rollout.rewards.compose import build_reward
from rlcore.rollout.workflows.multi_turn import MultiTurnWorkflow
from rlcore.rollout.workflows.turns import TurnFormat

ENV = f"{__name__}:CountingEnv"
OBS = "+1="
# A chat template whose assistant turns end on the EOS token the model generates, then a newline.
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{% if m['role'] == 'assistant' %}</s>{% endif %}"
    "{{ '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)


class CountingEnv(TextEnv):
    """Answers every reply with OBS and a reward of 0.25; ends after `args.end_after` replies (if set)."""

    def reset(self) -> str:
        self.replies: list[str] = []
        return self.task.prompt

    def step(self, reply: str) -> StepResult:
        self.replies.append(reply)
        done = len(self.replies) == self.args.get("end_after", -1)
        return StepResult("" if done else OBS, 0.25, done)


@pytest.fixture(scope="module")
def engine(tiny_model_path: str) -> HFEngine:
    return HFEngine(tiny_model_path, max_model_len=256)


def workflow(engine: HFEngine, args: dict[str, Any], **kwargs: Any) -> MultiTurnWorkflow:
    kwargs.setdefault("max_prompt_tokens", 64)
    return MultiTurnWorkflow(engine, engine.tokenizer, build_reward(["format"], [0.5]), args=args, **kwargs)


TASKS = [Task("t0", "12+7=", answer="19"), Task("t1", "3+4=", answer="7")]
SAMPLING = SamplingParams(temperature=1.0, n=3, max_tokens=5, seed=3)


def test_a_conversation_is_the_engines_tokens_and_the_environments_turns(engine: HFEngine) -> None:
    wf = workflow(engine, {"env": ENV, "max_turns": 3})
    exps = wf.run(TASKS, SAMPLING, policy_version=2)
    obs = engine.tokenizer(OBS, add_special_tokens=False)["input_ids"]
    assert [e.group_id for e in exps] == ["t0"] * 3 + ["t1"] * 3
    for e in exps:
        assert e.finish_reason == "max_turns" and e.metrics == {"turns": 3.0} and e.policy_version == 2
        assert e.reward_components["env"] == 0.75
        assert e.reward == pytest.approx(0.75 + 0.5 * e.reward_components["format"])
        # response = reply, OBS, reply, OBS, reply: the mask marks the model's tokens only
        runs, mask = [], e.loss_mask
        for i, m in enumerate(mask):
            if i == 0 or m != mask[i - 1]:
                runs.append([m, i, i])
            runs[-1][2] = i + 1
        assert [r[0] for r in runs] == [1, 0, 1, 0, 1]
        for value, lo, hi in runs:
            if value == 0:
                assert e.response_token_ids[lo:hi] == obs and e.logprobs[lo:hi] == [0.0] * len(obs)
            else:
                assert hi - lo <= SAMPLING.max_tokens
        # every trained token carries the log-prob the model gives it in this very context
        ids = torch.tensor([e.prompt_token_ids + e.response_token_ids])
        with torch.no_grad():
            logits = engine.model(ids).logits[0, len(e.prompt_token_ids) - 1 : -1]
        expected = torch.log_softmax(logits.float(), -1).gather(-1, ids[0, len(e.prompt_token_ids) :, None])[
            :, 0
        ]
        trained = torch.tensor(mask, dtype=torch.bool)
        assert torch.allclose(torch.tensor(e.logprobs)[trained], expected[trained], atol=1e-4)
    # a group's conversations differ; the same seed replays them exactly
    assert len({tuple(e.response_token_ids) for e in exps[:3]}) > 1
    again = wf.run(TASKS, SAMPLING, policy_version=2)
    assert [e.response_token_ids for e in again] == [e.response_token_ids for e in exps]


def test_the_environment_ends_an_episode_with_finish_reason_stop(engine: HFEngine) -> None:
    exps = workflow(engine, {"env": ENV, "env_args": {"end_after": 2}}).run(TASKS, SAMPLING, 0)
    assert all(
        e.finish_reason == "stop" and e.metrics["turns"] == 2 and e.reward_components["env"] == 0.5
        for e in exps
    )


def test_token_limits_end_episodes_cleanly_with_finish_reason_length(
    tiny_model_path: str, engine: HFEngine
) -> None:
    budget = workflow(engine, {"env": ENV, "max_turns": 50, "max_total_tokens": 17}).run(TASKS, SAMPLING, 0)
    assert all(e.finish_reason == "length" and len(e.response_token_ids) <= 17 for e in budget)
    short = HFEngine(tiny_model_path, max_model_len=24)
    wf = workflow(short, {"env": ENV, "max_turns": 50, "max_tokens_per_turn": 4})
    for e in wf.run(TASKS, SAMPLING, 0):
        assert e.finish_reason == "length" and len(e.prompt_token_ids) + len(e.response_token_ids) <= 24
        assert e.metrics["turns"] >= 2 and e.loss_mask[-1] == 1  # it ended on a reply, not mid-observation


def test_chat_template_turns_append_what_the_template_renders(engine: HFEngine) -> None:
    fmt = TurnFormat(engine.tokenizer, True, TEMPLATE, None)
    eos = engine.tokenizer.eos_token_id
    encode = fmt.encode
    # the model closed its turn with EOS: the template's newline, then the user turn and the next prompt
    assert fmt.after_reply([5, eos], [{"role": "user", "content": "3+4="}]) == encode(
        "\nuser: 3+4=\nassistant: "
    )
    # a reply cut by max_tokens gets the whole closing of its turn as context
    assert fmt.after_reply([5, 6], [{"role": "user", "content": "x"}]) == encode("</s>\nuser: x\nassistant: ")
    wf = workflow(engine, {"env": ENV, "max_turns": 2}, apply_chat_template=True, chat_template=TEMPLATE)
    (e, *_) = wf.run(TASKS[:1], SAMPLING, 0)
    assert e.prompt_token_ids == encode("user: 12+7=\nassistant: ")
    recount = TEMPLATE.replace(
        "{% for m", "{{ messages | length }}{% for m"
    )  # re-renders the top per message
    with pytest.raises(
        ValueError, match="^the chat template does not render a conversation by appending turns"
    ):
        TurnFormat(engine.tokenizer, True, recount, None)


@pytest.mark.parametrize(
    "args, match",
    [
        ({}, r"^workflow_args\.env: name the environment"),
        ({"env": "nope"}, r"^workflow_args\.env: 'nope' is not one of arithmetic_chain \(nor an import path"),
        (
            {"env": "rlcore.core.types:Task"},
            r"^workflow_args\.env: environment 'rlcore.core.types:Task' is not a TextEnv",
        ),
        ({"env": ENV, "max_turns": 0}, r"^workflow_args\.max_turns must be a positive integer; got 0"),
        ({"env": ENV, "env_args": [1]}, r"^workflow_args\.env_args must be an object"),
        (
            {"env": ENV, "turns": 3},
            r"^workflow_args: unknown key\(s\) turns; this workflow takes env, env_args",
        ),
    ],
)
def test_bad_workflow_args_name_the_key(engine: HFEngine, args: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        workflow(engine, args)


def test_arithmetic_chain_asks_on_the_models_answers_and_grades_each_step() -> None:
    env = ArithmeticChainEnv(Task("c", "12+7=", metadata={"addends": [5, 30]}), {})
    assert env.reset() == "12+7="
    first = env.step("<answer>19</answer>")
    assert (first.observation, first.reward, first.done) == ("19+5=", pytest.approx(1 / 3), False)
    wrong = env.step("<answer>25</answer>")  # 19+5 is 24: no credit, and the next question builds on 25
    assert (wrong.observation, wrong.reward, wrong.done) == ("25+30=", 0.0, False)
    last = env.step("<answer>55</answer>")
    assert (last.reward, last.done) == (pytest.approx(1 / 3), True)
    assert (
        ArithmeticChainEnv(Task("c", "1+1=", metadata={"addends": []}), {}).step("2").done
    )  # unreadable: over
    with pytest.raises(ValueError, match=r"^task c: column 'addends' must be a list of integers"):
        ArithmeticChainEnv(Task("c", "1+1="), {})


def test_a_thinking_template_appends_tool_turns_and_re_renders_after_a_user_turn(engine: HFEngine) -> None:
    """The Qwen3-like template (core/scratch_model.py): reasoning kept in the assistant turns after the
    last user turn, dropped from earlier ones, an empty reasoning block in the generation prompt with
    enable_thinking=False. A tool turn after a reply appends (the history renders as before); a new
    user turn re-renders what came before, which TurnFormat says (the door starts a new sample)."""
    from rlcore.core.scratch_model import CHATML_THINKING_TEMPLATE as THINKING
    from rlcore.rollout.workflows.turns import HistoryRerendered

    tokenizer = engine.tokenizer
    convo = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>add</think>4"},
        {"role": "tool", "content": "4"},
        {"role": "assistant", "content": "<think>\nsure\n</think>\n\nyes"},
    ]

    def render(messages: list[dict[str, Any]], **kw: Any) -> str:
        return str(tokenizer.apply_chat_template(messages, chat_template=THINKING, tokenize=False, **kw))

    assert render(convo) == (
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\nadd\n</think>\n\n4<|im_end|>\n"
        "<|im_start|>tool\n<tool_response>\n4\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\nsure\n</think>\n\nyes<|im_end|>\n"
    )
    again = render(
        [*convo, {"role": "user", "content": "and 3+3?"}], add_generation_prompt=True, enable_thinking=False
    )
    assert again == (
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
        "<|im_start|>tool\n<tool_response>\n4\n</tool_response><|im_end|>\n<|im_start|>assistant\nyes<|im_end|>\n"
        "<|im_start|>user\nand 3+3?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    turns = TurnFormat(tokenizer, True, THINKING, None, template_kwargs={"enable_thinking": False})
    reply = turns.encode("<think>x</think>7")
    assert turns.after_reply(reply, [{"role": "tool", "content": "7"}]) == turns.encode(
        "<|im_end|>\n<|im_start|>tool\n<tool_response>\n7\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    with pytest.raises(HistoryRerendered, match="adding a message changes what came before"):
        turns.after_reply(reply, [{"role": "user", "content": "sure?"}])


def test_thinking_demos_render_their_reasoning_through_the_thinking_tokenizer(tmp_path) -> None:
    """configs/tool_call_thinking.yaml's SFT rows: every assistant turn opens with a reasoning block;
    the chatml_thinking tokenizer keeps the tags one token each and renders the blocks (all its
    assistant turns follow the only user turn), and its tool turns append."""
    import json

    from rlcore.core.data.synthetic import write_tool_arithmetic_taskset
    from rlcore.core.scratch_model import CHATML_THINKING_TEMPLATE, build_bpe_tokenizer

    path = tmp_path / "demos.jsonl"
    write_tool_arithmetic_taskset(
        str(path), part="train", num_tasks=20, demos=True, no_tool_fraction=0.5, thinking=True
    )
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    replies = [m["content"] for r in rows for m in r["messages"] if m["role"] == "assistant"]
    assert replies and all(c.startswith("<think>\n") and "\n</think>\n\n" in c for c in replies)
    assert {len(r["messages"]) for r in rows} == {2, 4}  # sloppy guesses and tool calls both present
    tokenizer = build_bpe_tokenizer(512, thinking=True)
    assert tokenizer.chat_template == CHATML_THINKING_TEMPLATE
    assert tokenizer.convert_ids_to_tokens(tokenizer("<think>x</think>")["input_ids"]) == [
        "<think>",
        "x",
        "</think>",
    ]
    (call_row,) = [r for r in rows if len(r["messages"]) == 4][:1]
    text = tokenizer.apply_chat_template(call_row["messages"], tokenize=False)
    assert text.count("<think>\n") == 2 and "<think>\nThe tool says" in text
    turns = TurnFormat(tokenizer, True, None, None)  # the tokenizer's own (thinking) template
    assert turns.after_reply(turns.encode("<think>\nUse it.\n</think>\n\n<tool_call>{}</tool_call>"),
                             [{"role": "tool", "content": "7"}])  # fmt: skip


class ToolThenUserEnv(TextEnv):
    """A tool turn after the first reply, a user turn after the second; over after the third."""

    def reset(self) -> str:
        self.replies = 0
        return self.task.prompt

    def step(self, reply: str) -> StepResult:
        self.replies += 1
        if self.replies == 1:
            return StepResult("", 0.125, messages=[{"role": "tool", "content": "4"}])
        return StepResult("and 3+3?", 0.125, done=self.replies == 3)


def test_a_re_rendered_history_goes_on_as_a_new_sample_of_the_episode(engine: HFEngine) -> None:
    """The thinking template (core/scratch_model.py) drops the reasoning block of the turns before a
    new user turn: the tool turn appends to the first sample, the user turn starts a second one
    whose prompt is the template's rendering of the whole conversation. Each sample's response is
    exactly the engine's tokens in its own context; both share the episode's id, reward and finish."""
    from rlcore.core.scratch_model import CHATML_THINKING_TEMPLATE as THINKING

    wf = workflow(
        engine, {"env": f"{__name__}:ToolThenUserEnv", "max_turns": 3}, apply_chat_template=True,
        chat_template=THINKING, max_prompt_tokens=200,
    )  # fmt: skip
    sampling = SamplingParams(temperature=1.0, n=2, max_tokens=4, seed=5)
    exps = wf.run(TASKS, sampling, policy_version=1)
    assert [e.group_id for e in exps] == ["t0"] * 4 + ["t1"] * 4  # 2 episodes x 2 samples per task
    episodes = [exps[i : i + 2] for i in range(0, len(exps), 2)]
    assert len({e.episode_id for e in exps}) == 4 and all(a.episode_id == b.episode_id != "" for a, b in episodes)
    tok = engine.tokenizer

    def render(messages: list[dict[str, Any]]) -> list[int]:
        text = tok.apply_chat_template(messages, chat_template=THINKING, add_generation_prompt=True, tokenize=False)
        return list(tok(text, add_special_tokens=False)["input_ids"])

    for (first, second), task in zip(episodes, [t for t in TASKS for _ in range(2)], strict=True):
        assert first.reward == second.reward == pytest.approx(0.375 + 0.5 * first.reward_components["format"])
        assert first.finish_reason == second.finish_reason == "stop"  # the environment ended it
        assert first.metrics["turns"] == second.metrics["turns"] == 3.0
        # sample 1: reply, the tool turn (context), reply; sample 2: one reply after the re-rendered history
        assert [m for i, m in enumerate(first.loss_mask) if i == 0 or m != first.loss_mask[i - 1]] == [1, 0, 1]
        assert second.loss_mask == []
        user = {"role": "user", "content": task.prompt}
        assert first.prompt_token_ids == render([user])
        zeros = first.loss_mask.index(0)
        reply1 = tok.decode(first.response_token_ids[:zeros], skip_special_tokens=True)
        reply2 = tok.decode(
            [t for t, m in zip(first.response_token_ids, first.loss_mask, strict=True) if m][zeros:],
            skip_special_tokens=True,
        )
        history = [user, {"role": "assistant", "content": reply1}, {"role": "tool", "content": "4"},
                   {"role": "assistant", "content": reply2}, {"role": "user", "content": "and 3+3?"}]  # fmt: skip
        assert second.prompt_token_ids == render(history)
        for e in (first, second):  # the engine's log-probs of its own tokens, in the context it saw
            ids = torch.tensor([e.prompt_token_ids + e.response_token_ids])
            with torch.no_grad():
                logits = engine.model(ids).logits[0, len(e.prompt_token_ids) - 1 : -1]
            expected = torch.log_softmax(logits.float(), -1).gather(-1, ids[0, len(e.prompt_token_ids) :, None])[:, 0]
            trained = torch.tensor(e.loss_mask or [1] * len(e.response_token_ids), dtype=torch.bool)
            assert torch.allclose(torch.tensor(e.logprobs)[trained], expected[trained], atol=1e-4)
    # a template that appends every turn (ChatML without reasoning blocks) keeps one sample per episode
    plain = workflow(
        engine, {"env": f"{__name__}:ToolThenUserEnv", "max_turns": 3}, apply_chat_template=True,
        chat_template=THINKING.replace("{%- if loop.index0 > ns.last_query %}", "{%- if false %}"), max_prompt_tokens=200,
    )  # fmt: skip
    assert [e.episode_id for e in plain.run(TASKS, sampling, 1)] == [""] * 4
