"""benchmarks/adapters.py: every adapter against its peer in one run, as a markdown table and a chart.

    python benchmarks/adapters.py [--rounds 3] [--scale 1] [--rows latency,kv,...] [--out DIR]
    python benchmarks/adapters.py --quick          # a short smoke run: one round at 1/20 the counts

Issue 48 item 6. Each group of rows starts its systems once, on 127.0.0.1 with free ports and
temporary directories, then runs `--rounds` rounds, each measuring walkit and its baseline back
to back; the table gives medians over rounds (the machine is shared and noisy). walkit always
runs 3 bookie processes, E3/Qw2/Qa2, files storage (a bookie fdatasyncs before it answers):

- latency: one append in flight (1 KiB) beside the floor of `benchmarks/latency_floor.py` (its
  three ZeroMQ servers in Python that fdatasync each entry, the hand-off to a client thread);
- pipelined: 1,000 appends of 1 KiB in flight, and the same entries through append_many in
  batches of 100 (absolute targets);
- replicate: walkit.replicate with 1, 8 and 64 threads submitting 16-byte records to the leader
  of 3 nodes (`benchmarks/replicate_bench.py`), beside one append in flight, 1 thread on a
  leader alone (the node's own path, without its followers' reads), and 64 threads with the
  2 ms `linger_ms` that `walkit kv serve` uses (walkit.replicate's default is 0: off);
- sqlite: one-row transactions through walkit.adapters.sqlite (a leader and a follower) from 1
  and 4 threads, beside the standard sqlite3 module in WAL mode with synchronous=FULL
  (`benchmarks/sqlite_bench.py`), 4 threads also with `group_commit=False` (each transaction
  alone, group commit's baseline), and 1 writer's commit beside one append in flight;
- kv: redis-benchmark -c 50 (SET, GET) and -c 50 -P 16 against `walkit kv serve` and against
  redis-server with appendonly yes and appendfsync always (`benchmarks/kv_bench.py`);
- topics: 100-byte records produced through confluent-kafka (acks=all, linger.ms=5) to `walkit
  topics serve` and consumed back, and the end-to-end latency of one record at a time (Kafka's
  EndToEndLatency tool: produce, poll until it arrives, linger.ms=0); beside Redis Streams (XADD
  with appendfsync always) and NATS JetStream R1 and R3 (`benchmarks/topics_bench.py`; JetStream
  acknowledges before it fsyncs).

A peer that is not installed is not a failure: its rows say "peer missing: install X". A group
that fails is reported on its rows ("failed: ...") and the others still run. The script
reports pass or miss per target and never asserts. It writes adapters.md (the table with the
date, machine and command), adapters.json (every round) and adapters.png (the chart; needs
matplotlib) into `--out`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

from adapters_report import GROUPS, Samples, build_rows, chart, markdown

ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Counts:
    """Counts is how much each measurement of a round does (`--scale` multiplies them all)."""

    appends_one: int = 2000          # one append in flight, and the floor
    appends: int = 50_000            # pipelined appends, and append_many's entries
    window: int = 1000
    batch: int = 100
    submits: tuple = ((1, 1000), (8, 4000), (64, 12_800))       # (submitters, records)
    transactions: tuple = ((1, 1000), (4, 2000))                # (writer threads, transactions)
    kv_requests: int = 100_000       # redis-benchmark -n at -c 50
    kv_requests_pipelined: int = 300_000                        # ... at -c 50 -P 16
    records: int = 100_000           # topics: produced, then consumed back
    e2e_records: int = 1000          # topics: one at a time

    def scaled(self, factor: float) -> "Counts":
        """scaled is these counts times `factor` (each at least a few, so every measurement runs)."""
        def n(value: int, least: int = 20) -> int:
            return max(least, int(value * factor))
        return Counts(appends_one=n(self.appends_one), appends=n(self.appends, self.window), window=self.window,
                      batch=self.batch, submits=tuple((s, n(r, s * 2)) for s, r in self.submits),
                      transactions=tuple((t, n(x, t * 10)) for t, x in self.transactions),
                      kv_requests=n(self.kv_requests, 1000), kv_requests_pipelined=n(self.kv_requests_pipelined, 1000),
                      records=n(self.records, 1000), e2e_records=n(self.e2e_records))


def say(message: str) -> None:
    """say prints progress to stderr (the table goes to stdout)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- latency, pipelined, replicate, sqlite: one LocalCluster in this process ----------------------
