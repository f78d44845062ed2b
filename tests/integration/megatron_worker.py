"""Test-only trainer-rank entry: install the CPU shim for megatron-core, then run rlcore's own rank
entry point (`rlcore.runtime.trainer_rank`) on a plan written by `rlcore launch`. This is how the CPU tests
run the real training loop on the megatron strategy: `rlcore launch` itself refuses megatron
without CUDA, as it must for users.

python -m torch.distributed.run --nproc-per-node N -m tests.integration.megatron_worker PLAN.json
"""

import sys

if __name__ == "__main__":
    from tests.megatron_cpu_shim import install

    install()
    from rlcore.runtime.trainer_rank import main
    from rlcore.runtime.trainer_world import exit_world

    exit_world(main(sys.argv[1]))
