"""Pure tests of the topics broker's pieces: batches, partition state, producers, offsets, groups."""

from __future__ import annotations

import asyncio
import io

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from walkit import Position
from walkit.adapters.topics import batches, errors
from walkit.adapters.topics.coordinator import COMPLETING, EMPTY, STABLE, GroupCoordinator
from walkit.adapters.topics.errors import KafkaError
from walkit.adapters.topics.offsets import OffsetsState, commit_record
from walkit.adapters.topics.partition import PartitionState
from walkit.adapters.topics.producers import APPEND, DUPLICATE, ProducerTable
from walkit.adapters.topics.wire import BadRequest, parse_request


def make_batch(count: int, first_ts: int = 1000, *, pid: int = -1, epoch: int = -1, seq: int = -1) -> bytes:
    """make_batch builds a magic-2 batch of `count` records the way producers do (kafka-python's builder)."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=pid,
                                        producer_epoch=epoch, base_sequence=seq, batch_size=1 << 20)
    for i in range(count):
        builder.append(i, timestamp=first_ts + i, key=b"k%d" % i, value=b"v%d" % i, headers=[])
    return bytes(builder.build())


def test_split_accepts_batches_and_refuses_corrupt_ones():
    one, two = make_batch(3), make_batch(2)
    assert batches.split(one + two, 1 << 20) == [one, two]
    corrupt = bytearray(one)
    corrupt[-1] ^= 0xFF
    with pytest.raises(KafkaError) as caught:
        batches.split(bytes(corrupt), 1 << 20)
    assert caught.value.code == errors.CORRUPT_MESSAGE
    with pytest.raises(KafkaError) as caught:
        batches.split(one[:40], 1 << 20)
    assert caught.value.code == errors.CORRUPT_MESSAGE
    with pytest.raises(KafkaError) as caught:
        batches.split(one, 50)
    assert caught.value.code == errors.MESSAGE_TOO_LARGE
    old = bytearray(one)
    old[16] = 1
    with pytest.raises(KafkaError) as caught:
        batches.split(bytes(old), 1 << 20)
    assert caught.value.code == errors.UNSUPPORTED_FOR_MESSAGE_FORMAT


def test_renumbering_keeps_the_crc_valid_and_timestamps_are_found():
    stored = batches.with_base_offset(make_batch(5, first_ts=2000), 40)
    assert batches.split(stored, 1 << 20) == [stored]
    head = batches.info(stored)
    assert (head.base_offset, head.last_offset, head.next_offset, head.max_timestamp) == (40, 44, 45, 2004)
    assert batches.first_offset_at(stored, 2002) == (42, 2002)
    assert batches.first_offset_at(stored, 9999) is None


def test_partition_state_indexes_offsets_times_and_ledgers_and_survives_a_snapshot():
    state = PartitionState()
    offset = 0
    for i in range(6):
        stored = batches.with_base_offset(make_batch(4, first_ts=1000 * i, pid=7, epoch=0, seq=4 * i), offset)
        state.apply(stored, Position(10 + i // 2, i % 2))
        offset += 4
    assert state.next_offset == 24 and state.log_start_offset == 0
    assert state.locate(0) == 0 and state.locate(9) == 2 and state.locate(23) == 5
    assert state.locate(24) is None and state.locate(-1) is None
    assert state.locate_time(2500) == 3 and state.locate_time(10**9) is None
    assert [row[0] for row in state.ledgers()] == [10, 11, 12]
    assert state.apply(b"ignored", Position(10, 0)) is None        # already applied: skipped
    out = io.BytesIO()
    state.snapshot(out)
    copy = PartitionState()
    copy.restore(io.BytesIO(out.getvalue()))
    assert copy.bases == state.bases and copy.positions == state.positions
    assert copy.producers.entries[7].last_sequence == 23
    assert state.truncate_before(Position(11, 0)) == 2
    assert state.log_start_offset == 8 and state.locate(3) is None and state.locate(8) == 0


def test_producer_table_finds_duplicates_gaps_and_old_epochs():
    table = ProducerTable()
    first = batches.info(batches.with_base_offset(make_batch(3, pid=5, epoch=0, seq=0), 0))
    assert table.check(first) == (APPEND, None)
    table.record(first)
    assert table.check(first) == (DUPLICATE, 0)
    second = batches.info(batches.with_base_offset(make_batch(2, pid=5, epoch=0, seq=3), 3))
    assert table.check(second) == (APPEND, None)
    table.record(second)
    gap = batches.info(make_batch(1, pid=5, epoch=0, seq=9))
    with pytest.raises(KafkaError) as caught:
        table.check(gap)
    assert caught.value.code == errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    table.record(batches.info(make_batch(1, pid=5, epoch=1, seq=0)))
    with pytest.raises(KafkaError) as caught:
        table.check(first)
    assert caught.value.code == errors.INVALID_PRODUCER_EPOCH
    assert ProducerTable.from_json(table.to_json()).entries[5].epoch == 1


def test_offsets_state_applies_commits_and_checkpoints():
    state = OffsetsState()
    state.apply(commit_record("g", [("t", 0, 5, -1, None), ("t", 1, 7, -1, "m")], 1), Position(1, 0))
    state.apply(commit_record("g", [("t", 0, 9, -1, None)], 2), Position(1, 1))
    assert state.offsets("g")[("t", 0)].offset == 9 and state.offsets("g")[("t", 1)].metadata == "m"
    checkpoint = state.checkpoint_record()
    other = OffsetsState()
    other.apply(commit_record("h", [("x", 0, 1, -1, None)], 3), Position(2, 0))
    other.apply(checkpoint, Position(2, 1))
    assert other.offsets("g") == state.offsets("g") and other.offsets("h") == {}
    out = io.BytesIO()
    state.snapshot(out)
    restored = OffsetsState()
    restored.restore(io.BytesIO(out.getvalue()))
    assert restored.offsets("g") == state.offsets("g")


def test_group_of_two_rebalances_syncs_and_expires_a_silent_member():
    async def scenario():
        coordinator = GroupCoordinator(asyncio.get_running_loop(), initial_delay_ms=50)
        protocols = [("range", b"sub")]
        first = coordinator.join("g", "", None, "c1", "h", 6000, 1000, "consumer", protocols)
        second = coordinator.join("g", "", None, "c2", "h", 1000, 1000, "consumer", protocols)
        one, two = await first, await second
        assert one.error == two.error == errors.NONE and one.generation == two.generation == 1
        assert one.leader == one.member_id and len(one.members) == 2 and two.members == []
        group = coordinator.groups["g"]
        assert group.state == COMPLETING
        follower = coordinator.sync("g", 1, two.member_id, [])
        leader = coordinator.sync("g", 1, one.member_id, [(one.member_id, b"A"), (two.member_id, b"B")])
        assert await leader == (errors.NONE, b"A") and await follower == (errors.NONE, b"B")
        assert group.state == STABLE
        assert coordinator.heartbeat("g", 1, one.member_id) == errors.NONE
        assert coordinator.heartbeat("g", 0, one.member_id) == errors.ILLEGAL_GENERATION
        assert coordinator.heartbeat("g", 1, "nobody") == errors.UNKNOWN_MEMBER_ID
        group.members[two.member_id].last_seen -= 5              # silent past its 1 s session
        coordinator.expire()
        assert two.member_id not in group.members
        assert coordinator.heartbeat("g", 1, one.member_id) == errors.REBALANCE_IN_PROGRESS
        again = await coordinator.join("g", one.member_id, None, "c1", "h", 6000, 1000, "consumer", protocols)
        assert again.generation == 2 and [m[0] for m in again.members] == [one.member_id]
        assert coordinator.leave("g", [(one.member_id, None)]) == [errors.NONE]
        assert group.state == EMPTY
    asyncio.run(scenario())


def test_parse_request_refuses_unknown_apis_versions_and_garbage():
    with pytest.raises(BadRequest):
        parse_request(b"\x00")
    with pytest.raises(BadRequest):
        parse_request(b"\x03\xe7\x00\x00\x00\x00\x00\x01\x00\x00")       # api key 999
    with pytest.raises(BadRequest):
        parse_request(b"\x00\x03\x00\x63\x00\x00\x00\x01\x00\x00")       # Metadata v99
    with pytest.raises(BadRequest):
        parse_request(b"\x00\x03\x00\x01\x00\x00\x00\x01\x00\x00\xff\xff\xff")   # a truncated body


@pytest.mark.parametrize("command", ["serve", "create", "list", "describe", "delete", "produce", "consume", "groups"])
def test_every_topics_command_has_help(command):
    from click.testing import CliRunner
    from walkit.cli import main
    result = CliRunner().invoke(main, ["topics", command, "--help"])
    assert result.exit_code == 0 and "Usage:" in result.output
    assert "--bootstrap" in result.output or command == "serve"
