"""walkit.core.log is the sans-IO machine of a log's single writer (docs/internals/protocol.md#logs).

A log is an ordered list of ledgers kept in one metadata record (walkit.core.loglist). Its writer
runs the LedgerWriter and LedgerRecovery machines of the ledgers it touches, routes their
events to them by ledger id, and keeps the list right by construction:

- open: read the list (create it if absent); fence and recover EVERY ledger of the list that is
  not closed (normally the last two: a writer may die mid-roll); create a ledger; add it to the
  list by compare-and-swap. No append is accepted before that CAS succeeded (`LogOpened`). A
  lost CAS race starts over on the list found, up to `open_attempts` times;
- roll: create a ledger, add it by CAS, switch appends to it, then close the previous one and
  record its end by CAS. A roll does not start while the previous ledger is still closing, so
  at most two of the list's ledgers are unclosed at any time (LedgerChaining.tla's
  OnlyOneLedgerOpenAtATime, two during a roll). Appends that arrive once a roll is due wait
  for the switch (they would not be acknowledged earlier anyway, since the previous ledger's
  appends come first). A batch of appends (one AppendRequested) goes to one ledger whole, so
  `roll_entries` is a threshold: a ledger can exceed it by the rest of the batch that crossed it;
- acknowledgements reach the application in log order across rolls: the appends of a ledger
  are acknowledged only once every append of the ledger before it was;
- a failure of any ledger this writer writes (fenced, no bookies, a failed close) ends the
  writer: every unacknowledged and later append fails (FailAppends). Its ledgers stay in the
  list, and the next open recovers them;
- the list is changed by one CAS at a time; a CAS that finds another version means another
  writer opened the log: this one is fenced. A CAS whose outcome is unknown is settled by the
  dispatcher (re-read) before the writer decides;
- truncation and retention remove whole closed ledgers from the front of the list by CAS, then
  delete them;
- close waits for a roll under way, sends appends held for a roll that has not started to the
  current ledger, closes every ledger of the writer and records each end, and answers LogClosed
  last. Every request is answered exactly once: a roll still waiting fails, and a writer that
  fails fails its queued and in-flight truncations (the simulator checks this).

States (`LogState`, transitions asserted): OPENING, WRITING, CLOSING, CLOSED, FAILED. Rolls
and list updates run inside WRITING and CLOSING. Named failpoints (ev.Failpoint) mark the steps
crash tests stop at: log.open.after_create, log.roll.after_create, log.roll.after_cas.

The two rules BookKeeper's own log users got wrong are class attributes, so the simulator's
tests can break them on purpose and show the checker notices.
"""

from __future__ import annotations

import enum
import itertools
from collections import deque
from typing import Callable

from walkit.core import events as ev
from walkit.core import logevents as lev
from walkit.core.digest import Digest
from walkit.core.loglist import LogConfig, LogMetadata, LogSegment, Position
from walkit.core.metadata import CLOSED as LEDGER_CLOSED
from walkit.core.recovery import LedgerRecovery
from walkit.core.writer import DEFAULT_MAX_BYTES_IN_FLIGHT, LedgerWriter
from walkit.errors import ConfigError, LedgerClosed, LedgerFenced, LogContention, NoSuchLog, WalkitError

#: How long an automatic roll that could not create a ledger waits before it tries again.
ROLL_RETRY_MS = 1000
#: How long open waits before it starts over after a recovery failed.
OPEN_RETRY_MS = 200


class LogState(str, enum.Enum):
    """LogState is where a log writer is in its life (see the module doc)."""

    OPENING = "OPENING"
    WRITING = "WRITING"
    CLOSING = "CLOSING"
    CLOSED = "CLOSED"
    FAILED = "FAILED"


OPENING, WRITING, CLOSING, CLOSED, FAILED = LogState

_TRANSITIONS = {
    OPENING: {OPENING, WRITING, FAILED},
    WRITING: {CLOSING, FAILED},
    CLOSING: {CLOSED, FAILED},
    CLOSED: set(),
    FAILED: set(),
}

