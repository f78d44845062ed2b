"""A step pass: a model or data an algorithm's step runs beside the policy (PPO's critic, mix's
expert rows, a teacher...), with hooks at the points of the trainer's step. The trainer calls every
pass of the stage's plan (`Algorithm.passes`, resolved through STEP_PASSES or an import path) at each
point; a hook a pass does not need keeps its default, which does nothing.

    __init__(ctx)              build what the pass holds (a second model: ctx.build_model)
    score(mbs, temperature)    log-prob time: write per-position fields into this rank's micro-batches
    before_advantages(b, rows) the algorithm's ScoredBatch before its advantages (critic: values)
    after_advantages(b, rows)  after them (critic: the returns it trains on)
    extra_batches(step, ...)   rows trained in the same step, per mini-batch (mix: expert rows)
    wrap_loss(loss, rows)      the loss over the policy's and the extra rows' micro-batches
    update(mbs, norm)          its own optimizer step before the policy's (critic)
    holds_policy(step)         whether the policy waits this step (critic warm-up)
    folder / save / load       its state in a sub-folder of a checkpoint's model/ folder

Pure Python: a pass's module imports torch, this one does not.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from ..batch import Batch, Sequence
    from ..config.schema import RLCoreConfig
    from .aggregation import LossNorm
    from .scored import ScoredBatch


class StepRows(Protocol):
    """A step's rows as every rank sees them (runtime/scoring.py): all experiences' sequences, and
    the micro-batches this rank holds (rlcore's trainer: LocalRows, whole [B, L] rows, prompt then
    response; a Tinker client: WholeRows, one micro-batch of [N, T] response-aligned rows)."""

    def gather(self, per_micro_batch: list[torch.Tensor], width: int) -> torch.Tensor:
        """[N, width] response-aligned rows of one tensor per micro-batch (laid out as the
        micro-batches are), from every rank."""
        ...

    def place(self, values: torch.Tensor, key: str) -> None:
        """Write [N] or [N, T] response-aligned values into each micro-batch's `key` field."""
        ...

    def micro_batches(self) -> list[Batch]:
        """This rank's micro-batches, every mini-batch's, in order."""
        ...


@dataclass
class PassContext:
    """What the trainer lends a pass when it is built."""

    cfg: RLCoreConfig
    model_path: str
    device: str
    total_steps: int
    """Optimizer steps the stage's lr schedule spans."""
    tokenizer: Any
    rollouts_per_step: int
    """Experiences one explore step hands the trainer."""
    max_response_len: int
    build_model: Callable[..., Any]
    """build_model(path, optim_config, value_head=False) -> a TrainingStrategy of the stage's kind."""
    micro: Callable[[list[Sequence]], tuple[list[Batch], list[list[int]]]]
    """This rank's share of sequences as micro-batches (the same count on every rank), and the
    index of each of their rows."""


class StepPass:
    """The hooks, each doing nothing; a pass overrides the ones it needs."""

    name = "pass"
    folder: str | None = None
    """The sub-folder of a checkpoint's model/ folder that keeps the pass's state (None: stateless,
    or its state is derived from the step count, as mix's expert stream is)."""

    def __init__(self, ctx: PassContext):
        self.ctx = ctx

    def score(self, mbs: list[Batch], temperature: float) -> None:
        """`temperature`: the step's sampling temperature (rows with their own carry a field)."""

    def before_advantages(self, batch: ScoredBatch, rows: StepRows) -> None:
        pass

    def after_advantages(self, batch: ScoredBatch, rows: StepRows, metrics: dict[str, float]) -> None:
        pass

    def extra_batches(
        self, step: int, first_index: int, minis: int, metrics: dict[str, float]
    ) -> list[tuple[list[Batch], list[Sequence]]]:
        """Per mini-batch: this rank's micro-batches of rows trained beside the step's experiences,
        and those rows (indexed from `first_index` on); explore step `step` of the stage."""
        return [([], [])] * minis

    def wrap_loss(self, loss: Any, rows: list[Sequence], norm: Callable[[list[Sequence]], LossNorm]) -> Any:
        """The loss over a mini-batch's micro-batches and this pass's `rows` in it (`norm(rows)`: a
        LossNorm over some rows)."""
        return loss

    def update(self, mbs: list[Batch], norm: LossNorm) -> dict[str, float]:
        return {}

    def holds_policy(self, step: int) -> bool:
        return False

    def save(self, path: str) -> None:
        pass

    def load(self, path: str) -> None:
        pass


class WithPasses:
    """What a checkpoint's model/ folder holds: the policy's state, and each stateful pass's in its
    `folder` (the `save_checkpoint`/`load_checkpoint` half of TrainingStrategy)."""

    def __init__(self, policy: Any, passes: list[StepPass]):
        self.policy, self.passes = policy, [p for p in passes if p.folder is not None]

    def save_checkpoint(self, path: str) -> None:
        self.policy.save_checkpoint(path)
        for p in self.passes:
            p.save(os.path.join(path, str(p.folder)))

    def load_checkpoint(self, path: str) -> None:
        self.policy.load_checkpoint(path)
        for p in self.passes:
            folder = os.path.join(path, str(p.folder))
            if not os.path.isdir(folder):
                raise ValueError(
                    f"checkpoint {os.path.dirname(path)} holds no {p.name} (no {p.folder}/): it was written by a "
                    f"stage without one; resume with the algorithm_type that wrote it"
                )
            p.load(folder)


@contextmanager
def timed(timers: dict[str, float], key: str) -> Iterator[None]:
    """Add the seconds spent in the block to timers[key]."""
    start = time.perf_counter()
    try:
        yield
    finally:
        timers[key] = timers.get(key, 0.0) + time.perf_counter() - start
