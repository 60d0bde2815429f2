"""Consumer groups across the death of a broker: three `walkit topics serve` processes, real clients.

A topic of 3 partitions, an idempotent acks=all producer streaming (from before the groups
settle until each has consumed again from every partition after the kill), and two groups of three
consumers, one of confluent-kafka and one of kafka-python, each consumer committing its offset
synchronously after every record it processes. A broker is SIGKILLed mid-stream: the leader of
partition 0 (which coordinates neither group), or the broker coordinating both groups (found
with FindCoordinator). The groups' memberships are stored in their coordinator's bucket, so a
coordinator's death costs no rebalance: the confluent-kafka group of the second test is static
(`group.instance.id`) and cooperative-sticky, and none of its members is assigned anything anew.

What each test asserts, per group (`check_group`):
- every acknowledged record is consumed;
- a record is consumed more than once only if every commit of it before its last consumption
  failed (raised, or answered an error): a commit that succeeded is never followed by a
  redelivery, and a redelivery needs a failed commit, so the redelivered records are at most the
  failed commits (those in flight when the broker died, or answered while the coordinator moved);
- the group consumes and commits from every partition again within the session timeout plus
  RESUME_SLACK_S of the kill (the producer streams into every partition all along);
- no member is assigned partitions anew after the kill: neither a partition leader's death nor
  the coordinator's costs the group a rebalance.

The fast test at the end replays the bucket state's records, snapshots and restores it, and has
a second node of a bucket take over from the first: it loads the stored group as Stable, with
the same generation, members and assignments.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import threading
import time
from collections import defaultdict
from dataclasses import dataclass

import pytest
from confluent_kafka import Consumer, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import ConsumerRebalanceListener, KafkaConsumer
from kafka.errors import KafkaError as KafkaPythonError
from kafka.structs import OffsetAndMetadata

from walkit import Position
from walkit.adapters.topics import errors
from walkit.adapters.topics.broker import BucketLeader
from walkit.adapters.topics.catalog import DEFAULT_GROUP_BUCKETS, group_bucket
from walkit.adapters.topics.coordinator import STABLE, GroupCoordinator
from walkit.adapters.topics.offsets import OffsetsState, commit_record, membership_record
from walkit.adapters.topics.ownership import Slot, preferred
from walkit.local import LocalCluster
from walkit.replication import ReplicatedNode

from ..integration.helpers import wait_until
from .test_topics_failover import broker_ids, coordinator, leaders, stream
from .test_topics_leader import until
from tests.support.serverprocess import TopicsProcess, topics_brokers

TOPIC = "orders"
PARTITIONS = 3
#: How many records the producer streams at most (2 ms apart); it stops once the groups resumed.
RECORDS = 30_000
SESSION_MS = 15_000
#: How much longer than the session timeout a group may take to consume again after the kill.
RESUME_SLACK_S = 5.0


@pytest.fixture
def brokers(tmp_path):
    """brokers are three broker processes on one LocalCluster of 3 bookies, stopped at the end."""
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster")) as cluster:
        with topics_brokers(tmp_path, cluster.metadata_url, 3, ("--rebalance-delay-ms", "500")) as started:
            yield started


@dataclass(frozen=True)
class Delivery:
    """Delivery is one record processed by a consumer: when, and whether its commit succeeded."""

    value: bytes
    partition: int
    at: float
    committed: bool
    error: str = ""            # why the commit failed, for the failure messages


class GroupRun:
    """GroupRun is a group of three consumer threads of one client library, each committing after every record."""

    def __init__(self, name: str, bootstrap: str, library: str, *, static_cooperative: bool = False) -> None:
        self.name = name
        self.bootstrap = bootstrap
        self.library = library
        self.static_cooperative = static_cooperative
        self.deliveries: list[Delivery] = []
        self.assigned_at: list[float] = []           # each time a member was given partitions
        self.owned: dict[int, set[int]] = {i: set() for i in range(3)}    # each member's partitions now
        self.failures: list[BaseException] = []
        self.stopping = threading.Event()
        self.stopped_at = float("inf")
        self.killed_at = 0.0                          # set by the test, for failure messages
        target = self._confluent if library == "confluent-kafka" else self._kafka_python
        self.threads = [threading.Thread(target=self._run, args=(target, i), daemon=True) for i in range(3)]

    def start(self) -> "GroupRun":
        for thread in self.threads:
            thread.start()
        return self

    def stop(self) -> None:
        self.stopped_at = time.monotonic()           # members closing from here on rebalance the rest
        self.stopping.set()
        for thread in self.threads:
            thread.join(30)

    def consumed(self) -> set[bytes]:
        return {d.value for d in self.deliveries}

    def last_per_partition(self) -> dict[int, float]:
        """last_per_partition is when each partition's last record was consumed (for failure messages)."""
        last: dict[int, float] = {}
        for delivery in list(self.deliveries):
            last[delivery.partition] = delivery.at
        return {partition: round(at - self.killed_at, 2) for partition, at in sorted(last.items())}

    def _assigned(self, index: int, partitions) -> None:
        if partitions:
            self.assigned_at.append(time.monotonic())
        self.owned[index] |= {p.partition for p in partitions}         # eager: revoked first; cooperative: added

    def _revoked(self, index: int, partitions) -> None:
        self.owned[index] -= {p.partition for p in partitions}

    def settled(self) -> bool:
        """settled tells whether each member owns one partition and together all of them (rebalances over)."""
        owned = list(self.owned.values())
        return all(len(mine) == 1 for mine in owned) and set().union(*owned) == set(range(PARTITIONS))

    def _run(self, target, index: int) -> None:
        try:
            target(index)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.failures.append(exc)

    def _confluent(self, index: int) -> None:
        config = {"bootstrap.servers": self.bootstrap, "group.id": self.name, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 500}
        if self.static_cooperative:
            config.update({"group.instance.id": f"{self.name}-{index}",
                           "partition.assignment.strategy": "cooperative-sticky"})
        consumer = Consumer(config)
        consumer.subscribe([TOPIC], on_assign=lambda c, parts: self._assigned(index, parts),
                           on_revoke=lambda c, parts: self._revoked(index, parts))
        try:
            while not self.stopping.is_set():
                message = consumer.poll(0.2)
                if message is None or message.error() is not None:
                    continue
                at = time.monotonic()                           # processed; now committed
                try:
                    done = consumer.commit(message=message, asynchronous=False)
                    error = "; ".join(str(part.error) for part in done if part.error is not None)
                except KafkaException as exc:
                    error = str(exc)
                self.deliveries.append(Delivery(message.value(), message.partition(), at, not error, error))
        finally:
            consumer.close()

    def _kafka_python(self, index: int) -> None:
        run = self

        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked):
                run._revoked(index, revoked)

            def on_partitions_assigned(self, assigned):
                run._assigned(index, assigned)
        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap.split(","), group_id=self.name,
                                 auto_offset_reset="earliest", enable_auto_commit=False, max_poll_records=1,
                                 session_timeout_ms=SESSION_MS, heartbeat_interval_ms=500)
        consumer.subscribe([TOPIC], listener=Listener())
        try:
            while not self.stopping.is_set():
                for part, messages in consumer.poll(timeout_ms=200).items():
                    for message in messages:
                        at = time.monotonic()
                        try:
                            consumer.commit({part: OffsetAndMetadata(message.offset + 1, "", -1)})
                            error = ""
                        except KafkaPythonError as exc:
                            error = repr(exc)
                        self.deliveries.append(Delivery(message.value, message.partition, at, not error, error))
        finally:
            consumer.close()


