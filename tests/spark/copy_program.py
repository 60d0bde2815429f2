"""copy_program is a streaming copy of one topic into another, run as its own driver by test_spark_streaming.

    python copy_program.py METADATA INPUT OUTPUT CHECKPOINT [--available-now] [--max-records N] [--log NAME]

With --log, a second query of the same driver copies the values of INPUT into the log NAME, twice
as many records per micro-batch (its checkpoint beside CHECKPOINT). It prints "started <query id>" once each query runs.
With --available-now the queries run one after the other (see main), otherwise side by side.
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
    parser.add_argument("--log", default=None)
    args = parser.parse_args()
    from walkit.adapters.spark.jobs import session
    spark = session("walkit-copy-test", "local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    def source(per_trigger: int):
        return (spark.readStream.format("walkit").option("metadata", args.metadata).option("topic", args.input)
                .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(per_trigger)).load())
    sinks = [("topic", args.output, source(args.max_records).select("key", "value"), args.checkpoint)]
    if args.log is not None:              # half as many micro-batches: each costs the test seconds
        sinks.append(("log", args.log, source(2 * args.max_records).select("value"), f"{args.checkpoint}-log"))
    queries = []
    for kind, name, frame, checkpoint in sinks:
        writer = (frame.writeStream.format("walkit").option("metadata", args.metadata).option(kind, name)
                  .option("checkpointLocation", checkpoint))
        trigger = {"availableNow": True} if args.available_now else {"processingTime": "0.2 seconds"}
        queries.append(writer.trigger(**trigger).start())
        print(f"started {queries[-1].id}", flush=True)
        if args.available_now:
            # One after the other: two queries of Python data sources whose first batches start together in one
            # driver (a restart from checkpoints) failed twice in CI with java.io.OptionalDataException while
            # Spark deserialized a task (Spark 4's, not walkit's: the task's Java objects), never when apart.
            queries[-1].awaitTermination()
    for query in queries:
        query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
