"""A compacted topic of `walkit topics serve` through confluent-kafka, kcat and AdminClient.

One broker process for the module, and two on a cluster of their own for the failover test;
retention and compaction are checked every 200 ms. The topics roll their ledger every second
(segment.ms), so what was produced is soon in a closed ledger that compaction rewrites. A
sentinel key is produced while waiting, so the partition's last batch (never rewritten) is not
one of the checked keys.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from walkit.local import LocalCluster
from walkit.testing.processes import wait_until
from tests.support.serverprocess import TopicsProcess, kcat, topics_brokers

from .test_topics_admin import create_topic
from .test_topics_failover import broker_ids, leaders

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """broker is one `walkit topics serve` on an embedded cluster, for the whole module."""
    workdir = tmp_path_factory.mktemp("topics-compaction")
    process = TopicsProcess(workdir, data_dir=workdir / "data", args=("--retention-check-ms", "200"))
    process.start().wait_ready()
    yield process
    process.stop()


def produce(broker: TopicsProcess, topic: str, pairs) -> dict[int, tuple[bytes, bytes | None]]:
    """produce writes (key, value) pairs with an idempotent confluent-kafka producer; it returns them by offset."""
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5})
    stored: dict[int, tuple[bytes, bytes | None]] = {}

    def delivered(error, message):
        assert error is None, error
        stored[message.offset()] = (message.key(), message.value())
    for key, value in pairs:
        producer.produce(topic, key=key, value=value, on_delivery=delivered)
    assert producer.flush(30) == 0
    return stored


def kcat_records(broker: TopicsProcess, topic: str, offset: str = "beginning") -> list[tuple[int, str, str]]:
    """kcat_records consumes the topic with kcat: (offset, key, value), a null value read as NULL."""
    out = kcat("-b", broker.bootstrap, "-t", topic, "-p", "0", "-C", "-e", "-Z", "-o", offset, "-f", "%o|%k|%s\\n")
    return [(int(o), k, v) for o, k, v in (line.split("|", 2) for line in out.splitlines())]


def confluent_records(broker: TopicsProcess, topic: str, offset: int = 0) -> list[tuple[int, bytes, bytes | None]]:
    """confluent_records reads the partition from `offset` to its end with a confluent-kafka consumer."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "reader", "enable.auto.commit": False,
                         "enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(topic, 0, offset)])
        records = []
        while True:
            message = consumer.poll(10)
            assert message is not None, "no end of partition within 10 s"
            if message.error():
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                return records
            records.append((message.offset(), message.key(), message.value()))
    finally:
        consumer.close()


def latest_per_key(stored: dict[int, tuple[bytes, bytes | None]]) -> dict[bytes, tuple[int, bytes | None]]:
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    for offset in sorted(stored):
        key, value = stored[offset]
        latest[key] = (offset, value)
    return latest


