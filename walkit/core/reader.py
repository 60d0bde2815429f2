"""walkit.core.reader is the state machine of a range read over a ledger's replicas.

A read of entries [first, last] asks each entry from the first bookie of its write set (so a
range spreads over the ensemble as writes did), verifies every digest, and on NO_SUCH_ENTRY, an
error, a timeout or a digest mismatch asks the next bookie of the write set.

A stalled bookie (a SIGSTOP, a partition) costs a read one wait, not one per window:

- a bookie that does not answer in time is presumed stopped: every entry still asked of it
  moves on to its next replica at once, and for the next SLOW_FOR_MS it is asked last, by new
  asks and by retries alike (so is a bookie reported UNREACHABLE, whose reported entries move
  on). A LogReader shares this across the ledgers it reads;
- with `speculative_ms` (BookKeeper's speculative read timeout), an entry not answered that
  long is also asked of its next replica, without giving up on the first: whichever answers
  first is used, and the read waits for every open ask before it fails an entry. The bookie
  that was that slow is asked last, as above, so the wait is `speculative_ms`, not a timeout.

Entries are delivered strictly in entry order, in batches, with at most `window` entries
requested and not yet consumed (the caller reports consumption with EntriesConsumed), so a long
read streams in bounded memory. A bookie's answer holds a bounded number of bytes (BP-62;
ReadRequest.max_bytes): the ids it did not look at (EntriesRead.unread) are asked of it again
at once, not counted as missing. An entry fails the read only when every bookie of its write
set failed it: DigestMismatch if any replica returned corrupt bytes,
NoSuchEntry if all said it is absent, otherwise BookieError. A NO_SUCH_ENTRY from a disk other
than the one the entry's fragment records (a bookie whose storage was replaced since) is not
"absent" but an error of that replica.
"""

from __future__ import annotations

from walkit.core import events as ev
from walkit.core.digest import Digest
from walkit.core.distribution import ensemble_coverage, write_set_bookies, write_sets_of
from walkit.core.messages import Entry, Status
from walkit.core.metadata import LedgerMetadata
from walkit.core.messages import refusal as _refusal
from walkit.errors import BookieError, DigestMismatch, NoSuchEntry, Unauthorized


#: The reason recorded for a replica that returned bytes whose digest does not verify.
DIGEST_MISMATCH = "DIGEST_MISMATCH"
#: The reason recorded for NO_SUCH_ENTRY from a disk other than the one the fragment records
#: (walkit.core.metadata.LedgerMetadata.disks): it does not make the entry absent.
REPLACED_DISK = "NO_SUCH_ENTRY from a replaced disk"

#: How long a bookie that did not answer in time is asked last (milliseconds). Only the order
#: of asking changes: a slow bookie is still asked for an entry no other replica returned.
SLOW_FOR_MS = 60_000


class _Wanted:
    """_Wanted tracks one entry not yet received: its replicas, who is asked, what failed."""

    __slots__ = ("replicas", "tried", "asked", "sent_ms", "errors", "earlier")

    def __init__(self, replicas: tuple[str, ...], sent_ms: int) -> None:
        """A new _Wanted was just asked of its first replica, at `sent_ms`."""
        self.replicas = replicas
        self.tried = 1                # replicas[:tried] were asked
        self.asked: str | None = replicas[0]
        self.sent_ms = sent_ms
        self.errors: list[tuple[str, str]] = []   # (bookie, status name or DIGEST_MISMATCH)
        self.earlier: tuple[str, ...] = ()        # asked before `asked` (a speculative read) and may still answer


