"""A partition and a group bucket on a broker: over a scripted node (ordering, duplicates, failures,
retention) and over real walkit.replicate nodes on in-process bookies (hot followers, snapshots)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from types import SimpleNamespace

import pytest

from walkit import Position
from walkit.adapters.topics import batches, errors
from walkit.adapters.topics.broker import BucketLeader
from walkit.adapters.topics.coordinator import GroupCoordinator
from walkit.adapters.topics.errors import KafkaError
from walkit.adapters.topics.leader import PartitionLeader
from walkit.adapters.topics.offsets import OffsetsState, commit_record
from walkit.adapters.topics.partition import PartitionMachine
from walkit.errors import LedgerFenced, NotLeader
from walkit.replication import ReplicatedNode, batch as entries

from .test_topics_state import make_batch


class ScriptedNode:
    """ScriptedNode stands in for a walkit.replicate node: the test decides when entries are acknowledged.

    Like the node, it applies an acknowledged entry's records to the machine in log order and then
    resolves their futures; a failed append fails what is pending and reports "follower" from
    another thread; a snapshot truncates the log before the machine's `keep_log_from`.
    """

    node_id = "1"
    election = SimpleNamespace(epoch=4)              # the leadership's walkit.replicate epoch

    def __init__(self, machine, on_role) -> None:
        self.machine = machine
        self.on_role = on_role
        self.is_leader = True
        self.auto_ack = False
        self.ledger_id = 1
        self.log: list[tuple[Position, bytes]] = []
        self.pending: list[tuple[bytes, concurrent.futures.Future]] = []
        self.truncated: list[Position] = []

    def submit_async(self, record: bytes) -> concurrent.futures.Future:
        if not self.is_leader:
            raise NotLeader("not the leader", None)
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.pending.append((record, future))
        if self.auto_ack:
            self.ack()
        return future

    def ack(self, count: int | None = None) -> None:
        count = len(self.pending) if count is None else count
        done, self.pending = self.pending[:count], self.pending[count:]
        for record, future in done:
            position = Position(self.ledger_id, sum(1 for p, _ in self.log if p.ledger_id == self.ledger_id))
            self.log.append((position, entries.encode([record])))
            future.set_result(self.machine.apply(record, position))

    def fail(self) -> None:
        self.is_leader = False
        for _, future in self.pending:
            future.set_exception(LedgerFenced("another broker opened the log"))
        self.pending = []
        threading.Thread(target=self.on_role, args=("follower",)).start()

    def roll(self) -> None:
        self.ledger_id += 1

    def snapshot_now(self):
        keep = self.machine.keep_log_from()
        if keep is not None:
            self.truncated.append(keep)
            self.log = [(p, d) for p, d in self.log if p.ledger_id >= keep.ledger_id]


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def scripted_leader(cache_bytes: int = 1 << 20) -> tuple[PartitionLeader, ScriptedNode, list]:
    """scripted_leader is a partition led over a ScriptedNode; the list collects its role changes."""
    roles: list[str] = []
    client = SimpleNamespace(log_metadata=lambda name: SimpleNamespace(ledger_ids=[node.ledger_id]))
    leader = PartitionLeader(asyncio.get_running_loop(), client, "t", 0, "replicated-kafka-t-0",
                             PartitionMachine("kafka-t-0", cache_bytes))
    node = leader.node = ScriptedNode(leader.machine, lambda role: (roles.append(role), leader.on_role(role)))
    node.on_role("leader")
    await settle()
    node.ack()                                       # the leadership's epoch record (epochs.py)
    await settle()
    return leader, node, roles


def test_batches_get_dense_offsets_and_are_applied_only_once_acknowledged():
    async def scenario():
        leader, node, _ = await scripted_leader()
        first, second = leader.append(make_batch(3)), leader.append(make_batch(2))
        await settle()
        assert leader.high_watermark == 0 and not first.done()
        node.ack()
        await settle()
        assert (await first, await second) == (0, 3) and leader.high_watermark == 5
        data = await leader.read(4, 1 << 20)
        assert batches.info(data).base_offset == 3
        assert batches.HEADER.unpack_from(data)[2] == 4                 # stamped with the leader epoch
        assert leader.state.epochs.entries == [(4, 0)] and leader.end_offset_for(4) == (4, 5)
        with pytest.raises(KafkaError) as caught:
            await leader.read(6, 100)
        assert caught.value.code == errors.OFFSET_OUT_OF_RANGE
        assert await leader.read(5, 100) == b""
    asyncio.run(scenario())


def test_a_retry_of_an_in_flight_batch_is_answered_with_the_original_and_not_appended():
    async def scenario():
        leader, node, _ = await scripted_leader()
        original = leader.append(make_batch(4, pid=9, epoch=0, seq=0))
        retry = leader.append(make_batch(4, pid=9, epoch=0, seq=0))
        assert len(node.pending) == 1
        nxt = leader.append(make_batch(1, pid=9, epoch=0, seq=4))
        with pytest.raises(KafkaError) as caught:
            leader.append(make_batch(1, pid=9, epoch=0, seq=9))
        assert caught.value.code == errors.OUT_OF_ORDER_SEQUENCE_NUMBER
        node.ack()
        await settle()
        assert (await original, await retry, await nxt) == (0, 0, 4)
        again = leader.append(make_batch(4, pid=9, epoch=0, seq=0))        # after the ack: still a duplicate
        assert await again == 0 and node.pending == []
    asyncio.run(scenario())


def test_a_failed_append_ends_the_leadership_and_fails_everything_pending():
    async def scenario():
        leader, node, roles = await scripted_leader()
        pending = [leader.append(make_batch(1)) for _ in range(3)]
        node.ack(1)
        node.fail()
        for _ in range(50):
            await asyncio.sleep(0.01)
        assert await pending[0] == 0
        for future in pending[1:]:
            with pytest.raises(KafkaError) as caught:
                await future
            assert caught.value.code == errors.NOT_LEADER_OR_FOLLOWER
        assert not leader.active and roles == ["leader", "follower"] and leader.high_watermark == 1
        with pytest.raises(KafkaError):
            leader.append(make_batch(1))
    asyncio.run(scenario())


def test_a_long_poll_that_read_an_older_high_watermark_is_woken_at_once():
    async def scenario():
        leader, node, _ = await scripted_leader()
        waiter = leader.wait_for_data(0)
        assert not waiter.done()                          # nothing new since the caller's read
        leader.append(make_batch(1))
        node.ack()
        await settle()
        assert waiter.done()
        assert leader.wait_for_data(0).done()             # applied before the call: no wait
        assert not leader.wait_for_data(1).done()
    asyncio.run(scenario())


def test_retention_truncates_whole_old_ledgers_but_never_the_current_one():
    async def scenario():
        leader, node, _ = await scripted_leader(cache_bytes=200)
        for ledger in range(3):
            leader.append(make_batch(2, first_ts=1000 + ledger))             # ancient timestamps
            node.ack()
            await settle()
            node.roll()
        assert len(leader.machine.cache) < 3                                  # the cache keeps ~200 bytes
        node.auto_ack = True
        removed = await leader.enforce_retention(retention_ms=1000, retention_bytes=-1)
        assert removed == 3 and node.truncated == [Position(4, 0)]
        assert leader.state.log_start_offset == 6 and leader.state.next_offset == 6
        leader.append(make_batch(2, first_ts=1000))
        await settle()
        assert await leader.enforce_retention(retention_ms=1000, retention_bytes=-1) == 0    # current ledger
        assert (await leader.read(6, 100))[:8] == (6).to_bytes(8, "big")
    asyncio.run(scenario())


# -- over real walkit.replicate nodes -------------------------------------------------------------------
async def until(predicate, timeout: float = 20.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"not within {timeout} s: {predicate}"
        await asyncio.sleep(0.02)


def partition_on(cluster, loop, broker_id: int, **options) -> PartitionLeader:
    """partition_on is broker `broker_id`'s side of partition t-0: a PartitionLeader over a started node."""
    leader = PartitionLeader(loop, cluster.client(), "t", 0, "replicated-kafka-t-0",
                             PartitionMachine("kafka-t-0", 1 << 20))
    leader.node = ReplicatedNode(leader.machine, client=cluster.client(own_store=True), name="kafka-t-0",
                                 node_id=str(broker_id), on_role=leader.on_role,
                                 keep_log_from=leader.machine.keep_log_from, **options).start()
    return leader


