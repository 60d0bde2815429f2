"""Every Kafka codec (gzip, snappy, lz4, zstd) through `walkit topics serve` with the real clients.

Each codec is produced by kcat (Debian's, librdkafka 2.0.2), confluent-kafka and kafka-python,
read back by all three, and checked where it is stored: the partition's log holds batches whose
attributes carry that codec, so a client that silently sent them uncompressed fails here, as
Debian's kcat did while ApiVersions reported Produce from v3 (librdkafka issue 4956). Time
lookups open the compressed batches: offsets_for_times into one 3-record batch answers each
record exactly. The first tests are pure (fast tier): first_offset_at and the ApiVersions table.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import crc32c
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as ConfluentPartition
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.protocol.producer import ProduceRequest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from walkit.adapters.topics import batches, errors
from walkit.adapters.topics.handlers import fetch
from walkit.adapters.topics.errors import KafkaError
from walkit.adapters.topics.versions import SUPPORTED
from walkit.adapters.topics.wire import BadRequest, api_table, parse_request

from ..integration.helpers import wait_until
from tests.support.serverprocess import TopicsProcess, api_versions, kcat, recv_exactly
from tests.spark.kafkaclients import create_topic
from tests.support.topicslog import CODEC_IDS, codec_ids, wait_stored

CODECS = ("gzip", "snappy", "lz4", "zstd")
#: Values compressible enough that librdkafka keeps them compressed (it sends a batch that
#: compression does not shrink as it is).
PADDING = "." * 200


def compressed_batch(codec: str, stamps: list[int], base_offset: int = 0) -> bytes:
    """compressed_batch is one magic-2 batch of len(stamps) records compressed with `codec`, as kafka-python builds it."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=CODEC_IDS[codec], is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i, stamp in enumerate(stamps):
        builder.append(i, timestamp=stamp, key=None, value=f"record {i} {PADDING}".encode(), headers=[])
    return batches.with_base_offset(bytes(builder.build()), base_offset)


# -- pure: first_offset_at and the version table ------------------------------------------------
@pytest.mark.parametrize("codec", ("none",) + CODECS)
def test_first_offset_at_finds_the_exact_record_inside_a_batch_of_each_codec(codec):
    stored = compressed_batch(codec, [5000, 5010, 5020], base_offset=40)
    assert codec_ids([stored]) == [CODEC_IDS[codec]]
    assert [batches.first_offset_at(stored, t) for t in (4000, 5000, 5001, 5011, 5020)] == \
        [(40, 5000), (40, 5000), (41, 5010), (42, 5020), (42, 5020)]
    assert batches.first_offset_at(stored, 5021) is None


def with_codec_id(batch: bytes, code: int) -> bytes:
    """with_codec_id is `batch` with its codec bits set to `code` and its CRC-32C made valid again."""
    head = bytearray(batch)
    attributes = int.from_bytes(head[21:23], "big")
    head[21:23] = ((attributes & ~batches.COMPRESSION) | code).to_bytes(2, "big")
    head[17:21] = crc32c.crc32c(bytes(head[21:])).to_bytes(4, "big")
    return bytes(head)


def test_a_batch_of_an_unknown_codec_is_refused_and_never_guessed():
    unknown = with_codec_id(compressed_batch("none", [1, 2, 3]), 5)
    with pytest.raises(KafkaError) as caught:
        batches.split(unknown, 1 << 20)
    assert caught.value.code == errors.CORRUPT_MESSAGE and "unknown codec 5" in str(caught.value)
    with pytest.raises(batches.MissingCodec, match="cannot read a codec 5 record batch"):
        batches.first_offset_at(unknown, 0)


def with_records_garbled(batch: bytes) -> bytes:
    """with_records_garbled is `batch` with every byte after its header 0xff and its CRC-32C made valid again."""
    head = bytearray(batch)
    head[61:] = b"\xff" * (len(head) - 61)
    head[17:21] = crc32c.crc32c(bytes(head[21:])).to_bytes(4, "big")
    return bytes(head)


