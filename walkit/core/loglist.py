"""walkit.core.loglist defines a log's metadata: an ordered list of ledgers (docs/internals/protocol.md#logs).

A log has a single writer. Its metadata lists its ledgers in order; at most the last two may be
unclosed (the last being written, the one before it closing after a roll), all others are
CLOSED. `Position(ledger_id, entry_id)` names a record and orders records: ledger ids grow with
every new ledger, so position order is log order. The rules that keep the list right live in
walkit.core.log (the writer) and walkit.core.logreader (readers).

Values here are immutable; each change returns new metadata for the writer to CAS.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, replace
from typing import NamedTuple

from walkit.errors import ConfigError

LOG_PREFIX = "logs"
#: Custom metadata keys of a ledger of a log: the owner and creation time (ms) of the log instance it
#: was made for (LogMetadata.ledger_custom, LogMetadata.holds).
LOG_OWNER, LOG_CREATED = "log_owner", "log_created_ms"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


class Position(NamedTuple):
    """Position is where a record lives in a log: (ledger id, entry id); positions sort in log order."""

    ledger_id: int
    entry_id: int

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"

    @classmethod
    def parse(cls, text: str) -> "Position":
        """parse reads a position written as LEDGER:ENTRY."""
        try:
            ledger, entry = text.split(":")
            return cls(int(ledger), int(entry))
        except ValueError:
            raise ConfigError(f"{text!r} is not a position; expected LEDGER:ENTRY, e.g. 12:0") from None


def check_log_name(name: str) -> str:
    """check_log_name returns `name` if it is a valid log name, else raises ConfigError."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"invalid log name {name!r}: use 1-200 letters, digits, '.', '_' or '-', "
                          "starting with a letter or digit")
    return name


def log_key(name: str) -> str:
    """log_key is the metadata key of a log."""
    return f"{LOG_PREFIX}/{check_log_name(name)}"


