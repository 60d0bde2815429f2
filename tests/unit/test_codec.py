"""walkit.wire.codec: round trips of every message, and only WireError out of bad frames."""

from __future__ import annotations

import struct

import pytest

from walkit.core.messages import (
    AddRequest, AddResponse, Entry, ErrorResponse, ForceRequest, ForceResponse, ReadLacRequest, ReadLacResponse,
    ReadRequest, ReadResponse, Status, WriteLacRequest, WriteLacResponse,
)
from walkit.wire.codec import FrameTooBusy, WireError, decode_requests, decode_responses, encode_requests, encode_responses

from .helpers import MASTER_KEY, make_entry

MANY_ENTRIES = [make_entry(i, b"x" * (i % 7), lac=i - 1) for i in range(200)]
EMPTY_ENTRY = Entry(7, 0, -1, b"", b"")
BIG_IDS = dict(txn=2**64 - 1, ledger_id=2**63 - 1)

REQUESTS = {
    "add": AddRequest(txn=1, ledger_id=7, master_key=MASTER_KEY, entries=[make_entry(0)]),
    "add-recovery-batch": AddRequest(txn=2, ledger_id=7, master_key=MASTER_KEY, entries=MANY_ENTRIES,
                                     recovery=True),
    "add-empty-payload": AddRequest(txn=3, ledger_id=7, master_key=MASTER_KEY, entries=[EMPTY_ENTRY]),
    "add-no-entries": AddRequest(txn=4, ledger_id=7, master_key=b"", entries=[]),
    "add-big-ids": AddRequest(master_key=MASTER_KEY, entries=[], **BIG_IDS),
    "add-lafr": AddRequest(txn=13, ledger_id=7, master_key=MASTER_KEY, entries=[make_entry(3)], lafr=2),
    "read": ReadRequest(txn=5, ledger_id=7, entry_ids=[0, 5, 3]),
    "read-fence-long-poll": ReadRequest(txn=6, ledger_id=7, entry_ids=list(range(1000)), fence=True,
                                        master_key=MASTER_KEY, previous_lac=-1, timeout_ms=2000),
    "read-no-ids": ReadRequest(txn=7, ledger_id=7, entry_ids=[]),
    "read-lac": ReadLacRequest(txn=8, ledger_id=7),
    "read-lac-fence": ReadLacRequest(txn=9, ledger_id=7, fence=True, master_key=MASTER_KEY),
    "read-lac-long-poll": ReadLacRequest(txn=10, ledger_id=7, previous_lac=41, timeout_ms=500),
    "write-lac": WriteLacRequest(txn=11, ledger_id=7, master_key=MASTER_KEY, lac=41),
    "write-lac-none": WriteLacRequest(txn=12, ledger_id=7, master_key=MASTER_KEY, lac=-1),
    "add-deferred-sync": AddRequest(txn=14, ledger_id=7, master_key=MASTER_KEY, entries=[make_entry(0)],
                                    deferred_sync=True),
    "force": ForceRequest(txn=15, ledger_id=7, master_key=MASTER_KEY),
    "add-cleaning": AddRequest(txn=16, ledger_id=7, master_key=MASTER_KEY, entries=[], term=4, truncate=True,
                               truncate_from=12),
    "add-cleaning-from-zero": AddRequest(txn=17, ledger_id=7, master_key=MASTER_KEY, entries=[], term=2,
                                         truncate=True, truncate_from=0),
}

