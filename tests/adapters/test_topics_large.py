"""`walkit topics serve` and record batches larger than a partition's log entry holds (issue 39).

A batch over the topic's max.message.bytes is answered MESSAGE_TOO_LARGE (Kafka error 10) for
its partition, as Kafka answers a batch over `max.message.bytes`; nothing is appended, the
broker keeps leading the partition (same election epoch, same ledger: no step-down) and the
next normal produce succeeds and is consumed. The broker here runs with the largest limits a
log entry allows (`--max-message-bytes`) and takes requests up to 128 MiB
(`--max-request-bytes`), so a 100 MiB batch reaches the broker and is judged there; the
clients' own size limits are raised for the same reason.
"""

from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka import KafkaError as ConfluentError
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import MessageSizeTooLargeError

import walkit
from walkit.adapters.topics import errors
from walkit.adapters.topics.catalog import MAX_MESSAGE_BYTES, Catalog, partition_log, partition_name
from walkit.adapters.topics.ownership import election_key

from tests.support.serverprocess import TopicsProcess

pytestmark = pytest.mark.slow

MIB = 1024 * 1024
HUNDRED_MIB = 100 * MIB


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """broker is one `walkit topics serve` on an embedded cluster whose limits are as large as an entry allows."""
    workdir = tmp_path_factory.mktemp("topics-large")
    process = TopicsProcess(workdir, data_dir=workdir / "data",
                            args=("--max-message-bytes", str(MAX_MESSAGE_BYTES),
                                  "--max-request-bytes", str(128 * MIB)))
    process.start().wait_ready()
    yield process
    process.stop()


def create_topic(broker: TopicsProcess, name: str, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1, config=configs)],
                                  operation_timeout=15)
    futures[name].result(30)


def leadership(broker: TopicsProcess, topic_name: str) -> tuple:
    """leadership is what a step-down of partition 0's leader would change: election holder and epoch, ledgers."""
    with walkit.Client(broker.metadata_url) as client:
        topic = Catalog(client.store).topic(topic_name)
        value, _ = client.store.get(election_key(partition_name(topic, 0)))
        held = json.loads(value)
        return held["candidate"], held["epoch"], tuple(client.log_metadata(partition_log(topic, 0)).ledger_ids)


def kafka_producer(broker: TopicsProcess) -> KafkaProducer:
    return KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", retries=0, linger_ms=0,
                         max_request_size=200 * MIB, request_timeout_ms=120_000,
                         max_block_ms=120_000)


def consume(broker: TopicsProcess, topic: str, count: int) -> list[bytes]:
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False,
                             fetch_max_bytes=128 * MIB, max_partition_fetch_bytes=128 * MIB,
                             consumer_timeout_ms=60_000)
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        values = []
        for message in consumer:
            values.append(message.value)
            if len(values) == count:
                break
        return values
    finally:
        consumer.close()


def test_a_100_mib_batch_from_kafka_python_gets_message_too_large_and_the_broker_keeps_leading(broker):
    topic = f"large-{uuid.uuid4().hex[:8]}"
    create_topic(broker, topic)
    producer = kafka_producer(broker)
    try:
        producer.send(topic, b"before").get(60)
        before = leadership(broker, topic)
        sent = producer.send(topic, b"x" * HUNDRED_MIB)        # under max_request_size: it goes to the broker
        with pytest.raises(MessageSizeTooLargeError) as refused:
            sent.get(120)
        assert refused.value.errno == errors.MESSAGE_TOO_LARGE == 10
        assert leadership(broker, topic) == before            # same leader, epoch and ledger: no step-down
        after = producer.send(topic, b"after").get(60)
        assert after.offset == 1                                # the refused batch took no offset
    finally:
        producer.close()
    assert consume(broker, topic, 2) == [b"before", b"after"]
    assert leadership(broker, topic) == before
    assert "stepping down" not in broker.log_tail(10_000)


def test_a_100_mib_batch_from_confluent_kafka_gets_msg_size_too_large_and_the_next_produce_is_consumed(broker):
    topic = f"large-{uuid.uuid4().hex[:8]}"
    create_topic(broker, topic)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0,
                         "message.max.bytes": 200 * MIB, "queue.buffering.max.kbytes": 512 * 1024,
                         "message.timeout.ms": 120_000, "enable.idempotence": False})
    outcomes: list = []

    def delivered(error, message):
        outcomes.append((error, message.offset()))
    producer.produce(topic, value=b"before", on_delivery=delivered)
    assert producer.flush(60) == 0
    before = leadership(broker, topic)
    producer.produce(topic, value=b"y" * HUNDRED_MIB, on_delivery=delivered)    # under message.max.bytes: it is sent
    assert producer.flush(120) == 0
    producer.produce(topic, value=b"after", on_delivery=delivered)
    assert producer.flush(60) == 0
    (first, first_offset), (refused, _), (last, last_offset) = outcomes
    assert first is None and last is None
    assert refused is not None and refused.code() == ConfluentError.MSG_SIZE_TOO_LARGE
    assert (first_offset, last_offset) == (0, 1)
    assert leadership(broker, topic) == before
    assert consume(broker, topic, 2) == [b"before", b"after"]


def test_a_batch_near_the_entry_limit_is_stored_and_consumed(broker):
    """The broker's limit is real: a 50 MiB batch (under MAX_MESSAGE_BYTES) crosses the log and comes back whole."""
    topic = f"large-{uuid.uuid4().hex[:8]}"
    create_topic(broker, topic)
    value = bytes(range(256)) * (50 * MIB // 256)
    producer = kafka_producer(broker)
    try:
        assert producer.send(topic, value).get(120).offset == 0
    finally:
        producer.close()
    assert consume(broker, topic, 1) == [value]


def test_max_message_bytes_above_what_an_entry_holds_is_an_invalid_config(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    name = f"large-{uuid.uuid4().hex[:8]}"
    futures = admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1,
                                            config={"max.message.bytes": str(MAX_MESSAGE_BYTES + 1)})],
                                  operation_timeout=15)
    with pytest.raises(KafkaException) as refused:
        futures[name].result(30)
    assert refused.value.args[0].code() == ConfluentError.INVALID_CONFIG
    assert str(MAX_MESSAGE_BYTES) in refused.value.args[0].str()


def test_a_topic_stored_with_a_larger_max_message_bytes_is_held_to_what_an_entry_holds(broker):
    """A topic stored with max.message.bytes = 200 MiB (by an older broker, say) still gets MESSAGE_TOO_LARGE."""
    name = f"large-{uuid.uuid4().hex[:8]}"
    with walkit.Client(broker.metadata_url) as client:
        Catalog(client.store).create_topic(name, 1, {"max.message.bytes": str(200 * MIB)}, largest_message=200 * MIB)
    producer = kafka_producer(broker)
    try:
        producer.send(name, b"before").get(60)
        before = leadership(broker, name)
        sent = producer.send(name, b"z" * HUNDRED_MIB)
        with pytest.raises(MessageSizeTooLargeError):
            sent.get(120)
        assert leadership(broker, name) == before
        assert producer.send(name, b"after").get(60).offset == 1
    finally:
        producer.close()
    assert consume(broker, name, 2) == [b"before", b"after"]
