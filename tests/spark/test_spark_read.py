"""Batch reads of topics and logs with a real local Spark: exact records, bounds, splits and errors."""

from __future__ import annotations

import pytest

import walkit
from walkit.core.loglist import Position
from walkit.local import free_port

from ..integration.helpers import wait_until
from .kafkaclients import create_topic, produce

pytestmark = pytest.mark.slow


def read_topic(spark, broker, **options):
    reader = spark.read.format("walkit").option("metadata", broker.metadata_url)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


@pytest.fixture(scope="module")
def orders(broker):
    """orders is a three-partition topic of 600 records produced by confluent-kafka; it returns the acks."""
    create_topic(broker.bootstrap, "orders", 3)
    records = [(f"customer-{i % 17}".encode(), f"order {i}".encode(), [("n", str(i).encode())] if i % 4 == 0 else None)
               for i in range(600)]
    return produce(broker.bootstrap, "orders", records)


def test_batch_read_returns_exactly_the_produced_records_with_offsets_and_keys(spark, broker, orders):
    rows = read_topic(spark, broker, topic="orders").collect()
    got = sorted((r.key, r.value, r.partition, r.offset, [(h.key, h.value) for h in r.headers]) for r in rows)
    assert got == sorted(orders)
    assert {r.topic for r in rows} == {"orders"} and {r.timestampType for r in rows} == {0}
    for p in range(3):
        offsets = sorted(r.offset for r in rows if r.partition == p)
        assert offsets == list(range(len(offsets))) and offsets, f"partition {p}: offsets are not dense from 0"


def test_ending_and_starting_offsets_bound_the_read(spark, broker, orders):
    starting = '{"orders": {"0": 3, "1": -2, "2": 10}}'
    ending = '{"orders": {"0": 20, "1": 7, "2": 10}}'
    rows = read_topic(spark, broker, topic="orders", startingOffsets=starting, endingOffsets=ending).collect()
    wanted = {0: range(3, 20), 1: range(0, 7), 2: range(10, 10)}
    expected = sorted((k, v, p, o) for k, v, p, o, _ in orders if o in wanted[p])
    assert sorted((r.key, r.value, r.partition, r.offset) for r in rows) == expected
    assert len(expected) == 17 + 7


def test_large_ranges_are_split_into_more_spark_partitions(spark, broker):
    create_topic(broker.bootstrap, "split-me", 3)
    acked = []
    for round in range(20):                       # one flush per round: about 20 log entries per partition
        acked += produce(broker.bootstrap, "split-me", [(str(i).encode(), f"{round}-{i}".encode()) for i in range(30)])
    df = read_topic(spark, broker, topic="split-me", maxRecordsPerPartition="50")
    assert df.rdd.getNumPartitions() >= 9          # about 200 records per topic partition
    rows = df.collect()
    assert sorted((r.partition, r.offset, r.value) for r in rows) == sorted((p, o, v) for _, v, p, o, _ in acked)


def test_log_read_has_positions_and_values_and_stops_at_ending_offsets(spark, broker):
    with walkit.Client(broker.metadata_url) as client:
        writer = client.open_log("spark-events")
        positions = [writer.append(f"event {i}".encode()) for i in range(5)]
        writer.roll()
        positions += [writer.append(f"event {i}".encode()) for i in range(5, 12)]
        writer.close()
    df = spark.read.format("walkit").option("metadata", broker.metadata_url).option("log", "spark-events").load()
    assert df.columns == ["ledger_id", "entry_id", "value"]
    rows = df.collect()
    assert [(Position(r.ledger_id, r.entry_id), r.value) for r in rows] == \
        [(p, f"event {i}".encode()) for i, p in enumerate(positions)]
    bounded = (spark.read.format("walkit").option("metadata", broker.metadata_url).option("log", "spark-events")
               .option("startingOffsets", str(positions[3])).option("endingOffsets", str(positions[8])).load())
    assert [r.value for r in bounded.collect()] == [f"event {i}".encode() for i in range(3, 8)]


