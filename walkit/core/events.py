"""walkit.core.events defines what goes into the client-side machines and what comes out.

Events (past tense) are facts the shell feeds a machine with `step(event)`: a bookie answered,
the metadata store answered, time passed. Commands (imperative) are what a machine asks the
shell to do: send requests, write metadata, complete or fail the user's futures.

Events and commands carry batches (many entry ids, many entries) so the shell can put many adds
in one ZeroMQ message and the machines create no object per entry where one per batch will do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from walkit.core.messages import Entry, Status
from walkit.core.metadata import LedgerMetadata

# ---------------------------------------------------------------------------------------------
# events


@dataclass(frozen=True, slots=True, kw_only=True)
class Ticked:
    """Ticked tells a machine the current time in milliseconds.

    `now_ms` is a monotonic clock for timeouts; `wall_ms` is wall-clock time (milliseconds since
    the epoch) for what is recorded in metadata, such as when a ledger was created or closed.
    """

    now_ms: int
    wall_ms: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendRequested:
    """AppendRequested hands the writer new payloads; they get consecutive entry ids."""

    payloads: list[bytes]


@dataclass(frozen=True, slots=True, kw_only=True)
class AddsAcked:
    """AddsAcked reports that `bookie` durably stored the listed entries.

    Deferred-sync adds are acknowledged once stored, not yet durable; `instance` names the
    bookie run that answered (see walkit.core.messages.AddResponse), `disk` its storage (0:
    unknown; walkit.core.metadata.LedgerMetadata.disks).
    """

    bookie: str
    ledger_id: int
    entry_ids: list[int]
    instance: int = 0
    disk: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class LacWritten:
    """LacWritten reports that `bookie` made the explicit LAC `lac` durable (a WriteLac's answer)."""

    bookie: str
    ledger_id: int
    lac: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ForceRequested:
    """ForceRequested asks the writer to make every entry appended so far durable; `token` names the request."""

    token: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ForceAcked:
    """ForceAcked reports that `bookie` synced every entry it acknowledged before the force."""

    bookie: str
    ledger_id: int
    instance: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class AddsRejected:
    """AddsRejected reports that `bookie` refused or could not be reached for the entries."""

    bookie: str
    ledger_id: int
    entry_ids: list[int]
    status: Status
    message: str = ""
    disk: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class BookiesChosen:
    """BookiesChosen answers ChooseBookies with live writable candidates, in random order.

    `back` lists the bookies of ChooseBookies.recheck that are registered and writable again
    (restarted); the shell has started reconnecting to them. `disks` maps every registered
    writable bookie (candidates, excluded ones and `back` alike) to the disk it registered
    with, where known: a bookie whose disk is not the one a fragment recorded for it lost what
    it held, and is used again only in a new fragment that records its new disk.
    """

    ledger_id: int
    bookies: list[str]
    back: frozenset[str] = frozenset()
    disks: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class MetadataWritten:
    """MetadataWritten reports a successful compare-and-swap of a ledger's metadata."""

    metadata: LedgerMetadata
    version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MetadataConflict:
    """MetadataConflict reports a failed compare-and-swap, with the metadata found instead."""

    metadata: LedgerMetadata
    version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MetadataFailed:
    """MetadataFailed reports that a metadata operation failed for certain (the ledger is gone).

    An operation whose outcome is unknown (a timeout, a lost answer) is never reported as
    failed: the dispatcher re-reads and reports MetadataWritten or MetadataConflict instead.
    """

    ledger_id: int
    error: Exception


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerMetadataRead:
    """LedgerMetadataRead answers ReadLedgerMetadata: the metadata and version, or None if absent."""

    ledger_id: int
    metadata: LedgerMetadata | None
    version: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerCreated:
    """LedgerCreated answers CreateLedger with the new ledger's metadata (OPEN) and version."""

    token: int
    metadata: LedgerMetadata
    version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerCreateFailed:
    """LedgerCreateFailed answers CreateLedger that could not create a ledger (NotEnoughBookies, ...)."""

    token: int
    error: Exception


@dataclass(frozen=True, slots=True, kw_only=True)
class CloseRequested:
    """CloseRequested asks the writer to close the ledger once its pending adds completed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EntriesRead:
    """EntriesRead reports entries a bookie returned; requested ids it lacks are `missing`.

    `unread` are requested ids the bookie did not look at: its answer reached the request's
    byte bound (ReadRequest.max_bytes). They are not absent; a machine asks for them again
    (of the same bookie: it is answering). `disk` is the identity of the storage that answered
    (0: unknown): a `missing` id proves nothing when it differs from the disk the ledger's
    metadata records for the bookie.
    """

    bookie: str
    ledger_id: int
    entries: list[Entry]
    missing: list[int]
    lac: int
    disk: int = 0
    unread: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadFailed:
    """ReadFailed reports that a read of the listed entries failed at `bookie` as a whole."""

    bookie: str
    ledger_id: int
    entry_ids: list[int]
    status: Status
    message: str = ""
    disk: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class EntriesConsumed:
    """EntriesConsumed tells a reader the caller took every entry up to `upto` (of `ledger_id`, if given), at
    `now_ms` on the caller's clock if given (a following log reader's linger is measured from it)."""

    upto: int
    ledger_id: int | None = None
    now_ms: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LacRead:
    """LacRead reports a bookie's answer to a ReadLac request (status OK or an error)."""

    bookie: str
    ledger_id: int
    status: Status
    lac: int = -1
    last_entry_id: int = -1
    message: str = ""
    lafr: int = -1
    disk: int = 0


