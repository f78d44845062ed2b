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


def test_the_peak_never_reads_under_an_rss_reported_before(monkeypatch) -> None:
    """ru_maxrss lags statm by up to a few hundred KiB: a step's RSS must not exceed a later peak."""
    import resource

    block = bytearray(256 * 2**20)
    reported = memory_metrics("cpu")["perf/rss_gib"]
    del block  # RSS falls back by 256 MiB

    def lagging(_who: int):  # the kernel's peak counter reading 1 MiB under what statm said
        return type("Usage", (), {"ru_maxrss": int((reported * 2**30 - 2**20) / 1024)})()

    monkeypatch.setattr(resource, "getrusage", lagging)
    assert memory_metrics("cpu")["perf/peak_rss_gib"] >= reported