@pytest.mark.parametrize("codec", ("none",) + CODECS)
def test_a_time_lookup_into_a_batch_whose_records_do_not_decode_answers_corrupt_message(codec, caplog):
    """The fuzz stored such batches (valid CRC, records that do not decode): ListOffsets by time used to fail
    with the decoder's exception (CorruptRecordError, lz4's RuntimeError), log a traceback and close the connection."""
    stored = with_records_garbled(compressed_batch(codec, [5000, 5010, 5020]))
    with pytest.raises(batches.CorruptBatch) as caught:
        batches.first_offset_at(stored, 0)
    assert caught.value.code == errors.CORRUPT_MESSAGE

    class Leader:
        async def offset_for_time(self, timestamp):
            return batches.first_offset_at(stored, timestamp)

    class Broker:
        def partition(self, topic, partition):
            return Leader()
    with caplog.at_level(logging.INFO):
        answer = asyncio.run(fetch._list_offset(Broker(), "t", 0, 4000))
    assert answer == (errors.CORRUPT_MESSAGE, -1, -1)
    assert len(caplog.records) == 1 and caplog.records[0].exc_info is None, caplog.text
    assert "t-0" in caplog.text and "corrupt" in caplog.text


def test_api_versions_reports_produce_from_v0_yet_requests_below_v3_are_refused():
    table = {entry.api_key: (entry.min_version, entry.max_version) for entry in api_table()}
    produce, fetch = ProduceRequest.API_KEY, 1
    assert table[produce] == (0, SUPPORTED[produce][2])          # what librdkafka < 2.8 needs to compress
    assert table[fetch] == SUPPORTED[fetch][1:] and SUPPORTED[fetch][1] == 4
    assert SUPPORTED[produce][1] == 3
    with pytest.raises(BadRequest, match="ProduceRequest version 2 is not supported"):
        parse_request(old_produce_frame()[4:])


def old_produce_frame() -> bytes:
    """old_produce_frame is a framed Produce v2 request carrying a gzip message set of magic 1 (Kafka 0.10)."""
    builder = LegacyRecordBatchBuilder(magic=1, compression_type=1, batch_size=1 << 20)
    builder.append(0, timestamp=1000, key=None, value=b"from a 0.10 client")
    data = ProduceRequest.TopicProduceData
    request = ProduceRequest(version=2, acks=1, timeout_ms=5000, topic_data=[data(
        name="old-clients", partition_data=[data.PartitionProduceData(index=0, records=bytes(builder.build()))])])
    request.with_header(correlation_id=7, client_id="kafka-0.10")
    return bytes(request.encode(header=True, framed=True))


# -- real broker and clients --------------------------------------------------------------------
@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """broker is one `walkit topics serve` on an embedded cluster, for the whole module."""
    workdir = tmp_path_factory.mktemp("codecs")
    process = TopicsProcess(workdir, data_dir=workdir / "data", args=("--rebalance-delay-ms", "300"))
    process.start().wait_ready()
    yield process
    process.stop()


def values_of(source: str, codec: str, count: int) -> list[str]:
    return [f"{source} {codec} {i} {PADDING}" for i in range(count)]


def produce_kcat(broker: TopicsProcess, topic: str, codec: str, values: list[str]) -> None:
    """produce_kcat writes `values` with `kcat -P -z codec`; kcat says nothing when it sends them uncompressed."""
    kcat("-b", broker.bootstrap, "-t", topic, "-p", "0", "-P", "-z", codec, input="".join(v + "\n" for v in values))


def produce_confluent(broker: TopicsProcess, topic: str, codec: str, values: list[str]) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": codec, "acks": "all",
                         "enable.idempotence": True, "linger.ms": 20})
    failures = []

    def delivered(error, _message) -> None:
        if error is not None:
            failures.append(error)
    for value in values:
        producer.produce(topic, value=value.encode(), partition=0, on_delivery=delivered)
    assert producer.flush(60) == 0 and not failures, failures


def produce_kafka_python(broker: TopicsProcess, topic: str, codec: str, values: list[str]) -> None:
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, compression_type=codec, acks="all", linger_ms=20)
    try:
        for future in [producer.send(topic, value=value.encode(), partition=0) for value in values]:
            future.get(30)
    finally:
        producer.close()


def read_kcat(broker: TopicsProcess, topic: str) -> list[str]:
    return kcat("-b", broker.bootstrap, "-t", topic, "-C", "-e", "-o", "beginning", "-f", "%s\\n").splitlines()


