"""BookieHandler: how a bookie answers adds, reads, fences and LAC requests.

The rules: docs/internals/protocol.md#sync-before-ack, #fencing and #bookie-statuses.
"""

from __future__ import annotations

import pytest

from walkit.core.bookie import (
    BookieHandler, BookieLimits, LedgerState, Reply, StoreEntries, StoreLedgerState, pack_entry, unpack_entry,
)
from walkit.core.digest import master_key
from walkit.core.messages import (
    NO_LONG_POLL, AddRequest, ReadLacRequest, ReadRequest, Status, WriteLacRequest,
)

from .helpers import LEDGER_ID, MASTER_KEY, make_entry, of_type, only

PEER = b"client-1"
OTHER_KEY = master_key(b"another password")


class DictStorage:
    """DictStorage is an in-memory StorageView that also applies the handler's store commands."""

    def __init__(self) -> None:
        self.entries: dict[tuple[int, int], bytes] = {}
        self.states: dict[int, LedgerState] = {}

    def get(self, ledger_id: int, entry_id: int) -> bytes | None:
        return self.entries.get((ledger_id, entry_id))

    def last_entry(self, ledger_id: int) -> int:
        return max((e for (l, e) in self.entries if l == ledger_id), default=-1)

    def ledger_state(self, ledger_id: int) -> LedgerState | None:
        return self.states.get(ledger_id)

    def apply(self, commands: list) -> list[Reply]:
        """apply stores what the store commands say and returns the replies, in order."""
        for command in commands:
            if type(command) is StoreEntries:
                for entry_id, data in command.entries:
                    self.entries[(command.ledger_id, entry_id)] = data
            elif type(command) is StoreLedgerState:
                self.states[command.ledger_id] = command.state
        return of_type(commands, Reply)


class Bookie:
    """Bookie is a BookieHandler over a DictStorage whose store commands are applied at once."""

    def __init__(self, storage: DictStorage | None = None, **options) -> None:
        self.storage = storage or DictStorage()
        self.handler = BookieHandler(self.storage, **options)
        self.commands: list = []

    def send(self, request) -> list[Reply]:
        """send hands `request` to the handler, keeps its commands and returns its replies."""
        self.commands = self.handler.step(PEER, request)
        return self.storage.apply(self.commands)

    def tick(self, now_ms: int) -> list[Reply]:
        self.commands = self.handler.tick(now_ms)
        return self.storage.apply(self.commands)


def add(*entry_ids: int, key: bytes = MASTER_KEY, recovery: bool = False, lac: int = -1,
        ledger_id: int = LEDGER_ID, txn: int = 1) -> AddRequest:
    """add builds an AddRequest for the given entries of a ledger, all carrying `lac`."""
    return AddRequest(txn=txn, ledger_id=ledger_id, master_key=key, recovery=recovery,
                      entries=[make_entry(e, lac=lac, ledger_id=ledger_id) for e in entry_ids])


def fence(key: bytes = MASTER_KEY, ledger_id: int = LEDGER_ID) -> ReadLacRequest:
    return ReadLacRequest(txn=2, ledger_id=ledger_id, fence=True, master_key=key)


def read(*entry_ids: int, ledger_id: int = LEDGER_ID, **options) -> ReadRequest:
    return ReadRequest(txn=3, ledger_id=ledger_id, entry_ids=list(entry_ids), **options)


def read_lac(**options) -> ReadLacRequest:
    return ReadLacRequest(txn=4, ledger_id=LEDGER_ID, **options)


def the_reply(replies: list[Reply]) -> Reply:
    assert len(replies) == 1, replies
    return replies[0]


# -- adds ------------------------------------------------------------------------------------
def test_add_stores_entries_and_replies_ok_durably():
    bookie = Bookie()
    reply = the_reply(bookie.send(add(0, 1, 2)))
    assert (reply.peer, reply.durable) == (PEER, True)
    assert (reply.response.status, reply.response.entry_ids, reply.response.txn) == (Status.OK, [0, 1, 2], 1)
    stored = [unpack_entry(LEDGER_ID, e, bookie.storage.get(LEDGER_ID, e)) for e in range(3)]
    assert stored == [make_entry(e) for e in range(3)]


