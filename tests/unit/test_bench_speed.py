"""walkit.bench.speed_adjusted: a sustained run's intervals compared at equal machine speed.

The machine walkit is developed on changes speed from one second to the next, and a sustained
run's entries/s follows it. The adjusted figure must hold still when only the machine slowed,
and fall when walkit did.
"""

from __future__ import annotations

import pytest

from walkit.bench import speed_adjusted


def interval(start_s: float, entries_per_s: float, probe_ms: float | None) -> dict:
    return {"start_s": start_s, "span_s": 30.0, "entries": int(entries_per_s * 30), "entries_per_s": entries_per_s,
            "p50_ms": 10.0, "p99_ms": 20.0, "probe_ms": probe_ms}


def test_a_machine_that_slows_down_leaves_the_adjusted_throughput_where_it_was():
    intervals = [interval(0, 60_000, 10.0), interval(30, 40_000, 15.0), interval(60, 60_000, 10.0)]
    adjusted = speed_adjusted(intervals)
    assert [part["entries_per_probe"] for part in intervals] == pytest.approx([600, 600, 600])
    assert adjusted["lowest"] == pytest.approx(1.0) and adjusted["highest"] == pytest.approx(1.0)
    assert adjusted["last_over_first"] == pytest.approx(1.0) and adjusted["median"] == pytest.approx(600)


def test_a_walkit_that_slows_down_on_a_steady_machine_shows_at_equal_speed():
    intervals = [interval(0, 60_000, 10.0), interval(30, 60_000, 10.0), interval(60, 30_000, 10.0)]
    adjusted = speed_adjusted(intervals)
    assert adjusted["lowest"] == pytest.approx(0.5) and adjusted["highest"] == pytest.approx(1.0)
    assert adjusted["last_over_first"] == pytest.approx(0.5)


def test_intervals_without_a_probe_reading_are_left_out_and_one_reading_is_not_enough():
    intervals = [interval(0, 60_000, None), interval(30, 50_000, 12.0), interval(60, 40_000, 15.0)]
    adjusted = speed_adjusted(intervals)
    assert "entries_per_probe" not in intervals[0]
    assert adjusted["entries_per_probe"] == pytest.approx([600, 600])
    assert speed_adjusted([interval(0, 60_000, 10.0), interval(30, 60_000, None)]) is None
    assert speed_adjusted([]) is None

