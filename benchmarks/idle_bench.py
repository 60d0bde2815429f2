"""What an idle topics broker costs: CPU and metadata requests per second, with 1 and with N partitions.

    python benchmarks/idle_bench.py --partitions 1000 --window 60 --json idle_bench.json

Starts, on 127.0.0.1 with free ports and temporary directories: a real ZooKeeper (Debian's, via
walkit.testing.servers), three `walkit bookie` processes (files storage) and two
`walkit topics serve` brokers on that cluster. It creates a topic of one partition, waits until
it has a leader and every broker's node of it is quiet, and measures for `--window` seconds
with no client traffic:

- each broker's CPU (user + system seconds from /proc, as a share of one core);
- the requests ZooKeeper received (`Received:` of its `srvr` command, which counts every
  request of every client, session pings included) per second;
- the bookies' CPU.

Then it creates a topic of `--partitions` partitions and measures the same again. Every
partition is a walkit.replicate machine with a node on each broker: one leads, the other
follows (tails the log, stands ready to take over). The 1-partition figures are the baseline
of the same run; the ratio says what the extra partitions cost when nothing happens.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from walkit.local import LocalCluster, free_port
from walkit.testing.servers import ZooKeeperServer

sys.path.insert(0, os.path.dirname(__file__))
from topics_bench import wait_port  # noqa: E402  (the benchmarks' shared helpers)


def cpu_seconds(pid: int) -> float:
    """cpu_seconds is a process's user + system CPU time so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def zk_packets(port: int) -> int:
    """zk_packets is ZooKeeper's count of requests received so far (`Received:` of the `srvr` four-letter word)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"srvr")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    for line in data.decode().splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "Received":
            return int(value)
    raise SystemExit(f"ZooKeeper's srvr has no Received line: {data[:200]!r}")


def led_partitions(bootstrap: str, topic: str) -> int:
    """led_partitions counts the partitions of `topic` that have a leader, as kafka-python's metadata says."""
    from kafka import KafkaAdminClient
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    try:
        described = admin.describe_topics([topic])
    finally:
        admin.close()
    partitions = described[0]["partitions"]
    return sum(1 for p in partitions if p.get("leader", p.get("leader_id", -1)) >= 0)


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=120_000)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    finally:
        admin.close()


def measure(brokers: list[subprocess.Popen], bookies: list[int], zk_port: int, window: float) -> dict:
    """measure samples CPU and ZooKeeper's request count at the start and end of `window` seconds."""
    before = [cpu_seconds(b.pid) for b in brokers], [cpu_seconds(p) for p in bookies], zk_packets(zk_port)
    started = time.monotonic()
    time.sleep(window)                  # the measurement window: nothing else runs
    elapsed = time.monotonic() - started
    after = [cpu_seconds(b.pid) for b in brokers], [cpu_seconds(p) for p in bookies], zk_packets(zk_port)
    return {
        "broker_cpu_pct": [round(100 * (a - b) / elapsed, 2) for a, b in zip(after[0], before[0])],
        "bookies_cpu_pct": round(100 * (sum(after[1]) - sum(before[1])) / elapsed, 2),
        "zk_requests_per_s": round((after[2] - before[2]) / elapsed, 1),
    }


def settle(bootstrap: str, topic: str, partitions: int, quiet_s: float) -> float:
    """settle waits until every partition has a leader, then `quiet_s` more (followers caught up); it returns how long."""
    started = time.monotonic()
    deadline = started + 600
    while led_partitions(bootstrap, topic) < partitions:
        if time.monotonic() > deadline:
            raise SystemExit(f"{topic}: not every partition had a leader after 600 s")
        time.sleep(2)
    time.sleep(quiet_s)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--window", type=float, default=60.0, help="seconds measured, per phase")
    parser.add_argument("--rounds", type=int, default=3, help="windows per phase (medians reported)")
    parser.add_argument("--quiet", type=float, default=40.0, help="seconds waited after the last leader came")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="walkit-idle-")
    brokers: list[subprocess.Popen] = []
    results: dict = {"partitions": args.partitions, "window_s": args.window, "rounds": args.rounds}
    with ZooKeeperServer(os.path.join(workdir, "zk")) as zk:
        url = zk.url("/walkit-idle")
        with LocalCluster(bookies=3, data_dir=os.path.join(workdir, "cluster"), storage="files",
                          metadata=url) as cluster:
            bookie_pids = [cluster.pid(i) for i in range(3)]
            ports = [free_port(), free_port()]
            try:
                for i, port in enumerate(ports):
                    log = open(os.path.join(workdir, f"broker{i}.log"), "ab")
                    brokers.append(subprocess.Popen(
                        [sys.executable, "-m", "walkit", "topics", "serve", "--port", str(port), "--metadata", url,
                         "--no-auto-create"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
                for port, broker in zip(ports, brokers):
                    wait_port(port, broker, timeout=90.0)
                bootstrap = f"127.0.0.1:{ports[0]}"
                for phase, partitions in (("baseline", 1), ("many", args.partitions)):
                    topic = f"idle-{partitions}"
                    create_topic(bootstrap, topic, partitions)
                    took = settle(bootstrap, topic, partitions, args.quiet)
                    rounds = [measure(brokers, bookie_pids, zk.port, args.window) for _ in range(args.rounds)]
                    results[phase] = {
                        "partitions": partitions + (0 if phase == "baseline" else 1),
                        "settled_s": round(took, 1),
                        "broker_cpu_pct": [statistics.median(r["broker_cpu_pct"][i] for r in rounds) for i in range(2)],
                        "bookies_cpu_pct": statistics.median(r["bookies_cpu_pct"] for r in rounds),
                        "zk_requests_per_s": statistics.median(r["zk_requests_per_s"] for r in rounds),
                        "rounds": rounds,
                    }
                    print(json.dumps({phase: results[phase]}), flush=True)
            finally:
                for broker in brokers:
                    broker.terminate()
                for broker in brokers:
                    try:
                        broker.wait(60)
                    except subprocess.TimeoutExpired:
                        broker.kill()
    base, many = results["baseline"], results["many"]
    print(f"\nidle, medians of {args.rounds} windows of {args.window:g} s:")
    print(f"{'':24}{'1 partition':>14}{str(args.partitions + 1) + ' partitions':>18}")
    for i in range(2):
        print(f"{'broker %d CPU %% of a core' % i:24}{base['broker_cpu_pct'][i]:>14}{many['broker_cpu_pct'][i]:>18}")
    print(f"{'bookies CPU % (all 3)':24}{base['bookies_cpu_pct']:>14}{many['bookies_cpu_pct']:>18}")
    print(f"{'ZooKeeper requests/s':24}{base['zk_requests_per_s']:>14}{many['zk_requests_per_s']:>18}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    subprocess.run(["rm", "-rf", workdir], check=False)


if __name__ == "__main__":
    main()
