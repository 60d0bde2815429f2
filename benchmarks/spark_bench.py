"""Throughput of the Spark data source beside Spark reading the same records from Parquet, in one run.

    python benchmarks/spark_bench.py -n 10000000 --json spark_bench.json     # -n: records (10M default)

Starts `walkit topics serve` on its embedded cluster (3 bookie processes) on 127.0.0.1, creates
a topic of `--partitions` partitions and produces `-n` records (`-s` bytes of value, keys
key-0..key-999) with confluent-kafka (idempotent, acks=all). Then it reads the whole topic
back, timing each reader from its start to its last record:

- Spark on local[2], `--runs` times each (medians reported), each beside the same job over the
  same records in Parquet on local disk (written once from the topic): the ceiling Spark itself
  sets on this machine. A batch query aggregated (count and total value length) so every record
  is decoded and sent to Spark; a streaming query (Trigger.AvailableNow, `maxOffsetsPerTrigger`
  = `--per-trigger`; Parquet: maxFilesPerTrigger of as many records) into the noop sink; a write
  of the records' key and value into a new 3-partition topic (Parquet: into a new folder);
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


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _aggregate(frame):
    return frame.selectExpr("count(*) AS n", "sum(length(value)) AS bytes").collect()[0]


def _stream(spark, frame, count: int, checkpoint: str) -> float:
    """_stream runs a streaming query over `frame` to a noop sink (Trigger.AvailableNow); it returns records/s."""
    started = time.perf_counter()
    query = (frame.writeStream.format("noop").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    read = sum(progress["numInputRows"] for progress in query.recentProgress)
    assert read == count, f"the streaming query read {read} records of {count}"
    return count / elapsed


def spark_rounds(metadata: str, bootstrap: str, topic: str, count: int, runs: int, per_trigger: int,
                 folder: str) -> dict:
    """spark_rounds times, `runs` times each, the same jobs over the walkit topic and over the same records
    in Parquet on local disk: a batch count, a streaming read (AvailableNow, maxOffsetsPerTrigger /
    maxFilesPerTrigger) and a write (to a new walkit topic; to Parquet). It returns records/s lists."""
    from walkit.adapters.spark.jobs import session
    spark = session("walkit-spark-bench", "local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    walkit_frame = spark.read.format("walkit").option("metadata", metadata).option("topic", topic).load()
    parquet = os.path.join(folder, "parquet")
    (walkit_frame.select("key", "value", "partition", "offset", "timestamp")
     .repartition(max(1, count // 250_000)).write.parquet(parquet))
    results: dict = {name: [] for name in ("batch_read", "parquet_batch_read", "streaming_read",
                                           "parquet_streaming_read", "write", "parquet_write")}
    try:
        for run in range(runs):
            started = time.perf_counter()
            row = _aggregate(spark.read.format("walkit").option("metadata", metadata).option("topic", topic).load())
            results["batch_read"].append(count / (time.perf_counter() - started))
            assert row.n == count, f"Spark read {row.n} records of {count}"
            started = time.perf_counter()
            row = _aggregate(spark.read.parquet(parquet))
            results["parquet_batch_read"].append(count / (time.perf_counter() - started))
            assert row.n == count
            stream = (spark.readStream.format("walkit").option("metadata", metadata).option("topic", topic)
                      .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(per_trigger)).load())
            results["streaming_read"].append(_stream(spark, stream, count, os.path.join(folder, f"cp-w{run}")))
            schema = spark.read.parquet(parquet).schema
            files = len([f for f in os.listdir(parquet) if f.endswith(".parquet")])
            stream = (spark.readStream.schema(schema).option("maxFilesPerTrigger",
                                                             str(max(1, files * per_trigger // count)))
                      .parquet(parquet))
            results["parquet_streaming_read"].append(_stream(spark, stream, count, os.path.join(folder, f"cp-p{run}")))
            source = spark.read.parquet(parquet).select("key", "value")
            out = f"written-{run}"
            _create_topic(bootstrap, out, 3)
            started = time.perf_counter()
            source.write.format("walkit").option("metadata", metadata).option("topic", out).mode("append").save()
            results["write"].append(count / (time.perf_counter() - started))
            started = time.perf_counter()
            source.write.parquet(os.path.join(folder, f"parquet-out-{run}"))
            results["parquet_write"].append(count / (time.perf_counter() - started))
            print(f"run {run + 1}: " + ", ".join(f"{name} {values[-1]:,.0f}" for name, values in results.items()),
                  flush=True)
    finally:
        spark.stop()
    return results


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(60)


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
    parser.add_argument("-n", "--records", type=int, default=10_000_000)
    parser.add_argument("-s", "--size", type=int, default=100, help="value bytes per record")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3, help="runs of each Spark job (medians are reported)")
    parser.add_argument("--per-trigger", type=int, default=250_000,
                        help="maxOffsetsPerTrigger of the streaming read (Parquet: files of as many records)")
    parser.add_argument("--spark-only", action="store_true", help="skip the CLI, Python and Kafka readers")
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
        spark = spark_rounds(metadata, bootstrap, "bench", args.records, args.runs, args.per_trigger, folder)
        results["spark_records_per_s"] = spark
        if not args.spark_only:
            results["walkit_log_read_records_per_s"] = cli_read(metadata, logs, args.records)
            results["python_reader_records_per_s"] = python_read(metadata, logs, args.records)
            results["kafka_consumer_records_per_s"] = kafka_read(bootstrap, "bench", args.partitions, args.records)
    finally:
        stop([broker])
        log.close()
    print(f"medians of {args.runs} runs, {args.records:,} records of {args.size} bytes, local[2]:")
    for job in ("batch_read", "streaming_read", "write"):
        ours, ceiling = median(spark[job]), median(spark[f"parquet_{job}"])
        print(f"  {job:15} walkit {ours:>11,.0f} records/s   Parquet {ceiling:>11,.0f} records/s   "
              f"ratio {ours / ceiling:.2f}")
    best = max(spark["batch_read"])
    for name, key in (("walkit log read (CLI)", "walkit_log_read_records_per_s"),
                      ("one Python reader", "python_reader_records_per_s"),
                      ("confluent-kafka consumer", "kafka_consumer_records_per_s")):
        if key in results:
            print(f"{name + ':':31}{results[key]:,.0f} records/s  (Spark best / this: {best / results[key]:.2f})")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
