"""tests.support.kafka_fuzz makes hostile Kafka requests for `walkit topics serve`, from a seed.

`HostileRequests(seed, topic=..., group=...)` yields Messages of the kinds a broken or
malicious client sends: size prefixes that are negative, huge (2 GiB), above the broker's
limit or shorter than the body; unknown api keys and versions; served headers with garbage
bodies; bit-flipped and overwritten valid requests; valid requests with out-of-range values
(Produce with corrupt record batches, some with a recomputed CRC so they reach the log;
Fetch with negative byte limits; Metadata claiming 10^6 topics; ListOffsets claiming 2^31
partitions; absurd group timeouts; invalid topics to create); truncated frames the client
abandons; pipelines; bursts of connections; and, with `sasl=True`, SASL exchanges that go
wrong. Each Message says what it is (`kind`) and how the client ends it (`then`), so a
failure names the input. The same seed yields the same messages.

`KafkaWire` is a raw blocking connection to a broker, for tests: it sends bytes, reads
frames, tells whether the broker closed, and logs in with SASL/PLAIN. `HostileClient` sends
Messages over such connections and says how each ended.
"""

from __future__ import annotations

import random
import socket
import struct
from typing import Iterator, NamedTuple

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
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.util import calc_crc32c

#: How a client ends a Message: read until the answer to correlation id `correlation` (the
#: last frame's, as sent) or the close; follow it with a marker request (a request that may get
#: no answer: Produce, which is silent with acks=0) and read until the marker's answer or the
#: close; wait for the broker to close; read `replies` answers (or the close), then close;
#: close at once after sending.
ANSWER, MARKER, EOF, REPLY, HANGUP = "answer", "marker", "eof", "reply", "hangup"
#: Correlation ids of marker requests: fuzzed requests use lower values.
MARKER_BASE = 0x7EED0000
KINDS = ("size-prefix", "truncated", "unknown-api", "garbage-body", "bit-flips", "overwrites", "out-of-range",
         "claimed-counts", "pipelined", "burst", "sasl")

_INT32 = (-1, -2, -(2**31), 2**31 - 1, 0, 1, 2**30, 10**6)
_INT64 = (-1, -2, -3, -4, -(2**63), 2**63 - 1, 0, 2**40, 10**12)
_NAMES = ("", "x" * 300, "..", "a/b", "é\x00", "fuzz" * 10, "__consumer_offsets")
_MECHANISMS = ("SCRAM-SHA-256", "GSSAPI", "plain", "", "P" * 1000, "PLAIN\x00")


class Message(NamedTuple):
    """Message is one hostile request: the bytes to send, what it is and how the client ends it.

    `correlation`: with `then` ANSWER, the correlation id whose answer ends the message;
    `fresh`: send it on a new connection that has not logged in (SASL abuse, bursts);
    `copies`: open that many connections at once and send it on each (a burst);
    `replies`: with `then` REPLY, how many answers to read before closing.
    """

    kind: str
    data: bytes
    then: str
    correlation: int = -1
    fresh: bool = False
    copies: int = 1
    replies: int = 0


def encode(request, correlation_id: int = 1, client_id: str | None = "fuzz") -> bytes:
    """encode is a request with its header, without the size prefix."""
    request.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(request.encode(header=True))


def framed(body: bytes) -> bytes:
    """framed is `body` with its size prefix."""
    return struct.pack(">i", len(body)) + body


def marker(number: int) -> bytes:
    """marker is the framed request that follows a MARKER message (correlation id MARKER_BASE + number).

    It is a Heartbeat of a member no group has: as cheap an answer as the broker gives.
    """
    return framed(encode(HeartbeatRequest(version=0, group_id="marker", generation_id=0, member_id="none"),
                         MARKER_BASE + number, "marker"))


def answered(kind: str, data: bytes) -> Message:
    """answered ends a message of whole frames by the answer to its last frame (a Produce: by a marker)."""
    last = data
    while 0 <= struct.unpack_from(">i", last)[0] < len(last) - 4:
        last = last[4 + struct.unpack_from(">i", last)[0]:]
    if len(last) < 12:
        return Message(kind, data, EOF)                           # no header: the broker closes
    api_key, correlation = struct.unpack_from(">h", last, 4)[0], struct.unpack_from(">i", last, 8)[0]
    if api_key == ProduceRequest.API_KEY:
        return Message(kind, data, MARKER)
    return Message(kind, data, ANSWER, correlation=correlation)


