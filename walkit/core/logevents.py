"""walkit.core.logevents defines what goes into and comes out of the log machines.

The log writer (walkit.core.log) and reader (walkit.core.logreader) take the ledger-level
events of walkit.core.events, routed to the ledger machines they run, plus the events here:
answers about the log's metadata record, and the application's requests. They return the
ledger-level commands of their ledger machines, the metadata commands here, and outcomes for
the application (CompleteAppends, LogOpened, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

from walkit.core.loglist import LogMetadata, Position

# ---------------------------------------------------------------------------------------------
# events: the log's metadata record


@dataclass(frozen=True, slots=True, kw_only=True)
class LogMetadataRead:
    """LogMetadataRead answers ReadLogMetadata: the log's metadata and version, or None if absent."""

    name: str
    metadata: LogMetadata | None
    version: int = -1


@dataclass(frozen=True, slots=True, kw_only=True)
class LogMetadataWritten:
    """LogMetadataWritten reports that CreateLogMetadata or WriteLogMetadata took effect."""

    name: str
    metadata: LogMetadata
    version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LogMetadataConflict:
    """LogMetadataConflict reports a failed compare-and-swap with what the store holds (None: deleted), or the
    store's refusal of the write (`refused`: the caller may not write the log; nothing was written)."""

    name: str
    metadata: LogMetadata | None
    version: int = -1
    refused: Exception | None = None


# ---------------------------------------------------------------------------------------------
# events: the application


@dataclass(frozen=True, slots=True, kw_only=True)
class RollRequested:
    """RollRequested asks the writer to start a new ledger now; `token` names the request."""

    token: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TruncateRequested:
    """TruncateRequested asks the writer to delete the whole ledgers that end before `before`."""

    token: int
    before: Position


# ---------------------------------------------------------------------------------------------
# commands: metadata


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadLogMetadata:
    """ReadLogMetadata asks for the log's metadata (answered by LogMetadataRead)."""

    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateLogMetadata:
    """CreateLogMetadata creates the log's record (LogMetadataWritten, or LogMetadataConflict if present)."""

    name: str
    metadata: LogMetadata


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteLogMetadata:
    """WriteLogMetadata compares-and-swaps the log's record (LogMetadataWritten or LogMetadataConflict)."""

    name: str
    metadata: LogMetadata
    expected_version: int


# ---------------------------------------------------------------------------------------------
# outcomes for the application


@dataclass(frozen=True, slots=True, kw_only=True)
class LogOpened:
    """LogOpened reports that the writer owns the log: the list CAS that added its ledger succeeded.

    `first_writer` is True when the list this open replaced held no ledger and nothing was ever
    truncated from it: no writer opened the log before this one (every open adds its ledger in
    the same CAS, and a ledger leaves the list only by a later open, which adds its own, or by
    truncation once closed, which never takes the list's last ledger and records `truncated_to`
    if the ledger held records; `truncated_to` also covers lists older writers emptied).
    """

    metadata: LogMetadata
    first_writer: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class LogOpenFailed:
    """LogOpenFailed reports that the log could not be opened for writing."""

    error: Exception


@dataclass(frozen=True, slots=True, kw_only=True)
class CompleteAppends:
    """CompleteAppends acknowledges the next appends, in log order: entries first..last of a ledger."""

    ledger_id: int
    first_entry_id: int
    last_entry_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FailAppends:
    """FailAppends ends the writer: every append not yet acknowledged, and every later one, fails."""

    error: Exception


@dataclass(frozen=True, slots=True, kw_only=True)
class RefuseAppends:
    """RefuseAppends fails the `count` appends just requested (the writer is closed or not open)."""

    count: int
    error: Exception


@dataclass(frozen=True, slots=True, kw_only=True)
class RollCompleted:
    """RollCompleted reports that appends now go to ledger `ledger_id`."""

    token: int
    ledger_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RollFailed:
    """RollFailed reports that a requested roll could not start a ledger; the log goes on."""

    token: int
    error: Exception


@dataclass(frozen=True, slots=True, kw_only=True)
class TruncateCompleted:
    """TruncateCompleted reports the ledgers a truncation removed from the log."""

    token: int
    ledger_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TruncateFailed:
    """TruncateFailed reports that a truncation could not be recorded."""

    token: int
    error: Exception


@dataclass(frozen=True, slots=True, kw_only=True)
class LogClosed:
    """LogClosed reports that every ledger of this writer is closed and recorded in the list."""

    metadata: LogMetadata


@dataclass(frozen=True, slots=True, kw_only=True)
class LogCloseFailed:
    """LogCloseFailed reports that the writer ended before its ledgers were closed (see its error)."""

    error: Exception


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliverRecords:
    """DeliverRecords hands a log reader's caller the next records of one ledger, in log order."""

    ledger_id: int
    entries: list


@dataclass(frozen=True, slots=True, kw_only=True)
class LogChanged:
    """LogChanged tells a following reader that the log's metadata changed (a watch fired): look again now."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CatchUp:
    """CatchUp tells a following reader that lingers (its `linger_ms`) to long-poll now: its caller waits for
    what was appended (a read barrier on a follower, say)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReaderRetrying:
    """ReaderRetrying tells a reader's caller that a read failed (`error`; `failures` in a row) and is tried
    again after `poll_ms`; records delivered next (or ReaderCaughtUp) say it went through."""

    error: Exception
    failures: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReaderCaughtUp:
    """ReaderCaughtUp tells a following reader's caller that it read everything confirmed so far; with
    `wake_at_ms`, that it lingers until then before it asks for more (the caller ticks it then, or cuts the
    linger short with LogChanged)."""

    position: Position | None
    wake_at_ms: int | None = None
