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

    def _messages(self, prompt: str) -> list[dict[str, str]]:
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return messages + [{"role": "user", "content": prompt}]

    def encode_prompt(self, tokenizer: Any, prompt: str) -> list[int]:
        """Token ids of the prompt, left-truncated to max_prompt_tokens."""
        if self.apply_chat_template:
            ids = tokenizer.apply_chat_template(
                self._messages(prompt),
                chat_template=self.chat_template,
                add_generation_prompt=True,
                tokenize=True,
            )
            ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
        else:
            ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        return ids[-self.max_prompt_tokens :]

    def encode_sft_example(self, tokenizer: Any, prompt: str, response: str) -> tuple[list[int], list[int]]:
        """(prompt ids, response ids ending with EOS): the response is what the model should generate."""
        prompt_ids = self.encode_prompt(tokenizer, prompt)
        response_ids = tokenizer(response, add_special_tokens=False)["input_ids"]
        if tokenizer.eos_token_id is not None:
            response_ids = response_ids + [tokenizer.eos_token_id]
        return prompt_ids, response_ids