def test_add_reply_comes_after_the_store_commands():
    bookie = Bookie()
    bookie.send(add(0))
    assert [type(c) for c in bookie.commands] == [StoreLedgerState, StoreEntries, Reply]


def test_first_add_records_the_master_key():
    bookie = Bookie()
    bookie.send(add(0))
    assert bookie.storage.states[LEDGER_ID] == LedgerState(master_key=MASTER_KEY)


def test_add_with_another_master_key_is_unauthorized_and_not_durable():
    bookie = Bookie()
    bookie.send(add(0))
    reply = the_reply(bookie.send(add(1, key=OTHER_KEY)))
    assert (reply.response.status, reply.durable) == (Status.UNAUTHORIZED, False)
    assert bookie.storage.get(LEDGER_ID, 1) is None
    assert of_type(bookie.commands, StoreEntries) == []


def test_add_without_master_key_is_a_bad_request():
    reply = the_reply(Bookie().send(add(0, key=b"")))
    assert reply.response.status == Status.BAD_REQUEST


def test_add_whose_entries_name_another_ledger_is_a_bad_request_and_stores_nothing():
    bookie = Bookie()
    request = AddRequest(txn=1, ledger_id=LEDGER_ID, master_key=MASTER_KEY,
                         entries=[make_entry(0), make_entry(1, ledger_id=LEDGER_ID + 1)])
    reply = the_reply(bookie.send(request))
    assert (reply.response.status, reply.durable) == (Status.BAD_REQUEST, False)
    assert bookie.storage.entries == {} and bookie.storage.states == {}


def test_read_only_bookie_refuses_ordinary_adds():
    bookie = Bookie(read_only=True)
    reply = the_reply(bookie.send(add(0)))
    assert (reply.response.status, reply.durable) == (Status.READ_ONLY, False)
    assert bookie.storage.entries == {}


def test_read_only_bookie_accepts_recovery_adds():
    reply = the_reply(Bookie(read_only=True).send(add(0, recovery=True)))
    assert reply.response.status == Status.OK


# -- fencing ---------------------------------------------------------------------------------
def test_fencing_read_lac_stores_fenced_state_and_replies_durably():
    bookie = Bookie()
    bookie.send(add(0))
    reply = the_reply(bookie.send(fence()))
    assert only(bookie.commands, StoreLedgerState).state == LedgerState(fenced=True, master_key=MASTER_KEY)
    assert (reply.response.status, reply.durable) == (Status.OK, True)


def test_fenced_ledger_refuses_a_non_recovery_add():
    bookie = Bookie()
    bookie.send(add(0))
    bookie.send(fence())
    reply = the_reply(bookie.send(add(1)))
    assert reply.response.status == Status.FENCED
    assert bookie.storage.get(LEDGER_ID, 1) is None


def test_fenced_ledger_accepts_a_recovery_add():
    bookie = Bookie()
    bookie.send(add(0))
    bookie.send(fence())
    reply = the_reply(bookie.send(add(1, recovery=True)))
    assert (reply.response.status, reply.durable) == (Status.OK, True)
    assert bookie.storage.get(LEDGER_ID, 1) is not None


def test_fencing_an_unknown_ledger_creates_it_fenced():
    bookie = Bookie()
    the_reply(bookie.send(fence()))
    assert bookie.storage.states[LEDGER_ID] == LedgerState(fenced=True, master_key=MASTER_KEY)
    assert the_reply(bookie.send(add(0))).response.status == Status.FENCED


def test_fencing_with_another_master_key_is_unauthorized_and_does_not_fence():
    bookie = Bookie()
    bookie.send(add(0))
    reply = the_reply(bookie.send(fence(key=OTHER_KEY)))
    assert reply.response.status == Status.UNAUTHORIZED
    assert not bookie.storage.states[LEDGER_ID].fenced


