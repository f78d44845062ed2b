"""An engine in the trainer's own process (mode colocate, and evaluation in modes train and bench);
its weights arrive by an in-memory copy (transports/memory.py)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict

import torch

from ..core.config.dtypes import engine_dtype
from ..core.config.schema import RLCoreConfig
from ..core.step_metrics import rollout_report
from ..core.types import Experience, SamplingParams, Task, WorkflowSpec
from .engines import in_process
from .engines.spec import engine_spec
from .loopback_door import workflow_context
from .workflows import build_workflow
from .workflows.base import Workflow, sampled_at


class LocalRollout:
    """`reused`: an earlier stage of this launch built the engine (one that lives as long as the
    process, see rollout/engines/in_process.py), so it holds that stage's weights until the first
    sync."""

    bounded = False  # a generate in this process cannot be interrupted: the explorer's watchdog bounds it

    def __init__(self, cfg: RLCoreConfig, model_path: str, device: str):
        rm = cfg.explorer.rollout_model
        self.engine, self.reused = in_process.acquire(
            engine_spec(cfg, model_path, device, engine_dtype(cfg, device), seed=cfg.seed, in_process=True)
        )
        self._workflows: dict[str, Workflow] = {}
        self.sleeps = rm.enable_sleep_mode
        self.timing: dict[str, float] = {}  # the last batch's workflow timing

    def run(
        self, tasks: list[Task], sampling: SamplingParams, spec: WorkflowSpec, timeout: float
    ) -> list[Experience]:
        key = json.dumps(asdict(spec), sort_keys=True)
        if key not in self._workflows:
            context = workflow_context()
            self._workflows[key] = build_workflow(spec, self.engine, self.engine.tokenizer, context)
        self._awake()
        experiences = sampled_at(
            self._workflows[key].run(tasks, sampling, self.engine.policy_version), sampling
        )
        self.timing = dict(self._workflows[key].timing)
        if self.sleeps:  # the trainer gets the GPU until the next weight load
            self.engine.sleep()
        return experiences

    @property
    def policy_version(self) -> int:
        """The version of the weights its engine serves."""
        return int(self.engine.policy_version)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        self.engine.pause()
        if self.sleeps:  # the weights come back first, the KV cache once they are loaded
            self.engine.wake_up(["weights"])
        self.engine.load_weights(weights, version)
        if self.sleeps:
            self.engine.wake_up(["kv_cache"])
        self.engine.resume()

    def report(self) -> dict[str, float]:
        return rollout_report(1, [self.timing])

    def probe(self, prompt: list[int], max_tokens: int) -> list[tuple[str, list[int], list[float]]]:
        self._awake()
        (c,) = self.engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=max_tokens))[0]
        return [("in-process", c.token_ids, c.logprobs)]

    def _awake(self) -> None:
        if self.sleeps and self.engine.sleeping:
            self.engine.wake_up()

    def close(self) -> None:
        if self.sleeps and not self.engine.sleeping:  # the GPU goes to whatever runs next
            self.engine.sleep()
        in_process.release(self.engine)