def core_rounds(groups: set[str], counts: Counts, rounds: int, samples: Samples, folder: str) -> None:
    """core_rounds measures the rows run from this process on one LocalCluster, round after round."""
    import walkit
    from walkit.bench import pipelined
    if "sqlite" in groups and importlib.util.find_spec("apsw") is None:
        samples.missing["sqlite"] = "missing: the Python package apsw (pip install 'walkit[sqlite]')"
        groups = groups - {"sqlite"}
    payload = os.urandom(1024)
    with walkit.LocalCluster(bookies=3, data_dir=os.path.join(folder, "cluster"), storage="files") as cluster, \
            walkit.Client(cluster.metadata_url) as client, contextlib.ExitStack() as stack:
        floor = None
        if "latency" in groups:
            import latency_floor
            floor = latency_floor.Floor(folder, sync=True)
            stack.callback(floor.close)
            latency_floor.timed(floor.handed_off, payload, 200)          # warm up, as latency_floor.py does

        def appends(count: int, window: int) -> dict:
            writer = client.create_ledger(3, 2, 2)
            try:
                return pipelined(lambda i: writer.append_async(payload), count, window)
            finally:
                writer.close()
        appends(counts.window, counts.window)                          # connections made, code warm
        for round_ in range(rounds):
            say(f"round {round_ + 1}/{rounds}: {', '.join(g for g in GROUPS if g in groups)}")
            if floor is not None:
                result = latency_floor.timed(floor.handed_off, payload, counts.appends_one)
                samples.add("floor.p50_ms", result["p50_ms"])
                samples.add("floor.p99_ms", result["p99_ms"])
            if groups & {"latency", "replicate", "sqlite"}:            # their baseline
                one = appends(counts.appends_one, 1)
                for key in ("p50_ms", "p99_ms"):
                    samples.add(f"append1.{key}", one[key])
                samples.add("append1.mean_ms", one["seconds"] / one["entries"] * 1000)
                samples.add("append1.per_s", one["entries_per_s"])
            if "pipelined" in groups:
                samples.add("append.per_s", appends(counts.appends, counts.window)["entries_per_s"])
                samples.add("append.many_per_s", _append_many(client, payload, counts))
            # A failure of walkit.replicate or SQLite marks its rows; the rest go on, round after round.
            if "replicate" in groups and not guarded(samples, ("replicate",), lambda: _replicate_round(
                    cluster.metadata_url, counts, round_, samples)):
                groups = groups - {"replicate"}
            if "sqlite" in groups and not guarded(samples, ("sqlite", "sqlite3"), lambda: _sqlite_round(
                    cluster.metadata_url, folder, counts, round_, samples)):
                groups = groups - {"sqlite"}


