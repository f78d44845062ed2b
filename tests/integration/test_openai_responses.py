"""The door's /v1/responses (rollout/openai_responses.py), driven by the `openai` package's
`responses.create`: a two-tool agent's turns (function calls and their outputs sent back as input
items, the conversation carried by previous_response_id), recorded as one episode whose trained
tokens are exactly the tokens the door served; a streamed response (`responses.stream`) that is the
unstreamed one, its text arriving while generated; errors in the Responses request's terms."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from rlcore.client.base import ClientOptions
from rlcore.client.rollout import RolloutClient

from .test_openai_door import TOKEN, serving

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ARG = {"type": "object", "properties": {"x": {"type": "string"}}}
TOOLS: list[Any] = [{"type": "function", "name": "calc", "parameters": ARG},
                    {"type": "function", "name": "price", "parameters": ARG}]  # fmt: skip
"""Two function tools, their schemas short: the scratch model's 256 positions hold the template's
rendering of them and three turns."""


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A worker serving the scratch BPE model (its ChatML template renders tools) with 1024
    positions: an agent's conversation with its tools' schemas outgrows 256."""
    from rlcore.core.config.schema import ScratchModelConfig
    from rlcore.core.scratch_model import build_scratch_model

    path = str(tmp_path_factory.mktemp("models") / "bpe-1024")
    spec = ScratchModelConfig(enabled=True, tokenizer="bpe", hidden_size=64, num_layers=2, num_attention_heads=2,
                              num_key_value_heads=1, intermediate_size=128)  # fmt: skip
    build_scratch_model(path, spec, max_model_len=1024, seed=0)
    with serving(path, tmp_path_factory.mktemp("responses")) as served:
        yield served


@pytest.fixture(scope="module")
def api(worker: tuple[str, str]) -> openai.OpenAI:
    return openai.OpenAI(base_url=worker[1], api_key=TOKEN, max_retries=0, timeout=60)


def test_a_two_tool_agent_through_responses_is_recorded_as_the_tokens_served(
    api: openai.OpenAI, worker: tuple[str, str]
) -> None:
    """Turn 1: a question with instructions and two function tools. Turn 2 (previous_response_id):
    the agent's two tool calls and their outputs, then a user message. Turn 3: the conversation
    again, by id. The episode's trained tokens are the three replies' token ids and log-probs; its
    context the template's rendering of what the agent added between them."""
    extra = {"episode_id": "agent-1"}
    first = api.responses.create(model="tiny", instructions="Use tools.", input="37 pens?",
                                 tools=TOOLS, max_output_tokens=8, temperature=1.0, extra_body={**extra, "seed": 1})  # fmt: skip
    assert first.object == "response" and first.status in ("completed", "incomplete") and first.id.startswith("resp_")
    assert first.output_text == "".join(
        part.text for item in first.output if item.type == "message" for part in item.content
    )
    assert first.usage.output_tokens == len(first.model_extra["token_ids"])
    calls = [
        {"type": "function_call", "call_id": "call_a", "name": "price", "arguments": json.dumps({"x": "pen"})},
        {"type": "function_call_output", "call_id": "call_a", "output": "3"},
        {"type": "function_call", "call_id": "call_b", "name": "calc", "arguments": json.dumps({"x": "37*3"})},
        {"type": "function_call_output", "call_id": "call_b", "output": "111"},
        {"role": "user", "content": [{"type": "input_text", "text": "So?"}]},
    ]  # fmt: skip
    second = api.responses.create(model="tiny", previous_response_id=first.id, input=calls, tools=TOOLS,
                                  max_output_tokens=8, extra_body={**extra, "seed": 2})  # fmt: skip
    third = api.responses.create(model="tiny", previous_response_id=second.id, input="Sure?", tools=TOOLS,
                                 max_output_tokens=8, extra_body={**extra, "seed": 3})  # fmt: skip
    served = [r.model_extra["token_ids"] for r in (first, second, third)]
    assert all(served)
    with RolloutClient(worker[0], ClientOptions(token=TOKEN, timeout=60)) as rollout:
        (exp,) = rollout.finish_episode("agent-1", reward=1.0, group_id="agent")
    assert exp.metrics["turns"] == 3
    trained = [t for t, m in zip(exp.response_token_ids, exp.loss_mask, strict=True) if m]
    assert trained == [t for ids in served for t in ids]
    assert exp.prompt_token_ids == first.model_extra["prompt_token_ids"]
    # each later prompt is the episode so far: the earlier prompt, reply and what the agent added
    context = len(exp.response_token_ids) - len(trained)
    assert context > 0 and second.model_extra["prompt_token_ids"][: len(exp.prompt_token_ids)] == exp.prompt_token_ids


