"""walkit.adapters.topics.handlers.commits answers OffsetCommit, OffsetFetch, OffsetDelete and DeleteGroups.

A commit is checked against the group's membership (generation and member id; a consumer
outside group management commits with generation -1 and no member id) and, as Kafka does,
refused for partitions that do not exist (UNKNOWN_TOPIC_OR_PARTITION: offsets for made-up
names would grow the group's state without end); the rest is appended to the
group bucket's log and answered once acknowledged (offsets.py), so an answered commit
survives the coordinator. OffsetFetch reads the bucket's applied state once no commit is in
flight or in doubt (broker.BucketLeader.settled: a commit answered with an error may still take
effect until the next leader's replay decides, and a client reading back its failed commit must
not be told it did not): -1 for partitions without a committed offset. A request that
requires stable offsets (v7, KIP-447: librdkafka's read_committed consumers) is answered
UNSTABLE_OFFSET_COMMIT for a partition whose offsets an open transaction committed
(TxnOffsetCommit), and the client asks again: a consumer taking the partition over must not
start at the older offset and process again what that transaction's commit consumes. Offsets
waiting longer than any transaction may stay open (txncoordinator.ORPHAN_S) no longer count: no
marker will take them (sent without AddOffsetsToTxn, or by a zombie after its abort).

DeleteGroups removes a group's committed offsets and stored membership (a forget record of
its bucket, offsets.py); a group with members is NON_EMPTY_GROUP, an unknown one
GROUP_ID_NOT_FOUND. OffsetDelete removes the offsets of the named partitions; a partition
of a topic that a member of the group subscribes to is GROUP_SUBSCRIBED_TO_TOPIC (read from
the members' consumer-protocol subscriptions), as in Kafka.
"""

from __future__ import annotations

import time

from kafka.protocol.admin import DeleteGroupsRequest, DeleteGroupsResponse
from kafka.protocol.consumer import (
    OffsetCommitRequest, OffsetCommitResponse, OffsetDeleteRequest, OffsetDeleteResponse, OffsetFetchRequest,
    OffsetFetchResponse,
)
from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription

from walkit.adapters.topics import errors
from walkit.adapters.topics.errors import KafkaError
from walkit.adapters.topics.offsets import commit_record, forget_record
from walkit.adapters.topics.txncoordinator import ORPHAN_S

OFFSET_METADATA_TOO_LARGE = 12
MAX_METADATA = 4096
_CTOPIC = OffsetCommitResponse.OffsetCommitResponseTopic
_CPART = _CTOPIC.OffsetCommitResponsePartition
_FTOPIC = OffsetFetchResponse.OffsetFetchResponseTopic
_FPART = _FTOPIC.OffsetFetchResponsePartition


async def offset_commit(broker, connection, request):
    """offset_commit stores a group's offsets durably."""
    body = request.body
    code = errors.NONE
    try:
        bucket = broker.bucket_for(body.group_id)
    except KafkaError as exc:
        code, bucket = exc.code, None
    if code == errors.NONE:
        code = broker.coordinator.check_commit(body.group_id, body.generation_id_or_member_epoch, body.member_id)
    codes: dict[tuple[str, int], int] = {}
    offsets = []
    for topic in body.topics or []:
        known = await broker.lookup_topic(topic.name) if code == errors.NONE else None
        for part in topic.partitions or []:
            metadata = part.committed_metadata
            if code == errors.NONE and (known is None or not 0 <= part.partition_index < known.partitions):
                codes[(topic.name, part.partition_index)] = errors.UNKNOWN_TOPIC_OR_PARTITION
                continue
            if code == errors.NONE and metadata is not None and len(metadata) > MAX_METADATA:
                codes[(topic.name, part.partition_index)] = OFFSET_METADATA_TOO_LARGE
                continue
            codes[(topic.name, part.partition_index)] = code
            epoch = part.committed_leader_epoch if request.version >= 6 else -1
            offsets.append((topic.name, part.partition_index, part.committed_offset, epoch, metadata))
    if code == errors.NONE and offsets:
        try:
            await bucket.commit(commit_record(body.group_id, offsets, int(time.time() * 1000)))
        except KafkaError as exc:
            failed = errors.NOT_COORDINATOR if exc.code == errors.NOT_LEADER_OR_FOLLOWER else exc.code
            codes = {key: failed if value == errors.NONE else value for key, value in codes.items()}
    topics: dict[str, list] = {}
    for (name, index), value in codes.items():
        topics.setdefault(name, []).append(_CPART(partition_index=index, error_code=value))
    return request.response(OffsetCommitResponse, throttle_time_ms=0,
                            topics=[_CTOPIC(name=name, partitions=parts) for name, parts in topics.items()])