def _append_many(client, payload: bytes, counts: Counts) -> float:
    """_append_many is the entries/s of append_many in batches of `counts.batch`, ~`counts.window` in flight."""
    from walkit.bench import pipelined
    writer = client.create_ledger(3, 2, 2)
    records = [payload] * counts.batch
    calls = max(1, counts.appends // counts.batch)
    try:
        result = pipelined(lambda i: writer.append_many_async(records), calls, max(1, counts.window // counts.batch))
    finally:
        writer.close()
    return calls * counts.batch / result["seconds"]


def _replicate_round(url: str, counts: Counts, round_: int, samples: Samples) -> None:
    import replicate_bench
    for submitters, records in counts.submits:          # names of their own: SQLite's share the cluster
        rate, _ = replicate_bench.throughput(url, submitters, records, f"replicate-{round_}")
        samples.add(f"replicate.{submitters}_per_s", rate)
        if submitters == 1:
            samples.add("replicate.1_mean_ms", 1000 / rate)
            alone, _ = replicate_bench.throughput(url, 1, records, f"replicate-alone-{round_}", followers=0)
            samples.add("replicate.1_alone_mean_ms", 1000 / alone)     # the node's own path, apart from its followers
        if submitters == 64:                                # the batching `walkit kv serve` turns on (2 ms linger)
            rate, _ = replicate_bench.throughput(url, submitters, records, f"replicate-linger-{round_}", linger_ms=2)
            samples.add("replicate.64_linger_per_s", rate)


def _sqlite_round(url: str, folder: str, counts: Counts, round_: int, samples: Samples) -> None:
    import sqlite_bench
    run = f"sqlite-{round_}"                             # names of their own: walkit.replicate's share the cluster
    for threads, transactions in counts.transactions:
        samples.add(f"sqlite3.{threads}_per_s", sqlite_bench.plain(folder, run, transactions, threads))
        commits: list[float] = []
        rate = sqlite_bench.replicated(folder, url, run, transactions, threads, commits)
        samples.add(f"sqlite.{threads}_per_s", rate)
        if threads > 1:                                    # group commit's baseline: each transaction alone
            samples.add(f"sqlite.{threads}_alone_per_s",
                        sqlite_bench.replicated(folder, url, f"{run}-alone", transactions, threads, group_commit=False))
        if threads == 1:
            samples.add("sqlite.1_mean_ms", 1000 / rate)
            samples.add("sqlite.1_commit_mean_ms", 1000 * sum(commits) / len(commits))


# -- kv: walkit kv serve and redis-server, the same redis-benchmark ------------------------------
REDIS_TOOLS = "install redis-server and redis-tools (Debian: apt-get install redis-server redis-tools)"


def kv_rounds(counts: Counts, rounds: int, samples: Samples, folder: str) -> None:
    """kv_rounds runs redis-benchmark -c 50 and -c 50 -P 16 against both servers, each round."""
    import kv_bench
    from walkit.local import stop_process
    if any(shutil.which(tool) is None for tool in ("redis-server", "redis-benchmark", "redis-cli")):
        samples.missing["kv"] = samples.missing["redis"] = f"missing: {REDIS_TOOLS}"
        return
    servers = kv_bench.start_servers(folder)
    try:
        for process, port, role in servers.values():
            kv_bench.wait_ready(port, process, role)
        for round_ in range(rounds):
            say(f"round {round_ + 1}/{rounds}: kv")
            for suffix, requests, pipeline in (("c50", counts.kv_requests, 1),
                                               ("c50_p16", counts.kv_requests_pipelined, 16)):
                options = SimpleNamespace(requests=requests, clients=50, size=3, keyspace=100_000, pipeline=pipeline)
                for name, system in (("walkit", "kv"), ("redis", "redis")):
                    result = kv_bench.benchmark(servers[name][1], options)
                    samples.add(f"{system}.set_{suffix}", result["SET"])
                    samples.add(f"{system}.get_{suffix}", result["GET"])
    finally:
        for process, _, _ in servers.values():
            stop_process(process, 30)


# -- topics: walkit topics serve through confluent-kafka, Redis Streams, NATS JetStream ------------
RECORD_BYTES = 100


def topics_rounds(counts: Counts, rounds: int, samples: Samples, folder: str) -> None:
    """topics_rounds measures walkit topics, then each peer that is installed, each round."""
    import topics_bench
    from peers_bench import module_missing, nats_missing
    walkit_missing = module_missing("confluent_kafka", "confluent-kafka") or (
        "the Python package kafka-python (pip install 'walkit[topics]')" if importlib.util.find_spec("kafka") is None
        else None)
    streams_missing = ("redis-server is not installed (Debian: apt-get install redis-server)"
                       if shutil.which("redis-server") is None else module_missing("redis", "redis"))
    nats_why = nats_missing()
    if walkit_missing:
        samples.missing["topics"] = f"missing: {walkit_missing}"
    if streams_missing:
        samples.missing["streams"] = f"peer missing: {streams_missing}"
    if nats_why:
        samples.missing["nats1"] = samples.missing["nats3"] = f"peer missing: {nats_why}"
    peer = SimpleNamespace(messages=counts.records, size=RECORD_BYTES, runs=1)
    with contextlib.ExitStack() as stack:
        bootstrap = None
        if not walkit_missing:
            process, port, log = topics_bench.start_broker(folder, 32)
            stack.callback(log.close)
            stack.callback(topics_bench.stop, [process])
            topics_bench.wait_port(port, process)
            bootstrap = f"127.0.0.1:{port}"
        for round_ in range(rounds):
            say(f"round {round_ + 1}/{rounds}: topics")
            if bootstrap:
                _topics_round(bootstrap, counts, round_, samples)
            if not streams_missing:                # a folder per round: redis-server would load the last one's file
                [(produce, consume)] = topics_bench.redis_rounds(peer, _fresh(folder, f"streams-{round_}"))
                samples.add("streams.produce_per_s", produce)
                samples.add("streams.consume_per_s", consume)
            if not nats_why:
                for nodes in (1, 3):
                    where = _fresh(folder, f"nats{nodes}-{round_}")
                    [(produce, consume)] = topics_bench.nats_rounds(peer, where, nodes)
                    samples.add(f"nats{nodes}.produce_per_s", produce)
                    samples.add(f"nats{nodes}.consume_per_s", consume)


def _fresh(folder: str, name: str) -> str:
    """_fresh makes and returns the new folder `name` under `folder`."""
    path = os.path.join(folder, name)
    os.makedirs(path)
    return path


def _topics_round(bootstrap: str, counts: Counts, round_: int, samples: Samples) -> None:
    """_topics_round produces `counts.records` records to a new topic, consumes them back, then times one at a time.

    Produce: one idempotent acks=all producer (linger.ms 5), after one untimed record, records/s
    until flush() returns with every delivery acknowledged. Consume: a consumer, connected, is
    assigned the partition from offset 0 (no group to join); records/s from the assignment to the
    last record. End to end: Kafka's EndToEndLatency shape, one record produced (linger.ms 0)
    and polled back before the next.
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic, tail = f"adapters-{round_}", f"adapters-e2e-{round_}"
    for name in (topic, tail):
        admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])[name].result(60)
    failed = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5,
                         "queue.buffering.max.messages": counts.records + 1, "delivery.report.only.error": True,
                         "on_delivery": lambda error, message: failed.append(error)})
    payload = os.urandom(RECORD_BYTES)
    producer.produce(topic, payload)              # untimed: the connection and the producer id
    producer.flush(60)
    started = time.perf_counter()
    for i in range(counts.records):
        producer.produce(topic, payload)
        if i % 1000 == 999:
            producer.poll(0)
    if producer.flush(300) != 0 or failed:
        raise RuntimeError(f"produce failed: {len(failed)} records not delivered ({failed[:1]})")
    samples.add("topics.produce_per_s", counts.records / (time.perf_counter() - started))

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"adapters-{round_}",
                         "enable.auto.commit": False})
    consumer.list_topics(topic, timeout=60)       # untimed: connected, the partition's leader known
    total = counts.records + 1
    started = time.perf_counter()
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    count = 0
    deadline = time.monotonic() + 300
    while count < total and time.monotonic() < deadline:
        batch = consumer.consume(min(10_000, total - count), 1.0)    # it waits for as many as it is asked for
        count += sum(1 for message in batch if message.error() is None)
    elapsed = time.perf_counter() - started
    consumer.close()
    if count < total:
        raise RuntimeError(f"consumed {count} of {total} records within 300 s")
    samples.add("topics.consume_per_s", count / elapsed)

    latencies = _end_to_end(bootstrap, tail, counts.e2e_records)
    samples.add("topics.e2e_p50_ms", latencies["p50_ms"])
    samples.add("topics.e2e_p99_ms", latencies["p99_ms"])


def _end_to_end(bootstrap: str, topic: str, records: int) -> dict:
    """_end_to_end produces `records` records one at a time, each polled back before the next; their latencies."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from walkit.bench import latency_summary
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 0})
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    payload = os.urandom(RECORD_BYTES)
    latencies = []
    try:
        for i in range(records + 10):                  # the first 10 warm the connections up, untimed
            started = time.perf_counter()
            producer.produce(topic, payload)
            producer.poll(0)
            deadline = time.monotonic() + 30
            while True:
                message = consumer.poll(1.0)
                if message is not None and message.error() is None:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"record {i} did not come back within 30 s")
            if i >= 10:
                latencies.append(time.perf_counter() - started)
            if producer.flush(30) != 0:
                raise RuntimeError(f"record {i} was not acknowledged")
    finally:
        consumer.close()
    return latency_summary(latencies)


