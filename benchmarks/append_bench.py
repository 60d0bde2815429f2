"""Append throughput and latency of one client against real bookie processes.

    python benchmarks/append_bench.py --entries 20000 --size 1024 --window 1000 --runs 3

Starts a LocalCluster (bookie processes on 127.0.0.1), creates one ledger per run with the
given quorums, appends `--entries` payloads of `--size` bytes keeping at most `--window` in
flight, and reports entries/s and per-append latency percentiles. A second phase measures
latency with one append in flight. The machine is shared and noisy, so every figure is the
median over `--runs` runs. Results are printed and written as JSON (--json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import walkit  # noqa: E402


def percentile(sorted_values: list[float], q: float) -> float:
    """percentile returns the q-quantile (0..1) of already sorted values."""
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, int(q * len(sorted_values)))
    return sorted_values[index]


def run_window(client, args, entries: int, window: int) -> dict:
    """run_window appends `entries` payloads keeping `window` in flight; returns the figures."""
    writer = client.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum, password=b"bench")
    payload = os.urandom(args.size)
    slots = threading.Semaphore(window)
    latencies = [0.0] * entries
    done = threading.Event()
    remaining = [entries]
    lock = threading.Lock()

    def finished(index: int, started: float):
        def callback(future):
            latencies[index] = time.perf_counter() - started
            future.result()
            slots.release()
            with lock:
                remaining[0] -= 1
                if remaining[0] == 0:
                    done.set()
        return callback

    began = time.perf_counter()
    for i in range(entries):
        slots.acquire()
        started = time.perf_counter()
        writer.append_async(payload).add_done_callback(finished(i, started))
    done.wait()
    elapsed = time.perf_counter() - began
    writer.close()
    latencies.sort()
    return {"entries": entries, "window": window, "seconds": elapsed, "entries_per_s": entries / elapsed,
            "p50_ms": percentile(latencies, 0.50) * 1000, "p99_ms": percentile(latencies, 0.99) * 1000,
            "p999_ms": percentile(latencies, 0.999) * 1000}


def median_of(runs: list[dict]) -> dict:
    """median_of returns the per-field median of several runs."""
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bookies", type=int, default=3)
    parser.add_argument("--ensemble", "-e", type=int, default=3)
    parser.add_argument("--write-quorum", "-w", type=int, default=2)
    parser.add_argument("--ack-quorum", "-a", type=int, default=2)
    parser.add_argument("--size", type=int, default=1024, help="payload bytes")
    parser.add_argument("--entries", type=int, default=20000)
    parser.add_argument("--window", type=int, default=1000, help="appends in flight")
    parser.add_argument("--latency-entries", type=int, default=2000, help="appends for the one-in-flight phase")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--storage", default="memory", help="LocalCluster storage kind or URI")
    parser.add_argument("--json", default=None, help="write results to this file")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as data_dir, \
            walkit.LocalCluster(bookies=args.bookies, data_dir=data_dir, storage=args.storage) as cluster, \
            walkit.Client(cluster.metadata_url) as client:
        run_window(client, args, min(2000, args.entries), args.window)          # warm-up
        pipelined = [run_window(client, args, args.entries, args.window) for _ in range(args.runs)]
        single = [run_window(client, args, args.latency_entries, 1) for _ in range(args.runs)]
    result = {
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "pipelined": {"median": median_of(pipelined), "runs": pipelined},
        "one_in_flight": {"median": median_of(single), "runs": single},
    }
    p, s = result["pipelined"]["median"], result["one_in_flight"]["median"]
    print(f"E{args.ensemble}/Qw{args.write_quorum}/Qa{args.ack_quorum} {args.size} B entries, "
          f"{args.storage} storage, median of {args.runs} runs")
    print(f"  pipelined (window {args.window}): {p['entries_per_s']:,.0f} entries/s, "
          f"p50 {p['p50_ms']:.2f} ms, p99 {p['p99_ms']:.2f} ms, p99.9 {p['p999_ms']:.2f} ms")
    print(f"  one in flight: {s['entries_per_s']:,.0f} entries/s, p50 {s['p50_ms']:.3f} ms, "
          f"p99 {s['p99_ms']:.3f} ms, p99.9 {s['p999_ms']:.3f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
