"""`walkit topics serve` with the real clients: kcat, confluent-kafka (librdkafka) and kafka-python.

One broker process (on an embedded cluster of bookie processes) serves the whole module; the
restart test kills it and starts it again on the same data. Its cache of recent batches holds
about one batch, so consumers are mostly served from the partitions' logs, not from memory, and
it snapshots partition state every 2 batches, so the restarted broker starts from snapshots.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition
from kafka.partitioner.default import murmur2

from ..integration.helpers import wait_until
from tests.support.serverprocess import TopicsProcess, kcat, read_to_end

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """broker is one `walkit topics serve` on an embedded cluster, for the whole module."""
    workdir = tmp_path_factory.mktemp("topics")
    process = TopicsProcess(workdir, data_dir=workdir / "data",       # a tiny cache: fetches read the log
                            args=("--retention-check-ms", "200", "--rebalance-delay-ms", "500", "--cache-mb", "0.001",
                                  "--snapshot-every", "2"))
    process.start().wait_ready()
    yield process
    process.stop()


def create_topic(broker: TopicsProcess, name: str, partitions: int, **configs: str) -> None:
    """create_topic creates a topic through confluent-kafka's AdminClient and waits for it."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1,
                                            config=configs)], operation_timeout=15)
    futures[name].result(30)


