"""walkit.bench measures walkit: append throughput and latency, catch-up reads, recovery time.

`walkit bench` runs it from the command line (see `walkit bench --help`); benchmarks/ holds
the scripts that compare walkit with its peers through the same harness. Every phase runs
`runs` times on a fresh LocalCluster and reports the median, because the machine is shared and
noisy. Each cluster first takes one window of appends, untimed, on a ledger of its own, so no
phase times the client's first handshakes with the bookies. Results are a JSON-able dict;
`plot` draws throughput over time and the latency distribution to a PNG (matplotlib, optional).

Phases:
- append: `entries` appends of `size` bytes with at most `window` in flight; entries/s,
  latency percentiles (p50/p99/p99.9) and a throughput time series;
- append_many: the same entries through `append_many` in batches of `batch` records, with
  about `window` entries in flight (window / batch calls);
- latency: `latency_entries` appends with one in flight;
- deferred sync: the pipelined appends on a deferred-sync ledger, then one `force()`
  (entries/s counts until the force returned: everything durable), and `latency_entries`
  deferred-sync appends with one in flight (acknowledged, not yet durable);
- read: catch-up read of the closed ledger the append phase wrote, in entries/s, first with
  a cold page cache (the bookies' files dropped from it: /proc/sys/vm/drop_caches, as root;
  `cold` says whether it could) and then again, warm;
- sustained (with `duration` > 0, once, after the runs): appends with `window` in flight for
  `duration` seconds, long enough to cross several checkpoints, with entries/s, p99, CPU per
  entry and a speed probe (walkit.bench_cpu: CPU milliseconds of a fixed piece of Python) per
  `interval` seconds. Intervals compared with each other tell a slower machine (more CPU per
  entry at the same share of each core, a slower probe) from a slower walkit (fewer entries
  at the same CPU per entry and probe). `speed_adjusted` (walkit.bench_cpu) puts a number on
  it: entries/s times the probe's seconds (the entries that went by while the machine ran the
  probe once) stays about the same when only the machine's speed moves, and falls when walkit
  itself slows down;
- recovery: time for open_ledger(recover=True) on a ledger left OPEN with `recovery_entries`
  entries, as after a writer crash.

The append, append_many and latency phases also say where the time went (`CpuMeter` of
walkit.bench_cpu, Linux only): CPU per entry of this process (the client and the harness) and of
the bookie processes, each process's share of a core, and how idle the machine was. A client
near one core is bound by the client's Python; idle cores with every process well below one mean
the phase waits on round trips and syncs (the stop-and-go of a full window), not on CPU.
"""

from __future__ import annotations

import os
import statistics
from array import array
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable

from walkit.bench_cpu import CpuMeter, IntervalMonitor, entries_per_probe, speed_adjusted
from walkit.errors import ConfigError

#: Width of the buckets of the throughput time series, in seconds.
BUCKET_S = 0.1


