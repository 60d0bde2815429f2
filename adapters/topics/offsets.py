"""walkit.adapters.topics.offsets is the committed-offsets state of one group bucket (a replicated machine).

Committed offsets are records of the bucket's walkit.replicate machine ``kafkagroups-<b>``,
submitted by the bucket's coordinator (its leader) and answered once acknowledged and
applied, so a commit survives the coordinator's death and the next coordinator, a broker
that applied the same log all along, has it. A log rather than metadata keys: consumers
commit every few seconds per partition, and a log append is one pipelined, quorum-acknowledged
write fenced by the coordinator's leadership, where a key per commit would load the metadata
store (ZooKeeper, etcd) with CAS writes. walkit.replicate snapshots the state every
SNAPSHOT_EVERY commits and truncates the log behind it, so the log stays short.

Records are JSON objects:

    {"commit": group, "offsets": [[topic, partition, offset, leader_epoch, metadata], ...], "ms": now}
    {"checkpoint": {group: [[topic, partition, offset, leader_epoch, metadata, ms], ...]}}

A checkpoint holds the whole state and replaces it; it is what `snapshot` writes. The apply
thread writes the state while the broker's event loop reads it, so both go through `lock`.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass

import walkit
from walkit import Position

#: Commits between two snapshots of a bucket.
SNAPSHOT_EVERY = 10_000


@dataclass(frozen=True, slots=True)
class Committed:
    """Committed is one committed offset of a group for a partition."""

    offset: int
    leader_epoch: int
    metadata: str | None
    ms: int


class OffsetsState(walkit.StateMachine):
    """OffsetsState maps group -> {(topic, partition): Committed} (see the module doc)."""

    def __init__(self) -> None:
        self.groups: dict[str, dict[tuple[str, int], Committed]] = {}
        self.lock = threading.Lock()

    def apply(self, record: bytes, position: Position):
        """apply applies one record of the bucket's log; it returns the group it changed (or None)."""
        doc = json.loads(record)
        with self.lock:
            if "checkpoint" in doc:
                self.groups = {group: {(t, p): Committed(o, e, m, ms) for t, p, o, e, m, ms in rows}
                               for group, rows in doc["checkpoint"].items()}
                return None
            group = doc["commit"]
            committed = dict(self.groups.get(group, {}))
            for topic, partition, offset, epoch, metadata in doc["offsets"]:
                committed[(topic, partition)] = Committed(offset, epoch, metadata, doc.get("ms", 0))
            self.groups[group] = committed              # replaced, never changed: readers hold a stable dict
        return group

    def checkpoint_record(self) -> bytes:
        """checkpoint_record is a record that holds the whole state."""
        with self.lock:
            groups = dict(self.groups)
        return json.dumps({"checkpoint": {
            group: [[t, p, c.offset, c.leader_epoch, c.metadata, c.ms] for (t, p), c in sorted(offsets.items())]
            for group, offsets in groups.items()}}, separators=(",", ":")).encode()

    def snapshot(self, out) -> None:
        """snapshot writes the state to the binary file-like `out` (a checkpoint record)."""
        out.write(self.checkpoint_record())

    def restore(self, src) -> None:
        """restore replaces the state with one written by `snapshot`."""
        self.apply(src.read(), Position(-1, -1))

    def offsets(self, group: str) -> dict[tuple[str, int], Committed]:
        """offsets are the committed offsets of `group` (empty if it has none); the dict is not changed later."""
        with self.lock:
            return self.groups.get(group, {})

    def group_ids(self) -> list[str]:
        """group_ids lists the groups with committed offsets."""
        with self.lock:
            return list(self.groups)


def commit_record(group: str, offsets: list[tuple[str, int, int, int, str | None]], ms: int) -> bytes:
    """commit_record is the log record of one OffsetCommit request's offsets."""
    return json.dumps({"commit": group, "offsets": [list(o) for o in offsets], "ms": ms},
                      separators=(",", ":")).encode()
