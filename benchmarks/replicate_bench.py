"""benchmarks/replicate_bench.py: walkit.replicate's submit throughput and failover time.

    python benchmarks/replicate_bench.py [--records 3000] [--runs 3] [--json out.json]

Cluster: 3 bookie processes (files storage, fsync), SQLite metadata; a replicated counter of 3
nodes (E3/Qw2/Qa2): the leader in this process, the two followers processes of their own
(tests/support/counter_node.py), as they would run on three machines. Throughput: 1, 8 and 64
threads each submitting records of 16 bytes to the leader and waiting for each result (group
commit shares log entries between them); records/s and the records per log entry, medians of
`--runs`. Failover: three node processes
(tests/support/counter_node.py) with 1 s metadata sessions; the leader is SIGKILLed while a
thread submits; the time from the kill to the first record acknowledged by the new leader,
median of `--runs`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import walkit

#: The counter node process the failover runs three of (a test harness shared with tests/replication).
COUNTER_NODE = str(Path(__file__).resolve().parent.parent / "tests" / "support" / "counter_node.py")


class Counter(walkit.StateMachine):
    """Counter counts records and the log entries they came in."""

    def __init__(self) -> None:
        self.value = 0
        self.entries = set()

    def apply(self, record, position):
        self.value += 1
        self.entries.add(position)
        return self.value

    def snapshot(self, out):
        out.write(str(self.value).encode())

    def restore(self, src):
        self.value = int(src.read())


def throughput(url: str, submitters: int, records: int, run: int | str, *, followers: int = 2,
               linger_ms: float = 0.0) -> tuple[float, float]:
    """throughput is (submits/s, records per log entry) of `submitters` threads on the leader, a node of this
    process; the `followers` are processes of their own (tests/support/counter_node.py), as on three
    machines, so their applying does not share this process's GIL with the leader. With none, the
    figure is the node's own path (on a 2-core machine the followers' reads of each entry take CPU
    from the bookies and the leader). `linger_ms` is the leader's (walkit.replicate's; 0, its default: off)."""
    name = f"bench-{submitters}-{run}"
    client = walkit.Client(url)
    leader = walkit.replicate(Counter(), client=client, name=name, node_id="n0", snapshot_every_records=0,
                              linger_ms=linger_ms)
    processes = []
    try:
        deadline = time.monotonic() + 30
        while not leader.is_leader:                # alone, it wins the first election
            if time.monotonic() > deadline:
                raise RuntimeError("no leader")
            time.sleep(0.01)
        for i in range(1, followers + 1):
            processes.append(subprocess.Popen([sys.executable, COUNTER_NODE, url, f"n{i}", os.devnull, name],
                                              stdout=subprocess.PIPE, text=True))
        for follower in processes:
            follower.stdout.readline()             # "listening PORT": its node is open
        per_thread = max(1, records // submitters)
        payload = b"x" * 14 + b":1"                # 16 bytes, a record the followers' counter reads

        def work() -> None:
            for _ in range(per_thread):
                leader.submit(payload)

        threads = [threading.Thread(target=work) for _ in range(submitters)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
        done = per_thread * submitters
        return done / elapsed, done / len(leader.machine.entries)
    finally:
        leader.close()
        client.close()
        for follower in processes:
            follower.terminate()
            follower.wait(10)


def failover(url: str, workdir: str) -> float:
    processes, bases = [], []
    for i in range(3):
        process = subprocess.Popen([sys.executable, COUNTER_NODE, url + "?ttl=1", f"n{i}",
                                    f"{workdir}/applied-{i}"], stdout=subprocess.PIPE, text=True)
        processes.append(process)
        bases.append(f"http://127.0.0.1:{int(process.stdout.readline().split()[1])}")

    def call(base: str, path: str, body: bytes | None = None):
        request = urllib.request.Request(base + path, data=body, method="POST" if body is not None else "GET")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    try:
        def leader(alive) -> int | None:
            for i in alive:
                try:
                    if call(bases[i], "/state")[1]["is_leader"]:
                        return i
                except OSError:
                    pass
            return None
        alive = [0, 1, 2]
        while (first := leader(alive)) is None:
            time.sleep(0.01)
        for k in range(50):
            call(bases[first], "/submit", f"warm{k}:1".encode())
        processes[first].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        alive.remove(first)
        k = 0
        while True:
            target = leader(alive)
            if target is not None:
                status, _ = call(bases[target], "/submit", f"after{k}:1".encode())
                k += 1
                if status == 200:
                    return time.monotonic() - killed
            time.sleep(0.005)
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
                process.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results: dict = {}
    with tempfile.TemporaryDirectory() as workdir:
        with walkit.LocalCluster(bookies=3, data_dir=f"{workdir}/cluster") as cluster:
            for submitters in (1, 8, 64):
                runs = [throughput(cluster.metadata_url, submitters, args.records, run) for run in range(args.runs)]
                rate = statistics.median(r for r, _ in runs)
                per_entry = statistics.median(e for _, e in runs)
                results[f"submitters_{submitters}"] = {"records_per_s": round(rate), "records_per_entry": per_entry}
                print(f"{submitters:3d} submitters: {rate:9.0f} records/s ({per_entry:.1f} records per log entry)")
            times = [failover(cluster.metadata_url, workdir) for _ in range(args.runs)]
            results["failover_s"] = statistics.median(times)
            print(f"failover (SIGKILL of the leader to the next acknowledged record, 1 s sessions): "
                  f"median {results['failover_s']:.2f} s of {[round(t, 2) for t in times]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
