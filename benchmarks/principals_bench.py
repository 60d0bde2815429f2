"""What principal mode costs: a ledger's creation and a log's roll, as the cluster's user and as a principal.

    python benchmarks/principals_bench.py --rounds 30 [--json out.json]

In principal mode (docs/operations/security.md#zookeeper-principals and #etcd-principals) a
principal's store has the bookies create and delete ledgers and logs (etcd: the agent, which
also draws ledger ids) and carry out a grantee's changes of what it does not own (ZooKeeper's
reaper and etcd's agent). This measures, on a real ZooKeeper and a real etcd with
authentication, each with three CurveZMQ bookies on loopback (storage in memory, so no fsync of
entries):

- `create`: `create_ledger` plus `close` of an empty ledger, by the same key, once through the
  cluster's metadata user (as before principal mode) and once through its own principal user;
- `roll`: `LogWriter.roll` by the log's owner, and by a principal with a `write` grant on it
  (whose change of the log's metadata goes through the bookies).

Medians and p90 over `--rounds`, after one untimed round; both columns of a row in one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import walkit
from walkit import security
from walkit.local import LocalCluster
from walkit.testing.servers import SecuredEtcdServer, ZooKeeperServer, with_user

ROOT_PASSWORD = "root-s3cret"


def timed(action, rounds: int) -> dict[str, float]:
    """timed runs `action` once untimed, then `rounds` times; it returns the median and p90 in ms."""
    action()
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        action()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return {"median_ms": statistics.median(samples), "p90_ms": samples[int(0.9 * (len(samples) - 1))]}


def measure(kind: str, cluster_url: str, principal_url, folder: Path, rounds: int) -> dict[str, dict]:
    """measure runs the rows on one store: `principal_url(name, password_file)` is a principal's own URI."""
    def walkit_cli(*args: str) -> None:
        subprocess.run([sys.executable, "-m", "walkit", *args, "--metadata", cluster_url], check=True,
                       capture_output=True, timeout=120)

    keys = {}
    for name in ("owner", "grantee"):
        _, secret = security.new_keys(str(folder), name)
        keys[name] = secret
        walkit_cli("clients", "allow", security.principal_of(secret), "--name", name,
                   "--metadata-password-file", str(folder / f"{name}.pw"))

    def client(name: str, own: bool) -> walkit.Client:
        url = principal_url(security.principal_of(keys[name]), folder / f"{name}.pw") if own else cluster_url
        return walkit.Client(url, key=keys[name], timeout=10)

    def create(c: walkit.Client):
        return lambda: c.create_ledger(3, 2, 2, password=b"pw").close()

    rows: dict[str, dict] = {}
    with client("owner", False) as as_cluster, client("owner", True) as as_principal:
        rows["create"] = {"cluster user": timed(create(as_cluster), rounds),
                          "principal user": timed(create(as_principal), rounds)}
        writer = as_principal.open_log("rolled")
        writer.append(b"x")
        rows["roll"] = {"owner": timed(writer.roll, rounds)}
        writer.close()
    walkit_cli("acl", "grant", security.principal_of(keys["grantee"]), "write", "log", "rolled")
    with client("grantee", True) as grantee:
        writer = grantee.open_log("rolled")
        writer.append(b"x")
        rows["roll"]["write grantee"] = timed(writer.roll, rounds)
        writer.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="principals-bench-") as scratch:
        folder = Path(scratch)
        with ZooKeeperServer() as zk:
            url = with_user(zk.url("/bench", timeout=10), "walkit", "cluster-s3cret")
            with LocalCluster(bookies=3, data_dir=str(folder / "zk"), storage="memory", metadata=url, security=True):
                (folder / "zk-keys").mkdir()
                results["zookeeper"] = measure("zk", url, lambda p, f: with_user(zk.url("/bench", timeout=10), p)
                                               + f"&password_file={f}", folder / "zk-keys", args.rounds)
        with SecuredEtcdServer(ROOT_PASSWORD) as etcd:
            url = with_user(etcd.url("/bench", timeout=10), "root", ROOT_PASSWORD)
            with LocalCluster(bookies=3, data_dir=str(folder / "etcd"), storage="memory", metadata=url,
                              security=True):
                (folder / "etcd-keys").mkdir()
                results["etcd"] = measure("etcd", url, lambda p, f: with_user(etcd.url("/bench", timeout=10), p)
                                          + f"&password_file={f}", folder / "etcd-keys", args.rounds)
    print("| store | row | who | median ms | p90 ms |\n|---|---|---|---:|---:|")
    for store, rows in results.items():
        for row, columns in rows.items():
            for who, value in columns.items():
                print(f"| {store} | {row} | {who} | {value['median_ms']:.1f} | {value['p90_ms']:.1f} |")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)


if __name__ == "__main__":
    main()