class RangeReader:
    """RangeReader reads entries [first, last] of a ledger; drive it with `start` and `step`."""

    def __init__(self, metadata: LedgerMetadata, first: int, last: int, digest: Digest, *,
                 window: int = 4096, timeout_ms: int = 5000, now_ms: int = 0, speculative_ms: int = 0,
                 slow: dict[str, int] | None = None, together: bool = False) -> None:
        """`speculative_ms` > 0 turns on speculative reads (see the module doc). `slow` maps
        bookies that did not answer in time to when they stop being asked last; pass the same
        dict to successive readers to carry it over (the reader updates it). With `together`
        the entries asked are delivered once all of them came, in one DeliverEntries, not as
        each replica's answer completes a prefix (for a caller that hands each delivery on:
        one hand-over instead of several)."""
        if first < 0 or last < first - 1:
            raise ValueError(f"invalid entry range [{first}, {last}]")
        self.metadata = metadata
        self.ledger_id = metadata.ledger_id
        self.first, self.last = first, last
        self.window = window
        self.timeout_ms = timeout_ms
        self.speculative_ms = speculative_ms if 0 < speculative_ms < timeout_ms else 0
        self.together = together
        self.done = False
        self._verify_many = digest.verify_many
        self._now = now_ms
        self._next_request = first
        self._next_deliver = first
        self._consumed = first          # entries below this were taken by the caller
        self._wanted: dict[int, _Wanted] = {}
        self._next_check_ms = now_ms + (self.speculative_ms or timeout_ms)   # no ask is late before this
        self._received: dict[int, Entry] = {}
        self._slow = {} if slow is None else slow    # bookie -> asked last until this time (ms)
        self._write_sets: dict[int, list[tuple[str, ...]]] = {}     # per fragment start
        self._handlers = {ev.EntriesRead: self._on_read, ev.ReadFailed: self._on_failed, ev.Ticked: self._on_tick,
                          ev.EntriesConsumed: self._on_consumed}

    def start(self) -> list:
        """start returns the first read requests (or completion, for an empty range)."""
        return self._top_up() or self._deliver()

    def step(self, event) -> list:
        """step applies one event and returns commands."""
        if self.done:
            return []
        return self._handlers[type(event)](event)

    # -- requests -------------------------------------------------------------------------
    def _on_consumed(self, event: ev.EntriesConsumed) -> list:
        self._consumed = max(self._consumed, event.upto + 1)
        return self._top_up()

    def _top_up(self) -> list:
        outstanding = self._next_request - self._consumed
        if self._next_request > self.last or outstanding > self.window // 2:
            return []
        sends: dict[str, list[int]] = {}
        stop = min(self.last, self._consumed + self.window - 1)
        wanted_map, now = self._wanted, self._now
        any_slow = any(map(self._is_slow, self._slow))
        for first, last, write_sets in self._fragments_between(self._next_request, stop):
            if any_slow:  # healthy replicas first; the order among each kind stays (a stable sort)
                write_sets = [tuple(sorted(replicas, key=self._is_slow)) for replicas in write_sets]
            size = len(write_sets)
            asks = [sends.setdefault(replicas[0], []) for replicas in write_sets]   # each entry's first replica
            for entry_id in range(first, last + 1):
                k = entry_id % size
                wanted_map[entry_id] = _Wanted(write_sets[k], now)
                asks[k].append(entry_id)
        self._next_request = stop + 1
        return self._sends(sends)

    def _fragments_between(self, first: int, last: int):
        """_fragments_between yields (first, last, write sets) for each fragment overlapping first..last."""
        starts = self.metadata.fragment_starts
        for i, start in enumerate(starts):
            end = starts[i + 1] - 1 if i + 1 < len(starts) else last
            low, high = max(first, start), min(last, end)
            if low <= high:
                sets = self._write_sets.get(start)
                if sets is None:
                    sets = self._write_sets[start] = write_sets_of(self.metadata.ensembles[start],
                                                                     self.metadata.write_quorum)
                yield low, high, sets

    def _ask(self, entry_id: int, wanted: _Wanted, sends: dict[str, list[int]]) -> bool:
        """_ask asks the entry of its next replica not yet asked, a healthy one before a slow one."""
        replicas, tried = wanted.replicas, wanted.tried
        if tried >= len(replicas):
            return False
        bookie = replicas[tried]
        if self._is_slow(bookie):
            for i in range(tried + 1, len(replicas)):
                if not self._is_slow(replicas[i]):      # ask it now; the slow ones stay after it
                    bookie = replicas[i]
                    wanted.replicas = replicas[:tried] + (bookie,) + replicas[tried:i] + replicas[i + 1:]
                    break
        wanted.tried += 1
        wanted.asked = bookie
        wanted.sent_ms = self._now
        sends.setdefault(bookie, []).append(entry_id)
        return True

    def _sends(self, sends: dict[str, list[int]]) -> list:
        return [ev.SendRead(bookie=b, ledger_id=self.ledger_id, entry_ids=ids) for b, ids in sends.items() if ids]

    # -- answers --------------------------------------------------------------------------
    def _on_read(self, event: ev.EntriesRead) -> list:
        retry: list[tuple[int, str, str]] = []
        wanted_map, received, ledger_id, bookie = self._wanted, self._received, self.ledger_id, event.bookie
        for entry, verified in zip(event.entries, self._verify_many(event.entries)):
            entry_id = entry.entry_id
            wanted = wanted_map.get(entry_id)
            if wanted is None:
                continue          # already received (a late duplicate) or not ours
            if verified and entry.ledger_id == ledger_id:
                received[entry_id] = entry
                del wanted_map[entry_id]          # (not pop and put back: the map stays in entry order)
            else:
                retry.append((entry_id, bookie, DIGEST_MISMATCH))
        missing = Status.NO_SUCH_ENTRY.name
        counts = self.metadata.answer_counts
        retry += [(entry_id, bookie, missing if counts(entry_id, bookie, event.disk) else REPLACED_DISK)
                  for entry_id in event.missing]
        again = self._ask_again(bookie, event.unread) if event.unread else []
        return again + self._retry(retry) + self._deliver()

    def _ask_again(self, bookie: str, entry_ids: list[int]) -> list:
        """_ask_again asks `bookie` once more for ids its answer did not look at (it was full).

        They are not missing there, and the bookie is answering: it stays asked (as the last
        ask or as an earlier, speculative one), and the entry's wait starts over, since an
        entry far down a long read waits for the answers before it, not for a stalled bookie.
        """
        ids = []
        wanted_map, now = self._wanted, self._now
        for entry_id in entry_ids:
            wanted = wanted_map.get(entry_id)
            if wanted is not None and (wanted.asked == bookie or bookie in wanted.earlier):
                wanted.sent_ms = now
                ids.append(entry_id)
        return self._sends({bookie: ids})

    def _on_failed(self, event: ev.ReadFailed) -> list:
        if event.status == Status.UNAUTHORIZED:
            return self._fail(Unauthorized(_refusal(event, self.ledger_id)))
        if event.status == Status.UNREACHABLE:     # asked last from now on; its other asks keep their timeouts
            self._mark_slow({event.bookie})
        if event.status == Status.NO_SUCH_LEDGER and self.metadata.holds_nothing_counts(event.disk):
            return self._on_read(ev.EntriesRead(bookie=event.bookie, ledger_id=event.ledger_id, entries=[],
                                                missing=event.entry_ids, lac=-1, disk=event.disk))   # as NO_SUCH_ENTRY each
        return self._retry([(e, event.bookie, event.status.name) for e in event.entry_ids]) + self._deliver()

    def _unresponsive(self, bookies: set[str]) -> list:
        """_unresponsive moves every entry asked of `bookies` on to its next replica, in entry
        order, and has them asked last for SLOW_FOR_MS."""
        self._mark_slow(bookies)
        unreachable = Status.UNREACHABLE.name
        failures = []
        for entry_id, wanted in self._wanted.items():
            if wanted.asked in bookies:
                failures.append((entry_id, wanted.asked, unreachable))
            failures += [(entry_id, b, unreachable) for b in wanted.earlier if b in bookies]
        return self._retry(failures)

    def _speculate(self, bookies: set[str]) -> list:
        """_speculate also asks every entry asked of `bookies` of its next replica (if it has
        one left), keeping the first ask open, and has `bookies` asked last for SLOW_FOR_MS."""
        self._mark_slow(bookies)
        sends: dict[str, list[int]] = {}
        for entry_id, wanted in self._wanted.items():
            asked = wanted.asked
            if asked in bookies and wanted.tried < len(wanted.replicas):
                wanted.earlier += (asked,)
                self._ask(entry_id, wanted, sends)
        return self._sends(sends)

    def _is_slow(self, bookie: str) -> bool:
        return self._slow.get(bookie, 0) > self._now

    def _mark_slow(self, bookies: set[str]) -> None:
        until = self._now + SLOW_FOR_MS
        for bookie in bookies:
            self._slow[bookie] = until

    def _retry(self, failures: list[tuple[int, str, str]]) -> list:
        """_retry asks each (entry, bookie that failed it, status) of its next replica, or fails
        the read at the first entry that has none left and no ask still open."""
        sends: dict[str, list[int]] = {}
        for entry_id, bookie, status in failures:
            wanted = self._wanted.get(entry_id)
            if wanted is None:
                continue
            if wanted.asked == bookie:
                wanted.errors.append((bookie, status))
                wanted.asked = None
                if self._ask(entry_id, wanted, sends) or wanted.earlier:
                    continue
            elif bookie in wanted.earlier:
                wanted.errors.append((bookie, status))
                wanted.earlier = tuple(b for b in wanted.earlier if b != bookie)
                if wanted.asked is not None or wanted.earlier:
                    continue
            else:
                continue      # not asked of this bookie (any more): a late answer
            return self._fail(self._error_for(entry_id, wanted))
        return self._sends(sends)

    def _error_for(self, entry_id: int, wanted: _Wanted):
        where = f"entry {entry_id} of ledger {self.ledger_id}"
        statuses = [s for _, s in wanted.errors]
        if DIGEST_MISMATCH in statuses:
            return DigestMismatch(f"{where}: no replica of {', '.join(wanted.replicas)} returned bytes "
                                  "whose digest verifies")
        if all(s == Status.NO_SUCH_ENTRY.name for s in statuses):
            return NoSuchEntry(f"{where} is on none of {', '.join(wanted.replicas)}")
        detail = ", ".join(f"{b}: {s}" for b, s in wanted.errors)
        return BookieError(f"{where} could not be read ({detail})", statuses[-1])

    def _deliver(self) -> list:
        if self.done or (self.together and self._wanted):      # some asked entries are still on their way
            return []
        batch = []
        received, next_deliver = self._received, self._next_deliver
        while next_deliver in received:
            batch.append(received.pop(next_deliver))
            next_deliver += 1
        self._next_deliver = next_deliver
        commands: list = [ev.DeliverEntries(ledger_id=self.ledger_id, entries=batch)] if batch else []
        if self._next_deliver > self.last:
            self.done = True
            return commands + [ev.CompleteRead(ledger_id=self.ledger_id)]
        return commands + self._top_up()

    def _fail(self, error: Exception) -> list:
        self.done = True
        self._wanted.clear()
        self._received.clear()
        return [ev.FailRead(ledger_id=self.ledger_id, error=error)]

    def _on_tick(self, event: ev.Ticked) -> list:
        self._now = now = event.now_ms
        if now < self._next_check_ms:
            return self._deliver()  # nothing can be late yet: no need to look at every wanted entry
        timeout, speculative = self.timeout_ms, self.speculative_ms
        late: set[str] = set()
        slow: set[str] = set()      # slower than speculative_ms: their entries are asked elsewhere too
        next_check = now + (speculative or timeout)     # asks made from now on are not late before this
        for wanted in self._wanted.values():
            sent = wanted.sent_ms
            asked = wanted.asked
            if asked is None:       # out of replicas, waiting for the earlier asks
                if now - sent >= timeout:
                    late.update(wanted.earlier)
                else:
                    next_check = min(next_check, sent + timeout)
            elif now - sent >= timeout:
                late.add(asked)
                late.update(wanted.earlier)     # asked before `asked`: later than that too
            elif speculative and wanted.tried < len(wanted.replicas):
                if now - sent >= speculative:
                    slow.add(asked)
                else:
                    next_check = min(next_check, sent + speculative)
            else:
                next_check = min(next_check, sent + timeout)
        self._next_check_ms = next_check
        slow -= late
        self._mark_slow(slow)       # before the retries below, so they skip these bookies too
        commands = self._unresponsive(late) if late else []
        if self.done:
            return commands
        if slow:
            commands += self._speculate(slow)
        return commands + self._deliver()


