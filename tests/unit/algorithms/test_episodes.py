"""Episodes that gave several samples (Experience.episode_id) count once: in the advantages of
every response-level algorithm, in the step's rollout metrics, in the explorer's n per task and in
the trainer's planned mini-batches."""

from __future__ import annotations

import pytest
import torch

from rlcore.core.algorithms import ADVANTAGE_FNS, ALGORITHMS, with_preset
from rlcore.core.algorithms.episodes import episode_rows, per_episode
from rlcore.core.algorithms.scored import ScoredBatch
from rlcore.core.config.schema import AlgorithmConfig
from rlcore.core.step_metrics import rollout_metrics
from rlcore.core.types import Experience, by_episode

# group a: episode e1 (reward 1) split in 3 samples, e2 (0) whole, e3 (1) whole; group b: e4 (0.5)
# split in 2, e5 (0) whole
SPLIT = [("a", "e1", 1.0), ("a", "e1", 1.0), ("a", "e1", 1.0), ("a", "", 0.0), ("a", "", 1.0),
         ("b", "e4", 0.5), ("b", "e4", 0.5), ("b", "", 0.0)]  # fmt: skip
LAST = [2, 3, 4, 6, 7]  # the last sample of each episode
T = 6


def batch(rows: list[tuple[str, str, float]], cfg: AlgorithmConfig) -> ScoredBatch:
    torch.manual_seed(0)
    n = len(rows)
    return ScoredBatch(
        torch.tensor([r for _, _, r in rows]), [g for g, _, _ in rows], response_mask=torch.ones(n, T),
        values=torch.randn(n, T), ref_logprobs=torch.randn(n, T), cfg=cfg,
        episode_ids=[e for _, e, _ in rows],
    )  # fmt: skip


def test_episode_rows_find_each_episodes_last_row_and_index_within_its_group() -> None:
    assert episode_rows([e for _, e, _ in SPLIT], [g for g, _, _ in SPLIT]) == (LAST, [0, 0, 0, 1, 2, 3, 3, 4])
    # an agent reused an episode name in another task: two episodes
    assert episode_rows(["x", "x", "x"], ["a", "a", "b"]) == ([1, 2], [0, 0, 1])


@pytest.mark.parametrize("name", sorted(ADVANTAGE_FNS))
def test_a_split_episode_gets_the_advantage_it_would_get_whole(name: str) -> None:
    """Response-level advantages of a split batch are those of one row per episode, each sample
    given its episode's; per-token ones (gae, reinforce_plus_plus) stay per sample."""
    algo = next((a for a, spec in ALGORITHMS.items() if spec.advantage_fn == name), "grpo")
    cfg = with_preset(AlgorithmConfig(algorithm_type=algo, advantage_fn=name))
    fn = ADVANTAGE_FNS.resolve(name)
    split = batch(SPLIT, cfg)
    whole = batch([SPLIT[i] for i in LAST], cfg)
    whole.values, whole.ref_logprobs = split.values[LAST], split.ref_logprobs[LAST]
    got, alone = per_episode(fn, split), fn(whole)
    if alone.dim() == 1:
        assert torch.equal(got, alone[torch.tensor([0, 0, 0, 1, 2, 3, 3, 4])])
    else:
        assert torch.equal(got, fn(split))  # one value per token of each sample
    unsplit = batch(SPLIT, cfg)
    unsplit.episode_ids = None
    assert torch.equal(per_episode(fn, unsplit), fn(unsplit))


def test_grpo_counts_a_split_episode_once_in_its_groups_mean_and_std() -> None:
    cfg = with_preset(AlgorithmConfig(algorithm_type="grpo"))
    adv = per_episode(ADVANTAGE_FNS.resolve("grpo"), batch(SPLIT, cfg))
    # group a is (1, 0, 1): mean 2/3, std 0.577; counted per sample it would be (1, 1, 1, 0, 1)
    assert adv[:3].tolist() == pytest.approx([(1 - 2 / 3) / (3**-0.5 * 1)] * 3, rel=1e-5)
    assert adv[3].item() == pytest.approx(-(2 / 3) / 3**-0.5, rel=1e-5)


