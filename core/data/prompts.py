"""Prompt and SFT-example encoding, shared by rollouts and SFT so both see identical token ids."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class PromptFormat:
    max_prompt_tokens: int
    apply_chat_template: bool = False
    chat_template: str | None = None
    system_prompt: str | None = None

    def encode_prompt(self, tokenizer: Any, prompt: str) -> list[int]:
        """Token ids of the prompt, truncated from the left so the question's end survives."""
        return self.encode_whole_prompt(tokenizer, prompt)[-self.max_prompt_tokens :]

    def encode_whole_prompt(self, tokenizer: Any, prompt: str) -> list[int]:
        """Token ids of the prompt before any truncation."""
        text = prompt
        if self.apply_chat_template:
            messages = [{"role": "user", "content": prompt}]
            if self.system_prompt is not None:  # only with the template: raw text has no system turn
                messages.insert(0, {"role": "system", "content": self.system_prompt})
            # Render to text, then tokenize without special tokens: the template already writes any BOS.
            text = tokenizer.apply_chat_template(
                messages, chat_template=self.chat_template, add_generation_prompt=True, tokenize=False
            )
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode_sft_example(self, tokenizer: Any, prompt: str, response: str) -> tuple[list[int], list[int]]:
        """(prompt ids, response ids ending with EOS): the response is what the model should generate."""
        prompt_ids = self.encode_prompt(tokenizer, prompt)
        response_ids = tokenizer(response, add_special_tokens=False)["input_ids"]
        if tokenizer.eos_token_id is not None:
            response_ids = response_ids + [tokenizer.eos_token_id]
        return prompt_ids, response_ids
