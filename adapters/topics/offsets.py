"""walkit.adapters.topics.offsets is the committed-offsets state of one group bucket (a walkit log).

Committed offsets are records in the bucket's log ``kafkagroups-<b>``, appended by the
bucket's coordinator and answered once acknowledged, so a commit survives the coordinator's
death and the next coordinator (the next election winner) finds it by replaying the log. A
log rather than metadata keys: consumers commit every few seconds per partition, and a log
append is one pipelined, quorum-acknowledged write fenced by the coordinator's leadership,
where a key per commit would load the metadata store (ZooKeeper, etcd) with CAS writes.

Records are JSON objects:

    {"commit": group, "offsets": [[topic, partition, offset, leader_epoch, metadata], ...], "ms": now}
    {"checkpoint": {group: [[topic, partition, offset, leader_epoch, metadata, ms], ...]}}

Every CHECKPOINT_EVERY commits the coordinator appends a checkpoint (the whole state) and
truncates the log before it, so the log stays short. `OffsetsState` has the StateMachine
shape: apply, snapshot, restore.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from walkit import Position

CHECKPOINT_EVERY = 10_000


@dataclass(frozen=True, slots=True)
class Committed:
    """Committed is one committed offset of a group for a partition."""

    offset: int
    leader_epoch: int
    metadata: str | None
    ms: int


class OffsetsState:
    """OffsetsState maps group -> {(topic, partition): Committed} (see the module doc)."""

    def __init__(self) -> None:
        self.groups: dict[str, dict[tuple[str, int], Committed]] = {}
        self.applied: Position | None = None
        self.checkpoint_position: Position | None = None
        self.commits_since_checkpoint = 0

    def apply(self, record: bytes, position: Position):
        """apply applies one record of the bucket's log; it returns the group it changed (or None)."""
        if self.applied is not None and position <= self.applied:
            return None
        self.applied = position
        doc = json.loads(record)
        if "checkpoint" in doc:
            self.checkpoint_position = position
            self.groups = {group: {(t, p): Committed(o, e, m, ms) for t, p, o, e, m, ms in rows}
                           for group, rows in doc["checkpoint"].items()}
            self.commits_since_checkpoint = 0
            return None
        group = doc["commit"]
        committed = self.groups.setdefault(group, {})
        for topic, partition, offset, epoch, metadata in doc["offsets"]:
            committed[(topic, partition)] = Committed(offset, epoch, metadata, doc.get("ms", 0))
        self.commits_since_checkpoint += 1
        return group

    def checkpoint_record(self) -> bytes:
        """checkpoint_record is a record that holds the whole state."""
        return json.dumps({"checkpoint": {
            group: [[t, p, c.offset, c.leader_epoch, c.metadata, c.ms] for (t, p), c in sorted(offsets.items())]
            for group, offsets in self.groups.items()}}, separators=(",", ":")).encode()

    def snapshot(self, out) -> None:
        """snapshot writes the state to the binary file-like `out`."""
        out.write(self.checkpoint_record())

    def restore(self, src) -> None:
        """restore replaces the state with one written by `snapshot`."""
        self.groups = {}
        self.applied = None
        self.apply(src.read(), Position(-1, -1))
        self.applied = None

    def offsets(self, group: str) -> dict[tuple[str, int], Committed]:
        """offsets are the committed offsets of `group` (empty if it has none)."""
        return self.groups.get(group, {})


def commit_record(group: str, offsets: list[tuple[str, int, int, int, str | None]], ms: int) -> bytes:
    """commit_record is the log record of one OffsetCommit request's offsets."""
    return json.dumps({"commit": group, "offsets": [list(o) for o in offsets], "ms": ms},
                      separators=(",", ":")).encode()
