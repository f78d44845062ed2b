"""Tasksets: loading through HF datasets, and built-in generators of synthetic tasks."""

from ..registry import Registry

GENERATORS = Registry(
    "taskset.generator",
    {
        "arithmetic": "rlcore.core.data.synthetic:write_arithmetic_taskset",
        "arithmetic_chain": "rlcore.core.data.synthetic:write_arithmetic_chain_taskset",
        "tool_arithmetic": "rlcore.core.data.synthetic:write_tool_arithmetic_taskset",
        "verifiers": "rlcore.core.data.verifiers_tasks:write_verifiers_taskset",
    },
)
