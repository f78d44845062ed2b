import math

from rlcore.backends.common.schedule import lr_lambda
from rlcore.core.config.schema import OptimizerConfig
from rlcore.core.data.prompts import PromptFormat
from rlcore.core.scratch_model import build_char_tokenizer


def test_warmup_then_constant():
    fn = lr_lambda(OptimizerConfig(lr_warmup_steps=4), total_steps=10)
    assert [fn(s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_cosine_decays_to_floor():
    fn = lr_lambda(
        OptimizerConfig(lr_scheduler_type="cosine", lr_warmup_steps=2, min_lr_ratio=0.1), total_steps=12
    )
    assert fn(2) == 1.0  # decay starts right after warm-up
    # halfway through the 10 decay steps: 0.1 + 0.9 * 0.5 * (1 + cos(pi/2)) = 0.55
    assert math.isclose(fn(7), 0.55)
    assert math.isclose(fn(12), 0.1) and math.isclose(fn(50), 0.1)


def test_sft_example_is_prompt_then_response_with_eos():
    tok = build_char_tokenizer()
    fmt = PromptFormat(max_prompt_tokens=3)
    prompt_ids, response_ids = fmt.encode_sft_example(tok, "12+3=", "<answer>15</answer>")
    assert tok.decode(prompt_ids) == "+3="  # left-truncated to 3 tokens
    assert response_ids[-1] == tok.eos_token_id
    assert tok.decode(response_ids[:-1]) == "<answer>15</answer>"
    assert len(response_ids) == 5  # <answer> 1 5 </answer> </s>