@dataclass
class BenchConfig:
    """BenchConfig is one benchmark's shape; see the module doc for the phases."""

    bookies: int = 3
    ensemble: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    size: int = 1024
    entries: int = 50000
    window: int = 1000
    latency_entries: int = 2000
    recovery_entries: int = 10000
    storage: str = "files"
    runs: int = 3
    data_dir: str | None = None
    batch: int = 100
    duration: float = 0.0
    interval: float = 10.0

    def validate(self) -> None:
        """validate raises ConfigError for impossible settings."""
        if self.bookies < self.ensemble:
            raise ConfigError(f"{self.bookies} bookies cannot hold an ensemble of {self.ensemble}")
        for name in ("size", "entries", "window", "runs", "batch"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1")
        if self.duration < 0 or self.interval <= 0:
            raise ConfigError("duration must be at least 0 and interval positive")


def percentile(sorted_values: list[float], q: float) -> float:
    """percentile returns the q-quantile (0..1) of sorted values (nan when empty)."""
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def latency_summary(latencies: list[float]) -> dict:
    """latency_summary gives p50, p99, p99.9 and max of latencies in seconds, as milliseconds."""
    ordered = sorted(latencies)
    return {"p50_ms": percentile(ordered, 0.5) * 1000, "p99_ms": percentile(ordered, 0.99) * 1000,
            "p999_ms": percentile(ordered, 0.999) * 1000, "max_ms": (ordered[-1] if ordered else float("nan")) * 1000}


class Window:
    """Window keeps at most `size` operations in flight: `enter()` before each, `leave()` as each completes.

    One thread enters; any thread may leave. It is the harness's share of every operation, so
    it is cheaper than a Semaphore (whose release is a Python-level Condition notify per
    operation): leaving counts under a plain lock and wakes the submitter only if it waits.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.entered = 0
        self._left = 0
        self._lock = threading.Lock()
        self._waiting = False
        self._room = threading.Event()

    def enter(self) -> None:
        """enter returns once fewer than `size` operations are in flight, and counts one more."""
        self.wait_below(self.size)
        self.entered += 1

    def leave(self) -> None:
        """leave counts one operation complete (from any thread)."""
        with self._lock:
            self._left += 1
        if self._waiting and not self._room.is_set():
            self._room.set()

    def wait_below(self, limit: int) -> None:
        """wait_below blocks the entering thread until fewer than `limit` operations are in flight."""
        if self.entered - self._left < limit:
            return
        self._waiting = True                  # before the check: a leave after it sees this and wakes us
        while self.entered - self._left >= limit:
            self._room.wait()
            self._room.clear()
        self._waiting = False


def pipelined(submit: Callable[[int], object], count: int, window: int,
              tick: Callable[[int], None] | None = None) -> dict:
    """pipelined calls `submit(i)` -> Future `count` times with at most `window` in flight.

    It returns entries/s, latency percentiles, the raw latencies and a time series of
    completions per BUCKET_S. Any failed operation raises once all have finished.
    """
    slots = Window(window)
    latencies = [0.0] * count
    done_at = [0.0] * count
    errors: list[BaseException] = []

    def completion(index: int, started: float):
        def callback(future) -> None:
            now = time.perf_counter()
            latencies[index] = now - started
            done_at[index] = now
            error = future.exception()
            if error is not None:
                errors.append(error)
            slots.leave()
        return callback

    began = time.perf_counter()
    for i in range(count):
        slots.enter()
        started = time.perf_counter()
        submit(i).add_done_callback(completion(i, started))
        if tick is not None and i % 1000 == 999:
            tick(1000)
    slots.wait_below(1)
    elapsed = time.perf_counter() - began
    if errors:
        raise errors[0]
    series: dict[int, int] = {}
    for at in done_at:
        bucket = int((at - began) / BUCKET_S)
        series[bucket] = series.get(bucket, 0) + 1
    return {"entries": count, "seconds": elapsed, "entries_per_s": count / elapsed,
            **latency_summary(latencies), "latencies": latencies,
            "series": [series.get(b, 0) / BUCKET_S for b in range(max(series, default=-1) + 1)]}


def add_append_arguments(parser, runs: int = 3, storage: bool = True) -> None:
    """add_append_arguments gives a benchmark script the options of `append_phases` (and --runs, --json)."""
    parser.add_argument("--entries", type=int, default=20000, help="appends in the pipelined phase")
    parser.add_argument("--window", type=int, default=1000, help="appends in flight in the pipelined phase")
    parser.add_argument("--latency-entries", type=int, default=2000, help="appends with one in flight")
    parser.add_argument("--size", type=int, default=1024, help="payload bytes per entry")
    parser.add_argument("--runs", type=int, default=runs, help="runs; medians are reported")
    if storage:
        parser.add_argument("--storage", default="files", help="bookie storage")
    parser.add_argument("--json", default=None, help="also write the results to this file")


def append_phases(create_writer: Callable[[], object], payload: bytes, args, keys) -> dict[str, dict]:
    """append_phases runs `args.entries` appends with `args.window` in flight, then `args.latency_entries`
    with one in flight, each on a new writer from `create_writer()`; it returns {phase: {key: value}}."""
    results = {}
    for phase, count, window in (("pipelined", args.entries, args.window), ("one_in_flight", args.latency_entries, 1)):
        writer = create_writer()
        result = pipelined(lambda i: writer.append_async(payload), count, window)
        writer.close()
        results[phase] = {k: result[k] for k in keys}
    return results


def sustained(submit: Callable[[], object], duration: float, window: int, interval: float,
              monitor: IntervalMonitor | None = None) -> dict:
    """sustained calls `submit()` -> Future with `window` in flight for `duration` seconds.

    It returns the totals and, per `interval` seconds of completions, entries/s and latency
    percentiles, so stalls (a checkpoint, a compaction) show as a bad interval. With a
    `monitor`, each interval also says what the CPU did (see IntervalMonitor).
    """
    slots = Window(window)
    lock = threading.Lock()
    # Completion times and latencies as C doubles: millions of tuples would make every full
    # garbage collection of this process walk them, slower and slower as the run goes on.
    completed, latencies = array("d"), array("d")
    errors: list[BaseException] = []

    def callback(started: float):
        def done(future) -> None:
            now = time.perf_counter()
            error = future.exception()
            with lock:
                completed.append(now)
                latencies.append(now - started)
                if error is not None:
                    errors.append(error)
            slots.leave()
        return done

    began = time.perf_counter()
    deadline = began + duration
    if monitor is not None:
        monitor.start(began, interval)
    try:
        while not errors:
            slots.enter()
            started = time.perf_counter()
            if started >= deadline:
                slots.leave()
                break
            submit().add_done_callback(callback(started))
        slots.wait_below(1)
    finally:
        if monitor is not None:
            monitor.stop()
    if errors:
        raise errors[0]
    elapsed = time.perf_counter() - began
    buckets: dict[int, list[float]] = {}
    for at, latency in zip(completed, latencies):
        buckets.setdefault(int((at - began) / interval), []).append(latency)
    intervals = []
    for index in range(int(elapsed / interval) + 1):      # an interval where nothing completed shows too
        values = buckets.get(index, [])
        span = min(interval, elapsed - index * interval)
        if span < interval / 2:
            continue                              # the drain at the end: too short to say anything
        intervals.append({"start_s": index * interval, "span_s": span, "entries": len(values),
                          "entries_per_s": len(values) / span, **latency_summary(values)})
    result = {"entries": len(latencies), "seconds": elapsed, "entries_per_s": len(latencies) / elapsed,
              **latency_summary(list(latencies)), "intervals": intervals}
    if monitor is not None:
        monitor.annotate(intervals)
        result["probe_ms"] = monitor.probe_mean()
        for part in intervals:
            part["entries_per_probe"] = entries_per_probe(part)
        result["speed_adjusted"] = speed_adjusted(intervals)
    return result


def drop_page_cache() -> bool:
    """drop_page_cache writes dirty pages and drops the page cache (root only); False if it may not."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return True
    except OSError:
        return False


def _median_runs(runs: list[dict], keys) -> dict:
    return {key: statistics.median(r[key] for r in runs) for key in keys}


def run(config: BenchConfig, progress: Callable[[int], None] | None = None) -> dict:
    """run executes every phase `config.runs` times and returns medians plus the raw runs."""
    import walkit
    config.validate()
    payload = os.urandom(config.size)
    appends, batches, singles, reads, warm_reads, recoveries = [], [], [], [], [], []
    deferreds, deferred_singles = [], []
    for _ in range(config.runs):
        with tempfile.TemporaryDirectory(prefix="walkit-bench-", dir=config.data_dir) as data_dir, \
                walkit.LocalCluster(bookies=config.bookies, data_dir=data_dir, storage=config.storage) as cluster, \
                walkit.Client(cluster.metadata_url) as client:
            quorums = (config.ensemble, config.write_quorum, config.ack_quorum)
            _warm_up(client, quorums, payload, config.window)
            writer = client.create_ledger(*quorums)
            pids = [cluster.pid(i) for i in range(config.bookies)]
            meter = CpuMeter(pids)
            result = pipelined(lambda i: writer.append_async(payload), config.entries, config.window, progress)
            appends.append({**result, "cpu": meter.result(config.entries)})
            writer.close()
            many = client.create_ledger(*quorums)
            records = [payload] * config.batch
            calls = max(1, config.entries // config.batch)
            meter = CpuMeter(pids)
            result = pipelined(lambda i: many.append_many_async(records), calls, max(1, config.window // config.batch))
            batches.append({**result, "entries": calls * config.batch, "cpu": meter.result(calls * config.batch),
                            "entries_per_s": calls * config.batch / result["seconds"]})
            many.close()
            cold = drop_page_cache()
            for target in (reads, warm_reads):
                reader = client.open_ledger(writer.ledger_id)
                started = time.perf_counter()
                count = sum(1 for _ in reader.read())
                target.append({"entries": count, "entries_per_s": count / (time.perf_counter() - started),
                               "cold": cold and target is reads})
            single = client.create_ledger(*quorums)
            meter = CpuMeter(pids)
            result = pipelined(lambda i: single.append_async(payload), config.latency_entries, 1, progress)
            singles.append({**result, "cpu": meter.result(config.latency_entries)})
            single.close()
            deferred = client.create_ledger(*quorums, deferred_sync=True)
            result = pipelined(lambda i: deferred.append_async(payload), config.entries, config.window)
            forcing = time.perf_counter()
            deferred.force()
            force_s = time.perf_counter() - forcing
            deferreds.append({**result, "force_ms": force_s * 1000,
                              "entries_per_s": config.entries / (result["seconds"] + force_s)})
            deferred.close()
            deferred = client.create_ledger(*quorums, deferred_sync=True)
            deferred_singles.append(pipelined(lambda i: deferred.append_async(payload), config.latency_entries, 1))
            deferred.close()
            recoveries.append(_recovery_time(cluster, config, payload, quorums))
    keys = ("entries_per_s", "p50_ms", "p99_ms", "p999_ms")
    long_run = None
    if config.duration:
        with tempfile.TemporaryDirectory(prefix="walkit-bench-", dir=config.data_dir) as data_dir, \
                walkit.LocalCluster(bookies=config.bookies, data_dir=data_dir, storage=config.storage) as cluster, \
                walkit.Client(cluster.metadata_url) as client:
            quorums = (config.ensemble, config.write_quorum, config.ack_quorum)
            _warm_up(client, quorums, payload, config.window)
            writer = client.create_ledger(*quorums)
            monitor = IntervalMonitor([cluster.pid(i) for i in range(config.bookies)],
                                      probe_every=min(1.0, config.interval / 2))     # at least 2 per interval
            long_run = sustained(lambda: writer.append_async(payload), config.duration, config.window,
                                 config.interval, monitor)
            writer.close()
    return {
        "config": asdict(config),
        "append": {"median": _median_runs(appends, keys), "runs": [_without_raw(r) for r in appends],
                   "latencies": appends[-1]["latencies"], "series": appends[-1]["series"], "cpu": _median_cpu(appends)},
        "one_in_flight": {"median": _median_runs(singles, keys), "runs": [_without_raw(r) for r in singles],
                          "latencies": singles[-1]["latencies"], "cpu": _median_cpu(singles)},
        "append_many": {"median": _median_runs(batches, keys), "runs": [_without_raw(r) for r in batches],
                        "cpu": _median_cpu(batches)},
        "deferred_sync": {"median": _median_runs(deferreds, keys + ("force_ms",)),
                          "runs": [_without_raw(r) for r in deferreds]},
        "deferred_one_in_flight": {"median": _median_runs(deferred_singles, keys),
                                   "runs": [_without_raw(r) for r in deferred_singles]},
        "catch_up_read": {"median": _median_runs(reads, ("entries_per_s",)), "runs": reads,
                          "cold": all(r["cold"] for r in reads)},
        "catch_up_read_warm": {"median": _median_runs(warm_reads, ("entries_per_s",)), "runs": warm_reads},
        "sustained": long_run,
        "recovery": {"median": _median_runs(recoveries, ("seconds",)), "runs": recoveries},
    }


def _median_cpu(runs: list[dict]) -> dict | None:
    """_median_cpu is the median of each CpuMeter figure over `runs` (None if a run could not measure)."""
    measured = [r["cpu"] for r in runs]
    if not measured or None in measured:
        return None
    median = {key: statistics.median(m[key] for m in measured) for key in measured[0] if key != "bookie_cores"}
    median["bookie_cores"] = [statistics.median(cores) for cores in zip(*(m["bookie_cores"] for m in measured))]
    return median


def _cpu_line(cpu: dict | None) -> list[str]:
    """_cpu_line renders a phase's CpuMeter medians (nothing where they could not be measured)."""
    if cpu is None:
        return []
    bookies = ", ".join(f"{c:.2f}" for c in cpu["bookie_cores"])
    return [f"    cpu per entry: client {cpu['client_us_per_entry']:.1f} us ({cpu['client_cores']:.2f} cores), "
            f"bookies {cpu['bookies_us_per_entry']:.1f} us together ({bookies} cores); "
            f"machine {cpu['machine_idle']:.0%} idle"]


def _without_raw(result: dict) -> dict:
    return {k: v for k, v in result.items() if k not in ("latencies", "series")}


def _warm_up(client, quorums, payload: bytes, window: int) -> None:
    """_warm_up appends one window to a ledger of its own, untimed: connections made, code warm.

    Without it the first phase's first window waited for the handshakes with every bookie and
    for code run the first time: 60-87 ms for the first 1,000 appends, which were the short
    run's p99 and made the sustained run's p99 look better beside it than it is.
    """
    ledger = client.create_ledger(*quorums)
    pipelined(lambda i: ledger.append_async(payload), window, window)
    ledger.close()


def _recovery_time(cluster, config: BenchConfig, payload: bytes, quorums) -> dict:
    """_recovery_time leaves a ledger OPEN (its writer's client closed mid-stream) and times recovery."""
    import walkit
    with walkit.Client(cluster.metadata_url) as abandoned:
        writer = abandoned.create_ledger(*quorums)
        pipelined(lambda i: writer.append_async(payload), config.recovery_entries, config.window)
        ledger_id = writer.ledger_id
    with walkit.Client(cluster.metadata_url) as recoverer:
        started = time.perf_counter()
        handle = recoverer.open_ledger(ledger_id, recover=True)
        return {"seconds": time.perf_counter() - started, "last_entry_id": handle.last_add_confirmed}


def plot(result: dict, path: str) -> None:
    """plot draws append throughput over time and the latency distribution to a PNG at `path`."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("plotting needs matplotlib: pip install 'walkit[bench]'") from None
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    series = result["append"]["series"]
    left.plot([i * BUCKET_S for i in range(len(series))], series, label="walkit")
    for name, peer in result.get("peers", {}).items():
        if peer.get("series"):
            left.plot([i * BUCKET_S for i in range(len(peer["series"]))], peer["series"], label=name)
    left.set_xlabel("seconds")
    left.set_ylabel("appends completed per second")
    left.set_title("append throughput over time (last run)")
    left.legend()
    latencies = sorted(x * 1000 for x in result["append"]["latencies"])
    ones = sorted(x * 1000 for x in result["one_in_flight"]["latencies"])
    for values, label in ((latencies, f"window {result['config']['window']}"), (ones, "one in flight")):
        right.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=label)
    right.set_xscale("log")
    right.set_xlabel("latency (ms)")
    right.set_ylabel("fraction of appends")
    right.set_title("append latency (CDF, last run)")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_lines(result: dict) -> list[str]:
    """summary_lines renders the medians as human-readable lines."""
    c = result["config"]
    a, s = result["append"]["median"], result["one_in_flight"]["median"]
    lines = [
        f"walkit: {c['bookies']} bookies, E{c['ensemble']}/Qw{c['write_quorum']}/Qa{c['ack_quorum']}, "
        f"{c['size']} B entries, {c['storage']} storage, median of {c['runs']} runs",
        f"  appends (window {c['window']}): {a['entries_per_s']:,.0f} entries/s; latency p50 {a['p50_ms']:.2f} ms, "
        f"p99 {a['p99_ms']:.2f} ms, p99.9 {a['p999_ms']:.2f} ms",
        *_cpu_line(result["append"].get("cpu")),
        f"  append_many (batches of {c['batch']}, ~{c['window']} entries in flight): "
        f"{result['append_many']['median']['entries_per_s']:,.0f} entries/s",
        *_cpu_line(result["append_many"].get("cpu")),
        f"  one append in flight: p50 {s['p50_ms']:.3f} ms, p99 {s['p99_ms']:.3f} ms, p99.9 {s['p999_ms']:.3f} ms",
        *_cpu_line(result["one_in_flight"].get("cpu")),
    ]
    if "deferred_sync" in result:
        d, ds = result["deferred_sync"]["median"], result["deferred_one_in_flight"]["median"]
        lines += [
            f"  deferred sync, appends (window {c['window']}) then one force: {d['entries_per_s']:,.0f} entries/s "
            f"durable (the force took {d['force_ms']:.1f} ms); one append in flight (not yet durable): "
            f"p50 {ds['p50_ms']:.3f} ms, p99 {ds['p99_ms']:.3f} ms",
        ]
    lines += [
        f"  catch-up read of a closed ledger: {result['catch_up_read']['median']['entries_per_s']:,.0f} entries/s "
        f"({'cold page cache' if result['catch_up_read']['cold'] else 'page cache NOT dropped: not root'}), "
        f"warm {result['catch_up_read_warm']['median']['entries_per_s']:,.0f} entries/s",
        f"  recovery of an open ledger of {c['recovery_entries']:,} entries: "
        f"{result['recovery']['median']['seconds'] * 1000:.0f} ms",
    ]
    long_run = result.get("sustained")
    if long_run:
        lines.append(f"  sustained {long_run['seconds']:.0f} s (window {c['window']}): "
                     f"{long_run['entries_per_s']:,.0f} entries/s, p99 {long_run['p99_ms']:.2f} ms; "
                     f"vs the short run: throughput {long_run['entries_per_s'] / a['entries_per_s']:.2f}x, "
                     f"p99 {long_run['p99_ms'] / a['p99_ms']:.2f}x")
        cpu = result["append"].get("cpu")
        if cpu is not None:
            lines.append(f"    cpu per entry in the short runs: client {cpu['client_us_per_entry']:.1f} + bookies "
                         f"{cpu['bookies_us_per_entry']:.1f} us")
        if any(part.get("probe_ms") is not None for part in long_run["intervals"]):
            lines.append("    per interval, the speed probe: CPU ms of a fixed piece of Python (higher is a slower "
                         "machine)" + (", and the entries per probe: entries/s x the probe's seconds, which a "
                                       "slower machine leaves about alone and a slower walkit lowers"
                                       if "speed_adjusted" in long_run else ""))
        adjusted = long_run.get("speed_adjusted")
        if adjusted is not None:
            lines.append(f"    at equal machine speed (an estimate): the intervals' entries per probe run from "
                         f"{adjusted['lowest']:.2f}x to {adjusted['highest']:.2f}x their median "
                         f"({adjusted['median']:,.0f}); the last probed is {adjusted['last_over_first']:.2f}x the "
                         f"first")
        for part in long_run["intervals"]:
            line = f"    {part['start_s']:>5.0f} s: {part['entries_per_s']:>9,.0f} entries/s, " + (
                f"p50 {part['p50_ms']:.2f} ms, p99 {part['p99_ms']:.2f} ms" if part["entries"] else "none completed")
            cpu = part.get("cpu")
            if cpu is not None:
                line += (f"; cpu per entry {cpu['client_us_per_entry']:.1f} + {cpu['bookies_us_per_entry']:.1f} us, "
                         f"machine {cpu['machine_idle']:.0%} idle")
            if part.get("probe_ms") is not None:
                line += f"; probe {part['probe_ms']:.1f} ms"
            if part.get("entries_per_probe") is not None:
                line += f", {part['entries_per_probe']:,.0f} entries per probe"
            lines.append(line)
    for name, peer in result.get("peers", {}).items():
        latency = f"p50 {peer['p50_ms']:.2f} ms" if "p50_ms" in peer else "no latencies"
        lines.append(f"  {name}: {peer['entries_per_s']:,.0f} ops/s ({latency}) -> walkit is "
                     f"{a['entries_per_s'] / peer['entries_per_s']:.1f}x; "
                     f"{'fsyncs before acking' if peer.get('fsync') else 'does NOT fsync before acking'}; "
                     f"{peer.get('note', '')}")
    return lines
