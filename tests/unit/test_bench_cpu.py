"""The benchmark's CpuMeter counts the CPU of this process and of the bookie processes over a phase."""

import os
import subprocess
import sys
import time

import pytest

from walkit.bench import CpuMeter, _cpu_line, _median_cpu

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
