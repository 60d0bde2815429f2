"""Spark's Kafka-source options, checked against one topic of every codec with headers and null keys and values.

confluent-kafka (librdkafka) writes the topic `mixed`: 2 partitions, for each codec (none, gzip,
snappy, lz4, zstd) ten records per partition with a header naming the codec, some with a null
key, a null value or a null header value, and timestamps one second apart. Every read option is
checked against what the broker acknowledged; writes of each codec are read back and their
stored batches carry that codec; an unknown option fails naming the closest valid one.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from tests.support.topicslog import CODEC_IDS, codec_ids, wait_stored
from walkit.adapters.spark.errors import OptionError
from walkit.adapters.spark.options import parse_source
from walkit.adapters.spark.reader import StreamReader
from walkit.adapters.spark.publishers import TAG_HEADER

from .kafkaclients import create_topic

pytestmark = pytest.mark.slow

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
T0 = 1_700_000_000_000
PER_CODEC = 10


def produce_mixed(bootstrap: str, topic: str) -> dict:
    """produce_mixed writes the module's records; it returns {(partition, offset): (key, value, headers, ms)}."""
    acked = {}
    for codec in CODECS:                     # one producer, one flush per codec: batches of one codec each
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                             "linger.ms": 5, "compression.type": codec})
        for partition in (0, 1):
            for i in range(PER_CODEC):
                n = CODECS.index(codec) * PER_CODEC + i
                key = None if i % 3 == 0 else f"k{partition}-{n}".encode()
                value = None if i % 4 == 1 else f"{codec} {n} {'.' * 100}".encode()
                headers = [("codec", codec.encode()), ("empty", None)] if i % 2 else [("codec", codec.encode())]

                def delivered(error, message, key=key, value=value, headers=headers, ms=T0 + n * 1000):
                    assert error is None, error
                    acked[(message.partition(), message.offset())] = (key, value, headers, ms)
                producer.produce(topic, key=key, value=value, headers=headers, partition=partition,
                                 timestamp=T0 + n * 1000, on_delivery=delivered)
        assert producer.flush(60) == 0
    return acked


@pytest.fixture(scope="module")
def mixed(broker):
    create_topic(broker.bootstrap, "mixed", 2)
    acked = produce_mixed(broker.bootstrap, "mixed")
    for partition in (0, 1):
        stored = wait_stored(broker.metadata_url, "mixed", len(CODECS) * PER_CODEC, partition)
        assert sorted(set(codec_ids(stored))) == sorted(CODEC_IDS.values())
    return acked


def read(spark, broker, **options):
    reader = spark.read.format("walkit").option("metadata", broker.metadata_url)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def records(frame) -> dict:
    """records are a DataFrame's rows as {(partition, offset): (key, value, headers, ms)}."""
    return {(r.partition, r.offset): (r.key, r.value, [(h.key, h.value) for h in r.headers],
                                      int(r.timestamp.timestamp() * 1000)) for r in frame.collect()}


def test_every_codec_with_headers_and_null_keys_and_values_reads_as_produced(spark, broker, mixed):
    assert records(read(spark, broker, subscribe="mixed")) == mixed
    assert any(key is None for key, *_ in mixed.values()) and any(value is None for _, value, *_ in mixed.values())


def test_subscribe_pattern_and_assign_read_the_partitions_they_name(spark, broker, mixed):
    assert records(read(spark, broker, subscribePattern="mix.*")) == mixed
    assigned = records(read(spark, broker, assign='{"mixed": [1]}'))
    assert assigned == {tp: r for tp, r in mixed.items() if tp[0] == 1}


def test_offsets_and_timestamps_in_json_bound_the_read(spark, broker, mixed):
    bounded = read(spark, broker, topic="mixed", startingOffsets='{"mixed": {"0": 5, "1": -2}}',
                   endingOffsets='{"mixed": {"0": 12, "1": 3}}')
    assert set(records(bounded)) == {(0, o) for o in range(5, 12)} | {(1, o) for o in range(3)}
    by_partition = read(spark, broker, topic="mixed",
                        startingOffsetsByTimestamp=f'{{"mixed": {{"0": {T0 + 40_000}, "1": {T0 + 47_500}}}}}')
    assert set(records(by_partition)) == {(0, o) for o in range(40, 50)} | {(1, o) for o in range(48, 50)}
    every = read(spark, broker, topic="mixed", startingTimestamp=str(T0 + 45_000))
    assert set(records(every)) == {(p, o) for p in (0, 1) for o in range(45, 50)}


def test_include_headers_false_leaves_the_column_out(spark, broker, mixed):
    frame = read(spark, broker, topic="mixed", includeHeaders="false")
    assert "headers" not in frame.columns and frame.count() == len(mixed)


@pytest.mark.parametrize("name, closest", [
    ("startingOffset", "startingOffsets"), ("maxOffsetPerTrigger", "maxOffsetsPerTrigger"),
    ("failondatalos", "failOnDataLoss"), ("kafka.sasl.jaas.conf", "kafka.sasl.jaas.config"),
])
def test_an_unknown_option_fails_naming_the_closest_valid_one(spark, broker, mixed, name, closest):
    with pytest.raises(Exception, match=f"unknown option '{name.lower()}' for a read; did you mean {closest}"):
        read(spark, broker, topic="mixed", **{name: "1"}).collect()


