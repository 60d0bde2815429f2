"""The admin APIs of `walkit topics serve` through confluent-kafka's AdminClient, kafka-python and kcat.

One broker process serves the module; the expiry test starts its own, whose committed offsets
expire after 0.05 minutes (3 s) of their group being empty, checked every 200 ms, and the
two-broker test two on a cluster of their own. The last test restarts the module's broker, so
every partition gets a new leadership (a new leader epoch).
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from confluent_kafka import (
    Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException, Producer, TopicPartition,
)
from confluent_kafka.admin import (
    AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient, AlterConfigOpType, ConfigEntry,
    ConfigResource, NewPartitions, NewTopic, OffsetSpec, ResourcePatternType, ResourceType,
)
from kafka import KafkaAdminClient
from kafka import TopicPartition as KafkaTopicPartition
from kafka.errors import NoError
from kafka.protocol.consumer import OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from walkit.adapters.topics.catalog import MAX_MESSAGE_BYTES
from walkit.adapters.topics.errors import FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH
from walkit.local import LocalCluster
from walkit.testing.processes import wait_until
from tests.support.kafka_fuzz import KafkaWire, encode, framed
from tests.support.serverprocess import TopicsProcess, kcat

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """broker is one `walkit topics serve` on an embedded cluster, for the whole module."""
    workdir = tmp_path_factory.mktemp("topics-admin")
    process = TopicsProcess(workdir, data_dir=workdir / "data",
                            args=("--retention-check-ms", "200", "--rebalance-delay-ms", "300"))
    process.start().wait_ready()
    yield process
    process.stop()


@pytest.fixture
def forgetful(tmp_path):
    """forgetful is a broker whose committed offsets expire 3 s after their group emptied."""
    process = TopicsProcess(tmp_path, data_dir=tmp_path / "data",
                            args=("--retention-check-ms", "200", "--rebalance-delay-ms", "300",
                                  "--offsets-retention-minutes", "0.05"))
    process.start().wait_ready()
    yield process
    process.stop()


def admin(broker: TopicsProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def create_topic(broker: TopicsProcess, name: str, partitions: int, **configs: str) -> None:
    client = admin(broker)                                   # held: a dropped client fails its futures
    futures = client.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1,
                                             config=configs)], operation_timeout=15)
    futures[name].result(30)


def produce(broker: TopicsProcess, topic: str, values, partition: int = 0, **config) -> list:
    """produce writes values to one partition with an idempotent producer; it returns (error, offset) per value."""
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5, **config})
    results = []

    def delivered(error, message):
        results.append((error, message.offset()))
    for value in values:
        producer.produce(topic, value=value, partition=partition, on_delivery=delivered)
        producer.flush(30)                                   # one at a time: each result in order
    assert producer.flush(30) == 0
    return results


def kafka_error(future, timeout: float = 30) -> KafkaError | None:
    """kafka_error is the KafkaError an AdminClient future fails with, None if it succeeds."""
    try:
        future.result(timeout)
    except KafkaException as exc:
        return exc.args[0]
    return None


def test_create_partitions_adds_partitions_that_kcat_lists_and_produces_to(broker):
    create_topic(broker, "growing", 2)
    client = admin(broker)
    assert kafka_error(client.create_partitions([NewPartitions("growing", 5)], operation_timeout=15)["growing"]) is None
    metadata = json.loads(kcat("-b", broker.bootstrap, "-L", "-J", "-t", "growing"))
    partitions = metadata["topics"][0]["partitions"]
    assert sorted(p["partition"] for p in partitions) == [0, 1, 2, 3, 4]
    assert all(p["leader"] >= 0 for p in partitions), partitions
    produced = subprocess.run(["kcat", "-b", broker.bootstrap, "-t", "growing", "-p", "4", "-P"], input="on four\n",
                              capture_output=True, text=True, timeout=60)
    assert produced.returncode == 0, produced.stderr
    assert kcat("-b", broker.bootstrap, "-t", "growing", "-p", "4", "-C", "-e", "-o", "beginning").split() == [
        "on", "four"]
    shrink = kafka_error(client.create_partitions([NewPartitions("growing", 3)])["growing"])
    assert shrink is not None and shrink.code() == KafkaError.INVALID_PARTITIONS
    missing = kafka_error(client.create_partitions([NewPartitions("no-such-topic", 3)])["no-such-topic"])
    assert missing is not None and missing.code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_delete_records_moves_the_log_start_and_a_consumer_behind_it_resets_to_it(broker):
    create_topic(broker, "trimmed", 1)
    assert [offset for _, offset in produce(broker, "trimmed", [b"r%d" % i for i in range(30)])] == list(range(30))
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "behind", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition("trimmed", 0, 5)], asynchronous=False)
    client = admin(broker)
    deleted = client.delete_records([TopicPartition("trimmed", 0, 12)], operation_timeout=15)
    assert next(iter(deleted.values())).result(30).low_watermark == 12
    assert consumer.get_watermark_offsets(TopicPartition("trimmed", 0), timeout=10) == (12, 30)
    out = kcat("-b", broker.bootstrap, "-t", "trimmed", "-C", "-e", "-o", "beginning", "-f", "%o %s\\n")
    assert [line.split() for line in out.splitlines()] == [[str(i), "r%d" % i] for i in range(12, 30)]
    consumer.subscribe(["trimmed"])                          # committed 5: out of range, reset to the earliest
    got = []
    deadline = time.monotonic() + 60
    while len(got) < 18 and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            got.append(message.offset())
    consumer.close()
    assert got == list(range(12, 30))
    python_admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        result = python_admin.delete_records({KafkaTopicPartition("trimmed", 0): -1})      # -1: the high watermark
        assert result[KafkaTopicPartition("trimmed", 0)]["low_watermark"] == 30
    finally:
        python_admin.close()
    beyond = client.delete_records([TopicPartition("trimmed", 0, 31)], operation_timeout=15)
    error = kafka_error(next(iter(beyond.values())))
    assert error is not None and error.code() == KafkaError.OFFSET_OUT_OF_RANGE


def test_topic_configs_change_at_runtime_and_max_message_bytes_answers_message_too_large(broker):
    create_topic(broker, "limited", 1)
    client = admin(broker)
    resource = ConfigResource(ResourceType.TOPIC, "limited", incremental_configs=[
        ConfigEntry("max.message.bytes", "2000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET)])
    assert kafka_error(next(iter(client.incremental_alter_configs([resource]).values()))) is None
    described = next(iter(client.describe_configs([ConfigResource(ResourceType.TOPIC, "limited")]).values())).result(30)
    assert (described["max.message.bytes"].value, described["retention.ms"].value) == ("2000", "3600000")
    assert not described["max.message.bytes"].is_default

    def refused_then_served() -> list:
        results = produce(broker, "limited", [b"x" * 5000, b"small"], **{"enable.idempotence": False})
        return results if results[0][0] is not None else None
    results = wait_until(refused_then_served, 30, message="the broker applies max.message.bytes = 2000",
                         interval=0.2)
    assert results[0][0].code() == KafkaError.MSG_SIZE_TOO_LARGE
    assert results[1][0] is None                              # the same producer's connection keeps serving

    above = ConfigResource(ResourceType.TOPIC, "limited", incremental_configs=[
        ConfigEntry("max.message.bytes", str(MAX_MESSAGE_BYTES + 1), incremental_operation=AlterConfigOpType.SET)])
    error = kafka_error(next(iter(client.incremental_alter_configs([above]).values())))
    assert error is not None and error.code() == KafkaError.INVALID_CONFIG
    unknown = ConfigResource(ResourceType.TOPIC, "limited", incremental_configs=[
        ConfigEntry("no.such.config", "1", incremental_operation=AlterConfigOpType.SET)])
    error = kafka_error(next(iter(client.incremental_alter_configs([unknown]).values())))
    assert error is not None and error.code() == KafkaError.INVALID_CONFIG

    replaced = ConfigResource(ResourceType.TOPIC, "limited", set_config={"retention.ms": "7200000"})
    assert kafka_error(next(iter(client.alter_configs([replaced]).values()))) is None   # the whole set
    described = next(iter(client.describe_configs([ConfigResource(ResourceType.TOPIC, "limited")]).values())).result(30)
    assert described["retention.ms"].value == "7200000" and described["max.message.bytes"].is_default

    def served_again() -> bool:
        return produce(broker, "limited", [b"x" * 5000], **{"enable.idempotence": False})[0][0] is None
    wait_until(served_again, 30, message="the broker applies the default max.message.bytes again", interval=0.2)


def test_groups_offsets_are_listed_altered_deleted_and_non_empty_groups_refused(broker):
    create_topic(broker, "grouped", 2)
    produce(broker, "grouped", [b"a", b"b", b"c"])
    client = admin(broker)
    tps = [TopicPartition("grouped", 0, 2), TopicPartition("grouped", 1, 0)]
    altered = client.alter_consumer_group_offsets([ConsumerGroupTopicPartitions("tidy", tps)])
    assert kafka_error(altered["tidy"]) is None
    listed = client.list_consumer_group_offsets([ConsumerGroupTopicPartitions("tidy")])["tidy"].result(30)
    assert sorted((tp.partition, tp.offset) for tp in listed.topic_partitions) == [(0, 2), (1, 0)]

    python_admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        result = python_admin.delete_group_offsets("tidy", [KafkaTopicPartition("grouped", 1)])   # OffsetDelete
        assert result == {KafkaTopicPartition("grouped", 1): NoError}
        left = python_admin.list_group_offsets({"tidy": None})["tidy"]
        assert {tp.partition: meta.offset for tp, meta in left.items()} == {0: 2}
    finally:
        python_admin.close()

    member = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "tidy", "auto.offset.reset": "earliest",
                       "enable.auto.commit": False, "session.timeout.ms": 10000})
    member.subscribe(["grouped"])
    wait_until(lambda: member.poll(0.2) is not None or member.assignment(), 60, message="a member of tidy")
    busy = kafka_error(client.delete_consumer_groups(["tidy"])["tidy"])
    assert busy is not None and busy.code() == KafkaError.NON_EMPTY_GROUP
    member.close()

    def deleted() -> bool:
        return kafka_error(client.delete_consumer_groups(["tidy"])["tidy"]) is None
    wait_until(deleted, 30, message="tidy deleted once its member left", interval=0.2)
    listed = client.list_consumer_group_offsets([ConsumerGroupTopicPartitions("tidy")])["tidy"].result(30)
    assert listed.topic_partitions == []
    gone = kafka_error(client.delete_consumer_groups(["tidy"])["tidy"])
    assert gone is not None and gone.code() == KafkaError.GROUP_ID_NOT_FOUND


def test_committed_offsets_expire_once_their_group_was_empty_for_the_retention(forgetful):
    broker = forgetful
    create_topic(broker, "expiring", 1)
    produce(broker, "expiring", [b"one", b"two"])
    client = admin(broker)
    member = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "fading", "auto.offset.reset": "earliest",
                       "enable.auto.commit": False, "session.timeout.ms": 10000})
    member.subscribe(["expiring"])
    message = wait_until(lambda: member.poll(0.2), 60, message="a record for fading")
    member.commit(message=message, asynchronous=False)
    committed_at = time.monotonic()

    def committed() -> dict:
        listed = client.list_consumer_group_offsets([ConsumerGroupTopicPartitions("fading")])["fading"].result(30)
        return {tp.partition: tp.offset for tp in listed.topic_partitions}
    while time.monotonic() - committed_at < 5:               # past the 3 s retention, the group still has a member
        member.poll(0.2)
        assert committed() == {0: message.offset() + 1}
    member.close()                                           # empty from now: expires 3 s later
    closed_at = time.monotonic()
    assert committed() == {0: message.offset() + 1}
    wait_until(lambda: committed() == {}, 30, message="fading's offsets expired", interval=0.1)
    assert time.monotonic() - closed_at >= 2.5


def test_describe_cluster_and_acls_are_stored_listed_and_deleted(broker):
    client = admin(broker)
    cluster = client.describe_cluster().result(30)
    assert cluster.cluster_id == "walkit" and [n.port for n in cluster.nodes] == [broker.port]
    assert cluster.controller.id == cluster.nodes[0].id
    bindings = [AclBinding(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:alice", "*",
                           AclOperation.READ, AclPermissionType.ALLOW),
                AclBinding(ResourceType.TOPIC, "ord", ResourcePatternType.PREFIXED, "User:bob", "*",
                           AclOperation.WRITE, AclPermissionType.DENY),
                AclBinding(ResourceType.GROUP, "readers", ResourcePatternType.LITERAL, "User:alice", "*",
                           AclOperation.READ, AclPermissionType.ALLOW)]
    for future in client.create_acls(bindings).values():
        assert kafka_error(future) is None
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                                  AclPermissionType.ANY)
    assert sorted(map(str, client.describe_acls(everything).result(30))) == sorted(map(str, bindings))
    matching = AclBindingFilter(ResourceType.TOPIC, "orders", ResourcePatternType.MATCH, None, None,
                                AclOperation.ANY, AclPermissionType.ANY)
    assert sorted(map(str, client.describe_acls(matching).result(30))) == sorted(map(str, bindings[:2]))
    alices = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, "User:alice", None, AclOperation.ANY,
                              AclPermissionType.ANY)
    deleted = next(iter(client.delete_acls([alices]).values())).result(30)
    assert sorted(map(str, deleted)) == sorted(map(str, [bindings[0], bindings[2]]))
    assert list(map(str, client.describe_acls(everything).result(30))) == [str(bindings[1])]
    python_admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        assert python_admin.describe_cluster()["cluster_id"] == "walkit"
    finally:
        python_admin.close()


def leader_epoch_end(broker: TopicsProcess, topic: str, epoch: int, current: int = -1) -> tuple[int, int, int]:
    """leader_epoch_end asks OffsetForLeaderEpoch v3 (kafka-python's message, a raw connection: no client
    exposes the request; librdkafka sends it on its own after a leader change): (error, epoch, end offset)."""
    part = OffsetForLeaderEpochRequest.OffsetForLeaderTopic.OffsetForLeaderPartition(
        partition=0, current_leader_epoch=current, leader_epoch=epoch)
    request = OffsetForLeaderEpochRequest(version=3, replica_id=-1, topics=[
        OffsetForLeaderEpochRequest.OffsetForLeaderTopic(topic=topic, partitions=[part])])
    with KafkaWire(broker.port) as wire:
        wire.send(framed(encode(request)))
        answer = OffsetForLeaderEpochResponse.decode(wire.read_frame(), version=3, header=True)
    found = answer.topics[0].partitions[0]
    return found.error_code, found.leader_epoch, found.end_offset


def consume_epochs(broker: TopicsProcess, topic: str, count: int) -> list[tuple[int, int]]:
    """consume_epochs reads `count` records from the beginning: (offset, leader epoch) of each."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"epochs-{time.monotonic_ns()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got = []
    deadline = time.monotonic() + 60
    while len(got) < count and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            got.append((message.offset(), message.leader_epoch()))
    consumer.close()
    return got


def test_leader_epochs_grow_with_each_leadership_and_offset_for_leader_epoch_ends_them(broker):
    create_topic(broker, "epochs", 1)
    produce(broker, "epochs", [b"first %d" % i for i in range(3)])
    before = consume_epochs(broker, "epochs", 3)
    first = before[0][1]
    assert first is not None and first >= 0 and [epoch for _, epoch in before] == [first] * 3
    assert leader_epoch_end(broker, "epochs", first) == (0, first, 3)
    broker.stop()
    broker.start().wait_ready()                              # a new leadership of every partition
    wait_until(lambda: produce(broker, "epochs", [b"second"])[0][0] is None, 60, message="epochs led again",
               interval=0.5)
    after = consume_epochs(broker, "epochs", 4)
    assert after[:3] == before and after[3][0] == 3 and after[3][1] > first
    second = after[3][1]
    assert leader_epoch_end(broker, "epochs", first) == (0, first, 3)      # where the next leadership began
    assert leader_epoch_end(broker, "epochs", second) == (0, second, 4)    # the current one: the log end
    assert leader_epoch_end(broker, "epochs", second + 1000)[1:] == (-1, -1)
    assert leader_epoch_end(broker, "epochs", second, current=first)[0] == FENCED_LEADER_EPOCH
    assert leader_epoch_end(broker, "epochs", second, current=second + 1)[0] == UNKNOWN_LEADER_EPOCH
    client = admin(broker)
    listed = {name: next(iter(client.list_offsets({TopicPartition("epochs", 0): spec}).values())).result(30)
              for name, spec in (("earliest", OffsetSpec.earliest()), ("latest", OffsetSpec.latest()))}
    assert (listed["earliest"].offset, listed["earliest"].leader_epoch) == (0, first)     # the record's epoch
    assert (listed["latest"].offset, listed["latest"].leader_epoch) == (4, second)        # the leader's own


def partition_leaders(port: int, topic: str) -> dict[int, tuple[int, int]]:
    """partition_leaders maps each partition of `topic` to (leader id, leader epoch) as broker `port`'s Metadata
    v12 says (kafka-python's messages on a raw connection: the clients do not show leader epochs)."""
    request = MetadataRequest(version=12, topics=[MetadataRequest.MetadataRequestTopic(name=topic)],
                              allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    with KafkaWire(port) as wire:
        wire.send(framed(encode(request)))
        answer = MetadataResponse.decode(wire.read_frame(), version=12, header=True)
    return {p.partition_index: (p.leader_id, p.leader_epoch) for p in answer.topics[0].partitions}


def test_two_brokers_apply_a_config_change_and_name_each_leader_with_its_epoch_across_a_failover(tmp_path):
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster")) as cluster:
        brokers = [TopicsProcess(tmp_path, metadata=cluster.metadata_url, args=("--rebalance-delay-ms", "300"))
                   for _ in range(2)]
        try:
            for broker in brokers:
                broker.start()
            for broker in brokers:
                broker.wait_ready()
            first, second = brokers
            create_topic(first, "shared", 6)

            def agreed() -> dict:
                views = [partition_leaders(broker.port, "shared") for broker in brokers]
                leading = {leader for leader, _ in views[0].values()}
                settled = all(leader >= 0 and epoch >= 0 for leader, epoch in views[0].values())
                return views[0] if views[0] == views[1] and settled and len(leading) == 2 else None
            before = wait_until(agreed, 60, message="both brokers name the same leaders and epochs, both leading",
                                interval=0.2)
            client = admin(first)
            resource = ConfigResource(ResourceType.TOPIC, "shared", incremental_configs=[
                ConfigEntry("max.message.bytes", "2000", incremental_operation=AlterConfigOpType.SET)])
            assert kafka_error(next(iter(client.incremental_alter_configs([resource]).values()))) is None

            def refused_everywhere() -> bool:
                return all(produce(second, "shared", [b"x" * 5000], partition=p, **{"enable.idempotence": False})[0][0]
                           is not None for p in range(6))
            wait_until(refused_everywhere, 30, message="every partition's leader refuses 5000 bytes", interval=0.2)

            acked = produce(second, "shared", [b"kept %d" % i for i in range(5)])
            start = acked[0][1]                              # after any 5000 bytes taken before the change
            assert acked == [(None, start + i) for i in range(5)]
            at_kill = wait_until(agreed, 60, message="both brokers agree again", interval=0.2)
            leader_id = at_kill[0][0]
            ports = {b["id"]: int(b["name"].rsplit(":", 1)[1])
                     for b in json.loads(kcat("-b", first.bootstrap, "-L", "-J"))["brokers"]}
            victim = next(b for b in brokers if b.port == ports[leader_id])
            survivor = next(b for b in brokers if b is not victim)
            victim.kill()

            def moved() -> tuple | None:
                leader, epoch = partition_leaders(survivor.port, "shared")[0]
                return (leader, epoch) if leader >= 0 and leader != leader_id else None
            new_leader, new_epoch = wait_until(moved, 60, message="partition 0 led by the survivor", interval=0.2)
            assert new_epoch > at_kill[0][1]
            consumer = Consumer({"bootstrap.servers": survivor.bootstrap, "group.id": "after-failover",
                                 "auto.offset.reset": "earliest", "enable.auto.commit": False})
            consumer.assign([TopicPartition("shared", 0, start)])
            got = []
            deadline = time.monotonic() + 60
            while len(got) < 5 and time.monotonic() < deadline:
                message = consumer.poll(0.5)
                if message is not None and message.error() is None:
                    got.append((message.value(), message.leader_epoch()))
            consumer.close()
            assert [value for value, _ in got] == [b"kept %d" % i for i in range(5)]
            assert {epoch for _, epoch in got} <= {before[0][1], at_kill[0][1]}     # stamped by their leader
        finally:
            for broker in brokers:
                broker.stop()
