"""The door as a serving front (`rlcore rollout serve --http-port`), driven by the real `openai`
package: answers streamed while they are generated, several prompts in one request, `echo` with the
prompt's log-probs (a distillation teacher's scores), the likeliest tokens, vLLM's /tokenize and
/detokenize, /metrics read by the Prometheus client library's parser, and structured output
(`response_format`) read back by the SDK's own parser."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
import torch

from .test_openai_door import TOKEN, TOOLS, serving

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def worker(bpe_model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(gRPC address, HTTP base URL) of a worker serving the scratch BPE model."""
    with serving(bpe_model_path, tmp_path_factory.mktemp("door-serving"), "--http-max-n", "8",
                 "--http-max-request-tokens", "64") as served:  # fmt: skip
        yield served


@pytest.fixture(scope="module")
def api(worker: tuple[str, str]) -> openai.OpenAI:
    return openai.OpenAI(base_url=worker[1], api_key=TOKEN, max_retries=0, timeout=60)


def test_streamed_answers_are_the_answers_in_openais_events(api: openai.OpenAI) -> None:
    """stream: true, through the SDK's own stream readers: a seeded chat answer and a completion
    reassemble to the unstreamed answers (content, log-probs, token ids, finish reason), with the
    usage in a last chunk when asked; chat tool calls stream with their index; an episode records a
    streamed turn as it records any."""
    messages = [{"role": "user", "content": "What is 37*46?"}]
    kwargs = dict(model="tiny", messages=messages, tools=TOOLS, max_tokens=12, seed=11, logprobs=True)
    whole = api.chat.completions.create(**kwargs).choices[0]
    chunks = list(api.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].model_extra["policy_version"] == 0 and chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == len(whole.model_extra["token_ids"])
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == (whole.message.content or "")
    streamed_lps = [
        t.logprob
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content
    ]
    assert streamed_lps == [t.logprob for t in whole.logprobs.content]
    finish = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [f.finish_reason for f in finish] == [whole.finish_reason]
    assert finish[0].model_extra["token_ids"] == whole.model_extra["token_ids"]
    calls = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert [(d.index, d.function.name) for d in calls] == [
        (k, t.function.name) for k, t in enumerate(whole.message.tool_calls or [])
    ]
    text = api.completions.create(model="tiny", prompt="12+7=", max_tokens=6, seed=5, n=2)
    parts: dict[int, str] = {}
    for c in api.completions.create(model="tiny", prompt="12+7=", max_tokens=6, seed=5, n=2, stream=True):
        for choice in c.choices:
            parts[choice.index] = parts.get(choice.index, "") + choice.text
    assert parts == {c.index: c.text for c in text.choices}


def test_a_streamed_answer_arrives_piece_by_piece_as_it_is_generated(api: openai.OpenAI) -> None:
    """Without tools a chat answer streams as the engine samples it: its text comes in many
    chunks before the one that ends it, the pieces join to the unstreamed answer, and text past a
    stop string is never sent (a piece that may begin one is held back until it cannot)."""
    kwargs = dict(model="tiny", messages=[{"role": "user", "content": "Count: 1 2 3"}], max_tokens=40, seed=3,
                  extra_body={"ignore_eos": True})  # fmt: skip
    stop = None
    for _ in range(2):
        whole = api.chat.completions.create(**kwargs, stop=stop).choices[0]
        chunks = [c for c in api.chat.completions.create(**kwargs, stop=stop, stream=True) if c.choices]
        pieces = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
        assert "".join(pieces) == whole.message.content
        ends = [i for i, c in enumerate(chunks) if c.choices[0].finish_reason]
        assert ends == [len(chunks) - 1] and chunks[-1].choices[0].finish_reason == whole.finish_reason
        if stop is None:
            assert len(pieces) >= 10, pieces  # one piece a token or so, not one at the end
            stop = [whole.message.content[12:15]]  # the same seeded answer then stops there
        else:
            assert whole.finish_reason == "stop" and stop[0] not in "".join(pieces)