def test_an_episodes_kl_penalties_add_up_in_its_reward() -> None:
    """use_kl_in_reward: each sample's reward is its score less its KL penalty; the episode's row
    takes its last sample's score less the penalties of all its samples."""
    from rlcore.core.algorithms.episodes import episodes_of

    cfg = with_preset(AlgorithmConfig(algorithm_type="grpo"))
    split = batch(SPLIT, cfg)
    split.scores = split.rewards.clone()
    split.rewards = split.scores - torch.tensor([0.1, 0.2, 0.3, 0.0, 0.05, 0.4, 0.1, 0.0])
    last, index = episode_rows(split.episode_ids, split.group_ids)
    episodes = episodes_of(split, last, index)
    assert episodes.rewards.tolist() == pytest.approx([1.0 - 0.6, 0.0, 1.0 - 0.05, 0.5 - 0.5, 0.0])
    assert episodes.scores.tolist() == [1.0, 0.0, 1.0, 0.5, 0.0]


def exp(group: str, episode: str, reward: float, tokens: int, finish: str = "stop") -> Experience:
    return Experience([1], [2] * tokens, [0.0] * tokens, reward, group, episode_id=episode, finish_reason=finish,
                      metrics={"turns": 3.0})  # fmt: skip


def test_rollout_metrics_count_an_episode_once_and_its_tokens_all() -> None:
    exps = [exp("a", "e1", 1.0, 2), exp("a", "e1", 1.0, 3, "length"), exp("a", "", 0.0, 5)]
    assert [len(e) for e in by_episode(exps)] == [2, 1]
    m = rollout_metrics(exps)
    assert m["rollout/reward_mean"] == 0.5 and m["rollout/response_len_mean"] == 5.0
    assert m["rollout/truncated_frac"] == 0.5 and m["rollout/samples_per_episode_mean"] == 1.5
    assert m["rollout/turns_mean"] == 3.0
    whole = rollout_metrics([exp("a", "", 1.0, 2), exp("a", "", 0.0, 4)])
    assert "rollout/samples_per_episode_mean" not in whole and whole["rollout/response_len_mean"] == 3.0


@pytest.mark.parametrize("train_batch, rows, sizes", [
    (None, 64, [64]), (None, 70, [70]), (None, 50, [50]),  # one update per step, whatever the samples
    (16, 64, [16, 16, 16, 16]), (16, 70, [16, 16, 16, 22]), (16, 40, [16, 16, 8]),  # short: stale ones dropped
])  # fmt: skip
def test_the_extra_samples_of_split_episodes_join_the_steps_last_mini_batch(
    train_batch: int | None, rows: int, sizes: list[int]
) -> None:
    from rlcore.core.config import load_config, resolve_stages
    from rlcore.runtime.step_sizes import mini_batches

    sets = ["stages.1.buffer.batch_size=8"]
    sets += [] if train_batch is None else [f"buffer.train_batch_size={train_batch}"]
    cfg = resolve_stages(load_config("configs/quickstart.yaml", sets))[1].config  # 64 rollouts a step
    minis = mini_batches(rows, cfg)
    assert [len(r) for r in minis] == sizes and minis[0].start == 0 and minis[-1].stop == rows
    assert all(a.stop == b.start for a, b in zip(minis, minis[1:], strict=False))
    # with the episodes' first rows (3 samples each): the same when no more rows than planned, else
    # equal shares cut where an episode starts
    starts = list(range(0, rows, 3))
    shares = [len(r) for r in mini_batches(rows, cfg, starts)]
    if rows <= 64:
        assert shares == sizes
    else:
        assert sum(shares) == rows and len(shares) == len(sizes) and max(shares) - min(shares) <= 3, shares
        assert all(r.start % 3 == 0 for r in mini_batches(rows, cfg, starts))
