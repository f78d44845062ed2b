"""The RolloutEngine interface: what the explorer needs from an inference engine."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ...core.types import Completion, SamplingParams

if TYPE_CHECKING:
    import torch


class RolloutEngine(ABC):
    """Generates completions for token-id prompts and takes new weights from the trainer.

    Construction: `Engine(model_path, *, device, dtype, max_model_len, max_batch_size)`.
    """

    policy_version: int = 0
    """Version of the weights loaded now (the trainer step that produced them)."""

    @abstractmethod
    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingParams) -> list[list[Completion]]:
        """Return, for each prompt, `sampling.n` completions (in a deterministic order)."""

    @abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], policy_version: int) -> None:
        """Replace the weights with full tensors keyed by HF parameter name, in process."""

    def pause(self) -> None:
        """Stop accepting work (before a weight update). Default: nothing to do for in-process engines."""
        return None

    def resume(self) -> None:
        """Accept work again."""
        return None

    def close(self) -> None:
        """Release the engine's resources."""
        return None