def test_echo_several_prompts_and_the_likeliest_tokens(api: openai.OpenAI, bpe_model_path: str) -> None:
    """Several prompts in one completions request (choice i * n + j is prompt i's sample j), each
    answered as alone; `echo` with `logprobs` puts each prompt's tokens and log-probs first (those
    of the model's own forward, the first token none), as a distillation teacher asks; `logprobs`
    k and chat's `top_logprobs` k give the k likeliest tokens at each generated one."""
    from transformers import AutoModelForCausalLM

    from rlcore.core.algorithms.logprob import token_logprobs

    prompts = [[5, 9, 14, 3, 22], [8, 2, 30]]
    both = api.completions.create(model="tiny", prompt=prompts, max_tokens=4, seed=2, n=2, echo=True, logprobs=0)
    assert [c.index for c in both.choices] == [0, 1, 2, 3]
    assert both.model_extra["prompt_token_ids"] == prompts
    model = AutoModelForCausalLM.from_pretrained(bpe_model_path, dtype=torch.float32)
    for i, prompt in enumerate(prompts):
        alone = api.completions.create(model="tiny", prompt=prompt, max_tokens=4, seed=2, n=2)
        for j in range(2):
            c = both.choices[2 * i + j]
            assert c.model_extra["token_ids"] == alone.choices[j].model_extra["token_ids"]
            assert c.text.endswith(alone.choices[j].text) and c.logprobs.top_logprobs is None
            scores = c.logprobs.token_logprobs
            assert len(scores) == len(prompt) + len(c.model_extra["token_ids"]) and scores[0] is None
            ids = torch.tensor([prompt + c.model_extra["token_ids"]])
            with torch.no_grad():
                want = token_logprobs(model(input_ids=ids).logits[:, :-1].float(), ids[:, 1:])[0].tolist()
            assert scores[1 : len(prompt)] == pytest.approx(want[: len(prompt) - 1], abs=1e-5)
    top = api.completions.create(model="tiny", prompt="12+7=", max_tokens=5, seed=1, logprobs=3).choices[0]
    assert len(top.logprobs.top_logprobs) == len(top.logprobs.tokens) == len(top.model_extra["token_ids"])
    for alternatives, token, lp in zip(top.logprobs.top_logprobs, top.logprobs.tokens, top.logprobs.token_logprobs, strict=True):
        # keyed by text, as OpenAI's legacy format is: tokens of one text (an unfinished character) share a key
        assert len(alternatives) <= 3 and lp <= max(alternatives.values()) + 1e-6
        if token in alternatives and "\ufffd" not in token:
            assert alternatives[token] == pytest.approx(lp, abs=1e-5)
    chat = api.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                       seed=4, logprobs=True, top_logprobs=4).choices[0]  # fmt: skip
    for entry in chat.logprobs.content:
        values = [a.logprob for a in entry.top_logprobs]
        assert len(values) == 4 and values == sorted(values, reverse=True) and entry.logprob <= values[0] + 1e-6


