"""copy_program is a streaming copy of one topic into another, run as its own driver by test_spark_streaming.

    python copy_program.py METADATA INPUT OUTPUT CHECKPOINT [--available-now] [--max-records N]

It prints "started <query id>" once the query runs.
"""

from __future__ import annotations

import argparse
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("metadata")
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("checkpoint")
    parser.add_argument("--available-now", action="store_true")
    parser.add_argument("--max-records", type=int, default=100)
    args = parser.parse_args()
    from walkit.adapters.spark.jobs import session
    spark = session("walkit-copy-test", "local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    source = (spark.readStream.format("walkit").option("metadata", args.metadata).option("topic", args.input)
              .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(args.max_records)).load())
    writer = (source.select("key", "value").writeStream.format("walkit").option("metadata", args.metadata)
              .option("topic", args.output).option("checkpointLocation", args.checkpoint))
    writer = writer.trigger(availableNow=True) if args.available_now else writer.trigger(processingTime="0.2 seconds")
    query = writer.start()
    print(f"started {query.id}", flush=True)
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
