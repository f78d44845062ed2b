"""An Experience crosses the wire (RunTasks, TrainExperiences) with its per-token loss mask, and a
malformed mask is INVALID_ARGUMENT naming the field."""

from __future__ import annotations

import pytest

from rlcore.core.rpc.convert import experience_from_proto, experience_to_proto
from rlcore.core.rpc.errors import InvalidArgument
from rlcore.core.types import Experience


def _exp(**kw) -> Experience:
    base = dict(prompt_token_ids=[1, 2], response_token_ids=[5, 6, 7, 8], logprobs=[-0.5, -0.25, 0.0, -0.125],
                reward=1.0, group_id="t0", policy_version=3, finish_reason="stop", response_text="ab",
                reward_components={"exact_match": 1.0})  # fmt: skip
    return Experience(**{**base, **kw})


def test_a_multi_turn_experience_round_trips_with_its_loss_mask() -> None:
    e = _exp(loss_mask=[1, 1, 0, 1])
    assert experience_from_proto(experience_to_proto(e)) == e
    single = _exp()
    assert experience_from_proto(experience_to_proto(single)).loss_mask == []  # every token trains


@pytest.mark.parametrize(
    ("mask", "message"),
    [
        ([1, 0, 1], "has 3 values for 4 response tokens"),
        ([1, 2, 0, 1], "must hold only 0 and 1; got [2]"),
        ([0, 0, 0, 0], "marks no token as the model's"),
    ],
)
def test_a_malformed_loss_mask_names_the_field(mask: list[int], message: str) -> None:
    msg = experience_to_proto(_exp())
    msg.loss_mask.extend(mask)
    with pytest.raises(InvalidArgument) as info:
        experience_from_proto(msg, "experiences[2]")
    assert info.value.field == "experiences[2].loss_mask" and message in str(info.value)


def test_an_episodes_samples_travel_with_its_id_and_into_the_buffer() -> None:
    from rlcore.buffer.records import from_record, to_record

    for eid in ("task7/3f2a", ""):  # "": the experience is a whole episode
        e = _exp(loss_mask=[1, 1, 0, 1], episode_id=eid)
        assert experience_from_proto(experience_to_proto(e)) == e and from_record(to_record(e), "test") == e


def test_the_sampling_temperature_travels_with_the_experience() -> None:
    for t in (0.0, 0.7, None):  # None: not recorded (the trainer uses the taskset's)
        assert experience_from_proto(experience_to_proto(_exp(temperature=t))).temperature == t
    msg = experience_to_proto(_exp(temperature=-0.5))
    with pytest.raises(InvalidArgument) as info:
        experience_from_proto(msg, "experiences[1]")
    assert info.value.field == "experiences[1].temperature" and "must be a finite number >= 0" in str(info.value)


def test_routing_records_travel_with_the_experience_and_into_the_buffer() -> None:
    from rlcore.buffer.records import from_record, to_record

    routed = bytes(range(5 * 3 * 2))  # 2 prompt + 4 response - 1 tokens, 3 MoE layers, top-2
    e = _exp(routed_experts=routed)
    assert experience_from_proto(experience_to_proto(e)) == e
    assert from_record(to_record(e), "test") == e
    assert from_record(to_record(_exp()), "test").routed_experts == b""
    msg = experience_to_proto(_exp(routed_experts=routed[:-1]))
    with pytest.raises(InvalidArgument) as info:
        experience_from_proto(msg, "experiences[0]")
    assert info.value.field == "experiences[0].routed_experts" and "for each of its 5 tokens" in str(info.value)


def test_a_continued_sequences_routing_joins_its_segments() -> None:
    from rlcore.core.types import Completion
    from rlcore.rollout.batching import joined_routing

    # 3 prompt tokens; 2 tokens before the interruption (records of 3 + 2 - 1 = 4 tokens, 1 byte each)
    before = Completion([1, 2, 3], [4, 5], [0.0, 0.0], "interrupted", routed_experts=b"abcd")
    # the continuation ran the prompt and both tokens again (prefill) and 3 more: 5 + 3 - 1 = 7 tokens
    after = Completion([1, 2, 3, 4, 5], [6, 7, 8], [0.0] * 3, "stop", routed_experts=b"ABCDEFG")
    assert joined_routing(before, after) == b"abcdEFG"  # token 5 first ran in the continuation's prefill
    unstarted = Completion([1, 2, 3], [], [], "interrupted")
    assert joined_routing(unstarted, after) == b"ABCDEFG"
    not_begun = Completion([1, 2, 3, 4, 5], [], [], "interrupted")  # interrupted again before it ran
    assert joined_routing(before, not_begun) == b"abcd"
