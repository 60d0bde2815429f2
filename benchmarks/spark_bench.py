"""Batch read throughput of the Spark data source vs one reader of the same logs, in one run.

    python benchmarks/spark_bench.py -n 1000000 --json spark_bench.json

Starts `walkit topics serve` on its embedded cluster (3 bookie processes) on 127.0.0.1, creates
a topic of `--partitions` partitions and produces `-n` records (`-s` bytes of value, keys
key-0..key-999) with confluent-kafka (idempotent, acks=all). Then it reads the whole topic
back, timing each reader from its start to its last record:

- Spark: a batch query `spark.read.format("walkit")` on local[2] (this machine's two cores),
  aggregated (count and total value length) so every record is decoded and sent to Spark;
  run `--runs` times (the first includes starting Python workers);
- `walkit log read` (the CLI, one process per partition log, one after another, output to
  /dev/null): the entries as stored, without decoding the Kafka batches;
- one Python reader: `client.read_log` over the partition logs in turn, decoding every record
  with the same decoder the Spark tasks use (walkit.adapters.spark.records);
- confluent-kafka: a consumer reading the topic through the broker (the Kafka protocol).

Results are records per second; the machine is shared and noisy, so compare figures of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

from topics_bench import stop, wait_port

from walkit.local import free_port


def produce(bootstrap: str, topic: str, count: int, size: int, partitions: int) -> float:
    """produce creates the topic and writes `count` records; it returns records/s."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(60)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 20, "batch.size": 1 << 20, "queue.buffering.max.messages": 1_000_000})
    value = b"v" * size
    started = time.perf_counter()
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value, key=b"key-%d" % (i % 1000))
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(600) == 0
    return count / (time.perf_counter() - started)


def spark_rounds(metadata: str, topic: str, count: int, runs: int) -> list[float]:
    """spark_rounds times a batch query over the whole topic `runs` times; it returns records/s per run."""
    from walkit.adapters.spark.jobs import session
    spark = session("walkit-spark-bench", "local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    results = []
    try:
        for _ in range(runs):
            started = time.perf_counter()
            row = (spark.read.format("walkit").option("metadata", metadata).option("topic", topic).load()
                   .selectExpr("count(*) AS n", "sum(length(value)) AS bytes").collect()[0])
            elapsed = time.perf_counter() - started
            assert row.n == count, f"Spark read {row.n} records of {count}"
            results.append(count / elapsed)
    finally:
        spark.stop()
    return results


def partition_logs(metadata: str, topic: str) -> list[str]:
    import walkit
    from walkit.adapters.topics.catalog import Catalog, partition_log
    with walkit.Client(metadata) as client:
        record = Catalog(client.store).topic(topic)
        return [partition_log(record, p) for p in range(record.partitions)]


def cli_read(metadata: str, logs: list[str], count: int) -> float:
    """cli_read times `walkit log read` of every partition log, one after another; it returns records/s."""
    started = time.perf_counter()
    for name in logs:
        subprocess.run([sys.executable, "-m", "walkit", "log", "read", "--metadata", metadata, "--format", "hex", name],
                       stdout=subprocess.DEVNULL, check=True)
    return count / (time.perf_counter() - started)


def python_read(metadata: str, logs: list[str], count: int) -> float:
    """python_read times one Python reader decoding every record of the partition logs; it returns records/s."""
    import walkit
    from walkit.adapters.spark.records import Columns, batches, decode_batch
    started = time.perf_counter()
    total = 0
    with walkit.Client(metadata) as client:
        for name in logs:
            with client.read_log(name) as reading:
                for record in reading:
                    columns = Columns()
                    for batch in batches(record.payload):
                        decode_batch(batch, 0, 1 << 62, columns)
                    total += len(columns)
    assert total == count, f"the Python reader read {total} records of {count}"
    return count / (time.perf_counter() - started)


def kafka_read(bootstrap: str, topic: str, partitions: int, count: int) -> float:
    """kafka_read times a confluent-kafka consumer reading the topic through the broker; it returns records/s."""
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "spark-bench", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    started = time.perf_counter()
    seen = 0
    while seen < count:
        for message in consumer.consume(10_000, timeout=5):
            if message.error() is None:
                seen += 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return count / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--records", type=int, default=1_000_000)
    parser.add_argument("-s", "--size", type=int, default=100, help="value bytes per record")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3, help="Spark queries")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="spark-bench-")
    port = free_port()
    log = open(os.path.join(folder, "broker.log"), "wb")
    broker = subprocess.Popen([sys.executable, "-m", "walkit", "topics", "serve", "--port", str(port),
                               "--data-dir", os.path.join(folder, "walkit-data")], stdout=log, stderr=log)
    bootstrap, metadata = f"127.0.0.1:{port}", f"sqlite://{folder}/walkit-data/metadata.db"
    try:
        wait_port(port, broker)
        results = {"records": args.records, "value_bytes": args.size, "partitions": args.partitions}
        results["produce_records_per_s"] = produce(bootstrap, "bench", args.records, args.size, args.partitions)
        print(f"produced {args.records:,} records: {results['produce_records_per_s']:,.0f} records/s", flush=True)
        logs = partition_logs(metadata, "bench")
        results["spark_records_per_s"] = spark_rounds(metadata, "bench", args.records, args.runs)
        results["walkit_log_read_records_per_s"] = cli_read(metadata, logs, args.records)
        results["python_reader_records_per_s"] = python_read(metadata, logs, args.records)
        results["kafka_consumer_records_per_s"] = kafka_read(bootstrap, "bench", args.partitions, args.records)
    finally:
        stop([broker])
        log.close()
    best = max(results["spark_records_per_s"])
    print(f"Spark batch query (local[2]):  {', '.join(f'{r:,.0f}' for r in results['spark_records_per_s'])} records/s")
    for name, key in (("walkit log read (CLI)", "walkit_log_read_records_per_s"),
                      ("one Python reader", "python_reader_records_per_s"),
                      ("confluent-kafka consumer", "kafka_consumer_records_per_s")):
        print(f"{name + ':':31}{results[key]:,.0f} records/s  (Spark best / this: {best / results[key]:.2f})")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
