"""Pure tests of the topics broker's admin state: leader epochs, DeleteRecords, forgetting offsets, configs, ACLs."""

from __future__ import annotations

import io
import json

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from walkit import Position
from walkit.adapters.topics import batches, errors
from walkit.adapters.topics.acls import ALLOW, ANY, DENY, LITERAL, MATCH, PREFIXED, AclBinding, AclFilter, AclStore
from walkit.adapters.topics.catalog import MAX_MESSAGE_BYTES, Catalog
from walkit.adapters.topics.epochs import LeaderEpochs
from walkit.adapters.topics.errors import KafkaError
from walkit.adapters.topics.handlers.configs import APPEND, DELETE, SET, SUBTRACT, incremental
from walkit.adapters.topics.offsets import Membership, OffsetsState, commit_record, forget_record, membership_record
from walkit.adapters.topics.partition import PartitionState, delete_record, epoch_record
from walkit.plugins import open_metadata

TOPIC, GROUP, READ, WRITE = 2, 3, 3, 4


def make_batch(count: int, first_ts: int = 1000) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i in range(count):
        builder.append(i, timestamp=first_ts + i, key=None, value=b"v%d" % i, headers=[])
    return bytes(builder.build())


def test_leader_epochs_answer_end_offsets_as_kafkas_leader_epoch_cache():
    epochs = LeaderEpochs()
    for epoch, start in ((3, 0), (5, 40), (5, 60), (4, 70), (9, 100)):
        epochs.begin(epoch, start)                       # a repeated or older epoch adds nothing
    assert epochs.entries == [(3, 0), (5, 40), (9, 100)]
    assert epochs.end_offset_for(9, log_end=130) == (9, 130)          # the latest: the log end
    assert epochs.end_offset_for(5, log_end=130) == (5, 100)          # the next epoch's start
    assert epochs.end_offset_for(7, log_end=130) == (5, 100)          # unknown: the largest epoch below
    assert epochs.end_offset_for(2, log_end=130) == (2, 0)            # before every epoch
    assert epochs.end_offset_for(12, log_end=130) == (-1, -1)         # after every epoch
    assert epochs.end_offset_for(-1, log_end=130) == (-1, -1)
    assert epochs.end_offset_for(9, 130, current=(11, 130)) == (9, 130)   # a leadership whose record is pending
    assert epochs.end_offset_for(11, 135, current=(11, 130)) == (11, 135)
    assert [epochs.epoch_at(o) for o in (0, 39, 40, 99, 100, 500)] == [3, 3, 5, 5, 9, 9]
    epochs.trim(50)
    assert epochs.entries == [(5, 50), (9, 100)]


def test_a_partition_keeps_leader_epochs_and_delete_records_moves_its_log_start_through_a_snapshot():
    state = PartitionState()
    state.apply(epoch_record(7), Position(1, 0))
    offset = 0
    for i in range(4):                                           # batches of 5 at 0, 5, 10, 15
        state.apply(batches.with_base_offset(make_batch(5), offset, 7), Position(1, 1 + i))
        offset += 5
    state.apply(epoch_record(8), Position(2, 0))
    state.apply(batches.with_base_offset(make_batch(5), offset, 8), Position(2, 1))
    assert state.epochs.entries == [(7, 0), (8, 20)] and state.epochs.latest == 8
    assert state.epochs.end_offset_for(7, state.next_offset) == (7, 20)
    state.apply(delete_record(7), Position(2, 2))                 # inside the second batch
    assert state.log_start_offset == 7 and len(state) == 4 and state.locate(6) is None and state.locate(7) == 0
    assert state.keep_from() == Position(1, 2)
    state.apply(delete_record(3), Position(2, 3))                 # never back
    assert state.log_start_offset == 7
    out = io.BytesIO()
    state.snapshot(out)
    restored = PartitionState()
    restored.restore(io.BytesIO(out.getvalue()))
    assert restored.epochs.entries == [(7, 7), (8, 20)] and restored.log_start_offset == 7
    restored.apply(delete_record(25), Position(2, 4))             # everything: the log starts at the end
    assert restored.log_start_offset == 25 and len(restored) == 0 and restored.keep_from() == Position(2, 4)
    restored.apply(batches.with_base_offset(make_batch(2), 25, 8), Position(2, 5))
    assert restored.log_start_offset == 25 and restored.locate(26) == 0
    stamped = batches.with_base_offset(make_batch(3), 40, 12)
    assert batches.split(stamped, 1 << 20) == [stamped]          # the CRC does not cover the epoch
    assert batches.HEADER.unpack_from(stamped)[2] == 12


def test_a_partition_snapshot_from_before_leader_epochs_restores_without_any():
    state = PartitionState()
    state.apply(batches.with_base_offset(make_batch(2), 0), Position(1, 0))
    out = io.BytesIO()
    state.snapshot(out)
    doc = json.loads(out.getvalue())
    del doc["epochs"]
    old = PartitionState()
    old.restore(io.BytesIO(json.dumps(doc).encode()))
    assert old.epochs.entries == [] and old.epochs.latest == -1 and old.next_offset == 2


def _offsets(*records: bytes) -> OffsetsState:
    state = OffsetsState()
    for i, record in enumerate(records):
        state.apply(record, Position(1, i))
    return state


