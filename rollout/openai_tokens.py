"""vLLM's `/tokenize` and `/detokenize` on the door: a prompt's token ids, or chat messages' as the
chat template renders them, and token ids back to text."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core.data.prompts import PromptFormat
from .openai_errors import invalid
from .openai_messages import template_messages

if TYPE_CHECKING:
    from .openai_door import OpenAIDoor


def tokenize(door: OpenAIDoor, body: dict[str, Any]) -> dict[str, Any]:
    """A prompt's tokens (add_special_tokens, default true), or chat messages' as the chat template
    renders them (add_generation_prompt, default true; add_special_tokens, default false, as the
    door's chat prompts; tools, chat_template_kwargs)."""
    door.check_body("tokenize", body)
    if (body.get("prompt") is None) == (body.get("messages") is None):
        raise invalid("prompt", "give a prompt or messages (one of them)")
    tokenizer = door.tokenizer
    if body.get("prompt") is not None:
        door.check_chars("prompt", len(body["prompt"]))
        special = body.get("add_special_tokens") is not False
        ids = list(tokenizer(body["prompt"], add_special_tokens=special)["input_ids"])
    else:
        messages = template_messages(body["messages"])
        door.check_chars("messages", sum(len(m["content"]) for m in messages))
        fmt = PromptFormat(door.servicer.max_model_len, True, None, None, body.get("tools") or None,
                           body.get("chat_template_kwargs") or None)  # fmt: skip
        try:
            text = fmt.render(tokenizer, messages, body.get("add_generation_prompt") is not False)
            ids = list(tokenizer(text, add_special_tokens=body.get("add_special_tokens") is True)["input_ids"])
        except Exception as e:  # no chat template, or one that refuses these messages
            raise door.template_error(e) from None
    return {"count": len(ids), "max_model_len": door.servicer.max_model_len, "tokens": ids}


def detokenize(door: OpenAIDoor, body: dict[str, Any]) -> dict[str, Any]:
    """Token ids back to text (special tokens kept, as vLLM's /detokenize)."""
    door.check_body("detokenize", body)
    vocab = door.servicer.vocab_size
    bad = [t for t in body["tokens"] if not t < vocab]
    if bad:
        raise invalid("tokens", f"token id {bad[0]} is outside [0, {vocab})")
    return {"prompt": str(door.tokenizer.decode(body["tokens"]))}
