"""walkit.core.writer is the state machine of a ledger's single writer.

The writer assigns entry ids, signs entries, tracks which bookies acknowledged each pending add
and completes adds strictly in entry order (docs/internals/protocol.md#ack-quorum):

- an add completes once Qa bookies of its write set acknowledged it AND every lower entry
  completed; the LAC is the highest completed entry and travels with every add;
- a bookie that refuses an add (other than FENCED/UNAUTHORIZED), cannot be reached, or does not
  answer within `add_timeout_ms` is replaced by a live bookie outside the ensemble: the new
  fragment starts at LAC + 1 and is written by compare-and-swap; while that change is in flight
  no add completes, and unacknowledged adds are re-sent to the replacement only after the CAS
  succeeded (ordering contract: docs/internals/protocol.md#ensemble-change);
- when no bookie outside the ensemble is free, a bookie that failed by being unreachable (its
  connection closed: a restart) and is registered again within `add_timeout_ms` of that is
  used again in place: its unacknowledged adds are re-sent to it, and the metadata does not
  change. A bookie that stopped answering on a live connection is never retried in place;
- on a CAS conflict the writer re-reads: if the ledger is no longer OPEN (someone is recovering
  it) every pending add fails with LedgerFenced, otherwise the change is retried on the new
  metadata (docs/internals/protocol.md#ensemble-change);
- an acknowledgement counts only from the disk the current fragment records for the bookie
  (`metadata.disks`): a bookie that answers from another disk had its storage emptied and
  formatted since (it lost what it acknowledged, and the fences recovery put on it, so a
  writer that counted it could complete an add on a ledger recovery closed). Its
  acknowledgements of pending adds are forgotten and it is replaced like a failed bookie; it
  may take its own place again, in a new fragment that records its new disk;
- FENCED from any bookie ends the writer: pending and later adds fail with LedgerFenced;
- closing waits for pending adds, then writes CLOSED with the LAC; a conflict follows
  docs/internals/protocol.md#closing: IN_RECOVERY is an error, CLOSED at the same last entry is
  success, any other is an error;
- a metadata write whose outcome is unknown never ends the writer: the dispatcher re-reads and
  reports what the store holds (walkit.core.dispatch); MetadataFailed means the ledger is gone.

An idle writer sends its LAC explicitly (WriteLac) so tailing readers are not one entry behind,
and again, to the bookies that did not acknowledge it, every explicit_lac_ms while it stays idle.

Backpressure: at most `max_bytes_in_flight` payload bytes are sent and not yet confirmed (with
guaranteed write quorum: not yet fully replicated); later appends wait in the writer, in order,
without an entry id, and are sent as earlier ones complete (one entry is always let through,
whatever its size). So a caller with a large window of large entries never makes every bookie
pass the add timeout at once, and an add's timeout runs from when it was sent.

Guaranteed write quorum (`metadata.guaranteed_write_quorum`; Vanlightly's "Tweaking the
BookKeeper protocol", the TLA+ spec ProtocolWithGuaranteedWriteQuorum) changes four things:

- adds are still acknowledged at Qa, but an add leaves the pending list only once it and every
  lower entry reached all Qw bookies of its write set: the Last Add Fully Replicated (LAFR),
  sent to bookies with every add so recovery can start after it;
- an ensemble change starts the new fragment at LAFR + 1, so every confirmed entry that is not
  on Qw bookies yet moves to the new write sets and is sent again;
- a bookie that acknowledged a confirmed entry above the LAFR is pinned: replacing it would
  leave that entry on fewer than Qa bookies of its write set. A failed pinned bookie is retried
  in place; if it still fails `add_timeout_ms` later the writer fails (NotEnoughBookies) and
  recovery, which also waits for Qw, finishes the ledger;
- close waits until every entry reached Qw.

So every entry of all but the last fragment, and every entry of a closed ledger, is on Qw
bookies (the spec's TailFragmentsReachWriteQuorum and AllEntriesOfClosedLedgerReachedWriteQuorum).

Forces (`ForceRequested`): a force completes (CompleteForce) once the LAC reaches the last
entry appended before it, queued appends included. On an ordinary ledger that is when those
adds complete. Deferred sync (`deferred_sync=True`, BookKeeper's WriteFlag.DEFERRED_SYNC)
separates the two:

- bookies acknowledge adds once stored, before their sync; an add completes (CompleteAdds)
  at Qa such acknowledgements, in order, and `last_add_acked` follows it;
- the LAC moves only over forced entries, so readers never see an entry a crash could take
  back: the writer sends SendForce to every bookie of the ensemble, a bookie answers after
  its sync, and an entry is forced once Qa bookies of its write set each acknowledged it
  before the writer sent them a force they answered, from the same bookie run (`instance`).
  "Acknowledged before the force was sent" needs no ordering from the network: the bookie
  answered the add before it saw the force. Entries stay in the pending list (and count in
  bytes in flight) until forced;
- forces run in rounds, one at a time: one is started by a force request, by appends that
  must queue (so a writer that never forces still makes progress), by close (which forces
  everything first) and, while anything waits for one, by every tick after the last round;
- the ensemble never changes (as in BookKeeper): a bookie that fails, does not answer, or
  answers from a new instance (it restarted, and may have lost acknowledged, unforced
  entries) ends the writer with NotEnoughBookies. Recovery then closes the ledger with every
  forced entry, and possibly some unforced ones that survived.

Unbounded ledgers (`metadata.unbounded`, docs/internals/protocol.md#unbounded-ledgers): the writer
writes in the metadata's term (every add carries it; a bookie in a higher term answers INVALID_TERM
and the writer stops with LedgerFenced), starts after `last_entry_id` (the no-op its recovery
wrote), and treats metadata of another term as fenced. A bookie that joins through an ensemble
change may hold dirty entries of an earlier term above the entries it gets, so every add of an
unbounded ledger has the truncate flag: the bookie drops what it holds above the add, unless it
applied a later truncation already, so reordered or duplicated adds never drop what later ones
wrote.

Rotation (unbounded ledgers only; docs/internals/protocol.md#truncation: "a maximum size per
fragment which would trigger an ensemble change once the current fragment has reached capacity"). A
bookie gives back the space of entries below `metadata.first_entry_id` only up to the start of the
last fragment (walkit.bookie.server: recovery reads from there), so a fragment that never ends
bounds nothing truncation can free. With `fragment_max_entries`, `fragment_max_bytes` or
`fragment_max_ms` (0 turns each off) the writer starts a new fragment once the current one
holds that many entries on all Qw bookies (counted by entry id, so a takeover sees its
predecessors' entries), that many payload bytes of this writer's fully replicated entries, or
once this writer has written in it that long. These are thresholds: the new fragment starts
after the LAFR, so the old one also keeps what reached Qw together with the entry that passed
the limit (at most about `max_bytes_in_flight` more). A rotation is an ensemble change with no
failed bookie, through the same states and rules:

- CHOOSING asks for every writable bookie (ChooseBookies with nothing excluded, the movable
  bookies as `replacing`, so placement picks their successors); CHANGING writes the fragment
  at LAFR + 1 by compare-and-swap; no add completes meanwhile, and once the CAS succeeded the
  pending adds are sent to the bookies new in their write sets;
- each position gets a bookie outside the current ensemble where one is writable (placement
  order), else keeps its bookie if that is writable and on the disk the fragment records; so
  on a cluster with no spare bookie the new fragment has the same bookies, and still ends
  what the old one holds. A pinned bookie always keeps its position (its confirmed entries
  above the LAFR stay on Qa bookies of their write sets); kept bookies keep the disks the
  fragment recorded, new ones the disks they registered with;
- it never fails the writer: a position nothing can fill, or no answer within
  `add_timeout_ms`, puts the rotation off for ROTATE_RETRY_MS; a bookie that fails while it
  is under way turns it into the ordinary ensemble change; a CAS conflict re-reads as any
  change does (then the next completion starts it again);
- it starts only when the fragment holds a fully replicated entry of its own (so the new one
  starts after the old one's start), while nothing failed and no close was requested, and
  never while the ledger has MAX_ROTATED_FRAGMENTS fragments (the metadata of a ledger nobody
  truncates stays bounded). Truncation drops old fragments without telling the writer, so a
  writer held at that many reads the metadata again every ROTATE_RETRY_MS (ReadLedgerMetadata)
  and takes a newer version that differs only before its last fragment, then rotates.

Bookies brought into an unbounded ledger by a change (a replacement, a rotation, or a bookie
back on a new disk taking its own place) are cleaned first: each must answer, from the disk the
proposal records, an empty truncating add at (term, fragment start), which makes it drop every
entry it holds from the fragment's start on, before the CAS names it. Such a bookie may
hold an older term's entries there (it was out of the last fragment when the takeover's no-op
truncated the others), and without the cleaning a later takeover's recovery could read one of
them in place of an entry this writer had acknowledged
(docs/internals/protocol.md#stale-bookie). A bookie that refuses or does not answer within
`add_timeout_ms` is left out of the next choice (for CHOOSE_RETRY_MS) and the writer chooses
again; a rotation is put off. Entries this writer sent to it earlier in the term carry later
truncation marks, so a late or duplicated cleaning never drops them.

States (`WriterState`, transitions in `_TRANSITIONS`, each one asserted):

    WRITING   adds flow; completions happen only here
    CHOOSING  a bookie failed, or the fragment is full: waiting for candidates (BookiesChosen)
    CLEANING  unbounded ledgers: the bookies a new fragment brings in are dropping an older
              term's entries from its start on (below), before the CAS proposes them
    CHANGING  the CAS of a new fragment is in flight
    CLOSING   the CAS of CLOSED is in flight (close requested and nothing pending)
    CLOSED    final: the ledger is closed at last_add_confirmed
    FAILED    final: `error` says why; every pending and later add failed

A close requested while adds are pending or an ensemble change runs is remembered
(`close_requested`): appends are refused from then on, and the writer moves to CLOSING once it is
back in WRITING with nothing pending.
"""

