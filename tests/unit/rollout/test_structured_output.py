"""Structured output in the HF engine (engines/hf_grammar.py through xgrammar): every sample of a
JSON schema parses and holds to it, a regular expression's match it whole, the log-probs stay the
policy's own (what the trainer recomputes), a grammar row samples in a running batch what it
samples alone, a response a weight update interrupts resumes its grammar, and a schema that cannot
be compiled (or a grammar the vocabulary cannot write, which ends its request alone) is one line."""

from __future__ import annotations

import json
import re
import threading
from dataclasses import replace

import pytest
import torch

from rlcore.core.algorithms.logprob import token_logprobs
from rlcore.core.types import SamplingParams, StructuredOutput
from rlcore.rollout.batching import BatchingEngine
from rlcore.rollout.engines.hf import HFEngine
from rlcore.rollout.gate import GenerationGate

pytestmark = pytest.mark.timeout(300)
pytest.importorskip("xgrammar", reason="structured output needs xgrammar: pip install 'rlcore[structured]'")

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}, "score": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["answer", "score"], "additionalProperties": False,
}  # fmt: skip
JSON = StructuredOutput("json_schema", json.dumps(SCHEMA))


@pytest.fixture(scope="module")
def engine(bpe_model_path: str) -> HFEngine:
    torch.set_num_threads(1)
    return HFEngine(bpe_model_path, max_batch_size=32)


def _prompt(engine: HFEngine, text: str = "Is 2+2=4? Answer in JSON.") -> list[int]:
    return engine.tokenizer(text)["input_ids"]


def test_every_sample_of_a_json_schema_parses_and_holds_to_it(engine: HFEngine) -> None:
    (samples,) = engine.generate([_prompt(engine)], SamplingParams(n=8, max_tokens=40, seed=3, structured_output=JSON))
    for c in samples:
        value = json.loads(c.text)
        assert set(value) == {"answer", "score"} and value["answer"] in ("yes", "no"), c.text
        assert isinstance(value["score"], int) and 0 <= value["score"] <= 99, c.text
        assert c.finish_reason == "stop" and c.token_ids[-1] in engine.eos_token_ids
        assert " " not in c.text  # compact, as vLLM's disable_any_whitespace
    assert len({c.text for c in samples}) > 1  # sampled, not one forced answer
    (plain,) = engine.generate([_prompt(engine)], SamplingParams(n=4, max_tokens=40, seed=3))
    assert not any(c.text.startswith('{"answer":') for c in plain)  # the random model alone writes no such JSON


def test_a_regex_and_any_json_object(engine: HFEngine) -> None:
    regex = StructuredOutput("regex", r"(yes|no), [0-9]{1,2}\.")
    (samples,) = engine.generate([_prompt(engine)], SamplingParams(n=6, max_tokens=12, seed=1, structured_output=regex))
    assert all(re.fullmatch(r"(yes|no), [0-9]{1,2}\.", c.text) and c.finish_reason == "stop" for c in samples)
    (greedy,) = engine.generate([_prompt(engine)], SamplingParams(temperature=0, max_tokens=40, structured_output=regex))
    assert re.fullmatch(r"(yes|no), [0-9]{1,2}\.", greedy[0].text)
    (objects,) = engine.generate(
        [_prompt(engine)], SamplingParams(n=2, max_tokens=6, seed=2, structured_output=StructuredOutput("json_object"))
    )
    assert all(c.text.startswith("{") for c in objects)  # cut at max_tokens: an object begun


def test_the_log_probs_are_the_policys_own_not_the_masks(engine: HFEngine) -> None:
    """What a row reports is log_softmax(logits / T) of the unmasked model at the token drawn (the
    trainer's function), so a trainer's recomputation agrees; the mask only chose the token."""
    prompt = _prompt(engine)
    (samples,) = engine.generate([prompt], SamplingParams(n=3, temperature=0.8, max_tokens=40, seed=7, structured_output=JSON))
    for c in samples:
        ids = torch.tensor([prompt + c.token_ids])
        with torch.no_grad():
            logits = engine.model(input_ids=ids).logits[:, len(prompt) - 1 : -1].float() / 0.8
        expected = token_logprobs(logits, torch.tensor([c.token_ids]))[0]
        assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-5)
        assert min(c.logprobs) < -2  # the policy's: a masked distribution would give its forced tokens ~0


