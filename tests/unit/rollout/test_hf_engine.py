"""HFEngine on the random-init scratch model: shapes, log-probs, seeding, stopping, weight loading."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import GenerationConfig

from rlcore.core.config.schema import ScratchModelConfig
from rlcore.core.scratch_model import build_scratch_model
from rlcore.core.types import SamplingParams
from rlcore.rollout.engines.hf import HFEngine

PROMPTS = ["1+2=", "What is 12*3?"]  # different lengths: the batch is left-padded


@pytest.fixture(scope="module")
def engine(tiny_model_path: str) -> HFEngine:
    """Shared, never mutated: tests that load weights build their own engine."""
    return HFEngine(tiny_model_path, max_model_len=256)


@pytest.fixture(scope="module")
def other_model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("models") / "tiny_seed1")
    build_scratch_model(path, ScratchModelConfig(enabled=True), max_model_len=256, seed=1)
    return path


def encode(engine: HFEngine, texts: list[str]) -> list[list[int]]:
    return [engine.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def greedy_tokens(engine: HFEngine, prompts: list[list[int]], max_tokens: int = 8) -> list[list[int]]:
    out = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    return [samples[0].token_ids for samples in out]


def test_generate_returns_n_completions_per_prompt(engine: HFEngine) -> None:
    prompts = encode(engine, PROMPTS)
    out = engine.generate(prompts, SamplingParams(temperature=1.0, n=3, max_tokens=5, seed=0))
    assert len(out) == 2 and all(len(samples) == 3 for samples in out)
    for prompt, samples in zip(prompts, out, strict=True):
        for c in samples:
            assert c.prompt_token_ids == prompt
            assert 1 <= len(c.token_ids) <= 5 and len(c.logprobs) == len(c.token_ids)
            assert c.finish_reason == (
                "stop" if c.token_ids[-1] == engine.tokenizer.eos_token_id else "length"
            )
            assert all(lp <= 0.0 for lp in c.logprobs)


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(temperature=0.0, max_tokens=8),
        SamplingParams(temperature=0.7, n=2, max_tokens=8, seed=1),
        # The sampler is restricted but the log-probs stay those of the plain tempered distribution.
        SamplingParams(
            temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, repetition_penalty=1.3, max_tokens=8, seed=2
        ),
    ],
    ids=["greedy", "t0.7", "t0.7-processed"],
)
def test_logprobs_equal_teacher_forced_forward(engine: HFEngine, sampling: SamplingParams) -> None:
    out = engine.generate(encode(engine, PROMPTS), sampling)
    for c in [c for samples in out for c in samples]:
        ids = torch.tensor([c.prompt_token_ids + c.token_ids])
        with torch.no_grad():
            logits = engine.model(input_ids=ids).logits[0].float()
        # Position p predicts token p+1: the response tokens are predicted by positions P-1 .. P+R-2.
        logits = logits[len(c.prompt_token_ids) - 1 : -1]
        if sampling.temperature > 0:
            logits = logits / sampling.temperature
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)


def test_seed_reproducible_and_global_rng_untouched(engine: HFEngine) -> None:
    prompts = encode(engine, PROMPTS)

    def tokens(seed: int) -> list[list[int]]:
        out = engine.generate(prompts, SamplingParams(temperature=1.0, n=2, max_tokens=8, seed=seed))
        return [c.token_ids for samples in out for c in samples]

    rng_before = torch.random.get_rng_state()
    first, again, other = tokens(7), tokens(7), tokens(8)
    assert torch.equal(torch.random.get_rng_state(), rng_before)
    assert first == again
    # 4 sequences of 8 tokens over a ~90-token vocabulary: equal by chance with probability ~0.
    assert first != other


def test_a_seed_reproduces_a_prompts_samples_whatever_it_is_batched_with(
    engine: HFEngine, tiny_model_path: str
) -> None:
    prompts = encode(engine, PROMPTS)
    sampling = SamplingParams(temperature=1.0, n=4, max_tokens=8, seed=5)

    def samples(e: HFEngine, batch: list[list[int]]) -> list[list[list[int]]]:
        return [[c.token_ids for c in cs] for cs in e.generate(batch, sampling)]

    together = samples(engine, prompts)
    alone = [samples(engine, [p])[0] for p in prompts]
    reversed_ = samples(engine, prompts[::-1])[::-1]
    # max_batch_size 3 splits n=4 into shares of 3 and 1, one prompt per call: sample j keeps seed + j
    split = samples(HFEngine(tiny_model_path, max_model_len=256, max_batch_size=3), prompts)
    assert together == alone == reversed_ == split
    assert all(len({tuple(t) for t in cs}) > 1 for cs in together)  # a prompt's samples still differ
    # a repeated prompt in one request samples what it samples alone
    assert samples(engine, [prompts[0], prompts[0]]) == [together[0], together[0]]


def test_greedy_equals_top_k_1_sampling(engine: HFEngine) -> None:
    prompts = encode(engine, PROMPTS)
    greedy = engine.generate(prompts, SamplingParams(temperature=0.0, n=2, max_tokens=8))
    top1 = engine.generate(prompts, SamplingParams(temperature=1.0, top_k=1, n=2, max_tokens=8, seed=3))
    for g, s in zip(greedy, top1, strict=True):
        assert len(g) == 2 and g[0].token_ids == g[1].token_ids
        assert [c.token_ids for c in s] == [c.token_ids for c in g]


def test_batching_splits_calls_without_changing_results(engine: HFEngine, tiny_model_path: str) -> None:
    small = HFEngine(tiny_model_path, max_model_len=256, max_batch_size=3)
    # n=5 with room for 3 sequences: shares of 3 and 2; the 3s go one prompt per call, the 2s one too.
    # n=2: one share of 2 per prompt, one prompt per call (2 * 2 > 3).
    assert small._plan_chunks(3, 5) == [([0], 3), ([1], 3), ([2], 3), ([0], 2), ([1], 2), ([2], 2)]
    assert small._plan_chunks(3, 1) == [([0, 1, 2], 1)]
    assert small._plan_chunks(4, 1) == [([0, 1, 2], 1), ([3], 1)]
    prompts = encode(engine, PROMPTS)
    # top_k=1 is deterministic, so every one of the 5 samples must be the prompt's greedy answer.
    out = small.generate(prompts, SamplingParams(temperature=1.0, top_k=1, n=5, max_tokens=6, seed=0))
    for prompt, samples, greedy in zip(prompts, out, greedy_tokens(engine, prompts, 6), strict=True):
        assert [c.prompt_token_ids for c in samples] == [prompt] * 5
        assert [c.token_ids for c in samples] == [greedy] * 5


def test_checkpoint_generation_config_does_not_leak_but_its_eos_ids_count(
    engine: HFEngine, tiny_model_path: str, tmp_path: Path
) -> None:
    path = tmp_path / "model"
    shutil.copytree(tiny_model_path, path)
    e_id = engine.tokenizer.convert_tokens_to_ids("E")
    # Sampler defaults a checkpoint may carry; if any reached generate, greedy output would change
    # (the random model repeats tokens, which no_repeat_ngram_size=1 forbids).
    GenerationConfig(
        eos_token_id=[engine.tokenizer.eos_token_id, e_id], no_repeat_ngram_size=1, repetition_penalty=3.0
    ).save_pretrained(path)
    custom = HFEngine(str(path), max_model_len=256)
    prompts = encode(engine, PROMPTS)
    expected = greedy_tokens(engine, prompts)
    # A chat model ends turns on any id its generation_config lists: here also 'E', so the
    # first prompt (whose greedy answer is all 'E') stops on its first token.
    assert expected[0][0] == e_id and e_id not in expected[1]  # precondition
    out = custom.generate(prompts, SamplingParams(temperature=0.0, max_tokens=8))
    assert out[0][0].token_ids == [e_id] and out[0][0].finish_reason == "stop"
    assert out[1][0].token_ids == expected[1]


def test_max_tokens_ends_with_length(engine: HFEngine) -> None:
    (c,) = engine.generate(encode(engine, PROMPTS[:1]), SamplingParams(temperature=0.0, max_tokens=4))[0]
    assert engine.tokenizer.eos_token_id not in c.token_ids  # precondition on the random model
    assert c.finish_reason == "length" and len(c.token_ids) == 4


def test_prompt_longer_than_model_len_is_rejected(engine: HFEngine) -> None:
    prompts = [[10] * 10, [10] * 250]
    with pytest.raises(ValueError, match="prompt 1"):
        engine.generate(prompts, SamplingParams(max_tokens=8))


def test_stop_strings_truncate_text_and_keep_the_completing_token(engine: HFEngine) -> None:
    prompts = encode(engine, PROMPTS[1:])
    (full,) = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=16))[0]
    # Precondition: the first 8 tokens are plain characters (one token per character, ids >= 6),
    # so character i of the text is token i, and the text varies enough to hold 2-char stops.
    assert all(t >= 6 for t in full.token_ids[:8]) and len(set(full.text[:8])) >= 4
    late, early = full.text[6:8], full.text[4:6]
    # Hand computation: the stop string first appears at character k = text.find(stop); generation
    # stops on the token completing it (token k+1), and the text keeps characters 0..k-1.
    k = min(full.text.find(late), full.text.find(early))
    (c,) = engine.generate(prompts, SamplingParams(temperature=0.0, max_tokens=16, stop=[late, early]))[0]
    assert c.finish_reason == "stop"
    assert c.token_ids == full.token_ids[: k + 2]
    assert c.logprobs == pytest.approx(full.logprobs[: k + 2], abs=1e-6)
    assert c.text == full.text[:k]


def knob_cases(eos: int, x: int) -> list[tuple[SamplingParams, list[int], str]]:
    """(sampling, expected tokens, finish reason) for the knobs the OpenAI door serves, each forced
    by a logit bias so that the answer is known whatever the weights: token `x` or EOS biased +100."""
    forced_eos, forced_x = {eos: 100.0}, {x: 100.0}
    return [
        (SamplingParams(temperature=1.0, max_tokens=6, logit_bias=forced_x, seed=0), [x] * 6, "length"),
        (SamplingParams(temperature=0.0, max_tokens=6, logit_bias=forced_eos), [eos], "stop"),
        (SamplingParams(temperature=0.0, max_tokens=6, logit_bias=forced_eos, ignore_eos=True), [eos] * 6, "length"),
        (SamplingParams(temperature=0.0, max_tokens=6, logit_bias=forced_x, stop_token_ids=[x]), [x], "stop"),
        # EOS held back for 3 tokens (the biased x is the next best), then sampled: 4 tokens
        (SamplingParams(temperature=0.0, max_tokens=6, logit_bias={eos: 100.0, x: 50.0}, min_tokens=3),
         [x, x, x, eos], "stop"),
        # ignore_eos with min_tokens: EOS is still held back for 2 tokens (vLLM's rule), then goes on
        (SamplingParams(temperature=0.0, max_tokens=4, logit_bias={eos: 100.0, x: 50.0}, min_tokens=2,
                        ignore_eos=True), [x, x, eos, eos], "length"),
        # a frequency penalty of 2 x count on x (+3 over the rest): taken twice, then 3 - 2 x 2 < 0
        (SamplingParams(temperature=0.0, max_tokens=4, logit_bias={x: 3.0, eos: -100.0}, frequency_penalty=2.0),
         [x, x], None),
    ]  # fmt: skip


def test_penalties_bias_min_tokens_ignore_eos_and_stop_token_ids(engine: HFEngine) -> None:
    eos, x = engine.tokenizer.eos_token_id, engine.tokenizer.convert_tokens_to_ids("7")
    prompts = encode(engine, PROMPTS)
    for sampling, expected, finish in knob_cases(eos, x):
        for (c,) in engine.generate(prompts, sampling):
            assert c.token_ids[: len(expected)] == expected, sampling
            if finish is not None:
                assert c.token_ids == expected and c.finish_reason == finish, sampling
            else:  # x no longer wins after twice
                assert x not in c.token_ids[len(expected) :], (sampling, c.token_ids)


def eos_weights(engine: HFEngine, eos_logit: float) -> dict[str, torch.Tensor]:
    """Weights under which every position gives logit `eos_logit` (before the final norm) to EOS
    and 0 to every other token: embeddings are all ones and attention/MLP outputs are zeroed, so
    the residual stream is the ones vector whatever the context."""
    state = engine.model.state_dict()
    hidden = engine.model.config.hidden_size
    weights = {"model.embed_tokens.weight": torch.ones_like(state["model.embed_tokens.weight"])}
    for name, tensor in state.items():
        if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            weights[name] = torch.zeros_like(tensor)
    lm_head = torch.zeros_like(state["lm_head.weight"])
    lm_head[engine.tokenizer.eos_token_id] = eos_logit / hidden
    weights["lm_head.weight"] = lm_head
    return weights


def test_eos_ends_sequences_and_logprobs_match_hand_values(tiny_model_path: str) -> None:
    engine = HFEngine(tiny_model_path, max_model_len=256)
    eos = engine.tokenizer.eos_token_id
    vocab = engine.model.config.vocab_size
    with torch.inference_mode():  # the engine must work under inference mode (rollout workers use it)
        engine.load_weights(eos_weights(engine, math.log((vocab - 1) / 4)).items(), policy_version=1)
        greedy = engine.generate([[10, 11]], SamplingParams(temperature=0.0, max_tokens=6))[0][0]
        out = engine.generate([[10, 11], [12]], SamplingParams(temperature=1.0, n=8, max_tokens=6, seed=0))
    assert greedy.token_ids == [eos] and greedy.finish_reason == "stop" and greedy.text == ""

    # Final RMSNorm of the ones vector: 1 / sqrt(1 + eps), eps = 1e-5. EOS logit a = ln((V-1)/4) times
    # that, every other logit 0, so log p(EOS) = a - log(e^a + V - 1) (p ~ 0.2) and
    # log p(other) = -log(e^a + V - 1).
    a = math.log((vocab - 1) / 4) / math.sqrt(1 + 1e-5)
    log_z = math.log(math.exp(a) + vocab - 1)
    completions = [c for samples in out for c in samples]
    for c in completions:
        assert eos not in c.token_ids[:-1]
        if c.token_ids[-1] == eos:
            assert c.finish_reason == "stop"
        else:
            assert c.finish_reason == "length" and len(c.token_ids) == 6
        expected = [a - log_z if t == eos else -log_z for t in c.token_ids]
        assert c.logprobs == pytest.approx(expected, abs=1e-4)
    # p(EOS) ~ 0.2 per step: of 16 samples some stop after a few tokens and some run to the budget
    # (0.8^6 ~ 0.26 each) while other rows of the batch are already padded.
    assert any(c.finish_reason == "stop" and len(c.token_ids) > 1 for c in completions)
    assert any(c.finish_reason == "length" for c in completions)


def test_load_weights_switches_to_the_other_model(tiny_model_path: str, other_model_path: str) -> None:
    engine = HFEngine(tiny_model_path, max_model_len=256)
    other = HFEngine(other_model_path, max_model_len=256)
    prompts = encode(engine, PROMPTS)
    target = greedy_tokens(other, prompts)
    assert greedy_tokens(engine, prompts) != target  # precondition: differently seeded models differ
    engine.load_weights(
        load_file(os.path.join(other_model_path, "model.safetensors")).items(), policy_version=5
    )
    assert engine.policy_version == 5
    assert greedy_tokens(engine, prompts) == target


def test_load_weights_keeps_tied_embeddings_tied(tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("tied")
    spec = ScratchModelConfig(enabled=True, tie_word_embeddings=True)
    paths = [str(root / f"seed{seed}") for seed in (0, 1)]
    for seed, path in enumerate(paths):
        build_scratch_model(path, spec, max_model_len=256, seed=seed)
    engine, other = HFEngine(paths[0], max_model_len=256), HFEngine(paths[1], max_model_len=256)
    prompts = encode(engine, PROMPTS)
    target = greedy_tokens(other, prompts)
    assert greedy_tokens(engine, prompts) != target
    # A trainer of a tied model may send the embedding only; the output layer must follow it.
    weights = {k: v for k, v in other.model.state_dict().items() if k != "lm_head.weight"}
    engine.load_weights(weights.items(), policy_version=1)
    assert engine.model.lm_head.weight.data_ptr() == engine.model.model.embed_tokens.weight.data_ptr()
    assert greedy_tokens(engine, prompts) == target


def test_load_weights_rejects_unknown_names_and_wrong_shapes(tiny_model_path: str) -> None:
    engine = HFEngine(tiny_model_path, max_model_len=256)
    with pytest.raises(ValueError, match="'model.nope.weight'"):
        engine.load_weights([("model.nope.weight", torch.zeros(2))], policy_version=1)
    with pytest.raises(ValueError, match=r"'model.norm.weight' has shape \(3,\)"):
        engine.load_weights([("model.norm.weight", torch.zeros(3))], policy_version=1)
    assert engine.policy_version == 0


def test_max_model_len_defaults_to_the_models_positions_and_refuses_more(
    tiny_model_path: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlcore.cli.main import main

    assert HFEngine(tiny_model_path).max_model_len == 256  # the scratch model's max_position_embeddings
    with pytest.raises(ValueError, match=r"^max_model_len 300 exceeds the 256 positions the model at .* holds"):
        HFEngine(tiny_model_path, max_model_len=300)
    # `rlcore rollout serve` says it in one line, naming the flag, before loading anything
    monkeypatch.setenv("RLCORE_TOKEN", "secret")
    capsys.readouterr()
    argv = ["rollout", "serve", "--model", tiny_model_path, "--max-model-len", "300"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlcore: error: --max-model-len 300 exceeds the 256 positions") and err.count("\n") == 1


def test_stop_strings_match_the_decoded_text_not_inside_special_tokens(bpe_model_path: str) -> None:
    """A stop string is looked for in the text a reply decodes to (as vLLM does): the special token
    `<|im_end|>`, which decoding drops, does not end a reply on the stop string "<|im"; the same
    characters written as plain text do. transformers' own matcher stops on both."""
    from transformers.generation.stopping_criteria import StopStringCriteria

    from rlcore.rollout.engines.hf_sampling import TextStopStrings

    engine = HFEngine(bpe_model_path, max_model_len=256)
    tok = engine.tokenizer
    special = [5, tok.convert_tokens_to_ids("<|im_end|>")]
    plain = tok("a <|im", add_special_tokens=False)["input_ids"]
    assert tok.decode(special[1:], skip_special_tokens=True) == "" and tok.decode(plain).endswith("<|im")
    ours, theirs = TextStopStrings(tok, ["<|im"]), StopStringCriteria(tok, ["<|im"])
    assert ours(torch.tensor([special]), None).tolist() == [False]
    assert theirs(torch.tensor([special]), None).tolist() == [True]
    assert ours(torch.tensor([plain]), None).tolist() == [True]
    # in the engine: <|im_start|> (special, not EOS) forced, with "<|im" as a stop string: no stop
    start = tok.convert_tokens_to_ids("<|im_start|>")
    sampling = SamplingParams(temperature=0.0, max_tokens=3, stop=["<|im"], logit_bias={start: 100.0})
    (c,) = engine.generate([plain], sampling)[0]
    assert c.token_ids == [start] * 3 and c.finish_reason == "length", c
