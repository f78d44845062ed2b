"""Episodes recorded by the OpenAI-compatible door (openai_door.py), token by token.

An agent tags its requests with an episode id; each request's prompt and completion are recorded
with the exact token ids the engine read and generated and their log-probs. A request that
continues the episode's last conversation (its messages, or its prompt text, start with everything
sent and answered before) is not re-rendered: its prompt is the previous tokens, the reply as
generated, then only the new turns' tokens, so no earlier token is re-tokenized. `finish` turns a
record into experiences: one per conversation, the model's tokens trained (loss mask 1), the
turns between them context (0), all with the episode's reward and, when there are several, its id
(Experience.episode_id: they count once in their group's statistics).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..core.types import Completion, Experience

MAX_EPISODES = 4096
"""Episodes held at once; the least recently used goes first (its record is lost)."""


@dataclass
class Conversation:
    """One growing token sequence of an episode."""

    prompt: list[int]
    response: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    history: Any = None
    """What the agent has seen so far (messages incl. the last reply, or prompt text + completion),
    to recognise a request that continues it."""
    last_reply: list[int] = field(default_factory=list)
    finish_reason: str = "stop"
    text: str = ""

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.response


@dataclass
class Episode:
    conversations: list[Conversation] = field(default_factory=list)
    policy_versions: list[int] = field(default_factory=list)
    touched: float = field(default_factory=time.monotonic)
    adapter: str = ""
    """The LoRA adapter its requests generated with (empty: the worker's own weights)."""


class EpisodeRecorder:
    """Thread-safe store of the door's episodes (HTTP requests run in a thread pool)."""

    def __init__(self, max_episodes: int = MAX_EPISODES):
        self.max_episodes = max_episodes
        self._episodes: OrderedDict[str, Episode] = OrderedDict()
        self._lock = threading.Lock()

    def continuation(self, episode_id: str, history: Any) -> Conversation | None:
        """The episode's last conversation if `history` (this request's messages, or prompt text)
        starts with everything it holds; None otherwise (a new conversation starts)."""
        with self._lock:
            episode = self._episodes.get(episode_id)
            if episode is None or not episode.conversations:
                return None
            last = episode.conversations[-1]
        seen = last.history
        if isinstance(seen, str) and isinstance(history, str):
            return last if history.startswith(seen) and len(history) > len(seen) else None
        if isinstance(seen, list) and isinstance(history, list):
            return last if len(history) > len(seen) and history[: len(seen)] == seen else None
        return None

    def record(
        self,
        episode_id: str,
        continued: Conversation | None,
        inserted: list[int],
        prompt: list[int],
        completion: Completion,
        history: Any,
        policy_version: int,
        adapter: str = "",
    ) -> None:
        """Add one request's turn: `inserted` (the new turns' tokens, context) and the completion
        to the continued conversation, or a new conversation from `prompt`."""
        with self._lock:
            episode = self._episodes.pop(episode_id, None) or Episode(adapter=adapter)
            self._episodes[episode_id] = episode  # most recent last
            episode.touched = time.monotonic()
            if continued is None or not episode.conversations or episode.conversations[-1] is not continued:
                conversation = Conversation(list(prompt))
                episode.conversations.append(conversation)
            else:
                conversation = continued
                conversation.response += inserted
                conversation.logprobs += [0.0] * len(inserted)
                conversation.mask += [0] * len(inserted)
            conversation.response += completion.token_ids
            conversation.logprobs += completion.logprobs
            conversation.mask += [1] * len(completion.token_ids)
            conversation.history, conversation.last_reply = history, list(completion.token_ids)
            conversation.finish_reason, conversation.text = completion.finish_reason, completion.text
            episode.policy_versions.append(policy_version)
            while len(self._episodes) > self.max_episodes:
                self._episodes.popitem(last=False)

    def adapter_of(self, episode_id: str) -> str | None:
        """The adapter an episode's requests generated with; None for an episode not recorded."""
        with self._lock:
            episode = self._episodes.get(episode_id)
        return None if episode is None else episode.adapter

    def finish(self, episode_id: str, reward: float, group_id: str) -> list[Experience] | None:
        """The episode's experiences (None for an unknown id); the record is dropped."""
        with self._lock:
            episode = self._episodes.pop(episode_id, None)
        if episode is None:
            return None
        version = min(episode.policy_versions) if episode.policy_versions else 0
        conversations = [c for c in episode.conversations if c.response]
        return [
            Experience(
                prompt_token_ids=c.prompt,
                response_token_ids=c.response,
                logprobs=c.logprobs,
                reward=reward,
                group_id=group_id or episode_id,
                policy_version=version,
                finish_reason=c.finish_reason,
                response_text=c.text,
                loss_mask=c.mask if 0 in c.mask else [],
                episode_id=episode_id if len(conversations) > 1 else "",  # its samples count once
                metrics={
                    "turns": float(
                        sum(1 for i, m in enumerate(c.mask) if m and (i == 0 or not c.mask[i - 1]))
                    )
                },
            )  # fmt: skip
            for c in conversations
        ]
