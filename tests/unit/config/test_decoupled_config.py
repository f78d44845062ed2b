"""A decoupled run's config (an RL algorithm in mode train, which reads the experience buffer, or in
mode explore, which writes it): what it resolves to, and what it refuses in one line."""

from __future__ import annotations

import pytest

from rlcore.buffer import buffer_location
from rlcore.core.config import ConfigError

from .minimal import resolve


def test_a_decoupled_run_divides_by_the_behaviour_policys_log_probs_unless_told(tmp_path) -> None:
    assert resolve(tmp_path, "mode=train").algorithm.do_old_log_prob_compute is False
    assert resolve(tmp_path, "mode=explore").algorithm.do_old_log_prob_compute is False
    assert resolve(tmp_path, "mode=both").algorithm.do_old_log_prob_compute is True
    told = resolve(tmp_path, "mode=train", "algorithm.do_old_log_prob_compute=true")
    assert told.algorithm.do_old_log_prob_compute is True


def test_dynamic_sampling_runs_in_every_mode_that_explores(tmp_path) -> None:
    """The explorer of a decoupled or asynchronous run drops (and refills) the groups that teach
    nothing before they reach the buffer, as a lock-step run does."""
    for mode in (["mode=explore"], ["synchronizer.asynchronous=true"], []):
        assert resolve(tmp_path, "algorithm.algorithm_type=dapo", *mode).algorithm.dynamic_sampling is True


def test_asynchronous_both_defaults_to_one_step_ahead_and_the_behaviour_policy(tmp_path) -> None:
    cfg = resolve(tmp_path, "synchronizer.asynchronous=true")
    assert cfg.synchronizer.max_staleness == 1 and cfg.algorithm.do_old_log_prob_compute is False
    assert (
        resolve(
            tmp_path, "synchronizer.asynchronous=true", "synchronizer.max_staleness=3"
        ).synchronizer.max_staleness
        == 3
    )


