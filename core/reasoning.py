"""A response's reasoning block and its answer: what reward functions score when a taskset names the
model's reasoning tags (FormatConfig.reasoning_tags, e.g. ["<think>", "</think>"] for Qwen3).

The answer is the text after the first closing tag, leading whitespace dropped; the reasoning is
the text between the opening tag (when the response has one: Qwen3's template may open the block in
the prompt) and the closing tag. A response that opened its block and never closed it (cut off by
max_tokens while thinking) has no answer: its rewards score the empty string. A response with no tag
at all is all answer.
"""

from __future__ import annotations

from collections.abc import Sequence


def reasoning_tags_problem(tags: Sequence[str]) -> str | None:
    """Why `tags` are not a usable [open, close] pair (None: they are, or they are empty)."""
    if not tags:
        return None
    if len(tags) != 2 or not all(isinstance(t, str) and t.strip() for t in tags) or tags[0] == tags[1]:
        return f"give [open, close], two different non-empty tags such as ['<think>', '</think>']; got {list(tags)}"
    return None


def split_reasoning(response: str, tags: Sequence[str]) -> tuple[str, str]:
    """(answer, reasoning) of `response` under [open, close] `tags`; (response, "") without tags."""
    if not tags:
        return response, ""
    open_tag, close_tag = tags
    head, closed, tail = response.partition(close_tag)
    if not closed:
        return ("", response.partition(open_tag)[2].strip()) if open_tag in response else (response, "")
    reasoning = head.partition(open_tag)[2] if open_tag in head else head
    return tail.lstrip(), reasoning.strip()
