"""launch/plan.json as LaunchPlan (runtime/launch_plan.py): written whole and read back field for
field, its stages rebuilt with their configs and plans, a field this version does not know refused
in one line."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rlcore.core.config import load_config, resolve_stages, to_yaml
from rlcore.runtime.launch_plan import LaunchPlan


def test_a_plan_reads_back_as_written_with_its_stages(tmp_path) -> None:
    (tmp_path / "t.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    (tmp_path / "m").mkdir()
    (tmp_path / "c.yaml").write_text(
        f"model: {{model_path: {tmp_path / 'm'}}}\ncheckpoint_root_dir: {tmp_path}\n"
        f"buffer: {{explorer_input: {{taskset: {{path: {tmp_path / 't.jsonl'}}}}}}}\n"
    )
    stage = resolve_stages(load_config(str(tmp_path / "c.yaml"), ["buffer.batch_size=3"]))[0]
    plan = LaunchPlan(
        run_dir=str(tmp_path / "run"), device="cpu", threads_per_rank=2, rollout_endpoints=["127.0.0.1:1"],
        workers_managed=True, run_address="127.0.0.1:2", worker_version=4,
        stages=[{"index": stage.index, "name": stage.name, "config": to_yaml(stage.config), "plan": stage.plan.as_dict()}],
    )  # fmt: skip
    path = str(tmp_path / "plan.json")
    plan.write(path)
    again = LaunchPlan.read(path)
    assert dataclasses.asdict(again) == json.loads(json.dumps(dataclasses.asdict(plan)))  # tuples come back as lists
    (rebuilt,) = again.stage_list()
    assert rebuilt.config.buffer.batch_size == 3 and rebuilt.plan == stage.plan
    plan.restart = 1  # the launcher counts a restart in the same file
    plan.write(path)
    assert LaunchPlan.read(path).restart == 1


def test_a_field_this_version_does_not_know_is_refused_in_one_line(tmp_path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"run_dir": "r", "rollout_workers": []}))
    with pytest.raises(ValueError, match=r"^launch plan: unknown field\(s\) rollout_workers \(written by another"):
        LaunchPlan.read(str(path))
