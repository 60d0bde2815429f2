"""benchmarks/peers_bench.py runs what a user might pick instead of walkit through walkit's bench harness.

    python benchmarks/peers_bench.py --peers etcd,etcd-go,nats,zookeeper [walkit bench's options]

It runs `walkit bench`'s phases (same options, same output), then each peer, and prints a table
of ratios. It lives here, not in the installed walkit, because it starts other systems' servers.

Each peer starts on loopback, gets the same payload size, entry count and in-flight window as
walkit, and is measured by the same `pipelined` driver (entries/s, latency percentiles):

- etcd with 3 members (Debian's etcd-server): puts over gRPC, as etcd's own clients send them
  (grpcio, the C-core Python gRPC client, with PutRequests encoded by hand so no protobuf
  code runs per put; `window` puts in flight over 4 HTTP/2 connections), the fastest client a
  Python user has. Without grpcio, puts go through the v3 JSON gateway over keep-alive HTTP
  connections (one request in flight per connection; at most 64 connections), which is slower;
- etcd-go: a 3-member etcd of its own driven by etcd's own Go client, through the only benchmark of it
  that Debian ships, ``etcdctl check perf --load xl`` (package etcd-client): 1,000 clients for
  60 s with 1 KiB values and 256-byte keys, offered up to 15,000 puts/s, more than any etcd
  takes here. Its load is fixed, so it runs once whatever `runs` says, ignores `size`,
  `entries` and `window`, and reports throughput only (no latency percentiles);
- NATS JetStream, a 3-node cluster with a stream of 3 replicas (Debian's nats-server, nats-py):
  note that JetStream acknowledges a publish once replicated in memory, BEFORE its fsync (its
  default sync interval is 2 minutes), so it is not durable in the sense walkit is;
- ZooKeeper (Debian's zookeeper, one server with forceSync) sequential znodes created with
  kazoo's asynchronous API.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import click

from walkit.bench import BenchConfig, pipelined, summary_lines
from walkit.cli import bench as walkit_bench
from walkit.cli.common import friendly
from walkit.errors import ConfigError
from walkit.local import free_port

PEERS = ("etcd", "etcd-go", "nats", "zookeeper")


_BENCH_EXTRA = "pip install 'walkit[bench]'"


def module_missing(module: str, package: str) -> str | None:
    """module_missing says what to install when Python cannot import `module` (of package `package`), else None."""
    import importlib.util
    if importlib.util.find_spec(module) is None:
        return f"the Python package {package} is not installed ({_BENCH_EXTRA})"
    return None


def nats_missing() -> str | None:
    """nats_missing says what to install when nats-server or nats-py is missing (both, if both are), else None."""
    server = "nats-server is not installed (Debian: apt-get install nats-server)" if shutil.which("nats-server") is None \
        else None
    return "; ".join(why for why in (server, module_missing("nats", "nats-py")) if why) or None


def _etcd_go_missing() -> str | None:
    from walkit.testing.servers import etcd_missing
    if shutil.which("etcdctl") is None:
        return "etcdctl is not installed (Debian: apt-get install etcd-client)"
    return etcd_missing()


def _zookeeper_missing() -> str | None:
    from walkit.testing.servers import zookeeper_missing
    return zookeeper_missing() or module_missing("kazoo", "kazoo")


def check_peers(names: list[str]) -> None:
    """check_peers raises ConfigError for an unknown peer or one whose server or client is not installed.

    `main` calls it before walkit's phases, so a missing peer fails at once, not after them.
    """
    from walkit.testing.servers import etcd_missing
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        raise ConfigError(f"unknown peer(s) {', '.join(unknown)}; choose from {', '.join(PEERS)}")
    checks = {"etcd": etcd_missing, "etcd-go": _etcd_go_missing, "nats": nats_missing,
              "zookeeper": _zookeeper_missing}
    missing = [f"{name}: {why}" for name in names if (why := checks[name]())]
    if missing:
        raise ConfigError("cannot run peer(s): " + "; ".join(missing))


def run_peers(names: list[str], config: BenchConfig) -> dict:
    """run_peers benchmarks each named peer with `config`'s size, entries and window."""
    check_peers(names)
    results = {}
    for name in names:
        if name == "etcd-go":                     # a fixed 60 s load: one run
            results[name] = _etcd_go(config)
            continue
        runner = {"etcd": _etcd, "nats": _nats, "zookeeper": _zookeeper}[name]
        runs = [runner(config) for _ in range(config.runs)]
        best = sorted(runs, key=lambda r: r["entries_per_s"])[len(runs) // 2]     # the median run
        results[name] = {k: v for k, v in best.items() if k != "latencies"}
    return results


# -- etcd ---------------------------------------------------------------------------------------
def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _put_request(key: bytes, value: bytes) -> bytes:
    """_put_request encodes etcdserverpb.PutRequest{key = 1, value = 2} in protobuf's wire format."""
    return b"\x0a" + _varint(len(key)) + key + b"\x12" + _varint(len(value)) + value


def _etcd(config: BenchConfig) -> dict:
    try:
        import grpc
    except ImportError:
        return _etcd_http(config)
    from walkit.testing.servers import EtcdCluster
    payload = os.urandom(config.size)
    with tempfile.TemporaryDirectory(prefix="bench-etcd-", dir=config.data_dir) as folder, \
            EtcdCluster(members=3, data_dir=folder) as cluster:
        channels = [grpc.insecure_channel(cluster.addresses[0], options=[("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(4)]
        try:
            puts = [c.unary_unary("/etcdserverpb.KV/Put") for c in channels]     # bytes in, bytes out
            puts[0](_put_request(b"bench/warm-up", payload), timeout=30)
            result = pipelined(lambda i: puts[i % 4].future(_put_request(b"bench/%012d" % i, payload), timeout=60),
                               config.entries, config.window)
        finally:
            for channel in channels:
                channel.close()
        return {**result, "fsync": True, "note": f"3 members; gRPC puts (grpcio), {config.window} in flight "
                "over 4 HTTP/2 connections"}


#: etcdctl check perf's load: clients, the most puts/s offered, seconds (etcdctl/ctlv3/command/check.go).
ETCD_GO_LOAD = ("xl", 1000, 15_000, 60)


def parse_check_perf(output: str) -> dict:
    """parse_check_perf reads `etcdctl check perf`'s verdict lines: writes/s, slowest and stddev (seconds).

    It raises RuntimeError if the throughput line is missing (the check did not run to its end).
    """
    found = re.search(r"Throughput (?:is|too low:) (\d+) writes/s", output)
    if found is None:
        raise RuntimeError(f"etcdctl check perf printed no throughput: {output[-500:]!r}")
    result = {"entries_per_s": float(found.group(1))}
    for name, pattern in (("slowest_s", r"Slowest request took (?:too long: )?([0-9.]+)s"),
                          ("stddev_s", r"Stddev (?:is|too high:) ([0-9.]+)s")):
        match = re.search(pattern, output)
        if match is not None:
            result[name] = float(match.group(1))
    return result


def _etcd_go(config: BenchConfig) -> dict:
    from walkit.testing.servers import EtcdCluster
    load, clients, offered, seconds = ETCD_GO_LOAD
    with tempfile.TemporaryDirectory(prefix="bench-etcd-", dir=config.data_dir) as folder, \
            EtcdCluster(members=3, data_dir=folder) as cluster:
        done = subprocess.run(["etcdctl", "--endpoints", ",".join(cluster.addresses), "check", "perf",
                               "--load", load], capture_output=True, text=True, timeout=seconds + 120,
                              env={**os.environ, "ETCDCTL_API": "3"})
    result = parse_check_perf(done.stdout + done.stderr)   # its exit status says only whether the load was met
    result.update(entries=int(result["entries_per_s"] * seconds), seconds=float(seconds), fsync=True,
                  note=f"3 members; etcd's own Go client: etcdctl check perf --load {load} ({clients:,} clients "
                       f"for {seconds} s, 1 KiB values, 256 B keys, up to {offered:,} puts/s offered; one run)")
    return result


def _etcd_http(config: BenchConfig) -> dict:
    from walkit.testing.servers import EtcdCluster
    payload = base64.b64encode(os.urandom(config.size)).decode()
    with tempfile.TemporaryDirectory(prefix="bench-etcd-", dir=config.data_dir) as folder, \
            EtcdCluster(members=3, data_dir=folder) as cluster:
        host, port = cluster.addresses[0].rsplit(":", 1)
        local = threading.local()

        def put(i: int) -> None:
            connection = getattr(local, "connection", None)
            if connection is None:
                connection = local.connection = http.client.HTTPConnection(host, port, timeout=30)
            body = json.dumps({"key": base64.b64encode(f"bench/{i:012d}".encode()).decode(), "value": payload})
            connection.request("POST", "/v3/kv/put", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"etcd put failed: HTTP {response.status}")

        connections = min(config.window, 64)
        with ThreadPoolExecutor(max_workers=connections) as pool:
            result = pipelined(lambda i: pool.submit(put, i), config.entries, connections)
        return {**result, "fsync": True, "note": f"3 members; Python threads over {connections} keep-alive HTTP "
                "connections to the v3 JSON gateway (etcd's Go client is faster)"}


# -- NATS JetStream -----------------------------------------------------------------------------
async def _ignore(error: Exception) -> None:
    """_ignore swallows nats-py's error callbacks (refused connects while the cluster forms)."""


def _nats(config: BenchConfig) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-nats-", dir=config.data_dir) as folder:
        return _nats_in(config, folder)


def _nats_in(config: BenchConfig, folder: str) -> dict:
    import nats
    ports = [(free_port(), free_port()) for _ in range(3)]
    routes = ",".join(f"nats-route://127.0.0.1:{cluster}" for _, cluster in ports)
    processes = []
    try:
        for i, (client_port, cluster_port) in enumerate(ports):
            conf = os.path.join(folder, f"n{i}.conf")
            with open(conf, "w") as f:
                f.write(f'server_name: n{i}\nlisten: 127.0.0.1:{client_port}\n'
                        f'jetstream {{ store_dir: "{folder}/n{i}" }}\n'
                        f'cluster {{ name: bench\n listen: 127.0.0.1:{cluster_port}\n routes: [{routes}] }}\n')
            processes.append(subprocess.Popen(["nats-server", "-c", conf], stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL))
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        payload = os.urandom(config.size)

        async def connect():
            deadline = time.monotonic() + 30
            while True:
                try:
                    connection = await nats.connect(f"nats://127.0.0.1:{ports[0][0]}", max_reconnect_attempts=0,
                                                    error_cb=_ignore, allow_reconnect=False)
                    js = connection.jetstream()
                    await js.add_stream(name="BENCH", subjects=["bench"], num_replicas=3)
                    return connection, js
                except Exception:  # noqa: BLE001 - the cluster is still forming
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)

        connection, js = asyncio.run_coroutine_threadsafe(connect(), loop).result(60)

        def publish(i: int) -> Future:
            return asyncio.run_coroutine_threadsafe(js.publish("bench", payload), loop)

        try:
            result = pipelined(publish, config.entries, config.window)
        finally:
            asyncio.run_coroutine_threadsafe(connection.close(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
        return {**result, "fsync": False, "note": "3-node cluster, stream R3, nats-py; acks BEFORE fsync"}
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(10)


# -- ZooKeeper ----------------------------------------------------------------------------------
def _zookeeper(config: BenchConfig) -> dict:
    from kazoo.client import KazooClient
    from walkit.testing.servers import ZooKeeperServer
    payload = os.urandom(config.size)
    with tempfile.TemporaryDirectory(prefix="bench-zk-", dir=config.data_dir) as folder, \
            ZooKeeperServer(data_dir=folder) as server:
        client = KazooClient(hosts=f"127.0.0.1:{server.port}")
        client.start(timeout=30)
        client.ensure_path("/bench")
        try:
            def create(i: int) -> Future:
                future: Future = Future()
                result = client.create_async("/bench/e-", payload, sequence=True)

                def settle(async_result) -> None:
                    try:
                        future.set_result(async_result.get())
                    except Exception as exc:  # noqa: BLE001 - reported by the driver
                        future.set_exception(exc)
                result.rawlink(settle)
                return future

            result = pipelined(create, config.entries, config.window)
        finally:
            client.stop()
            client.close()
        return {**result, "fsync": True, "note": "one server (forceSync), sequential znodes, kazoo async"}


# -- the command --------------------------------------------------------------------------------
@click.command(params=[p for p in walkit_bench.bench.params if p.name != "peers"],
               context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--peers", required=True, metavar="LIST",
              help="Comma-separated etcd,etcd-go,nats,zookeeper (etcd-go: etcd's own Go client through "
                   "`etcdctl check perf`, a fixed 60 s load).")
@friendly
def main(peers, json_path, plot_path, **options) -> None:
    """Run `walkit bench`'s phases, then the same appends on each of --peers, and print the ratios.

    etcd (3 members, over gRPC), NATS JetStream (R3) and ZooKeeper run the same appends, back to
    back, through the same driver; etcd-go drives such an etcd cluster with etcd's own Go client
    instead (`etcdctl check perf --load xl`, Debian's etcd-client: its own fixed load of 1 KiB puts
    from 1,000 clients for 60 s). A peer that is not installed is refused before walkit's phases.
    """
    config = walkit_bench.bench_config(**options)
    names = [p.strip() for p in peers.split(",") if p.strip()]
    check_peers(names)                      # before walkit's phases: a missing peer fails at once
    result = walkit_bench.run_walkit(config)
    try:
        result["peers"] = run_peers(names, config)
    except BaseException:
        click.echo("a peer failed; walkit's own results:", err=True)     # minutes of work, kept
        for line in summary_lines(result):
            click.echo(line, err=True)
        raise
    walkit_bench.report(result, json_path, plot_path)


if __name__ == "__main__":
    main()
