"""Append throughput and latency of one client against real bookie processes (E3/Qw2/Qa2, 1 KiB).

    python benchmarks/append_bench.py --entries 20000 --window 1000 --runs 3 [--storage files] [--json out.json]

A thin script over walkit's bench harness (walkit.bench, also `walkit bench`): it runs only the
append phases -- `--entries` appends with at most `--window` in flight, then appends with one in
flight -- on a fresh LocalCluster per run, and prints the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

import walkit
from walkit.bench import pipelined

KEYS = ("entries_per_s", "p50_ms", "p99_ms", "p999_ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=20000)
    parser.add_argument("--window", type=int, default=1000)
    parser.add_argument("--latency-entries", type=int, default=2000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--storage", default="files")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    payload = os.urandom(args.size)
    phases: dict[str, list[dict]] = {"pipelined": [], "one_in_flight": []}
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as data_dir, \
                walkit.LocalCluster(bookies=3, data_dir=data_dir, storage=args.storage) as cluster, \
                walkit.Client(cluster.metadata_url) as client:
            for phase, count, window in (("pipelined", args.entries, args.window),
                                         ("one_in_flight", args.latency_entries, 1)):
                writer = client.create_ledger(3, 2, 2)
                result = pipelined(lambda i: writer.append_async(payload), count, window)
                writer.close()
                phases[phase].append({k: result[k] for k in KEYS})
    medians = {phase: {k: statistics.median(r[k] for r in runs) for k in KEYS} for phase, runs in phases.items()}
    print(f"E3/Qw2/Qa2 {args.size} B entries, {args.storage} storage, median of {args.runs} runs")
    for phase, m in medians.items():
        print(f"  {phase}: {m['entries_per_s']:,.0f} entries/s, p50 {m['p50_ms']:.3f} ms, "
              f"p99 {m['p99_ms']:.3f} ms, p99.9 {m['p999_ms']:.3f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "median": medians, "runs": phases}, f, indent=2)


if __name__ == "__main__":
    main()
