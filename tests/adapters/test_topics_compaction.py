"""Compaction of a partition (compaction.py) over a scripted node whose log the leader reads back:
the latest record per key at its offset, gaps that Fetch steps over, tombstones kept for
delete.retention.ms, transactional batches untouched, codecs re-encoded, swaps that no longer match
the index ignored, snapshots of a compacted partition; and over real walkit.replicate nodes on
in-process bookies: every broker applies the same swaps, a late one restores them from a snapshot,
the replaced ledgers leave the log, and a follower that takes over reads the compacted log."""

from __future__ import annotations

import asyncio
import io
import threading
from contextlib import contextmanager
from types import SimpleNamespace

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from walkit import Position
from walkit.adapters.topics import batches, compaction
from walkit.adapters.topics.leader import PartitionLeader
from walkit.adapters.topics.partition import PartitionMachine, PartitionState
from walkit.errors import LogTruncated, NotLeader
from walkit.replication import batch as entries

from .test_topics_leader import ScriptedNode, partition_on, settle, until


def keyed_batch(pairs, first_ts: int = 1000, *, codec: int = 0, pid: int = -1, transactional: bool = False) -> bytes:
    """keyed_batch is a batch of (key, value) records (a None value is a tombstone), stamped first_ts on."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=transactional,
                                        producer_id=pid, producer_epoch=0 if pid >= 0 else -1,
                                        base_sequence=0 if pid >= 0 else -1, batch_size=1 << 20)
    for i, (key, value) in enumerate(pairs):
        builder.append(i, timestamp=first_ts + i, key=key, value=value, headers=[("h", b"x")])
    return bytes(builder.build())


def contents(data: bytes) -> list[tuple[int, bytes | None, bytes | None]]:
    """contents lists (offset, key, value) of every record of stored batches."""
    return [(r.offset, r.key, r.value) for batch in compaction.split_stored(data) for r in batches.records(batch)]


async def consume(leader, offset: int = 0) -> list[tuple[int, bytes | None, bytes | None]]:
    """consume fetches the partition from `offset` to its high watermark as a consumer does: from the
    offset after the last batch each fetch returned (a fetch may stop early where compaction moved batches)."""
    out = []
    while offset < leader.high_watermark:
        data = await leader.read(offset, 1 << 20)
        out += contents(data)
        offset = batches.last_offset(data) + 1
    return out


async def compacted_leader(cache_bytes: int = 1 << 20):
    """compacted_leader is a partition led over a ScriptedNode whose log its client reads back."""
    loop = asyncio.get_running_loop()

    @contextmanager
    def read_log(name, start=None, follow=False, password=b""):
        if node.truncated and start < node.truncated[-1]:
            raise LogTruncated(f"the log begins at {node.truncated[-1]}, not {start}")
        yield [SimpleNamespace(position=p, payload=payload) for p, payload in list(node.log) if p >= start]
    client = SimpleNamespace(read_log=read_log, max_entry_bytes=1 << 20)
    leader = PartitionLeader(loop, client, "t", 0, "replicated-kafka-t-0", PartitionMachine("kafka-t-0", cache_bytes))
    node = leader.node = ScriptedNode(leader.machine, leader.on_role)
    node.on_role("leader")
    await settle()
    node.ack()                                        # the epoch record
    await settle()
    node.auto_ack = True
    return leader, node


async def produce(leader, node, *batches_: bytes) -> None:
    for batch in batches_:
        await leader.append(batch)
    node.roll()                                       # the ledger closes: compaction may rewrite it


def test_compaction_keeps_the_latest_record_per_key_at_its_offset_and_fetch_steps_over_the_gaps():
    async def scenario():
        leader, node = await compacted_leader(cache_bytes=1)      # reads go to the log
        await produce(leader, node, keyed_batch([(b"a", b"a1"), (b"b", b"b1")]),
                      keyed_batch([(b"a", b"a2"), (b"c", b"c1")]), keyed_batch([(b"b", b"b2")]))
        await leader.append(keyed_batch([(b"d", b"d1")]))            # in the current ledger: untouched
        assert await leader.compactor.run(delete_retention_ms=10_000, now_ms=2000) == 1
        data = await leader.read(0, 1 << 20)
        assert contents(data) == [(2, b"a", b"a2"), (3, b"c", b"c1"), (4, b"b", b"b2"), (5, b"d", b"d1")]
        assert batches.info(await leader.read(0, 1)).base_offset == 2      # a removed offset: the next batch
        assert batches.info(await leader.read(1, 1)).base_offset == 2
        assert leader.state.log_start_offset == 0 and leader.high_watermark == 6
        assert node.truncated[-1].ledger_id == 2 and {p.ledger_id for p, _ in node.log} == {2}   # ledger 1 released
        assert await leader.compactor.run(delete_retention_ms=10_000, now_ms=2000) == 0     # nothing new
    asyncio.run(scenario())


def test_reads_from_the_cache_and_the_log_agree_after_a_compaction():
    async def scenario():
        leader, node = await compacted_leader()
        await produce(leader, node, keyed_batch([(b"a", b"a1")]), keyed_batch([(b"a", b"a2")]))
        await leader.append(keyed_batch([(b"b", b"b1")]))
        await leader.compactor.run(delete_retention_ms=10_000, now_ms=2000)
        cached = await consume(leader)
        leader.machine.cache.clear()
        leader.machine._cached = 0
        assert await consume(leader) == cached == [(1, b"a", b"a2"), (2, b"b", b"b1")]
    asyncio.run(scenario())


def test_a_fetch_planned_before_a_compaction_truncated_its_ledgers_reads_the_moved_batches():
    async def scenario():
        loop = asyncio.get_running_loop()
        leader, node = await compacted_leader(cache_bytes=1)      # reads go to the log
        await produce(leader, node, keyed_batch([(b"a", b"a1")]), keyed_batch([(b"a", b"a2")]))
        await leader.append(keyed_batch([(b"b", b"b1")]))
        planned, compacted, original = threading.Event(), threading.Event(), leader._read_log

        def stalled(keys, first, max_bytes):                     # the first read waits out the compaction
            if not planned.is_set():
                planned.set()
                compacted.wait(10)
            return original(keys, first, max_bytes)
        leader._read_log = stalled
        reading = asyncio.ensure_future(leader.read(0, 1 << 20))
        assert await loop.run_in_executor(None, planned.wait, 10)
        assert await leader.compactor.run(delete_retention_ms=1000, now_ms=2000) == 1
        assert node.truncated[-1].ledger_id == 2                # ledger 1, which the read planned for, is gone
        compacted.set()
        assert contents(await reading)[0] == (1, b"a", b"a2")
    asyncio.run(scenario())


def test_a_leader_that_fails_between_the_swaps_of_a_run_leaves_a_valid_log_that_the_next_run_finishes():
    async def scenario():
        leader, node = await compacted_leader()
        leader.client.max_entry_bytes = compaction.SWAP_OVERHEAD + 9 + 160       # two kept batches a swap
        keys = b"a b c d a b".split()
        await produce(leader, node, *(keyed_batch([(key, key + b"%d" % i)]) for i, key in enumerate(keys)))
        await leader.append(keyed_batch([(b"z", b"z")]))
        submit, swaps = node.submit_async, []

        def failing(record):
            if compaction.is_swap(record):
                swaps.append(record)
                if len(swaps) == 2:
                    raise NotLeader("the leadership ended", None)
            return submit(record)
        node.submit_async = failing
        assert await leader.compactor.run(delete_retention_ms=1000, now_ms=2000) == 0       # failed, logged
        partly = [(2, b"c", b"c2"), (3, b"d", b"d3"), (4, b"a", b"a4"), (5, b"b", b"b5"), (6, b"z", b"z")]
        assert await consume(leader) == partly and len(swaps) == 2
        node.submit_async = submit
        node.roll()                                      # the first swap's ledger closes
        assert await leader.compactor.run(delete_retention_ms=1000, now_ms=2000) == 2
        assert await consume(leader) == partly and min(p.ledger_id for p, _ in node.log) == 2     # ledger 1 goes
    asyncio.run(scenario())


def test_delete_records_forgets_the_batches_before_it_and_compaction_goes_on_from_the_new_log_start():
    async def scenario():
        leader, node = await compacted_leader()
        await produce(leader, node, keyed_batch([(b"a", b"a0")]), keyed_batch([(b"b", b"b1")]),
                      keyed_batch([(b"a", b"a2")]), keyed_batch([(b"c", b"c3"), (b"d", b"d4")]))
        await leader.append(keyed_batch([(b"z", b"z5")]))
        assert await leader.compactor.run(delete_retention_ms=1000, now_ms=2000) == 1
        assert leader.state.bases == [1, 2, 3, 5]                # the swap's batches, then z5 stored before it
        assert await leader.delete_records(4) == 4               # inside the batch of c3 and d4
        assert leader.state.bases == [3, 5]                      # those wholly before offset 4 are forgotten
        await produce(leader, node, keyed_batch([(b"d", b"d6")]))
        await leader.append(keyed_batch([(b"z", b"z7")]))
        assert await leader.compactor.run(delete_retention_ms=1000, now_ms=2000) == 1
        assert await consume(leader, 4) == [(5, b"z", b"z5"), (6, b"d", b"d6"), (7, b"z", b"z7")]
    asyncio.run(scenario())


def test_tombstones_stay_for_delete_retention_ms_after_their_timestamp_and_then_go():
    async def scenario():
        leader, node = await compacted_leader()
        await produce(leader, node, keyed_batch([(b"a", b"a1"), (b"b", b"b1")], first_ts=1000),
                      keyed_batch([(b"a", None)], first_ts=5000))
        await leader.append(keyed_batch([(b"z", b"z1")], first_ts=6000))
        await leader.compactor.run(delete_retention_ms=1000, now_ms=5500)
        assert await consume(leader) == [(1, b"b", b"b1"), (2, b"a", None), (3, b"z", b"z1")]
        assert await leader.compactor.run(delete_retention_ms=1000, now_ms=5900) == 0     # not yet due
        node.roll()                                       # the first run's swap is closed: nothing new in it
        assert await leader.compactor.run(delete_retention_ms=500, now_ms=5600) == 1      # the retention shortened
        assert await consume(leader) == [(1, b"b", b"b1"), (3, b"z", b"z1")]
    asyncio.run(scenario())


def test_transactional_batches_stay_whole_and_do_not_hide_older_values():
    async def scenario():
        leader, node = await compacted_leader()
        await produce(leader, node, keyed_batch([(b"a", b"a1")]),
                      keyed_batch([(b"a", b"t1")], pid=7, transactional=True), keyed_batch([(b"b", b"b1")]),
                      keyed_batch([(b"b", b"b2")]))
        await leader.append(keyed_batch([(b"z", b"z1")]))
        await leader.compactor.run(delete_retention_ms=1000, now_ms=2000)
        assert await consume(leader) == [(0, b"a", b"a1"), (1, b"a", b"t1"), (3, b"b", b"b2"),
                                                           (4, b"z", b"z1")]
    asyncio.run(scenario())


@pytest.mark.parametrize("codec", [1, 2, 3, 4], ids=["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_are_decoded_and_rewritten_with_their_codec(codec):
    async def scenario():
        leader, node = await compacted_leader()
        big = [(b"a", b"1" * 300), (b"b", b"2" * 300), (b"a", b"3" * 300)]              # worth compressing
        await produce(leader, node, keyed_batch(big, codec=codec))
        assert batches.info(leader.machine.cache[0]).attributes & batches.COMPRESSION == codec
        await leader.append(keyed_batch([(b"z", b"z1")]))
        await leader.compactor.run(delete_retention_ms=1000, now_ms=2000)
        data = await leader.read(0, 1 << 20)
        first = compaction.split_stored(data)[0]
        assert batches.info(first).attributes & batches.COMPRESSION == codec
        assert batches.info(first).last_offset_delta == 2                    # the offsets keep their gap
        assert contents(data) == [(1, b"b", b"2" * 300), (2, b"a", b"3" * 300), (3, b"z", b"z1")]
    asyncio.run(scenario())


def test_a_swap_that_no_longer_matches_the_index_is_ignored_and_snapshots_keep_a_compacted_index():
    async def scenario():
        leader, node = await compacted_leader()
        await produce(leader, node, keyed_batch([(b"a", b"a1")]), keyed_batch([(b"a", b"a2")]))
        await leader.append(keyed_batch([(b"b", b"b1")]))
        state = leader.state
        stale = compaction.swap_record(0, 2, compaction.digest(zip(state.positions[:2], state.subs[:2])), [])
        await leader.compactor.run(delete_retention_ms=1000, now_ms=2000)
        before = (list(state.bases), list(state.positions), list(state.subs))
        await asyncio.wrap_future(node.submit_async(stale))                 # planned before the first swap
        assert (state.bases, state.positions, state.subs) == before == ([1, 2], before[1], before[2])
        out = io.BytesIO()
        state.snapshot(out)
        restored = PartitionState()
        restored.restore(io.BytesIO(out.getvalue()))
        assert (restored.bases, restored.positions, restored.subs, restored.keep_from()) == (
            state.bases, state.positions, state.subs, state.keep_from())
    asyncio.run(scenario())


def test_retention_after_a_compaction_never_forgets_a_batch_still_read_before_the_position():
    state = PartitionState()
    for entry, pairs in enumerate([[(b"a", b"1")], [(b"a", b"2")], [(b"b", b"3")]]):
        batch = batches.with_base_offset(keyed_batch(pairs), entry)
        state.apply(batch, Position(1, entry))
    kept = batches.with_base_offset(keyed_batch([(b"a", b"2")]), 1)
    swap = compaction.swap_record(0, 2, compaction.digest(zip(state.positions[:2], state.subs[:2])), [kept])
    state.apply(entries.decode(entries.encode([swap]))[0], Position(2, 0))
    assert state.bases == [1, 2] and state.positions == [Position(2, 0), Position(1, 2)]
    assert state.keep_from() == Position(1, 2)
    assert state.truncate_before(Position(2, 0)) == 0                   # the swap's batch is stored later
    assert state.locate(0) == 0 and state.locate(1) == 0 and state.locate(2) == 1


def test_every_broker_holds_the_same_compacted_index_and_a_follower_takes_over_reading_it(memory_cluster):
    async def scenario():
        loop = asyncio.get_running_loop()
        first = partition_on(memory_cluster, loop, 1, roll_entries=3)
        await until(lambda: first.active)
        second = partition_on(memory_cluster, loop, 2, roll_entries=3)
        produced = [(key, b"%s%d" % (key, round_)) for round_ in range(4) for key in (b"a", b"b", b"c")]
        for pair in produced + [(b"z", b"last")]:
            await first.append(keyed_batch([pair]))
        client = memory_cluster.client()
        ledgers = client.log_metadata(first.log_name).ledger_ids
        assert await first.compactor.run(delete_retention_ms=1000) >= 1
        upto = first.compactor.checked_upto              # the closed ledgers' batches were rewritten
        latest = {key: offset for offset, (key, _) in enumerate(produced[:upto])}
        expected = [(offset, key, value) for offset, (key, value) in enumerate(produced + [(b"z", b"last")])
                    if offset >= upto or latest[key] == offset]
        assert 3 <= upto < 13 and len(expected) < 13
        assert await consume(first) == expected
        assert ledgers[0] not in client.log_metadata(first.log_name).ledger_ids      # replaced, then truncated
        await until(lambda: second.state.applied == first.state.applied)
        index = (first.state.bases, first.state.positions, first.state.subs)
        assert (second.state.bases, second.state.positions, second.state.subs) == index
        late = partition_on(memory_cluster, loop, 3)                       # starts from the snapshot
        await until(lambda: late.state.applied == first.state.applied)
        assert (late.state.bases, late.state.positions, late.state.subs) == index
        await loop.run_in_executor(None, first.node.step_down)
        await until(lambda: second.active or late.active)
        successor = second if second.active else late
        assert await consume(successor) == expected
        for leader in (first, second, late):
            await loop.run_in_executor(None, leader.node.close)
    asyncio.run(scenario())
