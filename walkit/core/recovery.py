"""walkit.core.recovery is the state machine that fences a ledger and closes it at its true end.

Opening a ledger with recovery (docs/internals/protocol.md#recovery) goes:

1. mark: CAS the metadata state to IN_RECOVERY, so the old writer can no longer change the
   ensemble (its CAS fails, it re-reads, sees IN_RECOVERY and stops);
2. fence: send fencing LAC reads to the bookies of the last fragment; the ledger is fenced once
   EC = (E - Qa) + 1 of them answered, and the highest LAC among the answers is known;
3. read forward from max(highest LAC, first entry of the last fragment - 1) + 1
   (BookKeeper issue 2615: with LAC -1 everywhere, entries before the last fragment are still
   committed). Every recovery read carries the fence flag (BookKeeper issue 2614: without it a
   live writer could still complete an add on a bookie recovery read from). An entry is present
   on one OK whose digest verifies; absent only once QC = (Qw - Qa) + 1 bookies of its write set
   said NO_SUCH_ENTRY; otherwise it is unknown and asked again, never guessed. An id a bookie's
   answer did not look at (its answer reached the read's byte bound, BP-62: EntriesRead.unread)
   is no NO_SUCH_ENTRY: it is asked of that bookie again at once;
4. write back: each present entry is re-added, unchanged, to its whole write set with the
   recovery flag (which passes the fence) and counts once Qa bookies acknowledged it. A bookie
   that fails a write-back is replaced; the new fragment starts at the first entry not yet
   written back in full (every entry before it is on Qa bookies of its old write set, and every
   later one, read already or not, goes to the new write sets) and is recorded only with the
   close;
5. close: CAS to CLOSED with last entry = (first absent entry) - 1. On a conflict with a CLOSED
   ledger the recoverer adopts that close, so concurrent recoverers converge on one last entry.

Absence is never proven by a replaced disk (`LedgerMetadata.answer_counts`): a bookie whose
storage was emptied and formatted since the fragment was written answers NO_SUCH_ENTRY for
entries it acknowledged. So a NO_SUCH_ENTRY (or NO_SUCH_LEDGER) counts toward QC only from the
disk the fragment records for that bookie; from another disk it is treated as an error and
asked again. NO_SUCH_LEDGER from a bookie that names no disk does not count either when the
ledger records disks (`holds_nothing_counts`: an older secured bookie says it for ledgers whose
metadata it cannot read). An entry such a bookie returns is still present (its digest proves
it). A fencing answer counts toward EC from any disk: the replaced disk is fenced now, and a
writer never counts its acknowledgements (walkit.core.writer), so with EC fenced no writer can
gather Qa acknowledgements; its low LAC only makes recovery read from earlier.

With guaranteed write quorum (`metadata.guaranteed_write_quorum`, see walkit.core.writer) step
3 starts after the highest LAFR the fencing answers report instead of the LAC (entries between
them may be on fewer than Qw bookies), and step 4 counts a write-back only once all Qw bookies
of its write set acknowledged it, so the closed ledger has every entry on Qw bookies.

Unbounded ledgers (docs/internals/protocol.md#unbounded-ledgers;
TLA+ ProtocolUnboundedLedgersAndGWQ) fence by term: step 1 moves
the ledger to the next term (always, even if it is IN_RECOVERY already: each recoverer needs a
term of its own), and every fencing read, recovery read and write-back carries that term; an
INVALID_TERM answer means another client took a higher term, and this recovery fails with
LedgerFenced. The metadata names the term's holder (`holder`, a random token the shell draws
for each recovery): two recoveries that mark the same metadata at once propose the same term,
and a put whose outcome was unknown is settled by reading the key back, so without the token
the loser would read the winner's identical bytes as its own write and both would recover, and
write, in one term. A later conflict that names another holder of the term fails the recovery.
With `reopen` the ledger is not closed: once every entry before the first absent one was
written back, a no-op entry with the truncate flag is written at that id to every bookie
of the last fragment (each drops the dirty entries it holds above it), and when all of them
acknowledged it the metadata goes back to OPEN in the new term, for a writer that starts after
the no-op. Without the truncation an entry written by the old term to one bookie only could
live on there under an id the new term reuses (docs/internals/protocol.md#log-divergence).

States (`RecoveryState`, transitions in `_TRANSITIONS`, each one asserted): MARKING (the CAS to
IN_RECOVERY), FENCING, RECOVERING (reading and writing back), TRUNCATING (the no-op, reopen
only), CLOSING (the final CAS: CLOSED, or OPEN after a reopen), DONE.
A metadata write whose outcome is unknown is settled by the dispatcher (walkit.core.dispatch);
MetadataFailed means the ledger is gone.
"""

