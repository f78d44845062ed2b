"""The `cluster` section: devices, ranks and the trainer nodes."""

from __future__ import annotations

from dataclasses import dataclass

from .fields import bounded, choice


@dataclass
class ClusterConfig:
    device: str = choice("auto", ("auto", "cpu", "cuda"))
    """auto: cuda when available, else cpu."""
    num_nodes: int = bounded(1, ge=1)
    """Trainer nodes."""
    ranks_per_node: int = bounded(1, ge=1)
    """Trainer processes per node (one per GPU on CUDA)."""
    rdzv_endpoint: str = ""
    """host:port of the torchrun rendezvous for multi-node runs (on node 0, reachable from every
    node); empty: single node, standalone."""
    node_rank: int = bounded(0, ge=0)
    """This host's place among the trainer nodes: 0 is the controller's host (it serves the control
    plane, prepares the run and hosts the rendezvous); the others join it with the same
    `rlcore launch` command and this set to 1, 2, ..."""
    node_address: str = ""
    """The address the other hosts reach this one at (torchrun's --local-addr; the weight-sync
    group's master when trainer rank 0 runs here); empty: the host's name."""
    rdzv_timeout_s: int = bounded(600, gt=0)
    """How long trainer nodes wait for each other at the rendezvous (at the start and after a restart)."""
    collective_timeout_s: float = bounded(1800.0, gt=0.0)
    """Timeout of the trainer world's collectives: a trainer node whose link or host is lost fails
    the world's next collective after this long."""
    threads_per_rank: int = bounded(0, ge=0)
    """CPU threads per trainer process; 0: cores divided by ranks."""
    malloc_keep_freed: bool = True
    """glibc malloc in the processes a launch starts keeps freed memory for reuse (no trimming; only
    blocks over 32 MiB are mmapped and returned) instead of handing it back to the OS and faulting it
    in again on the next step, which costs CPU training up to a quarter of its forward/backward.
    Off: glibc's defaults. MALLOC_* or GLIBC_TUNABLES already in the environment win either way."""
    fork_server: str = choice("auto", ("auto", "on", "off"))
    """The processes a launch starts (rollout workers, torchrun, trainer ranks) are forked from one
    that imported torch and transformers once (runtime/fork_server.py) instead of importing them
    each: seconds less per launch. auto: on when the run's device is the CPU (on CUDA it is not
    measured yet). A warm server named by RLCORE_FORK_SERVER (`rlcore warm`) is used either way."""

    @property
    def ranks(self) -> int:
        """Trainer processes in all: num_nodes x ranks_per_node."""
        return self.num_nodes * self.ranks_per_node
