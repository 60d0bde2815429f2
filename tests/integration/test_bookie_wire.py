"""A real bookie process fed hand-made frames over a raw ZeroMQ DEALER.

Every malformed input must get BAD_REQUEST (or NO_SUCH_LEDGER for unknown ledgers) and must not
stop the bookie: after each one a valid AddRequest on the same connection still gets OK.
"""

from __future__ import annotations

import itertools
import random

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from walkit.core.messages import (
    AddRequest, AddResponse, Entry, ErrorResponse, ReadLacRequest, ReadLacResponse, ReadRequest, ReadResponse,
    Status, WriteLacRequest,
)
from walkit.core.metadata import LedgerMetadata, ledger_key
from walkit.local import LocalCluster
from walkit.plugins import open_metadata
from walkit.wire.codec import encode_requests, encode_responses

from .helpers import MASTER_KEY, RawBookie

pytestmark = pytest.mark.slow

#: Ledger ids the tests use directly on bookies; far from anything a client allocates.
PROBE_LEDGER = 7_000_000_001
_probe_entries = itertools.count()


def assert_serving(raw: RawBookie, cluster: LocalCluster, index: int) -> None:
    """assert_serving checks that the bookie still stores a valid add and answers OK."""
    entry_id = next(_probe_entries)
    response = raw.add(PROBE_LEDGER, entry_id, b"still serving")
    assert isinstance(response, AddResponse)
    assert response.status == Status.OK, response
    assert response.entry_ids == [entry_id]
    assert cluster.is_running(index), cluster.log_tail(index)


def only_error(responses: list) -> ErrorResponse:
    assert len(responses) == 1, responses
    (response,) = responses
    assert isinstance(response, ErrorResponse), response
    assert response.status == Status.BAD_REQUEST
    return response


def register_probe_ledgers(cluster: LocalCluster) -> None:
    """register_probe_ledgers gives the probe ledgers metadata, so bookie garbage collection keeps them.

    Bookies delete ledgers that have no metadata (every 0.2 s with the `local_cluster` fixture);
    without this a test's second request could find its ledger collected after the first.
    """
    store = open_metadata(cluster.metadata_url)
    try:
        for ledger_id in range(PROBE_LEDGER, PROBE_LEDGER + 30):
            metadata = LedgerMetadata(ledger_id=ledger_id, ensemble_size=3, write_quorum=2, ack_quorum=2,
                                      ensembles={0: tuple(cluster.addresses[:3])})
            store.create(ledger_key(ledger_id), metadata.to_bytes())
    finally:
        store.close()


@pytest.fixture
def raw(local_cluster):
    register_probe_ledgers(local_cluster)
    with RawBookie(local_cluster.addresses[0]) as raw:
        assert_serving(raw, local_cluster, 0)        # connected and serving before the abuse
        yield raw


def _valid_add_frame(ledger_id: int, entry_id: int, payload: bytes = b"x", txn: int = 1) -> bytes:
    return encode_requests([AddRequest(txn=txn, ledger_id=ledger_id, master_key=MASTER_KEY,
                                       entries=[Entry(ledger_id, entry_id, -1, b"", payload)])])


_VALID = _valid_add_frame(123, 0)
_GARBAGE = {
    "text-8-aligned": b"hello, bookie!!!",
    "not-8-aligned": b"\xff" * 7,
    "one-byte": b"\x00",
    "huge-segment-count": b"\xff\xff\xff\x7f" + b"\x00" * 60,
    "segment-longer-than-frame": b"\x00\x00\x00\x00\xff\xff\x00\x00" + b"\x00" * 56,
    "truncated-valid-frame": _VALID[:-16],
    "random-4k": random.Random(1).randbytes(4096),
}


@pytest.mark.parametrize("frame", list(_GARBAGE.values()), ids=list(_GARBAGE))
def test_garbage_frame_gets_bad_request_and_bookie_keeps_serving(local_cluster, raw, frame):
    raw.send(frame)
    response = only_error(raw.recv_responses())
    assert response.txn == 0                # nothing in the frame could be trusted
    assert response.message
    assert_serving(raw, local_cluster, 0)


def test_empty_frame_gets_bad_request_and_bookie_keeps_serving(local_cluster, raw):
    raw.send(b"")
    only_error(raw.recv_responses())
    assert_serving(raw, local_cluster, 0)


