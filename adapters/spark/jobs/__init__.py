"""walkit.adapters.spark.jobs are the pipelines shipped with the Spark adapter, runnable as programs.

    python -m walkit.adapters.spark.jobs.archive --metadata URI --topic orders --output /data/orders
    python -m walkit.adapters.spark.jobs.windowed_counts --metadata URI --input clicks --output click-counts

Both also run under spark-submit (`spark-submit -m ...` is not a thing: pass the module's file).
`session` builds their SparkSession: `--master` if given (a local master binds 127.0.0.1),
otherwise what spark-submit was given, or Spark's default local[*].
"""

from __future__ import annotations

import argparse


def session(app: str, master: str | None):
    """session returns a SparkSession with the walkit data source registered."""
    from pyspark.sql import SparkSession

    from walkit.adapters.spark import WalkitDataSource
    builder = SparkSession.builder.appName(app)
    if master:
        builder = builder.master(master)
        if master.startswith("local"):
            builder = (builder.config("spark.driver.host", "127.0.0.1")
                       .config("spark.driver.bindAddress", "127.0.0.1")
                       .config("spark.ui.enabled", "false")
                       .config("spark.ui.showConsoleProgress", "false")
                       .config("spark.sql.shuffle.partitions", "4"))
    builder = builder.config("spark.sql.session.timeZone", "UTC")    # the jobs write times in UTC
    builder = builder.config("spark.sql.python.filterPushdown.enabled", "true")   # filters.py
    spark = builder.getOrCreate()
    spark.dataSource.register(WalkitDataSource)
    return spark


def common_arguments(parser: argparse.ArgumentParser) -> None:
    """common_arguments adds the options every job takes."""
    parser.add_argument("--metadata", required=True, help="the walkit cluster's metadata URI")
    parser.add_argument("--checkpoint", required=True, help="Spark checkpoint directory: where the job resumes")
    parser.add_argument("--master", default=None,
                        help="Spark master, e.g. local[2] (default: spark-submit's, or local[*])")
    parser.add_argument("--password", default="", help="the logs' password")


def master_of(args) -> str | None:
    """master_of is --master (None: Spark's own default, local[*] or what spark-submit was given)."""
    return args.master
