"""A `walkit topics serve` process takes 100,000 hostile Kafka requests and still serves real clients (issue 17).

The bugs the fuzz found each have a regression test below the fuzz test itself.

The requests come from `tests.support.kafka_fuzz.HostileRequests` (seeded: a failure names
the seed, the worker and the last kinds sent); four workers send them over their own
connections. After each request a worker reads until the request's answer or the close (a
Produce, which acks=0 leaves unanswered, is followed by a marker request whose answer comes
after it: the broker answers one connection's requests in order). So every request was
handled before the next is sent, and a broker that stops answering shows as a timeout. A
request that closes its connection is followed by a new connection. The SASL login gate
has its own seeded fuzz in test_topics_sasl.py: here every connection is a plain one, so the
requests reach the handlers.

Memory: the broker's VmRSS (/proc/PID/status) is read after a warm-up of WARM_UP requests
and after the last one; it may grow by at most RSS_GROWTH_LIMIT_KB. Growth that the
requests cause legitimately is small and bounded: the fuzz topic's offset index gets an
entry per appended batch (at most a few thousand of the requests are batches with a valid
CRC), the batch cache is capped by --cache-mb 1, committed offsets are kept per (group,
topic, partition) key, and the allocator keeps what Python freed. Anything proportional to
the number of requests or connections (a task, group or buffer kept per request) would
show as tens of megabytes over 90,000 requests.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import os
import threading
import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.protocol.admin import DescribeConfigsRequest, DescribeConfigsResponse
from kafka.protocol.consumer import (
    HeartbeatRequest, OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse,
)
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from walkit.adapters.topics import errors, handlers
from walkit.adapters.topics.catalog import Catalog
from walkit.adapters.topics.coordinator import GroupCoordinator
from walkit.adapters.topics.errors import KafkaError
from walkit.adapters.topics.server import KafkaServer
from walkit.plugins import open_metadata
from tests.support.kafka_fuzz import KINDS, HostileClient, HostileRequests, KafkaWire, encode, framed, marker

from tests.support.serverprocess import TopicsProcess, api_versions

SEED = int(os.environ.get("WALKIT_FUZZ_SEED", "20261122"))
REQUESTS = int(os.environ.get("WALKIT_KAFKA_FUZZ_REQUESTS", "100000"))
WORKERS = 4
WARM_UP = 10_000
RSS_GROWTH_LIMIT_KB = 30 * 1024
#: An answer later than this counts as slow (a long poll a mutation made legal); the broker
#: must then still answer a new connection at once.
ANSWER_TIMEOUT_S = 5.0


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("kafka-fuzz")
    process = TopicsProcess(workdir, data_dir=workdir / "data",
                            args=("--no-auto-create", "--cache-mb", "1", "--rebalance-delay-ms", "0"))
    process.start().wait_ready()
    admin = KafkaAdminClient(bootstrap_servers=process.bootstrap)
    admin.create_topics([NewTopic("fuzz", 2, 1), NewTopic("alive", 1, 1)], timeout_ms=15000)
    admin.close()
    yield process
    process.stop()


class Worker:
    """Worker sends one generator's hostile requests through a HostileClient and counts what happened."""

    def __init__(self, number: int, port: int) -> None:
        self.number = number
        self.port = port
        self.requests = iter(HostileRequests(SEED * 100 + number, group=f"fuzz-group-{number}"))
        self.client = HostileClient(port, timeout=ANSWER_TIMEOUT_S)
        self.sent = 0
        self.outcomes: collections.Counter = collections.Counter()
        self.kinds: collections.Counter = collections.Counter()
        self.slow: list[str] = []
        self.recent: collections.deque = collections.deque(maxlen=10)
        self.error: BaseException | None = None

    def where(self) -> str:
        return f"seed {SEED} worker {self.number} after {self.sent} requests; last kinds {list(self.recent)}"

    def run(self, count: int) -> None:
        try:
            for _ in range(count):
                message = next(self.requests)
                self.recent.append(message.kind)
                self.kinds[message.kind] += 1
                outcome = self.client.send(message)
                if outcome == "slow":
                    self.slow.append(f"{message.kind} {message.data[4:8].hex()}")
                    assert api_versions(self.port, timeout=ANSWER_TIMEOUT_S).error_code == 0, (
                        f"the broker stopped answering after {message.kind}")
                self.outcomes[outcome] += 1
                self.sent += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            self.error = exc
        finally:
            self.client.close()