def test_fencing_without_master_key_is_a_bad_request():
    assert the_reply(Bookie().send(fence(key=b""))).response.status == Status.BAD_REQUEST


def test_fencing_read_fences_the_ledger_too():
    bookie = Bookie()
    bookie.send(add(0))
    reply = the_reply(bookie.send(read(0, fence=True, master_key=MASTER_KEY)))
    assert (reply.response.status, reply.durable) == (Status.OK, True)
    assert reply.response.entries == [make_entry(0)]
    assert bookie.storage.states[LEDGER_ID].fenced


# -- reads -----------------------------------------------------------------------------------
def test_read_of_unknown_ledger_is_no_such_ledger():
    reply = the_reply(Bookie().send(read(0)))
    assert (reply.response.status, reply.durable) == (Status.NO_SUCH_LEDGER, False)


def test_read_returns_present_entries_and_omits_absent_ones():
    bookie = Bookie()
    bookie.send(add(0, 2))
    reply = the_reply(bookie.send(read(0, 1, 2, 3)))
    assert reply.response.status == Status.OK
    assert reply.response.entries == [make_entry(0), make_entry(2)]
    assert reply.durable is False


# -- LAC -------------------------------------------------------------------------------------
def test_lac_is_the_highest_lac_carried_by_entries():
    bookie = Bookie()
    bookie.send(add(5, lac=4))
    bookie.send(add(3, lac=2))        # a late, lower entry does not lower the LAC
    reply = the_reply(bookie.send(read_lac()))
    assert (reply.response.lac, reply.response.last_entry_id) == (4, 5)


def test_write_lac_raises_the_lac_above_the_entries_lac():
    bookie = Bookie()
    bookie.send(add(0, lac=-1))
    reply = the_reply(bookie.send(WriteLacRequest(txn=5, ledger_id=LEDGER_ID, master_key=MASTER_KEY, lac=0)))
    assert (reply.response.status, reply.durable) == (Status.OK, True)
    assert bookie.storage.states[LEDGER_ID].explicit_lac == 0
    assert the_reply(bookie.send(read_lac())).response.lac == 0


def test_lac_is_the_max_of_entry_lac_and_explicit_lac():
    bookie = Bookie()
    bookie.send(add(9, lac=8))
    bookie.send(WriteLacRequest(txn=5, ledger_id=LEDGER_ID, master_key=MASTER_KEY, lac=3))
    assert bookie.handler.lac(LEDGER_ID) == 8


def test_write_lac_with_another_master_key_is_unauthorized():
    bookie = Bookie()
    bookie.send(add(0))
    reply = the_reply(bookie.send(WriteLacRequest(txn=5, ledger_id=LEDGER_ID, master_key=OTHER_KEY, lac=0)))
    assert reply.response.status == Status.UNAUTHORIZED
    assert bookie.handler.lac(LEDGER_ID) == -1


def test_write_lac_of_unknown_ledger_is_no_such_ledger():
    reply = the_reply(Bookie().send(WriteLacRequest(txn=5, ledger_id=LEDGER_ID, master_key=MASTER_KEY, lac=0)))
    assert reply.response.status == Status.NO_SUCH_LEDGER


# -- long polls ------------------------------------------------------------------------------
def test_long_poll_parks_while_lac_is_not_past_previous_lac():
    bookie = Bookie()
    bookie.send(add(0, lac=-1))
    assert bookie.send(read_lac(previous_lac=-1, timeout_ms=1000)) == []
    assert bookie.handler.poll_count == 1