def check_group(run: GroupRun, acked: list[bytes], killed_at: float | None) -> dict:
    """check_group asserts what the module doc says of one group and returns its numbers (of a group
    started after the kill, `killed_at` None, all but how soon it consumed again)."""
    assert run.failures == [], f"{run.name}: a consumer failed: {run.failures!r}"
    missing = set(acked) - run.consumed()
    assert not missing, f"{run.name}: {len(missing)} acknowledged records never consumed"
    by_value: dict[bytes, list[Delivery]] = defaultdict(list)
    for delivery in sorted(run.deliveries, key=lambda d: d.at):
        by_value[delivery.value].append(delivery)
    again = {value: each for value, each in by_value.items() if len(each) > 1}
    after_success = sorted(value for value, each in again.items() if any(d.committed for d in each[:-1]))
    assert after_success == [], f"{run.name}: consumed again after a successful commit: {after_success[:10]}"
    failed = sum(not d.committed for d in run.deliveries)
    assert len(again) <= failed
    numbers = {"consumed": len(run.deliveries), "redelivered": len(again), "failed commits": failed}
    if killed_at is None:
        return numbers
    resumed = {}
    for partition in range(PARTITIONS):
        after = [d for d in run.deliveries if d.partition == partition and d.at >= killed_at]
        later = [d.at for d in after if d.committed]
        assert later, (f"{run.name}: nothing of partition {partition} consumed and committed after the kill "
                       f"({len(after)} consumed; commit errors {sorted({d.error for d in after})[:5]}; "
                       f"assigned at {[round(at - killed_at, 2) for at in run.assigned_at]} s after the kill)")
        resumed[partition] = min(later) - killed_at
    limit = SESSION_MS / 1000 + RESUME_SLACK_S
    assert max(resumed.values()) <= limit, f"{run.name}: partitions resumed {resumed} s after the kill (> {limit})"
    return {**numbers, "resumed after s": round(max(resumed.values()), 2)}