@dataclass(frozen=True, slots=True)
class LogSegment:
    """LogSegment is one ledger of a log: its id and, once closed, its last entry and size.

    `last_entry_id` is None while the ledger may still be written; `size` counts payload bytes
    and `entries` records (both None until known).
    """

    ledger_id: int
    created_ms: int = 0
    last_entry_id: int | None = None
    entries: int | None = None
    size: int | None = None
    closed_ms: int | None = None

    @property
    def is_closed(self) -> bool:
        """is_closed is True once the segment's end is final."""
        return self.last_entry_id is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class LogConfig:
    """LogConfig is how a log's ledgers are made and rolled, and what retention keeps.

    Rolling happens when the open ledger reaches `roll_entries` records, `roll_bytes` payload
    bytes or `roll_age_s` seconds (0 disables each). These are thresholds: appends that reach
    the writer together go to one ledger, so a ledger can exceed `roll_entries` by a batch. Retention deletes closed ledgers older than
    `retention_age_s` and the oldest closed ledgers while the log exceeds `retention_bytes`
    (0 disables each); the open ledger is never deleted.

    With `unbounded` the log is one unbounded ledger (docs/internals/protocol.md#unbounded-ledgers)
    instead of a list of ledgers: a new writer takes it over in a new term rather than recovering it
    and starting another ledger, it never rolls, and truncation drops fragments
    (walkit.client.log.UnboundedLogWriter).
    Its `roll_*` settings rotate the ledger's fragments instead (walkit.core.writer), which
    bounds what truncation leaves on the bookies' disks as rolling does for a list of ledgers.
    """

    ensemble: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    digest: str = "crc32c"
    roll_entries: int = 0
    roll_bytes: int = 64 * 1024 * 1024
    roll_age_s: float = 0.0
    retention_age_s: float = 0.0
    retention_bytes: int = 0
    unbounded: bool = False

    def __post_init__(self) -> None:
        for name in ("roll_entries", "roll_bytes", "roll_age_s", "retention_age_s", "retention_bytes"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class LogMetadata:
    """LogMetadata is a log's record in the metadata store: its config and its ledgers, in order.

    `truncated_to` is the highest ledger id that truncation or retention removed while it held
    records (-1: none): a reader whose next record lies in a ledger up to it missed records
    and gets LogTruncated, even if it never saw that ledger listed. `owner` is the principal
    that created the log (walkit.security; "" without security).
    """

    name: str
    config: LogConfig = field(default_factory=LogConfig)
    segments: tuple[LogSegment, ...] = ()
    created_ms: int = 0
    truncated_to: int = -1
    owner: str = ""

    @property
    def ledger_ids(self) -> list[int]:
        """ledger_ids lists the log's ledgers in order."""
        return [s.ledger_id for s in self.segments]

    def segment(self, ledger_id: int) -> LogSegment | None:
        """segment returns the segment of `ledger_id`, or None if the log does not hold it."""
        return next((s for s in self.segments if s.ledger_id == ledger_id), None)

    def with_segment(self, segment: LogSegment) -> "LogMetadata":
        """with_segment appends a new ledger at the end of the log."""
        if self.segments and segment.ledger_id <= self.segments[-1].ledger_id:
            raise ValueError(f"ledger {segment.ledger_id} cannot follow {self.segments[-1].ledger_id}")
        return replace(self, segments=self.segments + (segment,))

    def updated(self, segment: LogSegment) -> "LogMetadata":
        """updated replaces the segment with the same ledger id (for example once closed)."""
        if self.segment(segment.ledger_id) is None:
            raise KeyError(segment.ledger_id)
        return replace(self, segments=tuple(segment if s.ledger_id == segment.ledger_id else s
                                            for s in self.segments))

    def without(self, ledger_ids: set[int]) -> "LogMetadata":
        """without removes the given ledgers from the log (ledgers found to hold no record)."""
        return replace(self, segments=tuple(s for s in self.segments if s.ledger_id not in ledger_ids))

    def ledger_custom(self, key: str = "log", value: str | None = None) -> tuple[tuple[str, str], ...]:
        """ledger_custom is the custom metadata of a ledger of this log: its name (under `key`, as `value`: a
        replicated name's snapshot names its name under "replication") and this instance of the log, its owner
        and creation time, so that the ledger passes to no later log of the same name (`holds`)."""
        return ((key, self.name if value is None else value), (LOG_OWNER, self.owner),
                (LOG_CREATED, str(self.created_ms)))

    def holds(self, custom) -> bool:
        """holds says whether a ledger whose custom metadata is `custom` (and names this log) is this instance's.

        A ledger made before walkit recorded instances (no LOG_OWNER) is the log's by name alone.
        """
        if LOG_OWNER not in custom:
            return True
        return custom[LOG_OWNER] == self.owner and custom.get(LOG_CREATED) == str(self.created_ms)

    def truncated(self, ledger_ids: set[int]) -> "LogMetadata":
        """truncated removes the given ledgers and records how far records were removed."""
        held = [s.ledger_id for s in self.segments if s.ledger_id in ledger_ids and s.entries != 0]
        return replace(self.without(ledger_ids), truncated_to=max([self.truncated_to, *held]))

    def before(self, position: Position) -> list[LogSegment]:
        """before lists the closed segments whose every record lies before `position`."""
        return [s for s in self.segments if s.is_closed and s.ledger_id < position.ledger_id]

    def expired(self, now_ms: int) -> list[LogSegment]:
        """expired lists the closed segments that retention removes at `now_ms`: always a prefix of the list.

        Age: the oldest segments closed more than `retention_age_s` ago, up to the first that is
        younger (removing a younger one further on would leave a gap readers could not see).
        Size: the oldest closed segments while the log exceeds `retention_bytes`; a segment whose
        size is unknown (its ledger was recovered, not closed by its writer) counts as its entries
        times the average entry size of the segments whose size is known.
        """
        config = self.config
        prefix: list[LogSegment] = []
        for segment in self.segments[:-1]:
            if not segment.is_closed:
                break
            prefix.append(segment)
        count = 0
        if config.retention_age_s:
            horizon = now_ms - int(config.retention_age_s * 1000)
            while count < len(prefix) and prefix[count].closed_ms is not None and prefix[count].closed_ms < horizon:
                count += 1
        if config.retention_bytes:
            known = [s for s in self.segments if s.size is not None and s.entries]
            per_entry = sum(s.size for s in known) / max(1, sum(s.entries for s in known))
            sizes = [s.size if s.size is not None else int((s.entries or 0) * per_entry) for s in self.segments]
            total = sum(sizes)
            by_size = 0
            while by_size < len(prefix) and total > config.retention_bytes:
                total -= sizes[by_size]
                by_size += 1
            count = max(count, by_size)
        return prefix[:count]

    # -- encoding -------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        """to_bytes encodes the log metadata as JSON."""
        doc = {"name": self.name, "created_ms": self.created_ms, "config": asdict(self.config),
               "segments": [asdict(s) for s in self.segments], "truncated_to": self.truncated_to}
        if self.owner:
            doc["owner"] = self.owner
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "LogMetadata":
        """from_bytes decodes log metadata written by `to_bytes`."""
        doc = json.loads(data)
        return cls(name=doc["name"], created_ms=doc.get("created_ms", 0), config=LogConfig(**doc["config"]),
                   segments=tuple(LogSegment(**s) for s in doc["segments"]), truncated_to=doc.get("truncated_to", -1),
                   owner=doc.get("owner", ""))
