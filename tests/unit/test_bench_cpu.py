"""The benchmark's CpuMeter counts the CPU of this process and of the bookie processes over a phase;
the sustained run's IntervalMonitor does per interval, beside a speed probe of the machine."""

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Future

import pytest

from walkit.bench import _cpu_line, _median_cpu, sustained
from walkit.bench_cpu import CpuMeter, IntervalMonitor, SpeedProbe

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="CpuMeter reads /proc (Linux)")

_BURN = """
import sys, time
print("ready", flush=True)
sys.stdin.readline()
began = time.process_time()
while time.process_time() - began < 0.3:
    pass
print("burnt", flush=True)
sys.stdin.readline()
"""


def _burn(seconds: float) -> None:
    began = time.process_time()
    while time.process_time() - began < seconds:
        pass


@pytest.mark.processes
def test_the_meter_counts_this_process_and_each_bookie_process_apart():
    burner = subprocess.Popen([sys.executable, "-c", _BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    idle = subprocess.Popen([sys.executable, "-c", _BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert burner.stdout.readline() == "ready\n" and idle.stdout.readline() == "ready\n"
        meter = CpuMeter([burner.pid, idle.pid])
        burner.stdin.write("go\n")
        burner.stdin.flush()
        _burn(0.2)
        assert burner.stdout.readline() == "burnt\n"
        cpu = meter.result(entries=1000)
    finally:
        for process in (burner, idle):
            process.kill()
            process.wait()
    assert cpu is not None
    # 0.2 s of this process and 0.3 s of the first "bookie" over 1,000 entries, counted in 10 ms ticks.
    assert 150 <= cpu["client_us_per_entry"] <= 400
    assert 250 <= cpu["bookies_us_per_entry"] <= 450
    assert cpu["bookie_cores"][0] > 0.2 and cpu["bookie_cores"][1] < 0.05
    assert 0.0 <= cpu["machine_idle"] <= 1.0


@pytest.mark.processes
def test_a_bookie_that_went_away_makes_the_phase_unmeasured_not_wrong():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    meter = CpuMeter([gone.pid])
    gone.wait()
    assert meter.result(entries=10) is None
    assert _cpu_line(None) == []


def test_medians_are_per_figure_and_per_bookie_and_absent_if_any_run_was_not_measured():
    runs = [{"cpu": {"client_us_per_entry": c, "bookies_us_per_entry": 2 * c, "client_cores": c / 10,
                     "bookie_cores": [c / 10, c / 20], "machine_idle": 0.3}} for c in (1.0, 5.0, 3.0)]
    median = _median_cpu(runs)
    assert median["client_us_per_entry"] == 3.0 and median["bookies_us_per_entry"] == 6.0
    assert median["bookie_cores"] == [0.3, 0.15]
    assert "client 3.0 us (0.30 cores), bookies 6.0 us together (0.30, 0.15 cores); machine 30% idle" in _cpu_line(median)[0]
    assert _median_cpu(runs + [{"cpu": None}]) is None


@pytest.mark.processes
def test_the_speed_probe_times_its_work_in_cpu_milliseconds_and_its_child_ends_with_it():
    probe = SpeedProbe()
    readings = probe.measure_many(3)
    child = probe._process
    probe.close()
    assert len(readings) == 3 and all(0 < ms < 1000 for ms in readings)
    assert child.poll() is not None                   # closed: the child is gone, not left behind
    assert probe.measure() is None and probe.measure_many(2) == []


@pytest.mark.processes
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_a_probe_whose_child_died_answers_none_and_closes(how):
    probe = SpeedProbe()
    assert probe.measure() is not None
    child = probe._process
    child.send_signal(how)
    child.wait()
    assert probe.measure() is None                    # no BrokenPipeError out of a benchmark's thread
    assert probe._process is None and child.stdout.closed and child.stdin.closed


@pytest.mark.processes
def test_the_speed_probe_counts_cpu_not_waiting_for_a_core():
    """Sharing its one core with a busy loop, the probe reports about half the time its work took, not all of it."""
    cpu = os.sched_getaffinity(0)
    core = {min(cpu)}
    with SpeedProbe() as probe:
        os.sched_setaffinity(probe._process.pid, core)
        probe.measure()                               # its first run is behind it
        burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            os.sched_setaffinity(burner.pid, core)
            began = time.perf_counter()
            cpu_ms = sum(probe.measure_many(5))
            wall_ms = (time.perf_counter() - began) * 1000
        finally:
            burner.kill()
            burner.wait()
    assert 0 < cpu_ms < 0.75 * wall_ms, (cpu_ms, wall_ms)    # about 0.5: the core was shared with the loop


@pytest.mark.processes
def test_each_interval_of_a_sustained_run_says_what_the_cpu_did():
    idle = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert idle.stdout.readline() == "ready\n"     # started: its start-up CPU is behind it

        def submit():
            _burn(0.0002)                              # each "append" costs this process 0.2 ms of CPU
            future = Future()
            future.set_result(None)
            return future
        monitor = IntervalMonitor([idle.pid], probe_every=0.25)
        result = sustained(submit, duration=3.0, window=10, interval=1.0, monitor=monitor)
    finally:
        idle.kill()
        idle.wait()
        idle.stdout.close()
    intervals = result["intervals"]
    assert len(intervals) == 3
    for part in intervals:
        assert part["entries"] > 0
        # 0.2 ms of CPU per entry here, read in 10 ms ticks; the idle "bookie" used none.
        assert 150 <= part["cpu"]["client_us_per_entry"] <= 400, part
        assert part["cpu"]["bookie_cores"][0] < 0.05 and part["cpu"]["bookies_us_per_entry"] < 50
        assert part["probe_ms"] is not None and part["probe_ms"] > 0
    assert result["probe_ms"] > 0
    assert len(monitor._probes) >= 6                   # about one per 0.25 s of the 3 s run


@pytest.mark.slow                      # the monitor's probe runs in a process of its own
def test_a_monitor_watches_one_run_only():
    monitor = IntervalMonitor([], probe_every=10)
    monitor.start(time.perf_counter(), 1.0)
    try:
        with pytest.raises(RuntimeError, match="one run"):
            monitor.start(time.perf_counter(), 1.0)
    finally:
        monitor.stop()


def test_an_interval_whose_boundary_reading_came_late_gets_no_cpu_rather_than_anothers():
    monitor = IntervalMonitor([], probe_every=10)
    monitor._began, monitor._interval = 100.0, 1.0
    reading = lambda at, cpu: (at, [cpu], (0, 100))      # noqa: E731 - (time, [client CPU s], machine ticks)
    monitor._readings = [reading(100.0, 0.0), reading(101.0, 0.1), reading(102.4, 0.3), reading(103.0, 0.4)]
    intervals = [{"start_s": float(k), "span_s": 1.0, "entries": 100, "entries_per_s": 100.0} for k in range(3)]
    monitor.annotate(intervals)
    assert intervals[0]["cpu"]["client_us_per_entry"] == pytest.approx(1000)   # 0.1 s over 100 entries
    assert intervals[1]["cpu"] is None and intervals[2]["cpu"] is None      # the reading at 102 s came at 102.4
