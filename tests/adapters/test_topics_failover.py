"""`walkit topics serve` brokers on one cluster: a partition leader is SIGKILLed mid-stream.

An idempotent acks=all producer (confluent-kafka) writes keyed records while a group of three
consumers reads them. Killing the broker that leads a partition moves its partitions (and any
group coordination it held) to the other two: every acknowledged record is consumed, none is
in the log twice, and the consumers go on (the group's membership moves with its coordination,
test_topics_groups_failover.py). Brokers that join later take
their share of the partitions while a producer writes, without losing or duplicating a record.
And a partition's leader killed while a bookie of its log is held with SIGSTOP loses nothing.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

import walkit
from walkit.adapters.topics.catalog import DEFAULT_GROUP_BUCKETS, group_bucket
from walkit.adapters.topics.ownership import Slot, preferred
from walkit.local import LocalCluster
from tests.support import pause

from ..integration.helpers import wait_until
from tests.support.serverprocess import TopicsProcess

pytestmark = pytest.mark.slow

RECORDS = 4000
PARTITIONS = 9          # with broker ids 1-3, the partitions' preferred leaders cover all three brokers
LEADER_MOVING = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE}
COORDINATOR_MOVING = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS}
OUT_OF_RANGE = {KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE}


@pytest.fixture
def start_brokers(tmp_path, request):
    """start_brokers starts broker processes on one LocalCluster (`start_brokers(n)`); all stop at the end.

    The cluster has 3 bookies, or as many as the test's indirect parameter says; it is
    `start_brokers.cluster`.
    """
    started: list[TopicsProcess] = []
    with LocalCluster(bookies=getattr(request, "param", 3), data_dir=str(tmp_path / "cluster")) as cluster:
        def start(count: int) -> list[TopicsProcess]:
            new = [TopicsProcess(tmp_path, metadata=cluster.metadata_url, args=("--rebalance-delay-ms", "500", "--snapshot-every", "25"))
                   for _ in range(count)]
            started.extend(new)
            for broker in new:
                broker.start()
            for broker in new:
                broker.wait_ready()
            return new
        start.cluster = cluster
        try:
            yield start
        finally:
            for broker in started:
                broker.stop()


@pytest.fixture
def brokers(start_brokers):
    """brokers are three broker processes on one LocalCluster."""
    return start_brokers(3)


def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """leaders maps each partition of `topic` to the id of its leading broker (-1 while there is none)."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return {p.id: p.leader for p in metadata.topics[topic].partitions.values()}


def broker_ids(bootstrap: str) -> dict[int, int]:
    """broker_ids maps broker id -> port, as Metadata reports them."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    return {b.id: b.port for b in metadata.brokers.values()}


def coordinator(bootstrap: str, group: str, timeout: float = 60) -> int:
    """coordinator is the id of the broker coordinating `group` (asked afresh, no cached answer).

    A broker named coordinator that is still loading the group's bucket, or one that has just
    handed it over, answers NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS, which Kafka clients
    answer by finding the coordinator again: so does this, until `timeout`; other errors fail.
    """
    deadline = time.monotonic() + timeout
    while True:
        admin = AdminClient({"bootstrap.servers": bootstrap})   # kept alive until the answer is in
        try:
            return admin.describe_consumer_groups([group])[group].result(10).coordinator.id
        except KafkaException as exc:
            if exc.args[0].code() not in COORDINATOR_MOVING or time.monotonic() >= deadline:
                raise
        time.sleep(0.2)                           # paces the retries; the answer is what is waited for


def settled(bootstrap: str, topic: str, group: str) -> bool:
    """settled tells whether every partition of `topic` and `group`'s bucket are led by their
    preferred broker among the live ones: until then the brokers hand slots over (ownership.py,
    `_hand_over`, HANDOVER_S after the live set last changed), and a handover moves leadership."""
    live = sorted(broker_ids(bootstrap))
    want = {p: preferred(Slot(topic, p), live, live[0]) for p in range(PARTITIONS)}
    bucket = preferred(Slot(None, group_bucket(group, DEFAULT_GROUP_BUCKETS)), live, live[0])
    return leaders(bootstrap, topic) == want and coordinator(bootstrap, group) == bucket


def read_log(bootstrap: str, topic: str, partitions: int) -> list[bytes]:
    """read_log reads every record of `topic`'s partitions, from the low watermark to the high one.

    An offset out of range fails the read (it is never skipped), as does any record of another
    partition; a connection event is left to the client, which goes on by itself.
    """
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-audit", "enable.auto.commit": False,
                       "auto.offset.reset": "error"})
    values: list[bytes] = []
    try:
        for partition in range(partitions):
            low, high = watermarks(reader, TopicPartition(topic, partition))
            reader.assign([TopicPartition(topic, partition, low)])
            deadline = time.monotonic() + 60
            while high > low:
                assert time.monotonic() < deadline, f"{topic}-{partition} not read to {high} within 60 s"
                message = reader.poll(1.0)
                if message is None:
                    continue
                error = message.error()
                assert error is None or error.code() not in OUT_OF_RANGE, f"{topic}-{partition}: {error}"
                if error is not None:
                    continue
                assert message.partition() == partition
                values.append(message.value())
                if message.offset() >= high - 1:
                    break
    finally:
        reader.close()
    return values


def stream(bootstrap: str, topic: str, acked: list[bytes], errors: list, *, records, keys: int = 0,
           stop: threading.Event | None = None) -> None:
    """stream produces b"<topic> <i>" for each i of `records`, 2 ms apart, through an idempotent
    acks=all producer (keyed by i % `keys` if given), until `stop` is set; then it flushes.
    Acknowledged values are appended to `acked`, delivery errors to `errors`."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 2, "message.timeout.ms": 120000})

    def delivered(error, message):
        if error is None:
            acked.append(message.value())
        else:
            errors.append(error)
    for i in records:
        if stop is not None and stop.is_set():
            break
        key = b"key-%d" % (i % keys) if keys else None
        producer.produce(topic, key=key, value=b"%s %d" % (topic.encode(), i), on_delivery=delivered)
        producer.poll(0)
        time.sleep(0.002)                       # a steady stream over several seconds, around the faults
    assert producer.flush(150) == 0


