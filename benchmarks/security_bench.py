"""Append throughput with CurveZMQ on and off, in the same run (issue 17).

    python benchmarks/security_bench.py --entries 20000 --window 1000 --runs 5 [--json out.json]

Each run starts two fresh three-bookie LocalClusters, one plain and one secured (`security=True`:
CURVE on every bookie socket, an allow-list, and per-ledger ownership checks), and measures the
same append phases on both (E3/Qw2/Qa2, 1 KiB, files storage): `--entries` appends with
`--window` in flight, then `--latency-entries` with one in flight. Plain and secured runs
alternate, so the machine's noise falls on both; the script prints the medians and the ratio
secured / plain.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

import walkit
from walkit.bench import add_append_arguments, append_phases

KEYS = ("entries_per_s", "p50_ms", "p99_ms")
PHASES = ("pipelined", "one_in_flight")


def measure(secured: bool, args, payload: bytes) -> dict[str, dict]:
    """measure runs both append phases on a fresh cluster and returns {phase: {key: value}}."""
    with tempfile.TemporaryDirectory() as data_dir, \
            walkit.LocalCluster(bookies=3, data_dir=data_dir, storage=args.storage, security=secured) as cluster, \
            walkit.Client(cluster.metadata_url, key=cluster.client_key) as client:
        return append_phases(lambda: client.create_ledger(3, 2, 2), payload, args, KEYS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_append_arguments(parser, runs=5)
    args = parser.parse_args()
    payload = os.urandom(args.size)
    runs: dict[str, list[dict]] = {"plain": [], "curve": []}
    for _ in range(args.runs):
        for name, secured in (("plain", False), ("curve", True)):
            runs[name].append(measure(secured, args, payload))
    medians = {name: {phase: {k: statistics.median(r[phase][k] for r in results) for k in KEYS}
                      for phase in PHASES} for name, results in runs.items()}
    print(f"E3/Qw2/Qa2 {args.size} B entries, {args.storage} storage, median of {args.runs} alternating runs")
    for phase in PHASES:
        for name in ("plain", "curve"):
            m = medians[name][phase]
            print(f"  {phase:13} {name:5}: {m['entries_per_s']:>9,.0f} entries/s, p50 {m['p50_ms']:.3f} ms, "
                  f"p99 {m['p99_ms']:.3f} ms")
        ratio = medians["curve"][phase]["entries_per_s"] / medians["plain"][phase]["entries_per_s"]
        print(f"  {phase:13} curve/plain throughput: {ratio:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "median": medians, "runs": runs}, f, indent=2)


if __name__ == "__main__":
    main()
