"""walkit.core.logreader is the sans-IO machine of a log reader: records in log order, once each.

A reader walks the log's ledger list from `start` (default: the oldest record). For each ledger
it reads the ledger's metadata; a CLOSED ledger is read to its last entry, an unclosed one up
to its LAC (LacReader, with the issue-2615 floor). The reader never moves past a ledger that is
not closed: the writer may still complete entries there (a roll closes the previous ledger only
after its pending adds), and recovery decides its end. So:

- without `follow` the read ends at the first unclosed ledger's LAC (or at the end of the list);
- with `follow`, once it has read up to the LAC it long-polls (for `long_poll_ms`, default
  `poll_ms`) the replicas of the next entry for that entry and the LAC together (TailReader,
  BookKeeper's readLastConfirmedAndEntry: one request and one answer per entry while the writer
  keeps writing; the second replica is asked `poll_ms` later). It re-reads the ledger's
  metadata when nothing new came, and moves to the next ledger of the list once the
  ledger is closed and read to its end: across rolls and writer handovers (the new writer closes
  the old ledger at its true end). An idle follower so costs one metadata read and a long poll
  per replica of the next entry every `long_poll_ms`; LogChanged (the caller saw the log's metadata change,
  say through a watch) makes it look again at once instead of at the end of the long poll.
  After a failed read it asks the LAC plainly first (LacReader), as its answer says the bookies are back.
  With `linger_ms`, a following reader that caught up (the caller consumed every record it delivered)
  waits that long before its next long poll, so what the writer appended meanwhile comes in one answer
  and one range read instead of one long poll per entry: fewer requests and wake-ups per entry for the
  reader and the bookies, for records delivered up to `linger_ms` later. That range read (up to
  TOGETHER_AT_MOST entries) is delivered in one piece once every answer came. Its ReaderCaughtUp then says
  until when (the caller ticks it then); LogChanged cuts the linger short.

Truncation: if truncation or retention removed a ledger holding records at or after the
reader's next position (LogMetadata.truncated_to), records it has not read are gone, and the
reader fails with LogTruncated rather than skip them. A ledger deleted while the reader is at
its start is looked up in the list again: a new writer's open drops a ledger its recovery found
empty, and the reader moves on to the next one; any other deleted ledger fails with
LogTruncated. A deleted log fails with NoSuchLog. Bookie failures are retried every `poll_ms`
(a reader without `follow` gives up after `attempts` tries).

Memory stays bounded: within a ledger the RangeReader keeps at most `window` entries ahead of
what the caller consumed (EntriesConsumed), and the reader moves on from a ledger (to the next
one, or to long-polling) only once the caller consumed every record delivered so far.

Events: LogMetadataRead, LedgerMetadataRead, the ledger-level events of its LacReader,
TailReader and RangeReader, EntriesConsumed (the caller's progress), LogChanged, CatchUp and Ticked. Outcomes:
DeliverRecords, ReaderCaughtUp (following: everything confirmed so far was delivered),
ReaderRetrying (a read failed and is tried again), CompleteRead (the end, without `follow`), FailRead.
"""

from __future__ import annotations

from walkit.core import events as ev
from walkit.core import logevents as lev
from walkit.core.digest import Digest
from walkit.core.loglist import LogMetadata, LogSegment, Position
from walkit.core.metadata import CLOSED as LEDGER_CLOSED
from walkit.core.metadata import LedgerMetadata
from walkit.core.reader import LacReader, RangeReader, TailReader
from walkit.errors import LogTruncated, NoSuchLog

#: A lingering follower's range read of fewer entries than this is delivered in one piece (RangeReader's
#: `together`): what piled up during a linger; a longer one (a follower far behind) streams.
TOGETHER_AT_MOST = 256

# Answers for the reader's sub-machines: a late answer meant for another kind is dropped.
_ROUTED = {ev.EntriesRead: (RangeReader, TailReader), ev.ReadFailed: (RangeReader, TailReader),
           ev.LacRead: (LacReader,)}