def test_a_responses_request_that_is_wrong_names_its_parameter(api: openai.OpenAI) -> None:
    """Errors in the Responses request's terms: an unknown stored response, an input item of a type
    the door does not serve, a tool that is not a function."""
    with pytest.raises(openai.NotFoundError, match="previous_response_id: no stored response 'resp_x'"):
        api.responses.create(model="tiny", input="hi", previous_response_id="resp_x")
    with pytest.raises(openai.BadRequestError, match=r"input\[0\]: must be a message, a function_call"):
        api.responses.create(model="tiny", input=[{"type": "input_image", "image_url": "x"}])
    with pytest.raises(openai.BadRequestError, match=r"tools\[0\]\.type: must be one of 'function'"):
        api.responses.create(model="tiny", input="hi", tools=[{"type": "web_search"}])
    with pytest.raises(openai.BadRequestError, match="max_output_tokens: 2000 leaves no room for a prompt"):
        api.responses.create(model="tiny", input="hi", max_output_tokens=2000)
    unstored = api.responses.create(model="tiny", input="hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError, match="previous_response_id"):
        api.responses.create(model="tiny", input="more", previous_response_id=unstored.id)


def test_a_streamed_response_is_the_response_sent_while_generated(api: openai.OpenAI) -> None:
    """`responses.create(stream=True)`: the SDK reads the events (each validated as its event type)
    and the last one holds the response the same seeded request gets unstreamed (text, token ids,
    status); the text comes in several deltas before it, and a follow-up continues the streamed
    response by its id. (The random model rarely ends before max_output_tokens: the SDK's
    `responses.stream` helper accepts only a completed response.)"""
    kwargs: dict[str, Any] = dict(model="tiny", input="Count to ten.", max_output_tokens=24, temperature=1.0,
                                  extra_body={"seed": 7})  # fmt: skip
    whole = api.responses.create(**kwargs)
    events = list(api.responses.create(**kwargs, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == ("response.incomplete" if whole.status == "incomplete" else "response.completed")
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    final = events[-1].response
    assert final.id == events[0].response.id and final.status == whole.status
    assert final.output_text == whole.output_text and "".join(deltas) == whole.output_text
    assert len(deltas) >= 2, deltas
    assert final.model_extra["token_ids"] == whole.model_extra["token_ids"]
    more = api.responses.create(model="tiny", input="Again.", previous_response_id=final.id, max_output_tokens=4)
    prompt = whole.model_extra["prompt_token_ids"]
    assert more.model_extra["prompt_token_ids"][: len(prompt)] == prompt


def test_text_format_holds_a_responses_reply_to_a_json_schema(api: openai.OpenAI) -> None:
    """`responses.parse(text_format=...)`: the SDK's strict schema in text.format, the reply JSON of
    it (parsed by the SDK), the format echoed in the response."""
    pytest.importorskip("xgrammar", reason="structured output needs xgrammar: pip install 'rlcore[structured]'")
    from typing import Literal

    import pydantic

    class Price(pydantic.BaseModel):
        item: Literal["pen", "ink"]
        cents: int = pydantic.Field(ge=0, le=999)

    out = api.responses.parse(model="tiny", input="Price of a pen?", text_format=Price, max_output_tokens=48,
                              extra_body={"seed": 5})  # fmt: skip
    assert out.status == "completed" and isinstance(out.output_parsed, Price), out.output_text
    assert out.text.format.type == "json_schema" and out.text.format.name == "Price"
    # the chat completion's errors in the Responses request's terms; verbosity served at its neutral value
    bad = {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}}
    with pytest.raises(openai.BadRequestError, match=r"text\.format: the json schema cannot be compiled"):
        api.responses.create(model="tiny", input="hi", text=bad, max_output_tokens=4)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match=r"text\.verbosity: 'low' is not served"):
        api.responses.create(model="tiny", input="hi", text={"verbosity": "low"}, max_output_tokens=4)
    medium = api.responses.create(model="tiny", input="hi", text={"verbosity": "medium"}, max_output_tokens=4)
    assert medium.status in ("completed", "incomplete")
