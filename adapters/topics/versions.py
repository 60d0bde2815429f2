"""walkit.adapters.topics.versions lists the Kafka APIs the broker serves and their version ranges.

The ranges are those kafka-python, librdkafka (confluent-kafka, kcat) negotiate with Kafka 3.x
brokers, capped where a later version needs what this broker does not keep: topic ids in
Fetch (v13+) and Produce (v13+), KIP-848 consumer groups, two-phase commit. ApiVersions
answers with this table; a request outside it gets UNSUPPORTED_VERSION (ApiVersions) or the
connection closed, as Kafka does. Transactional APIs are absent on purpose: transactions are
not supported (see handlers/produce.py). SaslHandshake and SaslAuthenticate are listed
whether or not the broker requires SASL, as Kafka lists them (sasl.py, handlers/sasl.py).
"""

from __future__ import annotations

from kafka.protocol.admin import (
    CreateTopicsRequest, DeleteTopicsRequest, DescribeConfigsRequest, DescribeGroupsRequest, ListGroupsRequest,
)
from kafka.protocol.consumer import (
    FetchRequest, HeartbeatRequest, JoinGroupRequest, LeaveGroupRequest, ListOffsetsRequest, OffsetCommitRequest,
    OffsetFetchRequest, SyncGroupRequest,
)
from kafka.protocol.metadata import ApiVersionsRequest, FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import InitProducerIdRequest, ProduceRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

#: api key -> (request class, lowest version, highest version) this broker serves.
SUPPORTED: dict[int, tuple[type, int, int]] = {
    cls.API_KEY: (cls, low, high) for cls, low, high in (
        (ProduceRequest, 3, 9),
        (FetchRequest, 4, 12),
        (ListOffsetsRequest, 1, 7),
        (MetadataRequest, 0, 12),
        (OffsetCommitRequest, 2, 8),
        (OffsetFetchRequest, 1, 7),
        (FindCoordinatorRequest, 0, 4),
        (JoinGroupRequest, 0, 7),
        (HeartbeatRequest, 0, 4),
        (LeaveGroupRequest, 0, 4),
        (SyncGroupRequest, 0, 5),
        (DescribeGroupsRequest, 0, 5),
        (ListGroupsRequest, 0, 4),
        (ApiVersionsRequest, 0, 4),
        (CreateTopicsRequest, 2, 5),
        (DeleteTopicsRequest, 1, 5),
        (InitProducerIdRequest, 0, 4),
        (DescribeConfigsRequest, 1, 4),
        (SaslHandshakeRequest, 0, 1),
        (SaslAuthenticateRequest, 0, 2),
    )
}


def supports(api_key: int, version: int) -> bool:
    """supports tells whether the broker serves version `version` of API `api_key`."""
    entry = SUPPORTED.get(api_key)
    return entry is not None and entry[1] <= version <= entry[2]