from __future__ import annotations

import enum
from collections import deque

from walkit.core import events as ev
from walkit.core.digest import Digest
from walkit.core.distribution import write_sets_of
from walkit.core.messages import NOOP_PAYLOAD, Entry, Status
from walkit.core import metadata as ledger_states
from walkit.core.metadata import LedgerMetadata
from walkit.core.messages import refusal as _refusal
from walkit.errors import ConfigError, LedgerClosed, LedgerFenced, NotEnoughBookies, Unauthorized, WalkitError

#: How long the writer waits before asking again for bookies when none could replace a failure.
CHOOSE_RETRY_MS = 200
#: How long a rotation that could not be placed (or got no answer) is put off.
ROTATE_RETRY_MS = 1000
#: A ledger with this many fragments does not rotate: each costs ~100 bytes of metadata, and a
#: store's values are bounded (etcd 1.5 MiB, ZooKeeper 1 MiB); truncation drops old fragments.
MAX_ROTATED_FRAGMENTS = 1000


class WriterState(str, enum.Enum):
    """WriterState is where a LedgerWriter is in its life (see the module doc)."""

    WRITING = "WRITING"
    CHOOSING = "CHOOSING"
    CLEANING = "CLEANING"
    CHANGING = "CHANGING"
    CLOSING = "CLOSING"
    CLOSED = "CLOSED"
    FAILED = "FAILED"


WRITING, CHOOSING, CLEANING, CHANGING, CLOSING, CLOSED, FAILED = WriterState

_TRANSITIONS = {
    WRITING: {CHOOSING, CLOSING, FAILED},
    CHOOSING: {CLEANING, CHANGING, WRITING, FAILED},
    CLEANING: {CHANGING, CHOOSING, FAILED},
    CHANGING: {WRITING, FAILED},
    CLOSING: {CLOSING, CLOSED, FAILED},
    CLOSED: set(),
    FAILED: set(),
}


class _Pending:
    """_Pending is one add that is not complete yet: its entry and who acknowledged it.

    With deferred sync, `rounds` maps each bookie that acknowledged it to the number of force
    rounds sent before that acknowledgement arrived.
    """

    __slots__ = ("entry", "acked", "sent_ms", "rounds")

    def __init__(self, entry: Entry, sent_ms: int) -> None:
        self.entry = entry
        self.acked: set[str] = set()
        self.sent_ms = sent_ms
        self.rounds: dict[str, int] | None = None


#: The default of `max_bytes_in_flight`: payload bytes sent to bookies and not yet complete.
DEFAULT_MAX_BYTES_IN_FLIGHT = 32 * 1024 * 1024
#: The fragment size at which walkit.Client's unbounded ledgers rotate by default: a log's
#: `roll_bytes` (walkit.core.loglist.LogConfig), so an unbounded log and a list of ledgers leave
#: as much behind a truncation; at ~100 bytes of metadata a fragment, 1.5 KB per GB written.
DEFAULT_FRAGMENT_MAX_BYTES = 64 * 1024 * 1024


