"""rlcore's benchmarks (`rlcore bench NAME ...`): each module has `main(argv) -> exit code` and also
runs as a script (`python benchmarks/NAME.py`). Results land in runs/bench/ unless --out says otherwise;
the committed ones in benchmarks/results/ change only when --out names them."""

BENCHMARKS = {
    "trl": "rlcore.benchmarks.vs_trl",
    "weight-sync": "rlcore.benchmarks.weight_sync",
    "grpc": "rlcore.benchmarks.grpc_overhead",
    "growth": "rlcore.benchmarks.cost_growth",
    "throughput": "rlcore.benchmarks.throughput",
    "decode": "rlcore.benchmarks.decode_profile",
    "rollout-ahead": "rlcore.benchmarks.rollout_ahead",
    "algorithms": "rlcore.benchmarks.algorithms",
    "async": "rlcore.benchmarks.async_explore",
    "tails": "rlcore.benchmarks.long_tails",
    "partial": "rlcore.benchmarks.partial_rollouts",
    "lora": "rlcore.benchmarks.lora_memory",
    "door": "rlcore.benchmarks.door_concurrency",
    "packing": "rlcore.benchmarks.packing",
    "ulysses": "rlcore.benchmarks.ulysses",
    "startup": "rlcore.benchmarks.startup",
    "shared": "rlcore.benchmarks.shared_machine",
    "routing": "rlcore.benchmarks.routing_replay",
    "curriculum": "rlcore.benchmarks.curriculum",
    "adapter-sync": "rlcore.benchmarks.adapter_sync",
    "resident-adapters": "rlcore.benchmarks.resident_adapters",
}
"""`rlcore bench` name -> module."""