def produce_confluent(broker: TopicsProcess, topic: str, records, **config) -> list:
    """produce_confluent writes (key, value) records with an idempotent acks=all producer; it returns the acks."""
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5, **config})
    acked = []

    def delivered(error, message):
        assert error is None, error
        acked.append((message.key(), message.value(), message.partition(), message.offset()))
    for key, value in records:
        while True:
            try:
                producer.produce(topic, key=key, value=value, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0
    return acked


def consumer_config(broker: TopicsProcess, group: str, **extra) -> dict:
    return {"bootstrap.servers": broker.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "session.timeout.ms": 10000, **extra}


def drain(consumer: Consumer, expected: int, timeout: float = 60.0) -> list:
    """drain polls until `expected` messages arrived (or the timeout); it returns them."""
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < expected and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None:
            continue
        assert message.error() is None, message.error()
        got.append(message)
    return got


def test_kcat_lists_brokers_and_produces_with_murmur2_keys_that_it_consumes_back(broker):
    create_topic(broker, "kcat-keys", 4)
    metadata = json.loads(kcat("-b", broker.bootstrap, "-L", "-J"))
    assert [b["name"] for b in metadata["brokers"]] == [f"127.0.0.1:{broker.port}"]
    lines = "".join(f"key-{i % 25}:value {i}\n" for i in range(200))
    produced = subprocess.run(["kcat", "-b", broker.bootstrap, "-t", "kcat-keys", "-P", "-K:", "-X",
                               "partitioner=murmur2_random"], input=lines, capture_output=True,
                              text=True, timeout=120)
    delivery_errors = [line for line in produced.stderr.splitlines() if "fail" in line.lower() or "error" in line.lower()]
    assert produced.returncode == 0 and not delivery_errors, produced.stderr[-3000:]
    out = kcat("-b", broker.bootstrap, "-t", "kcat-keys", "-C", "-e", "-o", "beginning", "-f", "%p %o %k %s\\n")
    rows = [line.split(" ", 3) for line in out.splitlines()]
    consumed = {p: [int(r[1]) for r in rows if r[0] == p] for p in sorted({r[0] for r in rows})}
    assert sorted(r[3] for r in rows) == sorted(f"value {i}" for i in range(200)), (
        f"offsets consumed per partition: {consumed}\nbroker log:\n{broker.log_tail(60)}")
    per_partition: dict[int, list[int]] = {}
    for partition, offset, key, _ in rows:
        assert int(partition) == (murmur2(key.encode()) & 0x7FFFFFFF) % 4, key     # Kafka's default partitioner
        per_partition.setdefault(int(partition), []).append(int(offset))
    for offsets in per_partition.values():
        assert offsets == list(range(len(offsets)))                                  # dense offsets


def test_kafka_python_and_confluent_agree_on_murmur2_partitions(broker):
    create_topic(broker, "both-keys", 3)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", enable_idempotence=True)
    sent = [producer.send("both-keys", key=b"k%d" % i, value=b"python %d" % i) for i in range(150)]
    producer.flush()
    python_acks = [(f.get(30).partition, f.get(30).offset) for f in sent]
    producer.close()
    confluent_acks = produce_confluent(broker, "both-keys", [(b"k%d" % i, b"confluent %d" % i) for i in range(150)],
                                       partitioner="murmur2_random")
    confluent_partitions = {key: partition for key, _, partition, _ in confluent_acks}
    for i, (partition, _) in enumerate(python_acks):
        assert partition == (murmur2(b"k%d" % i) & 0x7FFFFFFF) % 3
        assert confluent_partitions[b"k%d" % i] == partition
    consumer = KafkaConsumer("both-keys", bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False)
    values = sorted(m.value for m in read_to_end(consumer))
    consumer.close()
    assert values == sorted([b"python %d" % i for i in range(150)] + [b"confluent %d" % i for i in range(150)])


def test_group_of_three_shares_partitions_commits_and_resumes_after_a_broker_restart(broker):
    create_topic(broker, "orders", 6)
    consumers = [Consumer(consumer_config(broker, "three")) for _ in range(3)]
    for consumer in consumers:
        consumer.subscribe(["orders"])

    def everyone_assigned():
        for consumer in consumers:
            consumer.poll(0.1)
        return all(consumer.assignment() for consumer in consumers)
    wait_until(everyone_assigned, 60, message="three consumers with partitions")
    owned = [{tp.partition for tp in consumer.assignment()} for consumer in consumers]
    assert sorted(p for parts in owned for p in parts) == list(range(6))
    acked = produce_confluent(broker, "orders", [(b"customer-%d" % (i % 50), b"order %d" % i) for i in range(3000)],
                              **{"batch.num.messages": 50})          # many batches: partitions get snapshots
    assert len(acked) == 3000

    got: list[list] = [[] for _ in consumers]

    def run(index: int) -> None:
        deadline = time.monotonic() + 60
        while sum(len(g) for g in got) < 3000 and time.monotonic() < deadline:
            message = consumers[index].poll(0.2)
            if message is not None and message.error() is None:
                got[index].append((message.partition(), message.offset(), message.value()))
    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    everything = [row for rows in got for row in rows]
    assert sorted(v for _, _, v in everything) == sorted(b"order %d" % i for i in range(3000))   # once each
    for index, rows in enumerate(got):
        assert {p for p, _, _ in rows} <= owned[index]
    for consumer in consumers:
        consumer.commit(asynchronous=False)
    for consumer in consumers:
        consumer.close()

    broker.kill()                                              # SIGKILL; its bookies follow it
    broker.wait_bookies_gone()
    broker.start().wait_ready()
    produce_confluent(broker, "orders", [(b"late-%d" % i, b"late %d" % i) for i in range(300)])
    assert "kafka-orders-0: replaying the log after its snapshot" in broker.log_tail(2000)
    resumed = Consumer(consumer_config(broker, "three"))
    resumed.subscribe(["orders"])
    late = drain(resumed, 300, timeout=90)
    assert sorted(m.value() for m in late) == sorted(b"late %d" % i for i in range(300))
    assert resumed.poll(1.0) is None                           # nothing before the committed offsets
    resumed.close()


def test_seek_and_offsets_for_times_with_kafka_python_and_confluent(broker):
    create_topic(broker, "times", 1)
    base = int(time.time() * 1000) - 60_000
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=20)
    for i in range(100):
        producer.send("times", value=b"t%d" % i, timestamp_ms=base + 10 * i)
    producer.flush()
    producer.close()
    tp = KafkaTopicPartition("times", 0)
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False, consumer_timeout_ms=5000)
    found = consumer.offsets_for_times({tp: base + 505})[tp]
    assert (found.offset, found.timestamp) == (51, base + 510)              # inside a batch: the exact record
    assert consumer.offsets_for_times({tp: base + 10_000})[tp] is None
    assert consumer.beginning_offsets([tp])[tp] == 0 and consumer.end_offsets([tp])[tp] == 100
    consumer.assign([tp])
    consumer.seek(tp, 42)
    assert next(consumer).offset == 42
    consumer.seek_to_beginning(tp)
    assert next(consumer).value == b"t0"
    consumer.close()

    confluent = Consumer(consumer_config(broker, "times-reader"))
    [answer] = confluent.offsets_for_times([TopicPartition("times", 0, base + 700)], timeout=10)
    assert answer.offset == 70
    confluent.assign([TopicPartition("times", 0, 90)])
    first = drain(confluent, 1)[0]
    assert (first.offset(), first.value()) == (90, b"t90")
    confluent.seek(TopicPartition("times", 0, 5))
    assert drain(confluent, 1)[0].offset() == 5
    confluent.close()


