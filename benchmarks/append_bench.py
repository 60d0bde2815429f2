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
from walkit.bench import add_append_arguments, append_phases

KEYS = ("entries_per_s", "p50_ms", "p99_ms", "p999_ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_append_arguments(parser)
    args = parser.parse_args()
    payload = os.urandom(args.size)
    phases: dict[str, list[dict]] = {"pipelined": [], "one_in_flight": []}
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as data_dir, \
                walkit.LocalCluster(bookies=3, data_dir=data_dir, storage=args.storage) as cluster, \
                walkit.Client(cluster.metadata_url) as client:
            for phase, result in append_phases(lambda: client.create_ledger(3, 2, 2), payload, args, KEYS).items():
                phases[phase].append(result)
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
