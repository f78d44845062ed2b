"""Training strategies behind the TrainingStrategy interface (backends/base.py)."""

from ..core.registry import Registry

STRATEGIES = Registry("trainer.strategy", {"fsdp2": "rlcore.backends.fsdp2.strategy:FSDP2Strategy"})