def fuzz(workers: list[Worker], count: int) -> None:
    """fuzz runs `count` requests per worker, each in its own thread, and re-raises a worker's failure."""
    threads = [threading.Thread(target=w.run, args=(count,), name=f"fuzz-{w.number}") for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for worker in workers:
        if worker.error is not None:
            raise AssertionError(f"{worker.where()}: {type(worker.error).__name__}: {worker.error}") from worker.error


def round_trip(broker: TopicsProcess, tag: bytes) -> None:
    """round_trip produces `tag` with kafka-python and consumes it back."""
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    producer.send("alive", value=tag).get(timeout=30)
    producer.close()
    consumer = KafkaConsumer("alive", bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest",
                             consumer_timeout_ms=10000)
    values = []
    for record in consumer:                 # stops at the tag, or 10 s after the last record without it
        values.append(record.value)
        if record.value == tag:
            break
    consumer.close()
    assert tag in values


@pytest.mark.slow
def test_the_broker_survives_100k_hostile_requests_with_bounded_memory_and_serves_real_clients(broker):
    pid = broker.process.pid
    workers = [Worker(number, broker.port) for number in range(WORKERS)]
    round_trip(broker, b"before")
    started = time.monotonic()
    fuzz(workers, WARM_UP // WORKERS)
    assert broker.process.poll() is None, broker.log_tail()
    rss_warm = rss_kb(pid)
    fuzz(workers, (REQUESTS - WARM_UP) // WORKERS)
    took = time.monotonic() - started
    assert broker.process.poll() is None and broker.process.pid == pid, broker.log_tail()
    rss_end = rss_kb(pid)
    round_trip(broker, b"after")

    sent = sum(w.sent for w in workers)
    outcomes = sum((w.outcomes for w in workers), collections.Counter())
    kinds = sum((w.kinds for w in workers), collections.Counter())
    slow = [kind for w in workers for kind in w.slow]
    print(f"\nkafka fuzz seed {SEED}: {sent} requests in {took:.1f} s, {dict(outcomes)}, kinds {dict(kinds)}, "
          f"slow {slow}, broker RSS {rss_warm} -> {rss_end} kB")
    assert sent >= REQUESTS
    assert set(kinds) == set(KINDS) - {"sasl"}
    assert outcomes["answered"] > sent // 4 and outcomes["closed"] > sent // 10, outcomes
    assert len(slow) <= sent // 1000, slow
    assert rss_end - rss_warm < RSS_GROWTH_LIMIT_KB, f"RSS grew from {rss_warm} to {rss_end} kB"


# -- regressions: one per bug the fuzz found ------------------------------------------------------

def test_a_strangers_join_makes_no_group_and_a_group_without_members_is_forgotten():
    """Groups used to stay in memory forever once made, and a rejoin naming an unknown member made one."""
    async def scenario():
        coordinator = GroupCoordinator(asyncio.get_running_loop(), initial_delay_ms=0)
        protocols = [("range", b"")]
        stranger = await coordinator.join("g1", "nobody", None, "c", "h", 6000, 100, "consumer", protocols)
        assert stranger.error == errors.UNKNOWN_MEMBER_ID and coordinator.groups == {}
        joined = await coordinator.join("g2", "", None, "c", "h", 6000, 100, "consumer", protocols)
        assert joined.error == errors.NONE and list(coordinator.groups) == ["g2"]
        assert coordinator.leave("g2", [(joined.member_id, None)]) == [errors.NONE]
        assert coordinator.groups == {}
        expiring = await coordinator.join("g3", "", None, "c", "h", 1000, 100, "consumer", protocols)
        coordinator.groups["g3"].members[expiring.member_id].last_seen -= 5       # silent past its session
        coordinator.expire()
        assert coordinator.groups == {}
        again = await coordinator.join("g2", "", None, "c", "h", 6000, 100, "consumer", protocols)
        assert again.error == errors.NONE and again.generation == 1
    asyncio.run(scenario())


def test_names_no_topic_can_have_are_never_looked_up(tmp_path):
    """Metadata and DescribeConfigs of "" used to reach the metadata store, which refused the key: an internal error."""
    store = open_metadata(f"sqlite://{tmp_path / 'metadata.db'}")
    try:
        catalog = Catalog(store)
        for name in ("", "a/b", "..", "topics/x", "x" * 181, None):
            assert catalog.topic(name) is None
            with pytest.raises(KafkaError) as caught:
                catalog.delete_topic(name)
            assert caught.value.code == errors.UNKNOWN_TOPIC_OR_PARTITION
    finally:
        store.close()


@pytest.mark.slow
def test_metadata_and_describe_configs_of_invalid_names_are_answered_on_an_open_connection(broker):
    with KafkaWire(broker.port) as wire:
        for version in (1, 9, 12):
            topics = [MetadataRequest.MetadataRequestTopic(name=name) for name in ("", "a/b", "..")]
            wire.send(framed(encode(MetadataRequest(version=version, topics=topics, allow_auto_topic_creation=True,
                                                    include_topic_authorized_operations=False), 5)))
            reply = MetadataResponse.decode(wire.read_frame(), version=version, header=True)
            assert [t.error_code for t in reply.topics] == [errors.UNKNOWN_TOPIC_OR_PARTITION] * 3
        resource = DescribeConfigsRequest.DescribeConfigsResource(resource_type=2, resource_name="",
                                                                  configuration_keys=None)
        wire.send(framed(encode(DescribeConfigsRequest(version=1, resources=[resource], include_synonyms=False), 6)))
        reply = DescribeConfigsResponse.decode(wire.read_frame(), version=1, header=True)
        assert reply.results[0].error_code == errors.UNKNOWN_TOPIC_OR_PARTITION
    assert "failed: ConfigError" not in broker.log_tail(100_000)


@pytest.mark.slow
def test_offsets_of_topics_that_do_not_exist_are_refused(broker):
    """Commits used to be stored for any name: a client could grow a group's state without end."""
    partition = OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition
    topics = [OffsetCommitRequest.OffsetCommitRequestTopic(name=name, partitions=[
        partition(partition_index=index, committed_offset=3, committed_leader_epoch=-1, committed_metadata="")])
        for name, index in (("no-such-topic", 0), ("fuzz", 7), ("fuzz", 1))]
    with KafkaWire(broker.port) as wire:
        wire.send(framed(encode(OffsetCommitRequest(version=7, group_id="regression", generation_id_or_member_epoch=-1,
                                                    member_id="", group_instance_id=None, topics=topics), 8)))
        reply = OffsetCommitResponse.decode(wire.read_frame(), version=7, header=True)
        codes = {(t.name, p.partition_index): p.error_code for t in reply.topics for p in t.partitions}
        assert codes == {("no-such-topic", 0): errors.UNKNOWN_TOPIC_OR_PARTITION,
                         ("fuzz", 7): errors.UNKNOWN_TOPIC_OR_PARTITION, ("fuzz", 1): errors.NONE}
        wire.send(framed(encode(OffsetFetchRequest(version=7, group_id="regression", topics=None,
                                                   require_stable=False), 9)))
        fetched = OffsetFetchResponse.decode(wire.read_frame(), version=7, header=True)
        assert [(t.name, [p.partition_index for p in t.partitions]) for t in fetched.topics] == [("fuzz", [1])]


def test_a_handler_that_fails_after_its_client_left_is_logged(monkeypatch, caplog):
    """A failure after the client left used to be dropped ("Task exception was never retrieved")."""
    async def until(condition, what: str) -> None:
        deadline = time.monotonic() + 10
        while not condition():
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.01)

    async def scenario():
        started, left = asyncio.Event(), asyncio.Event()

        async def failing(broker, connection, request):
            started.set()
            await left.wait()
            raise RuntimeError("fails after the client left")
        monkeypatch.setitem(handlers.HANDLERS, HeartbeatRequest.API_KEY, failing)
        server = KafkaServer(asyncio.get_running_loop(), port=0)
        server.broker = object()
        await server.start()
        _, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(marker(0))
        await writer.drain()
        await asyncio.wait_for(started.wait(), 10)
        writer.close()
        await until(lambda: not server.connections, "the connection closes")
        left.set()
        await until(lambda: "fails after the client left" in caplog.text, "the failure is logged")
        await server.close()

    with caplog.at_level(logging.INFO):
        asyncio.run(scenario())
        gc.collect()
    assert "never retrieved" not in caplog.text
