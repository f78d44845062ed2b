"""The HF engine's own decode loop against transformers: the sampler's filters against transformers'
logits processors, and greedy decoding against `model.generate` (left padding, shared prefill,
finished rows leaving the batch)."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from rlcore.core.types import SamplingParams
from rlcore.rollout.engines.hf import HFEngine
from rlcore.rollout.engines.hf_decode import decode
from rlcore.rollout.engines.hf_sampling import LogitRules, filter_logits


def hf_filtered(logits: torch.Tensor, history: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """transformers' processors in the order generate applies them."""
    scores = RepetitionPenaltyLogitsProcessor(sampling.repetition_penalty)(history, logits.clone())
    scores = TemperatureLogitsWarper(sampling.temperature)(history, scores)
    if sampling.top_k > 0:
        scores = TopKLogitsWarper(sampling.top_k)(history, scores)
    if sampling.top_p < 1.0:
        scores = TopPLogitsWarper(sampling.top_p)(history, scores)
    if sampling.min_p > 0:
        scores = MinPLogitsWarper(sampling.min_p)(history, scores)
    return scores


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.0, top_k=5),
        SamplingParams(temperature=1.3, top_p=0.8),
        SamplingParams(temperature=1.0, min_p=0.1),
        SamplingParams(temperature=0.9, top_k=20, top_p=0.9, min_p=0.05, repetition_penalty=1.3),
    ],
    ids=["temperature", "top_k", "top_p", "min_p", "all"],
)
def test_filters_match_transformers_processors(sampling: SamplingParams) -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=gen) * 3
    history = torch.randint(0, 50, (6, 7), generator=gen)
    seen = torch.zeros(6, 50, dtype=torch.bool).scatter_(1, history, True)
    ours = filter_logits(logits, sampling, LogitRules.start(sampling, seen, 6, 50, torch.device("cpu"), [3]))
    theirs = hf_filtered(logits, history, sampling)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    kept = ~torch.isinf(ours)
    assert torch.allclose(ours[kept], theirs[kept], atol=1e-6)
    assert kept.sum(-1).min() >= 1  # every row keeps a token to sample


def test_rules_match_their_definitions() -> None:
    """logit_bias against transformers' SequenceBiasLogitsProcessor, min_tokens against its
    MinNewTokensLengthLogitsProcessor (which holds EOS back; here every stop token), presence and
    frequency penalties against OpenAI's formula: logit - frequency x count - presence x (count > 0),
    over the response only, counted as it grows."""
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 50, generator=gen) * 3
    response = torch.randint(0, 50, (4, 6), generator=gen)
    cpu = torch.device("cpu")

    bias = SamplingParams(temperature=0.0, logit_bias={5: 2.5, 7: -100.0, 49: 0.75})
    rules = LogitRules.start(bias, None, 4, 50, cpu, [])
    theirs = SequenceBiasLogitsProcessor({(5,): 2.5, (7,): -100.0, (49,): 0.75})(response, logits.clone())
    assert torch.allclose(filter_logits(logits, bias, rules), theirs)

    held = SamplingParams(temperature=0.0, min_tokens=3)
    rules = LogitRules.start(held, None, 4, 50, cpu, [2, 9])
    for step in range(5):
        ids = torch.zeros((4, 7 + step), dtype=torch.long)  # a prompt of 7, `step` tokens generated
        theirs = MinNewTokensLengthLogitsProcessor(7, 3, [2, 9])(ids, logits.clone())
        assert torch.equal(filter_logits(logits, held, rules, step), theirs), step

    penalties = SamplingParams(temperature=0.0, presence_penalty=0.7, frequency_penalty=-0.4)
    rules = LogitRules.start(penalties, None, 4, 50, cpu, [])
    assert rules is not None
    for step in range(response.shape[1]):
        counts = torch.zeros(4, 50).scatter_add_(1, response[:, :step], torch.ones(4, step))
        expected = logits - 0.4 * -counts - 0.7 * (counts > 0).float()
        assert torch.allclose(filter_logits(logits, penalties, rules, step), expected), step
        rules.observe(response[:, step])
    assert (
        LogitRules.start(SamplingParams(min_tokens=3), None, 4, 50, cpu, []) is None
    )  # nothing to hold back


