"""`rlcore bench decode` at its smallest size on CPU: the HF engine's eager loop timed and profiled,
the JSON, the markdown, the plot and the Chrome trace."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from tests.integration.launch_utils import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_bench_decode_profiles_the_engines_decode(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "decode.json"
    proc = subprocess.run(
        [sys.executable, "-m", "rlcore.cli", "bench", "decode", "--prompts", "2", "--n", "2", "--max-tokens", "6",
         "--calls", "1", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert not result["graphs"] and result["tokens_per_s"] > 0  # CPU: the eager loop
    assert 1 <= result["profiled"]["steps"] <= 6 and result["profiled"]["tokens"] >= 4
    assert result["profiled"]["device_busy_share"] is None and result["top_device"] == []
    assert any(r["name"] == "aten::mm" for r in result["top_host"])  # the model's matmuls were seen
    trace = json.loads(gzip.open(tmp_path / "decode.trace.json.gz").read())
    assert trace["traceEvents"]
    assert "tokens/s over 1 timed calls" in (tmp_path / "decode.md").read_text()
    assert (tmp_path / "decode.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
