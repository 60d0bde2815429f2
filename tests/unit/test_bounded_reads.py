"""Reads bounded by count and by bytes (BookKeeper BP-62; issue 39, item 3).

A bookie stops a read's answer before the entry that would take it past the request's
`max_bytes` (the first entry it holds always goes), and says how many ids it did not look at;
those are not absent. These tests cover each piece: the handler's bound, the wire field, the
dispatcher's split into `missing` and `unread`, each machine asking again, and the service
splitting one peer's answers over frames that a client takes.
"""

from __future__ import annotations

import os

import capnp

from walkit.bookie.service import BookieService
from walkit.core import events as ev
from walkit.core import logevents as lev
from walkit.core.bookie import ENTRY_WIRE_BYTES, BookieLimits
from walkit.core.dispatch import Dispatcher, response_event
from walkit.core.logreader import LogReader
from walkit.core.loglist import LogMetadata, LogSegment
from walkit.core.messages import (
    DEFAULT_MAX_READ_BYTES, MAX_READ_IDS, ReadRequest, ReadResponse, Status, split_answer,
)
from walkit.core.metadata import CLOSED
from walkit.core.reader import RangeReader
from walkit.core.recovery import LedgerRecovery
from walkit.wire import codec
from walkit.wire.codec import decode_requests, decode_responses, encode_requests, encode_responses

from .helpers import DIGEST, LEDGER_ID, MASTER_KEY, make_entry, make_metadata, of_type, only, sent_reads
from .test_bookie_handler import Bookie, DictStorage, add, read

KIB = 1024


def cost(payload_bytes: int) -> int:
    """cost is what one entry of `payload_bytes` counts toward a read's bytes (crc32c digest: 4 bytes)."""
    return ENTRY_WIRE_BYTES + 4 + payload_bytes


def stored(count: int, size: int, **options) -> Bookie:
    """stored is a bookie holding entries 0..count-1 of LEDGER_ID, each with a payload of `size` bytes."""
    bookie = Bookie(**options)
    bookie.send(add(0))
    bookie.storage.entries.update(
        {(LEDGER_ID, e): bookie.storage.entries[(LEDGER_ID, 0)][:13] + b"x" * size for e in range(count)})
    return bookie


def answer_of(bookie: Bookie, *ids: int, **options) -> ReadResponse:
    (reply,) = bookie.send(read(*ids, **options))
    return reply.response


# -- the handler --------------------------------------------------------------------------------
def test_an_answer_stops_before_the_entry_that_would_pass_max_bytes_and_counts_the_rest_unread():
    bookie = stored(10, 1000)
    response = answer_of(bookie, *range(10), max_bytes=3 * cost(1000) + 10)
    assert response.status == Status.OK
    assert [e.entry_id for e in response.entries] == [0, 1, 2]
    assert response.unread == 7


def test_an_answer_always_holds_the_first_entry_found_however_large():
    bookie = stored(3, 10 * KIB)
    response = answer_of(bookie, 0, 1, 2, max_bytes=1)
    assert [e.entry_id for e in response.entries] == [0] and response.unread == 2


def test_absent_ids_before_the_first_entry_are_looked_at_and_left_out():
    bookie = stored(3, 100)
    response = answer_of(bookie, 50, 51, 1, 2, max_bytes=1)
    assert [e.entry_id for e in response.entries] == [1] and response.unread == 1
    request = read(50, 51, 1, 2, max_bytes=1)
    assert split_answer(request, response) == ([50, 51], [2])      # absent, not looked at


def test_an_answer_within_max_bytes_has_nothing_unread():
    response = answer_of(stored(5, 100), *range(8), max_bytes=DEFAULT_MAX_READ_BYTES)
    assert [e.entry_id for e in response.entries] == list(range(5)) and response.unread == 0


def test_the_bookies_own_bound_caps_what_a_request_asks():
    bookie = stored(10, 1000, limits=BookieLimits(max_read_bytes=2 * cost(1000)))
    response = answer_of(bookie, *range(10), max_bytes=DEFAULT_MAX_READ_BYTES)
    assert [e.entry_id for e in response.entries] == [0, 1] and response.unread == 8


def test_repeated_ids_cost_their_bytes_each_time():
    bookie = stored(1, 64 * KIB)
    response = answer_of(bookie, *[0] * 4000, max_bytes=4 * cost(64 * KIB))
    assert len(response.entries) == 4 and response.unread == 3996