def _no_answer(ledger_id: int, refused: dict[str, str], errors: dict[str, str]):
    """_no_answer is the FailRead of a LAC read no bookie answered: Unauthorized if one refused the client."""
    if refused:
        bookie, why = next(iter(refused.items()))
        return ev.FailRead(ledger_id=ledger_id, error=Unauthorized(
            f"bookie {bookie} refused ledger {ledger_id}: {why or 'wrong password'}"))
    detail = ", ".join(f"{b}: {why}" for b, why in errors.items())
    return ev.FailRead(ledger_id=ledger_id, error=BookieError(f"no bookie of ledger {ledger_id} answered ({detail})"))


class LacReader:
    """LacReader asks the bookies of a ledger's last fragment for their LAC.

    Without long poll it completes once EC = (E - Qa) + 1 bookies answered (or all answered),
    with the highest LAC seen: every entry up to it is confirmed. With `previous_lac` >= -1 and
    `timeout_ms` > 0 each bookie holds the request until its LAC passes `previous_lac`; the
    reader completes at the first answer above it, or with the highest answer once all bookies
    answered. It fails only if no bookie answered at all.

    The answer is never below (first entry of the last fragment) - 1 (BookKeeper issue 2615): a
    fragment starts at LAC + 1 when it is made, so every entry before it was confirmed, even
    when the bookies of the new fragment have seen no entry yet and answer -1.

    It also reports the highest entry the answering bookies store (`last_entry_id`). Without
    long poll that bounds every entry the writer acknowledged: an acknowledged entry is on Qa
    bookies, and EC = (E - Qa) + 1 answers include at least one of them. Readers that must see
    everything acknowledged before they asked (a linearizable read barrier) wait for that.
    """

    def __init__(self, metadata: LedgerMetadata, *, previous_lac: int = -2, timeout_ms: int = 0) -> None:
        self.metadata = metadata
        self.ledger_id = metadata.ledger_id
        self.previous_lac = previous_lac
        self.timeout_ms = timeout_ms
        self.done = False
        self._bookies = metadata.current_ensemble
        self._answers: dict[str, int] = {}
        self._errors: dict[str, str] = {}
        self._refused: dict[str, str] = {}         # UNAUTHORIZED answers
        self._last_entry = -1

    @property
    def covered(self) -> bool:
        """covered is True once EC = (E - Qa) + 1 bookies answered: then `last_entry_id` bounds every acknowledged entry.

        A read that completed because the other bookies failed to answer is not covered: the
        entries it did not hear of may have been acknowledged.
        """
        md = self.metadata
        return len(self._answers) >= ensemble_coverage(md.ensemble_size, md.ack_quorum)

    def start(self) -> list:
        """start sends the LAC requests."""
        return [ev.SendReadLac(bookie=b, ledger_id=self.ledger_id, previous_lac=self.previous_lac,
                               timeout_ms=self.timeout_ms) for b in self._bookies]

    def step(self, event) -> list:
        """step takes LacRead answers; other events are ignored."""
        if self.done or type(event) is not ev.LacRead or event.bookie not in self._bookies:
            return []
        md = self.metadata
        if event.status in (Status.OK, Status.NO_SUCH_LEDGER) and not (
                md.answer_counts(md.last_fragment_start, event.bookie, event.disk)
                and (event.status == Status.OK or md.holds_nothing_counts(event.disk))):
            # A replaced disk knows nothing of what its predecessor acknowledged: its LAC (or its
            # NO_SUCH_LEDGER) would make the end look earlier than it is.
            self._errors[event.bookie] = f"answered from disk {event.disk:x}, not the one the fragment records"
        elif event.status == Status.OK:
            self._answers[event.bookie] = event.lac
            self._last_entry = max(self._last_entry, event.last_entry_id)
        elif event.status == Status.NO_SUCH_LEDGER:
            self._answers[event.bookie] = -1        # the bookie holds nothing of it yet
        else:
            self._errors[event.bookie] = f"{event.status.name} {event.message}".strip()
            if event.status == Status.UNAUTHORIZED:
                self._refused[event.bookie] = event.message
        best = max(self._answers.values(), default=None)
        answered = len(self._answers) + len(self._errors)
        long_poll = self.previous_lac >= -1 and self.timeout_ms > 0
        if long_poll:
            ready = best is not None and best > self.previous_lac
        else:
            md = self.metadata
            ready = len(self._answers) >= ensemble_coverage(md.ensemble_size, md.ack_quorum)
        if not ready and answered < len(self._bookies):
            return []
        self.done = True
        if best is None:
            return [_no_answer(self.ledger_id, self._refused, self._errors)]
        lac = max(best, self.metadata.last_fragment_start - 1)
        return [ev.CompleteRead(ledger_id=self.ledger_id, lac=lac, last_entry_id=max(lac, self._last_entry))]


