"""What the benchmarks say about a GPU: its dense bf16 peak by name, MFU, the report's header line."""

from __future__ import annotations

import pytest

from rlcore.benchmarks.common import machine_line, mfu, peak_flops


def test_peak_and_mfu_by_gpu_name() -> None:
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("NVIDIA A100-SXM4-80GB") is None  # not one word of the name: unknown, no MFU
    assert peak_flops("NVIDIA A100 80GB PCIe") == 312e12
    assert peak_flops(None) is None
    # 6 x 358M parameters x 26177 tokens/s over 989 TFLOP/s
    assert mfu(26177, 1.0, 358_026_368, "NVIDIA H100 80GB HBM3") == pytest.approx(0.0569, abs=1e-4)
    assert mfu(26177, 1.0, 358_026_368, None) is None


def test_header_names_the_gpu_or_the_cpu() -> None:
    machine = {"cpus": 16, "cpu": "Intel Xeon (x86_64)", "mem_total_gib": 125.9, "torch": "2.11.0+cu130"}
    assert machine_line({**machine, "gpu": None}).startswith("CPU (16 x Intel Xeon")
    assert machine_line({**machine, "gpu": "NVIDIA H100 80GB HBM3"}).startswith(
        "GPU NVIDIA H100 80GB HBM3 (torch 2.11.0+cu130"
    )

