"""Prompt and SFT-example encoding, shared by rollouts and SFT so both see identical token ids."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


def model_chat_template(model: Any) -> str | None:
    """model.chat_template, or the text of model.chat_template_path (None: the tokenizer's own)."""
    if model.chat_template_path:
        with open(model.chat_template_path) as f:
            return f.read()
    return model.chat_template  # type: ignore[no-any-return]


RESERVED_TEMPLATE_KWARGS = ("messages", "tools", "add_generation_prompt", "tokenize", "chat_template",
                            "continue_final_message", "return_dict", "tokenizer_kwargs")  # fmt: skip
"""apply_chat_template's own arguments, which rlcore passes itself: chat template variables
(model.chat_template_kwargs, the door's chat_template_kwargs) cannot set them."""


def template_kwargs_problem(kwargs: Any) -> str | None:
    """Why `kwargs` cannot be a chat template's variables (None: they can)."""
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        return f"must be an object of variable name -> value; got {kwargs!r}"
    taken = [k for k in kwargs if k in RESERVED_TEMPLATE_KWARGS]
    if taken:
        return f"{', '.join(taken)} cannot be set here (rlcore passes it to the chat template itself)"
    return None


def model_prompt_format(model: Any, system_prompt: str | None, tools: list[dict[str, Any]] | None = None) -> PromptFormat:
    """How the run's model reads a taskset's prompts: model.max_prompt_tokens, apply_chat_template,
    its chat template and chat_template_kwargs, with the taskset's system prompt (and a workflow's tools)."""
    return PromptFormat(
        model.max_prompt_tokens, model.apply_chat_template, model_chat_template(model), system_prompt, tools,
        dict(model.chat_template_kwargs) or None,
    )  # fmt: skip


@dataclass
class PromptFormat:
    max_prompt_tokens: int
    apply_chat_template: bool = False
    chat_template: str | None = None
    system_prompt: str | None = None
    tools: list[dict[str, Any]] | None = None
    """OpenAI function schemas the chat template declares to the model (tool_call)."""
    template_kwargs: dict[str, Any] | None = None
    """More variables the chat template reads (e.g. `enable_thinking`: model.chat_template_kwargs,
    the door's `chat_template_kwargs`)."""

    def for_task(self, task: Any) -> PromptFormat:
        """This format for one task: its row's own system prompt and tools (format.system_prompt_key,
        format.tools_key) in place of the taskset's."""
        row = {k: task.metadata[k] for k in ("system_prompt", "tools") if task.metadata.get(k) is not None}
        return replace(self, **row) if row else self

    def encode_prompt(self, tokenizer: Any, prompt: str, messages: list[dict] | None = None) -> list[int]:
        """Token ids of the prompt, truncated from the left so the question's end survives."""
        return self.encode_whole_prompt(tokenizer, prompt, messages)[-self.max_prompt_tokens :]

    def encode_whole_prompt(
        self, tokenizer: Any, prompt: str, messages: list[dict] | None = None
    ) -> list[int]:
        """Token ids of the prompt before any truncation: `prompt` as one user turn, or the
        conversation `messages` (a messages taskset's row), up to the next assistant turn."""
        return list(tokenizer(self.prompt_text(tokenizer, prompt, messages), add_special_tokens=False)["input_ids"])

    def prompt_text(self, tokenizer: Any, prompt: str, messages: list[dict] | None = None) -> str:
        """The text encode_whole_prompt tokenizes (without special tokens: a chat template already
        writes any BOS): `prompt` itself, or the conversation rendered by the chat template."""
        if self.apply_chat_template or messages is not None:
            return self.render(tokenizer, messages or [{"role": "user", "content": prompt}], True)
        return prompt

    def render(self, tokenizer: Any, messages: list[dict], generation_prompt: bool) -> str:
        """`messages` through the chat template (the system prompt first unless they start with
        one; raw text has no system turn)."""
        if not self.apply_chat_template:
            raise ValueError("chat messages need model.apply_chat_template: true (the template renders them)")
        if self.system_prompt is not None and (not messages or messages[0].get("role") != "system"):
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        return str(
            tokenizer.apply_chat_template(
                messages, chat_template=self.chat_template, tools=self.tools,
                add_generation_prompt=generation_prompt, tokenize=False, **(self.template_kwargs or {}),
            )
        )  # fmt: skip

    def encode_sft_messages(
        self, tokenizer: Any, messages: list[dict]
    ) -> list[tuple[list[int], list[int], list[int]]]:
        """The samples (prompt ids, response ids, response loss mask) of a conversation for SFT. Each
        assistant turn's tokens, its content and the token that closes it, are trained (1); the
        template's text around them and every other turn are context (0). The prompt runs to the
        first assistant turn. Segments are tokenized one by one, as a rollout's are (the prompt, then
        what the model generates, then the turns appended after it). One sample, unless the template
        renders the turns before an assistant turn differently from what came before it (a thinking
        template drops the reasoning of the turns before a new user turn): that turn then starts a
        new sample whose prompt is the conversation as rendered now, as a rollout goes on
        (rollout/workflows/conversation.py), so every turn trains in the context it is generated in."""
        eos = tokenizer.eos_token or ""
        samples: list[list[tuple[str, int]]] = [[]]
        done = ""
        for k, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            before = self.render(tokenizer, messages[:k], True)
            after = self.render(tokenizer, messages[: k + 1], False)
            if not after.startswith(before):
                raise ValueError(
                    "the chat template does not render an assistant turn as the generation prompt followed by "
                    "the reply; SFT on messages needs one that does (model.chat_template or chat_template_path)"
                )
            if not before.startswith(done):  # the history renders anew: a new sample
                samples.append([])
                done = ""
            reply = after[len(before) :]
            cut = reply.find(eos) + len(eos) if eos and eos in reply else len(reply)
            samples[-1] += [(before[len(done) :], 0), (reply[:cut], 1), (reply[cut:], 0)]
            done = after
        encoded = [
            self._sft_sample(tokenizer, segments) for segments in samples if any(t and text for text, t in segments)
        ]
        if not encoded:
            raise ValueError("the conversation has no assistant turn to train on")
        return encoded

    @staticmethod
    def _sft_sample(tokenizer: Any, segments: list[tuple[str, int]]) -> tuple[list[int], list[int], list[int]]:
        """(prompt ids, response ids, mask) of one sample's (text, trained) segments."""
        ids: list[int] = []
        mask: list[int] = []
        for text, trained in segments:
            piece = list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []
            ids += piece
            mask += [trained] * len(piece)
        if 1 not in mask:
            raise ValueError("the conversation has no assistant turn to train on")
        first, end = mask.index(1), len(mask) - mask[::-1].index(1)  # no context after the last turn
        return ids[:first], ids[first:end], mask[first:end]

    def encode_sft_example(self, tokenizer: Any, prompt: str, response: str) -> tuple[list[int], list[int]]:
        """(prompt ids, response ids ending with EOS): the response is what the model should generate."""
        prompt_ids = self.encode_prompt(tokenizer, prompt)
        response_ids = tokenizer(response, add_special_tokens=False)["input_ids"]
        if tokenizer.eos_token_id is not None:
            response_ids = response_ids + [tokenizer.eos_token_id]
        return prompt_ids, response_ids
