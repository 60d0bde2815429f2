"""batch_write_program writes rows "0".."ROWS-1" into a topic with df.write, run as its own driver by the tests
that kill it (test_spark_janitor, test_spark_write_once).

    python batch_write_program.py METADATA TOPIC ROWS [--slow-ms N] [--write-id ID] [--hold-commit-at N]

Each row waits --slow-ms in its task (a slow upstream stage), so a test can kill the driver while
the tasks are staging rows; --write-id names the write (option writeId: exactly once);
--hold-commit-at N makes the commit stop handing staged rows to the producer after N of them and
wait there for good, the first N rows published, so a test can kill the driver in the middle of
its commit (the data source "walkit-held" is "walkit" with that commit; its classes live in this
file, so Spark ships them to the commit's Python worker by value).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

from walkit.adapters.spark import WalkitDataSource
from walkit.adapters.spark.options import parse_sink
from walkit.adapters.spark.writer import BatchWriter

class HeldCommit(BatchWriter):
    """HeldCommit is BatchWriter whose commit publishes `hold_at` rows, then waits until the process is killed."""

    hold_at = 0

    def commit(self, messages) -> None:
        from walkit.adapters.spark import markers
        original, hold_at = markers.staged_rows, self.hold_at

        def held(*args, **kwargs):
            for i, row in enumerate(original(*args, **kwargs)):
                if i == hold_at:
                    threading.Event().wait()          # the commit is cut here: the test kills the driver
                yield row
        markers.staged_rows = held
        super().commit(messages)


class HeldSource(WalkitDataSource):
    """HeldSource is the "walkit" data source whose batch writes commit as HeldCommit."""

    @classmethod
    def name(cls) -> str:
        return "walkit-held"

    def writer(self, schema, overwrite: bool):
        options = {name: value for name, value in self.options.items() if name.lower() != "holdat"}
        writer = HeldCommit(parse_sink(options), schema, overwrite)
        writer.hold_at = int(self.options["holdAt"])
        return writer


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("metadata")
    parser.add_argument("topic")
    parser.add_argument("rows", type=int)
    parser.add_argument("--slow-ms", type=float, default=0.0)
    parser.add_argument("--write-id", default=None)
    parser.add_argument("--hold-commit-at", type=int, default=None)
    args = parser.parse_args()
    from walkit.adapters.spark.jobs import session
    spark = session("walkit-batch-write-test", "local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    pause = args.slow_ms / 1000

    from pyspark.sql.functions import udf

    @udf("string")
    def slowly(value):
        time.sleep(pause)                      # the upstream work the kill interrupts, not synchronisation
        return value
    frame = spark.range(args.rows, numPartitions=2).selectExpr("CAST(id AS STRING) AS value")
    if pause:
        frame = frame.select(slowly("value").alias("value"))
    if args.hold_commit_at is None:
        writer = frame.write.format("walkit")
    else:
        spark.dataSource.register(HeldSource)
        writer = frame.write.format("walkit-held").option("holdAt", str(args.hold_commit_at))
    writer = writer.option("metadata", args.metadata).option("topic", args.topic)
    if args.write_id is not None:
        writer = writer.option("writeId", args.write_id)
    writer.mode("append").save()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
