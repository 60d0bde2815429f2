"""A led partition and a group bucket over a scripted log writer: ordering, duplicates, failures, retention."""

from __future__ import annotations

import asyncio
import concurrent.futures

import pytest

from walkit import Position
from walkit.adapters.topics import batches, errors, broker as broker_module
from walkit.adapters.topics.broker import BucketLeader
from walkit.adapters.topics.errors import KafkaError
from walkit.adapters.topics.leader import PartitionLeader
from walkit.adapters.topics.offsets import OffsetsState, commit_record
from walkit.adapters.topics.partition import PartitionState
from walkit.errors import LedgerFenced

from .test_topics_state import make_batch


class ScriptedWriter:
    """ScriptedWriter stands in for a walkit LogWriter: the test decides when appends are acknowledged."""

    def __init__(self) -> None:
        self.ledger_id = 1
        self.log: list[tuple[Position, bytes]] = []
        self.pending: list[tuple[bytes, concurrent.futures.Future]] = []
        self.truncated: list[Position] = []

    def append_async(self, data: bytes) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.pending.append((data, future))
        return future

    def ack(self, count: int | None = None) -> None:
        count = len(self.pending) if count is None else count
        done, self.pending = self.pending[:count], self.pending[count:]
        for data, future in done:
            position = Position(self.ledger_id, sum(1 for p, _ in self.log if p.ledger_id == self.ledger_id))
            self.log.append((position, data))
            future.set_result(position)

    def fail(self) -> None:
        for _, future in self.pending:
            future.set_exception(LedgerFenced("another broker opened the log"))
        self.pending = []

    def roll(self) -> None:
        self.ledger_id += 1

    def truncate(self, before: Position) -> list[int]:
        self.truncated.append(before)
        self.log = [(p, d) for p, d in self.log if p.ledger_id >= before.ledger_id]
        return []


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def leader_over(writer: ScriptedWriter, lost: list, cache_bytes: int = 1 << 20) -> PartitionLeader:
    return PartitionLeader(asyncio.get_running_loop(), None, "t", 0, "kafka-t-0", writer, PartitionState(), [],
                           cache_bytes=cache_bytes, on_lost=lost.append)


def test_batches_get_dense_offsets_and_are_applied_only_once_acknowledged():
    async def scenario():
        writer, lost = ScriptedWriter(), []
        leader = leader_over(writer, lost)
        first, second = leader.append(make_batch(3)), leader.append(make_batch(2))
        await settle()
        assert leader.high_watermark == 0 and not first.done()
        writer.ack()
        await settle()
        assert (await first, await second) == (0, 3) and leader.high_watermark == 5
        data = await leader.read(4, 1 << 20)
        assert batches.info(data).base_offset == 3
        with pytest.raises(KafkaError) as caught:
            await leader.read(6, 100)
        assert caught.value.code == errors.OFFSET_OUT_OF_RANGE
        assert await leader.read(5, 100) == b""
    asyncio.run(scenario())


def test_a_retry_of_an_in_flight_batch_is_answered_with_the_original_and_not_appended():
    async def scenario():
        writer, lost = ScriptedWriter(), []
        leader = leader_over(writer, lost)
        original = leader.append(make_batch(4, pid=9, epoch=0, seq=0))
        retry = leader.append(make_batch(4, pid=9, epoch=0, seq=0))
        assert len(writer.pending) == 1
        nxt = leader.append(make_batch(1, pid=9, epoch=0, seq=4))
        with pytest.raises(KafkaError) as caught:
            leader.append(make_batch(1, pid=9, epoch=0, seq=9))
        assert caught.value.code == errors.OUT_OF_ORDER_SEQUENCE_NUMBER
        writer.ack()
        await settle()
        assert (await original, await retry, await nxt) == (0, 0, 4)
        again = leader.append(make_batch(4, pid=9, epoch=0, seq=0))        # after the ack: still a duplicate
        assert await again == 0 and writer.pending == []
    asyncio.run(scenario())


def test_a_failed_append_ends_the_leadership_and_fails_everything_pending():
    async def scenario():
        writer, lost = ScriptedWriter(), []
        leader = leader_over(writer, lost)
        pending = [leader.append(make_batch(1)) for _ in range(3)]
        writer.ack(1)
        writer.fail()
        await settle()
        assert await pending[0] == 0
        for future in pending[1:]:
            with pytest.raises(KafkaError) as caught:
                await future
            assert caught.value.code == errors.NOT_LEADER_OR_FOLLOWER
        assert not leader.active and len(lost) == 1 and leader.high_watermark == 1
        with pytest.raises(KafkaError):
            leader.append(make_batch(1))
    asyncio.run(scenario())


def test_retention_truncates_whole_old_ledgers_but_never_the_current_one():
    async def scenario():
        writer, lost = ScriptedWriter(), []
        leader = leader_over(writer, lost, cache_bytes=200)
        for ledger in range(3):
            leader.append(make_batch(2, first_ts=1000 + ledger))             # ancient timestamps
            writer.ack()
            await settle()
            writer.roll()
        assert len(leader.cache) < 3                                          # the cache keeps ~200 bytes
        removed = await leader.enforce_retention(retention_ms=1000, retention_bytes=-1)
        assert removed == 3 and writer.truncated == [Position(4, 0)]
        assert leader.state.log_start_offset == 6 and leader.state.next_offset == 6
        leader.append(make_batch(2, first_ts=1000))
        writer.ack()
        await settle()
        assert await leader.enforce_retention(retention_ms=1000, retention_bytes=-1) == 0    # current ledger
    asyncio.run(scenario())


def test_the_offsets_checkpoint_keeps_every_commit_and_the_log_replays_to_the_same_state(monkeypatch):
    monkeypatch.setattr(broker_module, "CHECKPOINT_EVERY", 3)

    async def scenario():
        writer = ScriptedWriter()
        bucket = BucketLeader(asyncio.get_running_loop(), 0, writer, OffsetsState(), on_lost=lambda e: None)
        for i in range(8):
            bucket.commit(commit_record("g", [("t", i % 2, i, -1, None)], i))
            writer.ack()
            await settle()
            if i % 3 == 2:
                writer.roll()
        await settle()
        assert writer.truncated, "a checkpoint truncated the log"
        replayed = OffsetsState()
        for position, data in writer.log:
            replayed.apply(data, position)
        assert replayed.offsets("g") == bucket.state.offsets("g")
        assert {k: v.offset for k, v in replayed.offsets("g").items()} == {("t", 0): 6, ("t", 1): 7}
    asyncio.run(scenario())