def test_forget_records_delete_groups_offsets_and_expire_only_groups_empty_for_the_retention():
    member = Membership(3, "consumer", "range", "m1", ())
    state = _offsets(
        commit_record("old", [("t", 0, 5, -1, None), ("t", 1, 6, -1, None)], 1_000),
        commit_record("standalone", [("t", 0, 9, -1, None)], 1_000),
        membership_record("busy", member), commit_record("busy", [("t", 0, 1, -1, None)], 1_000),
        commit_record("recent", [("t", 0, 2, -1, None)], 1_000), membership_record("recent", None, 50_000),
        forget_record("old", [("t", 1)]))
    assert set(state.offsets("old")) == {("t", 0)}                        # OffsetDelete
    assert state.expired(60_000, 20_000, active=lambda g: False) == ["old", "standalone"]
    assert state.expired(60_000, 20_000, active=lambda g: g == "old") == ["standalone"]
    state.apply(forget_record("old", None, 40_000), Position(2, 0))
    state.apply(forget_record("busy", None, 40_000), Position(2, 1))    # members: kept
    state.apply(forget_record("recent", None, 40_000), Position(2, 2))  # empty only since 50 s: kept
    assert state.offsets("old") == {} and state.offsets("busy") and state.offsets("recent")
    state.apply(forget_record("busy", None), Position(2, 3))            # DeleteGroups: offsets and membership
    assert state.offsets("busy") == {} and "busy" not in state.stored_memberships()
    copy = OffsetsState()
    copy.restore(io.BytesIO(state.checkpoint_record()))
    assert copy.emptied == {"recent": 50_000} and sorted(copy.group_ids()) == ["recent", "standalone"]
    old = json.loads(state.checkpoint_record())
    del old["emptied"]
    older = OffsetsState()
    older.restore(io.BytesIO(json.dumps(old).encode()))                 # a checkpoint from before expiry
    assert older.emptied == {} and sorted(older.expired(60_000, 20_000, lambda g: False)) == ["recent", "standalone"]


def test_incremental_config_changes_set_delete_append_and_subtract():
    defaults = {"cleanup.policy": "delete", "retention.ms": "604800000"}
    assert incremental({"retention.ms": "5"}, defaults, [("retention.ms", DELETE, None),
                                                         ("max.message.bytes", SET, "1000")]) == {
        "max.message.bytes": "1000"}
    assert incremental({}, defaults, [("cleanup.policy", APPEND, "compact")]) == {"cleanup.policy": "delete,compact"}
    assert incremental({"cleanup.policy": "delete,compact"}, defaults, [("cleanup.policy", SUBTRACT, "compact")]) == {
        "cleanup.policy": "delete"}
    with pytest.raises(KafkaError) as caught:
        incremental({}, defaults, [("retention.ms", APPEND, "5")])
    assert caught.value.code == errors.INVALID_CONFIG


def test_topic_records_change_by_compare_and_set_and_configs_are_checked(tmp_path):
    catalog = Catalog(open_metadata(f"sqlite://{tmp_path / 'metadata.db'}"))
    catalog.create_topic("changing", 2, {"retention.ms": "1000"})
    seen = []

    def grow(topic):
        seen.append(topic.partitions)
        if len(seen) == 1:                                   # another broker changes it meanwhile
            catalog.update_topic("changing", lambda t: type(t)(t.name, t.partitions, {"retention.ms": "7"}, t.id,
                                                                t.created_ms))
        return type(topic)(topic.name, 3, topic.configs, topic.id, topic.created_ms)
    changed = catalog.update_topic("changing", grow)
    assert seen == [2, 2] and changed.partitions == 3 and catalog.topic("changing").configs == {"retention.ms": "7"}
    with pytest.raises(KafkaError) as caught:
        catalog.update_topic("missing", grow)
    assert caught.value.code == errors.UNKNOWN_TOPIC_OR_PARTITION
    with pytest.raises(KafkaError) as caught:
        catalog.create_topic("huge", 1, {"max.message.bytes": str(MAX_MESSAGE_BYTES + 1)})
    assert caught.value.code == errors.INVALID_CONFIG


def test_acl_filters_match_as_kafkas_and_the_store_keeps_bindings_once(tmp_path):
    store = AclStore(open_metadata(f"sqlite://{tmp_path / 'metadata.db'}"))
    literal = AclBinding(TOPIC, "orders", LITERAL, "User:alice", "*", READ, ALLOW)
    prefixed = AclBinding(TOPIC, "ord", PREFIXED, "User:bob", "*", WRITE, DENY)
    wildcard = AclBinding(TOPIC, "*", LITERAL, "User:carol", "*", READ, ALLOW)
    group = AclBinding(GROUP, "orders", LITERAL, "User:alice", "*", READ, ALLOW)
    store.create([literal, prefixed, wildcard, group, literal])
    assert store.bindings() == [literal, prefixed, wildcard, group]
    everything = AclFilter(ANY, None, ANY, None, None, ANY, ANY)
    assert store.describe(everything) == [literal, prefixed, wildcard, group]
    assert store.describe(AclFilter(TOPIC, "orders", MATCH, None, None, ANY, ANY)) == [literal, prefixed, wildcard]
    assert store.describe(AclFilter(TOPIC, "orders", LITERAL, None, None, ANY, ANY)) == [literal]
    assert store.describe(AclFilter(ANY, None, ANY, "User:alice", None, READ, ALLOW)) == [literal, group]
    assert store.delete([AclFilter(TOPIC, None, PREFIXED, None, None, ANY, ANY),
                         AclFilter(ANY, "orders", ANY, None, None, ANY, ANY)]) == [[prefixed], [literal, group]]
    assert store.bindings() == [wildcard]
    for bad in (AclBinding(ANY, "x", LITERAL, "User:a", "*", READ, ALLOW),
                AclBinding(TOPIC, "x", MATCH, "User:a", "*", READ, ALLOW),
                AclBinding(TOPIC, "x", LITERAL, "alice", "*", READ, ALLOW),
                AclBinding(TOPIC, "x", LITERAL, "User:a", "*", ANY, ALLOW)):
        with pytest.raises(KafkaError) as caught:
            bad.check()
        assert caught.value.code == errors.INVALID_REQUEST
