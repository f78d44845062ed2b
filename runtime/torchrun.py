"""torch.distributed.run (torchrun), as rlcore starts it for a trainer world:
`python -m rlcore.runtime.torchrun ARGS` takes torchrun's ARGS.

One change: torch's elastic rendezvous names each event it records after the method that records
it through `inspect.stack()`, which finds the source file and lines of every frame on the stack
(`inspect.getmodule` walks all of `sys.modules` for each): 1.7 s of CPU per launch on a 2-core
machine, before any rank starts. The same name comes from the frame itself.
"""

from __future__ import annotations

import sys


def _method_name(depth: int = 2) -> str:
    """What torch's `get_method_name` returns (the function `depth` frames up from it), without
    reading any source."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:  # a shorter stack
        return "no_method_name"


def main() -> None:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous
    from torch.distributed.run import main as torchrun

    dynamic_rendezvous.get_method_name = _method_name
    torchrun()


if __name__ == "__main__":
    main()
