"""walkit.bench measures walkit: append throughput and latency, catch-up reads, recovery time.

`walkit bench` runs it from the command line (see `walkit bench --help`); benchmarks/ holds
the scripts that compare walkit with its peers through the same harness. Every phase runs
`runs` times on a fresh LocalCluster and reports the median, because the machine is shared and
noisy. Results are a JSON-able dict; `plot` draws throughput over time and the latency
distribution to a PNG (matplotlib, optional).

Phases:
- append: `entries` appends of `size` bytes with at most `window` in flight; entries/s,
  latency percentiles (p50/p99/p99.9) and a throughput time series;
- latency: `latency_entries` appends with one in flight;
- read: catch-up read of the closed ledger the append phase wrote, in entries/s;
- recovery: time for open_ledger(recover=True) on a ledger left OPEN with `recovery_entries`
  entries, as after a writer crash.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable

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

    def validate(self) -> None:
        """validate raises ConfigError for impossible settings."""
        if self.bookies < self.ensemble:
            raise ConfigError(f"{self.bookies} bookies cannot hold an ensemble of {self.ensemble}")
        for name in ("size", "entries", "window", "runs"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1")


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


def pipelined(submit: Callable[[int], object], count: int, window: int,
              tick: Callable[[int], None] | None = None) -> dict:
    """pipelined calls `submit(i)` -> Future `count` times with at most `window` in flight.

    It returns entries/s, latency percentiles, the raw latencies and a time series of
    completions per BUCKET_S. Any failed operation raises once all have finished.
    """
    slots = threading.Semaphore(window)
    latencies = [0.0] * count
    done_at = [0.0] * count
    errors: list[BaseException] = []
    finished = threading.Event()
    remaining = [count]
    lock = threading.Lock()

    def completion(index: int, started: float):
        def callback(future) -> None:
            now = time.perf_counter()
            latencies[index] = now - started
            done_at[index] = now
            error = future.exception()
            slots.release()
            with lock:
                if error is not None:
                    errors.append(error)
                remaining[0] -= 1
                if remaining[0] == 0:
                    finished.set()
        return callback

    began = time.perf_counter()
    for i in range(count):
        slots.acquire()
        started = time.perf_counter()
        submit(i).add_done_callback(completion(i, started))
        if tick is not None and i % 1000 == 999:
            tick(1000)
    finished.wait()
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


def _median_runs(runs: list[dict], keys) -> dict:
    return {key: statistics.median(r[key] for r in runs) for key in keys}


def run(config: BenchConfig, progress: Callable[[int], None] | None = None) -> dict:
    """run executes every phase `config.runs` times and returns medians plus the raw runs."""
    import walkit
    config.validate()
    payload = os.urandom(config.size)
    appends, singles, reads, recoveries = [], [], [], []
    for _ in range(config.runs):
        with tempfile.TemporaryDirectory(prefix="walkit-bench-", dir=config.data_dir) as data_dir, \
                walkit.LocalCluster(bookies=config.bookies, data_dir=data_dir, storage=config.storage) as cluster, \
                walkit.Client(cluster.metadata_url) as client:
            quorums = (config.ensemble, config.write_quorum, config.ack_quorum)
            writer = client.create_ledger(*quorums)
            appends.append(pipelined(lambda i: writer.append_async(payload), config.entries, config.window,
                                     progress))
            writer.close()
            reader = client.open_ledger(writer.ledger_id)
            started = time.perf_counter()
            count = sum(1 for _ in reader.read())
            reads.append({"entries": count, "entries_per_s": count / (time.perf_counter() - started)})
            single = client.create_ledger(*quorums)
            singles.append(pipelined(lambda i: single.append_async(payload), config.latency_entries, 1, progress))
            single.close()
            recoveries.append(_recovery_time(cluster, config, payload, quorums))
    keys = ("entries_per_s", "p50_ms", "p99_ms", "p999_ms")
    return {
        "config": asdict(config),
        "append": {"median": _median_runs(appends, keys), "runs": [_without_raw(r) for r in appends],
                   "latencies": appends[-1]["latencies"], "series": appends[-1]["series"]},
        "one_in_flight": {"median": _median_runs(singles, keys), "runs": [_without_raw(r) for r in singles],
                          "latencies": singles[-1]["latencies"]},
        "catch_up_read": {"median": _median_runs(reads, ("entries_per_s",)), "runs": reads},
        "recovery": {"median": _median_runs(recoveries, ("seconds",)), "runs": recoveries},
    }


def _without_raw(result: dict) -> dict:
    return {k: v for k, v in result.items() if k not in ("latencies", "series")}


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
        f"  one append in flight: p50 {s['p50_ms']:.3f} ms, p99 {s['p99_ms']:.3f} ms, p99.9 {s['p999_ms']:.3f} ms",
        f"  catch-up read of a closed ledger: {result['catch_up_read']['median']['entries_per_s']:,.0f} entries/s",
        f"  recovery of an open ledger of {c['recovery_entries']:,} entries: "
        f"{result['recovery']['median']['seconds'] * 1000:.0f} ms",
    ]
    for name, peer in result.get("peers", {}).items():
        lines.append(f"  {name}: {peer['entries_per_s']:,.0f} ops/s (p50 {peer['p50_ms']:.2f} ms) -> walkit is "
                     f"{a['entries_per_s'] / peer['entries_per_s']:.1f}x")
    return lines