def resumed_after(run: GroupRun, killed_at: float) -> float | None:
    """resumed_after is how long after the kill `run` had consumed and committed from every partition
    (None while it has not)."""
    firsts = []
    for partition in range(PARTITIONS):
        later = [d.at for d in list(run.deliveries) if d.partition == partition and d.at >= killed_at and d.committed]
        if not later:
            return None
        firsts.append(min(later))
    return max(firsts) - killed_at


def group_led_by(live: list[int], prefix: str, wanted) -> str:
    """group_led_by is the first group name `<prefix>-<i>` whose bucket's preferred broker passes `wanted`."""
    for i in range(1000):
        name = f"{prefix}-{i}"
        if wanted(preferred(Slot(None, group_bucket(name, DEFAULT_GROUP_BUCKETS)), live, live[0])):
            return name
    raise AssertionError(f"no group name {prefix}-<i> fits")


def failover(brokers: list[TopicsProcess], *, kill_coordinator: bool) -> dict:
    """failover runs both groups through the kill of a broker and checks them (see the module doc)."""
    bootstrap = ",".join(b.bootstrap for b in brokers)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, num_partitions=PARTITIONS, replication_factor=1)])[TOPIC].result(30)
    wait_until(lambda: len(broker_ids(bootstrap)) == 3, 30, message="three brokers in Metadata")
    live = sorted(broker_ids(bootstrap))
    if kill_coordinator:
        python_group = group_led_by(live, "python", lambda broker: True)
        victim_id = preferred(Slot(None, group_bucket(python_group, DEFAULT_GROUP_BUCKETS)), live, live[0])
        confluent_group = group_led_by(live, "confluent", lambda broker: broker == victim_id)
    else:
        victim_id = preferred(Slot(TOPIC, 0), live, live[0])
        python_group = group_led_by(live, "python", lambda broker: broker != victim_id)
        confluent_group = group_led_by(live, "confluent", lambda broker: broker != victim_id)
    groups = {confluent_group: "confluent-kafka", python_group: "kafka-python"}

    def settled():
        want = {p: preferred(Slot(TOPIC, p), live, live[0]) for p in range(PARTITIONS)}
        return leaders(bootstrap, TOPIC) == want and all(
            coordinator(bootstrap, g) == preferred(Slot(None, group_bucket(g, DEFAULT_GROUP_BUCKETS)), live, live[0])
            for g in groups)
    # Slots go first to whichever broker campaigns first; once the handovers end, only the kill moves leaders.
    wait_until(settled, 60, interval=0.2, message="partitions and coordinators led by their preferred brokers")

    acked: list[bytes] = []
    produce_errors: list = []
    enough = threading.Event()
    runs = [GroupRun(name, bootstrap, library, static_cooperative=kill_coordinator and library == "confluent-kafka")
            for name, library in groups.items()]
    late: GroupRun | None = None
    producer = threading.Thread(target=stream, args=(bootstrap, TOPIC, acked, produce_errors),
                                kwargs={"records": range(RECORDS), "keys": 97, "stop": enough}, daemon=True)
    try:
        for run in runs:
            run.start()
        producer.start()
        wait_until(lambda: all(len(run.deliveries) > 100 and run.settled() for run in runs), 60,
                   message="records consumed by each group, each member owning one partition")
        assigned_before = {run.name: len(run.assigned_at) for run in runs}
        victim = next(b for b in brokers if b.port == broker_ids(bootstrap)[victim_id])
        if kill_coordinator:
            assert {coordinator(bootstrap, g) for g in groups} == {victim_id}
        else:
            assert leaders(bootstrap, TOPIC)[0] == victim_id and victim_id not in {coordinator(bootstrap, g)
                                                                                  for g in groups}
        victim.kill()
        killed_at = time.monotonic()
        for run in runs:
            run.killed_at = killed_at
        if not kill_coordinator:                      # the group: started on the survivors
            survivors = ",".join(b.bootstrap for b in brokers if b is not victim)
            late = GroupRun(f"{confluent_group}-late", survivors, "confluent-kafka").start()
        # The producer goes on until every group consumed and committed from each partition after
        # the kill (check_group asserts how soon), or that time passed; then it flushes.
        limit = SESSION_MS / 1000 + RESUME_SLACK_S
        resumed = lambda: all(resumed_after(run, killed_at) is not None for run in runs)  # noqa: E731
        while not resumed() and time.monotonic() - killed_at < limit + 1 and producer.is_alive():
            time.sleep(0.1)                   # paces the check; the producer streams meanwhile
        enough.set()
        producer.join(150)
        assert not producer.is_alive() and produce_errors == [] and acked
        for run in runs + ([late] if late else []):
            wait_until(lambda: set(acked) <= run.consumed(), 60, interval=0.2, message=lambda: (
                f"{run.name}: {len(set(acked) - run.consumed())} acknowledged records not consumed; "
                f"last consumed per partition {run.last_per_partition()} s after the kill; members own {run.owned}; "
                f"assigned at {[round(at - killed_at, 2) for at in run.assigned_at]} s after the kill; "
                f"commit errors {sorted({d.error for d in run.deliveries if d.error})[:5]}"))
        done_at = time.monotonic()
    finally:
        for run in runs + ([late] if late else []):
            run.stop()
        producer.join(30)
    numbers = {run.library: check_group(run, acked, killed_at) for run in runs}
    if late is not None:
        numbers["confluent-kafka started after the kill"] = {
            **check_group(late, acked, None), "all consumed after s": round(done_at - killed_at, 2)}
    for run in runs:
        before_stop = [at for at in run.assigned_at if at < run.stopped_at]
        numbers[run.library]["assigned again after the kill"] = len(before_stop) - assigned_before[run.name]
    print(f"kill of broker {victim_id} ({'coordinator' if kill_coordinator else 'leader of partition 0'}): {numbers}")
    # Coordination stays put when a partition leader dies: no group rebalances. When the coordinator
    # dies, a member may still time its session out before it finds the new one on a loaded machine
    # (FindCoordinator names the dead broker until its metadata session ends), and join again, as it
    # would on Kafka; the records are still consumed once each (check_group), so that is allowed.
    if not kill_coordinator:
        assert all(each.get("assigned again after the kill", 0) == 0 for each in numbers.values()), (
            f"{numbers}; the coordinators said: {rebalances(brokers, groups)}")
    return numbers


