"""walkit.adapters.topics.broker is one broker's state on its event loop: the slots it runs and leads.

The broker runs a walkit.replicate node of every partition and group bucket (ownership.py
opens and closes them): `partitions` maps (topic, partition) to a PartitionLeader,
`buckets` maps a group bucket to a BucketLeader, each serving while this broker leads it, and
`coordinator` holds the membership of the groups in the buckets it leads (stored in the buckets,
and loaded by the broker that takes a bucket over); `transactions` coordinates the transactional
ids of those buckets and writes the markers of the slots this broker leads (txncoordinator.py).
The cluster's count of buckets is read (or, on a new cluster, recorded) before any slot opens
(catalog.Catalog.group_buckets). The request handlers (handlers/) read and change these only on
the event loop. A periodic task expires
silent group members, applies retention and, in the buckets this broker leads, expires the
committed offsets of groups empty for `offsets_retention_ms` (forget records, offsets.py) and
times out and expires transactions (TransactionCoordinator.tick).

Message size: a record batch is one walkit.replicate record, so it must fit a log entry of its
own (`largest_message`: the client's max_entry_bytes less 9 bytes). A topic's
`max.message.bytes` (default: the broker's `max_message_bytes`, Kafka's `message.max.bytes`)
is at most that; a larger batch is answered MESSAGE_TOO_LARGE for its partition before anything
is appended, never split, and the partition's leadership is untouched.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from walkit.adapters.topics import errors
from walkit.adapters.topics.catalog import (
    DEFAULT_CONFIGS, DEFAULT_GROUP_BUCKETS, REPLICATED_LOG, BrokerInfo, Catalog, Topic, bucket_name, group_bucket,
    partition_log, partition_name,
)
from walkit.adapters.topics.coordinator import GroupCoordinator
from walkit.adapters.topics.errors import KafkaError
from walkit.adapters.topics.leader import PartitionLeader, on_loop
from walkit.adapters.topics.offsets import SNAPSHOT_EVERY, OffsetsState, forget_record
from walkit.adapters.topics.ownership import ClusterView, Ownership, Slot
from walkit.adapters.topics.partition import PartitionMachine
from walkit.adapters.topics.txncoordinator import EXPIRATION_MS, TransactionCoordinator
from walkit.errors import ConfigError, NoSuchLog, WalkitError
from walkit.replication import ReplicatedNode
from walkit.replication.batch import max_record

log = logging.getLogger("walkit.adapters.topics")


@dataclass
class BrokerSettings:
    """BrokerSettings are the tunables of a broker (see `walkit topics serve --help`)."""

    auto_create_topics: bool = True
    default_partitions: int = 1
    cache_bytes: int = 32 * 1024 * 1024
    max_request_bytes: int = 100 * 1024 * 1024
    max_message_bytes: int = int(DEFAULT_CONFIGS["max.message.bytes"])     # Kafka's message.max.bytes
    retention_check_ms: int = 5000
    snapshot_every: int = 10_000
    initial_rebalance_delay_ms: int = 1000
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000   # Kafka's offsets.retention.minutes, 7 days
    group_buckets: int | None = None            # the cluster's (catalog.Catalog.group_buckets); None: keep it
    transactional_id_expiration_ms: int = EXPIRATION_MS      # Kafka's transactional.id.expiration.ms, 7 days
    ensemble: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2


#: How long OffsetFetch waits for a bucket leader past its lease to prove it still leads.
READ_BARRIER_S = 5.0


class BucketLeader:
    """BucketLeader is a group bucket on this broker: its committed offsets, served while the broker leads it.

    A commit whose submission failed (leadership lost mid-write) may still be in the log: the
    next leader's replay decides. Until then the bucket's offsets are in doubt, so `settled`, which
    OffsetFetch awaits, waits for the commits in flight and refuses (NOT_COORDINATOR, the client
    asks again) while a failed one is undecided: a client that reads back its failed commit must
    never be told "not committed" of a commit that later takes effect. A later commit applied,
    or the bucket led anew, decides it. A leader past its walkit.replicate lease proves it still
    leads (a read barrier) before it answers: a deposed one that has not noticed yet would
    answer offsets the new leader has moved on from (the nemesis topics test, seed 1: two
    brokers each loaded the group from the bucket for 6 s after a partition healed).
    """

    def __init__(self, loop, bucket: int, state: OffsetsState, coordinator: GroupCoordinator) -> None:
        self.loop = loop
        self.bucket = bucket
        self.state = state
        self.coordinator = coordinator
        self.node = None                          # the walkit.replicate node, set by the broker
        self.active = False
        self._in_flight: set[asyncio.Future] = set()
        self._submitted = 0                       # commits submitted in this process, numbered
        self._undecided = 0                       # the last failed commit's number while its fate is open

    def on_role(self, role: str) -> None:
        """on_role starts coordinating on "leader", with the groups the bucket stored; on "follower" it
        stops and forgets the groups' members (the next leader loads them)."""
        if role == "leader":
            on_loop(self.loop, self._lead)
        else:
            on_loop(self.loop, self._follow, wait=True)

    def _lead(self) -> None:
        if self.node is not None and self.node.is_leader:
            self.coordinator.load(self.bucket, self.state.stored_memberships())
            self._undecided = 0                   # the replay before leading applied it or not
            self.active = True

    def _follow(self) -> None:
        self.active = False
        self.coordinator.drop(self.bucket)

    def commit(self, record: bytes) -> asyncio.Future:
        """commit submits a commit record; the Future resolves once it is acknowledged and applied."""
        if not self.active:
            raise KafkaError(errors.NOT_COORDINATOR, f"group bucket {self.bucket} moved")
        try:
            submitted = self.node.submit_async(record)
        except WalkitError as exc:
            raise KafkaError(errors.NOT_COORDINATOR, f"group bucket {self.bucket}: {exc}") from None
        result = self.loop.create_future()
        self._submitted += 1
        number = self._submitted
        self._in_flight.add(result)
        result.add_done_callback(self._in_flight.discard)

        def finish(applied) -> None:
            if result.done():
                return
            error = applied.exception()
            if error is None:
                if number > self._undecided:      # applied after it, in log order: the failed one is decided
                    self._undecided = 0
                result.set_result(applied.result())
            else:
                self._undecided = max(self._undecided, number)
                result.set_exception(KafkaError(errors.NOT_COORDINATOR,
                                                f"group bucket {self.bucket}: {type(error).__name__}: {error}"))
        submitted.add_done_callback(lambda applied: on_loop(self.loop, lambda: finish(applied)))
        return result

    async def settled(self) -> None:
        """settled returns once no commit is in flight or in doubt (see the class doc); it raises
        KafkaError NOT_COORDINATOR while a failed commit's fate is open or the bucket moved."""
        if self._in_flight:
            await asyncio.wait(list(self._in_flight))
        if self.active and not self.node.lease_valid:
            # Past its lease this node may have been deposed without knowing it yet (a network
            # partition cut it from the metadata store's view while another broker took the
            # bucket); its state may miss the new leader's commits. Prove it still leads first.
            try:
                await self.loop.run_in_executor(None, self.node.read_barrier, READ_BARRIER_S)
            except WalkitError as exc:
                raise KafkaError(errors.NOT_COORDINATOR, f"group bucket {self.bucket}: {exc}") from None
            if not self.node.is_leader:
                raise KafkaError(errors.NOT_COORDINATOR, f"group bucket {self.bucket} moved")
        if not self.active or self._undecided:
            raise KafkaError(errors.NOT_COORDINATOR, f"group bucket {self.bucket}: a failed commit may still apply; "
                                                     f"the next leader decides")


