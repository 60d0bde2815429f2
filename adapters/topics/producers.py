"""walkit.adapters.topics.producers keeps idempotent producers' sequence state for one partition.

Kafka's rules (KIP-98): a producer id with an epoch numbers its batches per partition from
sequence 0. A batch is appended when its first sequence follows the producer's last one; a
batch the partition already holds (a retry) is answered with the offsets it got the first
time, and nothing is appended; a gap is OUT_OF_ORDER_SEQUENCE_NUMBER; an older epoch is
INVALID_PRODUCER_EPOCH. The last RECENT batches of each producer are remembered for
duplicates, as Kafka does (a producer has at most 5 requests in flight).

The table is part of the partition's replicated state (partition.py rebuilds it from the
log), so a new leader after a failover recognises retries of batches its predecessor wrote.
A retry is known by its producer id, epoch and sequences alone: a client that sends a message
again under a new epoch of its own (librdkafka's epoch bump renumbers what it holds from
sequence 0, docs/guides/topics.md#idempotent-producers) sends a new batch, stored again, as
Kafka stores it.
A transaction marker with a higher epoch (a transactional id given to a new producer, or a
transaction aborted on timeout) moves the producer to that epoch, fencing the older one.
Retention prunes the producers whose batches it removed (`prune`), so the table does not
grow with every producer a partition ever saw; a retry of such a producer's batch is taken
as new, as in Kafka.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from walkit.adapters.topics import errors
from walkit.adapters.topics.batches import BatchInfo

RECENT = 5
SEQUENCE_WRAP = 1 << 31


@dataclass
class ProducerEntry:
    """ProducerEntry is one producer id's state: its epoch and its recent batches."""

    epoch: int
    last_sequence: int = -1
    #: (first sequence, last sequence, base offset) of the last RECENT batches, oldest first.
    recent: collections.deque = field(default_factory=lambda: collections.deque(maxlen=RECENT))
    last_timestamp: int = -1


APPEND = "append"
DUPLICATE = "duplicate"


class ProducerTable:
    """ProducerTable maps producer ids to ProducerEntry; `check` judges a batch, `record` remembers it."""

    def __init__(self) -> None:
        self.entries: dict[int, ProducerEntry] = {}

    def check(self, batch: BatchInfo) -> tuple[str, int | None]:
        """check returns (APPEND, None), (DUPLICATE, base offset of the original) or raises KafkaError."""
        if not batch.idempotent:
            return APPEND, None
        entry = self.entries.get(batch.producer_id)
        if entry is None:
            return APPEND, None          # new producer, or its batches were all removed by retention
        if batch.producer_epoch < entry.epoch:
            raise errors.KafkaError(errors.INVALID_PRODUCER_EPOCH,
                                    f"producer {batch.producer_id} epoch {batch.producer_epoch} < {entry.epoch}")
        if batch.producer_epoch > entry.epoch:
            if batch.base_sequence != 0:
                raise errors.KafkaError(errors.OUT_OF_ORDER_SEQUENCE_NUMBER,
                                        f"a new epoch of producer {batch.producer_id} starts at sequence "
                                        f"{batch.base_sequence}, not 0")
            return APPEND, None
        for first, last, base in entry.recent:
            if first == batch.base_sequence and last == batch.last_sequence:
                return DUPLICATE, base
        if batch.base_sequence == (entry.last_sequence + 1) % SEQUENCE_WRAP:
            return APPEND, None
        raise errors.KafkaError(errors.OUT_OF_ORDER_SEQUENCE_NUMBER,
                                f"producer {batch.producer_id} sent sequence {batch.base_sequence} after "
                                f"{entry.last_sequence}")

    def record(self, batch: BatchInfo) -> None:
        """record remembers an appended batch (with its assigned base offset)."""
        if not batch.idempotent:
            return
        entry = self.entries.get(batch.producer_id)
        if entry is None or batch.producer_epoch != entry.epoch:
            entry = self.entries[batch.producer_id] = ProducerEntry(batch.producer_epoch)
        entry.last_sequence = batch.last_sequence
        entry.recent.append((batch.base_sequence, batch.last_sequence, batch.base_offset))
        entry.last_timestamp = batch.max_timestamp

    def record_marker(self, producer_id: int, epoch: int) -> None:
        """record_marker takes in a transaction marker: an epoch above the producer's starts it afresh
        (sequence 0 next), which fences the producer's older epoch (KIP-98)."""
        entry = self.entries.get(producer_id)
        if entry is None or epoch > entry.epoch:
            self.entries[producer_id] = ProducerEntry(epoch)

    def prune(self, log_start_offset: int, keep) -> int:
        """prune forgets the producers whose last batch retention removed (all before `log_start_offset`),
        except those in `keep` (an open transaction's); it returns how many, as Kafka's log cleaner does."""
        gone = [pid for pid, entry in self.entries.items()
                if entry.recent and entry.recent[-1][2] < log_start_offset and pid not in keep]
        for pid in gone:
            del self.entries[pid]
        return len(gone)

    def copy(self) -> "ProducerTable":
        """copy is an independent copy (a leader checks new batches against it before they are acked)."""
        other = ProducerTable()
        for pid, entry in self.entries.items():
            other.entries[pid] = ProducerEntry(entry.epoch, entry.last_sequence,
                                               collections.deque(entry.recent, maxlen=RECENT), entry.last_timestamp)
        return other

    def to_json(self) -> dict:
        """to_json is the table as JSON-able data (for snapshots)."""
        return {str(pid): [e.epoch, e.last_sequence, list(e.recent), e.last_timestamp]
                for pid, e in self.entries.items()}

    @classmethod
    def from_json(cls, data: dict) -> "ProducerTable":
        """from_json rebuilds a table written by `to_json`."""
        table = cls()
        for pid, (epoch, last, recent, stamp) in data.items():
            table.entries[int(pid)] = ProducerEntry(epoch, last, collections.deque(
                (tuple(r) for r in recent), maxlen=RECENT), stamp)
        return table