def rebalances(brokers: list[TopicsProcess], groups) -> list[str]:
    """rebalances are the lines of the brokers' logs that say why one of `groups` rebalanced."""
    found = []
    for broker in brokers:
        with open(broker.log_path, errors="replace") as f:
            found += [f"broker :{broker.port}: {line.strip()}" for line in f
                      if " rebalances " in line and any(f"group {group} " in line for group in groups)]
    return found


@pytest.mark.slow
def test_groups_consume_every_record_once_when_a_partition_leader_dies(brokers):
    """The leader of partition 0 is killed; besides the two groups that run through it, a third group
    (confluent-kafka) is started on the survivors right after the kill, as in issue 44."""
    failover(brokers, kill_coordinator=False)


@pytest.mark.slow
def test_groups_go_on_consuming_every_record_once_when_their_coordinator_dies(brokers):
    """The coordinator of both groups is killed: the new one loads their stored memberships, so the
    static cooperative-sticky confluent-kafka members and the kafka-python members go on with their
    assignments (a member whose session ran out first joins again), and both groups consume every
    record, once unless a commit failed, within the session timeout plus 5 s."""
    failover(brokers, kill_coordinator=True)


# -- the bucket's replicated group state (fast) ----------------------------------------------------

def test_bucket_state_applies_memberships_snapshots_and_reads_the_old_format():
    async def scenario():
        coordinator = GroupCoordinator(asyncio.get_running_loop(), initial_delay_ms=0)
        protocols = [("range", b"subscription")]
        joined = await coordinator.join("g", "", "static-1", "c1", "h1", 6000, 9000, "consumer", protocols)
        assert await coordinator.sync("g", 1, joined.member_id, [(joined.member_id, b"A")]) == (errors.NONE, b"A")
        return coordinator.groups["g"].membership()
    membership = asyncio.run(scenario())
    state = OffsetsState()
    state.apply(commit_record("g", [("t", 0, 5, -1, None)], 1), Position(1, 0))
    state.apply(membership_record("g", membership), Position(1, 1))
    state.apply(membership_record("gone", membership), Position(1, 2))
    state.apply(membership_record("gone", None), Position(1, 3))
    assert state.stored_memberships() == {"g": membership} and state.offsets("g")[("t", 0)].offset == 5
    [member] = membership.members
    assert (member.instance_id, member.session_timeout_ms, member.assignment) == ("static-1", 6000, b"A")
    out = io.BytesIO()
    state.snapshot(out)
    restored = OffsetsState()
    restored.restore(io.BytesIO(out.getvalue()))
    assert restored.stored_memberships() == {"g": membership} and restored.offsets("g") == state.offsets("g")
    # A checkpoint of a broker from before memberships restores its offsets and no membership.
    old = OffsetsState()
    old.restore(io.BytesIO(b'{"checkpoint":{"g":[["t",0,5,-1,null,1]]}}'))
    assert old.offsets("g") == state.offsets("g") and old.stored_memberships() == {}


