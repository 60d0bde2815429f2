"""walkit.core.replica is the sans-IO machine of one walkit.replicate node: its role, lease, sessions and apply order.

A replicated state machine (docs/internals/protocol.md#replicated-state-machines) runs one node per
process; one of them leads. The machine decides everything a node decides, fed with events and returning commands
(walkit.core.replicaevents), as the ledger and log machines do; the shell (walkit.replication.node)
runs the election, the metadata session, the application's state machine and snapshots, and
hands the I/O of the log writer and reader this machine runs to the dispatcher.

Roles (`Role`, transitions in `_TRANSITIONS`, each one asserted):

    FOLLOWING      a LogReader tails the log from the last entry queued for apply; the node
                   campaigns (Campaign) unless it was told to wait
    OPENING        elected: the follower's reader is dropped and a LogMachine opens the log,
                   fencing and recovering the previous leader's ledgers (walkit.core.log)
    REPLAYING      the log is open: a reader (not following) reads what is left before the
                   new ledger; the node leads once all of it is applied AND the lease wait is over
    LEADING        submits are batched into entries, appended, applied once acknowledged, in
                   log order; reads are answered from the state under the lease
    STEPPING_DOWN  the writer closes (appends in flight end one way or the other), then Resign
    STOPPED        after StopRequested

Every node applies every entry once, in log order: entries go through one queue (`_queue`),
and ApplyEntry leaves for the next entry only once EntryApplied answered the one before. The
reader of a follower starts after the last entry queued, and a leader's replay too, so an entry
is never queued twice; a restored snapshot drops what it covers.

The lease (how a leader answers reads from its own state without asking anyone). Rule:

    A leader answers a read from its state only while its metadata session is CONNECTED and
    its clock is below `lease_until`: the send time of the last append that was acknowledged
    (or of the last proof of leadership: its ledger still the log's last, and OPEN), plus
    `lease_ms`. A new leader accepts no submit until `lease_ms * (1 + drift) / (1 - drift)`
    after its log open finished (the fence), on its own clock, unless its open was the log's
    first (LogOpened.first_writer: the list it replaced never held a ledger).

Why it holds: a leader's reads return everything acknowledged before them, unless another
leader acknowledged a write meanwhile. Another leader writes only after it opened the log,
fencing this one's ledger first (time F); appends sent after F are never acknowledged (Qa of
the fenced bookies refuse them), and a proof of leadership read after the new leader marked
this ledger IN_RECOVERY fails. So every lease this leader holds started before F and ends,
in real time, before F + lease_ms * (1 + drift). The new leader's open finished after F, and
it waits, on a clock that may run `drift` slow, long enough for that much real time to pass:
its first write comes after every earlier lease ended. The argument needs one assumption:
clocks run at rates within `drift` (ReplicaConfig.max_clock_drift, default 5%) of real time;
it needs none about sessions, pauses or networks. A SUSPENDED session also stops lease reads
at once (the node may be cut off), which shortens how long a partitioned leader goes on
answering reads from its own state, though the wait alone makes them safe.

The first open of a log has no earlier leader to wait for. A leader's lease starts only once
its ledger is in the list (an acknowledged append, or a proof that its ledger is the list's
last), and a ledger leaves the list only by a later open, which adds its own in the same CAS,
or by truncation once closed (a ledger that held records raises `truncated_to`), while the
writer's current ledger stays open for as long as its node leads. A list that holds no ledger
and never lost one that held records therefore had no leader; a list of empty ledgers may have had one
(a proof on an empty ledger starts a lease), so its next leader waits. Deleting a log under a
running leader and creating it again is outside the rule: the old leader may answer reads from
the deleted log's state until its lease ends.

Exactly-once submits (walkit.core.sessions): a submit may name a client session (client id,
seq). The leader writes it with the record (walkit.core.batch format 2) and every node keeps
the session table in log order: a duplicate is answered with the first result and not applied
again. The table is part of snapshots (SnapshotState) and of restores (Restored).

Applying: entries go to the shell (ApplyEntry) in log order, in groups: when nothing is out,
every entry queued (up to APPLY_GROUP) goes at once, and the next group once the shell answered
each entry of this one (EntryApplied, in order). So a follower that read several entries at once
costs the shell one hand-over, not one per entry, and the group's last answer releases the reads
it satisfies and tells the reader what was consumed, once for the group. Planning an entry
(which records apply, which are duplicates) records its new sessions at once, their results
pending until applied, so each entry is planned against the table as a one-at-a-time application
would leave it; a group stops before an entry holding a duplicate of a record whose result is
still pending. Only the group's last entry may take a snapshot (ApplyEntry.last).

Reads: ReadRequested is answered by ReadReady once this node applied every record acknowledged
before the request. The leader, within its lease, answers at once (its state is current as
soon as it applied its acknowledged entries); outside it, it proves its leadership first (a
proof that fails deposes it, and the read is answered as a follower's). A follower finds the
log's end (walkit.core.logend) and answers once it applied that far, finding it again after
`poll_ms` if it has not by then.

Errors: an entry that does not decode (not written by walkit.replicate, or by a newer one) stops
the node's applying: Unhealthy says why, the node stops campaigning and a leader steps down;
it never skips an entry. A reader that fails with LogTruncated (a snapshot covers what it
needs) asks for the latest snapshot (LoadSnapshot); any other reader failure is retried, and
Trouble names it until the reader delivers again (a failed append too, until the node leads
again): the node is healthy but says what it is retrying.
"""

from __future__ import annotations

import enum
import itertools
from collections import deque
from dataclasses import dataclass
from typing import Callable

from walkit.core import batch
from walkit.core import events as ev
from walkit.core import logevents as lev
from walkit.core import replicaevents as rev
from walkit.core.digest import Digest
from walkit.core.log import LogMachine
from walkit.core.logend import FoundLogEnd, LogEndFinder
from walkit.core.loglist import LogConfig, Position
from walkit.core.logreader import LogReader
from walkit.core.metadata import OPEN as LEDGER_OPEN
from walkit.core.sessions import DEFAULT_TTL_MS, SessionTable
from walkit.errors import ConfigError, LogTruncated, NoSuchLog, NotLeader, WalkitError