def test_long_poll_is_answered_by_an_add_that_raises_the_lac():
    bookie = Bookie()
    bookie.send(add(0, lac=-1))
    bookie.send(read_lac(previous_lac=-1, timeout_ms=1000))
    add_reply, poll_reply = bookie.send(add(1, lac=0))
    assert add_reply.response.entry_ids == [1]
    assert (poll_reply.response.txn, poll_reply.response.lac, poll_reply.durable) == (4, 0, True)
    assert bookie.handler.poll_count == 0


def test_long_poll_is_not_answered_by_an_add_that_keeps_the_lac():
    bookie = Bookie()
    bookie.send(add(0, lac=-1))
    bookie.send(read_lac(previous_lac=-1, timeout_ms=1000))
    assert len(bookie.send(add(1, lac=-1))) == 1
    assert bookie.handler.poll_count == 1


def test_long_poll_is_answered_by_tick_after_its_deadline():
    bookie = Bookie()
    bookie.send(add(0, lac=-1))
    bookie.tick(100)
    bookie.send(read_lac(previous_lac=-1, timeout_ms=1000))
    assert bookie.tick(1099) == []
    reply = the_reply(bookie.tick(1100))
    assert (reply.response.status, reply.response.lac) == (Status.OK, -1)
    assert bookie.handler.poll_count == 0


def test_long_poll_read_woken_by_an_add_returns_the_entries_stored_before_it():
    bookie = Bookie()
    bookie.send(add(0, lac=-1))
    bookie.send(read(0, previous_lac=-1, timeout_ms=1000))
    _, poll_reply = bookie.send(add(1, lac=0))
    assert poll_reply.response.entries == [make_entry(0)]


def test_long_poll_read_woken_by_an_add_returns_the_entries_of_that_add():
    bookie = Bookie()
    bookie.send(add(0, lac=-1))
    bookie.send(read(1, 2, previous_lac=-1, timeout_ms=1000))
    request = AddRequest(txn=9, ledger_id=LEDGER_ID, master_key=MASTER_KEY,
                         entries=[make_entry(1, lac=-1), make_entry(2, lac=0)])
    _, poll_reply = bookie.send(request)
    assert poll_reply.response.entries == [make_entry(1, lac=-1), make_entry(2, lac=0)]


def test_long_poll_read_of_a_ledger_held_nowhere_here_waits_for_its_first_confirmed_entry():
    # A follower tails a new writer's ledger before this bookie has any entry of it: answering
    # NO_SUCH_LEDGER at once would make the follower poll in a loop (as for a LAC long poll).
    bookie = Bookie()
    assert bookie.send(read(0, previous_lac=-1, timeout_ms=1000)) == []
    assert bookie.handler.poll_count == 1
    bookie.send(add(0, lac=-1))
    _, poll_reply = bookie.send(add(1, lac=0))
    assert (poll_reply.response.lac, poll_reply.response.entries) == (0, [make_entry(0)])


def test_long_poll_read_of_a_ledger_held_nowhere_here_is_no_such_ledger_at_its_timeout():
    bookie = Bookie()
    bookie.send(read(0, previous_lac=-1, timeout_ms=1000))
    reply = the_reply(bookie.tick(1000))
    assert reply.response.status == Status.NO_SUCH_LEDGER and bookie.handler.poll_count == 0


def test_request_already_past_previous_lac_is_answered_at_once():
    bookie = Bookie()
    bookie.send(add(1, lac=0))
    reply = the_reply(bookie.send(read_lac(previous_lac=-1, timeout_ms=1000)))
    assert reply.response.lac == 0


def test_no_long_poll_marker_answers_at_once():
    bookie = Bookie()
    bookie.send(add(0, lac=-1))
    assert len(bookie.send(read_lac(previous_lac=NO_LONG_POLL, timeout_ms=1000))) == 1


# -- state reloaded from storage -------------------------------------------------------------
def stored_storage(state: LedgerState, entries: dict[int, int]) -> DictStorage:
    """stored_storage returns storage that holds `state` and entries {entry id: its LAC}."""
    storage = DictStorage()
    storage.states[LEDGER_ID] = state
    for entry_id, lac in entries.items():
        entry = make_entry(entry_id, lac=lac)
        storage.entries[(LEDGER_ID, entry_id)] = pack_entry(entry.lac, entry.digest, entry.payload)
    return storage


