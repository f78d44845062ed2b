"""Token ids of the turns a workflow puts between the model's replies (an environment's
observation, a tool's output), appended to a conversation exactly as the model will read them.

Without a chat template an observation's tokens are its text's. With one, they are what the
template renders for the new message after the model's reply: the rest of the assistant turn the
model did not generate (ChatML's newline after <|im_end|>; the whole closing tag when a reply was
cut by max_tokens) and the new turn, up to the next generation prompt. The conversation grows by
appending only, so the model's own tokens stay exactly as it generated them; where the template
renders the history differently once a turn follows (a thinking template after a new user turn),
`after_reply` raises HistoryRerendered and the workflow goes on as a new sample (conversation.py).
"""

from __future__ import annotations

from typing import Any

PROBE_USER, PROBE_REPLY = "\x00probe-user\x00", "\x00probe-reply\x00"


class HistoryRerendered(ValueError):
    """The template renders the conversation so far differently once a new turn follows (a thinking
    template drops the reasoning of assistant turns before the last user turn): the new turn cannot be
    appended to the tokens the model saw. The workflow then goes on as a new sample of the episode,
    as the door starts a new conversation of its episode."""


class TurnFormat:
    """Renders appended turns for one tokenizer and (optional) chat template."""

    def __init__(
        self, tokenizer: Any, chat: bool, chat_template: str | None, system_prompt: str | None,
        tools: list[dict[str, Any]] | None = None, template_kwargs: dict[str, Any] | None = None,
    ):  # fmt: skip
        """`template_kwargs`: more variables the template reads (e.g. enable_thinking)."""
        self.tokenizer = tokenizer
        self.template_kwargs = template_kwargs or {}
        self.chat = chat
        self.chat_template = chat_template
        self.tools = tools
        self.system = (
            [] if system_prompt is None or not chat else [{"role": "system", "content": system_prompt}]
        )
        if chat:
            prompt = self._render([{"role": "user", "content": PROBE_USER}], True)
            self._base = self._render(
                [{"role": "user", "content": PROBE_USER}, {"role": "assistant", "content": PROBE_REPLY}],
                False,
            )
            if not self._base.startswith(prompt) or PROBE_REPLY not in self._base[len(prompt) :]:
                raise ValueError(
                    "the chat template does not render a conversation by appending turns (the assistant "
                    "turn is not the generation prompt followed by the reply); multi-turn workflows need one that does"
                )
            self._reply_tail = self._base[self._base.index(PROBE_REPLY) + len(PROBE_REPLY) :]

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        return str(
            self.tokenizer.apply_chat_template(
                self.system + messages, chat_template=self.chat_template, tools=self.tools,
                add_generation_prompt=generation_prompt, tokenize=False, **self.template_kwargs,
            )
        )  # fmt: skip

    def _extends(self, history: list[dict[str, Any]], messages: list[dict[str, Any]]) -> bool:
        """Whether `history` followed by `messages` renders as `history`'s rendering plus more."""
        return self._render([*history, *messages], True).startswith(self._render(history, False))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def after_reply(
        self, reply_ids: list[int], messages: list[dict[str, Any]], history: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """Tokens to append after the model's reply `reply_ids` so that `messages` (the new turns:
        role and content) follow it, ending where the model answers next. `history`: the
        conversation so far as messages, its last the reply's text; the template must render it
        followed by `messages` as its own rendering plus more (HistoryRerendered otherwise)."""
        if not self.chat:
            return self.encode("".join(str(m["content"]) for m in messages))
        full = self._render(
            [
                {"role": "user", "content": PROBE_USER},
                {"role": "assistant", "content": PROBE_REPLY},
                *messages,
            ],
            True,
        )
        if not full.startswith(self._base) or (history is not None and not self._extends(history, messages)):
            raise HistoryRerendered(
                "the chat template does not render a conversation by appending turns (adding a message changes "
                "what came before); multi-turn workflows need one that does"
            )
        tail = self._reply_tail
        ended = reply_ids and reply_ids[-1] == self.tokenizer.eos_token_id
        eos_text = self.tokenizer.eos_token or ""
        if ended and eos_text and tail.startswith(eos_text):
            tail = tail[len(eos_text) :]  # the model generated the closing token itself
        return self.encode(tail + full[len(self._base) :])
