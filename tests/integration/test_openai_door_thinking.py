"""The OpenAI-compatible door with a thinking chat template (one written to behave as Qwen3's,
core/scratch_model.py): `chat_template_kwargs`, and an episode whose history the template renders
differently after a user turn, recorded as two samples of the engine's exact tokens."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from rlcore.client.base import ClientOptions
from rlcore.client.rollout import RolloutClient
from rlcore.rollout.workflows.turns import TurnFormat

from .test_openai_door import TOKEN, TOOLS, serving

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def thinking_worker(bpe_model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """(gRPC address, HTTP base URL, model folder) of a worker whose model's chat template is the
    Qwen3-like thinking one (core/scratch_model.py)."""
    import shutil

    from transformers import AutoTokenizer

    from rlcore.core.scratch_model import CHATML_THINKING_TEMPLATE

    model = str(tmp_path_factory.mktemp("thinking") / "model")
    shutil.copytree(bpe_model_path, model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.chat_template = CHATML_THINKING_TEMPLATE
    tokenizer.save_pretrained(model)
    with serving(model, tmp_path_factory.mktemp("thinking-door")) as (address, url):
        yield address, url, model


def test_a_thinking_template_episode_appends_tool_turns_and_starts_a_new_sample_after_a_user_turn(
    thinking_worker: tuple[str, str, str],
) -> None:
    """With `chat_template_kwargs: {"enable_thinking": false}` the prompt ends in the template's empty
    reasoning block; a tool turn continues the sample (the history renders as before); a user turn
    makes the template drop the earlier turns' reasoning, so the episode goes on as a second sample
    whose prompt is the conversation as the template renders it now. Each sample's trained tokens are
    exactly the engine's; the door's own template arguments cannot be overridden."""
    from transformers import AutoTokenizer

    address, base_url, model = thinking_worker
    tokenizer = AutoTokenizer.from_pretrained(model)
    api = openai.OpenAI(base_url=base_url, api_key=TOKEN, max_retries=0, timeout=60)
    kwargs = {"enable_thinking": False}

    def render(messages: list[dict[str, Any]]) -> list[int]:
        text = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False, **kwargs)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 37*46?"}]
    replies, prompts = [], []
    for turn, follow_up in enumerate([{"role": "tool", "content": "1702"}, {"role": "user", "content": "sure?"}, None]):
        prompts.append(render(messages))
        answer = api.chat.completions.create(
            model="tiny", messages=messages, tools=TOOLS, max_tokens=6, seed=turn,
            extra_body={"episode_id": "think", "chat_template_kwargs": kwargs},
        )  # fmt: skip
        replies.append(answer.choices[0].model_extra["token_ids"])
        messages.append(answer.choices[0].message.model_dump(exclude_none=True))
        if follow_up is not None:
            messages.append(follow_up)
    assert tokenizer.decode(prompts[0]).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    with RolloutClient(address, ClientOptions(token=TOKEN, timeout=60)) as rollout:
        first, second = rollout.finish_episode("think", reward=1.0, group_id="t")
    # the first sample: reply, the tool turn as appended, the second reply
    tool_turn = TurnFormat(tokenizer, True, None, None, TOOLS, kwargs).after_reply(replies[0], [messages[2]])
    assert first.prompt_token_ids == prompts[0]
    assert first.response_token_ids == replies[0] + tool_turn + replies[1]
    assert first.loss_mask == [1] * len(replies[0]) + [0] * len(tool_turn) + [1] * len(replies[1])
    # the second: the whole conversation rendered again (reasoning dropped), then the third reply
    assert second.prompt_token_ids == prompts[2] and second.response_token_ids == replies[2]
    assert second.loss_mask == [] and first.reward == second.reward == 1.0
    assert first.episode_id == second.episode_id == "think"  # one episode: counted once in its group
    with pytest.raises(openai.BadRequestError, match="chat_template_kwargs.*tools cannot be set here"):
        api.chat.completions.create(model="tiny", messages=messages[:1], extra_body={"chat_template_kwargs": {"tools": []}})