def test_a_hot_follower_takes_over_with_the_same_offsets_and_recognises_retries(memory_cluster):
    async def scenario():
        loop = asyncio.get_running_loop()
        first = partition_on(memory_cluster, loop, 1)
        await until(lambda: first.active)
        second = partition_on(memory_cluster, loop, 2)
        acked = [await first.append(make_batch(2, pid=5, epoch=0, seq=2 * i)) for i in range(10)]
        assert acked == list(range(0, 20, 2))
        await until(lambda: second.high_watermark == 20)                   # the follower applied it all
        await loop.run_in_executor(None, first.node.step_down)
        await until(lambda: second.active)
        retry = await second.append(make_batch(2, pid=5, epoch=0, seq=18))  # a retry across the failover
        assert retry == 18 and second.high_watermark == 20
        assert await second.append(make_batch(2, pid=5, epoch=0, seq=20)) == 20
        assert batches.info(await second.read(20, 1 << 20)).base_offset == 20
        for leader in (first, second):
            await loop.run_in_executor(None, leader.node.close)
    asyncio.run(scenario())


def test_retention_on_real_nodes_moves_the_log_start_and_truncates_the_log(memory_cluster):
    async def scenario():
        loop = asyncio.get_running_loop()
        leader = partition_on(memory_cluster, loop, 1, roll_entries=2)
        await until(lambda: leader.active)
        for i in range(6):
            await leader.append(make_batch(1, first_ts=1000 + i))
        client = memory_cluster.client()
        first_ledger = client.log_metadata(leader.log_name).ledger_ids[0]
        assert await leader.enforce_retention(retention_ms=1000, retention_bytes=-1) >= 2
        assert leader.state.log_start_offset >= 4
        assert first_ledger not in client.log_metadata(leader.log_name).ledger_ids
        late = partition_on(memory_cluster, loop, 2)                       # starts from the snapshot
        await until(lambda: late.high_watermark == 6)
        assert late.state.log_start_offset == leader.state.log_start_offset
        for node in (leader.node, late.node):
            await loop.run_in_executor(None, node.close)
    asyncio.run(scenario())