def test_a_new_bucket_leader_loads_the_stored_groups_as_stable(memory_cluster):
    async def scenario():
        loop = asyncio.get_running_loop()

        def bucket_on(node_id: str) -> BucketLeader:
            coordinator = GroupCoordinator(loop, initial_delay_ms=50, persist=lambda g, record: bucket.commit(record))
            bucket = BucketLeader(loop, 0, OffsetsState(), coordinator)
            bucket.node = ReplicatedNode(bucket.state, client=memory_cluster.client(own_store=True),
                                         name="kafkagroups-0", node_id=node_id, on_role=bucket.on_role,
                                         snapshot_every_records=2, lease_ms=0).start()
            return bucket
        first = bucket_on("1")
        await until(lambda: first.active)
        second = bucket_on("2")
        protocols = [("cooperative-sticky", b"subscription")]
        joins = [first.coordinator.join("g", "", f"static-{i}", f"c{i}", "h", 6000, 9000, "consumer", protocols)
                 for i in range(2)]
        one, two = [await join for join in joins]
        follower = first.coordinator.sync("g", 1, two.member_id, [])
        leader = first.coordinator.sync("g", 1, one.member_id, [(one.member_id, b"A"), (two.member_id, b"B")])
        assert await leader == (errors.NONE, b"A") and await follower == (errors.NONE, b"B")
        await until(lambda: "g" in second.state.stored_memberships())
        await loop.run_in_executor(None, first.node.close)
        await until(lambda: second.active, 30)
        group = second.coordinator.groups["g"]
        assert (group.state, group.generation, group.leader) == (STABLE, 1, one.member_id)
        assert {m.id: (m.instance_id, m.assignment) for m in group.members.values()} == {
            one.member_id: ("static-0", b"A"), two.member_id: ("static-1", b"B")}
        assert second.coordinator.heartbeat("g", 1, two.member_id) == errors.NONE
        assert second.coordinator.check_commit("g", 1, one.member_id) == errors.NONE
        assert await second.coordinator.sync("g", 1, two.member_id, []) == (errors.NONE, b"B")
        # The last member leaves: the group is stored as gone, so no later leader brings it back.
        assert second.coordinator.leave("g", [(one.member_id, None), (two.member_id, None)]) == [errors.NONE] * 2
        await until(lambda: "g" not in second.state.stored_memberships())
        await loop.run_in_executor(None, second.node.close)
    asyncio.run(scenario())


