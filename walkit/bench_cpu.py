"""walkit.bench_cpu says where a benchmark's CPU went, and how fast the machine was meanwhile.

`CpuMeter` measures one phase: CPU per entry of this process (the client and the harness) and
of the bookie processes, each process's share of a core, and how idle the machine was (Linux:
/proc). `IntervalMonitor` does the same for every interval of a sustained run, beside a
`SpeedProbe`: the CPU milliseconds a fixed piece of Python takes, which tells a slower machine
from a slower walkit. On the 2-core VM walkit is developed on, the probe swings between about
8.5 and 16 ms from one second to the next with nothing else running, and a sustained run's
entries/s follow it: its slow intervals take more CPU per entry at the same share of each core.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time

_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
#: A probe (about 10 ms, more when the interpreter is busy) starts no closer than this to a boundary
#: (or a quarter of the interval, if shorter).
_PROBE_CLEARANCE_S = 0.05


def _cpu_seconds(pid: int) -> float | None:
    """_cpu_seconds is the user + system CPU time of process `pid` (all its threads), or None if it cannot be read.

    It reads /proc/PID/stat itself (fields 14 and 15, in clock ticks): one small read, fast
    enough for a thread that samples while the harness keeps the interpreter busy. This process's
    own time comes from the kernel's precise clock instead (time.process_time, as /proc reads it
    but in nanoseconds), so a short phase does not read as no CPU at all.
    """
    if pid == os.getpid() and os.path.exists(f"/proc/{pid}/stat"):
        return time.process_time()
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()     # after the command name, which may hold spaces
        return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S
    except (OSError, IndexError, ValueError):
        return None


def _machine_times() -> tuple[int, int] | None:
    """_machine_times is (idle, total) CPU ticks of the whole machine since boot, or None without /proc."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(t) for t in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return ticks[3] + ticks[4], sum(ticks[:8])        # idle + iowait; user..steal (guest time is inside user)


def _reading(pids: list[int]) -> tuple:
    """_reading is (time, CPU seconds of each of `pids`, machine ticks): what `cpu_between` compares.

    The time is taken after the reads, which are quick; a thread kept from the interpreter
    between the two would make them disagree by that long.
    """
    cpu, machine = [_cpu_seconds(pid) for pid in pids], _machine_times()
    return time.perf_counter(), cpu, machine


def _mean_of(values: list[float]) -> float | None:
    """_mean_of is the harmonic mean of probe readings (`values`, each above 0), or None if there are none.

    The machine switches between a fast and a slow speed, and throughput adds up the speed
    (1 / probe) of each stretch of time, so the readings are averaged as speeds: a stretch of
    8 ms probes and one of 16 ms give 10.7 ms, the probe time of their mean speed, not 12.
    """
    values = [value for value in values if value > 0]
    return statistics.harmonic_mean(values) if values else None


def cpu_between(before: tuple, after: tuple, entries: int) -> dict | None:
    """cpu_between is the CPU used between two `_reading`s of (client, *bookies), per entry and in cores.

    None where /proc is missing, a process went away, or no time or entry passed.
    """
    (began, cpu_before, machine_before), (ended, cpu_after, machine_after) = before, after
    elapsed = ended - began
    if (None in cpu_before or None in cpu_after or machine_before is None or machine_after is None
            or elapsed <= 0 or entries <= 0):
        return None
    used = [b - a for a, b in zip(cpu_before, cpu_after)]
    total = machine_after[1] - machine_before[1]
    return {"client_us_per_entry": used[0] / entries * 1e6, "bookies_us_per_entry": sum(used[1:]) / entries * 1e6,
            "client_cores": used[0] / elapsed, "bookie_cores": [u / elapsed for u in used[1:]],
            "machine_idle": (machine_after[0] - machine_before[0]) / total if total > 0 else 0.0}