class LogReader:
    """LogReader reads log `name` in order; call `start`, then feed events to `step` (see the module doc)."""

    #: The machine that tails an unclosed ledger (a subclass in the simulator's broken-rule tests).
    TAIL_READER = TailReader

    def __init__(self, name: str, *, password: bytes = b"", start: Position | None = None, follow: bool = False,
                 poll_ms: int = 1000, read_timeout_ms: int = 10_000, window: int = 4096, attempts: int = 5,
                 now_ms: int = 0, speculative_ms: int = 0, long_poll_ms: int | None = None,
                 linger_ms: int = 0) -> None:
        self.name = name
        self.linger_ms = linger_ms
        self.password = password
        self.follow = follow
        self.poll_ms = poll_ms
        self.long_poll_ms = poll_ms if long_poll_ms is None else long_poll_ms
        self.read_timeout_ms = read_timeout_ms
        self.speculative_ms = speculative_ms
        self.window = window
        self.attempts = attempts
        self.done = False
        self.next = start                         # the next record to deliver
        self._from_oldest = start is None
        self.delivered: Position | None = None    # the last record delivered
        self._segment: LogSegment | None = None
        self._last_in_list = False
        self._ledger: LedgerMetadata | None = None
        self._sub = None                           # the LacReader or RangeReader running
        self._lac = -1
        self._failures = 0
        self._wake_at: int | None = None
        self._wake_action = None
        self._final = False
        self._consumed: Position | None = None    # the last record the caller consumed
        self._parked = None                        # what to do once the caller consumed everything
        self._now = now_ms
        self._digests: dict[str, Digest] = {}
        self._slow: dict[str, int] = {}          # bookies that did not answer in time (RangeReader)
        self._gone: int | None = None             # a ledger found deleted, whose list is being read again
        self._changed = False                      # LogChanged came while no poll or wait could take it

    @property
    def ledger(self) -> LedgerMetadata | None:
        """ledger is the metadata of the ledger being read (None between ledgers)."""
        return self._ledger

    def start(self) -> list:
        """start reads the log's ledger list."""
        return [lev.ReadLogMetadata(name=self.name)]

    def step(self, event) -> list:
        """step applies one event and returns commands and outcomes."""
        if self.done:
            return []
        kind = type(event)
        if kind in _ROUTED:
            sub = self._sub
            if not isinstance(sub, _ROUTED[kind]) or event.ledger_id != sub.ledger_id:
                return []
            return self._handle(self._sub.step(event))
        if kind is lev.LogMetadataRead:
            return self._on_list(event.metadata)
        if kind is ev.LedgerMetadataRead:
            return self._on_ledger(event) if self._segment and event.ledger_id == self._segment.ledger_id else []
        if kind is ev.EntriesConsumed:
            return self._on_consumed(event)
        if kind is ev.Ticked:
            return self._on_tick(event)
        if kind is lev.LogChanged:
            return self._on_changed()
        if kind is lev.CatchUp:
            return self._on_catch_up()
        return []

    def _on_changed(self) -> list:
        """_on_changed (LogChanged) looks again now instead of at the end of a long poll or a wait."""
        if (self._polling() or self._lingering()) and self._ledger is not None:
            self._sub = None                  # its late answers are dropped
            self._wake_at = self._wake_action = None
            return [ev.ReadLedgerMetadata(ledger_id=self._ledger.ledger_id)]
        if self._wake_at is not None:
            action, self._wake_at, self._wake_action = self._wake_action, None, None
            return action()
        self._changed = True                  # reading, or waiting for the caller: looked at before the next poll
        return []

    # -- the list ----------------------------------------------------------------------------------
    def _on_list(self, metadata: LogMetadata | None) -> list:
        if metadata is None:
            return self._fail(NoSuchLog(f"no log named {self.name!r}"))
        nxt = self.next
        if nxt is not None and nxt.ledger_id <= metadata.truncated_to and nxt.ledger_id not in metadata.ledger_ids:
            return self._fail(LogTruncated(f"log {self.name!r} was truncated past the reader's position {nxt}: "
                                           f"ledgers up to {metadata.truncated_to} are gone"))
        later = [s for s in metadata.segments if nxt is None or s.ledger_id >= nxt.ledger_id]
        if not later:
            if not self.follow:
                return self._complete()
            return self._caught_up() + self._wait(lambda: [lev.ReadLogMetadata(name=self.name)])
        self._segment = later[0]
        self._last_in_list = later[0] is metadata.segments[-1]
        if nxt is None or nxt.ledger_id != later[0].ledger_id:
            self.next = Position(later[0].ledger_id, 0)
        return [ev.ReadLedgerMetadata(ledger_id=later[0].ledger_id)]

    def _next_ledger(self) -> list:
        """_next_ledger moves past a ledger read to its end and reads the list again."""
        segment = self._segment
        self._segment, self._ledger, self._sub = None, None, None
        self.next = Position(segment.ledger_id + 1, 0)
        return [lev.ReadLogMetadata(name=self.name)]

    # -- one ledger ----------------------------------------------------------------------------------
    def _digest(self, kind: str) -> Digest:
        digest = self._digests.get(kind)
        if digest is None:
            digest = self._digests[kind] = Digest(kind, self.password)
        return digest

    def _on_ledger(self, event: ev.LedgerMetadataRead) -> list:
        if event.metadata is None:
            return self._ledger_gone(event.ledger_id)
        self._gone = None
        self._changed = False                      # looked at now
        self._ledger = md = event.metadata
        if self.next.entry_id < md.first_entry_id:   # an unbounded ledger truncated below its first entry
            if not (self._from_oldest and self.delivered is None):
                return self._fail(LogTruncated(f"log {self.name!r}: records before {md.first_entry_id} of ledger "
                                               f"{md.ledger_id} were truncated before they were read"))
            self.next = Position(md.ledger_id, md.first_entry_id)
        if md.state == LEDGER_CLOSED:
            return self._read_to(md.last_entry_id, final=True)
        if self.follow and not self._failures and md.last_fragment_start - 1 < self.next.entry_id:
            # Answered at once if there is something new; otherwise held until there is. (After a
            # failure the LAC is asked plainly first: its answer says the bookies are back.)
            self._sub = self._tail(md)
        else:
            self._sub = LacReader(md)
        return self._handle(self._sub.start())

    def _ledger_gone(self, ledger_id: int) -> list:
        """_ledger_gone handles a deleted ledger: the list says whether it was truncated or dropped empty.

        A new writer's open drops (and deletes) a ledger its recovery found empty: nothing of it
        was confirmed, so nothing of it was delivered, and the list moves on. A ledger records of
        which were delivered, or one the list still names, is gone under the reader: LogTruncated.
        """
        if self._gone == ledger_id or (self.delivered is not None and self.delivered.ledger_id == ledger_id):
            return self._fail(LogTruncated(f"log {self.name!r}: ledger {ledger_id} was deleted while being read"))
        self._gone = ledger_id
        self._segment, self._ledger, self._sub = None, None, None
        return [lev.ReadLogMetadata(name=self.name)]

    def _read_to(self, last: int, final: bool) -> list:
        """_read_to reads the ledger from the next entry up to `last` (final: the ledger's end)."""
        first = self.next.entry_id
        self._final = final
        if last < first:
            return self._after_read()
        # what a linger let pile up (a few entries) comes in one delivery; a long read streams
        together = self.linger_ms > 0 and not final and last - first < TOGETHER_AT_MOST
        self._sub = RangeReader(self._ledger, first, last, self._digest(self._ledger.digest_type),
                                window=self.window, timeout_ms=self.read_timeout_ms, now_ms=self._now,
                                speculative_ms=self.speculative_ms, slow=self._slow, together=together)
        return self._handle(self._sub.start())

    def _on_consumed(self, event: ev.EntriesConsumed) -> list:
        if event.now_ms is not None and event.now_ms > self._now:
            self._now = event.now_ms
        if event.ledger_id is not None:
            self._consumed = max(self._consumed or Position(-1, -1), Position(event.ledger_id, event.upto))
        out: list = []
        sub = self._sub
        if isinstance(sub, RangeReader) and event.ledger_id in (None, sub.ledger_id):
            out += self._handle(sub.step(event))
        if self._parked is not None and (self.delivered is None or (self._consumed or Position(-1, -1)) >= self.delivered):
            parked, self._parked = self._parked, None
            out += parked()
        return out

    def _after_read(self) -> list:
        """_after_read decides what follows reading a ledger up to its end or its LAC.

        It waits until the caller consumed every record delivered, so records never pile up.
        """
        self._sub = None
        self._failures = 0
        if self.delivered is not None and (self._consumed is None or self._consumed < self.delivered):
            self._parked = self._after_consumed
            return []
        return self._after_consumed()

    def _after_consumed(self) -> list:
        if self._final:
            return self._next_ledger()
        if not self.follow:
            return self._complete()           # an unclosed ledger's end is not known yet
        if self.linger_ms > 0:
            self._wake_at = self._now + self.linger_ms
            self._wake_action = self._poll_tail
            return [lev.ReaderCaughtUp(position=self.delivered, wake_at_ms=self._wake_at)]
        return self._caught_up() + self._poll_tail()

    def _poll_tail(self) -> list:
        """_poll_tail long-polls the ledger being followed for its next entry (or reads its metadata first, if the
        log changed meanwhile: a roll may have closed it)."""
        if self._changed:
            self._changed = False
            return [ev.ReadLedgerMetadata(ledger_id=self._ledger.ledger_id)]
        self._sub = self._tail(self._ledger)
        return self._handle(self._sub.start())

    def _tail(self, md: LedgerMetadata) -> TailReader:
        """_tail long-polls the ledger for the next entry and its LAC at once (TailReader)."""
        return self.TAIL_READER(md, self.next.entry_id, self._digest(md.digest_type), timeout_ms=self.long_poll_ms,
                          spread_ms=self.poll_ms, now_ms=self._now, slow=self._slow)

    def _lingering(self) -> bool:
        """_lingering tells whether the reader caught up and waits `linger_ms` before its next long poll."""
        return self._wake_action == self._poll_tail

    def _on_catch_up(self) -> list:
        """_on_catch_up (CatchUp) ends a linger: the reader long-polls now."""
        if not self._lingering():
            return []
        self._wake_at = self._wake_action = None
        return self._poll_tail()

    def _polling(self) -> bool:
        """_polling tells whether a long poll is running (a TailReader, or a LacReader with a timeout)."""
        sub = self._sub
        return isinstance(sub, TailReader) or (type(sub) is LacReader and sub.timeout_ms > 0)

    def _handle(self, commands: list) -> list:
        out: list = []
        for command in commands:
            kind = type(command)
            if kind is ev.DeliverEntries:
                entries = command.entries
                self.next = Position(command.ledger_id, entries[-1].entry_id + 1)
                self.delivered = Position(command.ledger_id, entries[-1].entry_id)
                out.append(lev.DeliverRecords(ledger_id=command.ledger_id, entries=entries))
            elif kind is ev.CompleteRead:
                if isinstance(self._sub, TailReader):      # it may have delivered the entry its LAC confirms
                    out += self._on_lac(command.lac, progressed=command.lac >= self._sub.entry_id)
                elif isinstance(self._sub, LacReader):
                    out += self._on_lac(command.lac)
                else:
                    out += self._after_read()
            elif kind is ev.FailRead:
                out += self._retry(command.error)
            else:
                out.append(command)
        return out

    def _on_lac(self, lac: int, progressed: bool = False) -> list:
        """_on_lac reads up to the LAC found (`progressed`: past the entry a TailReader asked for, which it
        may have delivered already)."""
        self._sub = None
        self._failures = 0
        if lac >= self.next.entry_id or progressed:
            return self._read_to(lac, final=False)
        if self.follow:          # nothing new: the ledger may be closed by now
            return self._caught_up() + [ev.ReadLedgerMetadata(ledger_id=self._ledger.ledger_id)]
        return self._complete()

    # -- outcomes, retries and time -------------------------------------------------------------------
    def _caught_up(self) -> list:
        return [lev.ReaderCaughtUp(position=self.delivered)]

    def _retry(self, error: Exception) -> list:
        """_retry reads the ledger's metadata again after `poll_ms`, or gives up without `follow`."""
        self._sub = None
        self._failures += 1
        if not self.follow and self._failures >= self.attempts:
            return self._fail(error)
        ledger_id = self._segment.ledger_id
        return [lev.ReaderRetrying(error=error, failures=self._failures)] + self._wait(
            lambda: [ev.ReadLedgerMetadata(ledger_id=ledger_id)])

    def _wait(self, action) -> list:
        self._wake_at = self._now + self.poll_ms
        self._wake_action = action
        return []

    def _complete(self) -> list:
        self.done = True
        return [ev.CompleteRead(ledger_id=-1)]

    def _fail(self, error: Exception) -> list:
        self.done = True
        self._sub = None
        return [ev.FailRead(ledger_id=-1, error=error)]

    def _on_tick(self, event: ev.Ticked) -> list:
        self._now = event.now_ms
        out: list = []
        if self._sub is not None:
            out += self._handle(self._sub.step(event))
        if self._wake_at is not None and self._now >= self._wake_at:
            action, self._wake_at, self._wake_action = self._wake_action, None, None
            out += action()
        return out
