"""The trainer's per-step memory metrics follow what the process really holds."""

from rlcore.core.step_metrics import memory_metrics


def test_rss_metrics_see_memory_the_process_touches() -> None:
    before = memory_metrics("cpu")
    block = bytearray(256 * 2**20)  # 256 MiB, zero-filled: every page is touched
    during = memory_metrics("cpu")
    assert set(during) == {"perf/rss_gib", "perf/peak_rss_gib"}  # no CUDA figure on a CPU run
    assert during["perf/rss_gib"] - before["perf/rss_gib"] > 0.2
    assert during["perf/peak_rss_gib"] >= during["perf/rss_gib"]
    del block
    after = memory_metrics("cpu")
    assert after["perf/rss_gib"] < during["perf/rss_gib"] - 0.2  # freed: RSS falls back
    assert after["perf/peak_rss_gib"] >= during["perf/rss_gib"] - 1e-3  # the peak stays