def test_multipart_message_is_refused_whole_and_bookie_keeps_serving(local_cluster, raw):
    ledger_id = PROBE_LEDGER + 1
    raw.send(_valid_add_frame(ledger_id, 0), _valid_add_frame(ledger_id, 1))
    response = only_error(raw.recv_responses())
    assert "frame" in response.message
    # Refused means refused: neither part was applied.
    lac = raw.read_lac(ledger_id)
    assert lac.status == Status.NO_SUCH_LEDGER
    assert_serving(raw, local_cluster, 0)


def test_response_envelope_sent_to_a_bookie_gets_bad_request(local_cluster, raw):
    raw.send(encode_responses([AddResponse(txn=5, status=Status.OK, ledger_id=1, entry_ids=[0])]))
    only_error(raw.recv_responses())
    assert_serving(raw, local_cluster, 0)


def test_unknown_request_kind_gets_bad_request_for_that_request_only(local_cluster, raw):
    """A request whose union discriminant is unknown is refused; its neighbours in the batch are not."""
    txn_bad, txn_good, ledger_id = 0x1122334455667788, 77, PROBE_LEDGER + 2
    frame = bytearray(encode_requests([
        WriteLacRequest(txn=txn_bad, ledger_id=1, master_key=MASTER_KEY, lac=0),
        AddRequest(txn=txn_good, ledger_id=ledger_id, master_key=MASTER_KEY,
                   entries=[Entry(ledger_id, 0, -1, b"", b"good")]),
    ]))
    where = frame.find(txn_bad.to_bytes(8, "little"))
    assert where > 0 and frame[where + 8:where + 10] == (3).to_bytes(2, "little")   # writeLac is @3 in the union
    frame[where + 8:where + 10] = (9).to_bytes(2, "little")                          # no such union member
    raw.send(bytes(frame))
    responses = {r.txn: r for r in raw.recv_responses()}
    assert set(responses) == {txn_bad, txn_good}
    assert isinstance(responses[txn_bad], ErrorResponse)
    assert responses[txn_bad].status == Status.BAD_REQUEST
    assert isinstance(responses[txn_good], AddResponse)
    assert responses[txn_good].status == Status.OK
    assert_serving(raw, local_cluster, 0)


def test_reads_of_an_unknown_ledger_get_no_such_ledger(local_cluster, raw):
    ledger_id = PROBE_LEDGER + 3
    read = raw.request(ReadRequest(txn=RawBookie.next_txn(), ledger_id=ledger_id, entry_ids=[0, 1, 2]))
    assert isinstance(read, ReadResponse)
    assert (read.status, read.ledger_id, read.entries) == (Status.NO_SUCH_LEDGER, ledger_id, [])
    assert_serving(raw, local_cluster, 0)
    lac = raw.request(ReadLacRequest(txn=RawBookie.next_txn(), ledger_id=ledger_id))
    assert isinstance(lac, ReadLacResponse)
    assert (lac.status, lac.ledger_id) == (Status.NO_SUCH_LEDGER, ledger_id)
    # A plain (non-fencing) read must not create the ledger on the bookie.
    assert raw.read_lac(ledger_id).status == Status.NO_SUCH_LEDGER
    assert_serving(raw, local_cluster, 0)


def test_read_of_a_missing_entry_in_a_known_ledger_omits_it(local_cluster, raw):
    ledger_id = PROBE_LEDGER + 4
    assert raw.add(ledger_id, 0, b"zero").status == Status.OK
    read = raw.read(ledger_id, [0, 1])
    assert read.status == Status.OK
    assert [(e.entry_id, e.payload) for e in read.entries] == [(0, b"zero")]


def test_add_without_master_key_gets_bad_request(local_cluster, raw):
    ledger_id = PROBE_LEDGER + 5
    response = raw.add(ledger_id, 0, master_key=b"")
    assert response.status == Status.BAD_REQUEST
    assert raw.read_lac(ledger_id).status == Status.NO_SUCH_LEDGER
    assert_serving(raw, local_cluster, 0)


def test_add_with_another_master_key_gets_unauthorized(local_cluster, raw):
    ledger_id = PROBE_LEDGER + 6
    assert raw.add(ledger_id, 0, b"mine").status == Status.OK
    response = raw.add(ledger_id, 1, b"intruder", master_key=b"z" * 32)
    assert response.status == Status.UNAUTHORIZED
    read = raw.read(ledger_id, [0, 1])
    assert [(e.entry_id, e.payload) for e in read.entries] == [(0, b"mine")]
    assert_serving(raw, local_cluster, 0)


