"""Produce and consume throughput: walkit topics (Kafka protocol) vs Redis Streams vs NATS JetStream R1/R3.

    python benchmarks/topics_bench.py -n 20000 -s 1024 --runs 3 --json topics_bench.json

Starts, in one run, on 127.0.0.1 with free ports and temporary directories:

- `walkit topics serve` on its embedded cluster (3 bookie processes, files storage, ledgers
  E3/Qw2/Qa2), driven by confluent-kafka (librdkafka): an idempotent acks=all producer
  (linger.ms 5) and a consumer reading the topic from the beginning (from the broker's cache
  of recent batches, or with --cache-mb 0 from the bookies);
- Debian's redis-server with appendonly yes and appendfsync always (each write fsynced before
  it is answered), driven by redis-py: XADD pipelined 500 at a time, XREAD COUNT 1000;
- NATS JetStream (Debian's nats-server, nats-py): a single server with an R1 stream and a
  3-node cluster with an R3 stream; publishes pipelined 1000 at a time (each one acknowledged
  by the stream), then a pull consumer (no acks, like the others) fetching 1000 at a time. JetStream acknowledges
  before fsync (its default sync_interval), so it does less work per message than the others.

Each system gets `--runs` rounds on a fresh topic/stream; the medians are printed, with the
ratio walkit/peer. The machine is shared and noisy: compare figures from one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from walkit.local import free_port, stop_process


def wait_port(port: int, process: subprocess.Popen, timeout: float = 60.0) -> None:
    """wait_port waits until something accepts connections on `port` (the process must stay alive)."""
    import socket
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server on port {port} exited with status {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing listens on port {port} after {timeout:g} s")


def stop(processes) -> None:
    """stop terminates server processes (SIGTERM, then SIGKILL after 30 s)."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        stop_process(process, 30)           # already told to stop: it waits, then SIGKILLs


# -- walkit topics through confluent-kafka --------------------------------------------------
def start_broker(folder: str, cache_mb: float):
    """start_broker starts `walkit topics serve` on its embedded cluster under `folder`, its output to walkit.log.

    It returns (process, port, log file); the caller waits for the port, then stops the
    process and closes the log.
    """
    port = free_port()
    log = open(os.path.join(folder, "walkit.log"), "wb")
    process = subprocess.Popen([sys.executable, "-m", "walkit", "topics", "serve", "--port", str(port),
                                "--data-dir", os.path.join(folder, "walkit-data"), "--cache-mb", str(cache_mb)],
                               stdout=log, stderr=log)
    return process, port, log


