"""walkit.adapters.topics.partition is a partition's replicated state: offsets, positions, producers.

A partition is a walkit.replicate machine: its log's entries each hold one or more records
(walkit.replication.batch: the records a leader submitted together). A record is either a
Kafka record batch whose base offset the leader assigned (batches.py), or a control record
(first byte 0xFF, which no stored batch has: its base offset is never negative):

    retain := 0xFF {"retain": "LEDGER:ENTRY"}        (JSON) retention: forget the batches before
    delete := 0xFF {"delete_before": OFFSET}         DeleteRecords: the log start offset moves there
    epoch  := 0xFF {"epoch": EPOCH}                  a leadership begins at the next offset (epochs.py)
    swap   := 0xFF 0x00 ...                          compaction: batches replace a range (compaction.py)

`PartitionState.apply(record, position)` is fed every record in log order, on every broker,
and keeps:

- the offset index: per batch its base offset, next offset, where it is (the entry's walkit
  Position and the record's index in the entry), size and the running maximum of record
  timestamps, in parallel lists searched by bisection, so Fetch and ListOffsets find any
  offset or time without reading the log;
- the idempotent producers' sequence state (producers.py);
- transactions (transactions.py): the first offset of each producer's open transaction (the
  last stable offset is the earliest of them), the aborted transactions (producer id, first
  offset, marker offset) that `read_committed` consumers are told to drop, and per producer
  the number and offset of its last marker (the coordinator waits for it; a marker of no higher
  number changes nothing). The last stable offset is never below the log start. A transactional
  batch opens its producer's transaction; a marker (a control batch) closes it. Retention
  forgets aborted transactions, markers and producers whose last batch lies before the log
  start. Snapshots from before transactions lack these fields and restore as none;
- the log start offset (the first offset still readable: the first batch's, or the offset a
  DeleteRecords asked for, which may fall inside a batch, as in Kafka) and the next offset
  (the high watermark: every applied batch is acknowledged by the ack quorum);
- the leader epochs: where each leadership's batches begin (epochs.py).

It is deterministic, so every broker that applies the same log holds the same state.
`truncate_before` is what a retain record does; `keep_from` is the earliest position the
partition still reads from its log. `PartitionMachine` is the walkit.StateMachine a broker's
node runs: the state, a cache of the recent batches for Fetch, and the lock between the node's
apply thread and the broker's event loop.
"""

from __future__ import annotations

import bisect
import json
import logging
import threading

import walkit
from walkit import Position
from walkit.adapters.topics import compaction
from walkit.adapters.topics.batches import TRANSACTIONAL, BatchInfo, info
from walkit.adapters.topics.epochs import LeaderEpochs
from walkit.adapters.topics.producers import ProducerTable
from walkit.adapters.topics.transactions import marker_of

log = logging.getLogger("walkit.adapters.topics")

SNAPSHOT_FORMAT = 2
CONTROL = b"\xff"
#: The cache of a partition this broker follows (it serves no Fetch; a new leader's cache fills up).
FOLLOWER_CACHE_BYTES = 1 << 20


def retain_record(before: Position) -> bytes:
    """retain_record is the control record that makes every replica forget the batches before `before`."""
    return CONTROL + json.dumps({"retain": str(before)}).encode()


def delete_record(offset: int) -> bytes:
    """delete_record is the control record that moves the log start offset to `offset` (DeleteRecords)."""
    return CONTROL + json.dumps({"delete_before": offset}).encode()


def epoch_record(epoch: int) -> bytes:
    """epoch_record is the control record a new leader appends first: its leadership's epoch begins here."""
    return CONTROL + json.dumps({"epoch": epoch}).encode()


def is_control(record: bytes) -> bool:
    """is_control tells a control record from a stored record batch."""
    return record[:1] == CONTROL


