"""A tqdm progress bar over optimizer steps with the numbers people watch in its postfix."""

from __future__ import annotations

from typing import IO

from tqdm import tqdm

from .console import format_value

# (label, keys tried in order): the postfix keeps the last value seen, so a step that logs only
# eval metrics does not blank the training numbers
POSTFIX_KEYS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward", ("rollout/reward_mean",)),
    ("loss", ("actor/loss", "sft/loss", "reward_model/loss")),
    ("pair_acc", ("reward_model/accuracy",)),
    ("kl", ("actor/kl_loss",)),
    ("tok/s", ("perf/tokens_per_s",)),
)


class StepProgress:
    """`update(step, metrics)` moves the bar to an absolute step; tqdm supplies the rate and ETA."""

    def __init__(self, total: int | None, desc: str, file: IO[str] | None = None):
        self.bar = tqdm(total=total, desc=desc, unit="step", file=file, dynamic_ncols=True)
        self._postfix: dict[str, str] = {}
        self._started = False

    def update(self, step: int, metrics: dict[str, float]) -> None:
        if not self._started:
            # Steps before the first report ran in an earlier process (a resume): start the bar
            # there so the rate and ETA count only the steps this process runs.
            self.bar.initial = self.bar.n = self.bar.last_print_n = max(step - 1, 0)
            self._started = True
        for label, keys in POSTFIX_KEYS:
            value = next((metrics[k] for k in keys if k in metrics), None)
            if value is not None:
                self._postfix[label] = format_value(value)
        self.bar.set_postfix(self._postfix, refresh=False)
        if self.bar.total is not None and step >= self.bar.total:
            self.bar.n = step  # close() draws the final state: drawn here too, a log shows it twice
        else:
            self.bar.update(step - self.bar.n)

    def close(self) -> None:
        self.bar.close()
