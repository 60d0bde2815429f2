"""Ledger create + close per second on each metadata backend (SQLite, ZooKeeper, etcd).

    python benchmarks/metadata_bench.py --ledgers 500 --runs 5 --threads 1 --json out.json

One "ledger" is exactly the metadata work of `Client.create_ledger` followed by a writer's
close: `next_id` for the ledger id, `create` of the ledger's metadata
(walkit.core.metadata.LedgerMetadata.to_bytes under `ledger_key`), then a compare-and-swap
`put` of the CLOSED metadata at the version create returned. No bookie is involved.

ZooKeeper and etcd are the real Debian servers, started on 127.0.0.1 by walkit.testing.servers
(scripts/test.sh installs them); "etcd3" is a three-member etcd cluster on loopback. Every
server keeps its default durability (ZooKeeper and etcd fsync their logs; SQLite runs with
synchronous=FULL). Each of `--threads` threads has its own store (its own session), like
separate clients. The machine is shared and noisy, so figures are medians over `--runs` runs,
after one warm-up run.
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
from contextlib import ExitStack

from walkit.core.metadata import LEDGER_ID_COUNTER, LedgerMetadata, ledger_key
from walkit.plugins import open_metadata
from walkit.testing.servers import EtcdCluster, EtcdServer, ZooKeeperServer

BACKENDS = ("sqlite", "zk", "etcd", "etcd3")
BOOKIES = ("127.0.0.1:3181", "127.0.0.1:3182", "127.0.0.1:3183")


def percentile(sorted_values: list[float], q: float) -> float:
    """percentile returns the q-quantile (0..1) of already sorted values."""
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def create_and_close(store) -> None:
    """create_and_close does the metadata work of creating a ledger and closing it after 100 entries."""
    ledger_id = store.next_id(LEDGER_ID_COUNTER)
    metadata = LedgerMetadata(ledger_id=ledger_id, ensemble_size=3, write_quorum=2, ack_quorum=2,
                              ensembles={0: BOOKIES}, created_ms=int(time.time() * 1000))
    key = ledger_key(ledger_id)
    version = store.create(key, metadata.to_bytes())
    store.put(key, metadata.closed(99).to_bytes(), version)


def one_run(stores: list, ledgers: int) -> dict:
    """one_run creates and closes `ledgers` ledgers split over the stores' threads; returns the figures."""
    latencies: list[float] = []
    lock = threading.Lock()
    share = [ledgers // len(stores) + (i < ledgers % len(stores)) for i in range(len(stores))]

    def work(store, count: int) -> None:
        mine = []
        for _ in range(count):
            started = time.perf_counter()
            create_and_close(store)
            mine.append(time.perf_counter() - started)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=work, args=(s, n)) for s, n in zip(stores, share)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {"ledgers_per_s": ledgers / elapsed, "p50_ms": percentile(latencies, 0.5) * 1000,
            "p99_ms": percentile(latencies, 0.99) * 1000}


def backend_url(backend: str, stack: ExitStack, data_dir: str) -> str:
    """backend_url starts what `backend` needs (under `stack`) and returns its metadata URI."""
    if backend == "sqlite":
        return f"sqlite://{data_dir}/metadata.db"
    if backend == "zk":
        return stack.enter_context(ZooKeeperServer(os.path.join(data_dir, "zk"))).url("/bench")
    if backend == "etcd":
        return stack.enter_context(EtcdServer(os.path.join(data_dir, "etcd"))).url("/bench")
    if backend == "etcd3":
        return stack.enter_context(EtcdCluster(3, os.path.join(data_dir, "etcd3"))).url("/bench")
    raise SystemExit(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")


def bench(backend: str, args) -> dict:
    """bench measures one backend: a warm-up run, then `args.runs` runs; returns medians and runs."""
    with tempfile.TemporaryDirectory(prefix=f"walkit-bench-{backend}-") as data_dir, ExitStack() as stack:
        url = backend_url(backend, stack, data_dir)
        stores = [open_metadata(url) for _ in range(args.threads)]
        for store in stores:
            stack.callback(store.close)
        one_run(stores, min(50, args.ledgers))
        runs = [one_run(stores, args.ledgers) for _ in range(args.runs)]
    median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    return {"median": median, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="sqlite,zk,etcd", help=f"comma-separated, from {', '.join(BACKENDS)}")
    parser.add_argument("--ledgers", type=int, default=500, help="ledgers created and closed per run")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="concurrent clients, one store each")
    parser.add_argument("--json", default=None, help="write results to this file ('-' for stdout)")
    args = parser.parse_args()

    results = {name: bench(name, args) for name in args.backends.split(",")}
    print(f"ledger create + close (next_id, create, CAS put), {args.ledgers} ledgers per run, "
          f"{args.threads} thread(s), median of {args.runs} runs")
    print(f"  {'backend':<8} {'ledgers/s':>10} {'p50 ms':>8} {'p99 ms':>8}")
    for name, result in results.items():
        m = result["median"]
        print(f"  {name:<8} {m['ledgers_per_s']:>10,.0f} {m['p50_ms']:>8.2f} {m['p99_ms']:>8.2f}")
    document = {"config": {k: v for k, v in vars(args).items() if k != "json"}, "results": results}
    if args.json == "-":
        json.dump(document, sys.stdout, indent=2)
        print()
    elif args.json:
        with open(args.json, "w") as f:
            json.dump(document, f, indent=2)


if __name__ == "__main__":
    main()
