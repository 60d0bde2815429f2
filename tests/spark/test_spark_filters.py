"""WHERE partition / offset / timestamp reaches the planner (pushFilters): only the entries that hold a match are read.

The topic `filtered` has 3 partitions of 200 records each, produced in batches of 10 (one
entry each), timestamps one second apart. Each filter is run twice: through Spark (the rows
are exactly those the filter keeps) and through the same planner and scan in this process,
counting the entries read from the bookies.
"""

from __future__ import annotations

import datetime

import pytest
from confluent_kafka import Producer
from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, In, LessThan

from tests.support.topicslog import wait_stored
from walkit.adapters.spark import scan
from walkit.adapters.spark.options import parse_source
from walkit.adapters.spark.reader import BatchReader, PieceInput
from walkit.adapters.spark.source import TOPIC_SCHEMA

from .kafkaclients import create_topic

pytestmark = pytest.mark.slow

T0 = 1_700_000_000_000
PER_PARTITION = 200
BATCH = 10


@pytest.fixture(scope="module")
def filtered(broker):
    create_topic(broker.bootstrap, "filtered", 3)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "acks": "all"})
    for partition in range(3):
        for first in range(0, PER_PARTITION, BATCH):        # one flush per batch: one batch, one entry
            for i in range(first, first + BATCH):
                producer.produce("filtered", key=f"k{i}".encode(), value=f"p{partition} v{i}".encode(),
                                 partition=partition, timestamp=T0 + i * 1000)
            assert producer.flush(30) == 0
        wait_stored(broker.metadata_url, "filtered", PER_PARTITION, partition)
    return broker


def entries_read(broker, monkeypatch, filters) -> tuple[int, set, list]:
    """entries_read plans and reads `filtered` in this process with `filters` pushed; it returns
    (entries fetched from the bookies, (partition, offset) of the rows, filters left to Spark)."""
    from pyspark.sql.types import _parse_datatype_string
    fetched = []
    original = scan._entries

    def counting(*args, **kwargs):
        for item in original(*args, **kwargs):
            fetched.append(item[:2])
            yield item
    monkeypatch.setattr(scan, "_entries", counting)
    reader = BatchReader(parse_source({"metadata": broker.metadata_url, "topic": "filtered"}, streaming=False),
                         _parse_datatype_string(TOPIC_SCHEMA))
    left = list(reader.pushFilters(filters))
    rows = set()
    for piece in reader.partitions():
        assert isinstance(piece, PieceInput)
        for batch in reader.read(piece):
            table = batch.to_pydict()
            rows |= set(zip(table["partition"], table["offset"]))
    return len(fetched), rows, left


def spark_rows(spark, broker, where: str) -> set:
    frame = (spark.read.format("walkit").option("metadata", broker.metadata_url).option("topic", "filtered")
             .load().where(where))
    return {(r.partition, r.offset) for r in frame.select("partition", "offset").collect()}


def test_a_partition_filter_reads_that_partition_only(spark, filtered, monkeypatch):
    everything, rows, _ = entries_read(filtered, monkeypatch, [])
    assert len(rows) == 3 * PER_PARTITION and everything == 3 * PER_PARTITION // BATCH
    fetched, rows, left = entries_read(filtered, monkeypatch, [EqualTo(("partition",), 1)])
    assert left == [] and rows == {(1, o) for o in range(PER_PARTITION)}
    assert fetched == PER_PARTITION // BATCH
    assert spark_rows(spark, filtered, "partition = 1") == rows


def test_an_offset_filter_reads_only_the_entries_that_hold_the_range(spark, filtered, monkeypatch):
    filters = [In(("partition",), (0, 2)), GreaterThanOrEqual(("offset",), 100), LessThan(("offset",), 120)]
    fetched, rows, left = entries_read(filtered, monkeypatch, filters)
    assert left == [] and rows == {(p, o) for p in (0, 2) for o in range(100, 120)}
    assert fetched == 2 * 2                           # two batches of ten in each of two partitions
    assert spark_rows(spark, filtered, "partition IN (0, 2) AND offset >= 100 AND offset < 120") == rows


def test_a_timestamp_filter_starts_at_the_first_record_at_or_after_it(spark, filtered, monkeypatch):
    since = datetime.datetime.fromtimestamp((T0 + 180_000) / 1000, datetime.timezone.utc)
    pushed = GreaterThanOrEqual(("timestamp",), since)
    fetched, rows, left = entries_read(filtered, monkeypatch, [pushed])
    assert left == [pushed]                           # Spark applies it to what was read: CreateTime may go back
    assert rows == {(p, o) for p in range(3) for o in range(180, PER_PARTITION)}
    assert fetched == 3 * 2
    where = f"timestamp >= to_timestamp('{since.strftime('%Y-%m-%d %H:%M:%S')}')"
    assert spark_rows(spark, filtered, where) == rows