@pytest.mark.parametrize("repetition_penalty", [1.0, 1.5])
def test_greedy_equals_model_generate_while_rows_finish(
    tiny_model_path: str, repetition_penalty: float
) -> None:
    """EOS is set to the tokens the model greedily emits most, so rows of different prompt lengths stop
    at different steps and leave the batch; every row must still equal `generate`'s, which keeps
    finished rows in its batch."""
    engine = HFEngine(tiny_model_path, max_model_len=256)
    tok = engine.tokenizer
    texts = ["1+2=", "What is 12*3?", "7", "9-4=", "Compute 3+3 now", "x"]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    sampling = SamplingParams(temperature=0.0, max_tokens=12, repetition_penalty=repetition_penalty)
    free_run = decode(engine.model, prompts, 1, sampling, eos_token_ids=[-1], pad_token_id=engine.pad_token_id,
                      stop_matcher=None)  # fmt: skip
    counts = torch.bincount(torch.tensor([t for row in free_run.tokens for t in row]))
    eos_ids = counts.topk(2).indices.tolist()

    rows = decode(engine.model, prompts, 1, sampling, eos_token_ids=eos_ids, pad_token_id=engine.pad_token_id,
                  stop_matcher=None)  # fmt: skip
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[engine.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        reference = engine.model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                          max_new_tokens=12, eos_token_id=eos_ids, pad_token_id=engine.pad_token_id,
                                          repetition_penalty=repetition_penalty)  # fmt: skip
    lengths = []
    for row, (tokens, finish) in enumerate(zip(rows.tokens, rows.finish_reasons, strict=True)):
        expected = reference[row, width:].tolist()
        stop = next((t + 1 for t, tok_id in enumerate(expected) if tok_id in eos_ids), None)
        assert tokens == expected[: stop or 12]
        assert finish == ("stop" if stop else "length")
        lengths.append(len(tokens))
    assert len(set(lengths)) > 1, f"rows should finish at different steps; lengths {lengths}"


def test_samples_share_a_prefill_yet_sample_independently(tiny_model_path: str) -> None:
    engine = HFEngine(tiny_model_path, max_model_len=256)
    prompts = [engine.tokenizer(t, add_special_tokens=False)["input_ids"] for t in ["1+2=", "What is 12*3?"]]
    torch.manual_seed(0)
    rows = decode(engine.model, prompts, 4, SamplingParams(temperature=1.0, max_tokens=10),
                  eos_token_ids=[-1], pad_token_id=engine.pad_token_id, stop_matcher=None)  # fmt: skip
    assert len(rows.tokens) == 8 and all(len(t) == 10 for t in rows.tokens)
    for p in range(2):
        samples = {tuple(t) for t in rows.tokens[p * 4 : (p + 1) * 4]}
        assert len(samples) > 1, "the n samples of a prompt must not be copies of each other"