# ---------------------------------------------------------------------------------------------
# commands


@dataclass(frozen=True, slots=True, kw_only=True)
class SendAdds:
    """SendAdds asks the shell to send entries of one ledger to one bookie (`lafr`: see AddRequest)."""

    bookie: str
    ledger_id: int
    master_key: bytes
    entries: list[Entry]
    recovery: bool = False
    lafr: int = -1
    term: int = 0
    truncate: bool = False
    deferred_sync: bool = False
    truncate_from: int = -1          # with no entries: drop every entry from this id on (a cleaning)


@dataclass(frozen=True, slots=True, kw_only=True)
class SendForce:
    """SendForce asks one bookie to sync what it acknowledged of a deferred-sync ledger."""

    bookie: str
    ledger_id: int
    master_key: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class SendRead:
    """SendRead asks the shell to read entries of one ledger from one bookie.

    The dispatcher sends at most MAX_READ_IDS ids per request (more go as several requests,
    each answered by an event of its own) and bounds each answer by its `max_read_bytes`.
    With `previous_lac` >= -1 and `timeout_ms` > 0 the bookie holds the read until its LAC
    passes `previous_lac` (a long poll, ReadRequest), and the request's deadline is that much later.
    """

    bookie: str
    ledger_id: int
    entry_ids: list[int]
    fence: bool = False
    master_key: bytes = b""
    term: int = 0
    previous_lac: int = -2
    timeout_ms: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class SendReadLac:
    """SendReadLac asks a bookie for its LAC; `fence` makes it a fencing request."""

    bookie: str
    ledger_id: int
    fence: bool = False
    master_key: bytes = b""
    previous_lac: int = -2
    timeout_ms: int = 0
    term: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class SendWriteLac:
    """SendWriteLac asks the shell to send an explicit LAC to one bookie."""

    bookie: str
    ledger_id: int
    master_key: bytes
    lac: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CompleteAdds:
    """CompleteAdds tells the shell that every entry up to `last_entry_id` is confirmed.

    On a deferred-sync ledger "confirmed" means acknowledged by Qa bookies, not yet durable.
    """

    ledger_id: int
    last_entry_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CompleteForce:
    """CompleteForce completes the forces `tokens`: every entry up to `last_entry_id` is durable on Qa bookies."""

    ledger_id: int
    tokens: list[int]
    last_entry_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FailForce:
    """FailForce fails the forces `tokens` (the writer failed or the ledger closed without them)."""

    ledger_id: int
    tokens: list[int]
    error: Exception