def test_a_request_without_max_bytes_is_answered_whole_or_refused_if_that_passes_the_bound():
    """A client that predates max_bytes would take unread ids for absent ones: it never gets a cut answer."""
    bookie = stored(10, 1000, limits=BookieLimits(max_read_bytes=5 * cost(1000)))
    whole = answer_of(bookie, 0, 1, 2, 3, 4)
    assert whole.status == Status.OK and len(whole.entries) == 5 and whole.unread == 0
    refused = answer_of(bookie, *range(10))
    assert refused.status == Status.BAD_REQUEST and not refused.entries
    assert "max_bytes" in refused.message and str(5 * cost(1000)) in refused.message


def test_more_ids_than_the_limit_get_bad_request_naming_it_and_change_nothing():
    bookie = Bookie(limits=BookieLimits(max_read_ids=100))
    bookie.send(add(0))
    (reply,) = bookie.send(read(*range(101), fence=True, master_key=MASTER_KEY))
    assert reply.response.status == Status.BAD_REQUEST
    assert "101 entry ids" in reply.response.message and "limit of 100" in reply.response.message
    assert not bookie.storage.states[LEDGER_ID].fenced                # the fencing read fenced nothing
    (reply,) = bookie.send(read(*range(100)))
    assert reply.response.status == Status.OK


def test_the_default_id_limit_is_max_read_ids():
    bookie = Bookie()
    bookie.send(add(0))
    assert answer_of(bookie, *([0] * MAX_READ_IDS), max_bytes=1).status == Status.OK
    assert answer_of(bookie, *([0] * (MAX_READ_IDS + 1)), max_bytes=1).status == Status.BAD_REQUEST


