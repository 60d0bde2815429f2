"""walkit.core.logend finds a log's end: the last record that may have been acknowledged, as of now.

A follower's linearizable read waits until it applied this far. The finder reads the log's
list, then walks its ledgers from the last: a closed ledger ends at its last entry; an unclosed
one at the highest entry its last fragment's bookies store (LacReader's last entry, which bounds
every entry a writer was told was acknowledged: an acknowledged entry is on Qa bookies of its
write set, and EC answers include one of them). Fewer than EC answers (the other bookies failed
to answer) bound nothing, and the finder asks again later. A ledger without entries sends it to
the one before; a ledger deleted meanwhile (a snapshot truncated the log, or a new writer dropped
it empty) sends it back to the log's list, which has moved on. No log, or no entry anywhere: the
end is None.

The end found may be an entry that was stored but never acknowledged, and that recovery later
drops (the ledger closes before it); a reader waiting for it would wait for nothing, so it asks
again after a while and takes the new end (every record acknowledged before the first question
is still there, and at or before any end found later).
"""

from __future__ import annotations

from dataclasses import dataclass

from walkit.core import events as ev
from walkit.core import logevents as lev
from walkit.core.loglist import LogMetadata, Position
from walkit.core.reader import LacReader

#: How long a metadata or LAC read that failed waits before it is asked again.
RETRY_MS = 100


class LogEndFinder:
    """LogEndFinder finds the end of log `name`; `start`, then `step` until it returns FoundLogEnd."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.done = False
        self._segments: list = []
        self._lac: LacReader | None = None
        self._ledger_id: int | None = None
        self._retry_at: int | None = None
        self._now = 0

    def start(self) -> list:
        """start reads the log's list."""
        return [lev.ReadLogMetadata(name=self.name)]

    def step(self, event) -> list:
        """step takes the answers (and Ticked, for retries); FoundLogEnd ends it."""
        if self.done:
            return []
        kind = type(event)
        if kind is lev.LogMetadataRead:
            return self._on_list(event.metadata)
        if kind is ev.LedgerMetadataRead and event.ledger_id == self._ledger_id and self._lac is None:
            if event.metadata is None:             # deleted meanwhile (truncated, or dropped empty): the list again
                return self.start()
            if event.metadata.is_closed:
                return self._ended(event.metadata.last_entry_id)
            self._lac = LacReader(event.metadata)
            return self._lac.start()
        if kind is ev.LacRead and self._lac is not None and event.ledger_id == self._ledger_id:
            return self._on_lac(self._lac.step(event))
        if kind is ev.Ticked:
            self._now = event.now_ms
            if self._retry_at is not None and event.now_ms >= self._retry_at:
                self._retry_at = None
                return self._ask()
        return []

    def _on_list(self, metadata: LogMetadata | None) -> list:
        if metadata is None:
            return self._found(None)
        self._segments = list(metadata.segments)
        return self._previous()

    def _previous(self) -> list:
        """_previous looks at the last segment not looked at yet."""
        self._lac = None
        while self._segments:
            segment = self._segments.pop()
            if segment.is_closed:
                if segment.last_entry_id >= 0:
                    return self._found(Position(segment.ledger_id, segment.last_entry_id))
                continue
            self._ledger_id = segment.ledger_id
            return self._ask()
        return self._found(None)

    def _ask(self) -> list:
        return [ev.ReadLedgerMetadata(ledger_id=self._ledger_id)]

    def _on_lac(self, commands: list) -> list:
        out: list = []
        for command in commands:
            kind = type(command)
            if kind is ev.CompleteRead and self._lac.covered:
                return self._ended(command.last_entry_id)
            if kind is ev.CompleteRead or kind is ev.FailRead:   # too few bookies answered: ask again in a while
                self._lac = None
                self._retry_at = self._now + RETRY_MS
                return []
            out.append(command)
        return out

    def _ended(self, last_entry_id: int) -> list:
        if last_entry_id >= 0:
            return self._found(Position(self._ledger_id, last_entry_id))
        return self._previous()

    def _found(self, position: Position | None) -> list:
        self.done = True
        return [FoundLogEnd(position=position)]


@dataclass(frozen=True, slots=True, kw_only=True)
class FoundLogEnd:
    """FoundLogEnd is the finder's outcome: the log's end, or None."""

    position: Position | None
