"""No frame may take a bookie down (issue 11): the six cases a fuzzer found, with real bookie processes.

Each test sends what a hostile or broken peer could send over a raw ZeroMQ DEALER and then checks
that the bookie answers with an error naming the problem and still serves a valid request. The
storage is `files://`, the default, whose index is where two of the crashes came from.
"""

from __future__ import annotations

import struct

import pytest

import walkit
from walkit.core.messages import AddRequest, Entry, ErrorResponse, ReadLacRequest, Status
from walkit.local import LocalCluster

from .helpers import MASTER_KEY, RawBookie, wait_until

pytestmark = pytest.mark.slow

LEDGER = 8_000_000_001


@pytest.fixture
def one_bookie(tmp_path):
    with LocalCluster(bookies=1, data_dir=str(tmp_path / "cluster"), storage="files") as cluster:
        yield cluster


@pytest.fixture
def poll_limited_bookie(tmp_path):
    with LocalCluster(bookies=1, data_dir=str(tmp_path / "cluster"), storage="memory",
                      bookie_args=("--max-long-poll-ms", "500", "--max-long-polls", "3")) as cluster:
        yield cluster


def add_frame(ledger_id: int, entry_id: int, *, digest: bytes = b"", txn: int = 1) -> bytes:
    from walkit.wire.codec import encode_requests
    return encode_requests([AddRequest(txn=txn, ledger_id=ledger_id, master_key=MASTER_KEY,
                                       entries=[Entry(ledger_id, entry_id, -1, digest, b"x")])])


def serves(raw: RawBookie, cluster: LocalCluster, ledger_id: int = LEDGER) -> None:
    """serves checks the bookie process is alive and stores a valid add."""
    response = raw.add(ledger_id, 0, b"still serving")
    assert response.status == Status.OK, response
    assert cluster.is_running(0), cluster.log_tail(0)


def the_response(raw: RawBookie):
    (response,) = raw.recv_responses()
    return response


def test_add_with_a_negative_ledger_id_gets_bad_request_and_the_bookie_lives(one_bookie):
    with RawBookie(one_bookie.addresses[0]) as raw:
        raw.send(add_frame(-5, 0))
        response = the_response(raw)
        assert response.status == Status.BAD_REQUEST and "ledger id -5" in response.message
        serves(raw, one_bookie)


def test_entry_id_past_what_the_index_holds_gets_bad_request_and_restarts_stay_clean(one_bookie):
    with RawBookie(one_bookie.addresses[0]) as raw:
        raw.send(add_frame(LEDGER, 1 << 40))
        response = the_response(raw)
        assert response.status == Status.BAD_REQUEST and "out of range" in response.message
        serves(raw, one_bookie)
    one_bookie.kill_bookie(0)              # replay the journal: nothing in it may stop a restart
    one_bookie.start_bookie(0)
    with RawBookie(one_bookie.addresses[0]) as raw:
        serves(raw, one_bookie, LEDGER + 1)
        assert raw.read(LEDGER, [0]).entries[0].payload == b"still serving"


def test_a_40_byte_frame_of_a_million_empty_requests_is_refused_at_once(one_bookie):
    amplifier = struct.pack("<IIQQQQ", 0, 4, 1 << 32 | 1 << 48, 0, 1 | 7 << 32, (1 << 20) << 2)
    with RawBookie(one_bookie.addresses[0]) as raw:
        raw.send(amplifier)
        response = the_response(raw)       # one refusal, not a million replies
        assert isinstance(response, ErrorResponse)
        assert response.status in (Status.BAD_REQUEST, Status.TOO_MANY_REQUESTS)
        serves(raw, one_bookie)            # answered within recv's 5 s; the attack took 23 s on main


def test_frame_with_more_requests_than_the_limit_gets_too_many_requests(one_bookie):
    from walkit.wire.codec import DEFAULT_MAX_REQUESTS, encode_requests
    requests = [ReadLacRequest(txn=i + 1, ledger_id=LEDGER) for i in range(DEFAULT_MAX_REQUESTS + 1)]
    with RawBookie(one_bookie.addresses[0]) as raw:
        raw.send(encode_requests(requests))
        response = the_response(raw)
        assert (type(response), response.status) == (ErrorResponse, Status.TOO_MANY_REQUESTS)
        serves(raw, one_bookie)


