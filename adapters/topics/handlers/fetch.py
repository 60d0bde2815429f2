"""walkit.adapters.topics.handlers.fetch answers Fetch (with long polling) and ListOffsets.

Fetch returns whole record batches from the one holding each partition's fetch offset (a
consumer skips the records before its offset, as with Kafka), up to the partition's and the
response's byte limits but always at least one batch. When fewer than MinBytes are ready it
waits, up to MaxWaitMs, for new batches on any of the partitions (long polling), then answers
with what there is. Fetch sessions (KIP-227) are not kept: every answer has session id 0, so
clients send full fetch requests. An offset outside [log start, high watermark] is
OFFSET_OUT_OF_RANGE, and the consumer resets per its auto.offset.reset.

A `read_committed` fetch (isolation level 1) gets the batches below the partition's last
stable offset only (the first offset of its oldest open transaction) and the aborted
transactions (producer id, first offset) among them, whose records the client drops
(partition.py, transactions.py); ListOffsets LATEST answers it the last stable offset.

ListOffsets answers EARLIEST (-2: the log start offset), LATEST (-1: the high watermark),
MAX_TIMESTAMP (-3) and a timestamp: the first offset whose record is stamped at or after it,
found through the index of running maximum timestamps and one batch read. A compressed batch
is opened for that (batches.records); one whose codec's library is missing answers
UNKNOWN_SERVER_ERROR for its partition and the broker logs what to install. Each answer carries
the leader epoch of the record at the offset found, the leader's own at the log end (epochs.py).
"""

from __future__ import annotations

import asyncio
import logging

from kafka.protocol.consumer import FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse

from walkit.adapters.topics import errors
from walkit.adapters.topics.batches import CorruptBatch, MissingCodec, last_offset
from walkit.adapters.topics.errors import KafkaError

log = logging.getLogger("walkit.adapters.topics")
EARLIEST, LATEST, MAX_TIMESTAMP = -2, -1, -3
#: Longest a Fetch is held, whatever MaxWaitMs asks (clients ask for 100-500 ms).
MAX_WAIT_MS = 60_000
_FTOPIC = FetchResponse.FetchableTopicResponse
_FPART = _FTOPIC.PartitionData
_ABORTED = _FPART.AbortedTransaction
READ_COMMITTED = 1
_LTOPIC = ListOffsetsResponse.ListOffsetsTopicResponse
_LPART = _LTOPIC.ListOffsetsPartitionResponse


async def _collect(broker, body) -> tuple[list, int, list, bool]:
    """_collect reads every requested partition once: (topics, bytes, (leader, high watermark)s, any error)."""
    budget = body.max_bytes if body.max_bytes > 0 else 52_428_800
    committed_only = body.isolation_level == READ_COMMITTED
    total, leaders, failed, topics = 0, [], False, []
    for topic in body.topics or []:
        parts = []
        for wanted in topic.partitions or []:
            code, records, hw, start, stable, aborted = errors.NONE, b"", -1, -1, -1, None
            try:
                leader = broker.partition(topic.topic, wanted.partition)
                hw, start = leader.high_watermark, leader.state.log_start_offset
                stable = leader.stable(0, -1)[0]
                leaders.append((leader, hw))
                limit = min(max(wanted.partition_max_bytes, 1), max(budget - total, 1))
                if budget - total > 0 or total == 0:
                    records = await leader.read(wanted.fetch_offset, limit, stable if committed_only else None)
                if committed_only:
                    aborted = [_ABORTED(producer_id=pid, first_offset=first) for pid, first in
                               leader.stable(wanted.fetch_offset, last_offset(records))[1]] if records else []
            except KafkaError as exc:
                code, failed = exc.code, True
            total += len(records)
            parts.append(_FPART(partition_index=wanted.partition, error_code=code, high_watermark=hw,
                                last_stable_offset=stable, log_start_offset=start, aborted_transactions=aborted,
                                preferred_read_replica=-1, records=records))
        topics.append(_FTOPIC(topic=topic.topic, partitions=parts))
    return topics, total, leaders, failed


async def fetch(broker, connection, request):
    """fetch returns batches from the partitions this broker leads, waiting for MinBytes up to MaxWaitMs."""
    body = request.body
    loop = broker.loop
    deadline = loop.time() + min(max(body.max_wait_ms, 0), MAX_WAIT_MS) / 1000
    while True:
        topics, total, leaders, failed = await _collect(broker, body)
        remaining = deadline - loop.time()
        if failed or total >= max(body.min_bytes, 1) or remaining <= 0 or not leaders:
            break
        waiters = [leader.wait_for_data(seen) for leader, seen in leaders]
        await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters:
            waiter.cancel()
    return request.response(FetchResponse, throttle_time_ms=0, error_code=errors.NONE, session_id=0,
                            responses=topics)


async def _list_offset(broker, topic: str, partition: int, timestamp: int,
                       committed_only: bool = False) -> tuple[int, int, int]:
    """_list_offset returns (error code, timestamp, offset) of one ListOffsets partition."""
    try:
        leader = broker.partition(topic, partition)
        if timestamp == EARLIEST:
            return errors.NONE, -1, leader.state.log_start_offset
        if timestamp == LATEST:
            return errors.NONE, -1, leader.stable(0, -1)[0] if committed_only else leader.high_watermark
        if timestamp == MAX_TIMESTAMP:
            offset, stamp = await leader.max_timestamp()
            return errors.NONE, stamp, offset
        if timestamp < 0:
            raise KafkaError(errors.INVALID_REQUEST, f"timestamp {timestamp}")
        offset, stamp = await leader.offset_for_time(timestamp)
        return errors.NONE, stamp, offset
    except MissingCodec as exc:
        log.error("ListOffsets of %s-%d by time: %s", topic, partition, exc)
        return exc.code, -1, -1
    except CorruptBatch as exc:
        log.warning("ListOffsets of %s-%d by time: a stored batch's records are corrupt: %s", topic, partition, exc)
        return exc.code, -1, -1
    except KafkaError as exc:
        return exc.code, -1, -1


def _epoch_of(broker, topic: str, partition: int, offset: int) -> int:
    """_epoch_of is the leader epoch of the record at `offset`, the leader's own at the log end (as Kafka
    answers ListOffsets), -1 when unknown (epochs.py)."""
    try:
        leader = broker.partition(topic, partition)
    except KafkaError:
        return -1
    if offset < 0:
        return -1
    if offset >= leader.high_watermark:
        return leader.epoch
    with leader.machine.lock:
        return leader.state.epochs.epoch_at(offset)


async def list_offsets(broker, connection, request):
    """list_offsets answers earliest, latest, max-timestamp and by-timestamp offset queries."""
    topics = []
    for topic in request.body.topics or []:
        parts = []
        for wanted in topic.partitions or []:
            code, stamp, offset = await _list_offset(broker, topic.name, wanted.partition_index, wanted.timestamp,
                                                     request.body.isolation_level == READ_COMMITTED)
            parts.append(_LPART(partition_index=wanted.partition_index, error_code=code, timestamp=stamp,
                                offset=offset, leader_epoch=_epoch_of(broker, topic.name, wanted.partition_index,
                                                                      offset) if code == errors.NONE else -1))
        topics.append(_LTOPIC(name=topic.name, partitions=parts))
    return request.response(ListOffsetsResponse, throttle_time_ms=0, topics=topics)


HANDLERS = {
    FetchRequest.API_KEY: fetch,
    ListOffsetsRequest.API_KEY: list_offsets,
}
