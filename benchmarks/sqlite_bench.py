"""benchmarks/sqlite_bench.py: small transactions per second through walkit.adapters.sqlite vs plain sqlite3.

    python benchmarks/sqlite_bench.py [--transactions 2000] [--threads 1,4] [--runs 3] [--json out.json]

Cluster: 3 bookie processes on one disk (files storage: a bookie syncs before it acknowledges),
SQLite metadata; the replicated database has a leader in this process and a follower in a
process of its own (`walkit sqlite replica`), as on two machines, so the follower's applying
does not share the leader's GIL (benchmarks/replicate_bench.py does the same) (E3/Qw2/Qa2). Each transaction inserts one row of ~40 bytes and commits (`conn.commit()`); the
COMMIT returns once the log acknowledged it and the leader applied it. The peer is the standard
sqlite3 module on the same disk, WAL with synchronous=FULL (an fsync per COMMIT), no
replication. Both run in the same invocation, `--runs` times each; medians and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import walkit
import walkit.adapters.sqlite as wsqlite


def run_transactions(connect, transactions: int, threads: int, commits: list[float] | None = None) -> float:
    """run_transactions commits `transactions` one-row transactions from `threads` threads; it returns tx/s.

    With `commits`, each COMMIT's duration in seconds is added to it (the INSERT before it not counted).
    """
    per_thread = transactions // threads
    barrier = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def work(k: int) -> None:
        conn = connect()
        try:
            barrier.wait()
            for i in range(per_thread):
                conn.execute("INSERT INTO events(thread, n, body) VALUES (?, ?, ?)", (k, i, "x" * 32))
                started = time.perf_counter()
                conn.commit()
                if commits is not None:
                    commits.append(time.perf_counter() - started)
        except BaseException as exc:  # noqa: BLE001 - reported after the run
            errors.append(exc)
        finally:
            conn.close()
    workers = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for worker in workers:
        worker.start()
    barrier.wait()
    started = time.perf_counter()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return per_thread * threads / elapsed


def plain(directory: str, run: int | str, transactions: int, threads: int) -> float:
    path = os.path.join(directory, f"plain-{threads}-{run}.db")
    setup = sqlite3.connect(path)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.execute("CREATE TABLE events(id INTEGER PRIMARY KEY, thread, n, body)")
    setup.commit()
    setup.close()

    def connect():
        conn = sqlite3.connect(path, timeout=30)
        conn.execute("PRAGMA synchronous=FULL")
        return conn
    return run_transactions(connect, transactions, threads)


def replicated(directory: str, url: str, run: int | str, transactions: int, threads: int,
               commits: list[float] | None = None, group_commit: bool = True) -> float:
    name = f"bench-{threads}-{run}"
    leader_path = os.path.join(directory, f"{name}-leader.db")
    follower_path = os.path.join(directory, f"{name}-follower.db")
    leader = wsqlite.connect(leader_path, name=name, client=walkit.Client(url), node_id="leader",
                             check_same_thread=False)
    follower = None
    try:
        leader.execute("CREATE TABLE events(id INTEGER PRIMARY KEY, thread, n, body)")
        follower = subprocess.Popen([sys.executable, "-m", "walkit", "sqlite", "replica", name, follower_path,
                                     "--metadata", url, "--node-id", "follower"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        started = follower.stderr.readline()            # "replica of NAME in FILE: ...": it is a node now
        if not started.startswith("replica of"):
            raise RuntimeError(f"walkit sqlite replica did not start: {started}{follower.stderr.read()}")
        rate = run_transactions(lambda: wsqlite.connect(leader_path, name=name, group_commit=group_commit),
                                transactions, threads, commits)
        expected = transactions // threads * threads
        deadline = time.monotonic() + 60
        while _count(follower_path) != expected:        # the follower applied every transaction
            if time.monotonic() > deadline or follower.poll() is not None:
                raise RuntimeError(f"the follower has {_count(follower_path)} rows of {expected}")
            time.sleep(0.05)
        return rate
    finally:
        if follower is not None:
            follower.terminate()
            follower.wait(30)
            follower.stderr.close()
        leader.close()


def _count(path: str) -> int | None:
    """_count is the follower file's row count as the sqlite3 module reads it (None before the table exists)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    try:
        return db.execute("SELECT count(*) FROM events").fetchone()[0]
    except sqlite3.OperationalError:
        return None
    finally:
        db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=2000)
    parser.add_argument("--threads", default="1,4", help="comma-separated thread counts")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="walkit-sqlite-bench-") as directory:
        with walkit.LocalCluster(bookies=3, data_dir=os.path.join(directory, "cluster"), storage="files") as cluster:
            for threads in (int(t) for t in args.threads.split(",")):
                ours, theirs = [], []
                for run in range(args.runs):
                    theirs.append(plain(directory, run, args.transactions, threads))
                    ours.append(replicated(directory, cluster.metadata_url, run, args.transactions, threads))
                row = {"threads": threads, "walkit_tps": statistics.median(ours),
                       "sqlite3_full_tps": statistics.median(theirs), "runs": args.runs,
                       "walkit_all": ours, "sqlite3_all": theirs}
                row["ratio"] = row["walkit_tps"] / row["sqlite3_full_tps"]
                results.append(row)
                print(f"{threads} thread(s): walkit {row['walkit_tps']:,.0f} tx/s (replicated, 1 follower process), "
                      f"sqlite3 synchronous=FULL {row['sqlite3_full_tps']:,.0f} tx/s; ratio {row['ratio']:.2f}",
                      flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
