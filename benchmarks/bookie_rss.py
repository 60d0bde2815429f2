"""A bookie's memory and restart time as its stored entries grow to a million.

    python benchmarks/bookie_rss.py --entries 1000000 --size 100

Runs one bookie process (files storage), appends `--entries` entries of `--size` bytes to it
through a client (E1/Qw1/Qa1, pipelined) and samples the bookie's resident memory (VmRSS) as it
goes. Then it measures restart time twice: after a clean stop (SIGTERM: the storage checkpoints
on close) and after SIGKILL (the journal tail since the last checkpoint is replayed). Restart
time after a clean stop is from process start to the bookie serving (its log line); after a
kill, the storage's open time (which includes the replay) is what a restart adds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import threading
import time
from datetime import datetime

import walkit
from walkit.plugins import open_storage


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def serving_delay(log_path: str, since: float) -> float:
    """serving_delay is seconds from `since` to the newest 'serving' line of a bookie log."""
    served = []
    with open(log_path) as f:
        for line in f:
            match = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})", line)
            if match and " serving " in line:
                served.append(datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return served[-1] - since


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--window", type=int, default=2000)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    result: dict = {"entries": args.entries, "size": args.size, "rss_mb": []}
    with tempfile.TemporaryDirectory(dir=os.environ.get("WALKIT_BENCH_DIR")) as data_dir, \
            walkit.LocalCluster(bookies=1, data_dir=data_dir, storage="files") as cluster:
        pid = cluster.pid(0)
        with walkit.Client(cluster.metadata_url) as client:
            writer = client.create_ledger(1, 1, 1)
            payload = os.urandom(args.size)
            window = threading.Semaphore(args.window)
            step = max(1, args.entries // 10)
            result["rss_mb"].append((0, rss_mb(pid)))
            started = time.perf_counter()
            for i in range(args.entries):
                window.acquire()
                writer.append_async(payload).add_done_callback(lambda f: window.release())
                if (i + 1) % step == 0:
                    result["rss_mb"].append((i + 1, rss_mb(pid)))
            writer.close()
            result["append_s"] = time.perf_counter() - started
        result["rss_mb"].append((args.entries, rss_mb(pid)))
        storage_uri = cluster._bookies[0].storage

        cluster.kill_bookie(0)                     # right after the writes: the journal tail is replayed
        opened = time.perf_counter()
        storage = open_storage(storage_uri)
        result["storage_open_after_kill_s"] = time.perf_counter() - opened
        result["replayed_records_after_kill"] = getattr(storage, "replayed_records", None)
        storage.close()
        cluster.start_bookie(0)

        cluster.stop_bookie(0)                     # SIGTERM: the storage checkpoints on close
        opened = time.perf_counter()
        open_storage(storage_uri).close()
        result["storage_open_after_clean_stop_s"] = time.perf_counter() - opened
        began = time.time()
        cluster.start_bookie(0)
        result["restart_after_clean_stop_s"] = serving_delay(os.path.join(data_dir, "bookie-0.log"), began)
    for entries, mb in result["rss_mb"]:
        print(f"  {entries:>9,} entries stored: bookie RSS {mb:7.1f} MB")
    print(f"appending took {result['append_s']:.1f} s ({args.entries / result['append_s']:,.0f} entries/s)")
    print(f"restart after a clean stop: storage open {result['storage_open_after_clean_stop_s'] * 1000:.0f} ms, "
          f"process start to serving {result['restart_after_clean_stop_s'] * 1000:.0f} ms")
    print(f"after SIGKILL: storage open with journal replay {result['storage_open_after_kill_s'] * 1000:.0f} ms "
          f"({result['replayed_records_after_kill']} records replayed)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
