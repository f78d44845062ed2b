"""`rlcore bench startup`'s summary: per-repeat ratios of the two sides, and its table."""

from __future__ import annotations

from rlcore.benchmarks.startup import markdown, summarize


def test_the_ratio_is_taken_per_repeat_and_the_table_shows_it() -> None:
    runs = {
        "on": [{"first_step_s": 10.0, "total_s": 15.0}, {"first_step_s": 12.0, "total_s": 18.0}],
        "off": [{"first_step_s": 20.0, "total_s": 24.0}, {"first_step_s": 18.0, "total_s": 27.0}],
        "warm": [{"first_step_s": 5.0, "total_s": 8.0}, {"first_step_s": 6.0, "total_s": 9.0}],
    }
    s = summarize(runs)
    assert s["first_step_s_ratio_off_over_on"]["runs"] == [2.0, 1.5]
    assert s["total_s_ratio_off_over_on"]["runs"] == [1.6, 1.5]
    assert s["first_step_s"]["on"]["median"] == 11.0
    table = markdown({"summary": s, "repeats": 2, "machine": {"cpus": 2, "cpu": "x", "mem_total_gib": 1, "gpu": None}})
    assert s["first_step_s_ratio_off_over_warm"]["runs"] == [4.0, 3.0]
    assert (
        "| to the first step | 19.0 (18.0-20.0) | 11.0 (10.0-12.0) | 5.5 (5.0-6.0) | 1.75x (1.50-2.00) | 3.50x (3.00-4.00) |"
        in table
    ), table