def test_lac_is_recovered_from_the_stored_last_entry():
    bookie = Bookie(stored_storage(LedgerState(master_key=MASTER_KEY), {0: -1, 1: 0, 2: 1}))
    reply = the_reply(bookie.send(read_lac()))
    assert (reply.response.lac, reply.response.last_entry_id) == (1, 2)


def test_lac_is_recovered_from_the_stored_explicit_lac_when_higher():
    bookie = Bookie(stored_storage(LedgerState(master_key=MASTER_KEY, explicit_lac=2), {0: -1, 1: 0, 2: 1}))
    assert bookie.handler.lac(LEDGER_ID) == 2


def test_stored_fence_is_honoured_after_reload():
    bookie = Bookie(stored_storage(LedgerState(fenced=True, master_key=MASTER_KEY), {0: -1}))
    assert the_reply(bookie.send(add(1, lac=0))).response.status == Status.FENCED


def test_stored_master_key_is_honoured_after_reload():
    bookie = Bookie(stored_storage(LedgerState(master_key=MASTER_KEY), {0: -1}))
    assert the_reply(bookie.send(add(1, key=OTHER_KEY))).response.status == Status.UNAUTHORIZED


def test_stored_entries_are_readable_after_reload():
    bookie = Bookie(stored_storage(LedgerState(master_key=MASTER_KEY), {0: -1, 1: 0}))
    assert the_reply(bookie.send(read(0, 1))).response.entries == [make_entry(0), make_entry(1, lac=0)]


def test_pack_entry_unpack_entry_round_trip():
    entry = make_entry(3, b"", lac=2)
    assert unpack_entry(LEDGER_ID, 3, pack_entry(entry.lac, entry.digest, entry.payload)) == entry


# -- requests outside the limits (issue 11) ---------------------------------------------------
def bad_request(replies: list[Reply]) -> str:
    """bad_request asserts one non-durable BAD_REQUEST reply and returns its message."""
    reply = the_reply(replies)
    assert (reply.response.status, reply.durable) == (Status.BAD_REQUEST, False), reply
    return reply.response.message


def test_add_to_a_negative_ledger_id_is_a_bad_request_and_stores_nothing():
    bookie = Bookie()
    assert "ledger id -5" in bad_request(bookie.send(add(0, ledger_id=-5)))
    assert of_type(bookie.commands, StoreEntries) == of_type(bookie.commands, StoreLedgerState) == []


def test_entry_id_above_the_storage_limit_is_a_bad_request_and_stores_nothing():
    bookie = Bookie(limits=BookieLimits(max_entry_id=(1 << 40) - 1))
    assert "entry id 1099511627776" in bad_request(bookie.send(add(1 << 40)))
    assert of_type(bookie.commands, StoreEntries) == of_type(bookie.commands, StoreLedgerState) == []
    assert the_reply(bookie.send(add((1 << 40) - 1, lac=-1))).response.status == Status.OK


def test_read_of_an_entry_id_out_of_range_is_a_bad_request():
    bookie = Bookie(limits=BookieLimits(max_entry_id=100))
    bookie.send(add(0))
    assert "entry id -1" in bad_request(bookie.send(read(-1)))
    assert "entry id 101" in bad_request(bookie.send(read(101)))


def test_digest_longer_than_255_bytes_is_a_bad_request_not_an_io_error():
    bookie = Bookie()
    entry = make_entry(0)._replace(digest=b"d" * 256)
    request = AddRequest(txn=1, ledger_id=LEDGER_ID, master_key=MASTER_KEY, entries=[entry])
    assert "digest of 256 bytes" in bad_request(bookie.send(request))