def test_digest_longer_than_255_bytes_gets_bad_request_not_io_error(one_bookie):
    with RawBookie(one_bookie.addresses[0]) as raw:
        raw.send(add_frame(LEDGER, 0, digest=b"d" * 300))
        response = the_response(raw)
        assert response.status == Status.BAD_REQUEST and "digest of 300 bytes" in response.message
        serves(raw, one_bookie)


def test_long_poll_timeouts_are_capped_and_counted(poll_limited_bookie):
    """The fixture's bookie holds a long poll at most 500 ms and at most 3 at once."""
    with RawBookie(poll_limited_bookie.addresses[0]) as raw:
        serves(raw, poll_limited_bookie)
        week = 7 * 24 * 3600 * 1000
        polls = [ReadLacRequest(txn=100 + i, ledger_id=LEDGER, previous_lac=5, timeout_ms=week) for i in range(4)]
        raw.send_requests(polls)
        first = the_response(raw)          # the fourth, at once
        assert (first.txn, first.status) == (103, Status.TOO_MANY_REQUESTS)
        answered = {}
        while len(answered) < 3:           # the others after the 500 ms cap, not in a week
            for response in raw.recv_responses(timeout=5.0):
                answered[response.txn] = response.status
        assert answered == {100: Status.OK, 101: Status.OK, 102: Status.OK}


def test_long_polls_of_a_client_that_disconnected_are_dropped(tmp_path):
    with LocalCluster(bookies=1, data_dir=str(tmp_path / "cluster"), storage="memory",
                      bookie_args=("--max-long-polls", "2", "--max-long-poll-ms", "600000")) as cluster:
        address = cluster.addresses[0]
        with RawBookie(address) as leaver:
            serves(leaver, cluster)
            leaver.send_requests([ReadLacRequest(txn=1 + i, ledger_id=LEDGER, previous_lac=5, timeout_ms=600_000)
                                  for i in range(2)])
            assert leaver.no_reply_within(0.3)        # both parked: the limit is reached
        # The leaver's polls are gone once the bookie sees its connection close, so the two
        # places are free again (a parked poll would stay for ten minutes).
        with RawBookie(address) as stayer:
            def both_park() -> bool:
                stayer.send_requests([ReadLacRequest(txn=RawBookie.next_txn(), ledger_id=LEDGER, previous_lac=5,
                                                     timeout_ms=600_000) for _ in range(2)])
                if stayer.no_reply_within(0.3):
                    return True
                refusals = stayer.recv_responses()
                assert all(r.status == Status.TOO_MANY_REQUESTS for r in refusals), refusals
                return False
            wait_until(both_park, timeout=10, message="the departed client's long polls still hold their places")


def test_a_restarted_bookie_is_used_again_when_no_spare_exists(tmp_path):
    """E3/Qw3/Qa3 on exactly 3 bookies: a bookie restart must not end the writer with NotEnoughBookies."""
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage="files") as cluster, \
            walkit.Client(cluster.metadata_url, add_timeout=3.0) as client:
        writer = client.create_ledger(ensemble=3, write_quorum=3, ack_quorum=3, password=b"pw")
        assert writer.append(b"before") == 0
        victim = writer.metadata.current_ensemble[0]
        index = cluster.addresses.index(victim)
        cluster.stop_bookie(index)
        pending = writer.append_async(b"during")     # cannot be acknowledged while the bookie is down
        cluster.start_bookie(index)                  # returns once it registered again
        assert pending.result(timeout=30) == 1
        assert writer.append(b"after", timeout=30) == 2
        assert writer.metadata.ensembles == {0: writer.metadata.ensembles[0]}   # no replacement was made
        writer.close()
        reader = client.open_ledger(writer.ledger_id, password=b"pw")
        assert [e.payload for e in reader.read()] == [b"before", b"during", b"after"]