from __future__ import annotations

import enum

from walkit.core import events as ev
from walkit.core.digest import Digest
from walkit.core.distribution import absent_quorum, ensemble_coverage, write_set_bookies
from walkit.core.messages import NOOP_PAYLOAD, Entry, Status
from walkit.core.metadata import CLOSED, IN_RECOVERY, OPEN, LedgerMetadata
from walkit.core.messages import refusal as _refusal
from walkit.errors import ConfigError, LedgerClosed, LedgerFenced, NotEnoughBookies, Timeout, Unauthorized

#: How long an undecided read or an unanswered fence waits before it is asked again.
RETRY_MS = 100



class RecoveryState(str, enum.Enum):
    """RecoveryState is the phase a LedgerRecovery is in (see the module doc)."""

    MARKING = "MARKING"
    FENCING = "FENCING"
    RECOVERING = "RECOVERING"
    TRUNCATING = "TRUNCATING"
    CLOSING = "CLOSING"
    DONE = "DONE"


MARKING, FENCING, RECOVERING, TRUNCATING, CLOSING, DONE = RecoveryState

_TRANSITIONS = {
    MARKING: {MARKING, FENCING, DONE},
    FENCING: {RECOVERING, DONE},
    RECOVERING: {TRUNCATING, CLOSING, DONE},
    TRUNCATING: {CLOSING, DONE},
    CLOSING: {CLOSING, DONE},
    DONE: set(),
}


class _Probe:
    """_Probe gathers the answers about one entry from its write set."""

    __slots__ = ("replicas", "asked", "absent_votes", "failed", "retry_ms")

    def __init__(self, replicas: tuple[str, ...]) -> None:
        self.replicas = replicas
        self.asked: set[str] = set()          # asked, no answer yet
        self.absent_votes: set[str] = set()   # said NO_SUCH_ENTRY (final: the read fenced them)
        self.failed: set[str] = set()         # errored; asked again after RETRY_MS
        self.retry_ms: int | None = None


class _WriteBack:
    """_WriteBack tracks the recovery add of one present entry."""

    __slots__ = ("entry", "acked", "sent_ms", "skipped")

    def __init__(self, entry: Entry, sent_ms: int) -> None:
        self.entry = entry
        self.acked: set[str] = set()
        self.sent_ms = sent_ms
        self.skipped: set[str] = set()          # targets not sent to: they were failed at the time