class CpuMeter:
    """CpuMeter measures the CPU a phase used: this process's (client and harness) and the bookies'.

    Made at the start of a phase; `result(entries)` at its end returns microseconds of CPU per
    entry and cores used (client, then each bookie), and the machine's idle share, or None where
    /proc is missing or a process went away. The kernel counts CPU in ticks (10 ms here), so a
    phase shorter than a second or so reads coarsely.
    """

    def __init__(self, bookie_pids: list[int]) -> None:
        self._pids = [os.getpid(), *bookie_pids]
        self._start = _reading(self._pids)

    def result(self, entries: int) -> dict | None:
        """result is the phase's CPU: per entry (us) and in cores, for the client and the bookies."""
        return cpu_between(self._start, _reading(self._pids), entries)


#: The speed probe's child: on each line of stdin, time a fixed piece of Python work in CPU milliseconds.
_PROBE = """
import sys, time
for _ in sys.stdin:
    began = time.process_time()
    total = 0
    for i in range(100_000):
        total += i * i
    print(f"{(time.process_time() - began) * 1000:.4f}", flush=True)
"""


class SpeedProbe:
    """SpeedProbe times a fixed piece of Python work in a child process, in milliseconds of CPU.

    CPU time leaves out any wait for a core, so the probe tells how fast the machine runs the
    same instructions right now, not how busy it is. On the 2-core VM walkit is developed on,
    with nothing else running, it reads about 8.5 ms or 16 ms seconds apart: the host gives
    the VM slower and faster cores over time. Sharing a core with other busy processes (time
    slices, caches) raises it too, so compare probes taken under the same load, such as the
    intervals of one sustained run. One measure costs its CPU milliseconds; `measure()` returns
    None once the child cannot answer (it failed to start or died), and the probe is closed.
    """

    def __init__(self) -> None:
        try:
            self._process = subprocess.Popen([sys.executable, "-c", _PROBE], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, text=True)
        except OSError:
            self._process = None

    def __enter__(self) -> "SpeedProbe":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def measure(self) -> float | None:
        """measure runs the work once and returns its CPU milliseconds."""
        if self._process is None:
            return None
        try:
            self._process.stdin.write("\n")
            self._process.stdin.flush()
            return float(self._process.stdout.readline())      # "" (a dead child) is a ValueError
        except (OSError, ValueError):
            self.close()
            return None

    def measure_many(self, count: int) -> list[float]:
        """measure_many is up to `count` measures, one after the other (fewer if the child went away)."""
        return [ms for ms in (self.measure() for _ in range(count)) if ms is not None]

    def close(self) -> None:
        """close ends the child and its pipes (also when it died first)."""
        process, self._process = self._process, None
        if process is None:
            return
        process.kill()
        process.wait()
        try:
            process.stdin.close()          # flushes what a dead child never read: a broken pipe
        except OSError:
            pass
        finally:
            process.stdout.close()


