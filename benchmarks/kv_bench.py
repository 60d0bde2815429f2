"""redis-benchmark against `walkit kv serve` and against Redis with fsync on every write, side by side.

    python benchmarks/kv_bench.py -n 100000 -c 50 -d 3 [-P 16] --json kv_bench.json

Starts, in the same run and on 127.0.0.1 with free ports and their own temporary directories:
`walkit kv serve` on its embedded cluster (3 bookie processes, E3/Qw2/Qa2, files storage), and
Debian's redis-server with ``appendonly yes`` and ``appendfsync always`` (each write is in
the append-only file, fsynced, before it is answered: the closest Redis comes to walkit's
"acknowledged once a quorum of bookies synced it"). Then runs ``redis-benchmark -t set,get``
with the same -n/-c/-P/-d/-r against each and prints the requests/s of both and the ratio
walkit/redis. The machine is shared and noisy: compare figures from one run.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from walkit.local import free_port

TESTS = ("SET", "GET")


def wait_ready(port: int, process: subprocess.Popen, role: bytes | None, timeout: float = 60.0) -> None:
    """wait_ready polls the server with redis-cli until it answers (as `role`, if given)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"server on port {port} exited with status {process.returncode}")
        done = subprocess.run(["redis-cli", "-p", str(port), "ROLE"], capture_output=True, timeout=10)
        if done.returncode == 0 and (role is None or done.stdout.startswith(role)):
            return
        time.sleep(0.1)
    raise SystemExit(f"server on port {port} did not get ready within {timeout:g} s")


def benchmark(port: int, args) -> dict[str, float]:
    """benchmark runs redis-benchmark -t set,get once and returns requests/s per test."""
    command = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-t", "set,get", "-n", str(args.requests),
               "-c", str(args.clients), "-d", str(args.size), "-r", str(args.keyspace), "-P", str(args.pipeline),
               "--csv"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"redis-benchmark failed: {done.stderr}")
    rows = list(csv.reader(io.StringIO(done.stdout)))
    return {row[0]: float(row[1]) for row in rows[1:] if row and row[0] in TESTS}


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_servers(scratch: str) -> dict[str, tuple[subprocess.Popen, int, bytes | None]]:
    """start_servers starts `walkit kv serve` and redis-server (appendfsync always) under `scratch`.

    It returns {"walkit": ..., "redis": ...}, each (process, port, the ROLE reply `wait_ready` waits
    for); the caller waits for them and stops them.
    """
    walkit_port, redis_port = free_port(), free_port()
    redis_dir = os.path.join(scratch, "redis")
    os.makedirs(redis_dir)
    return {
        "walkit": (subprocess.Popen(
            [sys.executable, "-m", "walkit", "kv", "serve", "--port", str(walkit_port),
             "--data-dir", os.path.join(scratch, "walkit")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=scratch), walkit_port, b"master"),
        "redis": (subprocess.Popen(
            ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--dir", redis_dir,
             "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=redis_dir), redis_port, None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--requests", type=int, default=100_000, help="requests per test")
    parser.add_argument("-c", "--clients", type=int, default=50, help="parallel connections")
    parser.add_argument("-P", "--pipeline", type=int, default=1, help="requests pipelined per connection")
    parser.add_argument("-d", "--size", type=int, default=3, help="value size in bytes")
    parser.add_argument("-r", "--keyspace", type=int, default=100_000, help="random keys from this many")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args()
    for tool in ("redis-server", "redis-benchmark", "redis-cli"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (apt-get install redis-server redis-tools)")

    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="kv-bench-") as scratch:
        servers = start_servers(scratch)
        try:
            for name, (process, port, role) in servers.items():
                wait_ready(port, process, role)
            for name, (process, port, _) in servers.items():
                results[name] = benchmark(port, args)
        finally:
            for process, _, _ in servers.values():
                stop(process)

    ratio = {test: results["walkit"][test] / results["redis"][test] for test in TESTS}
    print(f"redis-benchmark -t set,get -n {args.requests} -c {args.clients} -P {args.pipeline} -d {args.size} "
          f"-r {args.keyspace}")
    print(f"{'test':6} {'walkit kv (req/s)':>18} {'redis aof always (req/s)':>25} {'walkit/redis':>13}")
    for test in TESTS:
        print(f"{test:6} {results['walkit'][test]:>18,.0f} {results['redis'][test]:>25,.0f} {ratio[test]:>13.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"params": {k: v for k, v in vars(args).items() if k != "json"}, "requests_per_s": results,
                       "ratio": ratio}, f, indent=2)


if __name__ == "__main__":
    main()
