"""walkit.adapters.topics.epochs is a partition's leader epochs: where each leadership's batches begin.

A partition's leader epoch is the epoch of its walkit.replicate leadership (walkit.election
draws it from a counter that only grows, so every new leader's is larger). A broker that
starts to lead a partition appends an epoch record (partition.py) before any batch of its
own, so every broker's replicated state holds, in log order, (epoch, start offset) per
leadership: Kafka's leader epoch cache (KIP-101, KIP-320). The leader stamps the epoch into
each batch it appends (the batch header's partitionLeaderEpoch, outside the CRC), so a
consumer knows the epoch of what it read.

`end_offset_for` answers OffsetForLeaderEpoch exactly as Kafka's LeaderEpochFileCache does:
for the latest epoch the log end offset; for an earlier one the start offset of the first
later epoch, with the largest epoch at or below the one asked for; (-1, -1) for an epoch
above every known one. A consumer that read up to offset o in epoch e compares o with that
end offset after a leader change; walkit never truncates acknowledged batches, so the end
offset is never below what it read.
"""

from __future__ import annotations

import bisect

UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


class LeaderEpochs:
    """LeaderEpochs is the (epoch, start offset) of each leadership that began in the log, oldest first."""

    def __init__(self, entries: list[tuple[int, int]] | None = None) -> None:
        self.entries: list[tuple[int, int]] = list(entries or [])

    def begin(self, epoch: int, start_offset: int) -> None:
        """begin records that leadership `epoch` appends from `start_offset` (an older or repeated epoch is ignored)."""
        if not self.entries or epoch > self.entries[-1][0]:
            self.entries.append((epoch, start_offset))

    @property
    def latest(self) -> int:
        """latest is the epoch of the last leadership that began in the log, UNDEFINED_EPOCH if none did."""
        return self.entries[-1][0] if self.entries else UNDEFINED_EPOCH

    def epoch_at(self, offset: int) -> int:
        """epoch_at is the epoch whose leadership appended `offset`, UNDEFINED_EPOCH if none known."""
        index = bisect.bisect_right([start for _, start in self.entries], offset) - 1
        return self.entries[index][0] if index >= 0 else UNDEFINED_EPOCH

    def end_offset_for(self, requested: int, log_end: int, current: tuple[int, int] | None = None) -> tuple[int, int]:
        """end_offset_for is (epoch, end offset) of leadership `requested` (see the module doc).

        `current` is the (epoch, start offset) of the leadership serving now, whose epoch record
        may not be applied yet.
        """
        entries = list(self.entries)
        if current is not None and (not entries or current[0] > entries[-1][0]):
            entries.append(current)
        if requested == UNDEFINED_EPOCH or not entries:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if requested == entries[-1][0]:
            return requested, log_end
        epochs = [epoch for epoch, _ in entries]
        higher = bisect.bisect_right(epochs, requested)
        if higher == len(entries):
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if higher == 0:
            return requested, entries[0][1]
        return entries[higher - 1][0], entries[higher][1]

    def trim(self, log_start: int) -> None:
        """trim forgets the leaderships wholly before `log_start`; the one holding it now starts there (as Kafka)."""
        starts = [start for _, start in self.entries]
        keep = bisect.bisect_right(starts, log_start) - 1
        if keep > 0:
            del self.entries[:keep]
        if self.entries and self.entries[0][1] < log_start:
            self.entries[0] = (self.entries[0][0], log_start)

    def to_json(self) -> list[list[int]]:
        """to_json is the entries as JSON lists (the partition's snapshot holds them)."""
        return [[epoch, start] for epoch, start in self.entries]

    @classmethod
    def from_json(cls, rows) -> "LeaderEpochs":
        """from_json reads what `to_json` wrote; None (a snapshot from before leader epochs) is no entries."""
        return cls([(int(epoch), int(start)) for epoch, start in rows or []])

    def copy(self) -> "LeaderEpochs":
        """copy is an independent copy."""
        return LeaderEpochs(self.entries)
