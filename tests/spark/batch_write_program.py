"""batch_write_program writes ROWS rows into a topic with df.write, slowly, run as its own driver by test_spark_janitor.

    python batch_write_program.py METADATA TOPIC ROWS [--slow-ms N]

Each row waits --slow-ms in its task (a slow upstream stage), so a test can kill the driver while
the tasks are staging rows.
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
    frame = frame.select(slowly("value").alias("value"))
    frame.write.format("walkit").option("metadata", args.metadata).option("topic", args.topic).mode("append").save()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
