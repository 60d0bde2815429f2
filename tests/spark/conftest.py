"""Fixtures of the Spark adapter's tests: one local Spark and one topics broker for the whole session.

The SparkSession is local[2] bound to 127.0.0.1 with few shuffle partitions; it starts once
(about 10 s) and every test shares it. The broker is a real `walkit topics serve` process on an
embedded cluster of bookie processes; the tests produce with confluent-kafka through it and
Spark reads the bookies directly through the cluster's metadata file.
"""

from __future__ import annotations

import glob
import os
import sys

import pytest

from tests.support.serverprocess import TopicsProcess


def java17_home() -> str | None:
    """java17_home is the OpenJDK 17 that scripts/test.sh installs (None: use java on the PATH)."""
    found = sorted(glob.glob("/usr/lib/jvm/java-17-openjdk-*"))
    return found[0] if found else None


#: DRIVER_JAVA_OPTIONS are the tests' Spark driver JVMs' options: C1 only and the serial collector. A test's
#: JVM lives seconds to minutes on small data, so C2's compiling and G1's threads cost CPU that never
#: pays back; measured on 2026-11-30, a session start with three small queries took 16.3 CPU s with
#: the defaults and 8.9 with these.
DRIVER_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def spark_environment() -> dict:
    """spark_environment is os.environ with JAVA_HOME on OpenJDK 17, quiet PySpark warnings, the tests' JVM
    options (DRIVER_JAVA_OPTIONS) and this interpreter for the Python workers (not a `python3` shim)."""
    env = dict(os.environ)
    home = java17_home()
    if home:
        env["JAVA_HOME"] = home
    env.setdefault("PYARROW_IGNORE_TIMEZONE", "1")
    env.setdefault("PYSPARK_SUBMIT_ARGS", f'--driver-java-options "{DRIVER_JAVA_OPTIONS}" pyspark-shell')
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    return env


@pytest.fixture(scope="session")
def spark():
    """spark is the session's SparkSession (local[2], 127.0.0.1) with the walkit data source registered."""
    os.environ.update(spark_environment())
    from walkit.adapters.spark.jobs import session
    spark = session("walkit-tests", "local[2]")
    spark.sparkContext.setLogLevel("ERROR")
    yield spark
    from pyspark import SparkContext
    gateway = SparkContext._gateway
    spark.stop()
    stop_gateway(gateway)


def stop_gateway(gateway) -> None:
    """stop_gateway ends the JVM PySpark started (it outlives spark.stop() otherwise)."""
    from pyspark import SparkContext
    if gateway is None:
        return
    process = getattr(gateway, "proc", None)
    gateway.shutdown()
    SparkContext._gateway = SparkContext._jvm = None
    if process is not None:
        if process.stdin is not None:
            process.stdin.close()          # the JVM exits when its parent's pipe closes
        try:
            process.wait(30)
        except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired
            process.kill()
            process.wait(30)


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    """broker is one `walkit topics serve` on an embedded cluster for the session."""
    workdir = tmp_path_factory.mktemp("spark-topics")
    process = TopicsProcess(workdir, data_dir=workdir / "data",
                            args=("--retention-check-ms", "200", "--rebalance-delay-ms", "300"))
    process.start().wait_ready()
    yield process
    process.stop()