def _metrics(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the door's /metrics, parsed by the Prometheus client library's parser."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_tokenize_detokenize_and_metrics(api: openai.OpenAI, worker: tuple[str, str], bpe_model_path: str) -> None:
    """vLLM's /tokenize (a prompt, or messages as the chat template renders them) and /detokenize;
    /metrics in Prometheus's text format counts requests, tokens, latency and a streamed answer's
    first text, and answers only with the token."""
    import httpx
    from transformers import AutoTokenizer

    base, headers = worker[1].removesuffix("/v1"), {"Authorization": f"Bearer {TOKEN}"}
    tok = AutoTokenizer.from_pretrained(bpe_model_path)
    got = httpx.post(f"{base}/tokenize", json={"prompt": "12+7="}, headers=headers).json()
    assert got == {"count": len(tok("12+7=")["input_ids"]), "max_model_len": 256, "tokens": tok("12+7=")["input_ids"]}
    messages = [{"role": "user", "content": "hi"}]
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    chat = httpx.post(f"{base}/tokenize", json={"messages": messages}, headers=headers).json()
    assert chat["tokens"] == tok(rendered, add_special_tokens=False)["input_ids"]
    back = httpx.post(f"{base}/detokenize", json={"tokens": got["tokens"]}, headers=headers).json()
    assert back == {"prompt": tok.decode(got["tokens"])}
    both = httpx.post(f"{base}/tokenize", json={"prompt": "x", "messages": messages}, headers=headers)
    assert both.status_code == 400 and both.json()["error"]["param"] == "prompt"
    beyond = httpx.post(f"{base}/detokenize", json={"tokens": [10**6]}, headers=headers)
    assert beyond.status_code == 400 and beyond.json()["error"]["param"] == "tokens"

    before = _metrics(base)
    answer = api.completions.create(model="tiny", prompt="1+1=", max_tokens=5, extra_body={"ignore_eos": True})
    streamed = list(api.completions.create(model="tiny", prompt="2+2=", max_tokens=5, stream=True,
                                           extra_body={"ignore_eos": True}))  # fmt: skip
    assert streamed
    after = _metrics(base)

    def grew(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before.get(key, 0.0)

    assert grew("rlcore_door_requests_total", endpoint="completions", status="200") == 2
    assert grew("rlcore_door_generation_tokens_total") == answer.usage.completion_tokens + 5
    assert grew("rlcore_door_request_seconds_count", endpoint="completions") == 2
    assert grew("rlcore_door_time_to_first_token_seconds_count") == 1
    assert grew("rlcore_engine_steps_total") >= 5 and after[("rlcore_door_queue_depth", ())] == 0
    assert httpx.get(f"{base}/metrics").status_code == 401


def test_a_reply_held_to_a_json_schema_is_parsed_by_the_sdk(api: openai.OpenAI) -> None:
    """`chat.completions.parse` with a pydantic model (the SDK sends its strict JSON schema and
    validates the reply into the model), sampled and streamed; `json_object` gives an object; the
    log-probs are the policy's own, as the door scores the same tokens (echo)."""
    pytest.importorskip("xgrammar", reason="structured output needs xgrammar: pip install 'rlcore[structured]'")
    from typing import Literal

    import pydantic

    class Verdict(pydantic.BaseModel):
        answer: Literal["yes", "no"]
        score: int = pydantic.Field(ge=0, le=99)  # bounded: a random model's digits may run on

    messages = [{"role": "user", "content": "Is 2+2=4?"}]
    parsed = api.chat.completions.parse(model="tiny", messages=messages, response_format=Verdict, max_tokens=32,
                                        seed=4, n=2, logprobs=True)  # fmt: skip
    for choice in parsed.choices:
        assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Verdict), choice.message.content
    first = parsed.choices[0]
    prompt, reply = parsed.model_extra["prompt_token_ids"], first.model_extra["token_ids"]
    scored = api.completions.create(model="tiny", prompt=prompt + reply, echo=True, logprobs=0, max_tokens=1)
    policy = scored.choices[0].logprobs.token_logprobs[len(prompt) : len(prompt) + len(reply)]
    assert policy == pytest.approx([t.logprob for t in first.logprobs.content], abs=1e-5)
    schema = {"type": "json_schema", "json_schema": {"name": "Verdict", "schema": Verdict.model_json_schema()}}
    chunks = list(api.chat.completions.create(model="tiny", messages=messages, response_format=schema,
                                              max_tokens=32, seed=4, stream=True))  # fmt: skip
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert Verdict.model_validate_json(streamed) == first.message.parsed
    anything = api.chat.completions.create(model="tiny", messages=messages, response_format={"type": "json_object"},
                                           max_tokens=6, seed=1)  # fmt: skip
    assert anything.choices[0].message.content.startswith("{")
    unnamed = {"type": "json_schema", "json_schema": {"name": "any"}}  # no schema (the SDK allows it): any object
    no_schema = api.chat.completions.create(model="tiny", messages=messages, response_format=unnamed,  # type: ignore[arg-type]
                                            max_tokens=6, seed=1)  # fmt: skip
    assert no_schema.choices[0].message.content == anything.choices[0].message.content