class PartitionState:
    """PartitionState is one partition's offset index and producer state (see the module doc)."""

    def __init__(self) -> None:
        self.bases: list[int] = []
        self.nexts: list[int] = []
        self.positions: list[Position] = []
        self.subs: list[int] = []            # the batch's index among its entry's records
        self.sizes: list[int] = []
        self.max_times: list[int] = []       # running maximum: non-decreasing, for bisection
        self.producers = ProducerTable()
        self.ongoing: dict[int, int] = {}                    # producer id -> first offset of its open transaction
        self.aborted: list[tuple[int, int, int]] = []        # (producer id, first offset, marker offset), in order
        self.markers: dict[int, tuple[int, int]] = {}        # producer id -> (transaction number, marker offset)
        self.epochs = LeaderEpochs()
        self.log_start_offset = 0
        self.next_offset = 0
        self.applied: Position | None = None
        self.retained_from: Position | None = None
        self._sub = 0

    # -- the state machine ----------------------------------------------------------------
    def apply(self, record: bytes, position: Position) -> BatchInfo | None:
        """apply adds the batch stored at `position`; it returns its header (None if skipped).

        Records of entries before the last applied one, control records, and batches whose
        offsets are already covered return None.
        """
        if self.applied is not None and position < self.applied:
            return None
        self._sub = self._sub + 1 if position == self.applied else 0
        self.applied = position
        if compaction.is_swap(record):
            compaction.apply_swap(self, record, position, self._sub)
            return None
        if is_control(record):
            doc = json.loads(record[1:])
            if "epoch" in doc:
                self.epochs.begin(doc["epoch"], self.next_offset)
            elif "delete_before" in doc:
                self.delete_before(doc["delete_before"], position)
            else:
                self.truncate_before(Position.parse(doc["retain"]))
            return None
        head = info(record)
        if head.base_offset < self.next_offset:
            log.warning("entry %s holds offset %d, below the next offset %d; skipped", position,
                        head.base_offset, self.next_offset)
            return None
        if not self.bases:
            self.log_start_offset = head.base_offset
        self.bases.append(head.base_offset)
        self.nexts.append(head.next_offset)
        self.positions.append(position)
        self.subs.append(self._sub)
        self.sizes.append(head.size)
        previous = self.max_times[-1] if self.max_times else -1
        self.max_times.append(max(previous, head.max_timestamp))
        self.next_offset = head.next_offset
        self._transaction(record, head)
        return head

    def _transaction(self, record: bytes, head: BatchInfo) -> None:
        """_transaction keeps the producer and transaction state of an applied batch (see the module doc)."""
        marker = marker_of(record)
        if marker is None:
            self.producers.record(head)
            if head.attributes & TRANSACTIONAL and head.producer_id not in self.ongoing:
                self.ongoing[head.producer_id] = head.base_offset
            return
        committed, number = marker
        last = self.markers.get(head.producer_id)
        if number >= 0 and last is not None and number <= last[0]:
            return                  # a transaction's marker written again: the producer's next one may be open
        first = self.ongoing.pop(head.producer_id, None)
        if first is not None and not committed:
            self.aborted.append((head.producer_id, first, head.base_offset))
        self.markers[head.producer_id] = (number, head.base_offset)
        self.producers.record_marker(head.producer_id, head.producer_epoch)

    def snapshot(self, out) -> None:
        """snapshot writes the whole state to the binary file-like `out` (JSON)."""
        doc = {"format": SNAPSHOT_FORMAT, "bases": self.bases, "nexts": self.nexts,
               "positions": [[p.ledger_id, p.entry_id] for p in self.positions], "subs": self.subs,
               "sizes": self.sizes, "max_times": self.max_times, "producers": self.producers.to_json(),
               "ongoing": {str(pid): first for pid, first in self.ongoing.items()},
               "aborted": [list(a) for a in self.aborted],
               "markers": {str(pid): list(marker) for pid, marker in self.markers.items()},
               "log_start_offset": self.log_start_offset, "next_offset": self.next_offset,
               "epochs": self.epochs.to_json(), "applied": list(self.applied) if self.applied is not None else None,
               "retained_from": list(self.retained_from) if self.retained_from is not None else None}
        out.write(json.dumps(doc, separators=(",", ":")).encode())

    def restore(self, src) -> None:
        """restore replaces the state with one written by `snapshot`."""
        doc = json.loads(src.read())
        if doc.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(f"unknown partition snapshot format {doc.get('format')!r}")
        self.bases, self.nexts, self.sizes, self.max_times = doc["bases"], doc["nexts"], doc["sizes"], doc["max_times"]
        self.positions = [Position(*p) for p in doc["positions"]]
        self.subs = doc["subs"]
        self.producers = ProducerTable.from_json(doc["producers"])
        self.ongoing = {int(pid): first for pid, first in doc.get("ongoing", {}).items()}   # (absent before
        self.aborted = [tuple(a) for a in doc.get("aborted", [])]                           # transactions)
        self.markers = {int(pid): tuple(marker) for pid, marker in doc.get("markers", {}).items()}
        self.log_start_offset, self.next_offset = doc["log_start_offset"], doc["next_offset"]
        self.epochs = LeaderEpochs.from_json(doc.get("epochs"))       # absent before leader epochs: none known
        self.applied = Position(*doc["applied"]) if doc["applied"] is not None else None
        self.retained_from = Position(*doc["retained_from"]) if doc["retained_from"] is not None else None
        self._sub = 0

    def copy(self) -> "PartitionState":
        """copy is an independent copy (taken between two entries, serialised elsewhere by a snapshot)."""
        other = PartitionState()
        other.bases, other.nexts, other.positions = list(self.bases), list(self.nexts), list(self.positions)
        other.subs, other.sizes, other.max_times = list(self.subs), list(self.sizes), list(self.max_times)
        other.producers = self.producers.copy()
        other.ongoing, other.aborted, other.markers = dict(self.ongoing), list(self.aborted), dict(self.markers)
        other.epochs = self.epochs.copy()
        other.log_start_offset, other.next_offset, other.applied = self.log_start_offset, self.next_offset, self.applied
        other.retained_from, other._sub = self.retained_from, self._sub
        return other

    # -- queries ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.bases)

    @property
    def last_stable_offset(self) -> int:
        """last_stable_offset is the first offset of the oldest open transaction, else the next offset; never
        below the log start offset (DeleteRecords or retention may remove an open transaction's first batches,
        as Kafka's UnifiedLog bounds its first unstable offset)."""
        return max(min(self.ongoing.values(), default=self.next_offset), self.log_start_offset)

    def aborted_between(self, first: int, last: int) -> list[tuple[int, int]]:
        """aborted_between lists (producer id, first offset) of aborted transactions with records in [first, last]."""
        start = bisect.bisect_left(self.aborted, first, key=lambda a: a[2])
        return [(pid, begin) for pid, begin, _ in self.aborted[start:] if begin <= last]

    def where(self, index: int) -> tuple[Position, int]:
        """where is the log entry and the index in it of batch `index`."""
        return self.positions[index], self.subs[index]

    def locate(self, offset: int) -> int | None:
        """locate returns the index of the batch holding `offset`, or of the next batch if compaction removed
        it (len(self) past the last batch); None if outside the log."""
        if offset < self.log_start_offset or offset >= self.next_offset:
            return None
        index = bisect.bisect_right(self.bases, offset) - 1
        return index if index >= 0 and offset < self.nexts[index] else index + 1

    def locate_time(self, timestamp: int) -> int | None:
        """locate_time returns the index of the first batch holding a record stamped >= timestamp."""
        index = bisect.bisect_left(self.max_times, timestamp)
        return index if index < len(self.bases) else None

    def max_timestamp_index(self) -> int | None:
        """max_timestamp_index is the index of the first batch holding the largest timestamp."""
        if not self.max_times:
            return None
        return bisect.bisect_left(self.max_times, self.max_times[-1])

    def ledgers(self) -> list[tuple[int, int, int, int]]:
        """ledgers summarises the index per ledger: (ledger id, first index, bytes, max timestamp)."""
        out: list[list[int]] = []
        for i, position in enumerate(self.positions):
            if out and out[-1][0] == position.ledger_id:
                out[-1][2] += self.sizes[i]
                out[-1][3] = self.max_times[i]
            else:
                out.append([position.ledger_id, i, self.sizes[i], self.max_times[i]])
        return [tuple(row) for row in out]

    def keep_from(self) -> Position | None:
        """keep_from is the earliest log position the partition still reads (None: none yet); after a
        compaction the index's positions are not in log order (compaction.py)."""
        return min(self.positions) if self.positions else self.retained_from

    def truncate_before(self, position: Position, count: int | None = None) -> int:
        """truncate_before forgets the leading batches stored before `position` (or the first `count`, which
        DeleteRecords knows by offset); it returns how many.

        After a compaction the positions are not in log order (compaction.py): it stops at the first
        batch stored at or after `position`."""
        if count is None:
            count = next((i for i, p in enumerate(self.positions) if p >= position), len(self.positions))
        if count:                          # a DeleteRecords may have moved the log start further
            self.log_start_offset = max(self.log_start_offset, self.nexts[count - 1])
            del self.bases[:count], self.nexts[:count], self.positions[:count], self.subs[:count]
            del self.sizes[:count], self.max_times[:count]
        self.epochs.trim(self.log_start_offset)
        start = self.log_start_offset
        self.aborted = [a for a in self.aborted if a[2] >= start]
        self.markers = {pid: marker for pid, marker in self.markers.items() if marker[1] >= start}
        self.producers.prune(start, self.ongoing)
        if self.retained_from is None or position > self.retained_from:
            self.retained_from = position
        return count

    def delete_before(self, offset: int, position: Position) -> int:
        """delete_before moves the log start offset to `offset` (at most the next offset; never back) and
        forgets the batches wholly before it; it returns how many. `position` is the delete record's own."""
        offset = min(offset, self.next_offset)
        if offset <= self.log_start_offset:
            return 0
        count = bisect.bisect_right(self.nexts, offset)
        kept = self.positions[count] if count < len(self.positions) else position
        self.log_start_offset = offset
        return self.truncate_before(kept, count)


