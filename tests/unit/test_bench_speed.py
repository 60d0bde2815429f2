"""walkit.bench_cpu.speed_adjusted: a sustained run's intervals compared at equal machine speed.

The machine walkit is developed on changes speed from one second to the next, and a sustained
run's entries/s follows it. The adjusted figure must stay put when only the machine slowed,
also when an interval mixed fast and slow seconds, and fall when walkit did.
"""

from __future__ import annotations

import pytest

from walkit.bench import sustained
from walkit.bench_cpu import _mean_of, entries_per_probe, speed_adjusted

FAST, SLOW = 8.0, 16.0            # probe milliseconds; the entries a probe's time holds stay at 600
RATE = {FAST: 75_000, SLOW: 37_500}


def interval(start_s: float, entries_per_s: float, probe_ms: float | None) -> dict:
    return {"start_s": start_s, "span_s": 30.0, "entries": int(entries_per_s * 30), "entries_per_s": entries_per_s,
            "p50_ms": 10.0, "p99_ms": 20.0, "probe_ms": probe_ms}


def mixed(start_s: float, seconds: list[float]) -> dict:
    """mixed is an interval whose seconds ran at the speeds of their probes, one probe a second."""
    entries = sum(RATE[probe] for probe in seconds)
    return interval(start_s, entries / len(seconds), _mean_of(seconds))


def test_a_machine_that_slows_down_leaves_the_adjusted_throughput_where_it_was():
    intervals = [interval(0, 75_000, FAST), interval(30, 37_500, SLOW), interval(60, 75_000, FAST)]
    assert [entries_per_probe(part) for part in intervals] == pytest.approx([600, 600, 600])
    adjusted = speed_adjusted(intervals)
    assert adjusted["lowest"] == pytest.approx(1.0) and adjusted["highest"] == pytest.approx(1.0)
    assert adjusted["last_over_first"] == pytest.approx(1.0) and adjusted["median"] == pytest.approx(600)


def test_intervals_that_mix_fast_and_slow_seconds_adjust_alike():
    """A plain mean of the probes would make a half-fast, half-slow interval read 12 ms and
    750 entries per probe; its harmonic mean (the mean speed) reads 10.7 ms and 600."""
    intervals = [mixed(0, [FAST] * 30), mixed(30, [FAST, SLOW] * 15), mixed(60, [SLOW] * 10 + [FAST] * 20),
                 mixed(90, [SLOW] * 30)]
    assert intervals[1]["probe_ms"] == pytest.approx(2 / (1 / FAST + 1 / SLOW))
    assert speed_adjusted(intervals)["entries_per_probe"] == pytest.approx([600] * 4)


def test_a_walkit_that_slows_down_on_a_steady_machine_shows_at_equal_speed():
    intervals = [interval(0, 60_000, 10.0), interval(30, 60_000, 10.0), interval(60, 30_000, 10.0)]
    adjusted = speed_adjusted(intervals)
    assert adjusted["lowest"] == pytest.approx(0.5) and adjusted["highest"] == pytest.approx(1.0)
    assert adjusted["last_over_first"] == pytest.approx(0.5)


def test_intervals_without_a_probe_are_left_out_and_nothing_to_compare_with_gives_none():
    intervals = [interval(0, 60_000, None), interval(30, 50_000, 12.0), interval(60, 40_000, 15.0)]
    assert entries_per_probe(intervals[0]) is None
    assert speed_adjusted(intervals)["entries_per_probe"] == pytest.approx([600, 600])
    assert speed_adjusted([interval(0, 60_000, 10.0), interval(30, 60_000, None)]) is None
    assert speed_adjusted([]) is None
    assert speed_adjusted([interval(0, 0, 10.0), interval(30, 60_000, 10.0)]) is None      # no first to compare
    assert _mean_of([0.0, -1.0]) is None and _mean_of([]) is None                       # no probe ran


def test_a_whole_interval_without_completions_is_reported_and_lowers_the_adjusted_figure():
    """A stall as long as an interval is an interval of 0 entries/s, not a gap in the list."""
    import concurrent.futures
    import threading
    import time

    calls = [0]

    def submit():
        calls[0] += 1
        future = concurrent.futures.Future()
        if calls[0] == 50:                      # the stall: with one in flight, nothing else completes
            threading.Timer(0.95, future.set_result, args=(None,)).start()
        else:
            future.set_result(None)
        time.sleep(0.002)                       # an append's work, so 50 take about 0.1 s
        return future

    result = sustained(submit, duration=1.6, window=1, interval=0.3)
    counts = [part["entries"] for part in result["intervals"]]
    assert 0 in counts[1:-1], counts            # the stall spans at least one whole interval
    stalled = next(part for part in result["intervals"] if part["entries"] == 0)
    assert stalled["entries_per_s"] == 0
    for part in result["intervals"]:
        part["probe_ms"] = 10.0
    assert speed_adjusted(result["intervals"])["lowest"] == 0