def test_add_whose_entry_columns_disagree_gets_bad_request(local_cluster, raw):
    """An entry batch is columns (ids, LACs, digests, payloads); columns of different lengths are refused."""
    from walkit.wire.codec import schema
    ledger_id = PROBE_LEDGER + 7
    message = schema.Envelope.new_message()
    request = message.init("requests", 1)[0]
    request.txnId = txn = RawBookie.next_txn()
    add = request.init("add")
    add.ledgerId = ledger_id
    add.masterKey = MASTER_KEY
    batch = add.init("entries")
    batch.entryIds = [0, 1]
    batch.lacs = [-1, -1]
    batch.digests = [b"", b""]
    batch.payloads = [b"only one payload"]
    raw.send(message.to_bytes())
    response = next(r for r in raw.recv_responses() if r.txn == txn)
    assert response.status == Status.BAD_REQUEST
    assert "differ in length" in response.message
    assert raw.read_lac(ledger_id).status == Status.NO_SUCH_LEDGER
    assert_serving(raw, local_cluster, 0)


def test_fuzzed_frames_never_stop_the_bookie(local_cluster, raw):
    """Random frames and randomly mutated valid frames: every reply decodes; the bookie serves on."""
    rng = random.Random(20240521)
    base = [
        _valid_add_frame(PROBE_LEDGER + 8, 0, b"fuzz" * 10),
        encode_requests([ReadRequest(txn=3, ledger_id=PROBE_LEDGER + 8, entry_ids=[0, 1, 2])]),
        encode_requests([ReadLacRequest(txn=4, ledger_id=PROBE_LEDGER + 8)]),
    ]
    for i in range(300):
        if i % 3 == 0:
            frame = rng.randbytes(rng.choice([8, 16, 24, 64, 200, 1024]))
        else:
            frame = bytearray(rng.choice(base))
            for _ in range(rng.randint(1, 4)):
                frame[rng.randrange(len(frame))] = rng.randrange(256)
            frame = bytes(frame)
        raw.send(frame)
    # Whatever came back must be well-formed responses; then the bookie must still serve.
    while not raw.no_reply_within(0.2):
        raw.recv_responses()
    assert_serving(raw, local_cluster, 0)


# -- frames above --max-frame-bytes -------------------------------------------------------------
MAX_FRAME = 65536


@pytest.fixture(scope="module")
def small_frame_cluster(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("small-frames")
    with LocalCluster(bookies=1, data_dir=str(data_dir), bookie_args=("--max-frame-bytes", str(MAX_FRAME))) as cluster:
        yield cluster


def test_garbage_frame_above_max_frame_bytes_gets_bad_request(small_frame_cluster):
    with RawBookie(small_frame_cluster.addresses[0]) as raw:
        assert_serving(raw, small_frame_cluster, 0)
        raw.send(b"\x00" * (MAX_FRAME + 8 * 1000))
        response = only_error(raw.recv_responses())
        assert str(MAX_FRAME) in response.message
        assert_serving(raw, small_frame_cluster, 0)


def test_well_formed_add_above_max_frame_bytes_is_refused_and_not_stored(small_frame_cluster):
    ledger_id = PROBE_LEDGER + 20
    with RawBookie(small_frame_cluster.addresses[0]) as raw:
        frame = _valid_add_frame(ledger_id, 0, b"p" * (MAX_FRAME + 1000), txn=RawBookie.next_txn())
        assert MAX_FRAME < len(frame) < 2 * MAX_FRAME
        raw.send(frame)
        only_error(raw.recv_responses())
        assert raw.read_lac(ledger_id).status == Status.NO_SUCH_LEDGER
        # Just under the limit is accepted: the limit is the frame size, not something smaller.
        response = raw.add(ledger_id, 0, b"q" * (MAX_FRAME - 1024))
        assert response.status == Status.OK
        assert_serving(raw, small_frame_cluster, 0)


def test_frame_far_above_max_frame_bytes_does_not_stop_the_bookie(small_frame_cluster):
    """ZeroMQ drops a peer that sends more than twice the limit; the bookie serves everyone else."""
    with RawBookie(small_frame_cluster.addresses[0]) as abuser, RawBookie(small_frame_cluster.addresses[0]) as other:
        monitor = abuser.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        try:
            assert_serving(abuser, small_frame_cluster, 0)
            assert_serving(other, small_frame_cluster, 0)
            abuser.send(b"\x00" * (16 * MAX_FRAME))
            # The bookie really received it: it cut the abuser's connection.
            assert monitor.poll(10_000), "the bookie did not drop the peer that sent an oversized frame"
            assert recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED
            assert_serving(other, small_frame_cluster, 0)
        finally:
            abuser.socket.disable_monitor()
            monitor.close(linger=0)
    with RawBookie(small_frame_cluster.addresses[0]) as fresh:
        assert_serving(fresh, small_frame_cluster, 0)
