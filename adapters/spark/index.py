"""walkit.adapters.spark.index is the planner's view of a walkit log: ledgers, entries and Kafka offsets.

A query plans on the driver from the log's metadata and a few single-entry reads, never by
scanning: the ledger list comes from the log's metadata, each ledger's end from its metadata
(closed) or its LAC read from the bookies (the ledger being written), and for a topic
partition the offsets of an entry from the Kafka batch headers it holds (records.py). The
offsets of a partition increase along its log, so

- `first_offset(ledger)` is the base offset of its first batch (usually entry 0);
- `end_offset()` is the offset after the last visible batch: the high watermark as far as the
  bookies confirmed it (the broker's may be a few entries ahead until the LAC catches up);
- `locate(offset)` finds the entry that holds an offset by bisection within its ledger.

Closed ledgers never change, so what was learned about them is kept for the next micro-batch.
A `Piece` is the unit of work of one Spark task: entry ranges of one log and, for a topic
partition, the offsets [lo, hi) it yields; `split` cuts a range into pieces of about
`max_records` records each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from walkit.adapters.spark.records import entry_span
from walkit.core.loglist import Position
from walkit.core.metadata import CLOSED
from walkit.errors import NoSuchLedger, NoSuchLog


@dataclass(frozen=True)
class Segment:
    """Segment is the entries first..last of one ledger."""

    ledger_id: int
    first: int
    last: int

    @property
    def entries(self) -> int:
        return self.last - self.first + 1


@dataclass(frozen=True)
class Piece:
    """Piece is what one Spark task reads: `segments` of log `log`; for a topic partition, offsets [lo, hi)."""

    log: str
    segments: tuple[Segment, ...]
    topic: str | None = None
    partition: int = -1
    lo: int = 0
    hi: int = 0


#: Longest a planner waits for the LAC of a ledger being written to cover its last stored entry.
SETTLE_S = 2.0


class LogIndex:
    """LogIndex is what a planner knows of one log (see the module doc); `refresh()` re-reads its end."""

    def __init__(self, client, name: str, password: bytes = b"") -> None:
        self.client = client
        self.name = name
        self.password = password
        self.ledgers: list[int] = []
        self.last_entry: dict[int, int] = {}     # ledger -> its last visible entry (-1: empty)
        self._closed: set[int] = set()
        self._handles: dict[int, object] = {}
        self._first: dict[int, int | None] = {}  # ledger -> base offset of its first batch
        self._keys: dict[tuple[int, int], int | None] = {}

    def refresh(self, missing_ok: bool = False) -> "LogIndex":
        """refresh reads the ledger list and the end of every ledger not known to be closed.

        It raises NoSuchLog if the log does not exist, unless `missing_ok` (a topic partition
        whose leader has not opened its log yet): then the log is taken as empty.
        """
        try:
            metadata = self.client.log_metadata(self.name)
        except NoSuchLog:
            if not missing_ok:
                raise
            self.ledgers, self.last_entry = [], {}
            return self
        ledgers = []
        self._handles.clear()
        for ledger_id in metadata.ledger_ids:
            if ledger_id not in self._closed:
                try:
                    ledger = self.client.ledger_metadata(ledger_id)
                except NoSuchLedger:
                    continue                         # truncated meanwhile
                if ledger.state == CLOSED:
                    self._closed.add(ledger_id)
                    self.last_entry[ledger_id] = ledger.last_entry_id
                else:
                    self.last_entry[ledger_id] = self._settled_lac(ledger_id)
            ledgers.append(ledger_id)
        gone = set(self.last_entry) - set(ledgers)
        for ledger_id in gone:
            self.last_entry.pop(ledger_id, None)
            self._closed.discard(ledger_id)
            self._first.pop(ledger_id, None)
        if gone:
            self._keys = {key: value for key, value in self._keys.items() if key[0] not in gone}
        self.ledgers = ledgers
        return self

    def _settled_lac(self, ledger_id: int) -> int:
        """_settled_lac is the LAC of a ledger being written, once it covers what the bookies may have acknowledged.

        The bookies' LAC trails the writer's acknowledgements by an entry until the next add or
        the writer's explicit LAC (about 100 ms later), so a record acknowledged to its producer
        just before this call would be missed; `ledger_end` bounds the acknowledged entries and
        the LAC is awaited up to there (at most SETTLE_S: an entry of a dead writer waits for
        its recovery).
        """
        handle = self._handle(ledger_id)
        end = self.client.ledger_end(ledger_id)
        if handle.last_add_confirmed < end:
            handle.wait_for_lac(end - 1, timeout=SETTLE_S)
        return handle.last_add_confirmed

    def _handle(self, ledger_id: int):
        handle = self._handles.get(ledger_id)
        if handle is None:
            handle = self._handles[ledger_id] = self.client.open_ledger(ledger_id, password=self.password,
                                                                        recover=False)
        return handle

    def entry(self, ledger_id: int, entry_id: int) -> bytes:
        """entry reads one entry's payload."""
        for entry in self._handle(ledger_id).read(entry_id, entry_id):
            return entry.payload
        raise NoSuchLedger(f"entry {entry_id} of ledger {ledger_id} could not be read")

    # -- positions (logs) ------------------------------------------------------------------------
    def start(self) -> Position:
        """start is the position of the first record still in the log (the end if it holds none)."""
        for ledger_id in self.ledgers:
            if self.last_entry[ledger_id] >= 0:
                return Position(ledger_id, 0)
        return self.end()

    def end(self) -> Position:
        """end is the position after the last visible record: (last ledger, its last entry + 1)."""
        if not self.ledgers:
            return Position(0, 0)
        last = self.ledgers[-1]
        return Position(last, self.last_entry[last] + 1)

    def normal(self, position: Position) -> Position:
        """normal is where reading from `position` really starts: past the end of a ledger it is the next ledger's start.

        A position before the log's first ledger is returned as it is (its records are gone).
        """
        for ledger_id in self.ledgers:
            if ledger_id < position.ledger_id:
                continue
            if ledger_id > position.ledger_id:
                return Position(ledger_id, 0)
            if position.entry_id <= self.last_entry[ledger_id] or ledger_id == self.ledgers[-1]:
                return position
        return position if not self.ledgers or position.ledger_id < self.ledgers[0] else self.end()

    def segments(self, start: Position, end: Position) -> list[Segment]:
        """segments are the entries from `start` up to (not including) `end`, ledger by ledger."""
        found = []
        for ledger_id in self.ledgers:
            if ledger_id < start.ledger_id or ledger_id > end.ledger_id:
                continue
            first = start.entry_id if ledger_id == start.ledger_id else 0
            last = self.last_entry[ledger_id] if ledger_id != end.ledger_id else end.entry_id - 1
            last = min(last, self.last_entry[ledger_id])
            if last >= first:
                found.append(Segment(ledger_id, first, last))
        return found

    def advance(self, start: Position, count: int, end: Position) -> Position:
        """advance is the position `count` records after `start`, at most `end`."""
        for segment in self.segments(start, end):
            if count < segment.entries:
                return Position(segment.ledger_id, segment.first + count)
            count -= segment.entries
        return end

    # -- offsets (topic partitions) --------------------------------------------------------------
    def _key(self, ledger_id: int, entry_id: int) -> int | None:
        """_key is the base offset of the first batch at or after the entry (None: none in the ledger)."""
        cached = self._keys.get((ledger_id, entry_id))
        if cached is not None:
            return cached
        last = self.last_entry.get(ledger_id, -1)
        probe = entry_id
        while probe <= last:
            span = entry_span(self.entry(ledger_id, probe))
            if span is not None:
                self._keys[(ledger_id, entry_id)] = span[0]     # entries never change once written
                return span[0]
            probe += 1
        return None

    def first_offset(self, ledger_id: int) -> int | None:
        """first_offset is the base offset of the ledger's first batch (None if it holds none yet)."""
        if ledger_id in self._first:
            return self._first[ledger_id]
        first = self._key(ledger_id, 0)
        if first is not None or ledger_id in self._closed:
            self._first[ledger_id] = first
        return first

    def earliest(self) -> int | None:
        """earliest is the first offset still in the partition's log (None: it holds no batch)."""
        for ledger_id in self.ledgers:
            first = self.first_offset(ledger_id)
            if first is not None:
                return first
        return None

    def end_offset(self) -> int | None:
        """end_offset is the offset after the last visible batch (None: the log holds no batch)."""
        for ledger_id in reversed(self.ledgers):
            for entry_id in range(self.last_entry[ledger_id], -1, -1):
                span = entry_span(self.entry(ledger_id, entry_id))
                if span is not None:
                    return span[1]
        return None

    def locate(self, offset: int) -> Position:
        """locate is the entry to read from for `offset`: the last entry whose first batch starts at or before it."""
        ledger = None
        for ledger_id in self.ledgers:
            first = self.first_offset(ledger_id)
            if first is None:
                continue
            if first > offset:
                break
            ledger = ledger_id
        if ledger is None:
            return self.start()
        lo, hi = 0, self.last_entry[ledger]            # key(lo) <= offset holds
        while lo < hi:
            mid = (lo + hi + 1) // 2
            key = self._key(ledger, mid)
            if key is not None and key <= offset:
                lo = mid
            else:
                hi = mid - 1
        return Position(ledger, lo)

    def split_offsets(self, topic: str, partition: int, lo: int, hi: int, max_records: int,
                      min_pieces: int = 1) -> list[Piece]:
        """split_offsets plans offsets [lo, hi) of a topic partition as pieces of about `max_records` records."""
        if hi <= lo:
            return []
        start, last = self.locate(lo), self.locate(hi - 1)
        segments = self.segments(start, Position(last.ledger_id, last.entry_id + 1))
        total = sum(s.entries for s in segments)
        count = min(total, max(min_pieces, math.ceil((hi - lo) / max_records)))
        cuts = _cut(segments, count)
        bounds = [lo]
        for part in cuts[1:]:                      # a piece ends where the next one's first batch begins
            key = self._key(part[0].ledger_id, part[0].first)
            bounds.append(max(bounds[-1], hi if key is None else min(hi, key)))
        bounds.append(hi)
        pieces = []
        for i, part in enumerate(cuts):
            if bounds[i + 1] > bounds[i]:
                pieces.append(Piece(self.name, tuple(part), topic, partition, bounds[i], bounds[i + 1]))
        return pieces

    def split_positions(self, start: Position, end: Position, max_records: int, min_pieces: int = 1) -> list[Piece]:
        """split_positions plans the records of a log from `start` up to `end` as pieces of about `max_records`."""
        segments = self.segments(start, end)
        total = sum(s.entries for s in segments)
        if not total:
            return []
        count = min(total, max(min_pieces, math.ceil(total / max_records)))
        return [Piece(self.name, tuple(part)) for part in _cut(segments, count)]


def _cut(segments: list[Segment], count: int) -> list[list[Segment]]:
    """_cut divides the entries of `segments` into `count` consecutive parts of nearly equal size."""
    total = sum(s.entries for s in segments)
    parts: list[list[Segment]] = []
    queue = list(segments)
    for i in range(count):
        want = total * (i + 1) // count - total * i // count
        part = []
        while want > 0 and queue:
            segment = queue.pop(0)
            if segment.entries <= want:
                part.append(segment)
                want -= segment.entries
            else:
                part.append(Segment(segment.ledger_id, segment.first, segment.first + want - 1))
                queue.insert(0, Segment(segment.ledger_id, segment.first + want, segment.last))
                want = 0
        if part:
            parts.append(part)
    return parts