class LedgerWriter:
    """LedgerWriter drives one open ledger; feed it events with `step`, act on its commands.

    `metadata` and `version` are the ledger's metadata as created (state OPEN). `digest` signs
    entries and `master_key` proves the password to bookies. The writer never performs I/O:
    time comes from Ticked events and bookie choice from BookiesChosen events.
    `fragment_max_entries`, `fragment_max_bytes` and `fragment_max_ms` rotate an unbounded
    ledger's fragments (see the module doc; 0, the default, turns each off).
    """

    #: Acknowledgements count only from the disk the current fragment records (metadata.disks);
    #: a test's broken writer turns it off to show the simulator's checker notices.
    CHECK_DISKS = True
    #: Bookies a change brings into an unbounded ledger drop an older term's entries first (module
    #: doc); a test's broken writer turns it off to show the simulator's checker notices.
    CLEAN_JOINING_BOOKIES = True

    def __init__(self, metadata: LedgerMetadata, version: int, *, master_key: bytes, digest: Digest,
                 add_timeout_ms: int = 5000, explicit_lac_ms: int = 100, now_ms: int = 0,
                 last_entry_id: int = -1, max_bytes_in_flight: int = DEFAULT_MAX_BYTES_IN_FLIGHT,
                 deferred_sync: bool = False, fragment_max_entries: int = 0, fragment_max_bytes: int = 0,
                 fragment_max_ms: int = 0) -> None:
        if metadata.state != ledger_states.OPEN:
            raise LedgerClosed(f"ledger {metadata.ledger_id} is {metadata.state}, not OPEN")
        if deferred_sync and (metadata.guaranteed_write_quorum or metadata.unbounded):
            raise ConfigError("deferred sync cannot be combined with guaranteed write quorum or unbounded ledgers")
        limits = {"fragment_max_entries": fragment_max_entries, "fragment_max_bytes": fragment_max_bytes,
                  "fragment_max_ms": fragment_max_ms}
        for name, value in limits.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{name} must be a non-negative integer (0: no limit), got {value!r}")
        if any(limits.values()) and not metadata.unbounded:
            raise ConfigError(f"ledger {metadata.ledger_id} is not unbounded: only unbounded ledgers rotate fragments")
        self.fragment_max_entries = fragment_max_entries
        self.fragment_max_bytes = fragment_max_bytes
        self.fragment_max_ms = fragment_max_ms
        self._rotates = any(limits.values())
        self._rotating = False                      # the change under way is a rotation
        self._rotate_after_ms = 0                   # no rotation before (one was put off)
        self.rotations_put_off = 0                  # rotations that went back to the current fragment
        self.rotation_put_off_because = ""          # why the last one did
        self._fragment_bytes = 0                    # payload bytes this writer fully replicated in the fragment
        self._fragment_since_ms = now_ms            # when this writer began writing in the fragment
        self.deferred_sync = deferred_sync
        self.metadata = metadata
        self.version = version
        self.ledger_id = metadata.ledger_id
        self.master_key = master_key
        self.add_timeout_ms = add_timeout_ms
        self.explicit_lac_ms = explicit_lac_ms
        self.state = WRITING
        self.close_requested = False
        # An unbounded ledger's writer in a later term starts after the no-op its recovery wrote.
        self.last_add_confirmed = self.last_add_pushed = self.last_add_fully_replicated = last_entry_id
        self.last_add_acked = last_entry_id       # completed to the caller (ahead of the LAC with deferred sync)
        self._forces: deque[tuple[int, int]] = deque()   # (last entry to force, token), targets ascending
        self._round = 0                                  # force rounds sent
        self._forcing: dict[str, int] = {}               # bookie -> the round whose answer is awaited
        self._forced: dict[str, int] = {}                # bookie -> the last round it answered
        self._instances: dict[str, int] = {}             # bookie -> the instance that answered first
        self._gwq = metadata.guaranteed_write_quorum
        self.term = metadata.term if metadata.unbounded else 0
        self._pinned_since: dict[str, int] = {}     # pinned bookie -> when it first failed
        self._in_place: set[str] = set()            # pinned bookies retried in place by the change in flight
        self.error: WalkitError | None = None
        self._sign = digest.sign
        self._pending: deque[_Pending] = deque()
        self._queued: deque[bytes] = deque()        # appends waiting for bytes in flight to fall
        self.max_bytes_in_flight = max_bytes_in_flight
        self.bytes_in_flight = 0                    # payload bytes of _pending
        self._write_sets = write_sets_of(metadata.current_ensemble, metadata.write_quorum)
        self._disks = _current_disks(metadata)      # bookie -> the disk the current fragment records
        self._gone: dict[str, set[int]] = {}        # bookie -> its disks known replaced (late acks ignored)
        self._failed: dict[str, str] = {}           # bookie -> why, awaiting replacement
        self._unreachable_since: dict[str, int] = {}  # bookie -> when it first became unreachable
        self._replacements: dict[str, str] | None = None   # old -> new, while CLEANING and CHANGING
        self._proposal: LedgerMetadata | None = None       # the fragment proposed once cleaning is done
        self._cleaning: dict[str, int] = {}                # joining bookie -> its proposed disk, unanswered
        self._cleaning_since = 0
        self._unclean: dict[str, int] = {}                 # refused or missed a cleaning -> left out until
        self._change_started_ms = 0
        self._choose_again_ms: int | None = None
        self._now = now_ms
        self._last_add_ms = now_ms
        self._lac_sent = last_entry_id
        self._lac_sent_ms = now_ms
        self._lac_written: dict[str, int] = {}      # bookie -> the highest explicit LAC it acknowledged
        self._handlers = {
            ev.AppendRequested: self._on_append, ev.AddsAcked: self._on_acked,
            ev.AddsRejected: self._on_rejected, ev.BookiesChosen: self._on_bookies_chosen,
            ev.MetadataWritten: self._on_metadata_written, ev.MetadataConflict: self._on_conflict,
            ev.MetadataFailed: self._on_metadata_failed, ev.CloseRequested: self._on_close,
            ev.Ticked: self._on_tick, ev.ForceRequested: self._on_force, ev.ForceAcked: self._on_force_acked,
            ev.LedgerMetadataRead: self._on_metadata_read, ev.LacWritten: self._on_lac_written,
        }

    # -- public ---------------------------------------------------------------------------
    def step(self, event) -> list:
        """step applies one event and returns the commands the shell must carry out, in order."""
        return self._handlers[type(event)](event)

    @property
    def closed(self) -> bool:
        """closed is True once the ledger is closed by this writer."""
        return self.state is CLOSED

    @property
    def pending_count(self) -> int:
        """pending_count is the number of adds sent but not yet complete."""
        return len(self._pending)

    @property
    def queued_count(self) -> int:
        """queued_count is the number of appends waiting for bytes in flight to fall (no entry id yet)."""
        return len(self._queued)

    @property
    def changing_ensemble(self) -> bool:
        """changing_ensemble is True while failure handling (an ensemble change) is under way."""
        return self.state is CHOOSING or self.state is CLEANING or self.state is CHANGING

    def _to(self, state: WriterState) -> None:
        """_to moves to `state`, asserting the transition is one the writer allows."""
        assert state in _TRANSITIONS[self.state], f"ledger {self.ledger_id}: writer cannot go {self.state.name} -> {state.name}"
        self.state = state

    # -- appends --------------------------------------------------------------------------
    def _on_append(self, event: ev.AppendRequested) -> list:
        first = self.last_add_pushed + 1
        if self.error is not None or self.close_requested or self.state is CLOSED:
            # Refused appends take no entry ids: the next ids stay with whatever comes next.
            error = self.error or LedgerClosed(f"ledger {self.ledger_id} is closed")
            return [ev.FailAdds(ledger_id=self.ledger_id, first_entry_id=first, error=error)]
        if self.term and NOOP_PAYLOAD in event.payloads:
            return [ev.FailAdds(ledger_id=self.ledger_id, first_entry_id=first, error=ConfigError(
                "an unbounded ledger cannot take the payload its recoveries use as a no-op"))]
        queued = self._queued
        if not queued and self.bytes_in_flight + sum(map(len, event.payloads)) <= self.max_bytes_in_flight:
            payloads = event.payloads                  # the common case: everything goes at once
        else:
            queued.extend(event.payloads)
            payloads = self._release()
        self._last_add_ms = self._now
        commands = self._push(payloads)
        if queued and self.deferred_sync:       # unforced entries fill the window: force them out
            commands += self._force_round()
        return commands

    def _release(self) -> list[bytes]:
        """_release takes the queued appends that fit under max_bytes_in_flight (at least one if none is in flight)."""
        queued, limit, taken = self._queued, self.max_bytes_in_flight, []
        in_flight = self.bytes_in_flight
        while queued and (in_flight + len(queued[0]) <= limit or (in_flight == 0 and not taken)):
            payload = queued.popleft()
            in_flight += len(payload)
            taken.append(payload)
        return taken

    def _push(self, payloads: list[bytes]) -> list:
        """_push gives `payloads` the next entry ids and sends them to their write sets."""
        if not payloads:
            return []
        sends: dict[str, list[Entry]] = {}
        ledger_id, lac, sign, now = self.ledger_id, self.last_add_confirmed, self._sign, self._now
        write_sets, size, failed, pending = self._write_sets, len(self._write_sets), self._failed, self._pending
        entry_id = self.last_add_pushed + 1
        sent_bytes = 0
        new_entry = tuple.__new__                   # Entry(...) without its Python-level __new__
        for payload in payloads:
            entry = new_entry(Entry, (ledger_id, entry_id, lac, sign(ledger_id, entry_id, lac, payload), payload))
            pending.append(_Pending(entry, now))
            sent_bytes += len(payload)
            for bookie in write_sets[entry_id % size]:
                if bookie not in failed:
                    batch = sends.get(bookie)
                    if batch is None:
                        sends[bookie] = [entry]
                    else:
                        batch.append(entry)
            entry_id += 1
        self.last_add_pushed = entry_id - 1
        self.bytes_in_flight += sent_bytes
        return self._sends(sends)

    def _sends(self, sends: dict[str, list[Entry]]) -> list:
        """_sends turns entries per bookie into SendAdds (with the LAFR, and the term for unbounded ledgers)."""
        lafr, term = self.last_add_fully_replicated, self.term
        deferred = self.deferred_sync
        return [ev.SendAdds(bookie=b, ledger_id=self.ledger_id, master_key=self.master_key, entries=entries,
                            lafr=lafr, term=term, truncate=term > 0, deferred_sync=deferred)
                for b, entries in sends.items()]

    def _on_acked(self, event: ev.AddsAcked) -> list:
        pending, bookie = self._pending, event.bookie
        if not event.entry_ids:                  # a cleaning's answer (only cleanings carry no entries)
            return self._on_cleaning_answered(event)
        if self._disks and self.CHECK_DISKS:
            if event.disk in self._gone.get(bookie, ()):
                return []               # a late answer from a disk known replaced: it holds nothing now
            if self._disks.get(bookie, 0) not in (0, event.disk):
                return [] if self.error is not None else self._disk_replaced(bookie, event.disk)
        if not pending or self.error is not None:
            return []
        head = pending[0].entry.entry_id
        write_sets, size, count = self._write_sets, len(self._write_sets), len(pending)
        if self.deferred_sync and self._restarted(bookie, event.instance):
            return self._fail(NotEnoughBookies(
                f"bookie {bookie} restarted while writing deferred-sync ledger {self.ledger_id}, and may have lost "
                "entries it acknowledged but never made durable; recover the ledger"))
        if self._unreachable_since:
            self._unreachable_since.pop(bookie, None)
        if self._pinned_since:
            self._pinned_since.pop(bookie, None)
        deferred, round_ = self.deferred_sync, self._round
        for entry_id in event.entry_ids:
            index = entry_id - head
            if 0 <= index < count and bookie in write_sets[entry_id % size]:
                item = pending[index]
                item.acked.add(bookie)
                if deferred:
                    if item.rounds is None:
                        item.rounds = {bookie: round_}
                    else:
                        item.rounds.setdefault(bookie, round_)
        return self._complete()

    def _complete(self) -> list:
        """_complete confirms the adds that reached Qa in order; nothing completes mid-change.

        Without guaranteed write quorum a confirmed add leaves the pending list at once; with it,
        only once it and every lower add reached Qw (the LAFR advances).
        """
        if self.state is not WRITING:
            return []
        pending, quorum = self._pending, self.metadata.ack_quorum
        last = self.last_add_confirmed
        done_bytes = 0
        commands: list = []
        if self.deferred_sync:
            if pending:
                commands = self._acked(pending, quorum)
                forced = self._forced
                while pending and pending[0].entry.entry_id <= self.last_add_acked:
                    head = pending[0]
                    if sum(1 for b, r in head.rounds.items() if forced.get(b, 0) > r) < quorum:
                        break
                    pending.popleft()
                    last = head.entry.entry_id
                    done_bytes += len(head.entry.payload)
        elif not self._gwq:
            while pending and len(pending[0].acked) >= quorum:
                entry = pending.popleft().entry
                last = entry.entry_id
                done_bytes += len(entry.payload)
        elif pending:
            head, count = pending[0].entry.entry_id, len(pending)
            index = last + 1 - head              # pending holds LAFR+1..: the first unconfirmed add
            while index < count and len(pending[index].acked) >= quorum:
                index += 1
            last = max(last, head + index - 1)
            write_quorum = self.metadata.write_quorum
            while pending and pending[0].entry.entry_id <= last and len(pending[0].acked) >= write_quorum:
                entry = pending.popleft().entry
                self.last_add_fully_replicated = entry.entry_id
                done_bytes += len(entry.payload)
            self._fragment_bytes += done_bytes
        if last != self.last_add_confirmed:
            self.last_add_confirmed = last
            if not self.deferred_sync:
                self.last_add_acked = last
                commands.append(ev.CompleteAdds(ledger_id=self.ledger_id, last_entry_id=last))
            if self._forces:
                commands += self._satisfied()
        if done_bytes:
            self.bytes_in_flight -= done_bytes
            if self._queued:
                commands += self._push(self._release())
        if self.close_requested and not pending and not self._queued:
            commands.append(self._write_close())
        elif self._rotates and self._rotation_due():
            commands += self._rotation()
        return commands

    def _acked(self, pending: deque[_Pending], quorum: int) -> list:
        """_acked completes, in order, the deferred-sync adds that Qa bookies acknowledged (not yet forced)."""
        head, count = pending[0].entry.entry_id, len(pending)
        index = self.last_add_acked + 1 - head
        while index < count and len(pending[index].acked) >= quorum:
            index += 1
        acked = head + index - 1
        if acked <= self.last_add_acked:
            return []
        self.last_add_acked = acked
        return [ev.CompleteAdds(ledger_id=self.ledger_id, last_entry_id=acked)]

    # -- forces ---------------------------------------------------------------------------
    def _on_force(self, event: ev.ForceRequested) -> list:
        if self.error is not None:
            return [ev.FailForce(ledger_id=self.ledger_id, tokens=[event.token], error=self.error)]
        target = self.last_add_pushed + len(self._queued)
        if target <= self.last_add_confirmed:
            return [ev.CompleteForce(ledger_id=self.ledger_id, tokens=[event.token],
                                     last_entry_id=self.last_add_confirmed)]
        self._forces.append((target, event.token))
        return self._force_round()

    def _satisfied(self) -> list:
        """_satisfied completes the forces the LAC reached."""
        forces, lac, tokens = self._forces, self.last_add_confirmed, []
        while forces and forces[0][0] <= lac:
            tokens.append(forces.popleft()[1])
        return [ev.CompleteForce(ledger_id=self.ledger_id, tokens=tokens, last_entry_id=lac)] if tokens else []

    def _wants_force(self) -> bool:
        """_wants_force tells whether unforced entries are pending and something waits for them."""
        return bool(self._pending) and bool(self._forces or self._queued or self.close_requested)

    def _force_round(self) -> list:
        """_force_round asks every ensemble bookie to sync (deferred sync), unless a round is under way."""
        if (not self.deferred_sync or self._forcing or self.state is not WRITING
                or self.last_add_pushed <= self.last_add_confirmed):
            return []
        self._round += 1
        self._forcing = {b: self._round for b in self.metadata.current_ensemble}
        return [ev.SendForce(bookie=b, ledger_id=self.ledger_id, master_key=self.master_key) for b in self._forcing]

    def _on_force_acked(self, event: ev.ForceAcked) -> list:
        round_ = self._forcing.pop(event.bookie, None)
        if round_ is None or self.state is not WRITING:
            return []       # a late answer: closing or ended, nothing waits for it
        bookie = event.bookie
        if self._restarted(bookie, event.instance):
            return self._fail(NotEnoughBookies(
                f"bookie {bookie} restarted while writing deferred-sync ledger {self.ledger_id}, and may have lost "
                "entries it acknowledged but never made durable; recover the ledger"))
        self._forced[bookie] = round_       # rounds are answered one at a time, in order
        commands = self._complete()
        if not self._forcing and self._wants_force():
            commands += self._force_round()
        return commands

    def _restarted(self, bookie: str, instance: int) -> bool:
        """_restarted tells whether `bookie` answers from another run than the one that answered first."""
        return self._instances.setdefault(bookie, instance) != instance

    # -- failures and ensemble change ----------------------------------------------------
    def _renewed(self, bookie: str, disk: int) -> bool:
        """_renewed tells whether `bookie` now has another disk than the current fragment records (0: unknown)."""
        recorded = self._disks.get(bookie, 0)
        return recorded != 0 and disk != 0 and disk != recorded

    def _forget_acks(self, bookie: str) -> None:
        """_forget_acks drops what `bookie` acknowledged of the pending adds: its old disk is gone."""
        for pending in self._pending:
            pending.acked.discard(bookie)
            if pending.rounds is not None:
                pending.rounds.pop(bookie, None)

    def _renew(self, bookie: str) -> list:
        """_renew forgets what `bookie`'s recorded disk acknowledged: that disk is gone (replaced).

        With guaranteed write quorum a pinned bookie (it acknowledged a confirmed entry above the
        LAFR) cannot be renewed: that entry is now on fewer than Qa bookies of its write set, and
        a new fragment from LAFR + 1 would record the new disk over it. The writer fails
        (NotEnoughBookies); recovery, which counts no answer of the new disk for the old
        fragment, finishes the ledger from the other replicas.
        """
        pinned = self._pinned(bookie)
        self._gone.setdefault(bookie, set()).add(self._disks.get(bookie, 0))
        self._forget_acks(bookie)
        if pinned:
            return self._fail(NotEnoughBookies(
                f"bookie {bookie} of ledger {self.ledger_id} came back on a new disk while it held confirmed entries "
                f"that are not on Qw={self.metadata.write_quorum} bookies yet; recover the ledger"))
        return []

    def _disk_replaced(self, bookie: str, disk: int) -> list:
        """_disk_replaced handles an answer from a disk other than the one the fragment records."""
        commands = self._renew(bookie)
        if self.error is not None:
            return commands
        named = f"disk {disk:x}" if disk else "no disk (an older walkit?)"
        return self._bookie_failed(bookie, f"answered from {named}, not disk {self._disks[bookie]:x} that the "
                                           f"fragment records: its storage was replaced")

    def _on_rejected(self, event: ev.AddsRejected) -> list:
        if self.state is FAILED or self.state is CLOSED:
            return []           # a late answer: nothing is pending any more
        if event.status in (Status.FENCED, Status.INVALID_TERM):
            return self._fail(LedgerFenced(f"ledger {self.ledger_id} was fenced by another client "
                                           f"(bookie {event.bookie})"))
        if event.status == Status.UNAUTHORIZED:
            return self._fail(Unauthorized(_refusal(event, self.ledger_id)))
        if not event.entry_ids and self.term:    # a cleaning refused (unbounded ledgers send no forces)
            if self.state is CLEANING and event.bookie in self._cleaning:
                return self._not_cleaned({event.bookie})
            return []                            # a late refusal: nothing waits for it
        if event.status == Status.UNREACHABLE:
            self._unreachable_since.setdefault(event.bookie, self._now)
        return self._bookie_failed(event.bookie, f"{event.status.name}: {event.message}".rstrip(": "))

    def _bookie_failed(self, bookie: str, why: str) -> list:
        if bookie not in self.metadata.current_ensemble or bookie in self._failed:
            return []
        if self.state is CLOSING or self.state is CLOSED or self.state is FAILED:
            return []       # nothing left to write: a change now would rewrite a closing ledger
        if self.deferred_sync:
            return self._fail(NotEnoughBookies(
                f"bookie {bookie} failed ({why}) while writing deferred-sync ledger {self.ledger_id}; such a "
                "ledger never replaces bookies, as entries acknowledged but not forced could be lost: recover it"))
        self._failed[bookie] = why
        if self.state is not WRITING:
            return []      # handled once the change in flight finished
        return self._start_change()

    def _start_change(self) -> list:
        self._to(CHOOSING)
        self._change_started_ms = self._now
        self._choose_again_ms = None
        return [self._choose()]

    def _choose(self) -> ev.ChooseBookies:
        """_choose asks for replacements, and whether unreachable failed bookies came back."""
        ensemble = self.metadata.current_ensemble
        exclude = frozenset(ensemble) | frozenset(self._failed) | frozenset(self._excluded())
        recheck = frozenset(b for b in self._failed if self._retriable(b))
        return ev.ChooseBookies(ledger_id=self.ledger_id, exclude=exclude, recheck=recheck, ensemble=ensemble,
                                replacing=tuple(b for b in ensemble if b in self._failed),
                                write_quorum=self.metadata.write_quorum)

    def _retriable(self, bookie: str) -> bool:
        """_retriable tells whether a failed bookie may be used again in place (see the module doc)."""
        since = self._unreachable_since.get(bookie)
        return since is not None and self._now - since < self.add_timeout_ms

    def _fragment_start(self) -> int:
        """_fragment_start is where a new fragment begins: LAC + 1, or LAFR + 1 with guaranteed write quorum."""
        return (self.last_add_fully_replicated if self._gwq else self.last_add_confirmed) + 1

    def _pinned(self, bookie: str) -> bool:
        """_pinned tells whether `bookie` acknowledged a confirmed add above the LAFR (see the module doc)."""
        if not self._gwq or not self._pending:
            return False
        head = self._pending[0].entry.entry_id
        for index in range(min(self.last_add_confirmed + 1 - head, len(self._pending))):
            if bookie in self._pending[index].acked:
                return True
        return False

    def _on_bookies_chosen(self, event: ev.BookiesChosen) -> list:
        if self.state is not CHOOSING:
            return []
        if self._rotating:
            if not self._failed:
                return self._rotate(event)
            self._rotating = False          # a bookie failed meanwhile: an ordinary change from here
            self._change_started_ms = self._now
        ensemble = self.metadata.current_ensemble
        to_replace = [b for b in ensemble if b in self._failed]
        renewed = {b for b in to_replace if self._renewed(b, event.disks.get(b, 0))}
        for bookie in sorted(renewed):
            commands = self._renew(bookie)
            if self.error is not None:
                return commands
        pinned = {b for b in to_replace if b not in renewed and self._pinned(b)}
        if pinned:
            for bookie in sorted(pinned):
                since = self._pinned_since.setdefault(bookie, self._now)
                if self._now - since >= self.add_timeout_ms:
                    return self._fail(NotEnoughBookies(
                        f"bookie {bookie} acknowledged confirmed entries of ledger {self.ledger_id} that are not "
                        f"on Qw={self.metadata.write_quorum} bookies yet, so guaranteed write quorum cannot "
                        f"replace it, and it did not answer within {self.add_timeout_ms} ms; recover the ledger"))
                del self._failed[bookie]           # retried in place: its entries are sent again
            to_replace = [b for b in to_replace if b not in pinned]
        self._in_place = pinned
        unclean = self._excluded()
        candidates = [b for b in event.bookies if b not in ensemble and b not in self._failed and b not in unclean]
        if not to_replace:          # the failed bookies left the ensemble meanwhile, or are pinned
            return self._finish_change(resend_to=pinned)
        others = [b for b in to_replace if b not in renewed]     # a renewed bookie takes its own place
        if len(candidates) < len(others):
            back = {b for b in others if b in event.back and self._retriable(b)}
            if back or pinned:      # restarted (or pinned): use them again; a change goes on for any others
                for bookie in back:
                    del self._failed[bookie]
                return self._finish_change(resend_to=back | pinned)
            if not renewed:
                self._choose_again_ms = self._now + CHOOSE_RETRY_MS
                return []
            others = []             # the renewed ones now; the others are asked for again after
        self._replacements = {b: b for b in renewed} | dict(zip(others, candidates))
        new_ensemble = tuple(self._replacements.get(b, b) for b in ensemble)
        disks = tuple(event.disks.get(self._replacements[b], 0) if b in self._replacements else self._disks.get(b, 0)
                      for b in ensemble)
        return self._propose(self.metadata.with_fragment(self._fragment_start(), new_ensemble, disks))

    # -- rotation -------------------------------------------------------------------------
    def _rotation_due(self) -> bool:
        """_rotation_due tells whether the current fragment passed a limit and may be rotated now (module doc)."""
        if self.state is not WRITING or self.close_requested or self._failed or self._now < self._rotate_after_ms:
            return False
        replicated = self.last_add_fully_replicated + 1 - self.metadata.last_fragment_start
        if replicated <= 0:
            return False         # a new fragment would start where this one does
        return bool((self.fragment_max_entries and replicated >= self.fragment_max_entries)
                    or (self.fragment_max_bytes and self._fragment_bytes >= self.fragment_max_bytes)
                    or (self.fragment_max_ms and self._now - self._fragment_since_ms >= self.fragment_max_ms))

    def _rotation(self) -> list:
        """_rotation starts a rotation that is due, or reads the metadata again at MAX_ROTATED_FRAGMENTS fragments."""
        if len(self.metadata.ensembles) < MAX_ROTATED_FRAGMENTS:
            return self._start_rotation()
        self._rotate_after_ms = self._now + ROTATE_RETRY_MS
        return [ev.ReadLedgerMetadata(ledger_id=self.ledger_id)]        # a truncation may have dropped some

    def _on_metadata_read(self, event: ev.LedgerMetadataRead) -> list:
        """_on_metadata_read takes a newer version that changed nothing from the last fragment on (a truncation)."""
        current, read = self.metadata, event.metadata
        start = current.last_fragment_start
        if (read is None or self.state is not WRITING or event.version <= self.version or read.state != current.state
                or read.term != current.term or read.last_fragment_start != start
                or read.current_ensemble != current.current_ensemble
                or read.disks.get(start) != current.disks.get(start)):
            return []
        self._adopt(read, event.version)
        if len(read.ensembles) < MAX_ROTATED_FRAGMENTS:
            self._rotate_after_ms = self._now
        return self._complete()

    def _start_rotation(self) -> list:
        """_start_rotation asks for every writable bookie, placement first for the positions that may move."""
        self._to(CHOOSING)
        self._rotating = True
        self._change_started_ms = self._now
        self._choose_again_ms = None
        ensemble = self.metadata.current_ensemble
        return [ev.ChooseBookies(ledger_id=self.ledger_id, exclude=frozenset(), ensemble=ensemble,
                                 replacing=tuple(ensemble[i] for i in self._movable()),
                                 write_quorum=self.metadata.write_quorum)]

    def _movable(self) -> list[int]:
        """_movable lists the positions a rotation may give new bookies: all but the pinned ones.

        They start at a position that moves on with every fragment, so a cluster with fewer
        spare bookies than positions moves each position in turn, not always the first.
        """
        ensemble = self.metadata.current_ensemble
        size = len(ensemble)
        start = len(self.metadata.ensembles) % size
        return [i for i in ((start + k) % size for k in range(size)) if not self._pinned(ensemble[i])]

    def _rotate(self, event: ev.BookiesChosen) -> list:
        """_rotate proposes the next fragment at LAFR + 1: new bookies where writable, else the same (module doc).

        A pinned bookie keeps its position: its confirmed entries above the LAFR stay on Qa
        bookies of their write sets.
        """
        ensemble = self.metadata.current_ensemble
        writable = set(event.bookies)
        unclean = self._excluded()
        fresh = [b for b in event.bookies if b not in ensemble and b not in unclean]   # placement order
        chosen = list(ensemble)
        disks = [self._disks.get(b, 0) for b in ensemble]
        for i in self._movable():
            bookie = ensemble[i]
            if fresh:
                chosen[i] = fresh.pop(0)
                disks[i] = event.disks.get(chosen[i], 0)
            elif bookie not in writable or self._renewed(bookie, event.disks.get(bookie, 0)):
                return self._put_off_rotation(f"no writable bookie for position {i} ({bookie} "
                                              f"{'has another disk' if bookie in writable else 'is not writable'})")
        self._replacements = {old: new for old, new in zip(ensemble, chosen) if old != new}
        self._in_place = set()
        return self._propose(self.metadata.with_fragment(self._fragment_start(), tuple(chosen), tuple(disks)))

    # -- cleaning the bookies a change brings in (unbounded ledgers; module doc) ------------------
    def _propose(self, proposed: LedgerMetadata) -> list:
        """_propose writes the new fragment, after cleaning the bookies it brings into an unbounded ledger.

        A bookie joins when it was not in the current fragment or comes back on another disk (a
        renewed bookie: its new disk may have taken an older term's add before this one's).
        """
        start = proposed.last_fragment_start
        disks = dict(zip(proposed.current_ensemble, proposed.disks.get(start) or ()))
        joining = {b: disks.get(b, 0) for b in proposed.current_ensemble
                   if b not in self.metadata.current_ensemble or self._renewed(b, disks.get(b, 0))}
        if not self.term or not joining or not self.CLEAN_JOINING_BOOKIES:
            self._to(CHANGING)
            return [ev.WriteMetadata(metadata=proposed, expected_version=self.version)]
        self._to(CLEANING)
        self._proposal, self._cleaning, self._cleaning_since = proposed, joining, self._now
        return [ev.SendAdds(bookie=b, ledger_id=self.ledger_id, master_key=self.master_key, entries=[],
                            lafr=self.last_add_fully_replicated, term=self.term, truncate=True, truncate_from=start)
                for b in sorted(joining)]

    def _on_cleaning_answered(self, event: ev.AddsAcked) -> list:
        """_on_cleaning_answered counts a joining bookie's answer, from the disk the proposal records."""
        bookie = event.bookie
        if self.state is not CLEANING or bookie not in self._cleaning:
            return []                            # a late answer: nothing waits for it
        expected = self._cleaning[bookie]
        if expected and event.disk and event.disk != expected:
            return self._not_cleaned({bookie})   # another disk answered: not the one proposed
        del self._cleaning[bookie]
        if self._cleaning:
            return []
        proposed, self._proposal = self._proposal, None
        self._to(CHANGING)
        return [ev.WriteMetadata(metadata=proposed, expected_version=self.version)]

    def _not_cleaned(self, bookies) -> list:
        """_not_cleaned leaves `bookies` out of the next choice (for CHOOSE_RETRY_MS: a lost message
        must not cost the only spare) and chooses again; a rotation is put off. Pinned bookies the
        change retried in place are failed again, so the next choice retries them in place too."""
        now = self._now
        self._unclean = {b: until for b, until in self._unclean.items() if until > now}     # forget the expired
        self._unclean.update(dict.fromkeys(bookies, now + CHOOSE_RETRY_MS))
        for bookie in self._in_place:
            self._failed.setdefault(bookie, "retried in place")
        self._in_place = set()
        self._cleaning, self._proposal, self._replacements = {}, None, None
        self._to(CHOOSING)
        if self._rotating:
            return self._put_off_rotation(f"cleaning {', '.join(sorted(bookies))} failed")
        self._change_started_ms = self._now      # a fresh window to find others
        return [self._choose()]

    def _excluded(self) -> set[str]:
        """_excluded is the bookies left out of choices for now: their cleaning failed moments ago."""
        now = self._now
        return {b for b, until in self._unclean.items() if until > now}

    def _put_off_rotation(self, because: str) -> list:
        """_put_off_rotation goes back to writing in the current fragment; the rotation is tried again later.

        The fragment then holds what is written until ROTATE_RETRY_MS later, past its limit;
        `rotations_put_off` counts these and `rotation_put_off_because` says why the last one
        was. A bookie that failed while the rotation waited is replaced instead, by the
        ordinary change.
        """
        self.rotations_put_off += 1
        self.rotation_put_off_because = because
        self._rotating = False
        self._rotate_after_ms = self._now + ROTATE_RETRY_MS
        if self._failed:
            self._change_started_ms = self._now
            return [self._choose()]
        self._to(WRITING)
        return self._complete()

    def _adopt(self, metadata: LedgerMetadata, version: int) -> None:
        if metadata.last_fragment_start != self.metadata.last_fragment_start:
            self._fragment_bytes, self._fragment_since_ms = 0, self._now      # a new fragment: rotation counts anew
        self.metadata, self.version = metadata, version
        self._write_sets = write_sets_of(metadata.current_ensemble, metadata.write_quorum)
        self._disks = _current_disks(metadata)
        ensemble = set(metadata.current_ensemble)
        self._failed = {b: why for b, why in self._failed.items() if b in ensemble}
        self._unreachable_since = {b: t for b, t in self._unreachable_since.items() if b in ensemble}

    def _finish_change(self, resend_to: set[str]) -> list:
        """_finish_change re-sends what `resend_to` bookies lack, then completes or changes again."""
        self._to(WRITING)
        self._replacements = None
        self._rotating = False
        sends: dict[str, list[Entry]] = {}
        size = len(self._write_sets)
        for pending in self._pending:
            entry_id = pending.entry.entry_id
            write_set = self._write_sets[entry_id % size]
            pending.acked.intersection_update(write_set)
            pending.sent_ms = self._now
            for bookie in write_set:
                if bookie not in pending.acked and bookie not in self._failed and bookie in resend_to:
                    sends.setdefault(bookie, []).append(pending.entry)
        commands: list = self._sends(sends)
        self._in_place = set()
        if self._failed:
            return commands + self._start_change()
        return commands + self._complete()

    def _on_metadata_written(self, event: ev.MetadataWritten) -> list:
        if self.state is CLOSING:
            self._to(CLOSED)
            self._adopt(event.metadata, event.version)
            return [ev.CompleteClose(metadata=event.metadata, version=event.version)]
        if self.state is not CHANGING:
            return []
        replacements = set(self._replacements.values()) | self._in_place
        self._adopt(event.metadata, event.version)
        for bookie in self._replacements.values():       # a renewed bookie replaced itself
            self._failed.pop(bookie, None)
            self._unreachable_since.pop(bookie, None)
        return self._finish_change(resend_to=replacements)

    def _on_conflict(self, event: ev.MetadataConflict) -> list:
        current = event.metadata
        if self.state is CLOSING:
            return self._close_conflict(current, event.version)
        if self.state is not CHANGING:
            return []
        if current.state != ledger_states.OPEN or current.term != self.metadata.term:
            return self._fail(LedgerFenced(f"ledger {self.ledger_id} is {current.state} in term {current.term}: "
                                           "another client is recovering, took over or closed it"))
        # Still OPEN: someone else changed the metadata; retry the change on top of theirs and
        # send every unacknowledged entry to whichever write set it has now.
        self._adopt(current, event.version)
        return self._finish_change(resend_to=set(current.current_ensemble))

    def _on_metadata_failed(self, event: ev.MetadataFailed) -> list:
        if self.state is CHANGING or self.state is CLOSING:
            return self._fail(event.error)        # FailAdds, and FailClose if a close was requested
        return []

    def _fail(self, error: WalkitError) -> list:
        """_fail ends the writer: every pending and later add fails with `error`."""
        if self.error is not None:
            return []
        self.error = error
        self._to(FAILED)
        first = self._pending[0].entry.entry_id if self._pending else self.last_add_pushed + 1
        if self.deferred_sync and self._pending:      # acknowledged adds completed already; the rest fail
            first = max(first, self.last_add_acked + 1)
        self._pending.clear()
        self._queued.clear()
        self.bytes_in_flight = 0
        self._replacements = None
        self._rotating = False
        self._forcing = {}
        commands: list = [ev.FailAdds(ledger_id=self.ledger_id, first_entry_id=first, error=error)]
        if self._forces:
            commands.append(ev.FailForce(ledger_id=self.ledger_id, tokens=[t for _, t in self._forces], error=error))
            self._forces.clear()
        if self.close_requested:
            commands.append(ev.FailClose(ledger_id=self.ledger_id, error=error))
        return commands

    # -- close ----------------------------------------------------------------------------
    def _on_close(self, event: ev.CloseRequested) -> list:
        if self.state is CLOSED:
            return [ev.CompleteClose(metadata=self.metadata, version=self.version)]
        if self.state is FAILED:
            return [ev.FailClose(ledger_id=self.ledger_id, error=self.error)]
        if self.close_requested:
            return []
        self.close_requested = True
        if self.state is WRITING and not self._pending and not self._queued:
            return [self._write_close()]
        return self._force_round()

    def _write_close(self) -> ev.WriteMetadata:
        self._to(CLOSING)
        proposed = self.metadata.closed(self.last_add_confirmed)
        return ev.WriteMetadata(metadata=proposed, expected_version=self.version)

    def _close_conflict(self, current: LedgerMetadata, version: int) -> list:
        """_close_conflict applies the rules for a failed CAS of a writer's close.

        The rules: docs/internals/protocol.md#closing.
        """
        if current.state == ledger_states.OPEN and current.term == self.metadata.term:
            self.metadata, self.version = current, version
            return [self._write_close()]
        if current.state == ledger_states.CLOSED and current.last_entry_id == self.last_add_confirmed:
            self._to(CLOSED)
            self._adopt(current, version)
            return [ev.CompleteClose(metadata=current, version=version)]
        if current.state == ledger_states.CLOSED:
            why = (f"ledger {self.ledger_id} was closed by another client at entry "
                   f"{current.last_entry_id}, not at {self.last_add_confirmed}")
        else:
            why = f"ledger {self.ledger_id} is being recovered by another client"
        return self._fail(LedgerFenced(why))

    # -- time -----------------------------------------------------------------------------
    def _on_tick(self, event: ev.Ticked) -> list:
        self._now = now = event.now_ms
        state = self.state
        if state is CLOSED or state is FAILED or state is CLOSING:
            return []
        if state is CHOOSING:
            if self._rotating and now - self._change_started_ms >= self.add_timeout_ms:
                return self._put_off_rotation(        # no answer: rotation is no reason to fail
                    f"no bookies chosen within {self.add_timeout_ms} ms")
            if now - self._change_started_ms >= self.add_timeout_ms:
                failed = ", ".join(sorted(self._failed))
                return self._fail(NotEnoughBookies(
                    f"no live bookie could replace {failed} in ledger {self.ledger_id} within "
                    f"{self.add_timeout_ms} ms"))
            if self._choose_again_ms is not None and now >= self._choose_again_ms:
                self._choose_again_ms = None
                return [self._choose()]
            return []
        if state is CLEANING:
            if now - self._cleaning_since >= self.add_timeout_ms:
                return self._not_cleaned(set(self._cleaning))
            return []
        if state is CHANGING:
            return []
        pending = self._pending
        if pending:
            head = pending[0]
            if self.deferred_sync:              # acknowledged adds wait for a force, not for bookies
                index = self.last_add_acked + 1 - head.entry.entry_id
                head = pending[index] if index < len(pending) else None
                if head is None or now - head.sent_ms < self.add_timeout_ms:
                    # What was forced is announced even while later entries wait for a force.
                    return (self._force_round() if self._wants_force() else []) + self._explicit_lac(now)
            if now - head.sent_ms >= self.add_timeout_ms:
                commands: list = []
                write_set = self._write_sets[head.entry.entry_id % len(self._write_sets)]
                for bookie in write_set:
                    if bookie not in head.acked:
                        commands += self._bookie_failed(bookie, f"no answer within {self.add_timeout_ms} ms")
                return commands
        if self._rotates and self._rotation_due():        # by age, or a takeover in a full fragment
            return self._rotation()
        return [] if pending else self._explicit_lac(now)

    def _explicit_lac(self, now: int) -> list:
        """_explicit_lac sends the LAC to the ensemble once the writer was idle for explicit_lac_ms, if it moved.

        It is sent again, every explicit_lac_ms while the writer stays idle, to each bookie that
        has not acknowledged it (LacWritten): a lost WriteLac would otherwise leave tailing
        readers one entry behind until the next append.
        """
        lac = self.last_add_confirmed
        if lac < 0 or self.close_requested or now - self._last_add_ms < self.explicit_lac_ms:
            return []
        if lac <= self._lac_sent and now - self._lac_sent_ms < self.explicit_lac_ms:
            return []
        targets = [b for b in self.metadata.current_ensemble
                   if b not in self._failed and self._lac_written.get(b, -1) < lac]
        if not targets:
            return []
        self._lac_sent, self._lac_sent_ms = lac, now
        return [ev.SendWriteLac(bookie=b, ledger_id=self.ledger_id, master_key=self.master_key, lac=lac)
                for b in targets]

    def _on_lac_written(self, event: ev.LacWritten) -> list:
        if event.lac > self._lac_written.get(event.bookie, -1):
            self._lac_written[event.bookie] = event.lac
        return []


def _current_disks(metadata: LedgerMetadata) -> dict[str, int]:
    """_current_disks maps the current fragment's bookies to the disks it records ({} if none)."""
    disks = metadata.disks.get(metadata.last_fragment_start)
    return {} if disks is None else dict(zip(metadata.current_ensemble, disks))