def read_confluent(broker: TopicsProcess, topic: str, count: int) -> list[str]:
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"{topic}-confluent",
                         "enable.auto.commit": False})
    consumer.assign([ConfluentPartition(topic, 0, 0)])
    got: list[str] = []
    deadline = time.monotonic() + 60
    try:
        while len(got) < count and time.monotonic() < deadline:
            for message in consumer.consume(count - len(got), timeout=1.0):
                assert message.error() is None, message.error()
                got.append(message.value().decode())
    finally:
        consumer.close()
    return got


def read_kafka_python(broker: TopicsProcess, topic: str, count: int) -> list[str]:
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False, consumer_timeout_ms=10_000)
    partition = TopicPartition(topic, 0)
    consumer.assign([partition])
    consumer.seek(partition, 0)
    got: list[str] = []
    try:
        for message in consumer:
            got.append(message.value.decode())
            if len(got) == count:
                break
    finally:
        consumer.close()
    return got


@pytest.mark.slow
@pytest.mark.parametrize("codec", CODECS)
def test_kcat_confluent_and_kafka_python_batches_of_each_codec_are_stored_compressed_and_read_by_all(broker, codec):
    topic = f"codec-{codec}"
    create_topic(broker.bootstrap, topic, 1)
    sent = values_of("kcat", codec, 20) + values_of("confluent", codec, 20) + values_of("kafka-python", codec, 20)
    produce_kcat(broker, topic, codec, sent[:20])
    produce_confluent(broker, topic, codec, sent[20:40])
    produce_kafka_python(broker, topic, codec, sent[40:])
    stored = wait_stored(broker.metadata_url, topic, 60)
    assert set(codec_ids(stored)) == {CODEC_IDS[codec]}, f"codecs of the stored batches: {codec_ids(stored)}"
    assert read_kcat(broker, topic) == sent
    assert read_confluent(broker, topic, 60) == sent
    assert read_kafka_python(broker, topic, 60) == sent


@pytest.mark.slow
@pytest.mark.parametrize("codec", CODECS)
def test_offsets_for_times_into_one_compressed_batch_answers_each_record(broker, codec):
    topic = f"times-{codec}"
    create_topic(broker.bootstrap, topic, 1)
    base = int(time.time() * 1000) - 60_000
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, compression_type=codec, acks="all", linger_ms=5000)
    futures = [producer.send(topic, value=f"t{i} {PADDING}".encode(), partition=0, timestamp_ms=base + 10 * i)
               for i in range(3)]
    producer.flush(30)
    assert [f.get(30).offset for f in futures] == [0, 1, 2]
    producer.close()
    stored = wait_stored(broker.metadata_url, topic, 3)
    assert len(stored) == 1 and codec_ids(stored) == [CODEC_IDS[codec]]           # one batch of three, compressed
    wanted = [base + 1, base + 11, base + 20]                                       # records stamped base, +10, +20
    partition = TopicPartition(topic, 0)
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False)
    try:
        found = [consumer.offsets_for_times({partition: stamp})[partition] for stamp in wanted]
        assert [(f.offset, f.timestamp) for f in found] == [(1, base + 10), (2, base + 20), (2, base + 20)]
        assert consumer.offsets_for_times({partition: base + 21})[partition] is None
    finally:
        consumer.close()
    confluent = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"{topic}-times"})
    try:
        answers = [confluent.offsets_for_times([ConfluentPartition(topic, 0, stamp)], timeout=30)[0]
                   for stamp in wanted]                                     # one partition per request: one each
        assert [answer.offset for answer in answers] == [1, 2, 2]
    finally:
        confluent.close()


@pytest.mark.slow
def test_the_broker_advertises_produce_from_v0_and_closes_a_connection_that_sends_v2(broker):
    advertised = {entry.api_key: (entry.min_version, entry.max_version) for entry in api_versions(broker.port).api_keys}
    assert advertised[ProduceRequest.API_KEY] == (0, SUPPORTED[ProduceRequest.API_KEY][2])
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
        sock.sendall(old_produce_frame())
        with pytest.raises(ConnectionError):
            recv_exactly(sock, 4)                                     # closed, as Kafka 4 closes it, no answer
    wait_until(lambda: "ProduceRequest version 2 is not supported" in broker.log_tail(200), 10,
               message=lambda: f"the broker did not log why it closed:\n{broker.log_tail(40)}")