def test_grouped_sdpa_on_cpu_equals_transformers_sdpa_under_padding_and_cache(tiny_model_path: str) -> None:
    """The engine's CPU attention (KV heads grouped in the kernel, mask and all) against transformers'
    own SDPA (KV heads copied per query head): the same greedy rows, the same log-probs."""
    from transformers import AutoModelForCausalLM

    engine = HFEngine(tiny_model_path, max_model_len=256)
    assert engine.model.config._attn_implementation == "rlcore_grouped_sdpa"
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    assert reference.config._attn_implementation == "sdpa"
    assert reference.config.num_key_value_heads < reference.config.num_attention_heads  # grouped heads

    prompts = [
        engine.tokenizer(t, add_special_tokens=False)["input_ids"] for t in ["1+2=", "What is 12*3?", "7"]
    ]
    kwargs = dict(eos_token_ids=[-1], pad_token_id=engine.pad_token_id, stop_matcher=None)
    greedy = SamplingParams(temperature=0.0, max_tokens=16)
    ours, theirs = (
        decode(engine.model, prompts, 1, greedy, **kwargs),
        decode(reference, prompts, 1, greedy, **kwargs),
    )
    assert ours.tokens == theirs.tokens
    diffs = [
        abs(a - b)
        for x, y in zip(ours.logprobs, theirs.logprobs, strict=True)
        for a, b in zip(x, y, strict=True)
    ]
    assert max(diffs) < 1e-5


# ---------------------------------------------------------------------------- the static decode loop


