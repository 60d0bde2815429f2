"""walkit.adapters.topics.handlers.transactions answers InitProducerId and the transactional requests.

InitProducerId without a transactional id gives an idempotent producer a new cluster-wide
producer id (a metadata counter), epoch 0, as Kafka does. With one, the id's coordinator
(txncoordinator.py) keeps the id's producer id and bumps its epoch. AddPartitionsToTxn,
AddOffsetsToTxn and EndTxn go to the transactional id's coordinator; TxnOffsetCommit to the
group's, which keeps the offsets in the group's bucket until the transaction's marker makes
them committed (or drops them); a producer its transactional id's state shows fenced is
refused, and the offsets carry its epoch, so a fenced producer's are never committed. From v3
(KIP-447) the sender's group membership is checked as Kafka does: a member id the group does not
hold is UNKNOWN_MEMBER_ID, another generation ILLEGAL_GENERATION, so a worker that lost its
partitions in a rebalance cannot commit their offsets. PRODUCER_FENCED is answered INVALID_PRODUCER_EPOCH to the
versions from before it (KIP-588: InitProducerId before v4, the others before v2), as Kafka
does.
"""

from __future__ import annotations

import time

from kafka.protocol.producer import (
    AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, AddPartitionsToTxnRequest, AddPartitionsToTxnResponse,
    EndTxnRequest, EndTxnResponse, InitProducerIdRequest, InitProducerIdResponse, TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
)

from walkit.adapters.topics import errors
from walkit.adapters.topics.errors import KafkaError
from walkit.adapters.topics.transactions import txn_offsets_record

_ATOPIC = AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult
_APART = _ATOPIC.AddPartitionsToTxnPartitionResult
_CTOPIC = TxnOffsetCommitResponse.TxnOffsetCommitResponseTopic
_CPART = _CTOPIC.TxnOffsetCommitResponsePartition


def _code(exc: KafkaError, version: int, fenced_from: int) -> int:
    """_code is the error code of `exc` for a request of `version` (PRODUCER_FENCED from `fenced_from` on)."""
    if exc.code == errors.PRODUCER_FENCED and version < fenced_from:
        return errors.INVALID_PRODUCER_EPOCH
    return errors.NOT_COORDINATOR if exc.code == errors.NOT_LEADER_OR_FOLLOWER else exc.code


async def init_producer_id(broker, connection, request):
    """init_producer_id gives an idempotent producer a new producer id, a transactional one its id's (epoch bumped)."""
    body = request.body
    code, pid, epoch = errors.NONE, -1, -1
    try:
        if body.transactional_id is None:
            pid, epoch = await broker.loop.run_in_executor(None, broker.catalog.new_producer_id), 0
        else:
            given = (body.producer_id, body.producer_epoch) if request.version >= 3 else (-1, -1)
            pid, epoch = await broker.transactions.init_producer_id(body.transactional_id,
                                                                    body.transaction_timeout_ms, *given)
    except KafkaError as exc:
        code, pid, epoch = _code(exc, request.version, 4), -1, -1
    return request.response(InitProducerIdResponse, throttle_time_ms=0, error_code=code, producer_id=pid,
                            producer_epoch=epoch)


async def add_partitions_to_txn(broker, connection, request):
    """add_partitions_to_txn adds partitions to a transaction (UNKNOWN_TOPIC_OR_PARTITION fails them all)."""
    body = request.body
    wanted = [(topic.name, index) for topic in body.v3_and_below_topics or [] for index in topic.partitions or []]
    codes, found = {}, {}
    for name in dict.fromkeys(name for name, _ in wanted):      # one lookup per topic: a frame names millions
        found[name] = await broker.lookup_topic(name)
    for name, index in wanted:
        known = found[name]
        if known is None or not 0 <= index < known.partitions:
            codes[(name, index)] = errors.UNKNOWN_TOPIC_OR_PARTITION
    if codes:                                   # as Kafka: the others are answered OPERATION_NOT_ATTEMPTED
        codes = {key: codes.get(key, errors.OPERATION_NOT_ATTEMPTED) for key in wanted}
    else:
        try:
            await broker.transactions.add_partitions(body.v3_and_below_transactional_id,
                                                     body.v3_and_below_producer_id,
                                                     body.v3_and_below_producer_epoch, wanted)
            code = errors.NONE
        except KafkaError as exc:
            code = _code(exc, request.version, 2)
        codes = {key: code for key in wanted}
    topics: dict[str, list] = {}
    for (name, index), code in codes.items():
        topics.setdefault(name, []).append(_APART(partition_index=index, partition_error_code=code))
    return request.response(AddPartitionsToTxnResponse, throttle_time_ms=0, results_by_topic_v3_and_below=[
        _ATOPIC(name=name, results_by_partition=parts) for name, parts in topics.items()])


