"""walkit.adapters.topics.handlers.produce answers Produce.

Produce with acks=1 and acks=all is answered once the batches are in the partition's log,
acknowledged by the ledger's ack quorum (walkit acknowledges nothing earlier, so both mean
the same here); acks=0 is appended the same way and not answered. The producer's TimeoutMs
bounds the wait: a partition not acknowledged by then answers REQUEST_TIMED_OUT (an
idempotent producer's retry is then recognised as a duplicate, leader.py). A batch over the
topic's `max.message.bytes` (Broker.max_message_bytes: never above what a log entry holds)
answers MESSAGE_TOO_LARGE for its partition, as Kafka does; nothing of that partition is
appended and the broker keeps leading it.

A transactional producer's batches are stored as any others; the partition opens the
producer's transaction at its first one (partition.py), and the coordinator's markers close
it (txncoordinator.py). InitProducerId is answered in handlers/transactions.py.
"""

from __future__ import annotations

import asyncio

from kafka.protocol.producer import ProduceRequest, ProduceResponse

from walkit.adapters.topics import errors
from walkit.adapters.topics.batches import split
from walkit.adapters.topics.errors import KafkaError

INVALID_REQUIRED_ACKS = 21
_TOPIC = ProduceResponse.TopicProduceResponse
_PARTITION = _TOPIC.PartitionProduceResponse


def _settle(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()                      # retrieved: acks=0 has nobody to tell


async def produce(broker, connection, request):
    """produce appends record batches to the partitions this broker leads."""
    body = request.body
    pending: list[tuple[str, int, object, list]] = []     # topic, partition, leader or error code, futures
    for topic_data in body.topic_data or []:
        for data in topic_data.partition_data or []:
            name, index = topic_data.name, data.index
            try:
                if body.acks not in (0, 1, -1):
                    raise KafkaError(INVALID_REQUIRED_ACKS, f"acks={body.acks}")
                leader = broker.partition(name, index)
                limit = broker.max_message_bytes(broker.view.topics.get(name))
                futures = [leader.append(batch) for batch in split(data.records, limit)]
                pending.append((name, index, leader, futures))
            except KafkaError as exc:
                pending.append((name, index, exc.code, []))
    futures = [f for _, _, _, fs in pending for f in fs]
    if body.acks == 0:
        for future in futures:
            future.add_done_callback(_settle)
        return None
    if futures:
        await asyncio.wait(futures, timeout=max(body.timeout_ms, 1) / 1000)
    topics: dict[str, list] = {}
    for name, index, leader, futures in pending:
        code, base, start = (leader, -1, -1) if isinstance(leader, int) else (errors.NONE, -1, -1)
        for future in futures:
            if not future.done():
                future.add_done_callback(_settle)
                code = errors.REQUEST_TIMED_OUT
            elif future.exception() is not None:
                error = future.exception()
                code = error.code if isinstance(error, KafkaError) else errors.UNKNOWN_SERVER_ERROR
            elif base < 0:
                base = future.result()
        if code == errors.NONE:
            start = leader.state.log_start_offset
        else:
            base = -1
        topics.setdefault(name, []).append(_PARTITION(index=index, error_code=code, base_offset=base,
                                                      log_append_time_ms=-1, log_start_offset=start,
                                                      record_errors=[], error_message=None))
    return request.response(ProduceResponse, throttle_time_ms=0, responses=[
        _TOPIC(name=name, partition_responses=parts) for name, parts in topics.items()])


HANDLERS = {
    ProduceRequest.API_KEY: produce,
}