def test_a_compacted_topic_keeps_exactly_the_latest_value_per_key_and_drops_tombstones_after_their_retention(
        broker):
    topic = "compacted"
    create_topic(broker, topic, 1, **{"cleanup.policy": "compact", "segment.ms": "1000",
                                   "delete.retention.ms": "3600000"})
    stored = produce(broker, topic, [(b"k%d" % key, b"v%d-%d" % (round_, key))
                                     for round_ in range(5) for key in range(10)])
    stored.update(produce(broker, topic, [(b"k0", None), (b"k1", None)]))            # tombstones
    kcat("-b", broker.bootstrap, "-t", topic, "-p", "0", "-P", "-K:", input="k2:from kcat\n")
    stored.update((offset, (b"k2", b"from kcat")) for offset in [max(stored) + 1])
    latest = latest_per_key(stored)
    sentinels = itertools.count()

    def checked_keys() -> list[tuple[int, bytes, bytes | None]]:
        return [r for r in confluent_records(broker, topic) if r[1] != b"sentinel"]

    def compacted(expected):
        produce(broker, topic, [(b"sentinel", b"%d" % next(sentinels))])        # the last batch is never rewritten
        found = checked_keys()
        return found if found == expected else None
    with_tombstones = sorted((offset, key, value) for key, (offset, value) in latest.items())
    assert wait_until(lambda: compacted(with_tombstones), 60, interval=0.5,
                      message="the topic compacts to the latest value per key, tombstones kept") == with_tombstones
    assert len(with_tombstones) == 10 and (latest[b"k0"][1], latest[b"k2"][1]) == (None, b"from kcat")
    by_kcat = [r for r in kcat_records(broker, topic) if r[1] != "sentinel"]
    assert by_kcat == [(offset, key.decode(), "NULL" if value is None else value.decode())
                       for offset, key, value in with_tombstones]

    first_kept = with_tombstones[0][0]                   # a consumer at a removed offset gets the next record
    assert first_kept > 0 and confluent_records(broker, topic, first_kept - 1)[0][0] == first_kept
    assert kcat_records(broker, topic, str(first_kept - 1))[0][0] == first_kept

    client = AdminClient({"bootstrap.servers": broker.bootstrap})
    shorter = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("delete.retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)])
    next(iter(client.incremental_alter_configs([shorter]).values())).result(30)
    without_tombstones = [r for r in with_tombstones if r[2] is not None]
    assert wait_until(lambda: compacted(without_tombstones), 60, interval=0.5,
                      message="tombstones go once delete.retention.ms passed") == without_tombstones
    assert {key for _, key, _ in without_tombstones} == {b"k%d" % key for key in range(2, 10)}


def test_compact_delete_compacts_and_then_retention_removes_the_compacted_ledgers(broker):
    topic = "compacted-and-deleted"
    create_topic(broker, topic, 1, **{"cleanup.policy": "compact,delete", "segment.ms": "1000",
                                   "retention.ms": "3600000"})
    stored = produce(broker, topic, [(b"a", b"1"), (b"b", b"2"), (b"a", b"3")])
    sentinels = itertools.count()

    def compacted():
        produce(broker, topic, [(b"sentinel", b"%d" % next(sentinels))])
        found = [r for r in confluent_records(broker, topic) if r[1] != b"sentinel"]
        return found if found == [(1, b"b", b"2"), (2, b"a", b"3")] else None
    wait_until(compacted, 60, interval=0.5, message="compact,delete compacts")
    assert stored == {0: (b"a", b"1"), 1: (b"b", b"2"), 2: (b"a", b"3")}

    client = AdminClient({"bootstrap.servers": broker.bootstrap})
    shorter = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)])
    next(iter(client.incremental_alter_configs([shorter]).values())).result(30)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "watermarks"})
    try:
        def log_start_past_the_compacted_records() -> int | None:
            produce(broker, topic, [(b"sentinel", b"%d" % next(sentinels))])
            low, _ = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
            return low if low > 2 else None
        assert wait_until(log_start_past_the_compacted_records, 60, interval=0.5,
                          message="retention removes the compacted ledgers") > 2
    finally:
        consumer.close()
    assert all(key == b"sentinel" for _, key, _ in confluent_records(broker, topic))


@pytest.fixture
def two_brokers(tmp_path):
    """two_brokers are two broker processes on a LocalCluster of their own."""
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster")) as cluster:
        with topics_brokers(tmp_path, cluster.metadata_url, 2, ("--retention-check-ms", "200")) as brokers:
            yield brokers


def test_the_survivor_of_a_sigkilled_compacting_leader_serves_the_compacted_log_and_compacts_on(two_brokers):
    both = SimpleNamespace(bootstrap=",".join(b.bootstrap for b in two_brokers))
    topic = "compacted-failover"
    create_topic(both, topic, 1, **{"cleanup.policy": "compact", "segment.ms": "1000"})
    wait_until(lambda: leaders(both.bootstrap, topic)[0] >= 0 and len(broker_ids(both.bootstrap)) == 2, 30,
               message="a leader and two brokers")
    sentinels = itertools.count()

    def compacted(via, expected):
        produce(via, topic, [(b"sentinel", b"%d" % next(sentinels))])
        found = [r for r in confluent_records(via, topic) if r[1] != b"sentinel"]
        return found if found == expected else None

    def latest_records(stored):
        return sorted((offset, key, value) for key, (offset, value) in latest_per_key(stored).items())
    stored = produce(both, topic, [(b"k%d" % key, b"v%d-%d" % (round_, key))
                                   for round_ in range(5) for key in range(10)])
    expected = latest_records(stored)
    wait_until(lambda: compacted(both, expected), 60, interval=0.5, message="the leader compacts")

    ports = broker_ids(both.bootstrap)
    victim_id = leaders(both.bootstrap, topic)[0]
    victim = next(b for b in two_brokers if b.port == ports[victim_id])
    survivor = next(b for b in two_brokers if b is not victim)
    victim.kill()
    wait_until(lambda: leaders(survivor.bootstrap, topic)[0] not in (-1, victim_id), 60,
               message="the survivor leads the partition")
    assert [r for r in confluent_records(survivor, topic) if r[1] != b"sentinel"] == expected   # as replicated

    stored.update(produce(survivor, topic, [(b"k%d" % key, b"after-%d" % key) for key in range(0, 10, 2)]))
    expected = latest_records(stored)
    assert wait_until(lambda: compacted(survivor, expected), 60, interval=0.5,
                      message="the survivor compacts what was produced after the kill") == expected
