"""walkit.adapters.spark.jobs.archive copies a topic or a log into Parquet files, incrementally.

    python -m walkit.adapters.spark.jobs.archive --metadata URI --topic orders \\
        --output /archive/orders --checkpoint /archive/_checkpoints/orders

Each run reads what was added since the previous run (the offsets are in the checkpoint),
appends it to the Parquet dataset and stops (a streaming query with Trigger.AvailableNow), so
it can run from cron. Spark's file sink commits each micro-batch in the dataset's
_spark_metadata log, and the source's offsets in the checkpoint: a record is archived once,
even when a run dies and is started again. The archive is the long-term copy of what
retention later removes from the log: run it more often than retention.ms.

Columns: those of the source (key, value, topic, partition, offset, timestamp, timestampType,
headers for a topic; ledger_id, entry_id, value for a log). `--max-records` bounds one
micro-batch (maxOffsetsPerTrigger), so a first run over a long log writes several files.
"""

from __future__ import annotations

import argparse
import sys

from walkit.adapters.spark.jobs import common_arguments, master_of, session


def archive(spark, metadata: str, output: str, checkpoint: str, *, topic: str | None = None, log: str | None = None,
            max_records: int | None = None, password: str = "", fail_on_data_loss: bool = True) -> int:
    """archive runs one incremental archive of `topic` or `log` into Parquet at `output`; it returns the batches run."""
    reader = (spark.readStream.format("walkit").option("metadata", metadata)
              .option("startingOffsets", "earliest").option("password", password)
              .option("failOnDataLoss", str(fail_on_data_loss).lower()))
    reader = reader.option("topic", topic) if topic else reader.option("log", log)
    if max_records:
        reader = reader.option("maxOffsetsPerTrigger", str(max_records))
    query = (reader.load().writeStream.format("parquet").option("path", output)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    if query.exception() is not None:
        raise query.exception()
    return len(query.recentProgress)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m walkit.adapters.spark.jobs.archive",
                                     description="Archive a walkit topic or log into Parquet, incrementally.")
    common_arguments(parser)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--topic", help="topic to archive (one, or a comma list)")
    what.add_argument("--log", help="walkit log to archive")
    parser.add_argument("--output", required=True, help="Parquet dataset directory")
    parser.add_argument("--max-records", type=int, default=None, help="records per micro-batch at most")
    parser.add_argument("--skip-lost", action="store_true",
                        help="go on past records retention removed before they were archived (failOnDataLoss=false)")
    args = parser.parse_args(argv)
    spark = session("walkit-archive", master_of(args))
    try:
        batches = archive(spark, args.metadata, args.output, args.checkpoint, topic=args.topic, log=args.log,
                          max_records=args.max_records, password=args.password,
                          fail_on_data_loss=not args.skip_lost)
        print(f"archived {args.topic or args.log} into {args.output} in {batches} micro-batch(es)")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
