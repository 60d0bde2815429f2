"""walkit.core.replicaevents defines what goes into and comes out of a walkit.replicate node's machine.

The machine (walkit.core.replica.ReplicaMachine) runs a log writer while it leads and a log
reader while it follows (walkit.core.log, walkit.core.logreader). Their I/O leaves it wrapped in
`Via(key, commands)`, and their answers come back wrapped in `From(key, event)`: the shell hands
each Via's commands to the dispatcher under an owner of its own (so the answers of a reader that
was stopped can never reach a writer that runs later on the same ledger), and wraps what comes
back. Everything else here is the node's own: the election and the metadata session (events
the shell reports, so the simulator decides when a session is suspended or lost, per node),
the application's submits and reads, and the application of entries, which the shell performs
(the state machine is the application's code) and reports back, one entry at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from walkit.core.batch import Session
from walkit.core.loglist import Position

# ---------------------------------------------------------------------------------------------
# events


@dataclass(frozen=True, slots=True)
class From:
    """From wraps an answer for the sub-machine `key` (a log writer or reader the node runs)."""

    key: str
    event: Any


@dataclass(frozen=True, slots=True, kw_only=True)
class Elected:
    """Elected reports that this node won the election, in `epoch` (larger for every new leadership)."""

    epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ElectionLost:
    """ElectionLost reports that this node no longer holds the election (its registration is gone)."""

    why: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionChanged:
    """SessionChanged reports the metadata session's state: "CONNECTED", "SUSPENDED" or "LOST"."""

    state: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitRequested:
    """SubmitRequested asks the leader to append `record` and apply it; `token` names the submit.

    `session` (a client id and seq) makes it exactly-once (walkit.core.sessions); `submitter`
    names who submits, for linger (see ReplicaConfig.linger_ms); None: the token itself.
    `epoch`, if set, makes the submit conditional: it is refused (NotLeader, never appended)
    unless the node leads in that epoch, so a record computed on state that earlier records of
    one leadership left (still in flight) is appended after them by the same writer or not at all.
    """

    token: int
    record: bytes
    session: Session | None = None
    submitter: Any = None
    epoch: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitsRequested:
    """SubmitsRequested hands the leader several submits at once (those the shell collected in one round):
    they share entries (group commit) as if requested one by one, but are appended together."""

    submits: list[SubmitRequested]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadRequested:
    """ReadRequested asks for a linearizable read: ReadReady once this node applied every record
    acknowledged before the request (on the leader, once it proved it still leads). With `upto`, it
    asks only for ReadReady once this node applied the record at that position (one the caller knows
    is in the log: a write it forwarded), on any node and without proving anything."""

    token: int
    upto: Position | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EntryApplied:
    """EntryApplied reports that the shell applied ApplyEntry's records: `results`, one per record.

    A result is what apply returned, or the exception it raised. With `snapshot` the shell wants
    to snapshot the state as it is now, between this entry and the next (only after the last
    ApplyEntry of a group): the machine answers with SnapshotState (the client sessions as of
    this entry) before the next ApplyEntry.
    """

    position: Position
    results: list
    snapshot: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotRequested:
    """SnapshotRequested asks for SnapshotState between two entries, now or once the entry being applied is done."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Restored:
    """Restored reports that the shell loaded a snapshot taken at `position`, with its client `sessions`."""

    position: Position
    sessions: bytes = b""


@dataclass(frozen=True, slots=True, kw_only=True)
class RestoreFailed:
    """RestoreFailed reports that loading the latest snapshot failed (the machine asks again later)."""

    error: Exception


@dataclass(frozen=True, slots=True, kw_only=True)
class TruncateRequested:
    """TruncateRequested asks the leader to truncate the log before `before` (a snapshot covers it);
    Truncated answers `token`."""

    before: Position
    token: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class LogChanged:
    """LogChanged: the log's metadata changed (the shell watches it); a follower's reader looks again at once."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepDownRequested:
    """StepDownRequested asks a leader to give up its leadership (cleanly) and follow."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StopRequested:
    """StopRequested asks the node to stop: a leader closes its log writer first; then Stopped."""


# ---------------------------------------------------------------------------------------------
# commands


@dataclass(frozen=True, slots=True)
class Via:
    """Via carries a sub-machine's I/O: the shell runs `commands` for owner `key` and wraps the answers in From."""

    key: str
    commands: list


@dataclass(frozen=True, slots=True, kw_only=True)
class Campaign:
    """Campaign asks the shell to campaign for leadership (answered by Elected, whenever it wins)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Resign:
    """Resign asks the shell to give the election up (this node stopped leading)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ApplyEntry:
    """ApplyEntry asks the shell to apply `records` (of the entry at `position`), in order; EntryApplied answers.

    Duplicates of records applied before (client sessions) are not among them: each record here
    is applied exactly once on every node. `tokens` (the leader's; None elsewhere) names the
    submit each record answers: the shell answers it with the record's result right after
    applying it and before the next record (so a reader chained to that submit sees exactly the
    state up to it); duplicates are answered by the machine with CompleteSubmit.

    Several may come at once, a group (walkit.core.replica's Applying): the shell applies them in
    order and answers each; only the group's `last` may ask for a snapshot (EntryApplied.snapshot).
    An entry of a group may hand no records (all of them duplicates): it is answered all the same.
    """

    position: Position
    records: list[bytes]
    tokens: list[int | None] | None = None
    last: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotState:
    """SnapshotState answers EntryApplied(snapshot=True) or SnapshotRequested: the client sessions as of
    `position` (the last entry applied; None if none), for the snapshot the shell takes now."""

    position: Position | None
    sessions: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Truncated:
    """Truncated answers TruncateRequested: the ledgers the log dropped, or why it did not (`error`)."""

    token: int
    ledger_ids: tuple[int, ...] = ()
    error: Exception | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadSnapshot:
    """LoadSnapshot asks the shell to load the latest snapshot (answered by Restored or RestoreFailed):
    the log was truncated past what this node applied."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CompleteSubmit:
    """CompleteSubmit answers a submit with its record's `result` (apply's, or the first application's)."""

    token: int
    result: Any


@dataclass(frozen=True, slots=True, kw_only=True)
class FailSubmit:
    """FailSubmit fails a submit: NotLeader (never appended, unless its `maybe_in_log`: sent before the
    node stopped leading), or the writer's error (it may be in the log)."""

    token: int
    error: Exception


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadReady:
    """ReadReady answers ReadRequested: this node applied every record acknowledged before it, up to `applied`."""

    token: int
    applied: Position | None


@dataclass(frozen=True, slots=True, kw_only=True)
class RoleChanged:
    """RoleChanged tells the shell the node's role (ReplicaMachine's Role value) and the leader it knows of."""

    role: str
    epoch: int | None = None
    why: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendsDone:
    """AppendsDone reports entries the leader appended: `sent_ms` (when each acknowledged one was sent),
    and `failed`, how many failed; for the shell's metrics (walkit.metrics.ClientMetrics)."""

    sent_ms: tuple[int, ...] = ()
    failed: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Wake:
    """Wake asks the shell for a Ticked at `at_ms` (the node's clock) or earlier: a linger or a wait ends then."""

    at_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Stopped:
    """Stopped reports that the node stopped (after StopRequested): nothing more will come out of it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Trouble:
    """Trouble reports a failure the node retries on its own (`why`; None once it is over): a tail
    that cannot read the log, an append that failed. The node stays healthy; its status says so."""

    why: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Unhealthy:
    """Unhealthy reports that the node cannot go on as it is (`why`); it stays up, and says so in its status."""

    why: str
    details: dict = field(default_factory=dict)