# -- the command ------------------------------------------------------------------------------
def run(groups: list[str], counts: Counts, rounds: int, samples: Samples, folder: str) -> None:
    """run measures `groups`; a group that fails marks its systems failed and the next one runs."""
    plan = [(("latency", "pipelined", "replicate", "sqlite"),
             lambda chosen: core_rounds(chosen, counts, rounds, samples, _fresh(folder, "core")),
             ("floor", "append1", "append", "replicate", "sqlite", "sqlite3")),
            (("kv",), lambda chosen: kv_rounds(counts, rounds, samples, _fresh(folder, "kv")), ("kv", "redis")),
            (("topics",), lambda chosen: topics_rounds(counts, rounds, samples, _fresh(folder, "topics")),
             ("topics", "streams", "nats1", "nats3"))]
    for members, measure, systems in plan:
        chosen = {g for g in members if g in groups}
        if chosen:
            guarded(samples, systems, lambda: measure(chosen))


def guarded(samples: Samples, systems, measure) -> bool:
    """guarded runs `measure()`; if it raises, it prints the traceback, marks `systems` failed and returns False.

    A failure stays on the rows of the systems it stopped (their rounds so far are kept: the
    header of the table lists it too); the next measurement runs.
    """
    try:
        measure()
        return True
    except Exception as exc:  # noqa: BLE001 - reported on the rows and in the header; the others still run
        traceback.print_exc()
        why = f"failed: {type(exc).__name__}: {exc}"[:200]
        samples.failures.append(f"{', '.join(systems)}: {why}")
        for system in systems:
            samples.missing.setdefault(system, why)
        return False