def test_entry_carrying_a_lac_not_below_its_own_id_is_a_bad_request():
    bookie = Bookie()
    assert "LAC 5" in bad_request(bookie.send(add(3, lac=5)))
    assert "LAC -7" in bad_request(bookie.send(add(3, lac=-7)))


def test_oversized_master_key_is_a_bad_request():
    bookie = Bookie()
    assert "master key of 65 bytes" in bad_request(bookie.send(add(0, key=b"k" * 65)))
    assert "master key of 65 bytes" in bad_request(bookie.send(fence(key=b"k" * 65)))


def test_write_lac_out_of_range_is_a_bad_request():
    bookie = Bookie()
    bookie.send(add(0))
    request = WriteLacRequest(txn=9, ledger_id=LEDGER_ID, master_key=MASTER_KEY, lac=-3)
    assert "LAC -3" in bad_request(bookie.send(request))


def test_long_poll_timeout_is_capped():
    bookie = Bookie(limits=BookieLimits(max_long_poll_ms=500))
    bookie.send(add(0, lac=-1))
    bookie.tick(0)
    bookie.send(read_lac(previous_lac=-1, timeout_ms=49 * 24 * 3600 * 1000))
    assert bookie.tick(499) == []
    reply = the_reply(bookie.tick(500))
    assert (reply.response.status, reply.response.lac) == (Status.OK, -1)


def test_long_polls_beyond_the_cap_get_too_many_requests():
    bookie = Bookie(limits=BookieLimits(max_long_polls=2))
    bookie.send(add(0, lac=-1))
    assert bookie.send(read_lac(previous_lac=-1, timeout_ms=1000)) == []
    assert bookie.send(read(0, previous_lac=-1, timeout_ms=1000)) == []
    reply = the_reply(bookie.send(read_lac(previous_lac=-1, timeout_ms=1000)))
    assert (reply.response.status, reply.durable) == (Status.TOO_MANY_REQUESTS, False)
    assert bookie.handler.poll_count == 2


def test_long_polls_of_a_peer_that_went_away_are_answered_and_dropped():
    bookie = Bookie()
    bookie.send(add(0, lac=-1))
    bookie.send(read_lac(previous_lac=-1, timeout_ms=60_000))
    other = bookie.handler.step(b"client-2", read_lac(previous_lac=-1, timeout_ms=60_000))
    assert other == [] and bookie.handler.poll_count == 2
    replies = bookie.storage.apply(bookie.handler.peer_gone(PEER))
    assert [r.peer for r in replies] == [PEER]
    assert bookie.handler.poll_count == 1


def test_malformed_requests_change_no_state():
    """A refused request leaves the ledger as it was: no master key claimed, no fence, no LAC."""
    bookie = Bookie(limits=BookieLimits(max_entry_id=1000))
    bad_request(bookie.send(add(0, 5000, key=OTHER_KEY)))
    assert bookie.handler.lac(LEDGER_ID) == -1
    assert bookie.storage.states == {}
    assert the_reply(bookie.send(add(0))).response.status == Status.OK


def test_the_lafr_writers_send_is_reported_by_lac_reads_and_never_passes_the_lac():
    bookie = Bookie()
    entries = [make_entry(i, lac=i - 1) for i in range(4)]
    bookie.send(AddRequest(txn=1, ledger_id=LEDGER_ID, master_key=MASTER_KEY, entries=entries[:3], lafr=0))
    (reply,) = bookie.send(ReadLacRequest(txn=2, ledger_id=LEDGER_ID))
    assert (reply.response.lac, reply.response.lafr) == (1, 0)
    bookie.send(AddRequest(txn=3, ledger_id=LEDGER_ID, master_key=MASTER_KEY, entries=entries[3:], lafr=9))
    (reply,) = bookie.send(ReadLacRequest(txn=4, ledger_id=LEDGER_ID))
    assert (reply.response.lac, reply.response.lafr) == (2, 2)       # a LAFR past the LAC is clamped to it


