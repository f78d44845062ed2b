"""launch/plan.json: the launch's wiring, which every trainer rank (and the loop in the launch
itself) reads. Node 0's launcher writes it once its rollout workers are ready (the ranks wait for it,
nodes.read_plan), and counts the trainer world's restarts in it (`restart`). Torch-free."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from ..core.config import Stage, from_yaml
from ..core.config.plan import StagePlan
from ..core.rpc.cli import write_atomic


@dataclass
class LaunchPlan:
    run_dir: str = ""
    device: str = "cpu"
    log_level: str = "INFO"
    """log.level."""
    threads_per_rank: int | None = None
    num_nodes: int = 1
    max_restarts: int = 0
    """trainer.max_restarts: how often the launcher starts the trainer world again."""
    collective_timeout_s: float | None = None
    run_address: str | None = None
    """The run's controller (RunService); None: none (a plan run by hand, as tests do)."""
    rollout_endpoints: list[str] = field(default_factory=list)
    workers_managed: bool = False
    """The launch restarts the rollout workers (they come back at new addresses the run lists)."""
    master_address: str = "127.0.0.1"
    """Where rank 0 offers the rollout workers' weight-sync group (one node)."""
    worker_version: int = -1
    """The published version the explore launch's workers started from (-1: none)."""
    run_plan: dict[str, Any] = field(default_factory=dict)
    """RunPlan.as_dict()."""
    stages: list[dict[str, Any]] = field(default_factory=list)
    """Each stage's index, name, config (YAML) and plan (StagePlan.as_dict())."""
    restart: int = 0
    """Which start of the trainer world this plan is for (0: the first)."""

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> LaunchPlan:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"launch plan: unknown field(s) {', '.join(unknown)} (written by another rlcore version?); "
                "launch the run again"
            )
        return cls(**values)

    @classmethod
    def read(cls, path: str) -> LaunchPlan:
        with open(path) as f:
            return cls.from_dict(json.load(f))

    def write(self, path: str) -> None:
        """Whole or not at all (a rank may read it at any moment)."""
        write_atomic(path, json.dumps(dataclasses.asdict(self), indent=2))

    def stage_list(self) -> list[Stage]:
        return [
            Stage(s["index"], s["name"], from_yaml(s["config"]), StagePlan.from_dict(s["plan"])) for s in self.stages
        ]