#: The position a node that applied nothing reads from: before any ledger, so truncation shows.
START = Position(0, 0)
#: How long a failed reader or log open waits before it is started again.
RETRY_MS = 500
#: How long after its last event (other than a tick) a node stays ticked at the shell's pace: the
#: writer's explicit LAC, a reader's retries and the like run on ticks in that time.
QUIET_MS = 1000
#: How often the shell ticks a quiet node (see ReplicaMachine.quiet).
IDLE_TICK_MS = 1000


def after(position: Position | None) -> Position:
    """after is where reading resumes past `position` (the log's start if None)."""
    return START if position is None else Position(position.ledger_id, position.entry_id + 1)


class Role(str, enum.Enum):
    """Role is what a node does now (see the module doc)."""

    FOLLOWING = "FOLLOWING"
    OPENING = "OPENING"
    REPLAYING = "REPLAYING"
    LEADING = "LEADING"
    STEPPING_DOWN = "STEPPING_DOWN"
    STOPPED = "STOPPED"


FOLLOWING, OPENING, REPLAYING, LEADING, STEPPING_DOWN, STOPPED = Role

_TRANSITIONS = {
    FOLLOWING: {OPENING, STOPPED},
    OPENING: {REPLAYING, STEPPING_DOWN},
    REPLAYING: {LEADING, STEPPING_DOWN},
    LEADING: {STEPPING_DOWN},
    STEPPING_DOWN: {FOLLOWING, STOPPED},
    STOPPED: set(),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaConfig:
    """ReplicaConfig is what a node is told (walkit.replicate's options; times in milliseconds).

    `log` configures the log if this node creates it. `lease_ms` is the lease (0: no lease
    reads; every read proves leadership); `max_clock_drift` bounds how far a clock's rate may
    be from real time (the lease wait grows with it). `max_batch_records`, `max_batch_bytes`,
    `max_entries_in_flight` and `linger_ms` shape group commit; `max_entry_bytes` is the client's
    entry limit. `session_ttl_ms` is how long an idle client session is remembered. `poll_ms`
    paces retried reads and reads of the log's list; `tail_poll_ms` is how long the follower's
    reader long-polls the bookies (for the next entry and the LAC) before it reads the ledger's
    metadata again (LogChanged, from the shell's watch of the log's metadata, cuts that short). `follow_linger_ms`
    is how long a follower that applied everything its reader delivered waits before its next long poll, so
    the entries appended meanwhile come in one answer and one read instead of a long poll each (its CPU and
    the bookies' per entry, for entries applied up to that much later; a read barrier on the follower cuts
    it short; 0 polls at once). `explicit_lac_ms` is how long the
    leader's writer stays idle before it tells the bookies its LAC, so followers see the last
    entry (walkit.core.writer): the longest a follower waits to apply it when nothing follows.
    """

    log: LogConfig
    lease_ms: int = 1000
    max_clock_drift: float = 0.05
    max_batch_records: int = 4096
    max_batch_bytes: int = 1 << 20
    max_entries_in_flight: int = 8
    linger_ms: float = 0.0
    max_entry_bytes: int = 60 * 1024 * 1024
    session_ttl_ms: int = DEFAULT_TTL_MS
    poll_ms: int = 200
    tail_poll_ms: int = 30_000
    follow_linger_ms: int = 0
    add_timeout_ms: int = 5000
    recovery_timeout_ms: int = 30_000
    read_timeout_ms: int = 10_000
    explicit_lac_ms: int = 100

    def __post_init__(self) -> None:
        if self.lease_ms < 0 or not 0 <= self.max_clock_drift < 0.5:
            raise ConfigError(f"lease_ms must not be negative and max_clock_drift must be in [0, 0.5), got "
                              f"{self.lease_ms} and {self.max_clock_drift}")

    @property
    def lease_wait_ms(self) -> int:
        """lease_wait_ms is how long a new leader waits after its open before it writes (see the module doc)."""
        drift = self.max_clock_drift
        return int(self.lease_ms * (1 + drift) / (1 - drift)) + 1 if self.lease_ms else 0


class _Batch:
    """_Batch is one entry appended and not yet acknowledged: its submit tokens, submitters and bytes."""

    __slots__ = ("tokens", "submitters", "sent_ms", "connected", "entry")

    def __init__(self, tokens: list, submitters: set, sent_ms: int, connected: bool, entry: bytes) -> None:
        self.tokens, self.submitters = tokens, submitters
        self.sent_ms, self.connected, self.entry = sent_ms, connected, entry


class _Queued:
    """_Queued is one entry waiting to be applied: where it is, its records and (on the leader) tokens."""

    __slots__ = ("position", "entry", "tokens")

    def __init__(self, position: Position, entry: batch.Entry, tokens: list | None) -> None:
        self.position, self.entry, self.tokens = position, entry, tokens


#: The most entries handed to the shell at once (one group; see the module doc's Applying).
APPLY_GROUP = 64


class _Applying:
    """_Applying is an entry ApplyEntry handed to the shell: what each of its records gets."""

    __slots__ = ("queued", "plan", "applied_index")

    def __init__(self, queued: _Queued, plan: list, applied_index: list[int]) -> None:
        self.queued = queued
        self.plan = plan                     # per record: ("apply", k) | ("dup", result) | ("same", i)
        self.applied_index = applied_index   # record index of each record handed over


class ReplicaMachine:
    """ReplicaMachine is one node of replicated machine `name` (see the module doc).

    `node_id` names the node; `password` keys the log; `digest_for(kind)` returns the Digest of
    a ledger's digest type; `applied` and `sessions` are what the node restored before it
    started (a snapshot's position and client sessions). Time comes from Ticked events: each
    node's own monotonic clock (`now_ms`) and wall clock (`wall_ms`, for entry stamps).
    """

    #: A new leader waits out earlier leases before its first write (the module doc's rule).
    NEW_LEADER_WAITS = True
    #: A lease starts when the append was sent, not when its acknowledgement came.
    LEASE_FROM_SEND = True
    #: Lease reads stop while the metadata session is SUSPENDED.
    SUSPENDED_STOPS_LEASE = True
    #: Snapshots carry the client sessions (a duplicate after a restore is still found).
    SNAPSHOT_SESSIONS = True
    #: An entry's new sessions are recorded when it is planned (their results pending until applied), so the
    #: entries of a group after it are planned against them. Flipped, they are recorded once applied, which is
    #: right one entry at a time: a group's later entry then takes a retry of its record for a new one.
    SESSIONS_AT_PLAN = True
    #: A wait for a position (ReadRequested.upto: node.wait_applied) is answered once the node applied it.
    WAIT_APPLIED_WAITS = True

    def __init__(self, name: str, node_id: str, config: ReplicaConfig, *, master_key: bytes, password_check: str,
                 digest_for: Callable[[str], Digest], password: bytes = b"", owner: str = "",
                 applied: Position | None = None, sessions: bytes = b"", now_ms: int = 0, wall_ms: int = 0) -> None:
        self.name = name
        self.log_name = f"replicated-{name}"
        self.node_id = node_id
        self.config = config
        self.master_key = master_key
        self.password_check = password_check
        self.digest_for = digest_for
        self.password = password
        self.owner = owner
        self.role = FOLLOWING
        self.epoch: int | None = None
        self.session_state = "CONNECTED"
        self.healthy = True
        self.why_unhealthy = ""
        self.trouble: str | None = None                     # a failure being retried (Trouble)
        self.applied = applied                      # the last entry applied
        self._queued_upto = applied                 # the last entry queued for apply (or applied)
        self.sessions = SessionTable.from_bytes(sessions, config.session_ttl_ms) if sessions \
            else SessionTable(config.session_ttl_ms)
        self.records_applied = 0
        self._now, self._wall = now_ms, wall_ms
        self._keys = itertools.count(1)
        self._queue: deque[_Queued] = deque()
        self._applying: deque[_Applying] = deque()       # handed to the shell, in log order, not applied yet
        self._reader_wakes_at = -1                        # the follower's reader lingers until then
        self._snapshot_requested = False            # SnapshotState due once the entry being applied is done
        # sub-machines, by key; answers for a key that is gone are dropped
        self._subs: dict[str, object] = {}
        self._reader_key: str | None = None
        self._writer_key: str | None = None
        self._reader_retry_at: int | None = None
        self._restoring = False                     # the reader needs a snapshot: no entry starts meanwhile
        self._restore_asked = False
        self._stopping = False
        # leadership
        self._writes_from_ms = 0                    # no submit is appended before (the lease wait)
        self._active_ms = now_ms                    # when the last event other than a tick came (quiet)
        self._replayed = False
        self.lease_until = 0
        self.last_acked: Position | None = None
        self._pending: deque = deque()              # (record, token, submitter, session) not appended yet
        self._queued_by: dict[object, int] = {}     # records queued per submitter (linger)
        self._pending_bytes = 0
        self._in_flight: deque[_Batch] = deque()
        self._linger_target = 0
        self._linger_until: int | None = None
        self._campaigning = False
        self._truncations: dict[int, int] = {}           # the writer's truncate token -> the shell's
        # reads
        self._reads: dict[int, Position | None] = {}     # token -> target (None: nothing to wait for)
        self._read_started: dict[int, int] = {}          # token -> when its target was found (follower)
        self._finders: dict[str, list[int]] = {}         # finder key -> the read tokens waiting for it
        self._proofs: dict[str, list] = {}               # proof key -> [tokens, started_ms, answers]
        self._parked_reads: list[int] = []                # reads that came while the role was changing

    # -- queries -------------------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        """is_leader is True while this node accepts submits."""
        return self.role is LEADING

    @property
    def lease_valid(self) -> bool:
        """lease_valid is True while this leader may answer reads from its own state (the module doc's rule),
        as of the last time the node was told (`at`)."""
        return self.lease_valid_at(self._now)

    def lease_valid_at(self, now_ms: int) -> bool:
        """lease_valid_at is lease_valid as of `now_ms`. A shell that answers reads between events asks with
        its clock read now: the node's own clock stops between events (it ticks once a second while quiet),
        and a process paused past its lease must not answer from the time it was paused."""
        if self.role is not LEADING or max(now_ms, self._now) >= self.lease_until:
            return False
        return self.session_state == "CONNECTED" or not self.SUSPENDED_STOPS_LEASE

    def _to(self, role: Role, why: str = "") -> list:
        assert role in _TRANSITIONS[self.role], f"{self.node_id}: a node cannot go {self.role.name} -> {role.name}"
        self.role = role
        return [rev.RoleChanged(role=role.value, epoch=self.epoch, why=why)]

    # -- entry points --------------------------------------------------------------------------
    def start(self) -> list:
        """start follows the log from what the node restored, and campaigns."""
        return self._follow() + self._campaign()

    def at(self, now_ms: int, wall_ms: int) -> None:
        """at sets the node's clock without ticking anything (the shell calls it before an event, so lingers
        and lease starts are measured from when the event came, not from the last tick)."""
        if now_ms > self._now:
            self._now = now_ms
        if wall_ms > self._wall:
            self._wall = wall_ms

    def quiet(self) -> bool:
        """quiet is True while nothing here needs time to pass soon: a follower long-polling the log, a leader
        with nothing in flight, both idle for QUIET_MS. The shell may then tick it rarely (IDLE_TICK_MS);
        timers it sets meanwhile come as Wake."""
        if self.role is not FOLLOWING and self.role is not LEADING:
            return False
        if (self._reads or self._pending or self._in_flight or self._queue or self._applying
                or self._reader_retry_at is not None or self._finders or self._proofs or self._truncations
                or self._restoring or self._linger_until is not None or self._parked_reads
                or self._now <= self._reader_wakes_at):
            return False
        return self._now - self._active_ms >= QUIET_MS

    def waits_for_applied(self) -> bool:
        """waits_for_applied tells whether anything here waits for the shell's next EntryApplied beyond the
        submits the shell answers itself: entries queued behind the group being applied, reads, a
        snapshot, duplicates answered at EntryApplied, or any role but LEADING. When it is False the
        shell may hand EntryApplied over with its next event instead of waking for it."""
        return bool(self.role is not LEADING or self._queue or self._reads or self._parked_reads
                    or self._snapshot_requested or self._restoring or self._stopping or self._finders
                    or self._truncations or self._proofs
                    or any(len(applying.applied_index) != len(applying.plan) for applying in self._applying))

    def step(self, event) -> list:
        """step applies one event and returns commands."""
        if self.role is STOPPED:
            return []
        kind = type(event)
        if kind is not ev.Ticked:
            self._active_ms = self._now
        if kind is rev.From:
            return self._from(event.key, event.event)
        handler = _HANDLERS.get(kind)
        if handler is None:
            raise TypeError(f"a replica machine does not take {event!r}")
        return handler(self, event)

    # -- sub-machines ----------------------------------------------------------------------------
    def _new_sub(self, prefix: str, machine, commands: list) -> tuple[str, list]:
        key = f"{prefix}{next(self._keys)}"
        self._subs[key] = machine
        return key, self._via(key, commands)

    def _via(self, key: str, commands: list) -> list:
        """_via wraps a sub-machine's commands: I/O goes out in one Via, outcomes are handled here."""
        io, out = [], []
        for command in commands:
            if isinstance(command, _OUTCOMES):
                out.append(command)
            else:
                io.append(command)
        result: list = [rev.Via(key, io)] if io else []
        for outcome in out:
            result += self._outcome(key, outcome)
        return result

    def _from(self, key: str, event) -> list:
        if key in self._proofs:
            return self._on_proof(key, event)
        machine = self._subs.get(key)
        if machine is None or type(event) is ev.Ticked:
            return []                                # dropped (a late answer), or ticked with the node
        return self._via(key, machine.step(event))

    def _drop(self, key: str | None) -> None:
        if key is not None:
            self._subs.pop(key, None)

    def _outcome(self, key: str, command) -> list:
        kind = type(command)
        if key == self._writer_key:
            return self._writer_outcome(command)
        if key == self._reader_key:
            return self._reader_outcome(command)
        if kind is FoundLogEnd:
            self._drop(key)
            return self._found_end(key, command.position)
        return []

    # -- following ---------------------------------------------------------------------------------
    def _follow(self) -> list:
        """_follow starts a reader that tails the log after the last entry queued."""
        self._reader_retry_at = None
        reader = LogReader(self.log_name, password=self.password, start=after(self._queued_upto), follow=True,
                           poll_ms=self.config.poll_ms, long_poll_ms=self.config.tail_poll_ms,
                           read_timeout_ms=self.config.read_timeout_ms, now_ms=self._now,
                           linger_ms=self.config.follow_linger_ms)
        self._reader_key, commands = self._new_sub("r", reader, reader.start())
        return commands

    def _on_log_changed(self, event: rev.LogChanged) -> list:
        """_on_log_changed: the log's metadata changed (a roll, a new leader); the follower's reader looks now."""
        reader = self._subs.get(self._reader_key) if self._reader_key else None
        if reader is None or self.role is not FOLLOWING:
            return []
        return self._via(self._reader_key, reader.step(lev.LogChanged()))

    def _replay(self) -> list:
        """_replay reads what the log holds before this leader's ledger (not following)."""
        reader = LogReader(self.log_name, password=self.password, start=after(self._queued_upto), follow=False,
                           poll_ms=self.config.poll_ms, read_timeout_ms=self.config.read_timeout_ms, now_ms=self._now,
                           attempts=1 << 30)
        self._reader_key, commands = self._new_sub("p", reader, reader.start())
        return commands

    def _stop_reader(self) -> None:
        self._drop(self._reader_key)
        self._reader_key = None
        self._reader_retry_at = None

    def _reader_outcome(self, command) -> list:
        kind = type(command)
        if kind is lev.DeliverRecords:
            for entry in command.entries:
                position = Position(command.ledger_id, entry.entry_id)
                if self._queued_upto is not None and position <= self._queued_upto:
                    continue                         # restored past it already
                self._queue_entry(position, entry.payload, None)
            return self._troubled(None) + self._next_apply()
        if kind is lev.ReaderCaughtUp:
            if command.wake_at_ms is not None:
                if self._reads:                      # a read barrier waits: no linger
                    return self._troubled(None) + self._hurry_reader()
                self._reader_wakes_at = command.wake_at_ms      # not quiet till then: ticked, not only woken
                return self._troubled(None) + [rev.Wake(at_ms=command.wake_at_ms)]
            return self._troubled(None)
        if kind is lev.ReaderRetrying:
            return self._troubled(f"cannot read the log: {type(command.error).__name__}: {command.error}")
        if kind is ev.CompleteRead:                  # the replay read everything
            self._stop_reader()
            self._replayed = True
            return self._maybe_lead()
        if kind is ev.FailRead:
            self._stop_reader()
            if isinstance(command.error, LogTruncated):
                self._restoring = True               # asked for once the entry being applied is done
                return self._ask_restore()
            if self.role is FOLLOWING or self.role is REPLAYING:
                self._reader_retry_at = self._now + RETRY_MS
                why = (None if isinstance(command.error, NoSuchLog)          # no leader made it yet
                       else f"cannot read the log: {type(command.error).__name__}: {command.error}")
                return self._troubled(why) + [rev.Wake(at_ms=self._reader_retry_at)]
            return []
        return []

    def _troubled(self, why: str | None) -> list:
        """_troubled notes a failure being retried (None: it is over); Trouble tells the shell when that changes."""
        if why == self.trouble:
            return []
        self.trouble = why
        return [rev.Trouble(why=why)]

    def _ask_restore(self) -> list:
        """_ask_restore asks for the latest snapshot, between two entries (none is being applied)."""
        if not self._restoring or self._applying or self._restore_asked:
            return []
        self._restore_asked = True
        return [rev.LoadSnapshot()]

    def _consumed(self, position: Position) -> list:
        """_consumed tells the reader that delivered `position` that it was applied (its window moves)."""
        reader = self._subs.get(self._reader_key) if self._reader_key else None
        if reader is None:
            return []
        return self._via(self._reader_key, reader.step(ev.EntriesConsumed(upto=position.entry_id,
                                                                          ledger_id=position.ledger_id,
                                                                          now_ms=self._now)))

    def _hurry_reader(self) -> list:
        """_hurry_reader ends the follower's reader's linger (`follow_linger_ms`): a read waits for the log's end."""
        reader = self._subs.get(self._reader_key) if self._reader_key else None
        if reader is None or self.role is not FOLLOWING or not self.config.follow_linger_ms:
            return []
        return self._via(self._reader_key, reader.step(lev.CatchUp()))

    def _campaign(self) -> list:
        if self._campaigning or not self.healthy or self._stopping:
            return []
        self._campaigning = True
        return [rev.Campaign()]

    # -- applying ----------------------------------------------------------------------------------
    def _queue_entry(self, position: Position, payload: bytes, tokens: list | None) -> None:
        try:
            entry = batch.decode_entry(payload)
        except batch.BatchError as exc:
            entry = exc                               # applied in turn: the node stops there
        self._queue.append(_Queued(position, entry, tokens))
        self._queued_upto = position

    def _next_apply(self) -> list:
        """_next_apply hands the queued entries to the shell, as a group, once the group before was applied."""
        commands: list = self._ask_restore()
        handed: list = []
        applying = self._applying
        while (not applying or handed) and self._queue and self.healthy and not self._restoring \
                and len(applying) < APPLY_GROUP:
            queued = self._queue[0]
            entry = queued.entry
            if isinstance(entry, Exception):
                if handed:
                    break                             # once the group before it is applied
                return commands + self._unhealthy(f"entry {queued.position} of log {self.log_name!r} does not "
                                                  f"decode: {entry}; this node stops applying there")
            if handed and self.sessions.awaits(entry.sessions):
                break                                 # it repeats a record of this group: planned once it is applied
            self._queue.popleft()
            plan, indexes, records = self._plan(entry, queued.position)
            applying.append(_Applying(queued, plan, indexes))
            if records or handed:
                tokens = None if queued.tokens is None else [queued.tokens[i] for i in indexes]
                handed.append((queued.position, records, tokens))
            else:
                commands += self._finish(queued.position, [], False)  # all duplicates: nothing to apply
        for i, (position, records, tokens) in enumerate(handed):
            commands.append(rev.ApplyEntry(position=position, records=records, tokens=tokens,
                                           last=i == len(handed) - 1))
        return commands

    def _plan(self, entry: batch.Entry, position: Position) -> tuple[list, list[int], list[bytes]]:
        """_plan decides, for each record of an entry, whether it is applied or answered as a duplicate; the
        sessions of the records applied are recorded now, their results pending until `_finish` (module doc)."""
        sessions = self.sessions
        sessions.expire(entry.stamp_ms)
        plan: list = []
        handed: list[int] = []
        records: list[bytes] = []
        first_in_entry: dict[str, tuple[int, int]] = {}      # client -> (seq, record index) new in this entry
        for index, (record, session) in enumerate(zip(entry.records, entry.sessions)):
            if session is None:
                plan.append(("apply", len(records)))
            else:
                earlier = first_in_entry.get(session.client)
                if earlier is not None and session.seq <= earlier[0]:
                    if session.seq == earlier[0]:
                        plan.append(("same", earlier[1]))
                    else:
                        plan.append(("dup", sessions.check(session.client, -1)[1]))
                    continue
                verdict, result = sessions.check(session.client, session.seq)
                if verdict != SessionTable.NEW:
                    sessions.touch(session.client, entry.stamp_ms)
                    plan.append(("dup", result))
                    continue
                first_in_entry[session.client] = (session.seq, index)
                if self.SESSIONS_AT_PLAN:
                    sessions.applied(session.client, session.seq, None, entry.stamp_ms, pending=position)
                plan.append(("apply", len(records)))
            handed.append(index)
            records.append(record)
        return plan, handed, records

    def _on_applied(self, event: rev.EntryApplied) -> list:
        applying = self._applying
        if not applying or event.position != applying[0].queued.position:
            raise AssertionError(f"{self.node_id}: EntryApplied for {event.position}, but the entry being applied "
                                 f"is {applying and applying[0].queued.position}")
        commands = self._finish(event.position, event.results, event.snapshot)
        return commands + self._next_apply() if not applying else commands

    def _finish(self, position: Position, results: list, snapshot: bool) -> list:
        """_finish records an applied entry (the first of those handed): sessions, answers to its submits, reads
        it releases."""
        applying = self._applying.popleft()
        queued = applying.queued
        entry = queued.entry
        outcomes: list = []
        for index, step in enumerate(applying.plan):
            kind, value = step
            if kind == "apply":
                result = results[value]
                session = entry.sessions[index]
                if session is not None and self.SESSIONS_AT_PLAN:
                    self.sessions.settle(session.client, session.seq, position, result)
                elif session is not None:
                    self.sessions.applied(session.client, session.seq, result, entry.stamp_ms)
            elif kind == "same":
                result = outcomes[value]
            else:
                result = value
            outcomes.append(result)
        self.applied = position
        self.records_applied += len(results)
        commands: list = []
        if queued.tokens is not None:                # applied records were answered by the shell as it applied them
            for (kind, _), token, result in zip(applying.plan, queued.tokens, outcomes):
                if token is not None and kind != "apply":
                    commands.append(rev.CompleteSubmit(token=token, result=result))
        if (snapshot or self._snapshot_requested) and self._applying:
            self._snapshot_requested = True          # between this group and the next (only the last asks)
        elif snapshot or self._snapshot_requested:
            self._snapshot_requested = False
            commands.append(self._snapshot_state())
        if self._applying:                            # more of its group follow: the last one releases reads and
            return commands                           # tells the reader, once for the group (`upto` is cumulative)
        commands += self._release_reads()              # first: a read this entry answers does not end the linger
        commands += self._consumed(position)
        if self.role is REPLAYING:
            commands += self._maybe_lead()
        return commands

    def _unhealthy(self, why: str) -> list:
        if not self.healthy:
            return []
        self.healthy = False
        self.why_unhealthy = why
        commands: list = [rev.Unhealthy(why=why)]
        if self.role in (OPENING, REPLAYING, LEADING):
            commands += self._step_down(why)
        if self._campaigning:
            self._campaigning = False
            commands.append(rev.Resign())
        return commands

    # -- election and session ------------------------------------------------------------------------
    def _on_elected(self, event: rev.Elected) -> list:
        self._campaigning = False
        if self.role is not FOLLOWING or not self.healthy or self._stopping:
            return [rev.Resign()]
        self.epoch = event.epoch
        self._stop_reader()
        commands = self._to(OPENING)
        self._replayed = False
        writer = LogMachine(self.log_name, master_key=self.master_key, password_check=self.password_check,
                            digest_for=self.digest_for, config=self.config.log, add_timeout_ms=self.config.add_timeout_ms,
                            recovery_timeout_ms=self.config.recovery_timeout_ms,
                            explicit_lac_ms=self.config.explicit_lac_ms, owner=self.owner, now_ms=self._now,
                            wall_ms=self._wall)
        self._writer_key, opened = self._new_sub("w", writer, writer.start())
        return commands + opened

    def _on_election_lost(self, event: rev.ElectionLost) -> list:
        self._campaigning = False
        if self.role in (OPENING, REPLAYING, LEADING):
            return self._step_down(f"the election was lost: {event.why}".rstrip(": "))
        return self._campaign() if self.role is FOLLOWING else []

    def _on_session(self, event: rev.SessionChanged) -> list:
        self.session_state = event.state
        if event.state == "LOST":
            self._campaigning = False
            if self.role in (OPENING, REPLAYING, LEADING):
                return self._step_down("the metadata session was lost")
        if event.state == "CONNECTED" and self.role is FOLLOWING:
            return self._campaign()
        return []

    def _writer_outcome(self, command) -> list:
        kind = type(command)
        if kind is lev.LogOpened:
            if self.role is not OPENING:
                return []
            commands = self._to(REPLAYING)
            waits = self.NEW_LEADER_WAITS and not self._first_writer(command)
            self._writes_from_ms = self._now + (self.config.lease_wait_ms if waits else 0)
            commands += self._replay()
            return commands + [rev.Wake(at_ms=self._writes_from_ms)]
        if kind is lev.LogOpenFailed:
            if self.role is STEPPING_DOWN:          # closed while opening
                return self._writer_closed()
            return self._step_down(f"the log did not open: {type(command.error).__name__}: {command.error}")
        if kind is lev.CompleteAppends:
            return self._on_acked(command)
        if kind is lev.FailAppends:
            return self._writer_failed(command.error)
        if kind is lev.RefuseAppends:
            return self._writer_failed(command.error)
        if kind is lev.LogClosed or kind is lev.LogCloseFailed:
            return self._writer_closed()
        if kind is lev.TruncateCompleted or kind is lev.TruncateFailed:
            token = self._truncations.pop(command.token, None)
            if token is None:
                return []
            if kind is lev.TruncateFailed:
                return [rev.Truncated(token=token, error=command.error)]
            return [rev.Truncated(token=token, ledger_ids=command.ledger_ids)]
        return []                                     # rolls: nothing waits for them here

    @staticmethod
    def _first_writer(opened: lev.LogOpened) -> bool:
        """_first_writer tells whether this open was the log's first ever: no leader came before, so no
        lease can still run and the new leader writes at once (the module doc's rule)."""
        return opened.first_writer

    def _maybe_lead(self) -> list:
        """_maybe_lead starts leading once the replay is applied and earlier leases ran out."""
        if (self.role is not REPLAYING or not self._replayed or self._queue or self._applying
                or self._now < self._writes_from_ms):
            return []
        commands = self._to(LEADING) + self._troubled(None)
        self.last_acked = self.applied
        # No lease yet: one must start before any later leader's fence, and only the send time of
        # an acknowledged append (or of a proof) is known to. The first read proves leadership.
        self.lease_until = 0
        commands += self._release_parked_reads()
        return commands + self._flush()

    def _step_down(self, why: str) -> list:
        """_step_down stops accepting at once; appends in flight end with the writer's close."""
        if self.role not in (OPENING, REPLAYING, LEADING):
            return []
        commands = self._to(STEPPING_DOWN, why)
        error = NotLeader(f"node {self.node_id} of {self.name!r} stopped leading before the record was appended "
                          f"({why})", None)
        commands += self._fail_pending(error)
        self.lease_until = 0
        self._stop_reader()
        writer = self._subs.get(self._writer_key)
        if writer is None:
            return commands + self._writer_closed()
        return commands + self._via(self._writer_key, writer.step(ev.CloseRequested()))

    def _writer_closed(self) -> list:
        if self.role is not STEPPING_DOWN:
            return []
        commands: list = []
        for token in self._truncations.values():      # the writer ended before it answered them
            commands.append(rev.Truncated(token=token, error=NotLeader(f"node {self.node_id} stopped leading", None)))
        self._truncations.clear()
        for item in self._in_flight:                  # the writer ended: these may or may not be in the log
            for token in item.tokens:
                if token is not None:
                    commands.append(rev.FailSubmit(token=token, error=NotLeader(
                        f"node {self.node_id} stopped leading {self.name!r}; the record may be in the log", None,
                        maybe_in_log=True)))
        self._in_flight.clear()
        self._drop(self._writer_key)
        self._writer_key = None
        commands.append(rev.Resign())
        if self._stopping:
            commands += self._to(STOPPED)
            return commands + [rev.Stopped()]
        commands += self._to(FOLLOWING)
        commands += self._follow()
        commands += self._release_parked_reads()
        return commands + self._campaign()

    def _writer_failed(self, error: Exception) -> list:
        """_writer_failed: the appends in flight fail with the writer's error (they may be in the log), then step down."""
        commands = [rev.FailSubmit(token=token, error=error)
                    for item in self._in_flight for token in item.tokens if token is not None]
        if self._in_flight:
            commands.append(rev.AppendsDone(failed=len(self._in_flight)))
        self._in_flight.clear()
        why = f"an append failed: {type(error).__name__}: {error}"
        return commands + self._troubled(why) + self._step_down(why)

    # -- submits -------------------------------------------------------------------------------------
    def _on_submit(self, event: rev.SubmitRequested) -> list:
        return self._on_submits(rev.SubmitsRequested(submits=[event]))

    def _on_submits(self, event: rev.SubmitsRequested) -> list:
        if self.role is not LEADING:
            return [rev.FailSubmit(token=submit.token, error=NotLeader(
                f"node {self.node_id} of {self.name!r} is not the leader", None)) for submit in event.submits]
        refused: list = []
        for submit in event.submits:
            if submit.epoch is not None and submit.epoch != self.epoch:
                refused.append(rev.FailSubmit(token=submit.token, error=NotLeader(
                    f"node {self.node_id} of {self.name!r} leads in epoch {self.epoch}, not in epoch {submit.epoch} "
                    f"the record was submitted for: it was refused, not appended", self.node_id)))
                continue
            key = submit.token if submit.submitter is None else submit.submitter
            self._pending.append((submit.record, submit.token, key, submit.session))
            self._pending_bytes += len(submit.record)
            if self.config.linger_ms:
                self._queued_by[key] = self._queued_by.get(key, 0) + 1
        return refused + self._flush()

    def _lingering(self) -> bool:
        return (self._linger_until is not None and self._now < self._linger_until
                and len(self._queued_by) < self._linger_target and len(self._pending) < self.config.max_batch_records
                and self._pending_bytes < self.config.max_batch_bytes)

    def _flush(self) -> list:
        """_flush appends batches while the in-flight limit, the lease wait and linger allow."""
        config = self.config
        if self.role is not LEADING or self._now < self._writes_from_ms:
            return []
        commands: list = []
        writer = self._subs.get(self._writer_key)
        while self._pending and len(self._in_flight) < config.max_entries_in_flight:
            if self._lingering():
                commands.append(rev.Wake(at_ms=self._linger_until))
                break
            self._linger_until = None
            taken, size = batch.take(self._pending, config.max_batch_records, config.max_batch_bytes,
                                     config.max_entry_bytes)
            self._pending_bytes -= size
            if config.linger_ms:
                for _, _, key, _ in taken:
                    if self._queued_by[key] == 1:
                        del self._queued_by[key]
                    else:
                        self._queued_by[key] -= 1
            entry = batch.encode([t[0] for t in taken], [t[3] for t in taken], self._wall)
            self._in_flight.append(_Batch([t[1] for t in taken], {t[2] for t in taken}, self._now,
                                          self.session_state == "CONNECTED", entry))
            commands += self._via(self._writer_key, writer.step(ev.AppendRequested(payloads=[entry])))
            if self.role is not LEADING:
                break
        return commands

    def _on_acked(self, command: lev.CompleteAppends) -> list:
        sent: list[int] = []
        commands: list = [ev.Failpoint(name="replicate.acked")]      # in the log; nobody was answered yet
        for entry_id in range(command.first_entry_id, command.last_entry_id + 1):
            item = self._in_flight.popleft()
            sent.append(item.sent_ms)
            position = Position(command.ledger_id, entry_id)
            self.last_acked = position
            started = item.sent_ms if self.LEASE_FROM_SEND else self._now
            if item.connected or not self.SUSPENDED_STOPS_LEASE:
                self.lease_until = max(self.lease_until, started + self.config.lease_ms)
            if self.config.linger_ms:       # the next entry waits for whoever this one answered, and the queued
                self._linger_target = len(item.submitters.union(self._queued_by))
                if self._linger_target <= 1:
                    self._linger_until = None
                elif self._linger_until is None:
                    self._linger_until = self._now + int(self.config.linger_ms)
            self._queue_entry(position, item.entry, item.tokens)
        commands.append(rev.AppendsDone(sent_ms=tuple(sent)))
        commands += self._next_apply()
        commands += self._release_reads()
        return commands + self._flush()

    def _fail_pending(self, error: Exception) -> list:
        commands = [rev.FailSubmit(token=token, error=error) for _, token, _, _ in self._pending]
        self._pending.clear()
        self._queued_by.clear()
        self._pending_bytes = 0
        self._linger_until = None
        return commands

    # -- reads -----------------------------------------------------------------------------------------
    def _on_read(self, event: rev.ReadRequested) -> list:
        if event.upto is not None:
            if not self.WAIT_APPLIED_WAITS:
                return [rev.ReadReady(token=event.token, applied=self.applied)]
            return self._wait_for(event.token, event.upto, found=True)
        if self.role is LEADING:
            if self.lease_valid:
                return self._wait_for(event.token, self.last_acked)
            return self._prove(event.token)
        if self.role is FOLLOWING:
            return self._find_end([event.token])
        self._parked_reads.append(event.token)        # the role is changing: decided once it settled
        return []

    def _wait_for(self, token: int, target: Position | None, found: bool = False) -> list:
        self._reads[token] = target
        if not found:                                 # a follower's target is looked up again if it never comes
            self._read_started[token] = self._now
        commands = self._release_reads()
        if token in self._reads:
            commands += self._hurry_reader()
        return commands

    def _release_reads(self) -> list:
        done = [t for t, target in self._reads.items() if target is None
                or (self.applied is not None and self.applied >= target)]
        commands = []
        for token in done:
            del self._reads[token]
            self._read_started.pop(token, None)
            commands.append(rev.ReadReady(token=token, applied=self.applied))
        return commands

    def _release_parked_reads(self) -> list:
        parked, self._parked_reads = self._parked_reads, []
        commands: list = []
        for token in parked:
            commands += self._on_read(rev.ReadRequested(token=token))
        return commands

    def _find_end(self, tokens: list[int]) -> list:
        finder = LogEndFinder(self.log_name)
        key, commands = self._new_sub("e", finder, finder.start())
        self._finders[key] = tokens
        return commands

    def _found_end(self, key: str, position: Position | None) -> list:
        tokens = self._finders.pop(key, [])
        commands: list = []
        for token in tokens:
            commands += self._wait_for(token, position)
        return commands

    def _prove(self, token: int) -> list:
        """_prove checks that this leader's ledger is still the log's last and OPEN (then its lease is renewed)."""
        key = f"q{next(self._keys)}"
        self._proofs[key] = [token, self._now, {}]
        self._subs[key] = _Proof(self.log_name)
        return [rev.Via(key, [lev.ReadLogMetadata(name=self.log_name)])]

    def _on_proof(self, key: str, event) -> list:
        token, started, answers = self._proofs[key]
        kind = type(event)
        if kind is lev.LogMetadataRead:
            answers["log"] = event.metadata
            ledger_id = event.metadata.ledger_ids[-1] if event.metadata and event.metadata.ledger_ids else None
            if ledger_id is None:
                answers["ledger"] = None
            else:
                return [rev.Via(key, [ev.ReadLedgerMetadata(ledger_id=ledger_id)])]
        elif kind is ev.LedgerMetadataRead:
            answers["ledger"] = event.metadata
        else:
            return []
        del self._proofs[key]
        self._drop(key)
        writer = self._subs.get(self._writer_key)
        ledger = answers.get("ledger")
        own = writer.ledger_id if writer is not None else None
        if self.role is LEADING and ledger is not None and ledger.ledger_id == own and ledger.state == LEDGER_OPEN:
            self.lease_until = max(self.lease_until, started + self.config.lease_ms)
            return self._wait_for(token, self.last_acked)
        commands: list = []
        if self.role is LEADING:
            commands += self._step_down(f"ledger {own} is no longer the log's last and OPEN: another node leads")
        self._parked_reads.append(token)
        if self.role is FOLLOWING:
            commands += self._release_parked_reads()
        return commands

    # -- snapshots and truncation --------------------------------------------------------------------
    def _on_restored(self, event: rev.Restored) -> list:
        self._restoring = self._restore_asked = False
        position = event.position
        commands: list = []
        if self._applying:
            raise AssertionError(f"{self.node_id}: a snapshot was restored while an entry was being applied")
        if self.applied is None or self.applied < position:
            self.applied = position
            if event.sessions:
                self.sessions = SessionTable.from_bytes(event.sessions, self.config.session_ttl_ms)
            while self._queue and self._queue[0].position <= position:
                self._queue.popleft()
            if self._queued_upto is None or self._queued_upto < position:
                self._queued_upto = position
            commands += self._release_reads()
        if self._reader_key is None and self.role is FOLLOWING:
            commands += self._follow()
        elif self._reader_key is None and self.role is REPLAYING:
            commands += self._replay()
        return commands + self._next_apply()

    def _on_restore_failed(self, event: rev.RestoreFailed) -> list:
        self._restoring = self._restore_asked = False
        self._reader_retry_at = self._now + RETRY_MS
        return [rev.Wake(at_ms=self._reader_retry_at)] + self._next_apply()

    def _snapshot_state(self) -> rev.SnapshotState:
        sessions = self.sessions.to_bytes() if self.SNAPSHOT_SESSIONS else b""
        return rev.SnapshotState(position=self.applied, sessions=sessions)

    def _on_snapshot_requested(self, event: rev.SnapshotRequested) -> list:
        if self._applying:
            self._snapshot_requested = True          # answered between this group and the next
            return []
        return [self._snapshot_state()]

    def _on_truncate(self, event: rev.TruncateRequested) -> list:
        writer = self._subs.get(self._writer_key)
        if self.role is not LEADING or writer is None:
            return [rev.Truncated(token=event.token, error=NotLeader(
                f"node {self.node_id} of {self.name!r} is not the leader: the log is truncated there", None))]
        token = next(self._keys)
        self._truncations[token] = event.token
        return self._via(self._writer_key, writer.step(lev.TruncateRequested(token=token, before=event.before)))

    # -- stepping down, stopping, time -----------------------------------------------------------------
    def _on_step_down(self, event: rev.StepDownRequested) -> list:
        return self._step_down("asked to step down")

    def _on_stop(self, event: rev.StopRequested) -> list:
        self._stopping = True
        if self.role in (OPENING, REPLAYING, LEADING):
            return self._step_down("the node stops")
        if self.role is STEPPING_DOWN:
            return []
        commands = self._fail_pending(NotLeader(f"node {self.node_id} stopped", None))
        self._subs.clear()
        commands += self._to(STOPPED)
        if self._campaigning:
            self._campaigning = False
            commands.append(rev.Resign())
        return commands + [rev.Stopped()]

    def _on_tick(self, event: ev.Ticked) -> list:
        self._now, self._wall = event.now_ms, event.wall_ms
        commands: list = []
        for key, machine in list(self._subs.items()):
            if key in self._subs and hasattr(machine, "step") and not isinstance(machine, _Proof):
                commands += self._via(key, machine.step(event))
        if self._reader_retry_at is not None and self._now >= self._reader_retry_at and not self._restoring:
            self._reader_retry_at = None
            if self.role is FOLLOWING and self._reader_key is None:
                commands += self._follow()
            elif self.role is REPLAYING and self._reader_key is None:
                commands += self._replay()
        if self.role is REPLAYING:
            commands += self._maybe_lead()
        if self.role is LEADING:
            commands += self._flush()
        stale = [t for t, started in self._read_started.items()
                 if t in self._reads and self._now - started >= self.config.poll_ms and self.role is FOLLOWING]
        if stale:                                     # a follower's target may never come: find the end again
            for token in stale:
                del self._reads[token]
                del self._read_started[token]
            commands += self._find_end(stale)
        return commands


class _Proof:
    """_Proof stands for a leadership proof in `_subs` (its answers are handled by the machine itself)."""

    def __init__(self, log_name: str) -> None:
        self.log_name = log_name


_OUTCOMES = (lev.LogOpened, lev.LogOpenFailed, lev.CompleteAppends, lev.FailAppends, lev.RefuseAppends,
             lev.RollCompleted, lev.RollFailed, lev.TruncateCompleted, lev.TruncateFailed, lev.LogClosed,
             lev.LogCloseFailed, lev.DeliverRecords, lev.ReaderCaughtUp, lev.ReaderRetrying, ev.CompleteRead,
             ev.FailRead, FoundLogEnd)

_HANDLERS = {
    rev.Elected: ReplicaMachine._on_elected,
    rev.ElectionLost: ReplicaMachine._on_election_lost,
    rev.SessionChanged: ReplicaMachine._on_session,
    rev.SubmitRequested: ReplicaMachine._on_submit,
    rev.SubmitsRequested: ReplicaMachine._on_submits,
    rev.ReadRequested: ReplicaMachine._on_read,
    rev.EntryApplied: ReplicaMachine._on_applied,
    rev.Restored: ReplicaMachine._on_restored,
    rev.RestoreFailed: ReplicaMachine._on_restore_failed,
    rev.TruncateRequested: ReplicaMachine._on_truncate,
    rev.SnapshotRequested: ReplicaMachine._on_snapshot_requested,
    rev.StepDownRequested: ReplicaMachine._on_step_down,
    rev.StopRequested: ReplicaMachine._on_stop,
    rev.LogChanged: ReplicaMachine._on_log_changed,
    ev.Ticked: ReplicaMachine._on_tick,
}