def test_a_negative_lafr_below_minus_one_is_a_bad_request():
    bookie = Bookie()
    (reply,) = bookie.send(AddRequest(txn=1, ledger_id=LEDGER_ID, master_key=MASTER_KEY, entries=[make_entry(0)],
                                      lafr=-5))
    assert reply.response.status == Status.BAD_REQUEST and "LAFR" in reply.response.message


# -- unbounded ledgers: terms and truncation (docs/internals/protocol.md#unbounded-ledgers) ---------
def term_add(bookie: "Bookie", *entry_ids: int, term: int = 0, truncate: bool = False, recovery: bool = False,
        payload: bytes | None = None):
    entries = [make_entry(i, payload, lac=i - 1) for i in entry_ids]
    (reply,) = bookie.send(AddRequest(txn=1, ledger_id=LEDGER_ID, master_key=MASTER_KEY, entries=entries,
                                      term=term, truncate=truncate, recovery=recovery))
    return reply


def test_a_request_from_a_lower_term_gets_invalid_term_and_a_higher_one_is_adopted_durably():
    bookie = Bookie()
    assert term_add(bookie, 0, term=1).response.status == Status.OK
    (fence,) = bookie.send(ReadLacRequest(txn=2, ledger_id=LEDGER_ID, fence=True, master_key=MASTER_KEY, term=2))
    assert fence.response.status == Status.OK and fence.durable
    assert bookie.storage.states[LEDGER_ID].term == 2 and not bookie.storage.states[LEDGER_ID].fenced
    refused = term_add(bookie, 1, term=1)
    assert refused.response.status == Status.INVALID_TERM and "term 2" in refused.response.message
    assert term_add(bookie, 1, term=0).response.status == Status.INVALID_TERM       # term-less: stale too
    (read,) = bookie.send(ReadRequest(txn=3, ledger_id=LEDGER_ID, entry_ids=[0], fence=True,
                                      master_key=MASTER_KEY, term=1))
    assert read.response.status == Status.INVALID_TERM
    (plain,) = bookie.send(ReadRequest(txn=4, ledger_id=LEDGER_ID, entry_ids=[0]))      # plain reads: no term
    assert plain.response.status == Status.OK and [e.entry_id for e in plain.response.entries] == [0]
    assert term_add(bookie, 1, term=3).response.status == Status.OK                          # adopts term 3
    assert bookie.storage.states[LEDGER_ID].term == 3


def test_a_truncating_add_drops_every_entry_above_it_even_after_a_restart():
    bookie = Bookie()
    term_add(bookie, 0, 1, 2, 3, term=1)
    truncate = term_add(bookie, 1, term=2, truncate=True, recovery=True, payload=b"noop")
    assert truncate.response.status == Status.OK and truncate.durable
    (read,) = bookie.send(ReadRequest(txn=5, ledger_id=LEDGER_ID, entry_ids=[0, 1, 2, 3]))
    assert [(e.entry_id, e.payload) for e in read.response.entries] == [(0, b"e0"), (1, b"noop")]
    (lac,) = bookie.send(ReadLacRequest(txn=6, ledger_id=LEDGER_ID))
    assert lac.response.last_entry_id == 1
    restarted = Bookie(bookie.storage)            # the handler re-reads the ledger from storage
    (lac,) = restarted.send(ReadLacRequest(txn=7, ledger_id=LEDGER_ID))
    assert lac.response.last_entry_id == 1 and lac.response.lac == 0
    assert term_add(restarted, 2, term=2).response.status == Status.OK                  # the new term writes on
    (read,) = restarted.send(ReadRequest(txn=8, ledger_id=LEDGER_ID, entry_ids=[2, 3]))
    assert [e.entry_id for e in read.response.entries] == [2]


def cleaning(bookie: "Bookie", truncate_from: int, term: int, **fields):
    (reply,) = bookie.send(AddRequest(txn=9, ledger_id=LEDGER_ID, master_key=MASTER_KEY, entries=[], term=term,
                                      truncate=True, truncate_from=truncate_from, **fields))
    return reply