class TailReader:
    """TailReader long-polls a ledger for its LAC and its next entry at once (BookKeeper's readLastConfirmedAndEntry).

    A following reader that delivered every entry before `entry_id` asks the replicas of
    `entry_id` for it with previous_lac = entry_id - 1: a bookie holds the read until its LAC
    passes that, then answers with its LAC and the entry. Tailing so costs one request and one
    answer per entry, where a LacReader and then a RangeReader take E LAC requests, E answers,
    a read and its answer.

    The replica asked first is one that also stores the next entry, as it learns the LAC that
    confirms `entry_id` from that entry's piggyback (a healthy bookie before a slow one). The
    others are asked `spread_ms` later, or at once when an answer fails, so a stalled or
    replaced bookie costs `spread_ms`, not a long poll: a bookie that failed, or that was asked
    `spread_ms` before another replica answered with news and has not answered, is marked slow
    in the shared `slow` dict (asked last for SLOW_FOR_MS), as RangeReader does.

    The outcome is a LacReader's with long poll: CompleteRead(lac, last_entry_id) at the first
    answer whose LAC passes previous_lac, preceded by DeliverEntries of the entry when that
    answer brought it with a verified digest and its LAC is that entry (otherwise the caller
    reads up to the LAC as usual: an answer confirming entries past it, as after a follower's
    linger, leaves the entry to that range read, so they come to the caller together rather
    than the first alone); with the highest LAC seen once every replica asked answered without one; FailRead
    if none answered. The LAC is never below (first entry of the last fragment) - 1, and an
    answer from a disk other than the one the fragment records counts as a failure.
    """

    #: The rule the simulator's broken-rule test flips: an entry is delivered only when the answer's
    #: LAC confirms it. A bookie returns an entry it holds whether or not it is confirmed (a poll
    #: that timed out, a writer that crashed mid-add); a reader trusting that could deliver a record
    #: that recovery then drops.
    DELIVER_ONLY_CONFIRMED = True

    def __init__(self, metadata: LedgerMetadata, entry_id: int, digest: Digest, *, timeout_ms: int,
                 spread_ms: int, now_ms: int = 0, slow: dict[str, int] | None = None) -> None:
        self.metadata = metadata
        self.ledger_id = metadata.ledger_id
        self.entry_id = entry_id
        self.previous_lac = entry_id - 1
        self.timeout_ms = timeout_ms
        self.done = False
        self._verify_many = digest.verify_many
        self._now = now_ms
        self._slow = {} if slow is None else slow
        ensemble, quorum = metadata.current_ensemble, metadata.write_quorum
        replicas = write_set_bookies(entry_id, ensemble, quorum)
        following = set(write_set_bookies(entry_id + 1, ensemble, quorum))
        # stable sorts: a healthy bookie first, and among those one that stores the next entry too
        self._replicas = sorted(sorted(replicas, key=lambda b: b not in following), key=self._is_slow)
        self._asked = 0
        self._asked_at: dict[str, int] = {}
        self._spread_ms = spread_ms
        self._spread_at = now_ms + spread_ms
        self._answers: dict[str, int] = {}
        self._errors: dict[str, str] = {}
        self._refused: dict[str, str] = {}

    def start(self) -> list:
        """start asks the first replica."""
        return self._ask(1)

    def step(self, event) -> list:
        """step takes EntriesRead, ReadFailed and Ticked; other events are ignored."""
        if self.done:
            return []
        kind = type(event)
        if kind is ev.Ticked:
            self._now = event.now_ms
            return self._ask(len(self._replicas)) if self._now >= self._spread_at else []
        if kind not in (ev.EntriesRead, ev.ReadFailed) or event.bookie not in self._replicas[:self._asked]:
            return []
        md, bookie, read = self.metadata, event.bookie, kind is ev.EntriesRead
        if (read or event.status == Status.NO_SUCH_LEDGER) and not (
                md.answer_counts(md.last_fragment_start, bookie, event.disk)
                and (read or md.holds_nothing_counts(event.disk))):
            # A replaced disk knows nothing of what its predecessor acknowledged (as in LacReader).
            return self._failed(bookie, f"answered from disk {event.disk:x}, not the one the fragment records")
        if kind is ev.ReadFailed:
            if event.status == Status.NO_SUCH_LEDGER:
                return self._answered(bookie, -1, None)        # holds nothing of it yet, at its timeout
            if event.status == Status.UNAUTHORIZED:
                self._refused[bookie] = event.message
            return self._failed(bookie, f"{event.status.name} {event.message}".strip())
        entry, lac = None, event.lac
        if lac >= self.entry_id or not self.DELIVER_ONLY_CONFIRMED:
            for found, verified in zip(event.entries, self._verify_many(event.entries)):
                if found.entry_id == self.entry_id and found.ledger_id == self.ledger_id and verified:
                    entry = found
                    lac = max(lac, self.entry_id)
        return self._answered(bookie, lac, entry)

    def _ask(self, upto: int) -> list:
        upto = min(upto, len(self._replicas))
        asks = self._replicas[self._asked:upto]
        self._asked = max(self._asked, upto)
        for bookie in asks:
            self._asked_at[bookie] = self._now
        self._spread_at = 1 << 62 if self._asked >= len(self._replicas) else self._spread_at
        return [ev.SendRead(bookie=b, ledger_id=self.ledger_id, entry_ids=[self.entry_id],
                            previous_lac=self.previous_lac, timeout_ms=self.timeout_ms) for b in asks]

    def _is_slow(self, bookie: str) -> bool:
        return self._slow.get(bookie, 0) > self._now

    def _failed(self, bookie: str, why: str) -> list:
        self._errors[bookie] = why
        self._slow[bookie] = self._now + SLOW_FOR_MS
        return self._ask(self._asked + 1) + self._settle()

    def _answered(self, bookie: str, lac: int, entry: Entry | None) -> list:
        self._answers[bookie] = lac
        if lac > self.previous_lac:
            # A replica asked first that has not answered while this one had news is behind or stopped
            # (a SIGSTOP, a partition): ask it last for a while, so the next entries do not wait spread_ms.
            late = [b for b in self._replicas[:self._asked] if b != bookie and b not in self._answers
                    and b not in self._errors and self._asked_at.get(b, self._now) + self._spread_ms <= self._now]
            for slow in late:
                self._slow[slow] = self._now + SLOW_FOR_MS
            return self._complete(lac, entry)
        return self._settle()

    def _settle(self) -> list:
        """_settle ends the read once every replica asked answered, and none is left to ask."""
        if len(self._answers) + len(self._errors) < self._asked:
            return []
        if not self._answers:
            if self._asked < len(self._replicas):
                return []
            self.done = True
            return [_no_answer(self.ledger_id, self._refused, self._errors)]
        return self._complete(max(self._answers.values()), None)

    def _complete(self, lac: int, entry: Entry | None) -> list:
        self.done = True
        lac = max(lac, self.metadata.last_fragment_start - 1)        # the highest LAC any replica answered
        alone = entry is not None and lac == self.entry_id               # nothing past it: no range read follows
        out: list = [ev.DeliverEntries(ledger_id=self.ledger_id, entries=[entry])] if alone else []
        return out + [ev.CompleteRead(ledger_id=self.ledger_id, lac=lac, last_entry_id=lac)]