@dataclass(frozen=True, slots=True, kw_only=True)
class FailAdds:
    """FailAdds fails every add of the ledger from `first_entry_id` on, and any later one."""

    ledger_id: int
    first_entry_id: int
    error: Exception


@dataclass(frozen=True, slots=True, kw_only=True)
class ChooseBookies:
    """ChooseBookies asks the shell for live writable bookies outside `exclude`.

    `recheck` names unreachable bookies the machine would use again if they came back: the
    shell reports those registered and writable in BookiesChosen.back. `ensemble`, `replacing`
    (its failed bookies, in ensemble order) and `write_quorum` let the shell order candidates
    so that the i-th is the rack-aware choice for the i-th replaced position (walkit.placement).
    """

    ledger_id: int
    exclude: frozenset[str]
    recheck: frozenset[str] = frozenset()
    ensemble: tuple[str, ...] = ()
    replacing: tuple[str, ...] = ()
    write_quorum: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteMetadata:
    """WriteMetadata asks for a compare-and-swap of a ledger's metadata.

    The shell answers MetadataWritten, or MetadataConflict carrying the current metadata (it
    re-reads on BadVersion), or MetadataFailed.
    """

    metadata: LedgerMetadata
    expected_version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadLedgerMetadata:
    """ReadLedgerMetadata asks for a ledger's current metadata (answered by LedgerMetadataRead)."""

    ledger_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateLedger:
    """CreateLedger asks for a new OPEN ledger on `ensemble` writable bookies (LedgerCreated).

    The shell draws the id and the bookies and creates the metadata; `token` names the request.
    """

    token: int
    ensemble: int
    write_quorum: int
    ack_quorum: int
    digest: str
    password_check: str
    custom: tuple[tuple[str, str], ...] = ()
    owner: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteLedger:
    """DeleteLedger removes a ledger's metadata; bookies drop its data at their garbage collection."""

    ledger_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Failpoint:
    """Failpoint marks a named step where crash tests stop a process (walkit.faults); nothing else."""

    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CompleteClose:
    """CompleteClose reports that the ledger is closed with the given metadata."""

    metadata: LedgerMetadata
    version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FailClose:
    """FailClose reports that closing the ledger failed."""

    ledger_id: int
    error: Exception


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliverEntries:
    """DeliverEntries hands the reader's caller the next entries, in entry order."""

    ledger_id: int
    entries: list[Entry]


@dataclass(frozen=True, slots=True, kw_only=True)
class FailRead:
    """FailRead ends a read with an error; entries delivered before stay valid."""

    ledger_id: int
    error: Exception


@dataclass(frozen=True, slots=True, kw_only=True)
class CompleteRead:
    """CompleteRead reports that every requested entry was delivered.

    A LacReader's CompleteRead carries the LAC and `last_entry_id`, the highest entry any
    answering bookie stores: every acknowledged entry is at or below it.
    """

    ledger_id: int
    lac: int = field(default=-1)
    last_entry_id: int = field(default=-1)


@dataclass(frozen=True, slots=True, kw_only=True)
class CompleteRecovery:
    """CompleteRecovery reports the recovered metadata of a ledger: CLOSED, or OPEN in a new term.

    After a reopen (OPEN in a new term) `last_entry_id` is the no-op that ends the recovery: the
    new term's writer starts after it. Otherwise it is -1 (the metadata has the last entry).
    """

    metadata: LedgerMetadata
    version: int
    last_entry_id: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class FailRecovery:
    """FailRecovery reports that recovering a ledger failed; it may be retried."""

    ledger_id: int
    error: Exception