class IntervalMonitor:
    """IntervalMonitor says, for each interval of a sustained run, what the CPU did.

    A thread reads the CPU of this process and of the bookies (`bookie_pids`) at every interval
    boundary and runs a `SpeedProbe` every `probe_every` seconds. `annotate` then adds to each
    interval the CPU per entry of the client and of the bookies, the machine's idle share and
    the probe's (harmonic) mean. An interval with fewer entries/s, more CPU per entry at the
    same share of each core, and a slower probe had a slower machine; fewer entries/s at the
    same CPU per entry and probe is walkit waiting on something (a sync, a checkpoint, a
    lock). A monitor watches one run: `start` it once.
    """

    def __init__(self, bookie_pids: list[int], probe_every: float = 1.0) -> None:
        self._pids = [os.getpid(), *bookie_pids]
        self._probe_every = probe_every
        self._readings: list[tuple] = []              # _readings, at the interval boundaries and at the end
        self._probes: list[tuple[float, float]] = []   # (seconds since the start, probe ms)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._began = self._interval = 0.0

    def start(self, began: float, interval: float) -> None:
        """start samples from `began` (a perf_counter time, just past), reading the CPU every `interval` seconds."""
        if self._thread is not None:
            raise RuntimeError("an IntervalMonitor watches one run; make a new one")
        self._began, self._interval = began, interval
        self._readings.append(_reading(self._pids))   # here, not in the thread: on time, whatever the GIL does
        self._thread = threading.Thread(target=self._run, name="walkit-bench-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """stop ends the sampling with a last reading: the end of the run."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._readings.append(_reading(self._pids))

    def _run(self) -> None:
        began, interval = self._began, self._interval
        clearance = min(_PROBE_CLEARANCE_S, interval / 4)
        probe = SpeedProbe()
        try:
            boundary, next_probe = began + interval, began
            while not self._stop.is_set():
                now = time.perf_counter()
                if now >= boundary:
                    self._readings.append(_reading(self._pids))
                    while boundary <= time.perf_counter():
                        boundary += interval           # a late thread skips a boundary, never shifts them
                if now >= next_probe and boundary - now > clearance:     # never delay a boundary's reading
                    measured = probe.measure()
                    if measured is not None:
                        self._probes.append((now - began, measured))
                    while next_probe <= time.perf_counter():
                        next_probe += self._probe_every         # a late thread skips probes, never bunches them
                now = time.perf_counter()
                wake = min(boundary, next_probe) if next_probe > now else boundary    # a probe held back waits too
                self._stop.wait(max(0.0, wake - now))
        finally:
            probe.close()

    def _reading_at(self, at: float) -> tuple | None:
        """_reading_at is the reading taken within a tenth of an interval of `at`, or None."""
        nearest = min(self._readings, key=lambda reading: abs(reading[0] - at), default=None)
        if nearest is None or abs(nearest[0] - at) > self._interval / 10:
            return None
        return nearest

    def annotate(self, intervals: list[dict]) -> None:
        """annotate adds `cpu` (see `cpu_between`) and `probe_ms` to each interval of the run (None where unknown).

        Each interval's CPU is read between the readings at its two ends (the last interval's
        end is the run's); it stays None if either was not taken within a tenth of an interval
        of its time, so no interval is charged with another's CPU. Within that tenth, the
        interval's CPU per entry may be off by as much: the entries are counted over the
        interval, the CPU between its readings.
        """
        for part in intervals:
            starts = self._began + part["start_s"]
            ends = starts + part["span_s"]
            first, last = self._reading_at(starts), self._reading_at(ends)
            part["cpu"] = None if first is None or last is None else cpu_between(first, last, part["entries"])
            part["probe_ms"] = _mean_of([ms for at, ms in self._probes
                                         if part["start_s"] <= at < part["start_s"] + self._interval])

    def probe_mean(self) -> float | None:
        """probe_mean is the (harmonic) mean of every probe of the run (None if none could run)."""
        return _mean_of([ms for _, ms in self._probes])


def entries_per_probe(interval: dict) -> float | None:
    """entries_per_probe is an interval's entries/s times its probe's seconds (None without a probe).

    It is how many entries went by in the time the machine took to run the probe once. A
    slower stretch of the machine lowers entries/s and raises the probe together, so the
    product holds still; walkit slowing down by itself (a sync or a checkpoint that stalls
    adds, state that grows) lowers it. It is an estimate, resting on throughput following the
    probe's speed.
    """
    probe_ms = interval.get("probe_ms")
    return None if probe_ms is None else interval["entries_per_s"] * probe_ms / 1000


def speed_adjusted(intervals: list[dict]) -> dict | None:
    """speed_adjusted compares a sustained run's intervals with each other at equal machine speed.

    From the intervals' `entries_per_probe` (those with a probe reading), it returns them, their
    median, the lowest and highest as fractions of the median, and the last of them over the
    first; None with fewer than two, or when the first or the median is 0 (nothing to compare
    with). An interval in which nothing completed counts as 0: a stall shows.
    """
    values = [value for value in map(entries_per_probe, intervals) if value is not None]
    if len(values) < 2:
        return None
    median = statistics.median(values)
    if median <= 0 or values[0] <= 0:
        return None
    return {"entries_per_probe": values, "median": median, "lowest": min(values) / median,
            "highest": max(values) / median, "last_over_first": values[-1] / values[0]}