def watermarks(reader: Consumer, partition: TopicPartition, timeout: float = 60) -> tuple[int, int]:
    """watermarks is `reader.get_watermark_offsets`, asked again while leadership is moving.

    A broker that has just handed the partition over answers NOT_LEADER, which a Kafka client
    retries after refreshing its metadata; any other error fails at once.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            return reader.get_watermark_offsets(partition, timeout=10)
        except KafkaException as exc:
            if exc.args[0].code() not in LEADER_MOVING or time.monotonic() >= deadline:
                raise
        time.sleep(0.2)                           # paces the retries; the answer is what is waited for


def test_sigkill_of_a_partition_leader_loses_no_acked_record_and_duplicates_none(brokers):
    bootstrap = ",".join(b.bootstrap for b in brokers)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("failover", num_partitions=PARTITIONS, replication_factor=1)])["failover"].result(30)
    wait_until(lambda: all(v >= 0 for v in leaders(bootstrap, "failover").values()), 30, message="leaders")
    wait_until(lambda: len(broker_ids(bootstrap)) == 3, 30, message="three brokers in Metadata")
    # Slots first go to whichever broker campaigns first; wait for the handovers to end, so the
    # only leadership that moves during the stream is the one the kill moves.
    wait_until(lambda: settled(bootstrap, "failover", "failover-group"), 60, interval=0.2,
               message="every partition and the group's bucket led by its preferred broker")

    acked: list[bytes] = []
    consumed: list[list[bytes]] = [[] for _ in range(3)]
    stop_consuming = threading.Event()
    errors: list = []

    def produce() -> None:
        stream(bootstrap, "failover", acked, errors, records=range(RECORDS), keys=97)

    def consume(index: int) -> None:
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "failover-group",
                             "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
                             "heartbeat.interval.ms": 500})
        consumer.subscribe(["failover"])
        while not stop_consuming.is_set():
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                consumed[index].append(message.value())
        consumer.close()

    consumers = [threading.Thread(target=consume, args=(i,)) for i in range(3)]
    for thread in consumers:
        thread.start()
    producer = threading.Thread(target=produce)
    producer.start()
    wait_until(lambda: len(acked) > RECORDS // 4, 60, message="a quarter of the records acknowledged")

    # The victim coordinates the group and leads partitions: its death moves both.
    victim_id = coordinator(bootstrap, "failover-group")
    assert victim_id in leaders(bootstrap, "failover").values()
    ports = broker_ids(bootstrap)
    victim = next(b for b in brokers if b.port == ports[victim_id])
    victim.kill()
    killed_at = len(acked)
    survivors = ",".join(b.bootstrap for b in brokers if b is not victim)

    def moved():
        current = leaders(survivors, "failover")
        return all(leader >= 0 and leader != victim_id for leader in current.values())
    wait_until(moved, 30, message="every partition led by a surviving broker")
    producer.join(180)
    assert not producer.is_alive() and errors == []
    assert len(acked) == RECORDS and killed_at < RECORDS

    def everything_consumed():
        return set(acked) <= {value for values in consumed for value in values}
    wait_until(everything_consumed, 120, interval=0.2, message=lambda: (
        f"{len(set(acked) - {v for vs in consumed for v in vs})} acknowledged records not consumed"))
    stop_consuming.set()
    for thread in consumers:
        thread.join(30)

    # The log: every record exactly once across the partitions. First the survivors end their
    # handovers (to each slot's preferred broker among them), so the audit reads settled leaders.
    wait_until(lambda: settled(survivors, "failover", "failover-group"), 90, interval=0.2,
               message="every partition and the group's bucket led by its preferred surviving broker")
    in_log = read_log(survivors, "failover", PARTITIONS)
    assert len(in_log) == len(set(in_log)) == RECORDS


def test_brokers_that_join_take_their_share_of_the_partitions_while_a_producer_writes(start_brokers):
    """Brokers 2 and 3 join broker 1, which led everything: after the live set settles, partitions
    move to their preferred brokers a few at a time, and every acknowledged record is in the log once."""
    [first] = start_brokers(1)
    admin = AdminClient({"bootstrap.servers": first.bootstrap})
    admin.create_topics([NewTopic("shared", num_partitions=PARTITIONS, replication_factor=1)])["shared"].result(30)
    wait_until(lambda: set(leaders(first.bootstrap, "shared").values()) == {1}, 30, message="broker 1 leads all")
    acked: list[bytes] = []
    producer = Producer({"bootstrap.servers": first.bootstrap, "enable.idempotence": True, "acks": "all"})

    def write(count: int) -> None:
        for i in range(count):
            producer.produce("shared", key=b"k%d" % (len(acked) + i), value=b"shared %d" % (len(acked) + i),
                             on_delivery=lambda error, message: error is None and acked.append(message.value()))
        assert producer.flush(60) == 0
    write(500)
    later = start_brokers(2)
    bootstrap = ",".join(b.bootstrap for b in [first, *later])

    expected = {p: preferred(Slot("shared", p), [1, 2, 3], 1) for p in range(PARTITIONS)}
    assert len(set(expected.values())) > 1

    def spread():
        write(20)                                 # keep writing while partitions move
        return leaders(bootstrap, "shared") == expected
    wait_until(spread, 90, interval=0.2, message="each partition led by its preferred broker")
    write(200)
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": "shared-audit", "auto.offset.reset": "earliest",
                       "enable.auto.commit": False})
    reader.subscribe(["shared"])
    seen: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(seen) < len(acked) and time.monotonic() < deadline:
        message = reader.poll(0.5)
        if message is not None and message.error() is None:
            seen.append(message.value())
    reader.close()
    assert sorted(seen) == sorted(acked) and len(set(seen)) == len(seen)


@pytest.mark.parametrize("start_brokers", [4], indirect=True)
def test_a_held_bookie_and_a_killed_partition_leader_lose_no_acked_record(start_brokers):
    """An idempotent acks=all producer streams to one partition of two brokers. A bookie of the
    partition log's current ensemble is held with SIGSTOP (its acks stop until the leader's writer
    replaces it), the partition's leader is SIGKILLed while it is held, and it stays held until
    the surviving broker took records of its own. Every acknowledged record is in the log once."""
    brokers = start_brokers(2)
    cluster = start_brokers.cluster
    bootstrap = ",".join(b.bootstrap for b in brokers)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("held", num_partitions=1, replication_factor=1)])["held"].result(30)
    wait_until(lambda: len(broker_ids(bootstrap)) == 2, 30, message="two brokers in Metadata")
    # Wait for the handover to the preferred broker, so the only move during the stream is the kill's.
    wait_until(lambda: leaders(bootstrap, "held")[0] == preferred(Slot("held", 0), sorted(broker_ids(bootstrap)), 1),
               60, interval=0.2, message="the partition led by its preferred broker")

    acked: list[bytes] = []
    errors: list = []
    stop = threading.Event()

    def produce() -> None:
        stream(bootstrap, "held", acked, errors, records=itertools.count(), stop=stop)
    streaming = threading.Thread(target=produce)
    streaming.start()
    held = None
    try:
        wait_until(lambda: len(acked) >= 300, 60, message="records acknowledged before the hold")
        with walkit.Client(cluster.metadata_url) as client:
            [log] = [name for name in client.list_logs() if name.startswith("replicated-kafka-held-0-")]
            ledger = client.ledger_metadata(client.log_metadata(log).ledger_ids[-1])
        held = cluster.pid(cluster.addresses.index(ledger.ensembles[max(ledger.ensembles)][0]))
        pause.stop(held, cluster.metadata_url)        # never inside a write to the metadata file
        at_hold = len(acked)
        # The first entry for the held bookie waits the add timeout; then the writer replaces it.
        wait_until(lambda: len(acked) >= at_hold + 300, 90,
                   message=lambda: f"{len(acked) - at_hold} records acknowledged since the hold")
        ports = broker_ids(bootstrap)
        victim_id = leaders(bootstrap, "held")[0]
        victim = next(b for b in brokers if b.port == ports[victim_id])
        survivor = next(b for b in brokers if b is not victim)
        victim.kill()
        at_kill = len(acked)
        wait_until(lambda: leaders(survivor.bootstrap, "held")[0] not in (-1, victim_id), 60,
                   message="the partition led by the surviving broker")
        wait_until(lambda: len(acked) >= at_kill + 300, 90,
                   message=lambda: f"{len(acked) - at_kill} records acknowledged since the kill")
        os.kill(held, signal.SIGCONT)           # only now
        held = None
    finally:
        stop.set()
        if held is not None:
            os.kill(held, signal.SIGCONT)
        streaming.join(180)
    assert not streaming.is_alive() and errors == []

    in_log = read_log(survivor.bootstrap, "held", 1)
    assert len(in_log) == len(set(in_log)), "a record is in the log twice"
    assert set(acked) <= set(in_log), f"{len(set(acked) - set(in_log))} acknowledged records lost"
