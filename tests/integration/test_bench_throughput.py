"""`rlcore bench throughput` end to end at its smallest size: each engine generates in its own
process, each strategy trains through a real `rlcore launch`, megatron is reported as not measured
where it cannot run; then the JSON, the markdown tables and the plot. (vLLM is left out here: its
start costs CI 20 s, and its rollout path runs in the weight-sync bench and the vLLM loop tests.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.integration.launch_utils import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def test_bench_throughput_measures_every_engine_and_strategy(tmp_path) -> None:
    pytest.importorskip("matplotlib", reason="the benchmark plots: pip install 'rlcore[bench]'")
    out = tmp_path / "throughput.json"
    proc = subprocess.run(
        [sys.executable, "-m", "rlcore.cli", "bench", "throughput", "--engines", "hf,hf-eager,hf-generate", "--prompts", "2", "--n", "2",
         "--max-tokens", "4", "--calls", "2", "--steps", "1", "--repeats", "1", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=840,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())

    rollout = result["rollout"]
    assert list(rollout) == ["hf", "hf-eager", "hf-generate"]  # hf-generate: model.generate
    # on CPU both HF loops are the eager one: the report's greedy check must find them equal
    assert result["greedy_agreement"] == {"rows": 2, "equal_rows": 2, "mean_equal_prefix": 1.0}
    for row in rollout.values():
        assert row["start_s"]["median"] > 0 and row["call_s"]["median"] > 0
        assert 4 <= row["tokens_per_call"]["median"] <= 2 * 2 * 4  # prompts x n x at most 4 tokens
        assert row["tokens_per_s"]["median"] == pytest.approx(
            row["tokens_per_call"]["median"] / row["call_s"]["median"], rel=0.01
        )
    generate_over_hf = rollout["hf-generate"]["ratio_to_reference"]["median"]
    assert generate_over_hf == pytest.approx(
        rollout["hf-generate"]["tokens_per_s"]["median"] / rollout["hf"]["tokens_per_s"]["median"]
    )

    train = result["train"]
    measured = set(train) | set(result["not_measured"])
    assert measured == {"fsdp", "fsdp2", "megatron"} and not set(train) & set(result["not_measured"])
    assert {"fsdp", "fsdp2"} <= set(train)
    for row in train.values():
        assert row["tokens_per_s"]["median"] > 0
        assert row["forward_backward_s"]["median"] + row["optimizer_s"]["median"] <= row["train_s"]["median"]
        assert 2 * 2 * 2 <= row["tokens_per_step"]["median"] <= 2 * 2 * (16 + 4)
    assert "ratio_to_reference" in train["fsdp"] and "ratio_to_reference" not in train["fsdp2"]

    table = (tmp_path / "throughput.md").read_text()
    assert "**rollout**" in table and "**train**" in table and "2 of 2 rows equal token for token" in table
    for reason in result["not_measured"].values():
        assert reason in table
    assert (tmp_path / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