def test_retention_truncates_old_ledgers_and_a_consumer_behind_resets(broker):
    import walkit
    from walkit.adapters.topics.catalog import Catalog, partition_log
    create_topic(broker, "short", 1, **{"segment.ms": "200", "retention.ms": "1500"})
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    sent = 0
    admin_consumer = Consumer(consumer_config(broker, "retention-probe"))

    def start_moved():
        nonlocal sent
        producer.produce("short", value=b"r%d" % sent)      # a record now and then: ledgers roll on append
        sent += 1
        producer.flush(10)
        low, _ = admin_consumer.get_watermark_offsets(TopicPartition("short", 0), timeout=5)
        return low > 0
    with walkit.Client(broker.metadata_url) as client:
        start_moved()
        log_name = partition_log(Catalog(client.store).topic("short"), 0)
        first_ledger = client.log_metadata(log_name).ledger_ids[0]
        wait_until(start_moved, 60, interval=0.1, message="the log start offset moving past 0")
        wait_until(lambda: first_ledger not in client.log_metadata(log_name).ledger_ids, 30,
                   message="the first ledger deleted")
    low, high = admin_consumer.get_watermark_offsets(TopicPartition("short", 0), timeout=5)
    admin_consumer.close()
    assert low > 0

    behind = Consumer(consumer_config(broker, "behind", **{"auto.offset.reset": "earliest"}))
    behind.assign([TopicPartition("short", 0, 0)])           # offset 0 is gone: OFFSET_OUT_OF_RANGE, then reset

    def next_record():
        producer.produce("short", value=b"more")             # retention may have emptied the log meanwhile
        producer.flush(10)
        return behind.poll(0.5)
    message = wait_until(next_record, 60, message="a record after the reset to earliest")
    assert message.error() is None and message.offset() >= low
    behind.close()
    latest = Consumer(consumer_config(broker, "behind-latest", **{"auto.offset.reset": "latest"}))
    latest.assign([TopicPartition("short", 0, 0)])           # reset to the end: only records written later

    def next_new_record():
        producer.produce("short", value=b"after")
        producer.flush(10)
        return latest.poll(0.5)
    message = wait_until(next_new_record, 60, message="a record after the reset to latest")
    assert message.error() is None and message.offset() >= high and message.value() == b"after"
    latest.close()


