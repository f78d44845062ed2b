"""synchronizer.rollout_ahead: the rollout worker generates the next step's experiences while the
trainer trains on this step's, so step k+1 trains on experiences of policy version k-1.

The check is exact, not statistical. Until the first sync after a step lands, the ahead run's
rollouts come from the initial weights, exactly as in a run that never syncs after its start. So
the first two steps must match that run sample for sample and loss for loss. The third step must
not match: its rollout had step 1's weights.
"""

from __future__ import annotations

import os

import pytest

from tests.integration.launch_utils import launch, read_metrics, tiny_grpo_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def _steps(root: str, **overrides) -> list[dict]:
    cfg = tiny_grpo_config(root, **{"buffer.total_steps": 3, **overrides})
    launch(cfg, os.path.join(root + ".yaml"))
    return [m for m in read_metrics(os.path.join(root, "it", "run")) if "perf/step_time_s" in m]


def test_rollouts_generated_ahead_are_one_version_old_and_otherwise_identical(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RLCORE_TOKEN", "rollout-ahead-test-token")
    ahead = _steps(
        str(tmp_path / "ahead"), **{"synchronizer.rollout_ahead": 1, "synchronizer.max_staleness": 1}
    )
    frozen = _steps(str(tmp_path / "frozen"), **{"synchronizer.sync_offset": 100})

    assert [m["rollout/generated_ahead"] for m in ahead] == [0.0, 1.0, 1.0]
    assert [m["rollout/staleness_mean"] for m in ahead] == [0.0, 1.0, 1.0]
    assert [m["rollout/stale_dropped"] for m in ahead] == [0.0, 0.0, 0.0]
    assert (
        all("perf/rollout_ahead_wait_s" in m for m in ahead[:2])
        and "perf/rollout_ahead_wait_s" not in ahead[2]
    )
    assert all(m["perf/sync_gb_per_s"] > 0 for m in ahead)  # a real sync after every step
    for key in ("rollout/reward_mean", "rollout/response_len_mean"):
        assert [m[key] for m in ahead[:2]] == [m[key] for m in frozen[:2]], key
    for a, f in zip(ahead[:2], frozen[:2], strict=True):
        assert abs(a["actor/pg_loss"] - f["actor/pg_loss"]) < 1e-6
    assert (ahead[2]["rollout/response_len_mean"], ahead[2]["actor/pg_loss"]) != (
        frozen[2]["rollout/response_len_mean"],
        frozen[2]["actor/pg_loss"],
    ), "step 3's rollout should have come from step 1's weights, not the initial ones"