def test_missing_topic_and_log_are_named_in_the_error(spark, broker, orders):
    with pytest.raises(Exception, match="no topic 'no-such-topic' in the walkit cluster"):
        read_topic(spark, broker, topic="no-such-topic").collect()
    with pytest.raises(Exception, match="no log named 'no-such-log'"):
        spark.read.format("walkit").option("metadata", broker.metadata_url).option("log", "no-such-log").load().collect()


def test_a_compacted_topic_is_refused_by_name_and_left_out_of_a_pattern(spark, broker, orders):
    create_topic(broker.bootstrap, "orders-compacted", 1, **{"cleanup.policy": "compact"})
    with pytest.raises(Exception, match="topic orders-compacted is compacted .* read it through a Kafka client"):
        read_topic(spark, broker, topic="orders-compacted").collect()
    matched = read_topic(spark, broker, subscribePattern="orders.*").select("topic").distinct().collect()
    assert [r.topic for r in matched] == ["orders"]


@pytest.mark.parametrize("options, message", [
    ({"topic": "orders", "startingOffsets": "yesterday"}, "option startingOffsets is earliest, latest or JSON"),
    ({"topic": "orders", "startingOffsets": "latest"}, "startingOffsets latest .* not allowed in a batch read"),
    ({"topic": "orders", "endingOffsets": '{"orders": {"0": 100000}}'}, "endingOffsets 100000 of orders-0 is beyond"),
    ({"topic": "orders", "log": "x"}, "exactly one of the options topic, subscribePattern and log"),
    ({"topic": "orders", "minPartitions": "0"}, "option minPartitions must be a positive integer"),
    ({"topic": "orders", "failOnDataLoss": "maybe"}, "option failOnDataLoss must be true or false"),
])
def test_bad_options_are_refused_with_a_clear_message(spark, broker, orders, options, message):
    with pytest.raises(Exception, match=message):
        read_topic(spark, broker, **options).collect()


def test_unreachable_cluster_is_reported(spark, tmp_path):
    missing = f"sqlite://{tmp_path}/nothing/metadata.db"
    with pytest.raises(Exception, match="no walkit cluster at .*does not exist"):
        spark.read.format("walkit").option("metadata", missing).option("topic", "t").load().collect()
    dead = f"zk://127.0.0.1:{free_port()}/walkit?timeout=1"
    with pytest.raises(Exception, match="cannot reach the walkit cluster at zk://"):
        spark.read.format("walkit").option("metadata", dead).option("topic", "t").load().collect()


def test_records_removed_by_retention_fail_the_read_unless_failondataloss_is_false(spark, broker):
    from walkit.adapters.spark.index import LogIndex
    from walkit.adapters.topics.catalog import Catalog, partition_log
    create_topic(broker.bootstrap, "short-lived", 1, **{"segment.bytes": "2000", "retention.bytes": "3000"})
    for round in range(12):                      # an entry of 2,500 bytes per round: the log rolls each time
        produce(broker.bootstrap, "short-lived", [(None, bytes([round]) * 500)] * 5)
    with walkit.Client(broker.metadata_url) as client:
        log_name = partition_log(Catalog(client.store).topic("short-lived"), 0)
        wait_until(lambda: (LogIndex(client, log_name).refresh().earliest() or 0) > 0, 60, interval=0.1,
                   message="retention never removed the ledger of offset 0")
    with pytest.raises(Exception, match=r"offsets 0\.\.\d+ of short-lived-0 were removed by retention"):
        read_topic(spark, broker, topic="short-lived", startingOffsets='{"short-lived": {"0": 0}}').collect()
    rest = read_topic(spark, broker, topic="short-lived", startingOffsets='{"short-lived": {"0": 0}}',
                      failOnDataLoss="false").select("offset").collect()
    offsets = sorted(r.offset for r in rest)
    assert offsets[0] > 0 and offsets == list(range(offsets[0], 60))
