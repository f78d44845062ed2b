"""Training strategies behind the TrainingStrategy interface (backends/base.py)."""

from ..core.registry import Registry, import_path

STRATEGIES = Registry(
    "trainer.strategy",
    {
        "fsdp": "rlcore.backends.fsdp.strategy:FSDP1Strategy",
        "fsdp2": "rlcore.backends.fsdp2.strategy:FSDP2Strategy",
        "megatron": "rlcore.backends.megatron.strategy:MegatronStrategy",
    },
)

STRATEGY_REQUIREMENTS = {"megatron": "rlcore.backends.megatron:check_available"}
"""Strategies that cannot run everywhere: name -> a light check(device) that raises RuntimeError
with a one-line reason and the fix (it must not import the strategy's heavy dependencies)."""


def check_strategy_runs(name: str, device: str, without_torch: bool = False) -> None:
    """Fail before any rank starts where strategy `name` cannot run on `device` (`without_torch`:
    the check `config validate` makes, which imports no torch)."""
    if name in STRATEGY_REQUIREMENTS:
        import_path(STRATEGY_REQUIREMENTS[name], what="trainer.strategy")(device, without_torch=without_torch)