def plain_token(user: str, password: str) -> bytes:
    """plain_token is a SASL/PLAIN token (RFC 4616) with an empty authorization id."""
    return b"\x00" + user.encode() + b"\x00" + password.encode()


def record_batch(records: int = 3, value_size: int = 8, producer_id: int = -1, sequence: int = -1,
                 timestamp: int = 1_700_000_000_000) -> bytearray:
    """record_batch is a valid uncompressed magic-2 record batch."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=producer_id,
                                        producer_epoch=0 if producer_id >= 0 else -1, base_sequence=sequence,
                                        batch_size=1 << 20)
    for i in range(records):
        builder.append(i, timestamp=timestamp + i, key=None, value=b"v" * value_size, headers=[])
    return bytearray(builder.build())


def recompute_crc(batch: bytearray) -> bytearray:
    """recompute_crc makes a tampered batch's CRC-32C (bytes 17-20, over byte 21 on) valid again."""
    batch[17:21] = struct.pack(">I", calc_crc32c(bytes(batch[21:])))
    return batch


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def claiming(empty: bytes, one: bytes, count: int) -> bytes:
    """claiming is `one` (a request with one element in some list) made to claim `count` elements.

    `empty` is the same request with that list empty: the first byte where the two differ is
    the list's count (the low byte of an int32, or a compact array's varint of count + 1).
    """
    at = next(i for i, (a, b) in enumerate(zip(empty, one)) if a != b)
    if empty[at] == 1 and one[at] == 2:                                   # compact array: varint N + 1
        return one[:at] + _uvarint(count + 1) + one[at + 1:]
    assert empty[at] == 0 and one[at] == 1 and at >= 3, "an int32 count"
    return one[:at - 3] + struct.pack(">i", count) + one[at + 1:]