# Events whose ledger is named by `.ledger_id`, or by `.metadata.ledger_id`.
_BY_LEDGER_ID = (ev.AddsAcked, ev.AddsRejected, ev.BookiesChosen, ev.MetadataFailed, ev.EntriesRead,
                 ev.ReadFailed, ev.LacRead, ev.LacWritten)
_BY_METADATA = (ev.MetadataWritten, ev.MetadataConflict)


class _Live:
    """_Live is a ledger this writer appends to (or did, and is closing)."""

    __slots__ = ("ledger_id", "writer", "created_ms", "opened_ms", "pushed", "bytes", "delivered",
                 "confirmed", "rolled", "closed")

    def __init__(self, ledger_id: int, writer: LedgerWriter, created_ms: int, now_ms: int) -> None:
        self.ledger_id = ledger_id
        self.writer = writer
        self.created_ms = created_ms
        self.opened_ms = now_ms
        self.pushed = 0             # entries appended
        self.bytes = 0              # payload bytes appended
        self.delivered = 0          # entries acknowledged to the application
        self.confirmed = -1         # highest entry the ledger confirmed
        self.rolled = False         # no more appends: a later ledger took over
        self.closed = False         # closed, and its end recorded in the list


class LogMachine:
    """LogMachine is the single writer of log `name`; call `start`, then feed events to `step`.

    `config` applies if the log is created here. `master_key`, `password_check` and the
    password-keyed digests come from the log's password (`digest_for(kind)` returns the Digest
    of a ledger's digest type). `owner` is recorded on the log (if created here) and on every
    ledger it creates. Timeouts are in milliseconds; time comes from Ticked events.
    """

    #: Seed 000: a roll waits until the previous ledger is closed (at most two unclosed).
    ROLL_WAITS_FOR_CLOSE = True
    #: Open fences and recovers every unclosed ledger of the list, not only the last one.
    RECOVER_EVERY_UNCLOSED = True

    def __init__(self, name: str, *, master_key: bytes, password_check: str,
                 digest_for: Callable[[str], Digest], config: LogConfig | None = None,
                 add_timeout_ms: int = 5000, recovery_timeout_ms: int = 30_000, explicit_lac_ms: int = 100,
                 open_attempts: int = 10, owner: str = "", now_ms: int = 0, wall_ms: int = 0,
                 max_bytes_in_flight: int = DEFAULT_MAX_BYTES_IN_FLIGHT) -> None:
        self.name = name
        self.owner = owner
        self.master_key = master_key
        self.password_check = password_check
        self.digest_for = digest_for
        self.initial_config = config or LogConfig()
        self.add_timeout_ms = add_timeout_ms
        self.recovery_timeout_ms = recovery_timeout_ms
        self.explicit_lac_ms = explicit_lac_ms
        self.max_bytes_in_flight = max_bytes_in_flight
        self.open_attempts = open_attempts
        self.state = OPENING
        self.error: WalkitError | None = None
        self.metadata: LogMetadata | None = None
        self.version = -1
        self._now, self._wall = now_ms, wall_ms
        self._tokens = itertools.count(1 << 40)      # internal tokens: far from the shell's
        self._machines: dict[int, object] = {}       # ledger id -> LedgerWriter | LedgerRecovery
        self._live: list[_Live] = []                 # oldest first; the last takes appends
        # opening
        self._attempt = 0
        self._recovered: dict[int, LogSegment | None] = {}   # ledger -> closed segment (None: gone)
        self._recovering: set[int] = set()
        self._open_token: int | None = None
        # the open's ledger, the ledgers it drops, and whether the list it replaces never held one
        self._pending_open: tuple[ev.LedgerCreated, set[int], bool] | None = None
        self._reopen_at: int | None = None
        # rolls
        self._roll_token: int | None = None          # CreateLedger of the roll in progress
        self._held: list[bytes] = []                 # appends waiting for the roll's switch
        self._roll_waiters: list[int] = []           # RollRequested tokens not answered yet
        self._auto_roll_at: int | None = None        # retry of a failed automatic roll
        # list updates, one CAS at a time
        self._cas_queue: deque[tuple[Callable[[LogMetadata], LogMetadata], Callable[[], list]]] = deque()
        self._cas_in_flight: Callable[[], list] | None = None
        self._truncates: set[int] = set()            # TruncateRequested tokens not answered yet
        self._handlers = {
            lev.LogMetadataRead: self._on_log_read, lev.LogMetadataWritten: self._on_log_written,
            lev.LogMetadataConflict: self._on_log_conflict, ev.LedgerCreated: self._on_created,
            ev.LedgerCreateFailed: self._on_create_failed, ev.LedgerMetadataRead: self._on_ledger_read,
            ev.AppendRequested: self._on_append, ev.CloseRequested: self._on_close,
            lev.RollRequested: self._on_roll, lev.TruncateRequested: self._on_truncate, ev.Ticked: self._on_tick,
        }

    # -- public ----------------------------------------------------------------------------------
    def start(self) -> list:
        """start reads the log's metadata: the first step of opening it."""
        return [lev.ReadLogMetadata(name=self.name)]

    def step(self, event) -> list:
        """step applies one event (the application's, the metadata's or a ledger's) and returns commands."""
        kind = type(event)
        if kind in _BY_LEDGER_ID:
            return self._route(event.ledger_id, event)
        if kind in _BY_METADATA:
            return self._route(event.metadata.ledger_id, event)
        return self._handlers[kind](event)

    @property
    def ledger_id(self) -> int | None:
        """ledger_id is the ledger appends go to now (None before the log is open)."""
        return self._live[-1].ledger_id if self._live else None

    @property
    def unclosed(self) -> list[int]:
        """unclosed lists the ledgers of this writer that are not closed and recorded yet."""
        return [live.ledger_id for live in self._live if not live.closed]

    def _to(self, state: LogState) -> None:
        assert state in _TRANSITIONS[self.state], f"log {self.name}: cannot go {self.state.name} -> {state.name}"
        self.state = state

    # -- ledger machines ----------------------------------------------------------------------------
    def _route(self, ledger_id: int, event) -> list:
        machine = self._machines.get(ledger_id)
        if machine is None or self.state is FAILED:
            return []
        return self._handle(ledger_id, machine.step(event))

    def _handle(self, ledger_id: int, commands: list) -> list:
        """_handle passes a ledger machine's I/O through and acts on its outcomes."""
        out: list = []
        for command in commands:
            kind = type(command)
            if kind is ev.CompleteAdds:
                out += self._on_confirmed(ledger_id, command.last_entry_id)
            elif kind is ev.FailRecovery:
                out += self._recovery_failed(ledger_id, command.error)
            elif kind is ev.FailAdds or kind is ev.FailClose:
                out += self._fail(command.error)
            elif kind is ev.CompleteClose:
                out += self._on_ledger_closed(ledger_id, command.metadata)
            elif kind is ev.CompleteRecovery:
                out += self._on_recovered(ledger_id, command.metadata)
            else:
                out.append(command)
        return out

    # -- opening ----------------------------------------------------------------------------------
    def _on_log_read(self, event: lev.LogMetadataRead) -> list:
        if self.state is not OPENING:
            return []
        if event.metadata is None:
            metadata = LogMetadata(name=self.name, config=self.initial_config, created_ms=self._wall, owner=self.owner)
            return [lev.CreateLogMetadata(name=self.name, metadata=metadata)]
        return self._recover_tail(event.metadata, event.version)

    def _recover_tail(self, metadata: LogMetadata, version: int) -> list:
        """_recover_tail fences and recovers the list's unclosed ledgers (docs/internals/protocol.md#logs)."""
        self.metadata, self.version = metadata, version
        unclosed = [s.ledger_id for s in metadata.segments if not s.is_closed]
        if not self.RECOVER_EVERY_UNCLOSED:
            unclosed = unclosed[-1:]
        self._recovered = {}
        self._recovering = set(unclosed)
        if not unclosed:
            return self._create_own_ledger()
        return [ev.ReadLedgerMetadata(ledger_id=ledger_id) for ledger_id in unclosed]

    def _on_ledger_read(self, event: ev.LedgerMetadataRead) -> list:
        ledger_id = event.ledger_id
        if self.state is not OPENING or ledger_id not in self._recovering or ledger_id in self._machines:
            return []
        if event.metadata is None:              # deleted: nothing of it can be read, drop it
            return self._recovery_done(ledger_id, None)
        md = event.metadata
        if md.unbounded:                        # a log of ledgers never makes one (UnboundedLogWriter does)
            return self._fail(ConfigError(f"ledger {ledger_id} of this log is unbounded: a log of ledgers "
                                          f"cannot recover it"), opening=True)
        recovery = LedgerRecovery(md, event.version, master_key=self.master_key, digest=self.digest_for(md.digest_type),
                                  timeout_ms=self.recovery_timeout_ms, add_timeout_ms=self.add_timeout_ms,
                                  now_ms=self._now)
        self._machines[ledger_id] = recovery
        return self._handle(ledger_id, recovery.start())

    def _on_recovered(self, ledger_id: int, metadata) -> list:
        self._machines.pop(ledger_id, None)
        last = metadata.last_entry_id
        segment = self.metadata.segment(ledger_id)
        closed = LogSegment(ledger_id, created_ms=segment.created_ms if segment else metadata.created_ms,
                            last_entry_id=last, entries=last + 1, size=0 if last < 0 else None, closed_ms=self._wall)
        return self._recovery_done(ledger_id, closed)

    def _recovery_failed(self, ledger_id: int, error: Exception) -> list:
        """_recovery_failed starts the open over after a pause (bookies may come back), a few times."""
        self._machines.pop(ledger_id, None)
        if self.state is not OPENING:
            return self._fail(error)
        self._attempt += 1
        if self._attempt >= self.open_attempts:
            return self._fail(error, opening=True)
        for other in list(self._recovering):        # recoveries still running are abandoned
            self._machines.pop(other, None)
        self._recovering.clear()
        self._reopen_at = self._now + OPEN_RETRY_MS
        return []

    def _recovery_done(self, ledger_id: int, segment: LogSegment | None) -> list:
        self._recovering.discard(ledger_id)
        self._recovered[ledger_id] = segment
        if self._recovering:
            return []
        return self._create_own_ledger()

    def _create_own_ledger(self) -> list:
        self._open_token = next(self._tokens)
        return [self._create_ledger(self._open_token)]

    def _create_ledger(self, token: int) -> ev.CreateLedger:
        cfg = self.metadata.config
        return ev.CreateLedger(token=token, ensemble=cfg.ensemble, write_quorum=cfg.write_quorum,
                               ack_quorum=cfg.ack_quorum, digest=cfg.digest, password_check=self.password_check,
                               custom=self.metadata.ledger_custom(), owner=self.owner)

    def _opened_list(self, new_ledger: int) -> tuple[LogMetadata, set[int]]:
        """_opened_list is the list with the recovered ledgers' ends, without empty ones, plus the new ledger."""
        metadata, dropped = self.metadata, set()
        for ledger_id, segment in self._recovered.items():
            if segment is None or segment.entries == 0:
                metadata = metadata.without({ledger_id})
                dropped.add(ledger_id)
            else:
                metadata = metadata.updated(segment)
        return metadata.with_segment(LogSegment(new_ledger, created_ms=self._wall)), dropped

    def _on_created(self, event: ev.LedgerCreated) -> list:
        if event.token == self._open_token and self.state is OPENING:
            self._open_token = None
            proposed, dropped = self._opened_list(event.metadata.ledger_id)
            first_writer = not self.metadata.segments and self.metadata.truncated_to < 0
            self._pending_open = (event, dropped, first_writer)
            return [ev.Failpoint(name="log.open.after_create"),
                    lev.WriteLogMetadata(name=self.name, metadata=proposed, expected_version=self.version)]
        if event.token == self._roll_token:
            return self._roll_created(event)
        return [ev.DeleteLedger(ledger_id=event.metadata.ledger_id)]     # nobody wants it any more

    def _on_create_failed(self, event: ev.LedgerCreateFailed) -> list:
        if event.token == self._open_token and self.state is OPENING:
            return self._fail(event.error, opening=True)
        if event.token == self._roll_token:
            self._roll_token = None
            self._auto_roll_at = self._now + ROLL_RETRY_MS
            waiters, self._roll_waiters = self._roll_waiters, []
            commands: list = [lev.RollFailed(token=t, error=event.error) for t in waiters]
            commands += self._release()
            if self.state is CLOSING:
                commands += self._close_current()
            return commands
        return []

    def _open_written(self, event: lev.LogMetadataWritten) -> list:
        created, dropped, first_writer = self._pending_open
        self._pending_open = None
        self.metadata, self.version = event.metadata, event.version
        md = created.metadata
        writer = LedgerWriter(md, created.version, master_key=self.master_key, digest=self.digest_for(md.digest_type),
                              add_timeout_ms=self.add_timeout_ms, explicit_lac_ms=self.explicit_lac_ms, now_ms=self._now,
                              max_bytes_in_flight=self.max_bytes_in_flight)
        self._machines[md.ledger_id] = writer
        self._live.append(_Live(md.ledger_id, writer, md.created_ms, self._now))
        self._to(WRITING)
        return ([ev.DeleteLedger(ledger_id=ledger_id) for ledger_id in sorted(dropped)]
                + [lev.LogOpened(metadata=self.metadata, first_writer=first_writer)])

    def _open_conflict(self, event: lev.LogMetadataConflict) -> list:
        created, _, _ = self._pending_open
        self._pending_open = None
        commands: list = [ev.DeleteLedger(ledger_id=created.metadata.ledger_id)]    # never written
        self._attempt += 1
        if self._attempt >= self.open_attempts:
            return commands + self._fail(LogContention(
                f"could not open log {self.name!r}: the ledger list changed {self.open_attempts} times "
                "while opening (another writer keeps opening it)"), opening=True)
        if event.metadata is None:
            return commands + self._fail(NoSuchLog(f"log {self.name!r} was deleted while opening"), opening=True)
        return commands + self._recover_tail(event.metadata, event.version)

    # -- appends ----------------------------------------------------------------------------------
    def _on_append(self, event: ev.AppendRequested) -> list:
        if self.state is not WRITING:
            error = self.error or (LedgerClosed(f"log {self.name!r} is closed") if self.state is not OPENING
                                   else WalkitError(f"log {self.name!r} is not open yet"))
            return [lev.RefuseAppends(count=len(event.payloads), error=error)]
        commands = self._maybe_roll()
        if self._roll_token is not None or self._roll_due():
            self._held += event.payloads          # they go to the next ledger
            return commands
        return commands + self._send(event.payloads)

    def _send(self, payloads: list[bytes]) -> list:
        """_send appends `payloads` to the current ledger."""
        if not payloads:
            return []
        live = self._live[-1]
        live.pushed += len(payloads)
        live.bytes += sum(map(len, payloads))
        return self._handle(live.ledger_id, live.writer.step(ev.AppendRequested(payloads=payloads)))

    def _release(self) -> list:
        """_release sends the appends held during a roll to whichever ledger is current now."""
        held, self._held = self._held, []
        return self._send(held)

    def _on_confirmed(self, ledger_id: int, last_entry_id: int) -> list:
        for live in self._live:
            if live.ledger_id == ledger_id:
                live.confirmed = last_entry_id
        return self._deliver()

    def _deliver(self) -> list:
        """_deliver acknowledges appends in log order: a ledger's only once the one before it is done."""
        out: list = []
        for live in self._live:
            if live.delivered <= live.confirmed:
                out.append(lev.CompleteAppends(ledger_id=live.ledger_id, first_entry_id=live.delivered,
                                               last_entry_id=live.confirmed))
                live.delivered = live.confirmed + 1
            if not live.rolled or live.delivered < live.pushed:
                break
        return out

    # -- rolling ----------------------------------------------------------------------------------
    def _on_roll(self, event: lev.RollRequested) -> list:
        if self.state is not WRITING:
            return [lev.RollFailed(token=event.token, error=self.error or LedgerClosed(f"log {self.name!r} is closed"))]
        self._roll_waiters.append(event.token)
        return self._maybe_roll()

    def _roll_due(self) -> bool:
        live = self._live[-1]
        if self._roll_waiters:
            return True
        if live.pushed == 0 or (self._auto_roll_at is not None and self._now < self._auto_roll_at):
            return False
        cfg = self.metadata.config
        return bool((cfg.roll_entries and live.pushed >= cfg.roll_entries)
                    or (cfg.roll_bytes and live.bytes >= cfg.roll_bytes)
                    or (cfg.roll_age_s and self._now - live.opened_ms >= cfg.roll_age_s * 1000))

    def _maybe_roll(self) -> list:
        """_maybe_roll starts a roll if one is due, none runs, and the previous ledger is closed."""
        if self.state is not WRITING or self._roll_token is not None or not self._roll_due():
            return []
        if self.ROLL_WAITS_FOR_CLOSE and len(self.unclosed) > 1:
            return []        # the previous ledger is still closing: the roll starts once it is done
        self._auto_roll_at = None
        self._roll_token = next(self._tokens)
        return [self._create_ledger(self._roll_token)]

    def _roll_created(self, event: ev.LedgerCreated) -> list:
        md = event.metadata
        if self.state is not WRITING:       # closing: the ledger is not needed, the held appends are
            self._roll_token = None
            commands: list = [ev.DeleteLedger(ledger_id=md.ledger_id)] + self._release()
            return commands + (self._close_current() if self.state is CLOSING else [])

        def switched() -> list:
            return self._switch(event)
        segment = LogSegment(md.ledger_id, created_ms=self._wall)
        return [ev.Failpoint(name="log.roll.after_create")] + self._update(lambda m: m.with_segment(segment), switched)

    def _switch(self, created: ev.LedgerCreated) -> list:
        """_switch sends appends to the new ledger and closes the previous one.

        The rule: docs/internals/protocol.md#rolling.
        """
        self._roll_token = None
        if self.state is FAILED:            # listed after the writer failed: the next open recovers it
            return []
        md = created.metadata
        writer = LedgerWriter(md, created.version, master_key=self.master_key, digest=self.digest_for(md.digest_type),
                              add_timeout_ms=self.add_timeout_ms, explicit_lac_ms=self.explicit_lac_ms, now_ms=self._now,
                              max_bytes_in_flight=self.max_bytes_in_flight)
        self._machines[md.ledger_id] = writer
        previous = self._live[-1]
        previous.rolled = True
        self._live.append(_Live(md.ledger_id, writer, md.created_ms, self._now))
        waiters, self._roll_waiters = self._roll_waiters, []
        commands: list = [ev.Failpoint(name="log.roll.after_cas")]
        commands += [lev.RollCompleted(token=t, ledger_id=md.ledger_id) for t in waiters]
        commands += self._release()
        commands += self._handle(previous.ledger_id, previous.writer.step(ev.CloseRequested()))
        if self.state is CLOSING:           # close came while the new ledger was being listed: close it too
            commands += self._close_current()
        return commands + self._deliver()

    def _on_ledger_closed(self, ledger_id: int, metadata) -> list:
        live = next(x for x in self._live if x.ledger_id == ledger_id)
        last = metadata.last_entry_id
        segment = LogSegment(ledger_id, created_ms=live.created_ms, last_entry_id=last, entries=last + 1,
                             size=live.bytes if last + 1 == live.pushed else None, closed_ms=self._wall)

        def recorded() -> list:
            live.closed = True
            self._machines.pop(ledger_id, None)
            if self.state is FAILED:        # recorded after the writer failed: nothing more to tell
                return []
            commands = self._deliver()
            # A ledger leaves _live once closed and every append of it acknowledged: one closed before
            # the ledger ahead of it (a close during a roll) still has appends waiting for that one.
            while len(self._live) > 1 and self._live[0].closed and self._live[0].delivered >= self._live[0].pushed:
                self._live.pop(0)
            commands += self._apply_retention()
            if self.state is CLOSING:
                return commands + self._maybe_closed()
            return commands + self._maybe_roll()
        return self._update(lambda m: m.updated(segment) if m.segment(ledger_id) else m, recorded)

    # -- truncation and retention -------------------------------------------------------------------
    def _on_truncate(self, event: lev.TruncateRequested) -> list:
        if self.state is not WRITING and self.state is not CLOSING:
            return [lev.TruncateFailed(token=event.token, error=self.error or LedgerClosed(f"log {self.name!r} is closed"))]
        self._truncates.add(event.token)
        return self._remove(lambda m: {s.ledger_id for s in m.before(event.before)}, event.token)

    def _apply_retention(self) -> list:
        wall = self._wall
        return self._remove(lambda m: {s.ledger_id for s in m.expired(wall)}, None)

    def _remove(self, doomed_of: Callable[[LogMetadata], set[int]], token: int | None) -> list:
        """_remove takes whole closed ledgers out of the list by CAS, then deletes them.

        It never takes the list's last ledger, so an opened log's list is never empty again
        (walkit.core.replica's first writer, which skips the lease wait, relies on it): a closing
        writer may have closed that ledger when a truncation past its end comes.
        """
        doomed: set[int] = set()

        def change(metadata: LogMetadata) -> LogMetadata:
            last = {metadata.segments[-1].ledger_id} if metadata.segments else set()
            doomed.update(doomed_of(metadata) - set(self.unclosed) - last)
            return metadata.truncated(doomed)

        def done() -> list:
            commands: list = [ev.DeleteLedger(ledger_id=i) for i in sorted(doomed)]
            if token in self._truncates:      # not answered yet (a failure answers it at once)
                self._truncates.discard(token)
                commands.append(lev.TruncateCompleted(token=token, ledger_ids=tuple(sorted(doomed))))
            return commands
        return self._update(change, done)

    # -- the list, one CAS at a time ----------------------------------------------------------------
    def _update(self, change: Callable[[LogMetadata], LogMetadata], done: Callable[[], list]) -> list:
        """_update queues `change` of the list; `done()` runs once it is written (commands it returns go out)."""
        self._cas_queue.append((change, done))
        return self._next_update()

    def _next_update(self) -> list:
        out: list = []
        while self._cas_in_flight is None and self._cas_queue and self.state is not FAILED:
            change, done = self._cas_queue.popleft()
            proposed = change(self.metadata)
            if proposed == self.metadata:
                out += done()
                continue
            self._cas_in_flight = done
            out.append(lev.WriteLogMetadata(name=self.name, metadata=proposed, expected_version=self.version))
        return out

    def _on_log_written(self, event: lev.LogMetadataWritten) -> list:
        if self.state is OPENING:
            if self._pending_open is None:     # the log was just created
                return self._recover_tail(event.metadata, event.version)
            return self._open_written(event)
        done, self._cas_in_flight = self._cas_in_flight, None
        if done is None:
            return []
        self.metadata, self.version = event.metadata, event.version
        commands = done() + self._next_update()
        if self.state is CLOSING:
            commands += self._maybe_closed()
        return commands

    def _on_log_conflict(self, event: lev.LogMetadataConflict) -> list:
        if event.refused is not None:          # the store will not let this writer write the log: trying again won't
            commands: list = []
            if self.state is OPENING and self._pending_open is not None:
                commands.append(ev.DeleteLedger(ledger_id=self._pending_open[0].metadata.ledger_id))  # never written
                self._pending_open = None
            self._cas_in_flight = None
            return commands + self._fail(event.refused, opening=self.state is OPENING)
        if self.state is OPENING:
            if self._pending_open is None:     # created by a racing writer: use theirs
                if event.metadata is None:
                    return [lev.ReadLogMetadata(name=self.name)]
                return self._recover_tail(event.metadata, event.version)
            return self._open_conflict(event)
        self._cas_in_flight = None
        return self._fail(LedgerFenced(f"log {self.name!r} was opened by another writer"))

    # -- closing ----------------------------------------------------------------------------------
    def _on_close(self, event: ev.CloseRequested) -> list:
        if self.state is CLOSED:
            return [lev.LogClosed(metadata=self.metadata)]
        if self.state is FAILED:
            return [lev.LogCloseFailed(error=self.error)]
        if self.state is CLOSING:
            return []
        if self.state is OPENING:
            return self._fail(LedgerClosed(f"log {self.name!r} was closed while opening"), opening=True)
        self._to(CLOSING)
        waiters, self._roll_waiters = self._roll_waiters, []
        commands: list = [lev.RollFailed(token=t, error=LedgerClosed(f"log {self.name!r} is closing")) for t in waiters]
        if self._roll_token is None:        # appends held for a roll that will not come now: this ledger takes them
            commands += self._release() + self._close_current()
        return commands

    def _close_current(self) -> list:
        live = self._live[-1]
        live.rolled = True
        return self._handle(live.ledger_id, live.writer.step(ev.CloseRequested()))

    def _maybe_closed(self) -> list:
        if (self.state is not CLOSING or any(not live.closed for live in self._live)
                or self._cas_in_flight or self._cas_queue):
            return []
        self._to(CLOSED)
        return [lev.LogClosed(metadata=self.metadata)]

    # -- failure and time ---------------------------------------------------------------------------
    def _fail(self, error: Exception, opening: bool = False) -> list:
        """_fail ends the writer; every unacknowledged and later append fails with `error`."""
        if self.state is FAILED:
            return []
        was_opening = self.state is OPENING
        self._to(FAILED)
        self.error = error
        self._cas_queue.clear()
        self._held.clear()
        waiters, self._roll_waiters = self._roll_waiters, []
        commands: list = [lev.RollFailed(token=t, error=error) for t in waiters]
        # Truncations queued or in flight fail too; one whose CAS is in flight may still take effect
        # (its late answer deletes the ledgers it removed), as a failed call's outcome is unknown.
        commands += [lev.TruncateFailed(token=t, error=error) for t in sorted(self._truncates)]
        self._truncates.clear()
        if was_opening or opening:
            return commands + [lev.LogOpenFailed(error=error)]
        return commands + [lev.FailAppends(error=error), lev.LogCloseFailed(error=error)]

    def _on_tick(self, event: ev.Ticked) -> list:
        self._now, self._wall = event.now_ms, event.wall_ms or self._wall
        if self.state is FAILED or self.state is CLOSED:
            return []
        commands: list = []
        for ledger_id, machine in list(self._machines.items()):
            commands += self._handle(ledger_id, machine.step(event))
            if self.state is FAILED:
                return commands
        if self.state is WRITING:
            commands += self._maybe_roll()
        elif self._reopen_at is not None and self._now >= self._reopen_at:
            self._reopen_at = None
            commands += self.start()
        return commands

