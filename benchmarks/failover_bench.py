"""Time from a bookie's death to appends flowing again.

    python benchmarks/failover_bench.py --runs 5

For each run: a fresh ledger (E3/Qw2/Qa2 by default) on a LocalCluster with spare bookies,
a steady stream of pipelined 1 KiB appends, then SIGKILL of one bookie of the ensemble. The
figure is the time from the kill to the acknowledgement of the first append submitted after
the kill: adds complete in order, so that one completes only once every append stalled by the
dead bookie was re-sent to its replacement. Also reported: the longest gap between two
consecutive acknowledgements around the kill. Medians over the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time

import walkit


def one_run(cluster: walkit.LocalCluster, client: walkit.Client, args) -> dict:
    writer = client.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum, password=b"bench")
    payload = os.urandom(args.size)
    window = threading.Semaphore(args.window)
    acks: list[float] = []
    lock = threading.Lock()
    state = {"kill_at": None, "first_after": None, "submitted_after_kill": None}

    def on_ack(future) -> None:
        window.release()
        entry_id = future.result()
        now = time.perf_counter()
        with lock:
            acks.append(now)
            boundary = state["submitted_after_kill"]
            if boundary is not None and entry_id >= boundary and state["first_after"] is None:
                state["first_after"] = now

    victim = writer.metadata.current_ensemble[0]
    submitted = 0
    deadline = time.perf_counter() + args.seconds
    while time.perf_counter() < deadline or state["first_after"] is None:
        window.acquire()
        if submitted == args.kill_after:
            cluster.kill_bookie(cluster.addresses.index(victim))
            state["kill_at"] = time.perf_counter()
            state["submitted_after_kill"] = submitted
        writer.append_async(payload).add_done_callback(on_ack)
        submitted += 1
        if time.perf_counter() > deadline + 30:
            raise RuntimeError("appends did not resume within 30 s of the kill")
    writer.close()
    kill_at = state["kill_at"]
    around = [b - a for a, b in zip(acks, acks[1:]) if a >= kill_at - 1 and b <= kill_at + 5]
    return {"recovery_ms": (state["first_after"] - kill_at) * 1000,
            "max_gap_ms": max(around, default=0.0) * 1000,
            "fragments": len(client.ledger_metadata(writer.ledger_id).ensembles)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--ensemble", "-e", type=int, default=3)
    parser.add_argument("--write-quorum", "-w", type=int, default=2)
    parser.add_argument("--ack-quorum", "-a", type=int, default=2)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--window", type=int, default=200)
    parser.add_argument("--kill-after", type=int, default=3000, help="appends submitted before the kill")
    parser.add_argument("--seconds", type=float, default=1.0, help="keep appending this long")
    parser.add_argument("--storage", default="memory")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    runs = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as data_dir, \
                walkit.LocalCluster(bookies=args.ensemble + 2, data_dir=data_dir, storage=args.storage) as cluster, \
                walkit.Client(cluster.metadata_url) as client:
            runs.append(one_run(cluster, client, args))
    median = {k: statistics.median(r[k] for r in runs) for k in ("recovery_ms", "max_gap_ms")}
    print(f"bookie SIGKILL under pipelined appends (E{args.ensemble}/Qw{args.write_quorum}/Qa{args.ack_quorum}, "
          f"{args.size} B, window {args.window}, {args.storage} storage), median of {args.runs} runs:")
    each = ", ".join(f"{r['recovery_ms']:.1f}" for r in runs)
    print(f"  kill -> appends flowing again: {median['recovery_ms']:.1f} ms (runs: {each})")
    print(f"  longest gap between acknowledgements: {median['max_gap_ms']:.1f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "median": median, "runs": runs}, f, indent=2)


if __name__ == "__main__":
    main()