RESPONSES = {
    "add": AddResponse(txn=1, status=Status.OK, ledger_id=7, entry_ids=[0, 1, 2]),
    "add-fenced": AddResponse(txn=2, status=Status.FENCED, ledger_id=7, entry_ids=[3], message="fenced"),
    "add-no-ids": AddResponse(txn=3, status=Status.OK, ledger_id=7),
    "add-big-ids": AddResponse(status=Status.OK, **BIG_IDS),
    "read": ReadResponse(txn=4, status=Status.OK, ledger_id=7, entries=MANY_ENTRIES, lac=198),
    "read-empty-payload": ReadResponse(txn=5, status=Status.OK, ledger_id=7, entries=[EMPTY_ENTRY]),
    "read-no-ledger": ReadResponse(txn=6, status=Status.NO_SUCH_LEDGER, ledger_id=7, message="none"),
    "read-lac": ReadLacResponse(txn=7, status=Status.OK, ledger_id=7, lac=10, last_entry_id=12),
    "read-lac-empty": ReadLacResponse(txn=8, status=Status.OK, ledger_id=7),
    "read-lac-lafr": ReadLacResponse(txn=12, status=Status.OK, ledger_id=7, lac=10, last_entry_id=12, lafr=8),
    "write-lac": WriteLacResponse(txn=9, status=Status.OK, ledger_id=7),
    "write-lac-unauthorized": WriteLacResponse(txn=10, status=Status.UNAUTHORIZED, ledger_id=7, message="key"),
    "error": ErrorResponse(txn=11, status=Status.BAD_REQUEST, message="malformed request: ü"),
    "error-no-txn": ErrorResponse(txn=0, status=Status.BAD_REQUEST),
    "add-instance": AddResponse(txn=13, status=Status.OK, ledger_id=7, entry_ids=[4], instance=2**63 - 1),
    "force": ForceResponse(txn=14, status=Status.OK, ledger_id=7, instance=12345),
    "force-unauthorized": ForceResponse(txn=15, status=Status.UNAUTHORIZED, ledger_id=7, message="key"),
}

WIRE_STATUSES = [s for s in Status if s != Status.UNREACHABLE]


@pytest.mark.parametrize("request_", REQUESTS.values(), ids=REQUESTS.keys())
def test_request_round_trips(request_):
    assert decode_requests(encode_requests([request_])) == [request_]


@pytest.mark.parametrize("response", RESPONSES.values(), ids=RESPONSES.keys())
def test_response_round_trips(response):
    assert decode_responses(encode_responses([response])) == [response]


def test_a_frame_of_many_requests_keeps_their_order():
    requests = list(REQUESTS.values())
    assert decode_requests(encode_requests(requests)) == requests


def test_a_frame_of_many_responses_keeps_their_order():
    responses = list(RESPONSES.values())
    assert decode_responses(encode_responses(responses)) == responses


@pytest.mark.parametrize("status", WIRE_STATUSES, ids=lambda s: s.name)
def test_every_bookie_status_round_trips(status):
    response = AddResponse(txn=1, status=status, ledger_id=7)
    [decoded] = decode_responses(encode_responses([response]))
    assert decoded.status is status


def test_empty_frames_of_requests_and_responses_round_trip():
    assert decode_requests(encode_requests([])) == []
    assert decode_responses(encode_responses([])) == []


def test_encode_requests_refuses_a_response():
    with pytest.raises(TypeError):
        encode_requests([RESPONSES["add"]])


@pytest.mark.parametrize("data", [
    b"", b"\x00", b"\x00" * 7, b"\xff" * 8, b"\xff" * 64, b"\x00\x00\x00\x00\xff\xff\xff\x7f" + b"\x00" * 8,
    bytes(range(256)), b"GET / HTTP/1.1\r\n\r\n\x00\x00\x00\x00\x00\x00",
], ids=["empty", "one-byte", "seven-bytes", "ones-8", "ones-64", "huge-segment", "counting", "http"])
def test_decode_requests_raises_wire_error_on_garbage(data):
    with pytest.raises(WireError):
        decode_requests(data)


def test_decode_requests_raises_wire_error_on_a_responses_envelope():
    with pytest.raises(WireError, match="expected requests"):
        decode_requests(encode_responses([RESPONSES["add"]]))


def test_decode_responses_raises_wire_error_on_a_requests_envelope():
    with pytest.raises(WireError, match="expected responses"):
        decode_responses(encode_requests([REQUESTS["add"]]))


def test_decode_requests_refuses_a_frame_over_max_frame():
    frame = encode_requests([REQUESTS["add-recovery-batch"]])
    with pytest.raises(WireError, match="exceeds the limit"):
        decode_requests(frame, max_frame=len(frame) - 8)


def test_decode_requests_accepts_a_frame_at_max_frame():
    frame = encode_requests([REQUESTS["add"]])
    assert decode_requests(frame, max_frame=len(frame)) == [REQUESTS["add"]]


