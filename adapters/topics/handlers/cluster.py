"""walkit.adapters.topics.handlers.cluster answers ApiVersions, Metadata, DescribeCluster and FindCoordinator.

Metadata names, for every partition, the broker that leads it now (the partition's election
winner once it finished replaying the log); a partition without one is LEADER_NOT_AVAILABLE
and clients ask again; its leader epoch is the partition's walkit.replicate epoch (epochs.py,
Broker.leadership: always the epoch of the leader named, as librdkafka moves to a new leader
only with a larger epoch). Replicas and ISR name the leader only: walkit replicates below the
broker (the ledgers' quorums), and any live broker can become a partition's leader.
Unknown topics are created on request when auto-creation is on (Kafka's default), answered
LEADER_NOT_AVAILABLE until their leaders are elected. DescribeCluster lists the same live brokers
and controller as Metadata; no authorized operations are reported (ACLs are stored, not enforced:
handlers/acls.py).
"""

from __future__ import annotations

from kafka.protocol.admin import DescribeClusterRequest, DescribeClusterResponse
from kafka.protocol.metadata import (
    ApiVersionsRequest, ApiVersionsResponse, FindCoordinatorRequest, FindCoordinatorResponse, MetadataRequest,
    MetadataResponse,
)

from walkit.adapters.topics import errors
from walkit.adapters.topics.errors import KafkaError
from walkit.adapters.topics.ownership import Slot
from walkit.adapters.topics.wire import api_table

CLUSTER_ID = "walkit"
GROUP_KEY, TRANSACTION_KEY = 0, 1
_TOPIC, _PARTITION = MetadataResponse.MetadataResponseTopic, MetadataResponse.MetadataResponseTopic.MetadataResponsePartition
_BROKER = MetadataResponse.MetadataResponseBroker
_CLUSTER_BROKER = DescribeClusterResponse.DescribeClusterBroker


async def api_versions(broker, connection, request):
    """api_versions lists the supported APIs and versions (versions.py)."""
    return request.response(ApiVersionsResponse, error_code=errors.NONE, api_keys=api_table(), throttle_time_ms=0)


async def create_missing(broker, name: str) -> int:
    """create_missing creates an unknown topic with the default partition count; it returns an error code."""
    try:
        await broker.loop.run_in_executor(None, broker.catalog.create_topic, name, broker.settings.default_partitions)
    except KafkaError as exc:
        if exc.code != errors.TOPIC_ALREADY_EXISTS:
            return exc.code
    broker.ownership.wake()
    return errors.LEADER_NOT_AVAILABLE


def live_brokers(broker) -> dict:
    """live_brokers are the brokers Metadata lists: the live registrations, this broker included."""
    brokers = dict(broker.view.brokers)
    brokers.setdefault(broker.id, broker.info)
    return brokers


def partition_leader(broker, topic: str, partition: int, brokers: dict) -> tuple[int, int]:
    """partition_leader is (the live broker leading a partition, -1 if none; its leader epoch)."""
    leader, epoch = broker.leadership(Slot(topic, partition))
    return (leader if leader in brokers else -1), epoch


async def metadata(broker, connection, request):
    """metadata describes brokers and topics (all topics when the request names none)."""
    body, version = request.body, request.version
    view = broker.view
    wanted = None if body.topics is None else [t.name for t in body.topics]
    if version == 0 and not wanted:
        wanted = None
    auto = broker.settings.auto_create_topics and (version < 4 or body.allow_auto_topic_creation)
    brokers = live_brokers(broker)
    topics = []
    for name in (sorted(view.topics) if wanted is None else wanted):
        topic = await broker.lookup_topic(name) if name is not None else None
        if topic is None:
            code = errors.UNKNOWN_TOPIC_OR_PARTITION
            if auto and name is not None:
                code = await create_missing(broker, name)
            topics.append(_TOPIC(error_code=code, name=name, is_internal=False, partitions=[]))
            continue
        partitions = []
        for index in range(topic.partitions):
            leader, epoch = partition_leader(broker, topic.name, index, brokers)
            partitions.append(_PARTITION(
                error_code=errors.NONE if leader >= 0 else errors.LEADER_NOT_AVAILABLE, partition_index=index,
                leader_id=leader, leader_epoch=epoch, replica_nodes=[leader] if leader >= 0 else [],
                isr_nodes=[leader] if leader >= 0 else [], offline_replicas=[]))
        topics.append(_TOPIC(error_code=errors.NONE, name=topic.name, topic_id=topic.uuid, is_internal=False,
                             partitions=partitions))
    return request.response(
        MetadataResponse, throttle_time_ms=0, cluster_id=CLUSTER_ID, controller_id=view.controller(),
        brokers=[_BROKER(node_id=b.id, host=b.host, port=b.port, rack=None) for b in brokers.values()],
        topics=topics)


async def describe_cluster(broker, connection, request):
    """describe_cluster names the cluster, its controller and its live brokers."""
    return request.response(
        DescribeClusterResponse, throttle_time_ms=0, error_code=errors.NONE, error_message=None, endpoint_type=1,
        cluster_id=CLUSTER_ID, controller_id=broker.view.controller(),
        brokers=[_CLUSTER_BROKER(broker_id=b.id, host=b.host, port=b.port, rack=None, is_fenced=False)
                 for b in live_brokers(broker).values()],
        authorized_operations=None)


def coordinator_of(broker, key: str, key_type: int) -> tuple[int, str, object]:
    """coordinator_of returns (error code, message, BrokerInfo or None) for a FindCoordinator key."""
    if key_type not in (GROUP_KEY, TRANSACTION_KEY):
        return errors.INVALID_REQUEST, f"unknown coordinator key type {key_type}", None
    if not isinstance(key, str) or not key:
        if key_type == TRANSACTION_KEY:
            return errors.INVALID_REQUEST, "an empty transactional id", None
        return errors.INVALID_GROUP_ID, "an empty group id", None
    brokers = live_brokers(broker)
    leader = broker.leader_of(Slot(None, broker.bucket_of(key)))
    if leader not in brokers:
        return errors.COORDINATOR_NOT_AVAILABLE, "the group's coordinator is being elected", None
    return errors.NONE, None, brokers[leader]


async def find_coordinator(broker, connection, request):
    """find_coordinator names the broker that coordinates a consumer group."""
    body, version = request.body, request.version
    key_type = body.key_type if version >= 1 else GROUP_KEY
    if version >= 4:
        coordinators = []
        for key in body.coordinator_keys or []:
            code, message, found = coordinator_of(broker, key, key_type)
            coordinators.append(FindCoordinatorResponse.Coordinator(
                key=key, node_id=found.id if found else -1, host=found.host if found else "",
                port=found.port if found else -1, error_code=code, error_message=message))
        return request.response(FindCoordinatorResponse, throttle_time_ms=0, coordinators=coordinators)
    code, message, found = coordinator_of(broker, body.key, key_type)
    return request.response(FindCoordinatorResponse, throttle_time_ms=0, error_code=code, error_message=message,
                            node_id=found.id if found else -1, host=found.host if found else "",
                            port=found.port if found else -1)


HANDLERS = {
    ApiVersionsRequest.API_KEY: api_versions,
    MetadataRequest.API_KEY: metadata,
    DescribeClusterRequest.API_KEY: describe_cluster,
    FindCoordinatorRequest.API_KEY: find_coordinator,
}
