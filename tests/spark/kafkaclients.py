"""Kafka-protocol helpers of the Spark tests: topics made, records produced and read through the broker.

The tests check what Spark read or wrote against what confluent-kafka (librdkafka) produced and
consumed through the broker, a path that shares no code with the data source's readers.
"""

from __future__ import annotations

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def create_topic(bootstrap: str, name: str, partitions: int, **configs: str) -> None:
    """create_topic creates a topic with AdminClient and waits until it exists."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1, config=configs)],
                                  operation_timeout=15)
    futures[name].result(30)


def produce(bootstrap: str, topic: str, records, **config) -> list[tuple]:
    """produce writes records (key, value[, headers[, timestamp ms]]) idempotently; it returns
    (key, value, partition, offset, headers) of each, as the broker acknowledged them."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5, **config})
    acked = []

    def delivered(error, message, headers):
        assert error is None, error
        acked.append((message.key(), message.value(), message.partition(), message.offset(), list(headers or [])))
    for record in records:
        key, value, headers, stamp = (*record, None, None)[:4]
        extra = {"timestamp": stamp} if stamp is not None else {}
        while True:
            try:
                producer.produce(topic, key=key, value=value, headers=headers, **extra,
                                 on_delivery=lambda error, message, h=headers: delivered(error, message, h))
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0
    return acked


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """end_offsets is each partition's high watermark, from the broker."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "spark-tests-watermarks"})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
    finally:
        consumer.close()


def consume_all(bootstrap: str, topic: str, partitions: int) -> list:
    """consume_all reads every record of the topic up to its current end through the broker."""
    ends = end_offsets(bootstrap, topic, partitions)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "spark-tests-reader",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions) if ends[p] > 0])
    messages, remaining = [], sum(ends.values())
    try:
        while remaining > 0:
            batch = consumer.consume(1000, timeout=10)
            assert batch, f"no more records from {topic} with {remaining} still to read"
            for message in batch:
                assert message.error() is None, message.error()
                messages.append(message)
                remaining -= 1
    finally:
        consumer.close()
    return messages