def small_model(model_type: str, vocab: int) -> torch.nn.Module:
    """A random 2-layer model of `model_type` with grouped KV heads (head_dim 16); MoE types with 4
    experts, 2 per token."""
    from transformers import AutoConfig, AutoModelForCausalLM

    moe = (
        {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
        if "moe" in model_type
        else {}
    )
    config = AutoConfig.for_model(
        model_type, vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512, **moe,
    )  # fmt: skip
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


STATIC_CASES = {
    "greedy": (SamplingParams(temperature=0.0, max_tokens=20), 1),
    "sampled": (SamplingParams(temperature=1.0, max_tokens=30, n=4), 4),
    "filters": (
        SamplingParams(
            temperature=0.8, top_k=5, top_p=0.9, min_p=0.02, repetition_penalty=1.3, max_tokens=25, n=3
        ),
        3,
    ),  # fmt: skip
    "stop_string": (SamplingParams(temperature=1.0, max_tokens=30, n=2, stop=["3", "ab"]), 2),
    "rules": (
        SamplingParams(
            temperature=1.0,
            max_tokens=25,
            n=3,
            presence_penalty=0.8,
            frequency_penalty=0.5,
            logit_bias={5: 2.0, 7: -100.0},
            min_tokens=4,
            stop_token_ids=[11],
            stop=["ab"],
        ),
        3,
    ),  # fmt: skip
    "past_one_view": (SamplingParams(temperature=0.0, max_tokens=150), 1),
}


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3", "qwen3_moe"])
@pytest.mark.parametrize("case", list(STATIC_CASES))
def test_static_decode_equals_the_eager_loop(tiny_model_path: str, model_type: str, case: str) -> None:
    """The static loop (rows kept in the batch to the end, a fixed-shape cache read through views of
    128-token steps, the batch padded to a power of two, the host told only every 4 steps) against
    the eager loop (rows leave the batch): the same tokens for the same seeds, the same finish
    reasons, log-probs equal to float32 rounding. EOS is a token the model emits often, so rows end at
    different steps."""
    from transformers.generation.stopping_criteria import StopStringCriteria

    from rlcore.rollout.engines.hf_decode import decode_static
    from rlcore.rollout.engines.hf_static import StaticDecodeStates, supports

    engine = HFEngine(tiny_model_path, max_model_len=256)
    model = engine.model if model_type == "llama" else small_model(model_type, len(engine.tokenizer))
    assert supports(model.config) is None
    sampling, n = STATIC_CASES[case]
    prompts = [engine.tokenizer(t, add_special_tokens=False)["input_ids"]
               for t in ["1+2=", "What is 12*3?", "7", "9-4=", "Compute 3+3 now", "x"]]  # fmt: skip
    matcher = StopStringCriteria(engine.tokenizer, sampling.stop) if sampling.stop else None
    seeds = None if sampling.temperature == 0 else [100 + r for r in range(len(prompts) * n)]
    free = decode(model, prompts, n, sampling, eos_token_ids=[-1], pad_token_id=engine.pad_token_id,
                  stop_matcher=None, row_seeds=seeds)  # fmt: skip
    counts = torch.bincount(torch.tensor([t for row in free.tokens for t in row]))
    eos = [] if case == "past_one_view" else counts.topk(1).indices.tolist()
    options = dict(eos_token_ids=eos or [-1], pad_token_id=engine.pad_token_id, stop_matcher=matcher,
                   row_seeds=seeds)  # fmt: skip

    eager = decode(model, prompts, n, sampling, **options)
    states = StaticDecodeStates(model, max_batch_size=256, max_model_len=256, use_graphs=False)
    static = decode_static(states, prompts, n, sampling, check_every=4, **options)
    assert static.tokens == eager.tokens
    assert static.finish_reasons == eager.finish_reasons
    gaps = [
        abs(a - b)
        for x, y in zip(static.logprobs, eager.logprobs, strict=True)
        for a, b in zip(x, y, strict=True)
    ]
    assert max(gaps) < 1e-4
    if case != "past_one_view":
        assert len({len(t) for t in eager.tokens}) > 1, "rows should end at different steps"
    (state,) = states._states.values()
    assert state.batch == 1 << (len(prompts) * n - 1).bit_length()  # rows padded to a power of two
    # a second call reuses the state (its cache was left with the first call's keys and values)
    assert decode_static(states, prompts, n, sampling, check_every=4, **options).tokens == eager.tokens


def test_static_decode_refuses_what_it_cannot_run() -> None:
    from transformers import AutoConfig

    from rlcore.rollout.engines.hf_static import batch_bucket, supports

    assert "gpt2" in (supports(AutoConfig.for_model("gpt2")) or "")
    assert supports(AutoConfig.for_model("qwen2", use_sliding_window=True)) == "sliding-window attention"
    moe = AutoConfig.for_model(
        "qwen3_moe", hidden_size=2048, moe_intermediate_size=768, num_experts_per_tok=8
    )
    assert supports(moe, batch=8) is None  # 8 x 8 experts of 9 MiB: 0.6 GiB gathered per layer
    assert "gather 2.2 GiB of expert weights per layer at max_batch_size 32" in (
        supports(moe, batch=32) or ""
    )
    assert [batch_bucket(r, 48) for r in (1, 2, 3, 5, 16, 17, 48)] == [1, 2, 4, 8, 16, 32, 48]


def test_an_interrupt_ends_both_loops_at_a_token_boundary_with_the_tokens_so_far(
    tiny_model_path: str,
) -> None:
    """Set before the call, the eager loop stops after one token and the static one after
    `check_every` (the host looks only then); rows that stopped earlier keep their own reason."""
    import threading

    from rlcore.rollout.engines.hf_decode import decode_static
    from rlcore.rollout.engines.hf_static import StaticDecodeStates

    engine = HFEngine(tiny_model_path, max_model_len=256)
    prompts, sampling = [[5, 6, 7], [9, 10]], SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True)
    options = dict(eos_token_ids=engine.eos_token_ids, pad_token_id=engine.pad_token_id, stop_matcher=None,
                   row_seeds=[1, 2])  # fmt: skip
    whole = decode(engine.model, prompts, 1, sampling, **options)
    interrupt = threading.Event()
    interrupt.set()
    eager = decode(engine.model, prompts, 1, sampling, interrupt=interrupt, **options)
    states = StaticDecodeStates(engine.model, max_batch_size=8, max_model_len=256, use_graphs=False)
    static = decode_static(states, prompts, 1, sampling, check_every=4, interrupt=interrupt, **options)
    assert eager.tokens == [row[:1] for row in whole.tokens] and eager.finish_reasons == ["interrupted"] * 2
    assert static.tokens == [row[:4] for row in whole.tokens] and static.finish_reasons == ["interrupted"] * 2
    assert [len(x) for x in static.logprobs] == [4, 4]
