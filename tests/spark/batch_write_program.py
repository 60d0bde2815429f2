"""batch_write_program writes rows "0".."ROWS-1" into a topic with df.write, run as its own driver by the tests
that kill it (test_spark_janitor, test_spark_write_once).

    python batch_write_program.py METADATA TOPIC ROWS [--slow-ms N] [--write-id ID]

Each row waits --slow-ms in its task (a slow upstream stage), so a test can kill the driver while
the tasks are staging rows; --write-id names the write (option writeId: exactly once).
"""

from __future__ import annotations

import argparse
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("metadata")
    parser.add_argument("topic")
    parser.add_argument("rows", type=int)
    parser.add_argument("--slow-ms", type=float, default=0.0)
    parser.add_argument("--write-id", default=None)
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
    writer = frame.write.format("walkit").option("metadata", args.metadata).option("topic", args.topic)
    if args.write_id is not None:
        writer = writer.option("writeId", args.write_id)
    writer.mode("append").save()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