async def offset_fetch(broker, connection, request):
    """offset_fetch returns a group's committed offsets (all of them when no topics are named)."""
    body = request.body
    try:
        bucket = broker.bucket_for(body.group_id)
        await bucket.settled()                  # no commit in flight or in doubt (broker.BucketLeader)
        committed = bucket.state.offsets(body.group_id)
        unstable = (bucket.state.txns.unstable(body.group_id, int((time.time() - ORPHAN_S) * 1000))
                    if request.version >= 7 and body.require_stable else ())
        code = errors.NONE
    except KafkaError as exc:
        committed, unstable, code = {}, (), exc.code
    if body.topics is None:
        wanted: dict[str, list[int]] = {}
        for name, index in sorted(committed):
            wanted.setdefault(name, []).append(index)
    else:
        wanted = {topic.name: list(topic.partition_indexes or []) for topic in body.topics}
    topics = []
    for name, indexes in wanted.items():
        parts = []
        for index in indexes:
            found = committed.get((name, index))
            if (name, index) in unstable:
                found, part_code = None, errors.UNSTABLE_OFFSET_COMMIT
            else:
                part_code = code if request.version < 2 else errors.NONE
            parts.append(_FPART(partition_index=index, committed_offset=found.offset if found else -1,
                                committed_leader_epoch=found.leader_epoch if found else -1,
                                metadata=(found.metadata if found else "") or "", error_code=part_code))
        topics.append(_FTOPIC(name=name, partitions=parts))
    return request.response(OffsetFetchResponse, throttle_time_ms=0, topics=topics, error_code=code)


def _known(bucket, group: str) -> bool:
    """_known tells whether a bucket holds anything of `group`: committed offsets or a stored membership."""
    return bool(bucket.state.offsets(group)) or group in bucket.state.stored_memberships()


async def delete_groups(broker, connection, request):
    """delete_groups removes empty groups: their committed offsets and stored memberships."""
    results = []
    for group_id in request.body.groups_names or []:
        try:
            bucket = broker.bucket_for(group_id)
            group = broker.coordinator.groups.get(group_id)
            if group is not None and group.members:
                raise KafkaError(errors.NON_EMPTY_GROUP, f"group {group_id!r} has members")
            if not _known(bucket, group_id):
                raise KafkaError(errors.GROUP_ID_NOT_FOUND, f"no group {group_id!r}")
            await bucket.commit(forget_record(group_id, None))
            code = errors.NONE
        except KafkaError as exc:
            code = exc.code
        results.append(DeleteGroupsResponse.DeletableGroupResult(group_id=group_id, error_code=code))
    return request.response(DeleteGroupsResponse, throttle_time_ms=0, results=results)


def subscribed_topics(group) -> set[str] | None:
    """subscribed_topics are the topics a group's members subscribe to; None if a subscription does not decode."""
    topics = set()
    for member in group.members.values():
        try:
            topics.update(ConsumerProtocolSubscription.decode(member.metadata(group.protocol or "")).topics or [])
        except Exception:  # noqa: BLE001 - any member's bytes: then every topic counts as subscribed
            return None
    return topics


async def offset_delete(broker, connection, request):
    """offset_delete removes a group's committed offsets of partitions it does not consume now."""
    body = request.body
    wanted = [(topic.name, part.partition_index) for topic in body.topics or [] for part in topic.partitions or []]
    codes = {key: errors.NONE for key in wanted}
    try:
        bucket = broker.bucket_for(body.group_id)
        if not _known(bucket, body.group_id):
            raise KafkaError(errors.GROUP_ID_NOT_FOUND, f"no group {body.group_id!r}")
        group = broker.coordinator.groups.get(body.group_id)
        if group is not None and group.members:
            if group.protocol_type != "consumer":
                raise KafkaError(errors.NON_EMPTY_GROUP, f"group {body.group_id!r} has members")
            subscribed = subscribed_topics(group)
            for name, index in wanted:
                if subscribed is None or name in subscribed:
                    codes[(name, index)] = errors.GROUP_SUBSCRIBED_TO_TOPIC
        doomed = [key for key in wanted if codes[key] == errors.NONE]
        if doomed:
            await bucket.commit(forget_record(body.group_id, doomed))
        code = errors.NONE
    except KafkaError as exc:
        code = exc.code
    topics: dict[str, list] = {}
    for (name, index), value in codes.items():
        topics.setdefault(name, []).append(OffsetDeleteResponse.OffsetDeleteResponseTopic.OffsetDeleteResponsePartition(
            partition_index=index, error_code=value if code == errors.NONE else errors.NONE))
    return request.response(OffsetDeleteResponse, error_code=code, throttle_time_ms=0, topics=[
        OffsetDeleteResponse.OffsetDeleteResponseTopic(name=name, partitions=parts) for name, parts in topics.items()])


HANDLERS = {
    OffsetCommitRequest.API_KEY: offset_commit,
    OffsetFetchRequest.API_KEY: offset_fetch,
    OffsetDeleteRequest.API_KEY: offset_delete,
    DeleteGroupsRequest.API_KEY: delete_groups,
}
