"""A batch write named with writeId is written exactly once, across a driver SIGKILLed during its commit.

batch_write_program.py writes ROWS rows into a topic with writeId, as its own driver (its own JVM),
its commit held after HELD_AT rows; the test kills it once the write's marker says "writing" and
those rows reached the topic, then runs the same write with the same writeId from its own Spark
session (a driver of its own): the rerun resumes the commit with the rows the first run staged,
and a third run writes nothing.
"""

from __future__ import annotations

import collections
import json
import os

import pytest
from confluent_kafka import Consumer, TopicPartition

import walkit
from walkit.adapters.spark.staging import SINKS
from walkit.errors import NoSuchKey

from .drivers import kill_when, start_driver
from .kafkaclients import consume_all, create_topic, end_offsets
from .test_spark_streaming import staged_for

pytestmark = pytest.mark.slow

PROGRAM = os.path.join(os.path.dirname(__file__), "batch_write_program.py")
ROWS = 20_000
HELD_AT = 7_000
WRITE_ID = "nightly-2026-01-01"


def test_a_named_batch_write_killed_mid_commit_and_rerun_writes_every_row_once_and_a_third_run_nothing(
        spark, broker, tmp_path):
    topic = "once-out"
    create_topic(broker.bootstrap, topic, 2)
    log_path = tmp_path / "drivers.log"
    args = (broker.metadata_url, topic, ROWS, "--write-id", WRITE_ID)
    marker_key = f"{SINKS}/topic/{topic}/{WRITE_ID}"
    with walkit.Client(broker.metadata_url) as client:
        def marker() -> dict | None:
            try:
                return json.loads(client.store.get(marker_key)[0])
            except NoSuchKey:
                return None

        watermarks = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "write-once-watermarks"})

        def publishing():                 # the commit's marker is "writing" and some rows reached the topic
            found = marker()
            published = sum(watermarks.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in (0, 1))
            return published if found is not None and found["state"] == "writing" and published >= HELD_AT else None
        try:
            kill_when(start_driver(PROGRAM, (*args, "--hold-commit-at", HELD_AT), log_path, tmp_path), publishing,
                      log_path)
        finally:
            watermarks.close()
        published_at_kill = sum(end_offsets(broker.bootstrap, topic, 2).values())
        assert published_at_kill == HELD_AT, f"{published_at_kill} of {ROWS} rows published at the kill"
        assert marker()["state"] == "writing"

        def rerun() -> None:              # the program's write, from the test's own driver
            frame = spark.range(ROWS, numPartitions=2).selectExpr("CAST(id AS STRING) AS value")
            (frame.write.format("walkit").option("metadata", broker.metadata_url).option("topic", topic)
             .option("writeId", WRITE_ID).mode("append").save())
        rerun()
        assert marker() == {"batch": 0, "state": "done"}
        assert staged_for(client, f"topic/{topic}") == []
        ends = end_offsets(broker.bootstrap, topic, 2)
        rerun()
        assert end_offsets(broker.bootstrap, topic, 2) == ends                  # the third run wrote nothing
        assert staged_for(client, f"topic/{topic}") == []
    written = collections.Counter(m.value() for m in consume_all(broker.bootstrap, topic, 2))
    assert written == collections.Counter(str(i).encode() for i in range(ROWS)), \
        f"{sum(written.values())} records for {ROWS}, {sum(1 for n in written.values() if n > 1)} twice"