class PartitionMachine(walkit.StateMachine):
    """PartitionMachine is the StateMachine of a partition: its PartitionState and a cache of recent batches.

    The apply thread writes, the event loop reads: both hold `lock`. `cache` holds the last
    len(cache) batches of the index, byte for byte, at least one and about `cache_bytes`: the
    `leader_cache_bytes` it was made with while the broker leads (`serving`), at most
    FOLLOWER_CACHE_BYTES otherwise. `on_applied()` is called (on the apply thread) after a batch
    was applied.
    """

    def __init__(self, label: str, cache_bytes: int, on_applied=None) -> None:
        self.label = label
        self.state = PartitionState()
        self.lock = threading.Lock()
        self.cache: list[bytes] = []
        self.leader_cache_bytes = cache_bytes
        self.cache_bytes = min(cache_bytes, FOLLOWER_CACHE_BYTES)
        self._cached = 0
        self.on_applied = on_applied

    def serving(self, leads: bool) -> None:
        """serving sizes the cache for a leader (`leads`) or a follower."""
        with self.lock:
            self.cache_bytes = self.leader_cache_bytes if leads else min(self.leader_cache_bytes, FOLLOWER_CACHE_BYTES)
            self._trim_cache()

    def apply(self, record: bytes, position: Position):
        """apply applies one record (partition.py) and keeps the batch in the cache; it returns its header."""
        with self.lock:
            head = self.state.apply(record, position)
            if head is not None:
                self.cache.append(record)
                self._cached += len(record)
            elif compaction.is_swap(record):
                self._uncache_swapped(record)
            self._trim_cache()
        if head is not None and self.on_applied is not None:
            self.on_applied()
        return head

    def snapshot(self, out):
        """snapshot copies the state now and writes the copy to `out` from the snapshot thread."""
        with self.lock:
            copy = self.state.copy()
        return lambda: copy.snapshot(out)

    def restore(self, src) -> None:
        """restore loads a snapshot (the cache starts empty)."""
        with self.lock:
            self.state.restore(src)
            self.cache, self._cached = [], 0
        log.info("%s: replaying the log after its snapshot at %s", self.label, self.state.applied)

    def keep_log_from(self) -> Position | None:
        """keep_log_from is where the partition's data begins in its log (walkit.replicate's option)."""
        with self.lock:
            return self.state.keep_from()

    def _uncache_swapped(self, record: bytes) -> None:
        """_uncache_swapped drops the cached batches a swap record may have replaced: the cache keeps
        only batches after its range, so it stays the tail of the index."""
        upto = compaction.parse_swap(record)[1]
        after = len(self.state) - bisect.bisect_left(self.state.bases, upto)
        drop = max(len(self.cache) - after, 0)
        if drop:
            self._cached -= sum(len(b) for b in self.cache[:drop])
            del self.cache[:drop]

    def _trim_cache(self) -> None:
        """_trim_cache drops the oldest cached batches beyond cache_bytes, and those retention removed."""
        cache = self.cache
        drop = max(len(cache) - len(self.state), 0)
        size = self._cached - sum(len(b) for b in cache[:drop])
        while drop < len(cache) - 1 and size > self.cache_bytes:
            size -= len(cache[drop])
            drop += 1
        if drop:
            del cache[:drop]
            self._cached = size
