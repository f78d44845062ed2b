"""Trainer rank 0's weight sender in a namespace host, for test_multi_host.py: it syncs a model to
one rollout worker, then pauses between the buckets of the next sync while the test cuts the
worker's link, goes on, and reports the sync's error; once the link is back it syncs again with a
new sender (the worker rejoins a new group). One line per event on stdout; the test answers on stdin.

    python -m tests.integration.netns_sync_sender MODEL WORKER MASTER_ADDRESS TIMEOUT_S
"""

from __future__ import annotations

import os
import sys
import time

from rlcore.client import ClientOptions, RolloutClient
from rlcore.weights.sender import WeightSender
from rlcore.weights.wire import WeightSyncError, spec_of


def main(model: str, worker: str, master_address: str, timeout_s: float) -> None:
    from transformers import AutoModelForCausalLM

    weights = [
        (n, p.detach().clone()) for n, p in AutoModelForCausalLM.from_pretrained(model).named_parameters()
    ]
    specs = [spec_of(n, t.dtype, t.shape) for n, t in weights]

    def sender() -> WeightSender:
        client = RolloutClient(worker, ClientOptions(token=os.environ["RLCORE_TOKEN"], timeout=30))
        return WeightSender(
            [client], backend="gloo", timeout_s=timeout_s, bucket_bytes=1 << 14, master_address=master_address,
            owns_clients=True,
        )  # fmt: skip

    first = sender()
    first.send(specs, iter(weights), 1)
    print("synced 1", flush=True)
    group = first.group
    assert group is not None and len(weights) > 4
    real, sent, resumed = group.broadcast_async, [0], [0.0]

    def pause_after_bucket_2(buf):
        sent[0] += 1
        if sent[0] == 3:  # two buckets are through: the test cuts the link now
            print("paused", flush=True)
            sys.stdin.readline()
            resumed[0] = time.monotonic()
        return real(buf)

    group.broadcast_async = pause_after_bucket_2
    try:
        first.send(specs, iter(weights), 2)
        print("no error", flush=True)
    except WeightSyncError as e:
        print(f"error after {time.monotonic() - resumed[0]:.1f} s: {' '.join(str(e).split())}", flush=True)
    sys.stdin.readline()  # the link is back
    again = sender()
    again.send(specs, iter(weights), 3)
    print(f"synced {again.clients[0].get_info().policy_version}", flush=True)
    again.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]))