class HostileRequests:
    """HostileRequests yields hostile Messages for a broker, deterministically from `seed` (see the module doc).

    `topic` is an existing topic (partition 0 at least) and `group` a consumer group, so that
    well-formed requests reach the partitions and the coordinator; `sasl` adds SASL abuse on
    fresh connections, with `user`/`password` a valid login (used to build wrong ones).
    No message creates or deletes a topic: CreateTopics and DeleteTopics are sent invalid,
    as validateOnly, or for names that do not exist, and never mutated.
    """

    def __init__(self, seed: int, *, topic: str = "fuzz", group: str = "fuzz-group", kinds=KINDS[:-1],
                 user: str = "fuzz", password: str = "fuzz-secret", max_request_bytes: int = 100 * 1024 * 1024) -> None:
        self.rng = random.Random(seed)
        self.topic = topic
        self.group = group
        self.user = user
        self.password = password
        self.max_request_bytes = max_request_bytes
        self._joins = 0
        self._makers = [
            ("size-prefix", 2, self._size_prefix),
            ("truncated", 2, self._truncated),
            ("unknown-api", 2, self._unknown_api),
            ("garbage-body", 2, self._garbage_body),
            ("bit-flips", 5, self._bit_flips),
            ("overwrites", 2, self._overwrites),
            ("out-of-range", 6, self._out_of_range),
            ("claimed-counts", 1, self._claimed_counts),
            ("pipelined", 1, self._pipelined),
            ("burst", 0.05, self._burst),
        ]
        self._makers.append(("sasl", 1, self._sasl))
        unknown = set(kinds) - set(KINDS)
        assert not unknown, f"unknown kinds {unknown}"
        self._makers = [maker for maker in self._makers if maker[0] in kinds]
        self._weights = [weight for _, weight, _ in self._makers]
        self._builders = [self._produce, self._fetch, self._list_offsets, self._metadata, self._offset_commit,
                          self._offset_fetch, self._find_coordinator, self._join_group, self._sync_group,
                          self._heartbeat, self._leave_group, self._describe_groups, self._list_groups,
                          self._api_versions, self._init_producer_id, self._describe_configs]

    def __iter__(self) -> Iterator[Message]:
        while True:
            kind, _, make = self.rng.choices(self._makers, self._weights)[0]
            yield make(kind)

    # -- values --------------------------------------------------------------------------------
    def _pick(self, wild: bool, values, tame):
        return self.rng.choice(values) if wild and self.rng.random() < 0.4 else tame

    def _correlation(self) -> int:
        return self.rng.randrange(0, MARKER_BASE)

    def _request(self, wild: bool = False) -> bytes:
        """_request is one served request (header and body, no size prefix); `wild` draws values from the edges."""
        build = self.rng.choice(self._builders)
        return encode(build(wild), self._correlation(), self.rng.choice(["fuzz", "", None, "c" * 200]))

    # -- one builder per API: tame values, or with `wild` the edges of their ranges --------------
    def _records(self, wild: bool) -> bytes:
        rng = self.rng
        batch = record_batch(rng.choice([1, 1, 3, 20]), rng.choice([0, 8, 100]))
        if not wild:
            return bytes(batch)
        damage = rng.randrange(12)
        if damage == 0:
            batch[rng.randrange(21, len(batch))] ^= 1 << rng.randrange(8)        # CRC mismatch
        elif damage == 1:
            batch[16] = rng.choice([0, 1, 3, 255])                               # magic
        elif damage == 2:
            batch[8:12] = struct.pack(">i", rng.choice(_INT32))                  # batch length
        elif damage == 3:
            batch = batch[:rng.randrange(len(batch))]                            # cut short
        elif damage == 4:
            batch[57:61] = struct.pack(">i", rng.choice(_INT32))                 # record count
        elif damage == 5:                                                        # codec, transactional, control
            batch[21:23] = struct.pack(">h", rng.choice([1, 2, 3, 4, 5, 7, 0x10, 0x20, 0x31, -1]))
            recompute_crc(batch)
        elif damage == 6:                                                        # lastOffsetDelta
            batch[23:27] = struct.pack(">i", rng.choice(_INT32))
            recompute_crc(batch)
        elif damage == 7:                                                        # timestamps
            batch[27:43] = struct.pack(">qq", rng.choice(_INT64), rng.choice(_INT64))
            recompute_crc(batch)
        elif damage == 8:                                                        # an idempotent producer's fields
            batch = record_batch(rng.choice([1, 5]), producer_id=rng.choice([0, 1, 2**40, 2**63 - 1]),
                                 sequence=rng.choice([0, 5, 2**31 - 1, 2**31 - 3]))
            batch[51:53] = struct.pack(">h", rng.choice([0, 1, -1, 32767]))
            recompute_crc(batch)
        elif damage == 9:                                                        # a good batch, then garbage
            batch += rng.randbytes(rng.choice([1, 12, 61, 200]))
        elif damage == 10:                                                       # records garbage, valid CRC
            batch[61:] = rng.randbytes(len(batch) - 61)
            recompute_crc(batch)
        else:
            return b"" if rng.random() < 0.5 else None
        return bytes(batch)

    def _produce(self, wild: bool):
        rng = self.rng
        partitions = [ProduceRequest.TopicProduceData.PartitionProduceData(
            index=self._pick(wild, _INT32, 0), records=self._records(wild))
            for _ in range(self._pick(wild, (0, 2, 30), 1))]
        topic = ProduceRequest.TopicProduceData(name=self._pick(wild, _NAMES, self.topic), partition_data=partitions)
        return ProduceRequest(version=self.rng.randint(3, 9),
                              transactional_id=self._pick(wild, ("tx", ""), None),
                              acks=self._pick(wild, (2, -2, 100, 0), rng.choice([1, -1, 0])),
                              timeout_ms=self._pick(wild, (-1, 0, 2**31 - 1), 5000), topic_data=[topic])

    def _fetch(self, wild: bool):
        rng = self.rng
        part = FetchRequest.FetchTopic.FetchPartition(
            partition=self._pick(wild, _INT32, 0), current_leader_epoch=self._pick(wild, _INT32, -1),
            fetch_offset=self._pick(wild, _INT64, rng.randrange(0, 50)), log_start_offset=-1,
            partition_max_bytes=self._pick(wild, _INT32, 1 << 20))
        topics = [FetchRequest.FetchTopic(topic=self._pick(wild, _NAMES, self.topic),
                                          partitions=[part] * self._pick(wild, (0, 3), 1))]
        return FetchRequest(version=self.rng.randint(4, 12), replica_id=self._pick(wild, (0, 1, -2), -1),
                            max_wait_ms=self._pick(wild, (-1, 0, 50), 10), min_bytes=self._pick(wild, _INT32, 1),
                            max_bytes=self._pick(wild, _INT32, 1 << 20), isolation_level=self._pick(wild, (1, 7), 0),
                            session_id=self._pick(wild, _INT32, 0), session_epoch=self._pick(wild, _INT32, -1),
                            topics=topics, forgotten_topics_data=[], rack_id="")

    def _list_offsets(self, wild: bool):
        part = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
            partition_index=self._pick(wild, _INT32, 0), current_leader_epoch=-1,
            timestamp=self._pick(wild, _INT64, self.rng.choice([-1, -2, -3, 1_700_000_000_000])))
        topic = ListOffsetsRequest.ListOffsetsTopic(name=self._pick(wild, _NAMES, self.topic), partitions=[part])
        return ListOffsetsRequest(version=self.rng.randint(1, 7), replica_id=-1,
                                  isolation_level=self._pick(wild, (1, 9), 0), topics=[topic])

    def _metadata(self, wild: bool):
        names = [self._pick(wild, _NAMES, self.topic) for _ in range(self._pick(wild, (0, 5, 50), 1))]
        topics = None if self.rng.random() < 0.2 else [MetadataRequest.MetadataRequestTopic(name=n) for n in names]
        return MetadataRequest(version=self.rng.randint(1, 12), topics=topics,
                               allow_auto_topic_creation=False, include_topic_authorized_operations=wild)

    def _offset_commit(self, wild: bool):
        part = OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
            partition_index=self._pick(wild, _INT32, 0), committed_offset=self._pick(wild, _INT64, 5),
            committed_leader_epoch=-1, committed_metadata=self._pick(wild, ("m" * 5000, "", None), "fuzz"))
        topic = OffsetCommitRequest.OffsetCommitRequestTopic(name=self._pick(wild, _NAMES, self.topic),
                                                             partitions=[part])
        return OffsetCommitRequest(version=self.rng.randint(2, 8), group_id=self.group,
                                   generation_id_or_member_epoch=self._pick(wild, _INT32, -1),
                                   member_id=self._pick(wild, ("nobody", "x" * 300), ""), group_instance_id=None,
                                   retention_time_ms=self._pick(wild, _INT64, -1), topics=[topic])

    def _offset_fetch(self, wild: bool):
        topic = OffsetFetchRequest.OffsetFetchRequestTopic(name=self._pick(wild, _NAMES, self.topic),
                                                           partition_indexes=[self._pick(wild, _INT32, 0)])
        return OffsetFetchRequest(version=self.rng.randint(1, 7),
                                  group_id=self._pick(wild, _NAMES, self.group),
                                  topics=None if wild and self.rng.random() < 0.3 else [topic], require_stable=wild)

    def _find_coordinator(self, wild: bool):
        version = self.rng.randint(0, 4)
        key = self._pick(wild, _NAMES, self.group)
        return FindCoordinatorRequest(version=version, key=key, key_type=self._pick(wild, (1, 2, -1, 127), 0),
                                      coordinator_keys=[key] * self._pick(wild, (0, 20), 1))

    def _join_group(self, wild: bool):
        """_join_group joins a new group (it completes at once with the broker's --rebalance-delay-ms 0), or is a stranger's rejoin.

        A join to a group with members waits for them up to their rebalance timeout, which a
        mutation can make minutes: new groups keep the fuzz from waiting on its own joins.
        """
        rng = self.rng
        protocols = [JoinGroupRequest.JoinGroupRequestProtocol(name=self._pick(wild, _NAMES, "range"),
                                                               metadata=rng.randbytes(self._pick(wild, (0, 5000), 10)))
                     for _ in range(self._pick(wild, (0, 10), 1))]
        self._joins += 1
        joins = rng.random() < 0.5
        return JoinGroupRequest(version=rng.randint(4, 7),
                                group_id=f"{self.group}-{self._joins}" if joins else self._pick(wild, _NAMES, self.group),
                                session_timeout_ms=self._pick(wild, _INT32, 10_000),
                                rebalance_timeout_ms=self._pick(wild, (-1, 0, 1), 10),
                                member_id="" if joins else self._pick(wild, ("nobody", "x" * 300), "unknown-member"),
                                group_instance_id=None, protocol_type=self._pick(wild, _NAMES, "consumer"),
                                protocols=protocols, reason=None)

    def _sync_group(self, wild: bool):
        assignments = [SyncGroupRequest.SyncGroupRequestAssignment(member_id="m", assignment=b"a" * 10)]
        return SyncGroupRequest(version=self.rng.randint(0, 5), group_id=self._pick(wild, _NAMES, self.group),
                                generation_id=self._pick(wild, _INT32, 1), member_id=self._pick(wild, _NAMES, "m"),
                                group_instance_id=None, protocol_type="consumer", protocol_name="range",
                                assignments=assignments * self._pick(wild, (0, 50), 1))

    def _heartbeat(self, wild: bool):
        return HeartbeatRequest(version=self.rng.randint(0, 4), group_id=self._pick(wild, _NAMES, self.group),
                                generation_id=self._pick(wild, _INT32, 1), member_id=self._pick(wild, _NAMES, "m"),
                                group_instance_id=None)

    def _leave_group(self, wild: bool):
        members = [LeaveGroupRequest.MemberIdentity(member_id=self._pick(wild, _NAMES, "m"), group_instance_id=None,
                                                    reason=None)] * self._pick(wild, (0, 20), 1)
        return LeaveGroupRequest(version=self.rng.randint(0, 4), group_id=self._pick(wild, _NAMES, self.group),
                                 member_id="m", members=members)

    def _describe_groups(self, wild: bool):
        return DescribeGroupsRequest(version=self.rng.randint(0, 5),
                                     groups=[self._pick(wild, _NAMES, self.group)] * self._pick(wild, (0, 50), 1),
                                     include_authorized_operations=wild)

    def _list_groups(self, wild: bool):
        return ListGroupsRequest(version=self.rng.randint(0, 4),
                                 states_filter=self._pick(wild, (["Stable"], ["??"] * 10), []))

    def _api_versions(self, wild: bool):
        return ApiVersionsRequest(version=self.rng.randint(0, 4),
                                  client_software_name=self._pick(wild, _NAMES, "fuzz"),
                                  client_software_version=self._pick(wild, _NAMES, "1.0"))

    def _init_producer_id(self, wild: bool):
        return InitProducerIdRequest(version=self.rng.randint(0, 4),
                                     transactional_id=self._pick(wild, ("tx", ""), None),
                                     transaction_timeout_ms=self._pick(wild, _INT32, 60_000),
                                     producer_id=self._pick(wild, _INT64, -1), producer_epoch=self._pick(wild, _INT32[:2], -1))

    def _describe_configs(self, wild: bool):
        resource = DescribeConfigsRequest.DescribeConfigsResource(
            resource_type=self._pick(wild, (0, 1, 3, 4, 127, -1), 2), resource_name=self._pick(wild, _NAMES, self.topic),
            configuration_keys=self._pick(wild, (["retention.ms"] * 50, [""]), None))
        return DescribeConfigsRequest(version=self.rng.randint(1, 4), resources=[resource],
                                      include_synonyms=wild, include_documentation=wild)

    def _topic_admin(self):
        """_topic_admin is a CreateTopics or DeleteTopics request that changes nothing (invalid, validateOnly, unknown names)."""
        rng = self.rng
        if rng.random() < 0.3:
            names = [rng.choice(_NAMES[1:]) + "-absent" for _ in range(rng.choice([1, 30]))]
            return DeleteTopicsRequest(version=rng.randint(1, 5), topic_names=names,
                                       timeout_ms=rng.choice([-1, 0, 100]))
        create = CreateTopicsRequest.CreatableTopic
        partitions, validate_only = rng.choice([(0, False), (-5, False), (10**6, False), (2**31 - 1, False),
                                                (10_001, False), (3, True), (-1, True)])
        topics = [create(name=rng.choice(_NAMES) + ("" if not validate_only else "-v"), num_partitions=partitions,
                         replication_factor=rng.choice([1, -1, 0, -7]), assignments=[],
                         configs=[create.CreatableTopicConfig(name=rng.choice(["retention.ms", "no.such", ""]),
                                                              value=rng.choice(["-5", "abc", None, "1" * 40]))])]
        return CreateTopicsRequest(version=rng.randint(2, 5), topics=topics, timeout_ms=rng.choice([0, 100]),
                                   validate_only=validate_only)

    # -- abuse ------------------------------------------------------------------------------------
    def _size_prefix(self, kind: str) -> Message:
        rng = self.rng
        body = self._request()
        choice = rng.randrange(4)
        if choice == 0:                                               # impossible: the broker closes at once
            size = rng.choice([-1, -(2**31), 2**31 - 1, self.max_request_bytes + 1, 2**30])
            return Message(kind, struct.pack(">i", size) + body[:rng.choice([0, 4, len(body)])], EOF)
        if choice == 1:                                               # shorter than the body: the rest misframes
            return Message(kind, struct.pack(">i", rng.randrange(0, len(body))) + body, HANGUP)
        if choice == 2:                                               # longer than what follows, then the client leaves
            return Message(kind, struct.pack(">i", len(body) + rng.choice([1, 100, 10**6])) + body, HANGUP)
        return Message(kind, struct.pack(">i", rng.choice([0, 1, 2, 7])) + body[:7], EOF)

    def _truncated(self, kind: str) -> Message:
        rng = self.rng
        body = self._request()
        if rng.random() < 0.5:                                        # a frame cut anywhere, then the client leaves
            whole = framed(body)
            return Message(kind, whole[:rng.randrange(1, len(whole))], HANGUP)
        return answered(kind, framed(body[:rng.randrange(len(body))]))           # a whole frame, a short body

    def _unknown_api(self, kind: str) -> Message:
        rng = self.rng
        from walkit.adapters.topics.versions import SUPPORTED
        body = bytearray(self._request())
        if rng.random() < 0.5:
            key = rng.choice([k for k in range(-3, 80) if k not in SUPPORTED] + [rng.randrange(-(2**15), 2**15)])
            if key in SUPPORTED:
                key = 999
            body[0:2] = struct.pack(">h", key)
        body[2:4] = struct.pack(">h", rng.choice([-1, 99, 2**15 - 1, -(2**15), rng.randrange(13, 200)]))
        return answered(kind, framed(bytes(body)))

    def _garbage_body(self, kind: str) -> Message:
        rng = self.rng
        head = self._request()
        client = struct.unpack_from(">h", head, 8)[0]
        header = head[:10 + max(client, 0)]
        body = rng.randbytes(rng.choice([0, 1, 4, 16, 100, 2000, rng.randrange(1, 20_000)]))
        return answered(kind, framed(header + body))

    def _bit_flips(self, kind: str) -> Message:
        body = bytearray(self._request())
        for _ in range(self.rng.choice([1, 1, 2, 4, 8, 32])):
            body[self.rng.randrange(len(body))] ^= 1 << self.rng.randrange(8)
        return answered(kind, framed(bytes(body)))

    def _overwrites(self, kind: str) -> Message:
        rng = self.rng
        body = bytearray(self._request())
        for _ in range(rng.choice([1, 2, 4])):
            at = rng.randrange(len(body))
            width = min(len(body) - at, rng.choice([1, 2, 4, 8]))
            body[at:at + width] = bytes([rng.choice([0x00, 0x7F, 0x80, 0xFF])]) * width
        return answered(kind, framed(bytes(body)))

    def _out_of_range(self, kind: str) -> Message:
        rng = self.rng
        if rng.random() < 0.05:
            body = encode(self._topic_admin(), self._correlation())
        else:
            build = rng.choice(self._builders)
            try:
                body = encode(build(True), self._correlation())
            except Exception:  # noqa: BLE001 - a wild value kafka-python refuses to encode: use a tame one
                body = encode(build(False), self._correlation())
        return answered(kind, framed(body))

    def _claimed_counts(self, kind: str) -> Message:
        """_claimed_counts is a request whose list claims far more elements than the frame holds."""
        rng = self.rng
        count = rng.choice([10**6, 2**31 - 1, 2**24, 65536])
        choice = rng.randrange(4)
        if choice == 0:
            version = rng.randint(1, 12)
            request = lambda topics: MetadataRequest(version=version, topics=topics, allow_auto_topic_creation=False,  # noqa: E731
                                                     include_topic_authorized_operations=False)
            one = [MetadataRequest.MetadataRequestTopic(name=self.topic)]
        elif choice == 1:
            version = rng.randint(1, 7)
            part = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1,
                                                                            timestamp=-1)
            request = lambda parts: ListOffsetsRequest(version=version, replica_id=-1, isolation_level=0, topics=[  # noqa: E731
                ListOffsetsRequest.ListOffsetsTopic(name=self.topic, partitions=parts)])
            one = [part]
        elif choice == 2:
            version = rng.randint(3, 9)
            data = ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=bytes(record_batch(1)))
            request = lambda parts: ProduceRequest(version=version, transactional_id=None, acks=1, timeout_ms=1000,  # noqa: E731
                                                   topic_data=[ProduceRequest.TopicProduceData(name=self.topic,
                                                                                               partition_data=parts)])
            one = [data]
        else:
            version = rng.randint(0, 5)
            request = lambda groups: DescribeGroupsRequest(version=version, groups=groups,  # noqa: E731
                                                           include_authorized_operations=False)
            one = [self.group]
        correlation = self._correlation()
        body = claiming(encode(request([]), correlation), encode(request(one), correlation), count)
        return answered(kind, framed(body))

    def _pipelined(self, kind: str) -> Message:
        frames = [framed(self._request()) for _ in range(self.rng.choice([2, 3, 5, 10]))]
        return answered(kind, b"".join(frames))

    def _burst(self, kind: str) -> Message:
        """_burst opens many connections at once, each sending a piece of a frame (or nothing) before closing."""
        rng = self.rng
        whole = framed(self._request())
        return Message(kind, whole[:rng.choice([0, 1, 3, 4, 10])], HANGUP, fresh=True, copies=rng.choice([20, 50, 100]))

    def _sasl(self, kind: str) -> Message:
        """_sasl is an exchange that goes wrong on a connection that has not logged in (the broker closes it)."""
        rng = self.rng
        handshake = lambda version, mechanism="PLAIN": framed(encode(  # noqa: E731
            SaslHandshakeRequest(version=version, mechanism=mechanism), self._correlation()))
        authenticate = lambda token: framed(encode(  # noqa: E731
            SaslAuthenticateRequest(version=rng.randint(0, 2), auth_bytes=token), self._correlation()))
        bad_tokens = [plain_token(self.user, self.password + "x"), plain_token("nobody", self.password),
                      plain_token(self.user, ""), plain_token("", self.password), b"", b"\x00" * 5,
                      b"no separators", b"\xff\xfe\x00\xc3\x28\x00\x80", b"other\x00" + plain_token(self.user, self.password),
                      b"\x00" + b"u" * 1000 + b"\x00" + b"p" * 100_000]
        choice = rng.randrange(7)
        if choice == 0:                                                  # a request before any handshake
            body = self._request()
            if body[:2] == b"\x00\x12":                                  # ApiVersions is served before a login
                body = encode(self._produce(False), 1)
            return Message(kind, framed(body), EOF, fresh=True)
        if choice == 1:                                                  # SaslAuthenticate without a handshake
            return Message(kind, authenticate(plain_token(self.user, self.password)), EOF, fresh=True)
        if choice == 2:                                                  # a mechanism the broker lacks
            return Message(kind, handshake(rng.randint(0, 1), rng.choice(_MECHANISMS)), REPLY, fresh=True, replies=1)
        if choice == 3:                                                  # v0: a bare token that is wrong
            return Message(kind, handshake(0) + framed(rng.choice(bad_tokens)), EOF, fresh=True)
        if choice == 4:                                                  # v1: a wrong token (its answer is delayed)
            waits = rng.random() < 0.05
            return Message(kind, handshake(1) + authenticate(rng.choice(bad_tokens)), REPLY if waits else HANGUP,
                           fresh=True, replies=2)
        if choice == 5:                                                  # v1: another request instead of the token
            return Message(kind, handshake(1) + framed(self._request()), EOF, fresh=True)
        size = rng.choice([524289, 2**20, 50 * 2**20])                   # above the unauthenticated limit
        return Message(kind, struct.pack(">i", size) + b"\x00" * 64, EOF, fresh=True)


