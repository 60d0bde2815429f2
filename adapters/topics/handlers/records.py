"""walkit.adapters.topics.handlers.records answers DeleteRecords and OffsetForLeaderEpoch.

DeleteRecords moves a partition's log start offset (leader.py `delete_records`): the leader
appends a delete record, so every broker's index forgets the batches wholly before the offset
and answers offsets below it OFFSET_OUT_OF_RANGE, as after retention; a consumer behind it
resets per its auto.offset.reset. The low watermark answered is the new log start offset,
which may fall inside a batch (Fetch then returns the whole batch; the consumer skips the
records before its offset). Offset -1 means the high watermark; an offset past it is
OFFSET_OUT_OF_RANGE. The log itself is truncated before the first batch kept at the snapshot
the leader starts next (walkit.replicate's `keep_log_from`), the ledger boundaries permitting.

OffsetForLeaderEpoch answers, from the partition's leader, the end offset of a leader epoch
(epochs.py): what a consumer asks after a leader change to detect log truncation (KIP-320).
A CurrentLeaderEpoch other than the leader's is FENCED_LEADER_EPOCH (older) or
UNKNOWN_LEADER_EPOCH (newer), as in Kafka.
"""

from __future__ import annotations

import asyncio

from kafka.protocol.admin import DeleteRecordsRequest, DeleteRecordsResponse
from kafka.protocol.consumer import OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse

from walkit.adapters.topics import errors
from walkit.adapters.topics.errors import KafkaError

_DTOPIC = DeleteRecordsResponse.DeleteRecordsTopicResult
_DPART = _DTOPIC.DeleteRecordsPartitionResult
_ETOPIC = OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult
_EPART = _ETOPIC.EpochEndOffset


async def _delete(broker, topic: str, partition: int, offset: int) -> tuple[int, int]:
    """_delete returns (error code, low watermark) of one DeleteRecords partition."""
    try:
        return errors.NONE, await broker.partition(topic, partition).delete_records(offset)
    except KafkaError as exc:
        return exc.code, -1


async def delete_records(broker, connection, request):
    """delete_records moves partitions' log start offsets forward (waiting at most the request's timeout)."""
    body = request.body
    timeout = max(body.timeout_ms, 1) / 1000
    topics = []
    for topic in body.topics or []:
        parts = []
        for wanted in topic.partitions or []:
            try:
                code, low = await asyncio.wait_for(
                    _delete(broker, topic.name, wanted.partition_index, wanted.offset), timeout)
            except asyncio.TimeoutError:
                code, low = errors.REQUEST_TIMED_OUT, -1
            parts.append(_DPART(partition_index=wanted.partition_index, low_watermark=low, error_code=code))
        topics.append(_DTOPIC(name=topic.name, partitions=parts))
    return request.response(DeleteRecordsResponse, throttle_time_ms=0, topics=topics)


async def offset_for_leader_epoch(broker, connection, request):
    """offset_for_leader_epoch answers the end offset of each asked leader epoch (see the module doc)."""
    version = request.version
    topics = []
    for topic in request.body.topics or []:
        parts = []
        for wanted in topic.partitions or []:
            current = wanted.current_leader_epoch if version >= 2 else -1
            try:
                leader = broker.partition(topic.topic, wanted.partition)
                epoch, end = leader.end_offset_for(wanted.leader_epoch, current)
                code = errors.NONE
            except KafkaError as exc:
                code, epoch, end = exc.code, -1, -1
            parts.append(_EPART(error_code=code, partition=wanted.partition, leader_epoch=epoch, end_offset=end))
        topics.append(_ETOPIC(topic=topic.topic, partitions=parts))
    return request.response(OffsetForLeaderEpochResponse, throttle_time_ms=0, topics=topics)


HANDLERS = {
    DeleteRecordsRequest.API_KEY: delete_records,
    OffsetForLeaderEpochRequest.API_KEY: offset_for_leader_epoch,
}