class LedgerRecovery:
    """LedgerRecovery recovers one ledger; call `start`, then feed events to `step`.

    It ends with CompleteRecovery (the CLOSED metadata) or FailRecovery. `timeout_ms` bounds the
    whole recovery; `window` bounds how many entries are read ahead.

    The two rules that BookKeeper once got wrong are named here so the simulator's tests can
    break them on purpose (in a subclass) and show that the checker notices.
    """

    #: Recovery reads carry the fence flag (BookKeeper issue 2614).
    FENCE_RECOVERY_READS = True
    #: A reopen writes the truncating no-op before the ledger is OPEN again
    #: (docs/internals/protocol.md#log-divergence).
    TRUNCATE_ON_REOPEN = True
    #: Fencing and absence count only answers from the disk a fragment records (metadata.disks).
    CHECK_DISKS = True
    #: Ids a byte-bounded answer did not look at (EntriesRead.unread) are asked again, never
    #: counted as NO_SUCH_ENTRY votes (BP-62).
    UNREAD_IS_UNANSWERED = True

    def _counts(self, entry_id: int, bookie: str, disk: int) -> bool:
        """_counts tells whether `bookie`'s answer from `disk` speaks for the fragment of `entry_id`."""
        return not self.CHECK_DISKS or self.metadata.answer_counts(entry_id, bookie, disk)

    def absent_votes_needed(self) -> int:
        """absent_votes_needed is QC = (Qw - Qa) + 1: NO_SUCH_ENTRY answers that prove absence."""
        return absent_quorum(self.metadata.write_quorum, self.metadata.ack_quorum)

    def __init__(self, metadata: LedgerMetadata, version: int, *, master_key: bytes, digest: Digest,
                 timeout_ms: int = 30000, add_timeout_ms: int = 5000, window: int = 256,
                 now_ms: int = 0, reopen: bool = False, holder: str = "") -> None:
        if reopen and not metadata.unbounded:
            raise ConfigError(f"ledger {metadata.ledger_id} is not unbounded: it cannot be reopened")
        if metadata.unbounded and not holder:
            raise ConfigError(f"ledger {metadata.ledger_id} is unbounded: its recovery needs a holder token "
                              f"(a random string) to take a term with")
        self.holder = holder
        self.metadata = metadata
        self.version = version
        self.ledger_id = metadata.ledger_id
        self.master_key = master_key
        self.reopen = reopen
        self._unbounded = metadata.unbounded
        self.term = 0                              # unbounded: this recovery's own term, once marked
        self._sign = digest.sign
        self._noop: int | None = None              # the id of the truncating no-op (reopen)
        self.phase = MARKING
        self.timeout_ms = timeout_ms
        self.add_timeout_ms = add_timeout_ms
        self.window = window
        self._verify = digest.verify
        self._now = now_ms
        self._deadline = now_ms + timeout_ms
        # fencing
        self._fence_answers: dict[str, int] = {}    # bookie -> its LAC (LAFR with guaranteed write quorum)
        self._fenced_lac = -1                       # the highest LAC the fencing answers reported
        self._quorum = metadata.write_quorum if metadata.guaranteed_write_quorum else metadata.ack_quorum
        self._fence_failed: dict[str, int] = {}     # bookie -> when to ask again
        self.start_entry = -1
        # reading and writing back
        self._next_read = 0
        self._probes: dict[int, _Probe] = {}
        self._absent_at: int | None = None
        self._writebacks: dict[int, _WriteBack] = {}
        self._held: dict[int, Entry] = {}           # read, waiting for every lower entry to be read
        self._sent_upto = -1                       # every entry up to here is read and its write-back sent
        self._done_upto = -1                       # every entry up to here is present and written back
        self._ensemble: tuple[str, ...] = metadata.current_ensemble   # where write-backs go now
        self._fragments: dict[int, tuple[str, ...]] = {}   # fragments added by replacing bookies
        self._fragment_disks: dict[int, tuple[int, ...]] = {}   # ... and the disks of their bookies
        self._failed: set[str] = set()
        self._slow: set[str] = set()        # failed by a write-back timeout only: taken back if they answer
        self._choosing = False
        self._choose_again_ms: int | None = None
        self._replacing_since = 0
        self._handlers = {
            ev.MetadataWritten: self._on_written, ev.MetadataConflict: self._on_conflict,
            ev.MetadataFailed: self._on_metadata_failed, ev.LacRead: self._on_lac,
            ev.EntriesRead: self._on_read, ev.ReadFailed: self._on_read_failed,
            ev.AddsAcked: self._on_acked, ev.AddsRejected: self._on_rejected,
            ev.BookiesChosen: self._on_chosen, ev.Ticked: self._on_tick,
        }

    def _to(self, phase: RecoveryState) -> None:
        """_to moves to `phase`, asserting the transition is one recovery allows."""
        assert phase in _TRANSITIONS[self.phase], f"ledger {self.ledger_id}: recovery cannot go {self.phase.name} -> {phase.name}"
        self.phase = phase

    @property
    def last_entry_id(self) -> int | None:
        """last_entry_id is the recovered last entry once known."""
        return None if self._absent_at is None else self._absent_at - 1

    def start(self) -> list:
        """start begins recovery: mark IN_RECOVERY (or go on if already marked or closed)."""
        if self.metadata.state == CLOSED:
            if self.reopen:
                return self._fail(LedgerClosed(f"ledger {self.ledger_id} is closed: it cannot be reopened"))
            return self._finish(self.metadata, self.version)
        if self.metadata.state == IN_RECOVERY and not self._unbounded:
            return self._fence()
        self._to(MARKING)
        marked = self.metadata.in_recovery(self.holder)
        return [ev.WriteMetadata(metadata=marked, expected_version=self.version)]

    def step(self, event) -> list:
        """step applies one event and returns commands."""
        if self.phase == DONE:
            return []
        return self._handlers[type(event)](event)

    # -- metadata -------------------------------------------------------------------------
    def _on_written(self, event: ev.MetadataWritten) -> list:
        if self.phase == MARKING:
            self.metadata, self.version = event.metadata, event.version
            self.term = event.metadata.term if self._unbounded else 0
            return self._fence()
        if self.phase == CLOSING:
            return self._finish(event.metadata, event.version)
        return []

    def _on_conflict(self, event: ev.MetadataConflict) -> list:
        current, version = event.metadata, event.version
        if current.state == CLOSED:
            if self.reopen:
                return self._fail(LedgerClosed(f"ledger {self.ledger_id} was closed by another client"))
            return self._finish(current, version)         # another recoverer (or the writer) closed it
        held = (current.term, current.term_holder) == (self.term, self.holder)
        if self._unbounded and self.phase != MARKING and not held:        # a higher term, or ours held by another
            return self._fail(self._taken(current.term))
        if self.phase == CLOSING and current.ensembles != self.metadata.ensembles:
            # Someone changed the fragments this recovery read and wrote back through: its view
            # of where entries live is stale, so it gives up and a fresh recovery starts over.
            return self._fail(LedgerFenced(f"ledger {self.ledger_id}: fragments changed during recovery"))
        self.metadata, self.version = current, version
        if self.phase == MARKING:
            return self.start()
        if self.phase == CLOSING:
            self._to(CLOSING)
            return [self._close_write()]
        return []

    def _on_metadata_failed(self, event: ev.MetadataFailed) -> list:
        return self._fail(event.error)

    def _taken(self, term: int | None = None) -> LedgerFenced:
        higher = f"term {term}" if term is not None else "a higher term"
        return LedgerFenced(f"ledger {self.ledger_id}: another client took over in {higher} "
                            f"during this recovery (term {self.term})")
    # -- fencing --------------------------------------------------------------------------
    def _fence(self) -> list:
        self._to(FENCING)
        self._ensemble = self.metadata.current_ensemble
        return [self._fence_request(b) for b in self._ensemble]

    def _fence_request(self, bookie: str) -> ev.SendReadLac:
        return ev.SendReadLac(bookie=bookie, ledger_id=self.ledger_id, fence=True, master_key=self.master_key,
                              term=self.term)

    def _on_lac(self, event: ev.LacRead) -> list:
        if self.phase != FENCING or event.bookie not in self._ensemble:
            return []
        if event.status == Status.UNAUTHORIZED:
            return self._fail(Unauthorized(_refusal(event, self.ledger_id)))
        if event.status == Status.INVALID_TERM:
            return self._fail(self._taken())
        if event.status != Status.OK:
            self._fence_failed[event.bookie] = self._now + RETRY_MS
            return []
        self._fence_answers[event.bookie] = event.lafr if self.metadata.guaranteed_write_quorum else event.lac
        self._fenced_lac = max(self._fenced_lac, event.lac)
        self._fence_failed.pop(event.bookie, None)
        md = self.metadata
        if len(self._fence_answers) < ensemble_coverage(md.ensemble_size, md.ack_quorum):
            return []
        self._to(RECOVERING)
        self.start_entry = max(max(self._fence_answers.values()), md.last_fragment_start - 1)
        self._next_read = self._done_upto = self._sent_upto = self.start_entry
        self._next_read += 1
        return self._read_ahead()

    # -- reading --------------------------------------------------------------------------
    def _read_ahead(self) -> list:
        sends: dict[str, list[int]] = {}
        limit = self._done_upto + self.window
        if self._absent_at is not None:
            limit = min(limit, self._absent_at - 1)
        md = self.metadata
        while self._next_read <= limit:
            entry_id = self._next_read
            probe = _Probe(write_set_bookies(entry_id, md.ensemble_at(entry_id), md.write_quorum))
            self._probes[entry_id] = probe
            for bookie in probe.replicas:
                probe.asked.add(bookie)
                sends.setdefault(bookie, []).append(entry_id)
            self._next_read += 1
        return self._reads(sends)

    def _on_read(self, event: ev.EntriesRead) -> list:
        if self.phase != RECOVERING:
            return []
        commands: list = []
        for entry in event.entries:
            probe = self._probes.get(entry.entry_id)
            if probe is None or event.bookie not in probe.asked:
                continue
            if entry.ledger_id == self.ledger_id and self._verify(entry):
                del self._probes[entry.entry_id]
                if self._absent_at is None or entry.entry_id < self._absent_at:
                    self._held[entry.entry_id] = entry      # (one proven absent already stays absent)
            else:
                self._probe_failed(probe, event.bookie)
        quorum = self.absent_votes_needed()
        counts = self._counts
        missing, again = event.missing, []
        if event.unread:
            if self.UNREAD_IS_UNANSWERED:
                again = event.unread
            else:
                missing = missing + event.unread
        for entry_id in missing:
            probe = self._probes.get(entry_id)
            if probe is None or event.bookie not in probe.asked:
                continue
            if not counts(entry_id, event.bookie, event.disk):
                self._probe_failed(probe, event.bookie)     # a replaced disk lacks it: that proves nothing
                continue
            probe.asked.discard(event.bookie)
            probe.absent_votes.add(event.bookie)
            if len(probe.absent_votes) >= quorum:
                self._absent_at = entry_id if self._absent_at is None else min(self._absent_at, entry_id)
        commands += self._send_write_backs() + self._progress()
        if again and self.phase == RECOVERING:        # not answered, not absent: ask the same bookie again
            probes, bookie = self._probes, event.bookie
            commands += self._reads({bookie: [e for e in again if e in probes and bookie in probes[e].asked]})
        return commands

    def _reads(self, sends: dict[str, list[int]]) -> list:
        return [ev.SendRead(bookie=b, ledger_id=self.ledger_id, entry_ids=ids, fence=self.FENCE_RECOVERY_READS,
                            master_key=self.master_key, term=self.term) for b, ids in sends.items() if ids]

    def _send_write_backs(self) -> list:
        """_send_write_backs writes back the entries read so far in order, stopping at the first not read yet.

        Reads run ahead, but an entry is written back only once every entry below it was read:
        one past the first absent entry is never written back. Such a write-back carries this
        recovery's term, so if it were sent and arrived late (delayed, duplicated), a bookie
        would take it after the truncating no-op, over the entry the new term's writer put at
        that id and had acknowledged.
        """
        commands: list = []
        end = self._absent_at
        while self._sent_upto + 1 in self._held and (end is None or self._sent_upto + 1 < end):
            self._sent_upto += 1
            commands += self._write_back(self._held.pop(self._sent_upto))
        if self._absent_at is not None:
            for entry_id in [e for e in self._held if e >= self._absent_at]:
                del self._held[entry_id]                # past the end: never written back
        return commands

    def _on_read_failed(self, event: ev.ReadFailed) -> list:
        if self.phase != RECOVERING:
            return []
        if event.status == Status.UNAUTHORIZED:
            return self._fail(Unauthorized(_refusal(event, self.ledger_id)))
        if event.status == Status.INVALID_TERM:
            return self._fail(self._taken())
        if event.status == Status.NO_SUCH_LEDGER and (not self.CHECK_DISKS
                                                      or self.metadata.holds_nothing_counts(event.disk)):
            return self._on_read(ev.EntriesRead(bookie=event.bookie, ledger_id=event.ledger_id, entries=[],
                                                missing=event.entry_ids, lac=-1, disk=event.disk))
        for entry_id in event.entry_ids:
            probe = self._probes.get(entry_id)
            if probe is not None and event.bookie in probe.asked:
                self._probe_failed(probe, event.bookie)
        return self._progress()

    def _probe_failed(self, probe: _Probe, bookie: str) -> None:
        probe.asked.discard(bookie)
        probe.failed.add(bookie)
        if probe.retry_ms is None:
            probe.retry_ms = self._now + RETRY_MS

    # -- writing back ---------------------------------------------------------------------
    def _write_back(self, entry: Entry) -> list:
        self._writebacks[entry.entry_id] = wb = _WriteBack(entry, self._now)
        targets = self._targets(entry.entry_id)
        wb.skipped = {b for b in targets if b in self._failed}
        return [self._add(b, entry) for b in targets if b not in self._failed]

    def _add(self, bookie: str, entry: Entry) -> ev.SendAdds:
        """_add is the recovery add of `entry` to `bookie` (the no-op truncates)."""
        return ev.SendAdds(bookie=bookie, ledger_id=self.ledger_id, master_key=self.master_key, entries=[entry],
                           recovery=True, term=self.term, truncate=entry.entry_id == self._noop)

    def _view(self) -> LedgerMetadata:
        """_view is the metadata plus the fragments this recovery added (recorded at close)."""
        view = self.metadata
        for first in sorted(self._fragments):
            view = view.with_fragment(first, self._fragments[first], self._fragment_disks.get(first))
        return view

    def _targets(self, entry_id: int) -> tuple[str, ...]:
        """_targets is the write set an entry is written back to (in a replaced ensemble if any).

        The truncating no-op goes to the whole ensemble: any bookie of it may hold dirty entries.
        """
        view = self._view() if self._fragments else self.metadata
        if entry_id == self._noop:
            return view.ensemble_at(entry_id)
        return write_set_bookies(entry_id, view.ensemble_at(entry_id), view.write_quorum)

    def _on_acked(self, event: ev.AddsAcked) -> list:
        if self.phase != RECOVERING and self.phase != TRUNCATING:
            return []
        for entry_id in event.entry_ids:
            pending = self._writebacks.get(entry_id)
            if pending is not None and event.bookie in self._targets(entry_id):
                pending.acked.add(event.bookie)
        commands = self._taken_back(event.bookie, event.disk) if event.bookie in self._slow else []
        return commands + self._progress()

    def _taken_back(self, bookie: str, disk: int) -> list:
        """_taken_back writes on to a bookie that failed by timeout and answered before anyone replaced it.

        A bookie fails when a write-back goes unanswered for add_timeout_ms; a slow one (a burst
        of write-backs after a replacement, say) answers later. With no spare bookie to replace
        it, the recovery would fail and the next one start over; it takes the bookie back instead
        (if the disk the fragment records answered) and sends it the write-backs skipped meanwhile
        (the no-op among them). A bookie that refused a write-back stays failed.
        """
        view = self._view()
        recorded = view.disk_of(view.last_fragment_start, bookie)
        if recorded and disk and disk != recorded:
            return []
        self._slow.discard(bookie)
        self._failed.discard(bookie)
        commands = []
        for wb in self._writebacks.values():
            targets = self._targets(wb.entry.entry_id)
            if bookie in wb.skipped:
                wb.skipped.discard(bookie)
                if bookie in targets:
                    commands.append(self._add(bookie, wb.entry))
            if bookie in targets and bookie not in wb.acked:
                wb.sent_ms = self._now          # it answers again: give what it still owes a new window
        return commands

    def _on_rejected(self, event: ev.AddsRejected) -> list:
        if self.phase != RECOVERING and self.phase != TRUNCATING:
            return []
        if event.status == Status.UNAUTHORIZED:
            return self._fail(Unauthorized(_refusal(event, self.ledger_id)))
        if event.status == Status.INVALID_TERM:
            return self._fail(self._taken())
        self._slow.discard(event.bookie)      # it refused: not merely slow
        return self._replace(event.bookie)

    def _replace(self, bookie: str) -> list:
        if bookie in self._failed or bookie not in self._ensemble:
            return []
        if not self._failed:
            self._replacing_since = self._now
        self._failed.add(bookie)
        if self._choosing:
            return []
        self._choosing = True
        return [self._choose()]

    def _choose(self) -> ev.ChooseBookies:
        """_choose asks for replacements of the failed bookies of the current ensemble (rack-aware)."""
        ensemble = self._ensemble
        return ev.ChooseBookies(ledger_id=self.ledger_id, exclude=frozenset(ensemble) | frozenset(self._failed),
                                ensemble=ensemble, replacing=tuple(b for b in ensemble if b in self._failed),
                                write_quorum=self.metadata.write_quorum)

    def _on_chosen(self, event: ev.BookiesChosen) -> list:
        if not self._choosing or (self.phase != RECOVERING and self.phase != TRUNCATING):
            return []
        self._choosing = False
        to_replace = [b for b in self._ensemble if b in self._failed]
        if not to_replace:
            return self._progress()          # the failed bookies were taken back meanwhile
        candidates = [b for b in event.bookies if b not in self._ensemble and b not in self._failed]
        if len(candidates) < len(to_replace):
            if self._now - self._replacing_since >= self.add_timeout_ms:
                return self._fail(NotEnoughBookies(
                    f"recovery of ledger {self.ledger_id}: no live bookie could replace "
                    f"{', '.join(sorted(self._failed))} within {self.add_timeout_ms} ms"))
            self._choose_again_ms = self._now + RETRY_MS
            return []
        mapping = dict(zip(to_replace, candidates))
        view = self._view()
        disks = tuple(event.disks.get(mapping[b], 0) if b in mapping else view.disk_of(view.last_fragment_start, b)
                      for b in self._ensemble)
        self._ensemble = tuple(mapping.get(b, b) for b in self._ensemble)
        self._failed.clear()
        self._slow.clear()
        # The new fragment starts right after the entries written back in full: each of those is
        # on Qa bookies of its old write set. Every later entry, written back already, being read
        # or not read yet, goes to the new write sets (an entry read later must not go to a
        # write set that still names the replaced bookie).
        first = self._done_upto + 1
        self._fragments = {f: ens for f, ens in self._fragments.items() if f < first}
        self._fragment_disks = {f: d for f, d in self._fragment_disks.items() if f < first}
        self._fragments[first] = self._ensemble
        self._fragment_disks[first] = disks
        commands: list = []
        for entry_id in sorted(e for e in self._writebacks if e >= first):
            wb = self._writebacks[entry_id]
            targets = self._targets(entry_id)
            wb.acked.intersection_update(targets)
            wb.sent_ms = self._now
            wb.skipped.clear()
            commands += [self._add(b, wb.entry) for b in targets if b not in wb.acked]
        return commands + self._progress()

    # -- progress and close ---------------------------------------------------------------
    def _quorum_of(self, entry_id: int) -> int:
        """_quorum_of is how many acknowledgements finish a write-back (the no-op: the whole ensemble)."""
        return self.metadata.ensemble_size if entry_id == self._noop else self._quorum

    def _progress(self) -> list:
        while True:
            next_id = self._done_upto + 1
            wb = self._writebacks.get(next_id)
            if wb is None or len(wb.acked) < self._quorum_of(next_id):
                break
            del self._writebacks[next_id]
            self._done_upto = next_id
        if self.phase == TRUNCATING:
            if self._done_upto < self._noop:
                return []
            self._to(CLOSING)
            return [self._close_write()]
        if self._absent_at is not None and self._done_upto >= self._absent_at - 1:
            self._probes.clear()
            self._held.clear()
            self._writebacks.clear()
            if self.reopen and self.TRUNCATE_ON_REOPEN:
                return self._truncate()
            self._to(CLOSING)
            return [self._close_write()]
        return self._read_ahead()

    def _truncate(self) -> list:
        """_truncate writes the no-op at the first absent id to every bookie of the last fragment."""
        self._to(TRUNCATING)
        self._noop = noop_id = self._absent_at
        # The no-op carries the LAC fencing found, not noop_id - 1: the entries recovered after it
        # are confirmed only once the metadata names the fragments recovery wrote them to.
        lac = min(self._fenced_lac, noop_id - 1)
        entry = Entry(self.ledger_id, noop_id, lac, self._sign(self.ledger_id, noop_id, lac, NOOP_PAYLOAD), NOOP_PAYLOAD)
        return self._write_back(entry)

    @property
    def _end(self) -> int:
        """_end is the recovered last entry: the no-op after a reopen, else the last entry present."""
        return self._noop if self._noop is not None else self._absent_at - 1

    def _close_write(self) -> ev.WriteMetadata:
        last = self._end
        proposed = self.metadata
        for first in sorted(self._fragments):
            if first <= last:
                proposed = proposed.with_fragment(first, self._fragments[first], self._fragment_disks.get(first))
        proposed = proposed.reopened() if self.reopen else proposed.closed(last)
        return ev.WriteMetadata(metadata=proposed, expected_version=self.version)

    def _finish(self, metadata: LedgerMetadata, version: int) -> list:
        self._to(DONE)
        self.metadata, self.version = metadata, version
        last = self._end if metadata.state == OPEN else -1
        return [ev.CompleteRecovery(metadata=metadata, version=version, last_entry_id=last)]

    def _fail(self, error: Exception) -> list:
        self._to(DONE)
        return [ev.FailRecovery(ledger_id=self.ledger_id, error=error)]

    # -- time -----------------------------------------------------------------------------
    def _on_tick(self, event: ev.Ticked) -> list:
        self._now = now = event.now_ms
        if now >= self._deadline:
            return self._fail(Timeout(f"recovery of ledger {self.ledger_id} did not finish within "
                                      f"{self.timeout_ms} ms (phase {self.phase})"))
        commands: list = []
        if self.phase == FENCING:
            for bookie, when in list(self._fence_failed.items()):
                if now >= when:
                    del self._fence_failed[bookie]
                    commands.append(self._fence_request(bookie))
        elif self.phase == RECOVERING or self.phase == TRUNCATING:
            sends: dict[str, list[int]] = {}
            for entry_id, probe in self._probes.items():
                if probe.retry_ms is not None and now >= probe.retry_ms:
                    probe.retry_ms = None
                    for bookie in probe.failed:
                        probe.asked.add(bookie)
                        sends.setdefault(bookie, []).append(entry_id)
                    probe.failed.clear()
            commands += self._reads(sends)
            for wb in self._writebacks.values():
                if len(wb.acked) < self._quorum_of(wb.entry.entry_id) and now - wb.sent_ms >= self.add_timeout_ms:
                    for bookie in self._targets(wb.entry.entry_id):
                        if bookie not in wb.acked:
                            if bookie in self._ensemble and bookie not in self._failed:
                                self._slow.add(bookie)
                            commands += self._replace(bookie)
            if self._choose_again_ms is not None and now >= self._choose_again_ms:
                self._choose_again_ms = None
                self._choosing = True
                commands.append(self._choose())
        return commands