def test_the_buffer_lives_in_the_run_folder_both_launches_share(tmp_path) -> None:
    run = tmp_path / "rlcore" / "run"
    assert buffer_location(
        resolve(tmp_path, "mode=train", "buffer.trainer_input.experience_buffer.storage_type=file")
    ) == str(run / "buffer" / "experiences")
    sql = resolve(tmp_path, "buffer.trainer_input.experience_buffer.storage_type=sql")
    assert buffer_location(sql) == f"sqlite:///{run}/buffer/experiences.db"
    assert buffer_location(resolve(tmp_path)) == ""  # a queue: no mode-train launch serves it yet


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["mode=explore", "algorithm.algorithm_type=sft"], r"mode explore writes rollouts for an RL algorithm; algorithm\.algorithm_type sft"),
        (["mode=train", "trainer.remote=127.0.0.1:5000"], r"mode train with algorithm grpo is half of a decoupled run.*drop trainer\.remote"),
        (["mode=train", "buffer.trainer_input.experience_buffer.path=nowhere"], r"buffer\.trainer_input\.experience_buffer\.path must be host:port"),
        (["mode=train", "synchronizer.asynchronous=true"], r"synchronizer\.asynchronous runs mode both's explorer beside its trainer; got mode train"),
        (["synchronizer.asynchronous=true", "synchronizer.rollout_ahead=1"], r"synchronizer\.asynchronous does not go with synchronizer\.rollout_ahead"),
        (["synchronizer.asynchronous=true", "buffer.trainer_input.experience_buffer.storage_type=sql"], r"does not go with buffer\.trainer_input\.experience_buffer other than the in-memory queue"),
        (["buffer.trainer_input.experience_buffer.storage_type=redis"], r"buffer\.trainer_input\.experience_buffer\.storage_type must be one of queue, file, sql; got 'redis'"),
        (["explorer.over_rollout.ratio=0.25"], r"explorer\.over_rollout\.ratio is for an explorer that feeds the experience buffer.*got mode both \(lock-step\)"),
        (["mode=colocate", "explorer.dynamic_timeout.enable=true"], r"explorer\.dynamic_timeout is for an explorer .*got mode colocate"),
        (["mode=explore", "explorer.over_rollout.ratio=1.0"], r"explorer\.over_rollout\.ratio must be < 1"),
        (["mode=explore", "explorer.dynamic_timeout.ratio=0.5"], r"explorer\.dynamic_timeout\.ratio must be > 1"),
        (["buffer.trainer_input.experience_buffer.replay_buffer.enable=true"], r"replay_buffer replays groups of the experience buffer to a trainer that reads it.*got mode both with grpo"),
        (["mode=train", "buffer.trainer_input.experience_buffer.storage_type=file", "buffer.trainer_input.experience_buffer.replay_buffer.enable=true"], r"replay_buffer keeps its pool in memory: it needs .*storage_type queue; got file"),
        (["mode=train", "algorithm.sample_strategy=staleness_control"], r"staleness_control leaves out experiences older than synchronizer\.max_staleness: set it"),
        (["algorithm.sample_strategy=staleness_control", "synchronizer.max_staleness=1"], r"staleness_control is for a trainer on the experience buffer"),
        (["mode=train", "algorithm.sample_strategy=newest"], r"algorithm\.sample_strategy must be one of default, staleness_control; got 'newest'"),
        (["mode=train", "algorithm.dpo.pairs=buffer"], r"^algorithm\.dpo\.pairs: buffer is where DPO's pairs come from; algorithm\.algorithm_type grpo trains on no pairs"),
        (["algorithm.algorithm_type=dpo", "algorithm.dpo.pairs=buffer"], r"^algorithm\.dpo\.pairs: buffer pairs come from a decoupled run's explorer: .*; got mode both$"),
        (["mode=explore", "algorithm.algorithm_type=dpo", "algorithm.dpo.pairs=buffer", "algorithm.repeat_times=1"], r"^algorithm\.dpo\.pairs: .*algorithm\.repeat_times must be 2 or more; got 1$"),
        (["mode=train", "algorithm.algorithm_type=dpo", "algorithm.dpo.pairs=buffer", "trainer.remote=127.0.0.1:5000"], r"is half of a decoupled run.*drop trainer\.remote"),
        (["explorer.partial_rollout=true"], r"^explorer\.partial_rollout continues generation across weight updates .*got mode both \(lock-step\)$"),
    ],
)  # fmt: skip
def test_what_a_decoupled_run_refuses(tmp_path, overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve(tmp_path, *overrides)


def test_dpo_on_explored_pairs_is_a_decoupled_run_on_the_taskset_s_prompts(tmp_path) -> None:
    """algorithm.dpo.pairs buffer: the explore launch explores (its taskset needs prompts, not
    chosen/rejected columns), the train launch reads the buffer; both train pairs."""
    from rlcore.core.config.plan import plan_stage

    sets = ("algorithm.algorithm_type=dpo", "algorithm.dpo.pairs=buffer")
    explore, train = (plan_stage(resolve(tmp_path, f"mode={m}", *sets)) for m in ("explore", "train"))
    assert (explore.source, explore.trains_on) == ("explore", "pairs")
    assert (train.source, train.trains_on, train.publishes, train.passes.reference) == ("buffer", "pairs", True, True)


def test_the_long_tail_settings_go_with_an_explorer_that_feeds_the_buffer(tmp_path) -> None:
    keys = ("explorer.over_rollout.ratio=0.25", "explorer.over_rollout.wait_after_min=5", "explorer.dynamic_timeout.enable=true")
    explore = resolve(tmp_path, "mode=explore", *keys).explorer
    assert explore.over_rollout.ratio == 0.25 and explore.over_rollout.wait_after_min == 5.0
    assert explore.dynamic_timeout.enable and explore.dynamic_timeout.ratio == 3.0
    assert resolve(tmp_path, "synchronizer.asynchronous=true", *keys).explorer.over_rollout.ratio == 0.25
    assert resolve(tmp_path, "mode=train", *keys).explorer.over_rollout.ratio == 0.25  # shared, unused
    assert resolve(tmp_path, "mode=explore", "explorer.partial_rollout=true").explorer.partial_rollout
    assert resolve(tmp_path, "synchronizer.asynchronous=true", "explorer.partial_rollout=true").explorer.partial_rollout


def test_a_trainer_on_the_buffer_may_replay_and_control_staleness(tmp_path) -> None:
    cfg = resolve(
        tmp_path, "mode=train", "buffer.trainer_input.experience_buffer.replay_buffer.enable=true",
        "buffer.trainer_input.experience_buffer.replay_buffer.reuse_cooldown_time=30",
        "algorithm.sample_strategy=staleness_control", "synchronizer.max_staleness=2",
    )  # fmt: skip
    rb = cfg.buffer.trainer_input.experience_buffer.replay_buffer
    assert rb.enable and rb.priority_fn == "linear_decay" and rb.reuse_cooldown_time == 30.0
    assert cfg.algorithm.sample_strategy == "staleness_control"
    assert resolve(tmp_path, "synchronizer.asynchronous=true", "buffer.trainer_input.experience_buffer.replay_buffer.enable=true")