class Broker:
    """Broker is one broker: its identity, its slots and its group coordinator."""

    def __init__(self, loop: asyncio.AbstractEventLoop, client, info: BrokerInfo, settings: BrokerSettings,
                 password: bytes = b"") -> None:
        self.loop = loop
        self.client = client
        self.info = info
        self.id = info.id
        self.settings = settings
        self.password = password
        self.largest_message = max_record(client.max_entry_bytes)
        if not 0 < settings.max_message_bytes <= self.largest_message:
            raise ConfigError(f"max_message_bytes is from 1 to {self.largest_message} (a record batch must fit a "
                              f"log entry: the client's max_entry_bytes less 9), got {settings.max_message_bytes}")
        self.defaults = {**DEFAULT_CONFIGS, "max.message.bytes": str(settings.max_message_bytes)}
        self.catalog = Catalog(client.store)
        self.partitions: dict[tuple[str, int], PartitionLeader] = {}
        self.buckets: dict[int, BucketLeader] = {}
        self.group_buckets = settings.group_buckets or DEFAULT_GROUP_BUCKETS     # the cluster's, once started
        self.coordinator = GroupCoordinator(loop, initial_delay_ms=settings.initial_rebalance_delay_ms,
                                            persist=self._persist, bucket_of=self.bucket_of)
        self.transactions = TransactionCoordinator(self, expiration_ms=settings.transactional_id_expiration_ms)
        self.view = ClusterView(brokers={info.id: info})
        self._registration = None
        self.ownership: Ownership | None = None
        self._periodic: asyncio.Task | None = None

    async def start(self) -> None:
        """start reads the cluster's group buckets, registers the broker, starts the ownership thread and
        the periodic task; ConfigError if --group-buckets disagrees with the cluster's."""
        self.group_buckets = await self.loop.run_in_executor(
            None, self.catalog.group_buckets, self.settings.group_buckets, self._bucket_logs_exist)
        self._registration = await self.loop.run_in_executor(None, self.catalog.register_broker, self.info)
        self.ownership = Ownership(self.client.store, self.id, group_buckets=self.group_buckets,
                                   open_slot=self._open_slot, close_slot=self._close_slot, publish=self._publish)
        self.ownership.start()
        self._periodic = self.loop.create_task(self._tick())

    def _bucket_logs_exist(self) -> bool:
        """_bucket_logs_exist tells whether the cluster has group buckets from before their count was recorded."""
        try:
            self.client.log_metadata(REPLICATED_LOG + bucket_name(0))
        except NoSuchLog:
            return False
        log.warning("this cluster's group buckets predate --group-buckets: it keeps their count")
        return True

    async def stop(self) -> None:
        """stop closes every node (leaders step down, so other brokers take over at once) and deregisters."""
        if self._periodic is not None:
            self._periodic.cancel()
        if self.ownership is not None:
            await self.loop.run_in_executor(None, self.ownership.stop)
        if self._registration is not None:
            await self.loop.run_in_executor(None, self._registration.close)

    # -- views ---------------------------------------------------------------------------------
    def _publish(self, view: ClusterView) -> None:
        try:
            self.loop.call_soon_threadsafe(setattr, self, "view", view)
        except RuntimeError:
            pass

    def leader_of(self, slot: Slot) -> int:
        """leader_of is the broker id that leads a slot, -1 if none (this broker's own view first).

        When the ownership thread's view names no live leader (a failover it has not read yet:
        FindCoordinator answered COORDINATOR_NOT_AVAILABLE for many seconds after a coordinator's
        death, and librdkafka members timed their sessions out), the slot's own node says whom it
        last read as leader (walkit.replicate's `node.leader`, renewed each second, never waiting).
        """
        return self.leadership(slot)[0]

    def leadership(self, slot: Slot) -> tuple[int, int]:
        """leadership is (leader_of, its leader epoch) of a slot: the epoch always of the leader named
        (librdkafka moves a partition to another leader only with a larger epoch), -1 if unknown.

        This broker's own epoch while it leads; the epoch its ownership thread read with the leader
        from the election; with the node's fallback leader, the last leadership that began in the
        partition's replicated state (epochs.py).
        """
        served = self._serving(slot)
        if served is not None:
            return self.id, served.epoch if slot.topic is not None else -1
        leader = self.view.leaders.get(slot, -1)
        epoch = self.view.epochs.get(slot, -1)
        if leader not in self.view.brokers:
            leader = self._node_leader(slot)
            known = self._slot(slot) if slot.topic is not None else None
            epoch = known.state.epochs.latest if known is not None else -1
        if leader == self.id:
            return -1, -1                                 # won, still replaying (or just lost)
        return leader, epoch

    def _node_leader(self, slot: Slot) -> int:
        """_node_leader is the broker id this broker's node of `slot` last read as its leader, -1 if none."""
        served = self._slot(slot)
        leader = served.node.leader if served is not None and served.node is not None else None
        return int(leader) if leader is not None and leader.isdigit() else -1

    def _slot(self, slot: Slot):
        """_slot is the slot's PartitionLeader or BucketLeader on this broker (led or not), else None."""
        if slot.topic is None:
            return self.buckets.get(slot.partition)
        served = self.partitions.get((slot.topic, slot.partition))
        known = self.view.topics.get(slot.topic)
        if served is not None and (known is None or known.id != served.topic_id):
            return None                                     # a deleted topic's partition
        return served

    def _serving(self, slot: Slot):
        """_serving is the slot's PartitionLeader or BucketLeader if this broker serves it now, else None."""
        served = self._slot(slot)
        if served is None or not served.active or not served.node.is_leader:
            return None                                     # (a deposed node says "follower" soon)
        return served

    def partition(self, topic: str, partition: int) -> PartitionLeader:
        """partition returns the leader of a partition this broker serves, or raises KafkaError."""
        served = self._serving(Slot(topic, partition))
        if served is not None:
            return served
        known = self.view.topics.get(topic)
        if known is None:
            raise KafkaError(errors.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {topic!r}")
        if not 0 <= partition < known.partitions:
            raise KafkaError(errors.UNKNOWN_TOPIC_OR_PARTITION, f"{topic!r} has no partition {partition}")
        raise KafkaError(errors.NOT_LEADER_OR_FOLLOWER, f"broker {self.id} does not lead {topic}-{partition}")

    async def lookup_topic(self, name: str) -> Topic | None:
        """lookup_topic returns a topic's record: from this broker's view, else (a topic just made) the catalog."""
        topic = self.view.topics.get(name) if isinstance(name, str) else None
        if topic is None:
            topic = await self.loop.run_in_executor(None, self.catalog.topic, name)
        return topic

    def max_message_bytes(self, topic: Topic | None) -> int:
        """max_message_bytes is the largest record batch a produce to `topic` may carry (see the module doc)."""
        configured = topic.configs.get("max.message.bytes") if topic is not None else None
        limit = int(configured) if configured is not None else self.settings.max_message_bytes
        return min(limit, self.largest_message)

    def bucket_of(self, group: str) -> int:
        """bucket_of is the bucket of a consumer group in this cluster."""
        return group_bucket(group, self.group_buckets)

    def bucket_for(self, group: str) -> BucketLeader:
        """bucket_for returns the bucket coordinating `group` here, or raises NOT_COORDINATOR (INVALID_GROUP_ID)."""
        if not isinstance(group, str) or not group:
            raise KafkaError(errors.INVALID_GROUP_ID, "a group id is a non-empty string")
        bucket = self._serving(Slot(None, self.bucket_of(group)))
        if bucket is None:
            raise KafkaError(errors.NOT_COORDINATOR, f"broker {self.id} does not coordinate group {group!r}")
        return bucket

    def _persist(self, group: str, record: bytes) -> asyncio.Future:
        """_persist appends a record of `group`'s membership to its bucket (the coordinator's `persist`)."""
        return self.bucket_for(group).commit(record)

    # -- opening and closing slots (ownership thread, worker threads) ----------------------------
    def _open_slot(self, slot: Slot, topic: Topic | None) -> ReplicatedNode:
        """_open_slot starts this broker's node of a slot and registers its leader object on the loop."""
        settings = self.settings
        options = dict(client=self.client, node_id=str(self.id), password=self.password, ensemble=settings.ensemble,
                       write_quorum=settings.write_quorum, ack_quorum=settings.ack_quorum,
                       campaign_when=lambda: self.ownership.may_campaign(slot, topic.id if topic else None))
        if topic is None:
            served = BucketLeader(self.loop, slot.partition, OffsetsState(), self.coordinator)
            served.state.on_transaction = lambda: on_loop(self.loop, self.transactions.write_markers)
            node = ReplicatedNode(served.state, name=bucket_name(slot.partition), on_role=served.on_role,
                                  snapshot_every_records=SNAPSHOT_EVERY, **options)
            registry, key = self.buckets, slot.partition
        else:
            machine = PartitionMachine(slot.label, settings.cache_bytes)
            served = PartitionLeader(self.loop, self.client, topic.name, slot.partition,
                                     partition_log(topic, slot.partition), machine, password=self.password,
                                     topic_id=topic.id)
            node = ReplicatedNode(machine, name=partition_name(topic, slot.partition), on_role=served.on_role,
                                  keep_log_from=machine.keep_log_from, snapshot_every_records=settings.snapshot_every,
                                  **topic.log_options(), **options)
            assert node.log_name == served.log_name, "catalog.partition_log follows walkit.replicate's log name"
            registry, key = self.partitions, (topic.name, slot.partition)
        served.node = node
        on_loop(self.loop, lambda: registry.__setitem__(key, served), wait=True)
        return node.start()

    def _close_slot(self, slot: Slot, node: ReplicatedNode) -> None:
        """_close_slot closes a slot's node (its topic was deleted, or the broker stops) and forgets it."""
        try:
            node.close()
        except Exception:  # noqa: BLE001 - a node that fails to close must not stop the others
            log.exception("broker %d: closing the node of %s failed", self.id, slot.label)
        if slot.topic is None:
            registry, key = self.buckets, slot.partition
        else:
            registry, key = self.partitions, (slot.topic, slot.partition)

        def forget() -> None:
            served = registry.get(key)
            if served is not None and served.node is node:
                del registry[key]
        on_loop(self.loop, forget)

    # -- periodic work ---------------------------------------------------------------------------
    async def _tick(self) -> None:
        last_retention = 0.0
        while True:
            await asyncio.sleep(0.25)
            try:
                self.coordinator.expire()
                self.transactions.tick()
                now = time.monotonic()
                if now - last_retention >= self.settings.retention_check_ms / 1000:
                    last_retention = now
                    for (topic, _), served in list(self.partitions.items()):
                        known = self.view.topics.get(topic)
                        if known is not None and served.active and known.id == served.topic_id:
                            self.loop.create_task(self._retention(served, known))
                    self._expire_offsets()
            except Exception:  # noqa: BLE001 - the periodic task must survive anything
                log.exception("periodic broker work failed")

    def _expire_offsets(self) -> None:
        """_expire_offsets submits a forget record for each group whose committed offsets expired (offsets.py)."""
        now, retention = int(time.time() * 1000), self.settings.offsets_retention_ms
        before = now - retention
        for bucket in list(self.buckets.values()):
            if not bucket.active:
                continue
            for group in bucket.state.expired(now, retention, self.coordinator.groups.__contains__):
                log.info("group %s: committed offsets older than %d ms expire", group, retention)
                try:
                    bucket.commit(forget_record(group, None, before)).add_done_callback(lambda done: done.exception())
                except KafkaError:
                    return                                      # the bucket moved: its next leader expires them

    async def _retention(self, leader: PartitionLeader, topic: Topic) -> None:
        """_retention applies the topic's cleanup.policy: delete (retention) and compact (compaction.py)."""
        policy = topic.config("cleanup.policy").replace(" ", "").split(",")
        try:
            if "delete" in policy:
                await leader.enforce_retention(topic.int_config("retention.ms"), topic.int_config("retention.bytes"))
            if "compact" in policy:
                await leader.compactor.run(topic.int_config("delete.retention.ms"))
        except Exception:  # noqa: BLE001 - retried at the next check
            log.exception("retention of %s-%d failed", leader.topic, leader.partition)