class CountingStorage(DictStorage):
    """CountingStorage records the ids of every get_many call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[int] = []

    def get_many(self, ledger_id: int, entry_ids: list[int]) -> list[bytes | None]:
        self.calls.append(len(entry_ids))
        return [self.get(ledger_id, e) for e in entry_ids]


def test_storage_is_read_in_chunks_sized_from_the_largest_entry_seen():
    storage = CountingStorage()
    bookie = stored(0, 0, storage=storage)
    data = storage.entries[(LEDGER_ID, 0)][:13]
    storage.entries.update({(LEDGER_ID, e): data + b"x" * 100 * KIB for e in range(200)})
    storage.calls.clear()
    response = answer_of(bookie, *range(200), max_bytes=1024 * KIB)
    assert len(response.entries) == 10 and response.unread == 190      # 10 x (100 KiB + 52) fit 1 MiB
    assert storage.calls[0] == 1 and sum(storage.calls) <= 11      # one first, then about what fits


def test_a_long_poll_answer_is_bounded_too():
    bookie = stored(1, 100)
    assert bookie.send(read(1, 2, 3, previous_lac=-1, timeout_ms=1000, max_bytes=1)) == []
    replies = bookie.send(add(1, 2, 3, lac=0))
    answer = next(r.response for r in replies if isinstance(r.response, ReadResponse))
    assert [e.entry_id for e in answer.entries] == [1] and answer.unread == 2


def test_a_fencing_read_that_stops_early_still_fenced():
    bookie = stored(5, 1000)
    response = answer_of(bookie, *range(5), fence=True, master_key=MASTER_KEY, max_bytes=1)
    assert response.status == Status.OK and response.unread == 4
    assert bookie.storage.states[LEDGER_ID].fenced


# -- the wire -----------------------------------------------------------------------------------
def test_max_bytes_and_unread_round_trip():
    request = ReadRequest(txn=9, ledger_id=LEDGER_ID, entry_ids=[1, 2, 3], max_bytes=8 << 20)
    assert decode_requests(encode_requests([request])) == [request]
    response = ReadResponse(txn=9, status=Status.OK, ledger_id=LEDGER_ID, entries=[make_entry(1)], lac=0, unread=2)
    assert decode_responses(encode_responses([response])) == [response]


def test_frames_of_a_walkit_without_the_fields_decode_as_unbounded_and_all_looked_at(tmp_path):
    """An older client's read decodes with max_bytes 0; an older bookie's answer with unread 0."""
    source = open(os.path.join(os.path.dirname(codec.__file__), "walkit.capnp")).read()
    old = (source.replace("  maxBytes @7 :UInt64;", "#").replace("  unread @3 :UInt32;", "#")
           .replace("@0xc3565bb7ccf06e0e", "@0xd3565bb7ccf06e0e"))
    path = tmp_path / "old.capnp"
    path.write_text(old)
    schema = capnp.load(str(path))
    assert "maxBytes" not in schema.ReadRequest.schema.fieldnames
    assert "unread" not in schema.ReadResponse.schema.fieldnames
    message = schema.Envelope.new_message()
    request = message.init("requests", 1)[0]
    request.txnId = 5
    request.init("read").entryIds = [1, 2]
    (decoded,) = decode_requests(message.to_bytes())
    assert decoded.max_bytes == 0 and decoded.entry_ids == [1, 2]
    message = schema.Envelope.new_message()
    response = message.init("responses", 1)[0]
    response.txnId = 5
    response.init("read").lac = 3
    (decoded,) = decode_responses(message.to_bytes())
    assert decoded.unread == 0 and decoded.lac == 3
    # ... and an older bookie reads a new client's bounded read as the read it knows.
    frame = encode_requests([ReadRequest(txn=6, ledger_id=LEDGER_ID, entry_ids=[4, 5], max_bytes=1 << 20)])
    with schema.Envelope.from_bytes(frame) as envelope:
        read_request = envelope.requests[0].read
        assert (read_request.ledgerId, list(read_request.entryIds)) == (LEDGER_ID, [4, 5])


# -- the dispatcher -----------------------------------------------------------------------------
def test_the_dispatcher_sends_max_read_bytes_and_splits_reads_over_the_id_limit():
    dispatcher = Dispatcher(max_read_bytes=12345)
    owner = object()
    ids = list(range(MAX_READ_IDS * 2 + 5))
    dispatcher.execute(owner, [ev.SendRead(bookie="B1", ledger_id=LEDGER_ID, entry_ids=ids)])
    requests = dispatcher.take_requests()["B1"]
    assert [len(r.entry_ids) for r in requests] == [MAX_READ_IDS, MAX_READ_IDS, 5]
    assert [i for r in requests for i in r.entry_ids] == ids
    assert {r.max_bytes for r in requests} == {12345}


def test_unread_ids_are_not_missing():
    request = ReadRequest(txn=1, ledger_id=LEDGER_ID, entry_ids=[0, 1, 2, 3, 4])
    response = ReadResponse(txn=1, status=Status.OK, ledger_id=LEDGER_ID, entries=[make_entry(0), make_entry(2)],
                            unread=2)
    event = response_event("B1", request, response)
    assert event.missing == [1] and event.unread == [3, 4]


def test_an_answer_of_a_bookie_without_the_field_has_every_lacking_id_missing():
    request = ReadRequest(txn=1, ledger_id=LEDGER_ID, entry_ids=[0, 1, 2])
    response = ReadResponse(txn=1, status=Status.OK, ledger_id=LEDGER_ID, entries=[make_entry(1)])
    event = response_event("B1", request, response)
    assert event.missing == [0, 2] and event.unread == []


def test_an_answer_that_looked_at_nothing_is_a_failed_read_not_an_absence():
    request = ReadRequest(txn=1, ledger_id=LEDGER_ID, entry_ids=[0, 1, 2])
    response = ReadResponse(txn=1, status=Status.OK, ledger_id=LEDGER_ID, unread=3)
    event = response_event("B1", request, response)
    assert type(event) is ev.ReadFailed and event.status == Status.IO_ERROR and event.entry_ids == [0, 1, 2]


# -- the machines ask again -----------------------------------------------------------------------
def entries_read(bookie: str, entries=(), missing=(), unread=()) -> ev.EntriesRead:
    return ev.EntriesRead(bookie=bookie, ledger_id=LEDGER_ID, entries=list(entries), missing=list(missing), lac=-1,
                          unread=list(unread))


def delivered(commands: list) -> list[int]:
    return [e.entry_id for c in of_type(commands, ev.DeliverEntries) for e in c.entries]


def test_a_range_reader_asks_the_same_bookie_again_for_unread_ids():
    reader = RangeReader(make_metadata(3, 2, 2), 0, 5, DIGEST)
    assert sent_reads(reader.start()) == {"B1": [0, 3], "B2": [1, 4], "B3": [2, 5]}
    commands = reader.step(entries_read("B1", [make_entry(0)], unread=[3]))
    assert sent_reads(commands) == {"B1": [3]} and delivered(commands) == [0]
    commands = reader.step(entries_read("B2", [make_entry(1), make_entry(4)]))
    commands += reader.step(entries_read("B3", [make_entry(2)], unread=[5]))
    assert sent_reads(commands) == {"B3": [5]}              # nothing went to another replica
    commands += reader.step(entries_read("B1", [make_entry(3)]))
    assert delivered(commands) == [1, 2, 3, 4]
    commands = reader.step(entries_read("B3", [make_entry(5)]))
    assert delivered(commands) == [5] and of_type(commands, ev.CompleteRead)


def test_a_range_reader_keeps_waiting_while_a_bookie_answers_part_by_part():
    """An entry far down a read waits for the answers before it: each part restarts its wait."""
    reader = RangeReader(make_metadata(1, 1, 1), 0, 4, DIGEST, timeout_ms=100, now_ms=0)
    reader.start()
    for entry_id in range(4):
        reader.step(ev.Ticked(now_ms=90 * (entry_id + 1)))
        commands = reader.step(entries_read("B1", [make_entry(entry_id)], unread=list(range(entry_id + 1, 5))))
        assert sent_reads(commands) == {"B1": list(range(entry_id + 1, 5))}
    assert not of_type(reader.step(ev.Ticked(now_ms=90 * 4 + 50)), ev.FailRead)
    assert of_type(reader.step(entries_read("B1", [make_entry(4)])), ev.CompleteRead)


def fenced_recovery(cls=LedgerRecovery) -> tuple[LedgerRecovery, list]:
    """fenced_recovery is a recovery of an E3/Qw3/Qa2 ledger past fencing; it returns it and its first reads."""
    recovery = cls(make_metadata(3, 3, 2), 1, master_key=MASTER_KEY, digest=DIGEST, window=4)
    proposed = only(recovery.start(), ev.WriteMetadata).metadata
    recovery.step(ev.MetadataWritten(metadata=proposed, version=2))
    commands: list = []
    for bookie in ("B1", "B2"):
        commands = recovery.step(ev.LacRead(bookie=bookie, ledger_id=LEDGER_ID, status=Status.OK, lac=-1))
    return recovery, commands


def test_recovery_asks_again_for_unread_ids_and_does_not_count_them_absent():
    recovery, reads = fenced_recovery()
    assert sent_reads(reads) == {b: [0, 1, 2, 3] for b in ("B1", "B2", "B3")}
    for bookie in ("B1", "B2", "B3"):                   # each answer holds entry 0 only: 1..3 unread
        commands = recovery.step(entries_read(bookie, [make_entry(0)], unread=[1, 2, 3]))
        again = only(of_type(commands, ev.SendRead), ev.SendRead)
        assert (again.bookie, again.entry_ids, again.fence) == (bookie, [1, 2, 3], True)
    assert recovery.last_entry_id is None               # no absence proven
    recovery.step(entries_read("B1", [make_entry(1)], missing=[2, 3]))
    commands = recovery.step(entries_read("B2", [], missing=[2, 3]))
    assert recovery.last_entry_id == 1                   # QC = 2 bookies said 2 is absent
    for entry_id in (0, 1):
        for bookie in ("B1", "B2"):
            commands = recovery.step(ev.AddsAcked(bookie=bookie, ledger_id=LEDGER_ID, entry_ids=[entry_id]))
    assert only(commands, ev.WriteMetadata).metadata.last_entry_id == 1


class RecoveryTakingUnreadForAbsent(LedgerRecovery):
    UNREAD_IS_UNANSWERED = False


def test_a_recovery_taking_unread_ids_for_absent_would_close_too_early():
    recovery, _ = fenced_recovery(RecoveryTakingUnreadForAbsent)
    recovery.step(entries_read("B1", [make_entry(0)], unread=[1, 2, 3]))
    recovery.step(entries_read("B2", [make_entry(0)], unread=[1, 2, 3]))
    assert recovery.last_entry_id == 0                   # entry 1 "absent" on two bookies that never looked


def test_a_log_reader_asks_again_through_its_range_reader():
    reader = LogReader("orders")
    reader.start()
    segment = LogSegment(ledger_id=LEDGER_ID)
    reader.step(lev.LogMetadataRead(name="orders", metadata=LogMetadata(name="orders", segments=(segment,)),
                                    version=0))
    metadata = make_metadata(1, 1, 1, state=CLOSED, last_entry_id=2)
    commands = reader.step(ev.LedgerMetadataRead(ledger_id=LEDGER_ID, metadata=metadata, version=0))
    assert sent_reads(commands) == {"B1": [0, 1, 2]}
    commands = reader.step(entries_read("B1", [make_entry(0)], unread=[1, 2]))
    assert sent_reads(commands) == {"B1": [1, 2]}
    assert [e.entry_id for c in of_type(commands, lev.DeliverRecords) for e in c.entries] == [0]


# -- the service's frames -----------------------------------------------------------------------------
class MemoryStorage(DictStorage):
    def put(self, ledger_id, entry_id, data):
        self.entries[(ledger_id, entry_id)] = data

    def set_ledger_state(self, ledger_id, state):
        self.states[ledger_id] = state

    def sync(self):
        pass


def service_holding(count: int, size: int, max_frame: int) -> BookieService:
    """service_holding is a BookieService (frames of `max_frame`) holding `count` entries of `size` bytes."""
    service = BookieService(MemoryStorage(), max_frame=max_frame)
    service.receive(b"p", encode_requests([add(0)]))
    service.flush()
    header = service.storage.entries[(LEDGER_ID, 0)][:13]
    for e in range(count):
        service.storage.entries[(LEDGER_ID, e)] = header + bytes([e % 256]) * size
    return service


def test_flush_splits_one_peers_answers_over_frames_within_the_limit():
    service = service_holding(40, 300 * KIB, max_frame=8 * 1024 * KIB)
    reads = [ReadRequest(txn=100 + i, ledger_id=LEDGER_ID, entry_ids=list(range(i * 10, i * 10 + 10)),
                         max_bytes=DEFAULT_MAX_READ_BYTES) for i in range(4)]
    service.receive(b"p", encode_requests(reads))
    frames = service.flush()              # 3 answers of 3 MiB fill the round: two frames of 8 MiB at most
    assert len(frames) == 2 and all(peer == b"p" for peer, _ in frames)
    frames += service.flush()             # the fourth, held for this round
    assert all(len(frame) <= service.reply_frame_bytes for _, frame in frames)
    responses = [r for _, frame in frames for r in decode_responses(frame, max_frame=service.reply_frame_bytes)]
    assert [[r.txn for r in decode_responses(frame)] for _, frame in frames] == [[100, 101], [102], [103]]
    assert [e.entry_id for r in responses for e in r.entries] == list(range(40))
    assert all(e.payload == bytes([e.entry_id]) * (300 * KIB) for r in responses for e in r.entries)


def test_reads_past_a_rounds_bytes_wait_for_the_next_rounds_in_order():
    """One frame of many large reads is answered over several rounds, each holding about a frame of answers."""
    service = service_holding(40, 300 * KIB, max_frame=4 * 1024 * KIB)
    reads = [ReadRequest(txn=100 + i, ledger_id=LEDGER_ID, entry_ids=list(range(i * 10, i * 10 + 10)),
                         max_bytes=DEFAULT_MAX_READ_BYTES) for i in range(4)]
    service.receive(b"p", encode_requests(reads + [ReadRequest(txn=200, ledger_id=LEDGER_ID, entry_ids=[0],
                                                                max_bytes=1)]))
    rounds = []
    while service.has_pending:
        frames = service.flush()
        assert all(len(frame) <= service.reply_frame_bytes for _, frame in frames)
        rounds.append([r.txn for _, frame in frames for r in decode_responses(frame)])
    assert rounds == [[100, 101], [102, 103], [200]]            # 3 MiB answers, 4 MiB a round


def test_an_answer_fits_a_frame_whatever_the_request_asks():
    service = service_holding(20, 100 * KIB, max_frame=1024 * KIB)
    service.receive(b"p", encode_requests([ReadRequest(txn=7, ledger_id=LEDGER_ID, entry_ids=list(range(20)),
                                                       max_bytes=1 << 40)]))
    ((_, frame),) = service.flush()
    assert len(frame) <= 1024 * KIB
    (response,) = decode_responses(frame)
    assert response.unread and len(response.entries) + response.unread == 20
