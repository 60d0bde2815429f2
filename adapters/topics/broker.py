"""walkit.adapters.topics.broker is one broker's state on its event loop: what it leads and coordinates.

The broker serves the partitions and group buckets it leads (ownership.py decides which):
`leaders` maps (topic, partition) to a PartitionLeader, `buckets` maps a group bucket to its
committed-offsets log, and `coordinator` holds the membership of the groups in those
buckets. The request handlers (handlers/) read and change these only on the event loop.
A periodic task expires silent group members, applies retention, and notices leaderships
lost with the metadata session.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass

from walkit import Position
from walkit.adapters.topics import errors, snapshots
from walkit.adapters.topics.catalog import BrokerInfo, Catalog, group_bucket
from walkit.adapters.topics.coordinator import GroupCoordinator
from walkit.adapters.topics.errors import KafkaError
from walkit.adapters.topics.leader import PartitionLeader
from walkit.adapters.topics.offsets import CHECKPOINT_EVERY, OffsetsState
from walkit.adapters.topics.ownership import ClusterView, Ownership, Slot
from walkit.adapters.topics.partition import PartitionState
from walkit.adapters.topics.replica import LeaderLog
from walkit.errors import LogTruncated

log = logging.getLogger("walkit.adapters.topics")


@dataclass
class BrokerSettings:
    """BrokerSettings are the tunables of a broker (see `walkit topics serve --help`)."""

    auto_create_topics: bool = True
    default_partitions: int = 1
    cache_bytes: int = 32 * 1024 * 1024
    max_request_bytes: int = 100 * 1024 * 1024
    retention_check_ms: int = 5000
    snapshot_every: int = 10_000
    initial_rebalance_delay_ms: int = 1000
    ensemble: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2


class BucketLeader:
    """BucketLeader is a group bucket this broker coordinates: its offsets log and state."""

    def __init__(self, loop, bucket: int, writer, state: OffsetsState, on_lost) -> None:
        self.bucket = bucket
        self.loop = loop
        self.state = state
        self.replica = LeaderLog(loop, f"group bucket {bucket}", writer, state, on_lost)
        self._checkpointing = False

    def commit(self, record: bytes) -> asyncio.Future:
        """commit appends a commit record; the Future resolves once it is durable and applied.

        Every CHECKPOINT_EVERY commits, at a moment when nothing is in flight (so the state holds
        every record before the checkpoint in the log), the whole state is appended first and
        the log truncated before it.
        """
        if (self.state.commits_since_checkpoint >= CHECKPOINT_EVERY and not self._checkpointing
                and self.replica.in_flight == 0):
            self._checkpointing = True
            self.loop.create_task(self._checkpoint(self.replica.submit(self.state.checkpoint_record())))
        return self.replica.submit(record)

    async def _checkpoint(self, appended: asyncio.Future) -> None:
        """_checkpoint waits for the checkpoint record and truncates the log before it."""
        try:
            await appended
            position = self.state.checkpoint_position
            await self.loop.run_in_executor(None, self.replica.writer.truncate, position)
        except Exception as exc:  # noqa: BLE001 - retried after the next CHECKPOINT_EVERY commits
            log.warning("group bucket %d: checkpoint failed: %s", self.bucket, exc)
        finally:
            self._checkpointing = False


class Broker:
    """Broker is one broker: its identity, its leaderships and its group coordinator."""

    def __init__(self, loop: asyncio.AbstractEventLoop, client, info: BrokerInfo, settings: BrokerSettings,
                 password: bytes = b"") -> None:
        self.loop = loop
        self.client = client
        self.info = info
        self.id = info.id
        self.settings = settings
        self.password = password
        self.catalog = Catalog(client.store)
        self.leaders: dict[tuple[str, int], PartitionLeader] = {}
        self.buckets: dict[int, BucketLeader] = {}
        self.coordinator = GroupCoordinator(loop, initial_delay_ms=settings.initial_rebalance_delay_ms)
        self.view = ClusterView(brokers={info.id: info})
        self.started = time.monotonic()
        self._elections: dict[Slot, object] = {}
        self._stopping = False
        self._registration = None
        log_options = {"ensemble": settings.ensemble, "write_quorum": settings.write_quorum,
                       "ack_quorum": settings.ack_quorum}
        self.ownership = Ownership(client, info.id, install=self._install, publish=self._publish,
                                   release=self._release_soon, log_options=log_options)
        self._periodic: asyncio.Task | None = None

    async def start(self) -> None:
        """start registers the broker, starts the ownership thread and the periodic task."""
        self._registration = await self.loop.run_in_executor(None, self.catalog.register_broker, self.info)
        self.ownership.start()
        self._periodic = self.loop.create_task(self._tick())

    async def stop(self) -> None:
        """stop steps down from everything this broker leads and deregisters it."""
        self._stopping = True
        if self._periodic is not None:
            self._periodic.cancel()
        for slot in list(self._elections):
            self._release(slot)
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
        """leader_of is the broker id that leads a slot, -1 if none (this broker's own view first)."""
        if slot in self._elections and self._serving(slot):
            return self.id
        leader = self.view.leaders.get(slot, -1)
        if leader == self.id and not self._serving(slot):
            return -1                           # won, still replaying (or just lost)
        return leader

    def _serving(self, slot: Slot) -> bool:
        if slot.topic is None:
            return slot.partition in self.buckets
        return (slot.topic, slot.partition) in self.leaders

    def partition(self, topic: str, partition: int) -> PartitionLeader:
        """partition returns the leader of a partition this broker serves, or raises KafkaError."""
        leader = self.leaders.get((topic, partition))
        if leader is not None and leader.active:
            return leader
        known = self.view.topics.get(topic)
        if known is None:
            raise KafkaError(errors.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {topic!r}")
        if not 0 <= partition < known.partitions:
            raise KafkaError(errors.UNKNOWN_TOPIC_OR_PARTITION, f"{topic!r} has no partition {partition}")
        raise KafkaError(errors.NOT_LEADER_OR_FOLLOWER, f"broker {self.id} does not lead {topic}-{partition}")

    def bucket_for(self, group: str) -> BucketLeader:
        """bucket_for returns the bucket coordinating `group` here, or raises NOT_COORDINATOR (INVALID_GROUP_ID)."""
        if not isinstance(group, str) or not group:
            raise KafkaError(errors.INVALID_GROUP_ID, "a group id is a non-empty string")
        bucket = self.buckets.get(group_bucket(group))
        if bucket is None or not bucket.replica.active:
            raise KafkaError(errors.NOT_COORDINATOR, f"broker {self.id} does not coordinate group {group!r}")
        return bucket

    # -- taking and losing slots -----------------------------------------------------------
    def _install(self, slot: Slot, writer, election) -> None:
        """_install replays a won slot's log and hands it to the loop (called on a worker thread)."""
        state = OffsetsState() if slot.topic is None else PartitionState()
        cache: collections.deque[bytes] = collections.deque()
        cached = 0
        for record in self._replay(slot, state):
            applied = state.apply(record.payload, record.position)
            if slot.topic is not None and applied is not None:
                cache.append(record.payload)
                cached += len(record.payload)
                while cached > self.settings.cache_bytes and len(cache) > 1:
                    cached -= len(cache.popleft())
        future = asyncio.run_coroutine_threadsafe(self._activate(slot, writer, election, state, list(cache)),
                                                  self.loop)
        future.result(30)

    def _replay(self, slot: Slot, state):
        """_replay yields the records a new leader applies: all of a bucket's log, a partition's after its snapshot."""
        start = None
        if slot.topic is not None:
            pointer = snapshots.load(self.client, slot.log_name, state, self.password)
            if pointer is not None:
                log.info("%s: replaying the log after its snapshot at %s", slot.log_name, pointer.position)
                start = Position(pointer.position.ledger_id, pointer.position.entry_id + 1)
                first = self.client.log_metadata(slot.log_name).ledger_ids[:1]
                if first:
                    state.truncate_before(Position(first[0], 0))       # what retention removed since
        try:
            yield from self.client.read_log(slot.log_name, start=start, follow=False, password=self.password)
        except LogTruncated:
            if start is None:
                raise
            # Retention removed the snapshot's ledger: the whole (remaining) log comes after it.
            yield from self.client.read_log(slot.log_name, follow=False, password=self.password)

    def _take_snapshot(self, log_name: str, state: PartitionState) -> None:
        """_take_snapshot writes and publishes a partition snapshot (worker thread)."""
        settings = self.settings
        pointer = snapshots.write(self.client, log_name, state, ensemble=settings.ensemble,
                                  write_quorum=settings.write_quorum, ack_quorum=settings.ack_quorum,
                                  password=self.password)
        if snapshots.publish(self.client, log_name, pointer):
            log.info("%s: snapshot at %s in ledger %d", log_name, pointer.position, pointer.ledger_id)

    async def _activate(self, slot: Slot, writer, election, state, cache) -> None:
        if self._stopping or not election.is_leader:
            raise KafkaError(errors.NOT_LEADER_OR_FOLLOWER, "the leadership ended during the replay")
        self._elections[slot] = election
        lost = lambda error, slot=slot: self._release(slot)     # noqa: E731
        if slot.topic is None:
            self.buckets[slot.partition] = BucketLeader(self.loop, slot.partition, writer, state, lost)
        else:
            known = self.view.topics.get(slot.topic)
            self.leaders[(slot.topic, slot.partition)] = leader = PartitionLeader(
                self.loop, self.client, slot.topic, slot.partition, slot.log_name, writer, state, cache,
                cache_bytes=self.settings.cache_bytes, on_lost=lost, password=self.password,
                snapshot_every=self.settings.snapshot_every, take_snapshot=self._take_snapshot)
            leader.topic_id = known.id if known is not None else None
        log.info("broker %d serves %s from offset %s", self.id, slot.log_name, getattr(state, "next_offset", "-"))

    def _release(self, slot: Slot) -> None:
        """_release stops serving a slot (on the loop) and resigns it (on a worker thread)."""
        self._elections.pop(slot, None)
        writer = None
        if slot.topic is None:
            bucket = self.buckets.pop(slot.partition, None)
            if bucket is not None:
                bucket.replica.stop()
                writer = bucket.replica.writer
                self.coordinator.drop([g for g in self.coordinator.groups if group_bucket(g) == slot.partition])
        else:
            leader = self.leaders.pop((slot.topic, slot.partition), None)
            if leader is not None:
                leader.replica.stop()
                leader.lost()
                writer = leader.replica.writer
        self.ownership.resign(slot, writer)

    def _release_soon(self, slot: Slot) -> None:
        """_release_soon releases a slot on the loop (called from the ownership thread)."""
        try:
            self.loop.call_soon_threadsafe(lambda: slot in self._elections and self._release(slot))
        except RuntimeError:
            pass

    # -- periodic work ---------------------------------------------------------------------------
    async def _tick(self) -> None:
        last_retention = 0.0
        while True:
            await asyncio.sleep(0.25)
            try:
                self.coordinator.expire()
                for slot, election in list(self._elections.items()):
                    if not election.is_leader:
                        log.warning("broker %d lost the election of %s", self.id, slot.log_name)
                        self._release(slot)
                for (topic, partition), leader in list(self.leaders.items()):
                    known = self.view.topics.get(topic)
                    if leader.topic_id is not None and (known is None or known.id != leader.topic_id):
                        log.info("broker %d: topic %s was deleted; leaving partition %d", self.id, topic, partition)
                        self._release(Slot(topic, partition))
                now = time.monotonic()
                if now - last_retention >= self.settings.retention_check_ms / 1000:
                    last_retention = now
                    for (topic, _), leader in list(self.leaders.items()):
                        known = self.view.topics.get(topic)
                        if known is not None:
                            self.loop.create_task(self._retention(leader, known))
            except Exception:  # noqa: BLE001 - the periodic task must survive anything
                log.exception("periodic broker work failed")

    async def _retention(self, leader: PartitionLeader, topic) -> None:
        try:
            await leader.enforce_retention(topic.int_config("retention.ms"), topic.int_config("retention.bytes"))
        except Exception:  # noqa: BLE001 - retried at the next check
            log.exception("retention of %s-%d failed", leader.topic, leader.partition)