def machine() -> str:
    """machine describes this machine in a line: OS, architecture, cores, Python, walkit's revision."""
    revision = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip() or "unknown"
    return (f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"walkit at {revision}")


def load() -> str:
    """load is the machine's load averages over 1, 5 and 15 minutes."""
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default=",".join(GROUPS),
                        help=f"comma-separated groups of rows to run (default: all of {','.join(GROUPS)})")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds per group; medians are reported (default 3, with --quick 1)")
    parser.add_argument("--scale", type=float, default=None,
                        help="multiplies every measurement's count, so how long each takes (default 1, with --quick "
                             "0.05)")
    parser.add_argument("--quick", action="store_true", help="a short smoke run: --rounds 1 --scale 0.05")
    parser.add_argument("--out", default=None,
                        help="folder for adapters.md, .json and .png (default: benchmarks/results/adapters-DATE)")
    parser.add_argument("--data-dir", default=None, help="where the systems keep their data (default: the temp dir)")
    args = parser.parse_args(argv)
    groups = [g.strip() for g in args.rows.split(",") if g.strip()]
    unknown = [g for g in groups if g not in GROUPS]
    if unknown or not groups:
        parser.error(f"--rows takes {','.join(GROUPS)}; not {','.join(unknown) or 'nothing'}")
    rounds = args.rounds if args.rounds is not None else 1 if args.quick else 3
    scale = args.scale if args.scale is not None else 0.05 if args.quick else 1.0
    if rounds < 1 or scale <= 0:
        parser.error("--rounds must be at least 1 and --scale positive")
    started = datetime.datetime.now(datetime.timezone.utc)
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"adapters-{started:%Y%m%d-%H%M%S}")
    out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python benchmarks/adapters.py", *(argv if argv is not None else sys.argv[1:])])
    context, load_before = machine(), load()

    from walkit.allocator import tune_malloc
    from walkit.collector import tune_gc
    tune_malloc()                                 # as every walkit process does (walkit.cli.common)
    tune_gc()
    samples = Samples()
    counts = Counts().scaled(scale)
    with tempfile.TemporaryDirectory(prefix="walkit-adapters-", dir=args.data_dir) as folder:
        run([g for g in GROUPS if g in groups], counts, rounds, samples, folder)
    took = (datetime.datetime.now(datetime.timezone.utc) - started).total_seconds()

    rows = build_rows(samples, groups)
    table = markdown(rows)
    header = (f"walkit adapters against their peers, {started:%Y-%m-%d %H:%M} UTC, {took / 60:.1f} min\n\n"
              f"- command: `{command}`\n- machine: {context}; load average (1/5/15 min) {load_before} at the "
              f"start, {load()} at the end\n"
              f"- medians of {rounds} round(s) at --scale {scale:g}; walkit: 3 bookie processes, E3/Qw2/Qa2, "
              f"files storage (fdatasync before each acknowledgement)\n"
              + "".join(f"- FAILED: {failure}\n" for failure in samples.failures))
    (out / "adapters.md").write_text(f"# {header}\n{table}")
    (out / "adapters.json").write_text(json.dumps({"command": command, "machine": context, "rounds": rounds,
                                                   "scale": scale, "counts": dataclasses.asdict(counts),
                                                   "samples": samples.rounds, "missing": samples.missing,
                                                   "failures": samples.failures}, indent=1))
    print(header)
    print(table)
    why = chart(rows, str(out / "adapters.png"), f"walkit adapters, {started:%Y-%m-%d}, medians of {rounds} round(s)")
    print(f"chart skipped: {why}" if why else f"chart: {out / 'adapters.png'}")
    print(f"table: {out / 'adapters.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
