"""Child of test_megatron_dtype.py: builds the megatron strategy in bfloat16 under the CPU shim (which
changes torch process-wide, so not in pytest's process) and prints, as one JSON line, the dtypes of
the policy's and the reference's parameters, the announced weight specs and the weights it yields."""

from __future__ import annotations

import json
import sys

import torch.distributed as dist

from tests.megatron_cpu_shim import install


def main(model_path: str) -> None:
    install()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    from rlcore.backends.megatron.strategy import MegatronStrategy
    from rlcore.core.config.schema import OptimizerConfig, TrainerConfig

    strategy = MegatronStrategy(
        model_path, TrainerConfig(strategy="megatron"), OptimizerConfig(), device="cpu",
        dtype="bfloat16", total_steps=1, with_reference=True, seed=0,
    )  # fmt: skip
    assert strategy.reference is not None
    print(
        json.dumps(
            {
                "policy": sorted({str(p.dtype) for p in strategy.model.parameters()}),
                "reference": sorted({str(p.dtype) for p in strategy.reference.parameters()}),
                "specs": [[n, str(d), list(s)] for n, d, s in strategy.weight_specs()],
                "weights": [[n, str(t.dtype), list(t.shape)] for n, t in strategy.iter_full_weights()],
            }
        )
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