def walkit_topics(broker: TopicsProcess, *args: str, input: str | None = None) -> str:
    done = subprocess.run([sys.executable, "-m", "walkit", "topics", *args, "-b", broker.bootstrap], input=input,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_command_line_creates_describes_produces_consumes_and_deletes(broker):
    assert "created topic cli" in walkit_topics(broker, "create", "cli", "-p", "2", "-c", "retention.ms=60000")
    assert "cli" in walkit_topics(broker, "list").split()
    walkit_topics(broker, "produce", "cli", "-K:", input="a:one\nb:two\nc:three\n")
    out = walkit_topics(broker, "consume", "cli", "--from-beginning", "-n", "3", "-g", "cli-group", "--format", "json")
    assert sorted(json.loads(line)["value"] for line in out.splitlines()) == ["one", "three", "two"]
    described = walkit_topics(broker, "describe", "cli")
    assert "retention.ms=60000" in described and "partition 1" in described
    assert "cli-group" in walkit_topics(broker, "groups")
    assert "lag 0" in walkit_topics(broker, "groups", "cli-group")
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    assert admin.list_group_offsets("cli-group")
    admin.close()
    walkit_topics(broker, "delete", "cli")
    assert "cli" not in walkit_topics(broker, "list").split()


def test_acks_zero_one_and_all_each_store_every_record(broker):
    create_topic(broker, "acks", 2)
    for acks in ("0", "1", "all"):
        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": acks})
        for i in range(100):
            producer.produce("acks", value=b"acks=%s %d" % (acks.encode(), i))
        assert producer.flush(30) == 0
    consumer = KafkaConsumer("acks", bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False)
    values = sorted(m.value for m in read_to_end(consumer))
    consumer.close()
    assert values == sorted(b"acks=%s %d" % (a, i) for a in (b"0", b"1", b"all") for i in range(100))


def test_client_side_assignors_pass_through_roundrobin_and_cooperative_sticky(broker):
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    create_topic(broker, "assigned", 6)
    produce_confluent(broker, "assigned", [(None, b"a%d" % i) for i in range(600)])
    python_consumers = [KafkaConsumer("assigned", bootstrap_servers=broker.bootstrap, group_id="rr",
                                      auto_offset_reset="earliest", enable_auto_commit=False,
                                      partition_assignment_strategy=[RoundRobinPartitionAssignor])
                        for _ in range(3)]
    seen: list[bytes] = []
    stop = threading.Event()

    sizes = [0] * len(python_consumers)  # each member's assignment, as its own thread last saw it

    def consume(index: int, consumer) -> None:     # each member polls in its own thread, as an application's would
        while not stop.is_set():
            for records in consumer.poll(100).values():
                seen.extend(r.value for r in records)
            sizes[index] = len(consumer.assignment())
    pollers = [threading.Thread(target=consume, args=(i, c), daemon=True) for i, c in enumerate(python_consumers)]
    for poller in pollers:
        poller.start()
    try:
        wait_until(lambda: sizes == [2, 2, 2] and len(set(seen)) == 600, 90,
                   message=lambda: f"roundrobin: 2 partitions each and every record ({sizes}, {len(set(seen))} records)")
    finally:
        stop.set()
        for poller in pollers:
            poller.join(30)
    for consumer in python_consumers:
        consumer.close()

    sticky = [Consumer(consumer_config(broker, "sticky", **{"partition.assignment.strategy": "cooperative-sticky"}))
              for _ in range(3)]
    sticky[0].subscribe(["assigned"])
    sticky[1].subscribe(["assigned"])

    def assigned(consumers, total):
        for consumer in consumers:
            consumer.poll(0.1)
        parts = [tp.partition for consumer in consumers for tp in consumer.assignment()]
        return sorted(parts) == list(range(6)) and all(c.assignment() for c in consumers) and len(parts) == total
    wait_until(lambda: assigned(sticky[:2], 6), 60, message="cooperative-sticky: two members")
    before = {tp.partition for tp in sticky[0].assignment()}
    sticky[2].subscribe(["assigned"])                          # an incremental rebalance: a third member
    wait_until(lambda: assigned(sticky, 6), 60, message="cooperative-sticky: three members")
    assert {tp.partition for tp in sticky[0].assignment()} <= before          # sticky: it only gave some up
    for consumer in sticky:
        consumer.close()


def test_fetch_long_polls_until_a_record_arrives(broker):
    import select
    import socket
    from kafka.protocol.consumer import FetchRequest, FetchResponse
    from tests.support.serverprocess import recv_exactly
    create_topic(broker, "polled", 1)

    def fetch(sock, offset: int, max_wait_ms: int) -> None:
        request = FetchRequest(version=11, replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20,
                               isolation_level=0, session_id=0, session_epoch=-1, rack_id="",
                               forgotten_topics_data=[], topics=[FetchRequest.FetchTopic(
                                   topic="polled", partitions=[FetchRequest.FetchTopic.FetchPartition(
                                       partition=0, current_leader_epoch=-1, fetch_offset=offset,
                                       log_start_offset=-1, partition_max_bytes=1 << 20)])])
        request.with_header(correlation_id=1, client_id="long-poll")
        sock.sendall(bytes(request.encode(header=True, framed=True)))

    def response(sock):
        size = int.from_bytes(recv_exactly(sock, 4), "big")
        return FetchResponse.decode(recv_exactly(sock, size), version=11, header=True).responses[0].partitions[0]

    with socket.create_connection(("127.0.0.1", broker.port), timeout=30) as sock:
        started = time.monotonic()
        fetch(sock, 0, 300)
        empty = response(sock)
        assert empty.error_code == 0 and not empty.records and time.monotonic() - started >= 0.25
        fetch(sock, 0, 20000)
        assert select.select([sock], [], [], 0.5)[0] == []          # held: nothing to answer with yet
        started = time.monotonic()
        produce_confluent(broker, "polled", [(None, b"wake up")])
        woke = response(sock)
        assert woke.error_code == 0 and b"wake up" in woke.records and time.monotonic() - started < 10


def test_a_deleted_topic_created_again_starts_empty(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    create_topic(broker, "again", 1)
    produce_confluent(broker, "again", [(None, b"old %d" % i) for i in range(20)], **{"batch.num.messages": 2})
    admin.delete_topics(["again"], operation_timeout=15)["again"].result(30)
    wait_until(lambda: "again" not in admin.list_topics(timeout=10).topics, 30, message="topic deleted")
    wait_until(lambda: create_topic(broker, "again", 1) is None, 30, message="topic created again")
    produce_confluent(broker, "again", [(None, b"new %d" % i) for i in range(3)])
    consumer = Consumer(consumer_config(broker, "again-reader"))
    consumer.assign([TopicPartition("again", 0, 0)])
    got = drain(consumer, 3)
    assert consumer.poll(1.0) is None
    consumer.close()
    assert [(m.offset(), m.value()) for m in got] == [(0, b"new 0"), (1, b"new 1"), (2, b"new 2")]