class KafkaWire:
    """KafkaWire is a raw blocking connection to a Kafka broker, for hand-made frames.

    `send(data)` writes bytes as they are; `read_frame()` returns the next answer without its
    size prefix, or None once the broker closed the connection (socket.timeout after
    `timeout` seconds of silence); `login(user, password)` runs SaslHandshake v1 and
    SaslAuthenticate and returns SaslAuthenticate's error code.
    """

    def __init__(self, port: int, timeout: float = 10.0, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = bytearray()

    def __enter__(self) -> "KafkaWire":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send(self, data: bytes) -> None:
        """send writes `data` (a broker that closed may make this raise ConnectionError)."""
        self.sock.sendall(data)

    def _fill(self, count: int) -> bool:
        while len(self._buffer) < count:
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return False
            self._buffer += chunk
        return True

    def read_frame(self) -> bytes | None:
        """read_frame returns the next frame's body, or None if the broker closed the connection first."""
        if not self._fill(4):
            return None
        size = struct.unpack_from(">i", self._buffer)[0]
        assert 4 <= size <= 1 << 30, f"an answer with size prefix {size}"
        if not self._fill(4 + size):
            return None
        frame = bytes(self._buffer[4:4 + size])
        del self._buffer[:4 + size]
        return frame

    def closed(self) -> bool:
        """closed waits for the broker to close the connection (True), discarding answers; False on timeout."""
        try:
            while self.read_frame() is not None:
                pass
        except socket.timeout:
            return False
        return True

    def login(self, user: str, password: str, version: int = 2) -> int:
        """login runs SaslHandshake v1 and SaslAuthenticate (`version`); it returns the latter's error code (-1: closed)."""
        from kafka.protocol.sasl import SaslAuthenticateResponse, SaslHandshakeResponse
        self.send(framed(encode(SaslHandshakeRequest(version=1, mechanism="PLAIN"), 1))
                  + framed(encode(SaslAuthenticateRequest(version=version, auth_bytes=plain_token(user, password)), 2)))
        answer = self.read_frame()
        if answer is None or SaslHandshakeResponse.decode(answer, version=1, header=True).error_code:
            return -1
        answer = self.read_frame()
        return -1 if answer is None else SaslAuthenticateResponse.decode(answer, version=version, header=True).error_code

    def close(self) -> None:
        """close closes the socket."""
        self.sock.close()


class HostileClient:
    """HostileClient sends Messages to a broker and ends each one as its `then` says.

    `send(message)` returns what happened: "answered" (the answer, or the marker's, came on a
    connection that stays open), "closed" (the broker closed it), "hung up" (the client did),
    "replied" (REPLY answers read) or "slow" (no answer within `timeout`: the caller should
    check the broker still answers others). It raises AssertionError when the broker breaks
    the protocol: a connection it must close stays open, or a valid login is refused. With
    `login` (user, password) every new connection logs in before non-fresh messages.
    """

    def __init__(self, port: int, *, timeout: float = 5.0, login: tuple[str, str] | None = None) -> None:
        self.port = port
        self.timeout = timeout
        self.login = login
        self.markers = 0
        self._wire: KafkaWire | None = None

    def close(self) -> None:
        """close drops the client's open connection."""
        if self._wire is not None:
            self._wire.close()
            self._wire = None

    def _connection(self) -> KafkaWire:
        if self._wire is None:
            wire = KafkaWire(self.port, timeout=self.timeout)
            if self.login is not None:
                code = wire.login(*self.login)
                assert code == 0, f"a valid login was refused (code {code})"
            self._wire = wire
        return self._wire

    def send(self, message: Message) -> str:
        """send sends one message and returns its outcome (see the class doc)."""
        if message.fresh:
            wires = [KafkaWire(self.port, timeout=self.timeout) for _ in range(message.copies)]
            try:
                for wire in wires:
                    self._write(wire, message.data)
                return self._finish(wires[0], message)
            finally:
                for wire in wires:
                    wire.close()
        wire = self._connection()
        if not self._write(wire, message.data + (marker(self.markers) if message.then == MARKER else b"")):
            self.close()
            return "closed"
        outcome = self._finish(wire, message)
        if outcome != "answered":
            self.close()
        return outcome

    @staticmethod
    def _write(wire: KafkaWire, data: bytes) -> bool:
        try:
            if data:
                wire.send(data)
        except (BrokenPipeError, ConnectionResetError):
            return False
        return True

    def _finish(self, wire: KafkaWire, message: Message) -> str:
        if message.then == HANGUP:
            return "hung up"
        try:
            if message.then == EOF:
                while wire.read_frame() is not None:
                    pass
                return "closed"
            if message.then == REPLY:
                for _ in range(message.replies):
                    if wire.read_frame() is None:
                        return "closed"
                return "replied"
            if message.then == ANSWER:
                expected = message.correlation
            else:
                assert message.then == MARKER, message.then
                expected = MARKER_BASE + self.markers
                self.markers += 1
            while True:
                answer = wire.read_frame()
                if answer is None:
                    return "closed"
                if struct.unpack_from(">i", answer)[0] == expected:
                    return "answered"
        except socket.timeout:
            assert message.then != EOF, f"the broker kept the connection open after {message.kind}"
            return "slow"
