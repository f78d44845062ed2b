"""An engine in every trainer rank (mode colocate with engine_num = the ranks, or an in-process vLLM
engine in a world of several ranks): the explorer's Rollout on rank 0 splits each batch across
the ranks through the world's command channel, the way RemoteRollout splits it across workers."""

from __future__ import annotations

from ..core.types import Experience, SamplingParams, Task, WorkflowSpec
from .commands import ProbeCall, RolloutCall
from .trainer_world import Commander


class WorldRollout:
    bounded = True  # each rank's share runs under its own watchdog (TrainerWorld.rollout)

    def __init__(self, command: Commander):
        self.command = command
        self._report: dict[str, float] = {}

    def run(
        self, tasks: list[Task], sampling: SamplingParams, spec: WorkflowSpec, timeout: float
    ) -> list[Experience]:
        exps, self._report, failed = self.command(RolloutCall(tasks, sampling, spec, timeout))
        if failed is not None:  # every rank has finished the command: raising here keeps them in step
            kind, _, message = failed.partition(":")
            raise (ValueError if kind == "ValueError" else RuntimeError)(message)
        return exps  # type: ignore[no-any-return]

    def report(self) -> dict[str, float]:
        return self._report

    def probe(self, prompt: list[int], max_tokens: int) -> list[tuple[str, list[int], list[float]]]:
        return self.command(ProbeCall(prompt, max_tokens))  # type: ignore[no-any-return]
