"""FSDP1 (`FullyShardedDataParallel`, `use_orig_params=True`) training strategy."""
