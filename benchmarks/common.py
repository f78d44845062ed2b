"""What every benchmark reports the same way: spreads over repeats and the machine it ran on."""

from __future__ import annotations

import os
import platform
import statistics
from typing import Any


def spread(values: list[float]) -> dict[str, Any]:
    """The values and their min / median / max (benchmarks report ratios this way, never one time)."""
    return {"runs": values, "min": min(values), "median": statistics.median(values), "max": max(values)}


def machine_info() -> dict[str, Any]:
    """Python, torch, CPUs, memory and load at the start: these machines drift, say where it ran."""
    import torch

    with open("/proc/meminfo") as f:
        total_kb = int(f.readline().split()[1])
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "mem_total_gib": round(total_kb / 1024**2, 1),
        "loadavg_at_start": list(os.getloadavg()),
    }
