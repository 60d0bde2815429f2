"""walkit.adapters.spark.jobs.windowed_counts counts a topic's records per key and time window into another topic.

    python -m walkit.adapters.spark.jobs.windowed_counts --metadata URI --input clicks \\
        --output click-counts --window "1 minute" --checkpoint /jobs/_checkpoints/click-counts

A streaming query: records of `--input` are grouped by key and by tumbling windows of their
Kafka timestamp. A window's count is written once, final, when the watermark passes the
window's end: the watermark trails the latest timestamp seen by `--watermark` (default: the
window length), and records later than that are dropped, as Spark's append mode does (the
Python data source API offers sinks append mode only). Each count goes to `--output` as
key = the input key, value = JSON {"key", "window_start", "window_end", "count"} (times in
ISO 8601, UTC). The walkit sink writes each micro-batch exactly once, and the offsets and the
aggregation state are in the checkpoint, so a killed job started again goes on without
counting a record twice or losing one.
`--available-now` processes what is there and stops (for tests and catch-up runs).
"""

from __future__ import annotations

import argparse
import sys

from walkit.adapters.spark.jobs import common_arguments, master_of, session


def windowed_counts(spark, metadata: str, source: str, target: str, checkpoint: str, *, window: str = "1 minute",
                    watermark: str | None = None, trigger_s: float = 5.0, available_now: bool = False,
                    max_records: int | None = None, password: str = "", starting: str = "earliest"):
    """windowed_counts starts the query and returns it (a StreamingQuery)."""
    from pyspark.sql import functions as F
    reader = (spark.readStream.format("walkit").option("metadata", metadata).option("topic", source)
              .option("startingOffsets", starting).option("password", password))
    if max_records:
        reader = reader.option("maxOffsetsPerTrigger", str(max_records))
    counts = (reader.load().withWatermark("timestamp", watermark or window)
              .groupBy(F.window("timestamp", window), F.col("key")).count())
    out = counts.select(
        F.col("key"),
        F.to_json(F.struct(F.col("key").cast("string").alias("key"),
                           F.date_format(F.col("window.start"), "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("window_start"),
                           F.date_format(F.col("window.end"), "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("window_end"),
                           F.col("count"))).alias("value"))
    writer = (out.writeStream.format("walkit").option("metadata", metadata).option("topic", target)
              .option("password", password).option("checkpointLocation", checkpoint).outputMode("append"))
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime=f"{trigger_s} seconds")
    return writer.start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m walkit.adapters.spark.jobs.windowed_counts",
                                     description="Count a topic's records per key and window into another topic.")
    common_arguments(parser)
    parser.add_argument("--input", required=True, help="topic to read")
    parser.add_argument("--output", required=True, help="topic to write the counts to (it must exist)")
    parser.add_argument("--window", default="1 minute", help="window length, e.g. '10 seconds', '1 hour'")
    parser.add_argument("--watermark", default=None, help="how late a record may be (default: the window)")
    parser.add_argument("--trigger-seconds", type=float, default=5.0, help="micro-batch interval")
    parser.add_argument("--max-records", type=int, default=None, help="records per micro-batch at most")
    parser.add_argument("--starting", default="earliest", help="startingOffsets of a new query: earliest or latest")
    parser.add_argument("--available-now", action="store_true", help="process what is there, then stop")
    args = parser.parse_args(argv)
    spark = session("walkit-windowed-counts", master_of(args))
    try:
        query = windowed_counts(spark, args.metadata, args.input, args.output, args.checkpoint, window=args.window,
                                watermark=args.watermark, trigger_s=args.trigger_seconds,
                                available_now=args.available_now, max_records=args.max_records,
                                password=args.password, starting=args.starting)
        query.awaitTermination()
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
