"""Guaranteed write quorum and unbounded ledgers: their cost, measured (issue 19).

    python benchmarks/unbounded_bench.py --entries 20000 --window 1000 --runs 3 [--json out.json]

1. Append throughput and latency of E3/Qw3/Qa2 ledgers (1 KiB, files storage, three bookies)
   with guaranteed write quorum off, on, and as an unbounded ledger (which always has it),
   alternating in one run so the machine's noise falls on all three: `--entries` appends with
   `--window` in flight, then `--latency-entries` with one in flight. Medians of `--runs`.
2. Metadata size after 10,000 fragments: the JSON record of a ledger whose writer changed the
   ensemble 10,000 times (over a 20-bookie pool), as a bounded ledger's encoding and as an
   unbounded one's (bookies named by index), and after truncating all but the last 100.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile

import walkit
from walkit.bench import add_append_arguments, append_phases, pipelined
from walkit.core.metadata import LedgerMetadata

KEYS = ("entries_per_s", "p50_ms", "p99_ms")
MODES = {"plain": {}, "gwq": {"guaranteed_write_quorum": True}, "unbounded": {"unbounded": True}}


def measure(args, payload: bytes, turn: int) -> dict[str, dict]:
    """measure runs both append phases for every mode on one fresh cluster (after a warm-up).

    The modes take turns going first (`turn`), so none always meets the coldest cluster.
    """
    results: dict[str, dict] = {}
    order = list(MODES)[turn % len(MODES):] + list(MODES)[:turn % len(MODES)]
    with tempfile.TemporaryDirectory() as data_dir, \
            walkit.LocalCluster(bookies=3, data_dir=data_dir, storage="files") as cluster, \
            walkit.Client(cluster.metadata_url) as client:
        warm = client.create_ledger(3, 3, 2)
        pipelined(lambda i: warm.append_async(payload), min(args.entries, 2000), args.window)
        warm.close()
        for mode in order:
            results[mode] = append_phases(lambda: client.create_ledger(3, 3, 2, **MODES[mode]), payload, args, KEYS)
    return results


def metadata_sizes(fragments: int, keep: int) -> dict[str, int]:
    """metadata_sizes encodes a ledger after `fragments` ensemble changes, bounded and unbounded."""
    rng = random.Random(1)
    pool = [f"10.0.{i // 250}.{i % 250}:3181" for i in range(20)]
    base = dict(ledger_id=123456789, ensemble_size=3, write_quorum=3, ack_quorum=2, guaranteed_write_quorum=True,
                ensembles={0: tuple(rng.sample(pool, 3))})
    bounded = LedgerMetadata(**base)
    unbounded = LedgerMetadata(**base, unbounded=True, term=7)
    ensembles = dict(bounded.ensembles)
    for i in range(1, fragments):
        ensembles[i * 1000] = tuple(rng.sample(pool, 3))
    bounded = LedgerMetadata(**{**base, "ensembles": ensembles})
    unbounded = LedgerMetadata(**{**base, "ensembles": ensembles}, unbounded=True, term=7)
    truncated = unbounded.truncated(sorted(ensembles)[-keep])
    return {"bounded_bytes": len(bounded.to_bytes()), "unbounded_bytes": len(unbounded.to_bytes()),
            "after_truncation_bytes": len(truncated.to_bytes()), "fragments_after_truncation": len(truncated.ensembles)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_append_arguments(parser, storage=False)
    parser.add_argument("--fragments", type=int, default=10000)
    args = parser.parse_args()
    payload = os.urandom(args.size)
    runs = [measure(args, payload, turn) for turn in range(args.runs)]
    medians = {mode: {phase: {k: statistics.median(r[mode][phase][k] for r in runs) for k in KEYS}
                      for phase in ("pipelined", "one_in_flight")} for mode in MODES}
    print(f"E3/Qw3/Qa2 {args.size} B entries, files storage, median of {args.runs} runs")
    for phase in ("pipelined", "one_in_flight"):
        base = medians["plain"][phase]["entries_per_s"]
        for mode in MODES:
            m = medians[mode][phase]
            print(f"  {phase:13} {mode:9}: {m['entries_per_s']:>9,.0f} entries/s ({m['entries_per_s'] / base:.2f}x), "
                  f"p50 {m['p50_ms']:.3f} ms, p99 {m['p99_ms']:.3f} ms")
    sizes = metadata_sizes(args.fragments, 100)
    print(f"metadata after {args.fragments:,} fragments: bounded encoding {sizes['bounded_bytes']:,} B, unbounded "
          f"{sizes['unbounded_bytes']:,} B; truncated to the last {sizes['fragments_after_truncation']} fragments "
          f"{sizes['after_truncation_bytes']:,} B")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "median": medians, "runs": runs, "metadata": sizes}, f, indent=2)


if __name__ == "__main__":
    main()
