"""mode colocate with engine_num = the trainer's ranks: an HF engine inside each of 2 gloo ranks.

Each rank must generate its own contiguous share of a batch, and every sync must load both
engines. Engines seed each prompt by itself, so the shares sample exactly what one engine given
the whole batch samples: step 1's rollout, reproduced outside the run as one batch by one engine
and as its two shares, gives the mean reward and response length the run logged; the same batch
under another seed does not.
"""

from __future__ import annotations

import os

import pytest

from .launch_utils import launch, read_metrics, tiny_grpo_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def _stats(exps) -> tuple[float, float]:
    return (
        sum(e.reward for e in exps) / len(exps),
        sum(len(e.response_token_ids) for e in exps) / len(exps),
    )


def test_an_engine_in_every_rank_generates_its_share_with_its_seed_and_each_passes_the_probe(
    tmp_path,
) -> None:
    from rlcore.core.config import load_config, resolve_stages
    from rlcore.core.data.taskset import TaskStream, load_tasks
    from rlcore.rollout.explorer import Explorer
    from rlcore.rollout.local import LocalRollout

    root = str(tmp_path)
    cfg = tiny_grpo_config(
        root,
        **{
            "mode": "colocate",
            "cluster.ranks_per_node": 2,
            "explorer.rollout_model.engine_num": 2,
            "synchronizer.probe": True,
            "buffer.batch_size": 6,
        },
    )
    path = os.path.join(root, "cfg.yaml")
    launch(cfg, path)
    steps = [m for m in read_metrics(os.path.join(root, "it", "run")) if "actor/loss" in m]
    assert len(steps) == 2
    assert [m["rollout/engines"] for m in steps] == [2.0, 2.0]
    assert all(m["sync/probe_engines"] == 2.0 for m in steps), steps
    assert all(m["sync/probe_logprob_diff"] < 1e-3 for m in steps), [
        m["sync/probe_logprob_diff"] for m in steps
    ]

    # Step 1 again, outside the run, from the untrained weights the run started with.
    (stage,) = resolve_stages(load_config(path))
    run_cfg = stage.config
    ts = run_cfg.buffer.explorer_input.taskset
    tasks = TaskStream(load_tasks(ts, "taskset"), run_cfg.buffer.batch_size, run_cfg.seed, ts.shuffle).batch(
        0
    )
    engine = LocalRollout(run_cfg, run_cfg.model.model_path, "cpu")
    explorer = Explorer(run_cfg, engine)
    base_seed = run_cfg.seed * 100_003
    shares = [explorer.explore(tasks[:3], seed=base_seed), explorer.explore(tasks[3:], seed=base_seed)]
    one_batch = explorer.explore(tasks, seed=base_seed)
    other_seed = explorer.explore(tasks, seed=base_seed + 1)
    engine.close()

    logged = (steps[0]["rollout/reward_mean"], steps[0]["rollout/response_len_mean"])
    assert [e.response_token_ids for e in shares[0] + shares[1]] == [e.response_token_ids for e in one_batch]
    # the run logs float32 means: equal to float32 precision
    assert _stats(one_batch) == pytest.approx(logged, abs=1e-6)
    assert _stats(other_seed) != pytest.approx(logged, abs=1e-6)
