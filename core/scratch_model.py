"""Build a tiny Llama-architecture model and a character tokenizer locally (nothing downloaded).

The quickstart trains this model from scratch. The tokenizer is a `tokenizers` WordLevel model over
single characters plus the answer tags as whole tokens, saved as a regular HF fast tokenizer so
that any HF-compatible engine can load the folder.
"""

from __future__ import annotations

import os
import string

from .config.schema import ScratchModelConfig

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]
TAG_TOKENS = ["<answer>", "</answer>"]
CHARS = string.digits + string.ascii_letters + " +-*/=.,:;?!()<>'\"\n"


def build_char_tokenizer():  # -> transformers.PreTrainedTokenizerFast
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + TAG_TOKENS + list(dict.fromkeys(CHARS)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    # The tags are ordinary (non-special) tokens: they survive decoding with skip_special_tokens.
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
    )


CHATML_TOOLS_TEMPLATE = (
    "{%- if tools %}"
    "{{ '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    '{{ \'# Tools\\nCall a tool as <tool_call>{\\"name\\": ..., \\"arguments\\": {...}}</tool_call>.\\n<tools>\\n\' }}'
    "{%- for tool in tools %}{{ tool | tojson + '\\n' }}{%- endfor %}"
    "{{ '</tools><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'tool' %}"
    "{{ '<|im_start|>tool\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- elif message['role'] != 'system' %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') }}"
    "{%- for call in message.get('tool_calls') or [] %}"
    "{{ '<tool_call>' + {'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson + '</tool_call>' }}"
    "{%- endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""ChatML with tools, the scratch BPE tokenizer's template: tools declared in the system turn as
OpenAI function schemas, calls written `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
(Hermes/Qwen), results in `tool` turns inside `<tool_response>`."""
CHATML_THINKING_TEMPLATE = (
    "{%- set ns = namespace(last_query=-1) %}"
    "{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- if tools %}"
    "{{ '<|im_start|>system\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\n\n' }}{%- endif %}"
    '{{ \'# Tools\nCall a tool as <tool_call>{"name": ..., "arguments": {...}}</tool_call>.\n<tools>\n\' }}'
    "{%- for tool in tools %}{{ tool | tojson + '\n' }}{%- endfor %}"
    "{{ '</tools><|im_end|>\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{ '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'tool' %}"
    "{{ '<|im_start|>tool\n<tool_response>\n' + message['content'] + '\n</tool_response><|im_end|>\n' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{%- set content = message['content'] or '' %}{%- set reasoning = '' %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\n') %}"
    "{%- endif %}"
    "{{ '<|im_start|>assistant\n' }}"
    "{%- if loop.index0 > ns.last_query %}{{ '<think>\n' + reasoning + '\n</think>\n\n' }}{%- endif %}"
    "{{ content }}"
    "{%- for call in message.get('tool_calls') or [] %}"
    "{{ '<tool_call>' + {'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson + '</tool_call>' }}"
    "{%- endfor %}"
    "{{ '<|im_end|>\n' }}"
    "{%- elif message['role'] != 'system' %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and not enable_thinking %}{{ '<think>\n\n</think>\n\n' }}{%- endif %}"
    "{%- endif %}"
)
"""ChatML with tools and reasoning, written here to behave as Qwen3's template does (Qwen3.5's and
DeepSeek-R1's likewise): an assistant turn after the last user turn is rendered with its reasoning
block (`<think>...</think>`, empty when it has none), an earlier one without it, so a conversation
rendered again after a new user turn is not the old rendering plus the new turn;
`enable_thinking=False` ends the generation prompt with an empty reasoning block."""
BPE_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BPE_TAG_TOKENS = [
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<answer>",
    "</answer>",
]


THINK_TAG_TOKENS = ["<think>", "</think>"]
"""Tag tokens the chatml_thinking tokenizer adds (one token each, as in Qwen3's vocabulary)."""


def _bpe_corpus() -> list[str]:
    """Deterministic text the scratch BPE learns its merges from: ChatML conversations about
    arithmetic with tool calls, so that the template's words and JSON take few tokens."""
    import json
    import random

    rng = random.Random(0)
    calculator = {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
    lines = [
        json.dumps(calculator),
        "# Tools\nCall a tool as <tool_call>",
        "error: unknown tool",
        "malformed tool call",
    ]
    for _ in range(2000):
        a, b, op = rng.randint(0, 99), rng.randint(0, 99), rng.choice("+-*")
        call = json.dumps({"name": "calculator", "arguments": {"expression": f"{a}{op}{b}"}})
        lines += [
            f"<|im_start|>user\nWhat is {a}{op}{b}?<|im_end|>\n<|im_start|>assistant\n<tool_call>{call}</tool_call><|im_end|>",
            f"<|im_start|>tool\n<tool_response>\n{eval(f'{a}{op}{b}')}\n</tool_response><|im_end|>",
            f"<|im_start|>assistant\n<answer>{eval(f'{a}{op}{b}')}</answer><|im_end|>",
        ]
    return lines


def build_bpe_tokenizer(vocab_size: int, thinking: bool = False):  # -> transformers.PreTrainedTokenizerFast
    """A byte-level BPE trained here on `_bpe_corpus` (digits stay single tokens), with ChatML's
    special tokens and CHATML_TOOLS_TEMPLATE as its chat template; `thinking`: the `<think>` tags as
    tokens of their own and CHATML_THINKING_TEMPLATE."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=BPE_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )  # fmt: skip
    tok.train_from_iterator(_bpe_corpus(), trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in BPE_SPECIAL_TOKENS])
    tags = BPE_TAG_TOKENS + (THINK_TAG_TOKENS if thinking else [])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in tags])
    template = CHATML_THINKING_TEMPLATE if thinking else CHATML_TOOLS_TEMPLATE
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=template,
    )  # fmt: skip


def build_scratch_model(path: str, spec: ScratchModelConfig, max_model_len: int, seed: int) -> None:
    """Write a randomly initialised model of `spec.architecture` + its tokenizer (`spec.tokenizer`:
    char, or bpe with a ChatML template) to `path` (a HF model folder)."""
    import torch

    tokenizer = (
        build_char_tokenizer()
        if spec.tokenizer == "char"
        else build_bpe_tokenizer(spec.vocab_size, thinking=spec.chat_template == "chatml_thinking")
    )
    config_cls, model_cls = _architecture(spec.architecture)
    extra = {}
    if spec.architecture == "qwen3_moe":
        extra = dict(
            num_experts=spec.num_experts, num_experts_per_tok=spec.num_experts_per_tok,
            moe_intermediate_size=spec.intermediate_size, norm_topk_prob=True,
        )  # fmt: skip
    config = config_cls(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.hidden_size // spec.num_attention_heads,
        max_position_embeddings=max_model_len,
        tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        rms_norm_eps=1e-5,
        **extra,
    )
    saved_rng = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = model_cls(config)
    torch.random.set_rng_state(saved_rng)
    os.makedirs(path, exist_ok=True)
    tmp = path.rstrip("/") + ".tmp"
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    # Atomic publish: a crashed build never leaves a half-written model folder behind.
    if os.path.isdir(path) and not os.listdir(path):
        os.rmdir(path)
    os.replace(tmp, path)


def _architecture(name: str) -> tuple[type, type]:
    """transformers' (config class, causal-LM class) of a scratch `architecture`."""
    import transformers

    prefix = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3", "qwen3_moe": "Qwen3Moe"}[name]
    return getattr(transformers, f"{prefix}Config"), getattr(transformers, f"{prefix}ForCausalLM")


def ensure_model(path: str, spec: ScratchModelConfig, max_model_len: int, seed: int) -> bool:
    """Build the scratch model if `spec.enabled` and `path` has no config.json. Returns True if built."""
    if not spec.enabled or os.path.isfile(os.path.join(path, "config.json")):
        return False
    build_scratch_model(path, spec, max_model_len, seed)
    return True