def test_an_unknown_write_option_fails_before_anything_is_written(spark, broker, mixed):
    frame = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(Exception, match="unknown option 'kafka.compresion.type' for a write; did you mean "
                                        "kafka.compression.type"):
        (frame.write.format("walkit").option("metadata", broker.metadata_url).option("topic", "mixed")
         .option("kafka.compresion.type", "lz4").mode("append").save())


def test_streaming_trigger_options_bound_and_hold_back_micro_batches(broker, mixed, monkeypatch):
    """maxOffsetsPerTrigger caps a micro-batch; minOffsetsPerTrigger holds one back until maxTriggerDelay passed."""
    from walkit.adapters.spark import reader as planning
    options = parse_source({"metadata": broker.metadata_url, "topic": "mixed", "startingOffsets": "earliest",
                            "maxOffsetsPerTrigger": "30", "minOffsetsPerTrigger": "20", "maxTriggerDelay": "2m"},
                           streaming=True)
    now = [1000.0]
    monkeypatch.setattr(planning.time, "monotonic", lambda: now[0])
    stream = StreamReader(options, None)
    start = stream.initialOffset()
    assert start == {"mixed": {"0": 0, "1": 0}}
    first = stream.latestOffset(start, stream.getDefaultReadLimit())
    assert sum(first["mixed"].values()) == 30                  # capped by maxOffsetsPerTrigger
    nearly = {"mixed": {"0": 45, "1": 45}}                       # 10 records left: fewer than 20
    assert stream.latestOffset(nearly, stream.getDefaultReadLimit()) == nearly
    now[0] += 119.0
    assert stream.latestOffset(nearly, stream.getDefaultReadLimit()) == nearly
    now[0] += 1.0                                                # maxTriggerDelay has passed
    assert stream.latestOffset(nearly, stream.getDefaultReadLimit()) == {"mixed": {"0": 50, "1": 50}}


@pytest.mark.parametrize("raw, message", [
    ({"assign": '{"mixed": "0"}'}, "option assign is JSON like"),
    ({"topic": "mixed", "startingTimestamp": "soon"}, "startingTimestamp is milliseconds"),
    ({"topic": "mixed", "maxTriggerDelay": "forever"}, "maxTriggerDelay is a duration"),
    ({"topic": "mixed", "includeHeaders": "yes"}, "includeHeaders must be true or false"),
    ({"topic": "mixed", "kafka.ssl.keystore.location": "x.jks"}, "reads PEM files, not Java key stores"),
    ({"topic": "mixed", "minOffsetsPerTrigger": "9", "maxOffsetsPerTrigger": "5"}, "above maxOffsetsPerTrigger"),
])
def test_bad_option_values_are_refused_naming_the_option(raw, message):
    with pytest.raises(OptionError, match=message):
        parse_source({"metadata": "sqlite:///nowhere", **raw}, streaming=True)


@pytest.mark.parametrize("codec", CODECS)
def test_a_write_of_each_codec_is_stored_compressed_and_reads_back_with_headers_and_nulls(spark, broker, codec):
    topic = f"written-{codec}"
    create_topic(broker.bootstrap, topic, 1)
    rows = [(None if i % 3 == 0 else f"k{i}".encode(), None if i % 4 == 1 else f"v{i}".encode(),
             [("codec", codec.encode()), ("null", None)]) for i in range(20)]
    frame = spark.createDataFrame(rows, "key binary, value binary, headers array<struct<key: string, value: binary>>")
    (frame.write.format("walkit").option("metadata", broker.metadata_url).option("topic", topic)
     .option("kafka.compression.type", codec).mode("append").save())
    stored = wait_stored(broker.metadata_url, topic, len(rows))
    assert set(codec_ids(stored)) == {CODEC_IDS[codec]}
    back = read(spark, broker, topic=topic).orderBy("offset").collect()
    assert [(r.key, r.value, [(h.key, h.value) for h in r.headers if h.key != TAG_HEADER]) for r in back] == \
        [(k, v, [(name, value) for name, value in h]) for k, v, h in rows]


def test_write_id_names_a_batch_write_only():
    from pyspark.sql.types import BinaryType, StructField, StructType

    from walkit.adapters.spark.options import parse_sink
    from walkit.adapters.spark.writer import StreamWriter
    sink = {"metadata": "sqlite:///nowhere", "topic": "out"}
    assert parse_sink({**sink, "writeId": "orders-2026-01-01"}).write_id == "orders-2026-01-01"
    with pytest.raises(OptionError, match="option writeId names a write with 1-200 letters"):
        parse_sink({**sink, "writeId": "spark/sinks"})
    with pytest.raises(OptionError, match="option writeId is for batch writes"):
        StreamWriter(parse_sink({**sink, "writeId": "once"}), StructType([StructField("value", BinaryType())]))