def test_decode_responses_refuses_a_frame_over_max_frame():
    frame = encode_responses([RESPONSES["read"]])
    with pytest.raises(WireError, match="exceeds the limit"):
        decode_responses(frame, max_frame=64)


def outcome(decode, data: bytes) -> str:
    """outcome decodes `data` and says how it ended: "ok", "wire-error" or the exception's type."""
    try:
        decode(data)
    except WireError:
        return "wire-error"
    except Exception as exc:  # noqa: BLE001 - the point is to report any other exception
        return type(exc).__name__
    return "ok"


def test_truncated_request_frames_raise_only_wire_error():
    frame = encode_requests(list(REQUESTS.values()))
    outcomes = {n: outcome(decode_requests, frame[:n]) for n in range(len(frame))}
    assert {n: o for n, o in outcomes.items() if o != "wire-error"} == {}


def test_truncated_response_frames_raise_only_wire_error():
    frame = encode_responses(list(RESPONSES.values()))
    outcomes = {n: outcome(decode_responses, frame[:n]) for n in range(len(frame))}
    assert {n: o for n, o in outcomes.items() if o != "wire-error"} == {}


def corrupted(frame: bytes, seed: int) -> bytes:
    """corrupted returns `frame` with three bytes overwritten, deterministically from `seed`."""
    data = bytearray(frame)
    for k in range(3):
        position = (seed * 7919 + k * 104729) % len(data)
        data[position] = (seed * 31 + k * 17 + 1) % 256
    return bytes(data)


def test_corrupted_request_frames_decode_or_raise_wire_error():
    frame = encode_requests([REQUESTS["add"], REQUESTS["read-fence-long-poll"], REQUESTS["write-lac"]])
    outcomes = {seed: outcome(decode_requests, corrupted(frame, seed)) for seed in range(500)}
    assert {s: o for s, o in outcomes.items() if o not in ("ok", "wire-error")} == {}


def test_corrupted_response_frames_decode_or_raise_wire_error():
    frame = encode_responses([RESPONSES["add-fenced"], RESPONSES["read-lac"], RESPONSES["error"]])
    outcomes = {seed: outcome(decode_responses, corrupted(frame, seed)) for seed in range(500)}
    assert {s: o for s, o in outcomes.items() if o not in ("ok", "wire-error")} == {}


def test_an_entry_of_another_ledger_cannot_be_encoded_into_a_batch():
    from walkit.core.messages import AddRequest, Entry
    from walkit.wire.codec import encode_requests
    import pytest
    request = AddRequest(txn=1, ledger_id=5, master_key=b"k", entries=[Entry(6, 0, -1, b"", b"stray")])
    with pytest.raises(ValueError, match="another ledger"):
        encode_requests([request])


# -- frames that cost more to decode than they weigh (issue 11) -------------------------------------
def zero_size_requests(count: int) -> bytes:
    """zero_size_requests is a 40-byte Envelope claiming `count` requests of zero size."""
    return struct.pack("<IIQQQQ", 0, 4, 1 << 32 | 1 << 48, 0, 1 | 7 << 32, count << 2)


@pytest.mark.parametrize("count", [1 << 20, 1 << 22, (1 << 29) - 1])
def test_a_tiny_frame_claiming_millions_of_requests_is_refused(count):
    with pytest.raises(WireError, match="traversal limit"):
        decode_requests(zero_size_requests(count))


def test_a_frame_with_more_requests_than_the_limit_is_refused_as_too_busy():
    frame = encode_requests([ReadLacRequest(txn=i, ledger_id=1) for i in range(11)])
    with pytest.raises(FrameTooBusy, match="11 requests"):
        decode_requests(frame, max_requests=10)
    assert len(decode_requests(frame, max_requests=11)) == 11


def test_large_real_frames_stay_within_the_traversal_limit():
    many = [AddRequest(txn=i, ledger_id=5, master_key=b"k" * 32,
                       entries=[Entry(5, j, j - 1, b"", b"") for j in range(2000)]) for i in range(20)]
    assert [len(r.entries) for r in decode_requests(encode_requests(many))] == [2000] * 20
    reads = [ReadResponse(txn=1, status=Status.OK, ledger_id=5, entries=[Entry(5, i, -1, b"", b"") for i in range(5000)])]
    assert len(decode_responses(encode_responses(reads))[0].entries) == 5000