def test_a_leader_rejoining_before_its_sync_gets_the_same_generation_not_a_new_rebalance():
    """A leader that missed its JoinGroup answer (kafka-python gives up on a poll's timeout) asks
    again while the group completes its rebalance: as Kafka, it is answered the current generation.
    Rebalancing instead restarted the group every time, without end (test_topics_clients' roundrobin
    group of three consumers polled by one thread never settled)."""
    async def scenario():
        coordinator = GroupCoordinator(asyncio.get_running_loop(), initial_delay_ms=50)
        protocols = [("roundrobin", b"subscription")]
        joins = [coordinator.join("g", "", None, f"c{i}", "h", 6000, 9000, "consumer", protocols) for i in range(2)]
        one, two = [await join for join in joins]
        again = await coordinator.join("g", one.member_id, None, "c0", "h", 6000, 9000, "consumer", protocols)
        assert (again.error, again.generation, again.leader) == (errors.NONE, 1, one.member_id)
        assert len(again.members) == 2
        leader = coordinator.sync("g", 1, one.member_id, [(one.member_id, b"A"), (two.member_id, b"B")])
        assert await leader == (errors.NONE, b"A")
        assert await coordinator.sync("g", 1, two.member_id, []) == (errors.NONE, b"B")
        # In Stable, the leader's rejoin rebalances (it may assign anew), as Kafka does.
        rejoin = coordinator.join("g", one.member_id, None, "c0", "h", 6000, 9000, "consumer", protocols)
        assert coordinator.heartbeat("g", 1, two.member_id) == errors.REBALANCE_IN_PROGRESS
        rejoin.cancel()
    asyncio.run(scenario())


class HeldNode:
    """HeldNode stands in for a bucket's walkit.replicate node whose submissions the test completes or fails."""

    is_leader = True
    lease_valid = True

    def __init__(self) -> None:
        self.submitted: list[concurrent.futures.Future] = []

    def submit_async(self, record: bytes) -> concurrent.futures.Future:
        self.submitted.append(concurrent.futures.Future())
        return self.submitted[-1]


def test_offset_fetch_waits_for_commits_in_flight_and_refuses_while_a_failed_one_is_undecided():
    """A commit that failed when leadership was lost may still be in the log; until a later commit
    applies or the bucket is led anew, OffsetFetch answers NOT_COORDINATOR (the client asks again),
    never offsets that the failed commit may yet move (the nemesis test's consumer read back such a
    commit as not taken, and its batch was never consumed)."""
    async def scenario():
        loop = asyncio.get_running_loop()
        bucket = BucketLeader(loop, 0, OffsetsState(), GroupCoordinator(loop, initial_delay_ms=0))
        bucket.node = HeldNode()
        bucket._lead()
        first = bucket.commit(b"first")
        settling = asyncio.ensure_future(bucket.settled())
        await asyncio.sleep(0)
        assert not settling.done()                                  # waits for the commit in flight
        bucket.node.submitted[0].set_result(None)
        await settling
        failed = bucket.commit(b"failed")
        bucket.node.submitted[1].set_exception(RuntimeError("leadership lost"))
        with pytest.raises(errors.KafkaError) as refused:
            await bucket.settled()
        assert refused.value.code == errors.NOT_COORDINATOR and failed.exception().code == errors.NOT_COORDINATOR
        later = bucket.commit(b"later")                             # applied after it: the failed one is decided
        bucket.node.submitted[2].set_result(None)
        await later
        await bucket.settled()
        bucket.commit(b"failed again")
        bucket.node.submitted[3].set_exception(RuntimeError("leadership lost"))
        await asyncio.sleep(0.01)
        with pytest.raises(errors.KafkaError):
            await bucket.settled()
        bucket._lead()                                              # led anew: the replay decided it
        await bucket.settled()
        assert first.done()
    asyncio.run(scenario())
