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


def build_scratch_model(path: str, spec: ScratchModelConfig, max_model_len: int, seed: int) -> None:
    """Write a randomly initialised Llama model + char tokenizer to `path` (a HF model folder)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_char_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=max_model_len,
        tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        rms_norm_eps=1e-5,
    )
    saved_rng = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    torch.random.set_rng_state(saved_rng)
    os.makedirs(path, exist_ok=True)
    tmp = path.rstrip("/") + ".tmp"
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    # Atomic publish: a crashed build never leaves a half-written model folder behind.
    if os.path.isdir(path) and not os.listdir(path):
        os.rmdir(path)
    os.replace(tmp, path)


def ensure_model(path: str, spec: ScratchModelConfig, max_model_len: int, seed: int) -> bool:
    """Build the scratch model if `spec.enabled` and `path` has no config.json. Returns True if built."""
    if not spec.enabled or os.path.isfile(os.path.join(path, "config.json")):
        return False
    build_scratch_model(path, spec, max_model_len, seed)
    return True
