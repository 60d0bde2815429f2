"""Hostile input to `walkit topics serve`: bad frames get errors or a closed connection, never a dead broker.

Kafka's broker closes a connection that sends a frame it cannot parse (an unknown api key, an
unsupported version, a malformed body, an impossible size); it answers ApiVersions of an
unknown version with UNSUPPORTED_VERSION, and record batches that fail their checks with the
protocol's error codes. After every kind of abuse, including thousands of seeded mutations
of valid requests, the same broker still serves kcat and confluent-kafka.
"""

from __future__ import annotations

import random
import socket
import struct

import pytest
from confluent_kafka import Consumer, Producer
from kafka.protocol.consumer import FetchRequest, JoinGroupRequest, ListOffsetsRequest, OffsetCommitRequest
from kafka.protocol.metadata import ApiVersionsResponse, MetadataRequest
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from walkit.adapters.topics import errors

from tests.support.serverprocess import TopicsProcess, api_versions, kcat, recv_exactly

pytestmark = pytest.mark.slow

SEED = 20261122


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("hostile")
    process = TopicsProcess(workdir, data_dir=workdir / "data")
    process.start().wait_ready()
    yield process
    process.stop()


def connect(broker: TopicsProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", broker.port), timeout=10)


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def encoded(request, correlation_id: int = 7) -> bytes:
    """encoded is a request with its header, without the size prefix."""
    request.with_header(correlation_id=correlation_id, client_id="hostile")
    return bytes(request.encode(header=True))


def closed(sock: socket.socket, timeout: float = 10.0) -> bool:
    """closed tells whether the broker closed the connection (reading EOF) rather than answering."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def batch(records: int = 3, magic: int = 2) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i in range(records):
        builder.append(i, timestamp=1000 + i, key=None, value=b"v%d" % i, headers=[])
    data = bytearray(builder.build())
    data[16] = magic
    return bytes(data)


def produce_request(records: bytes, topic: str = "hostile") -> ProduceRequest:
    topic_data = ProduceRequest.TopicProduceData(name=topic, partition_data=[
        ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)])
    return ProduceRequest(version=7, transactional_id=None, acks=-1, timeout_ms=10000, topic_data=[topic_data])


def answer(sock: socket.socket, cls, version: int):
    size = struct.unpack(">i", recv_exactly(sock, 4))[0]
    return cls.decode(recv_exactly(sock, size), version=version, header=True)


def assert_serving(broker: TopicsProcess, tag: str) -> None:
    """assert_serving checks the broker is alive and serves a real producer and kcat."""
    assert broker.process.poll() is None, broker.log_tail()
    assert api_versions(broker.port).error_code == 0
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    producer.produce("alive", value=tag.encode())
    assert producer.flush(30) == 0
    out = kcat("-b", broker.bootstrap, "-t", "alive", "-C", "-e", "-o", "beginning", "-f", "%s\\n")
    assert tag in out.split()


@pytest.mark.parametrize("size", [0x7FFFFFFF, 200 * 1024 * 1024, -1, -0x80000000])
def test_impossible_frame_sizes_close_the_connection(broker, size):
    with connect(broker) as sock:
        sock.sendall(struct.pack(">i", size) + b"\x00" * 16)
        assert closed(sock)
    assert_serving(broker, f"size{size & 0xFFFF}")


def test_unknown_apis_unsupported_versions_and_short_headers_close_the_connection(broker):
    for body in (b"\x03\xe7\x00\x00\x00\x00\x00\x01\x00\x00",       # api key 999
                 b"\x00\x15\x00\x00\x00\x00\x00\x01\x00\x00",       # DeleteRecords: not served
                 encoded(MetadataRequest(version=12, topics=None, allow_auto_topic_creation=False,
                                         include_topic_authorized_operations=False))[:4] + b"\x00\x01\x00\x00",
                 b"\x00\x03\x00\x63\x00\x00\x00\x01\x00\x00",       # Metadata v99
                 b"\x00\x03"):                                      # a header cut short
        with connect(broker) as sock:
            sock.sendall(frame(body))
            assert closed(sock), body
    assert_serving(broker, "apis")


def test_api_versions_of_an_unknown_version_gets_unsupported_version_and_the_table(broker):
    with connect(broker) as sock:
        sock.sendall(frame(b"\x00\x12\x00\x63\x00\x00\x00\x09\x00\x00"))            # ApiVersions v99
        size = struct.unpack(">i", recv_exactly(sock, 4))[0]
        reply = ApiVersionsResponse.decode(recv_exactly(sock, size), version=0, header=True)
    assert reply.error_code == errors.UNSUPPORTED_VERSION and len(reply.api_keys) >= 18


def test_truncated_requests_and_abandoned_connections_leave_the_broker_serving(broker):
    valid = encoded(MetadataRequest(version=9, topics=None, allow_auto_topic_creation=False,
                                    include_topic_authorized_operations=False))
    for cut in (1, 4, 9, len(valid) - 1):
        with connect(broker) as sock:
            sock.sendall(struct.pack(">i", len(valid)) + valid[:cut])      # promises more than it sends
    for cut in (4, len(valid) - 2):
        with connect(broker) as sock:
            sock.sendall(frame(valid[:cut]))                                # a whole frame, a short body
            assert closed(sock)
    assert_serving(broker, "truncated")


def test_bad_record_batches_get_the_protocols_error_codes_on_a_live_connection(broker):
    kcat("-b", broker.bootstrap, "-t", "hostile", "-P", input="seed\n")
    corrupt = bytearray(batch())
    corrupt[-1] ^= 0xFF
    cases = [(bytes(corrupt), errors.CORRUPT_MESSAGE), (batch(magic=1), errors.UNSUPPORTED_FOR_MESSAGE_FORMAT),
             (batch()[:30], errors.CORRUPT_MESSAGE), (batch(), errors.NONE)]
    with connect(broker) as sock:
        for records, expected in cases:
            sock.sendall(frame(encoded(produce_request(records))))
            reply = answer(sock, ProduceResponse, 7)
            assert reply.responses[0].partition_responses[0].error_code == expected
        sock.sendall(frame(encoded(produce_request(batch(), topic="no/such topic"))))
        reply = answer(sock, ProduceResponse, 7)
        assert reply.responses[0].partition_responses[0].error_code == errors.UNKNOWN_TOPIC_OR_PARTITION
    assert_serving(broker, "batches")


def test_thousands_of_mutated_requests_never_stop_the_broker(broker):
    kcat("-b", broker.bootstrap, "-t", "hostile", "-P", input="seed\n")
    templates = [
        encoded(MetadataRequest(version=12, topics=[MetadataRequest.MetadataRequestTopic(name="hostile")],
                                allow_auto_topic_creation=False, include_topic_authorized_operations=False)),
        encoded(produce_request(batch())),
        encoded(FetchRequest(version=11, replica_id=-1, max_wait_ms=10, min_bytes=1, max_bytes=1 << 20,
                             isolation_level=0, session_id=0, session_epoch=-1, topics=[FetchRequest.FetchTopic(
                                 topic="hostile", partitions=[FetchRequest.FetchTopic.FetchPartition(
                                     partition=0, current_leader_epoch=-1, fetch_offset=0, log_start_offset=-1,
                                     partition_max_bytes=1 << 20)])], forgotten_topics_data=[], rack_id="")),
        encoded(ListOffsetsRequest(version=5, replica_id=-1, isolation_level=0, topics=[
            ListOffsetsRequest.ListOffsetsTopic(name="hostile", partitions=[
                ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1,
                                                                         timestamp=-2)])])),
        encoded(JoinGroupRequest(version=5, group_id="fuzz", session_timeout_ms=6000, rebalance_timeout_ms=1000,
                                 member_id="", group_instance_id=None, protocol_type="consumer",
                                 protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")])),
        encoded(OffsetCommitRequest(version=7, group_id="fuzz", generation_id_or_member_epoch=-1, member_id="",
                                    group_instance_id=None, topics=[])),
    ]
    rng = random.Random(SEED)
    answered = dropped = 0
    for i in range(1500):
        body = bytearray(rng.choice(templates))
        for _ in range(rng.randint(1, 4)):
            kind = rng.random()
            position = rng.randrange(len(body))
            if kind < 0.5:
                body[position] = rng.randrange(256)
            elif kind < 0.7:
                del body[position:position + rng.randint(1, 8)]
            elif kind < 0.9:
                body[position:position] = rng.randbytes(rng.randint(1, 8))
            else:
                body[position:position + 4] = struct.pack(">i", rng.choice([-1, 0x7FFFFFFF, 0x10000, -0x80000000]))
        if len(body) >= 2:
            body[0:2] = rng.choice(templates)[0:2]          # mostly keep a served api key
        with connect(broker) as sock:
            sock.sendall(frame(bytes(body)))
            sock.settimeout(10)
            try:
                head = sock.recv(4)
            except ConnectionResetError:
                head = b""
            if head:
                answered += 1
            else:
                dropped += 1
    assert answered + dropped == 1500 and answered > 0 and dropped > 0
    assert_serving(broker, "fuzzed")
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "after-fuzz",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe(["alive"])
    seen = set()
    for _ in range(100):
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            seen.add(message.value())
        if b"fuzzed" in seen:
            break
    consumer.close()
    assert b"fuzzed" in seen
