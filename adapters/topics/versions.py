"""walkit.adapters.topics.versions lists the Kafka APIs the broker serves and their version ranges.

The ranges are those kafka-python, librdkafka (confluent-kafka, kcat) negotiate with Kafka 3.x
brokers, capped where a later version needs what this broker does not keep: topic ids in
Fetch (v13+) and Produce (v13+), KIP-848 consumer groups, two-phase commit. ApiVersions
answers with this table; a request outside it gets UNSUPPORTED_VERSION (ApiVersions) or the
connection closed, as Kafka does. The transactional APIs stop before KIP-890's versions
(AddPartitionsToTxn v4+ is the brokers' own verification, EndTxn and AddOffsetsToTxn v4+ and
TxnOffsetCommit v4+ carry TRANSACTION_ABORTABLE and epoch bumps per transaction): librdkafka
2.16 asks for AddPartitionsToTxn v0, EndTxn v1 and InitProducerId v4, kafka-python 3.0 for v3
of the first two (handlers/transactions.py). WriteTxnMarkers is not served:
brokers write markers into the partitions they lead themselves (txncoordinator.py).
SaslHandshake and SaslAuthenticate are listed whether or not the broker requires SASL, as
Kafka lists them (sasl.py, handlers/sasl.py).

ApiVersions reports Produce from v0 although the broker serves it from v3 (`ADVERTISED_LOW`),
as Kafka 4 does (KIP-896 removed Produce v0-v2; KAFKA-18659 put v0 back in ApiVersions only,
`ApiKeys.PRODUCE_API_VERSIONS_RESPONSE_MIN_VERSION`). older librdkafka (Debian's kcat links 2.0.2)
enables gzip, snappy and lz4 only if the broker's Produce range reaches v0 (librdkafka issue
4956: its codec check asks for Produce v0..v0); against v3 it logs "Broker does not support
compression type gzip" and sends the batch uncompressed. Every client picks the highest
version both sides know, so only clients older than Kafka 0.11's message format ask for
v0-v2, and they get the connection closed, as from Kafka 4: the broker keeps only record
batches of magic 2 (batches.py), and Produce v0-v2 carry message sets of magic 0 and 1.
Fetch keeps its real minimum, v4: librdkafka's codec checks do not look at it, and Kafka 4
reports v4 too.

The admin APIs are served at every version kafka-python knows, which covers what librdkafka
2.x asks for: CreatePartitions, DeleteRecords, AlterConfigs, IncrementalAlterConfigs
(handlers/configs.py: topic configs only), DeleteGroups and OffsetDelete (handlers/commits.py),
DescribeCluster, OffsetForLeaderEpoch (handlers/records.py: the partitions' walkit.replicate
epochs, epochs.py), and CreateAcls, DescribeAcls, DeleteAcls (handlers/acls.py: stored, never
enforced).
"""

from __future__ import annotations

from kafka.protocol.admin import (
    AlterConfigsRequest, CreateAclsRequest, CreatePartitionsRequest, CreateTopicsRequest, DeleteAclsRequest,
    DeleteGroupsRequest, DeleteRecordsRequest, DeleteTopicsRequest, DescribeAclsRequest, DescribeClusterRequest,
    DescribeConfigsRequest, DescribeGroupsRequest, IncrementalAlterConfigsRequest, ListGroupsRequest,
)
from kafka.protocol.consumer import (
    FetchRequest, HeartbeatRequest, JoinGroupRequest, LeaveGroupRequest, ListOffsetsRequest, OffsetCommitRequest,
    OffsetDeleteRequest, OffsetFetchRequest, OffsetForLeaderEpochRequest, SyncGroupRequest,
)
from kafka.protocol.metadata import ApiVersionsRequest, FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest, AddPartitionsToTxnRequest, EndTxnRequest, InitProducerIdRequest, ProduceRequest,
    TxnOffsetCommitRequest,
)
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
        (AddPartitionsToTxnRequest, 0, 3),
        (AddOffsetsToTxnRequest, 0, 3),
        (EndTxnRequest, 0, 3),
        (TxnOffsetCommitRequest, 0, 3),
        (DescribeConfigsRequest, 1, 4),
        (AlterConfigsRequest, 0, 2),
        (IncrementalAlterConfigsRequest, 0, 1),
        (CreatePartitionsRequest, 0, 3),
        (DeleteRecordsRequest, 0, 2),
        (OffsetForLeaderEpochRequest, 0, 4),
        (DeleteGroupsRequest, 0, 2),
        (OffsetDeleteRequest, 0, 0),
        (DescribeClusterRequest, 0, 2),
        (CreateAclsRequest, 0, 3),
        (DescribeAclsRequest, 0, 3),
        (DeleteAclsRequest, 0, 3),
        (SaslHandshakeRequest, 0, 1),
        (SaslAuthenticateRequest, 0, 2),
    )
}


#: api key -> the lowest version ApiVersions reports where it is below what the broker serves (see the module doc).
ADVERTISED_LOW: dict[int, int] = {ProduceRequest.API_KEY: 0}


def advertised(api_key: int) -> tuple[int, int]:
    """advertised is the (lowest, highest) version of API `api_key` that ApiVersions reports."""
    _cls, low, high = SUPPORTED[api_key]
    return min(low, ADVERTISED_LOW.get(api_key, low)), high


def supports(api_key: int, version: int) -> bool:
    """supports tells whether the broker serves version `version` of API `api_key`."""
    entry = SUPPORTED.get(api_key)
    return entry is not None and entry[1] <= version <= entry[2]