def test_a_cleaning_drops_every_entry_from_its_id_on_durably_and_adopts_the_term():
    bookie = Bookie()
    term_add(bookie, 0, 1, 2, 3, 4, term=1)                  # an older term's entries, 2-4 never recovered
    reply = cleaning(bookie, 2, term=3)
    assert reply.response.status == Status.OK and reply.durable and reply.response.entry_ids == []
    (read,) = bookie.send(ReadRequest(txn=5, ledger_id=LEDGER_ID, entry_ids=[0, 1, 2, 3, 4]))
    assert [e.entry_id for e in read.response.entries] == [0, 1]
    state = bookie.storage.states[LEDGER_ID]
    assert state.term == 3 and state.truncated == (3, 2)
    restarted = Bookie(bookie.storage)
    (lac,) = restarted.send(ReadLacRequest(txn=7, ledger_id=LEDGER_ID))
    assert lac.response.last_entry_id == 1
    assert cleaning(Bookie(), 5, term=2).response.status == Status.OK       # a bookie holding nothing of it


def test_a_late_or_duplicated_cleaning_never_drops_what_the_term_wrote_after_it():
    bookie = Bookie()
    term_add(bookie, 0, 1, term=1)
    cleaning(bookie, 2, term=2)
    term_add(bookie, 2, 3, term=2, truncate=True)             # the writer's adds after the cleaning
    assert cleaning(bookie, 2, term=2).response.status == Status.OK
    (read,) = bookie.send(ReadRequest(txn=5, ledger_id=LEDGER_ID, entry_ids=[0, 1, 2, 3]))
    assert [e.entry_id for e in read.response.entries] == [0, 1, 2, 3]
    assert cleaning(bookie, 0, term=1).response.status == Status.INVALID_TERM


@pytest.mark.parametrize("fields, says", [
    (dict(truncate=False, term=2), "truncate_from goes with"),
    (dict(truncate=True, term=0), "truncate_from goes with"),
    (dict(truncate=True, term=2, entries=[make_entry(0)]), "truncate_from goes with"),
    (dict(truncate=True, term=2, truncate_from=-5), "out of range"),
])
def test_a_malformed_cleaning_is_a_bad_request(fields, says):
    request = dict(txn=1, ledger_id=LEDGER_ID, master_key=MASTER_KEY, entries=[], truncate_from=3)
    request.update(fields)
    assert says in bad_request(Bookie().send(AddRequest(**request)))


def test_a_truncating_add_without_a_term_is_a_bad_request():
    reply = term_add(Bookie(), 0, truncate=True)
    assert reply.response.status == Status.BAD_REQUEST and "truncating" in reply.response.message


@pytest.mark.parametrize("bad, says", [
    (lambda e: e._replace(lac=e.entry_id), "carries LAC 7"),
    (lambda e: e._replace(lac=-2), "carries LAC -2"),
    (lambda e: e._replace(entry_id=-1), "entry id -1"),
    (lambda e: e._replace(ledger_id=LEDGER_ID + 1), "does not belong to ledger"),
    (lambda e: e._replace(digest=b"d" * 256), "digest of 256 bytes"),
])
def test_one_bad_entry_in_the_middle_of_a_batch_refuses_the_batch_and_is_named(bad, says):
    bookie = Bookie()
    entries = [make_entry(i, lac=i - 1) for i in range(20)]
    entries[7] = bad(entries[7])
    request = AddRequest(txn=1, ledger_id=LEDGER_ID, master_key=MASTER_KEY, entries=entries)
    assert says in bad_request(bookie.send(request))
    assert of_type(bookie.commands, StoreEntries) == []
    good = AddRequest(txn=2, ledger_id=LEDGER_ID, master_key=MASTER_KEY,
                      entries=[make_entry(i, lac=i - 1) for i in range(20)])
    assert the_reply(bookie.send(good)).response.status == Status.OK