def walkit_rounds(args, folder: str) -> list[tuple[float, float]]:
    """walkit_rounds measures (produce, consume) msg/s of walkit topics through confluent-kafka, per round."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    process, port, log = start_broker(folder, args.cache_mb)
    bootstrap = f"127.0.0.1:{port}"
    payload = os.urandom(args.size)
    results = []
    try:
        wait_port(port, process)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for round_ in range(args.runs):
            topic = f"bench-{round_}"
            admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(60)
            producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                                 "linger.ms": 5, "queue.buffering.max.messages": args.messages + 1})
            started = time.perf_counter()
            for _ in range(args.messages):
                producer.produce(topic, payload)
                producer.poll(0)
            assert producer.flush(300) == 0
            produced = time.perf_counter() - started
            consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{round_}",
                                 "auto.offset.reset": "earliest", "enable.auto.commit": False})
            consumer.subscribe([topic])
            first = None
            count = 0
            while count < args.messages:
                message = consumer.poll(1.0)
                if message is None or message.error() is not None:
                    continue
                first = first or time.perf_counter()
                count += 1
            consumed = time.perf_counter() - first
            consumer.close()
            results.append((args.messages / produced, args.messages / consumed))
    finally:
        stop([process])
        log.close()
    return results


# -- Redis Streams --------------------------------------------------------------------------
def redis_rounds(args, folder: str) -> list[tuple[float, float]]:
    """redis_rounds measures (produce, consume) msg/s of Redis Streams with appendfsync always, per round."""
    import redis
    port = free_port()
    process = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", folder,
                                "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    payload = os.urandom(args.size)
    results = []
    try:
        wait_port(port, process)
        client = redis.Redis(port=port)
        for round_ in range(args.runs):
            stream = f"bench-{round_}"
            started = time.perf_counter()
            for first in range(0, args.messages, 500):
                pipe = client.pipeline(transaction=False)
                for _ in range(min(500, args.messages - first)):
                    pipe.xadd(stream, {"v": payload})
                pipe.execute()
            produced = time.perf_counter() - started
            started = time.perf_counter()
            last, count = "0", 0
            while count < args.messages:
                for _, entries in client.xread({stream: last}, count=1000):
                    count += len(entries)
                    last = entries[-1][0]
            consumed = time.perf_counter() - started
            results.append((args.messages / produced, args.messages / consumed))
    finally:
        stop([process])
    return results


# -- NATS JetStream ---------------------------------------------------------------------------
def nats_servers(folder: str, nodes: int) -> tuple[list[subprocess.Popen], int]:
    """nats_servers starts `nodes` JetStream servers (a cluster if more than one); it returns them and a client port."""
    ports = [(free_port(), free_port()) for _ in range(nodes)]
    routes = ",".join(f"nats-route://127.0.0.1:{cluster}" for _, cluster in ports)
    processes = []
    for i, (client_port, cluster_port) in enumerate(ports):
        conf = os.path.join(folder, f"nats{nodes}-{i}.conf")
        cluster = (f'cluster {{ name: bench\n listen: 127.0.0.1:{cluster_port}\n routes: [{routes}] }}\n'
                   if nodes > 1 else "")
        with open(conf, "w") as f:
            f.write(f'server_name: n{nodes}-{i}\nlisten: 127.0.0.1:{client_port}\n'
                    f'jetstream {{ store_dir: "{folder}/nats{nodes}-{i}" }}\n{cluster}')
        processes.append(subprocess.Popen(["nats-server", "-c", conf], stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
    for (client_port, _), process in zip(ports, processes):
        wait_port(client_port, process)
    return processes, ports[0][0]


async def _nats_rounds(args, port: int, replicas: int) -> list[tuple[float, float]]:
    import nats
    payload = os.urandom(args.size)
    deadline = time.monotonic() + 60
    while True:
        try:
            connection = await nats.connect(f"nats://127.0.0.1:{port}")
            js = connection.jetstream()
            await js.add_stream(name="WARMUP", subjects=["warmup"], num_replicas=replicas)
            break
        except Exception:  # noqa: BLE001 - the cluster is still electing its meta leader
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
    results = []
    try:
        for round_ in range(args.runs):
            subject = f"bench{round_}"
            await js.add_stream(name=f"BENCH{round_}", subjects=[subject], num_replicas=replicas)
            started = time.perf_counter()
            for first in range(0, args.messages, 1000):
                await asyncio.gather(*(js.publish(subject, payload) for _ in range(min(1000, args.messages - first))))
            produced = time.perf_counter() - started
            from nats.js.api import AckPolicy, ConsumerConfig
            subscription = await js.pull_subscribe(subject, durable=f"reader{round_}",
                                                   config=ConsumerConfig(ack_policy=AckPolicy.NONE))
            started = time.perf_counter()
            count = 0
            while count < args.messages:
                messages = await subscription.fetch(1000, timeout=10)
                count += len(messages)
            consumed = time.perf_counter() - started
            results.append((args.messages / produced, args.messages / consumed))
    finally:
        await connection.close()
    return results


def nats_rounds(args, folder: str, nodes: int) -> list[tuple[float, float]]:
    """nats_rounds measures (produce, consume) msg/s of a JetStream stream with `nodes` replicas, per round."""
    processes, port = nats_servers(folder, nodes)
    try:
        return asyncio.run(_nats_rounds(args, port, nodes))
    finally:
        stop(processes)


def main() -> None:
    """main runs every system and prints the medians and the ratios walkit/peer."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--messages", type=int, default=20000, help="messages per round")
    parser.add_argument("-s", "--size", type=int, default=1024, help="payload bytes")
    parser.add_argument("--runs", type=int, default=3, help="rounds per system (medians are reported)")
    parser.add_argument("--cache-mb", type=float, default=32,
                        help="walkit's cache of recent batches per partition; 0 makes consumers read the bookies")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args()
    for tool in ("redis-server", "nats-server"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (Debian: apt-get install redis-server nats-server)")
    folder = tempfile.mkdtemp(prefix="topics-bench-")
    systems = {}
    try:
        systems["walkit topics (confluent-kafka, acks=all)"] = walkit_rounds(args, folder)
        systems["redis streams (appendfsync always)"] = redis_rounds(args, folder)
        systems["nats jetstream R1"] = nats_rounds(args, folder, 1)
        systems["nats jetstream R3"] = nats_rounds(args, folder, 3)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    medians = {name: (statistics.median(p for p, _ in rounds), statistics.median(c for _, c in rounds))
               for name, rounds in systems.items()}
    walkit_produce, walkit_consume = next(iter(medians.values()))
    print(f"{args.messages} messages of {args.size} bytes, median of {args.runs} rounds")
    print(f"{'system':45} {'produce msg/s':>14} {'consume msg/s':>14} {'walkit/peer p':>14} {'walkit/peer c':>14}")
    for name, (produce, consume) in medians.items():
        print(f"{name:45} {produce:14,.0f} {consume:14,.0f} {walkit_produce / produce:14.2f} "
              f"{walkit_consume / consume:14.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"messages": args.messages, "size": args.size, "runs": args.runs,
                       "rounds": systems, "medians": medians}, f, indent=2)


if __name__ == "__main__":
    main()