async def add_offsets_to_txn(broker, connection, request):
    """add_offsets_to_txn adds a group's offsets to a transaction: its bucket becomes one of its partitions."""
    body = request.body
    try:
        if not isinstance(body.group_id, str) or not body.group_id:
            raise KafkaError(errors.INVALID_GROUP_ID, "a group id is a non-empty string")
        await broker.transactions.add_partitions(body.transactional_id, body.producer_id, body.producer_epoch,
                                                 [(None, broker.bucket_of(body.group_id))])
        code = errors.NONE
    except KafkaError as exc:
        code = _code(exc, request.version, 2)
    return request.response(AddOffsetsToTxnResponse, throttle_time_ms=0, error_code=code)


async def end_txn(broker, connection, request):
    """end_txn commits or aborts a transaction."""
    body = request.body
    try:
        await broker.transactions.end_txn(body.transactional_id, body.producer_id, body.producer_epoch,
                                          bool(body.committed))
        code = errors.NONE
    except KafkaError as exc:
        code = _code(exc, request.version, 2)
    return request.response(EndTxnResponse, throttle_time_ms=0, error_code=code)


def _check_member(broker, body) -> int:
    """_check_member is the error of a TxnOffsetCommit v3's group membership (KIP-447), as Kafka's
    doTxnCommitOffsets: a member id the group does not hold, or a generation (>= 0) not the group's."""
    group = broker.coordinator.groups.get(body.group_id)
    if body.member_id and (group is None or body.member_id not in group.members):
        return errors.UNKNOWN_MEMBER_ID
    if body.generation_id >= 0 and (group is None or body.generation_id != group.generation):
        return errors.ILLEGAL_GENERATION
    return errors.NONE


async def txn_offset_commit(broker, connection, request):
    """txn_offset_commit stores a transaction's offsets of a group, committed by the transaction's marker."""
    body = request.body
    codes: dict[tuple[str, int], int] = {}
    offsets = []
    try:
        bucket = broker.bucket_for(body.group_id)
        broker.transactions.check_fenced(body.transactional_id, body.producer_id, body.producer_epoch)
        code = _check_member(broker, body) if request.version >= 3 else errors.NONE
    except KafkaError as exc:
        bucket, code = None, _code(exc, request.version, 2)
    for topic in body.topics or []:
        known = await broker.lookup_topic(topic.name) if code == errors.NONE else None
        for part in topic.partitions or []:
            key = (topic.name, part.partition_index)
            if code == errors.NONE and (known is None or not 0 <= part.partition_index < known.partitions):
                codes[key] = errors.UNKNOWN_TOPIC_OR_PARTITION
                continue
            codes[key] = code
            epoch = part.committed_leader_epoch if request.version >= 2 else -1
            offsets.append((topic.name, part.partition_index, part.committed_offset, epoch, part.committed_metadata))
    if code == errors.NONE and offsets:
        try:
            await bucket.commit(txn_offsets_record(body.group_id, body.producer_id, offsets, int(time.time() * 1000),
                                                   body.producer_epoch))
        except KafkaError as exc:
            failed = _code(exc, request.version, 2)
            codes = {key: failed if value == errors.NONE else value for key, value in codes.items()}
    topics: dict[str, list] = {}
    for (name, index), value in codes.items():
        topics.setdefault(name, []).append(_CPART(partition_index=index, error_code=value))
    return request.response(TxnOffsetCommitResponse, throttle_time_ms=0,
                            topics=[_CTOPIC(name=name, partitions=parts) for name, parts in topics.items()])

HANDLERS = {
    InitProducerIdRequest.API_KEY: init_producer_id,
    AddPartitionsToTxnRequest.API_KEY: add_partitions_to_txn,
    AddOffsetsToTxnRequest.API_KEY: add_offsets_to_txn,
    EndTxnRequest.API_KEY: end_txn,
    TxnOffsetCommitRequest.API_KEY: txn_offset_commit,
}
