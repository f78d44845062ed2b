"""A one-line summary per step on the terminal, written so it does not break a tqdm progress bar."""

from __future__ import annotations

from typing import IO, Any

from tqdm import tqdm

from .base import Monitor

# (metric key, short label) in display order; the first of several keys present wins a label
SUMMARY_KEYS: tuple[tuple[str, str], ...] = (
    ("rollout/reward_mean", "reward"),
    ("actor/loss", "loss"),
    ("sft/loss", "loss"),
    ("reward_model/loss", "loss"),
    ("reward_model/accuracy", "pair_acc"),
    ("actor/kl_loss", "kl"),
    ("actor/grad_norm", "grad_norm"),
    ("perf/tokens_per_s", "tok/s"),
    ("perf/step_time_s", "step_s"),
)
_EVAL_SUFFIXES = ("/accuracy", "/reward_mean", "/pair_accuracy")


def format_value(value: float) -> str:
    """Four significant digits, thousands as k: short enough for one terminal line."""
    if abs(value) >= 10_000:
        return f"{value / 1000:.1f}k"
    return f"{value:.4g}"


def summary(metrics: dict[str, float]) -> list[tuple[str, str]]:
    """(label, formatted value) for the key metrics present, eval accuracy/reward last."""
    shown: dict[str, str] = {}
    for key, label in SUMMARY_KEYS:
        if key in metrics and label not in shown:
            shown[label] = format_value(metrics[key])
    for key, value in metrics.items():
        if key.startswith("eval/") and key.endswith(_EVAL_SUFFIXES):
            shown[key] = format_value(value)
    return list(shown.items())


class ConsoleMonitor(Monitor):
    def __init__(self, file: IO[str] | None = None):
        self.file = file  # None: tqdm.write's default, stdout

    @classmethod
    def from_run(
        cls, run_dir: str, project: str, name: str, config: dict[str, Any], resumed_at: int | None = None
    ) -> ConsoleMonitor:
        return cls()

    def log(self, metrics: dict[str, float], step: int) -> None:
        parts = [f"step {step}"] + [f"{label} {value}" for label, value in summary(metrics)]
        tqdm.write(" | ".join(parts), file=self.file)

    def close(self) -> None:
        pass
