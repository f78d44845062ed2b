"""The strategy registry: lazy imports, and the one-line refusal of megatron where it cannot run."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from rlcore.backends import STRATEGIES, check_strategy_runs
from rlcore.cli.main import main


def test_every_strategy_is_registered_and_selecting_fsdp_never_imports_megatron() -> None:
    assert list(STRATEGIES) == ["fsdp", "fsdp2", "megatron"]
    code = (
        "import sys\n"
        "from rlcore.backends import STRATEGIES\n"
        "STRATEGIES.resolve('fsdp2'); STRATEGIES.resolve('fsdp')\n"
        "assert not [m for m in sys.modules if m.startswith('megatron')], 'megatron was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_megatron_without_cuda_is_refused_in_one_line(
    recipe: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(RuntimeError, match=r"^trainer.strategy=megatron needs CUDA: .* use --strategy fsdp2"):
        check_strategy_runs("megatron", "cpu")
    check_strategy_runs("fsdp2", "cpu")  # the others run anywhere

    # `rlcore launch --strategy megatron` stops before starting anything: exit 2, one line
    assert main(["launch", "--strategy", "megatron", recipe, "model.scratch.enabled=true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "megatron-core runs only on NVIDIA GPUs" in err[0], err


def test_each_strategy_carries_its_row_of_the_torch_free_capability_table() -> None:
    """What the config checks read (core/strategy_capabilities.py) is what each strategy class says
    of itself; the table names exactly the registered strategies."""
    from rlcore.core.strategy_capabilities import CAPABILITIES, strategies_with

    assert list(CAPABILITIES) == list(STRATEGIES)
    for name in STRATEGIES:
        assert STRATEGIES.resolve(name).capabilities is CAPABILITIES[name], name
    assert strategies_with("lora") == ["fsdp", "fsdp2", "megatron"] and strategies_with("context_parallel") == ["megatron"]