def test_committed_offsets_survive_snapshots_that_truncate_the_bucket_log(memory_cluster):
    async def scenario():
        loop = asyncio.get_running_loop()
        bucket = BucketLeader(loop, 0, OffsetsState(), GroupCoordinator(loop))
        bucket.node = ReplicatedNode(bucket.state, client=memory_cluster.client(own_store=True), name="kafkagroups-0",
                                     node_id="1", on_role=bucket.on_role, snapshot_every_records=3,
                                     roll_entries=2).start()
        await until(lambda: bucket.active)
        for i in range(8):
            await bucket.commit(commit_record("g", [("t", i % 2, i, -1, None)], i))
        client = memory_cluster.client()
        await until(lambda: client.log_metadata("replicated-kafkagroups-0").truncated_to >= 0)
        replayed = OffsetsState()
        other = ReplicatedNode(replayed, client=memory_cluster.client(own_store=True), name="kafkagroups-0",
                               node_id="2", campaign_when=lambda: False).start()
        await until(lambda: replayed.offsets("g") == bucket.state.offsets("g"))
        assert {k: v.offset for k, v in replayed.offsets("g").items()} == {("t", 0): 6, ("t", 1): 7}
        for node in (bucket.node, other):
            await loop.run_in_executor(None, node.close)
    asyncio.run(scenario())
