"""EpisodeRecorder: how the door's requests become experiences (continuations, new conversations,
eviction), without an engine."""

from __future__ import annotations

from rlcore.core.types import Completion
from rlcore.rollout.episodes import EpisodeRecorder


def test_continuations_grow_one_conversation_and_others_start_new_ones() -> None:
    rec = EpisodeRecorder()
    user = [{"role": "user", "content": "q"}]
    assert rec.continuation("e", user) is None  # nothing recorded yet
    rec.record("e", None, [], [1, 2], Completion([1, 2], [3, 4], [-0.1, -0.2], "stop", "a"), user + [{"role": "assistant", "content": "a"}], 3)
    history = user + [{"role": "assistant", "content": "a"}, {"role": "user", "content": "more"}]
    continued = rec.continuation("e", history)
    assert continued is not None and continued.tokens == [1, 2, 3, 4] and continued.last_reply == [3, 4]
    rec.record("e", continued, [9, 9], continued.tokens + [9, 9], Completion(continued.tokens + [9, 9], [5], [-0.5], "length", "b"), history + [{"role": "assistant", "content": "b"}], 4)
    # the agent rewrote its history: not a continuation, a second conversation
    rewritten = [{"role": "user", "content": "other"}]
    assert rec.continuation("e", rewritten) is None
    rec.record("e", None, [], [7], Completion([7], [8], [-0.8], "stop", "c"), rewritten + [{"role": "assistant", "content": "c"}], 5)
    first, second = rec.finish("e", reward=2.0, group_id="")
    assert (first.prompt_token_ids, first.response_token_ids, first.loss_mask) == ([1, 2], [3, 4, 9, 9, 5], [1, 1, 0, 0, 1])
    assert first.logprobs == [-0.1, -0.2, 0.0, 0.0, -0.5] and first.finish_reason == "length"
    assert first.metrics == {"turns": 2.0} and first.group_id == "e" and first.policy_version == 3
    assert (second.response_token_ids, second.loss_mask, second.reward) == ([8], [], 2.0)  # all the model's
    assert rec.finish("e", 0.0, "") is None  # finished: gone


def test_text_prompts_continue_by_prefix_and_old_episodes_are_evicted() -> None:
    rec = EpisodeRecorder(max_episodes=2)
    rec.record("a", None, [], [1], Completion([1], [2], [-1.0], "stop", "2"), "1+1=2", 0)
    assert rec.continuation("a", "1+1=2 and 2+2=") is not None
    assert rec.continuation("a", "1+1=3") is None and rec.continuation("a", "1+1=2") is None  # not longer
    rec.record("b", None, [], [1], Completion([1], [2], [-1.0], "stop", ""), "x", 0)
    rec.record("c", None, [], [1], Completion([1], [2], [-1.0], "stop", ""), "y", 0)
    assert rec.finish("a", 0.0, "") is None and rec.finish("b", 0.0, "g") is not None  # a was the oldest