def test_a_grammar_row_in_a_running_batch_samples_what_it_samples_alone(engine: HFEngine) -> None:
    """A structured request and a plain one, joining the running batch at different steps: each
    gives what it gives alone (seeded)."""
    structured = SamplingParams(n=2, max_tokens=40, seed=11, structured_output=JSON)
    plain = SamplingParams(n=2, max_tokens=20, seed=12)
    prompts = [[_prompt(engine)], [_prompt(engine, "Say something.")]]
    alone = [engine.generate(p, s) for p, s in zip(prompts, (plain, structured), strict=True)]
    batch = engine.continuous_batch()
    assert batch is not None
    first = batch.add(prompts[0], plain)
    done = batch.step()
    second = batch.add(prompts[1], structured)
    while batch.rows:
        done.update(batch.step())
    for got, ref in zip((done[first], done[second]), alone, strict=True):
        assert [c.token_ids for c in got[0]] == [c.token_ids for c in ref[0]]


def test_what_cannot_be_served_is_one_line(engine: HFEngine) -> None:
    prompt = [_prompt(engine)]
    with pytest.raises(ValueError, match=r'^structured output: the json schema cannot be compiled: Unsupported type "nonsense"$'):
        engine.generate(prompt, SamplingParams(max_tokens=4, structured_output=StructuredOutput("json_schema", '{"type": "nonsense"}')))
    with pytest.raises(ValueError, match="structured output with min_tokens"):
        engine.generate(prompt, SamplingParams(max_tokens=9, min_tokens=2, structured_output=JSON))
    with pytest.raises(ValueError, match="^structured output with ignore_eos: .*; drop ignore_eos$"):
        engine.generate(prompt, SamplingParams(max_tokens=9, ignore_eos=True, structured_output=JSON))


def test_a_response_a_weight_update_interrupts_resumes_its_grammar(engine: HFEngine) -> None:
    """A weight update (here: the same weights) interrupts a greedy structured request mid-text;
    the continuation's grammar first takes the tokens so far (StructuredOutput.resumed), so the
    response is the one decoded uninterrupted. A grammar begun afresh would open a second object."""
    prompt, greedy = _prompt(engine), SamplingParams(temperature=0, max_tokens=40, structured_output=JSON)
    (reference,) = engine.generate([prompt], greedy)[0]
    gate, lock, forwards, updates = GenerationGate(interrupts=True), threading.Lock(), [0], []

    def update() -> None:
        gate.wait_idle()
        gate.open()

    def interrupt_at_the_fifth_forward(module: torch.nn.Module, args: tuple) -> None:
        forwards[0] += 1
        if forwards[0] == 5:
            gate.close()
            updates.append(threading.Thread(target=update))
            updates[-1].start()

    hook = engine.model.register_forward_pre_hook(interrupt_at_the_fifth_forward)
    try:
        ((c,),), _ = BatchingEngine(engine, lock, gate).generate_versioned([prompt], greedy)
    finally:
        hook.remove()
        for t in updates:
            t.join()
    (_, first), _ = c.segments  # interrupted once, `first` tokens in
    assert 1 <= first < len(c.token_ids)
    assert c.token_ids == reference.token_ids and json.loads(c.text) == json.loads(reference.text)
    afresh = replace(greedy, max_tokens=40 - first)  # what the continuation gave before it resumed its grammar
    (restarted,) = engine.generate([prompt + c.token_ids[:first]], afresh)[0]
    assert restarted.token_ids != c.token_ids[first:]


def test_a_grammar_that_finds_no_way_on_ends_its_request_alone(tiny_model_path: str) -> None:
    """In a running batch, the request whose grammar the vocabulary cannot write fails with its
    one-line error; a plain request beside it decodes on to what it gives alone."""
    engine = HFEngine(tiny_model_path, max_model_len=256)
    prompt = [engine.tokenizer("1+1=")["input_ids"]]
    plain = SamplingParams(n=2, max_tokens=12, seed=5)
    (alone,) = engine.generate(prompt, plain)
    batch = engine.continuous_batch()
    assert batch is not None
    first = batch.add(prompt, plain)
    done = batch.step()
    second = batch.add(prompt, SamplingParams(max_tokens=4, structured_output=StructuredOutput("json_object")))
    while batch.rows:
        done.update(batch.step())
    assert isinstance(done[second], ValueError) and str(done[second]).startswith("structured output: no token")
    assert [c.token_ids for c in done[first][0]] == [c.token_ids for c in alone]


def test_a_grammar_the_vocabulary_cannot_write_is_one_line(tiny_model_path: str) -> None:
    """The quickstart's character vocabulary has no braces: a JSON object cannot begin."""
    engine = HFEngine(tiny_model_path, max_model_len=256)
    prompt = [engine.tokenizer("1+1=")["input_ids"]]
    for temperature in (0.0, 1.0):
        sampling = SamplingParams(temperature=temperature, max_tokens=4, structured_output=StructuredOutput("json_object"))
        with pytest.raises(ValueError, match="^structured output: no token of the model's vocabulary continues"):
            engine.generate(prompt, sampling)
