"""walkit.adapters.topics.offsets is the state of one group bucket (a replicated machine): offsets and memberships.

Committed offsets are records of the bucket's walkit.replicate machine ``kafkagroups-<b>``,
submitted by the bucket's coordinator (its leader) and answered once acknowledged and
applied, so a commit survives the coordinator's death and the next coordinator, a broker
that applied the same log all along, has it. A log rather than metadata keys: consumers
commit every few seconds per partition, and a log append is one pipelined, quorum-acknowledged
write fenced by the coordinator's leadership, where a key per commit would load the metadata
store (ZooKeeper, etcd) with CAS writes. walkit.replicate snapshots the state every
SNAPSHOT_EVERY commits and truncates the log behind it, so the log stays short.

The bucket also holds each group's membership as of its last completed rebalance (Kafka's
group metadata record): generation, protocol, leader, and every member with its session
timeout, subscriptions and assignment. The coordinator writes it before it answers the
SyncGroups of a generation, and writes it empty when the group empties; a broker that takes
the bucket over loads it (coordinator.load), so members go on with their generation and
assignment instead of joining again.

Records are JSON objects:

    {"commit": group, "offsets": [[topic, partition, offset, leader_epoch, metadata], ...], "ms": now}
    {"commit": group, "offsets": [], "group": membership or null, "ms": now}   (null: the group emptied)
    {"commit": group, "offsets": [], "forget": [[topic, partition], ...] or null, "before": ms or null}
    {"checkpoint": {group: [[topic, partition, offset, leader_epoch, metadata, ms], ...]},
     "groups": {group: membership}, "transactions", "pending", "marked"}

The bucket also coordinates the transactional ids that hash to it and keeps the offsets of
open transactions until their markers: those records and the checkpoint's last three fields
are transactions.py's (TxnBook).

    membership := {"generation", "protocol_type", "protocol", "leader", "members": [[id,
                   instance_id, client_id, client_host, session_timeout_ms, rebalance_timeout_ms,
                   [[protocol, metadata (base64)], ...], assignment (base64)], ...]}

A membership record is a commit of no offsets, so a broker from before memberships (which
reads only "commit" and "offsets") applies it as nothing; a checkpoint or record without
memberships (written by such a broker) holds none. A checkpoint holds the whole state and
replaces it; it is what `snapshot` writes. The apply thread writes the state while the
broker's event loop reads it, so both go through `lock`.

A forget record removes committed offsets: those of the listed partitions (OffsetDelete), or
all of the group's (null: DeleteGroups, which also drops its stored membership). With
"before" it is expiry (`offsets.retention.minutes`): it removes only offsets committed before
that time, and only if the group has no stored membership and emptied before that time too
(the checkpoint's "emptied": {group: ms} keeps when each group's membership was last stored
empty), as Kafka expires the offsets of a group once it has been empty for the retention
period (KIP-211); offsets committed outside group management expire by their commit time. The
times are the records' own, written by the coordinator, so every broker forgets exactly the
same offsets. A broker from before forget records applies one as a commit of no offsets, that
is, as nothing.
"""

from __future__ import annotations

import base64
import json
import threading
from dataclasses import dataclass

import walkit
from walkit import Position
from walkit.adapters.topics.transactions import TxnBook

#: Commits between two snapshots of a bucket.
SNAPSHOT_EVERY = 10_000


@dataclass(frozen=True, slots=True)
class Committed:
    """Committed is one committed offset of a group for a partition."""

    offset: int
    leader_epoch: int
    metadata: str | None
    ms: int


@dataclass
class MemberInfo:
    """MemberInfo is what a group's membership stores of a member (the coordinator's Member adds its requests)."""

    id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class Membership:
    """Membership is a group as of its last completed rebalance (see the module doc)."""

    generation: int
    protocol_type: str | None
    protocol: str | None
    leader: str | None
    members: tuple[MemberInfo, ...]

    def to_json(self) -> dict:
        """to_json is the membership as the JSON object the records and checkpoints hold."""
        return {"generation": self.generation, "protocol_type": self.protocol_type, "protocol": self.protocol,
                "leader": self.leader, "members": [
                    [m.id, m.instance_id, m.client_id, m.client_host, m.session_timeout_ms, m.rebalance_timeout_ms,
                     [[name, _b64(data)] for name, data in m.protocols], _b64(m.assignment)] for m in self.members]}

    @classmethod
    def from_json(cls, doc: dict) -> "Membership":
        """from_json decodes what `to_json` wrote."""
        members = tuple(MemberInfo(i, instance, client, host, session, rebalance,
                                   [(name, base64.b64decode(data)) for name, data in protocols],
                                   base64.b64decode(assignment))
                        for i, instance, client, host, session, rebalance, protocols, assignment in doc["members"])
        return cls(doc["generation"], doc["protocol_type"], doc["protocol"], doc["leader"], members)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class OffsetsState(walkit.StateMachine):
    """OffsetsState maps group -> {(topic, partition): Committed}, and group -> Membership (see the module doc)."""

    def __init__(self) -> None:
        self.groups: dict[str, dict[tuple[str, int], Committed]] = {}
        self.memberships: dict[str, Membership] = {}
        self.emptied: dict[str, int] = {}           # group -> when its membership was last stored empty (ms)
        self.txns = TxnBook()                       # the transactions of this bucket (transactions.py)
        self.on_transaction = None                  # called (apply thread) after a transaction's record
        self.lock = threading.Lock()

    def apply(self, record: bytes, position: Position):
        """apply applies one record of the bucket's log; it returns the group it changed (or None)."""
        doc = json.loads(record)
        with self.lock:
            if "checkpoint" in doc:
                self.groups = {group: {(t, p): Committed(o, e, m, ms) for t, p, o, e, m, ms in rows}
                               for group, rows in doc["checkpoint"].items()}
                self.memberships = {group: Membership.from_json(kept)
                                    for group, kept in doc.get("groups", {}).items()}
                self.emptied = dict(doc.get("emptied", {}))
                self.txns = TxnBook.from_json(doc)
                return None
            if TxnBook.handles(doc):
                for group, rows in self.txns.apply(doc).items():        # a commit marker's offsets
                    committed = dict(self.groups.get(group, {}))
                    for topic, partition, offset, epoch, metadata, ms in rows:
                        committed[(topic, partition)] = Committed(offset, epoch, metadata, ms)
                    self.groups[group] = committed
                if self.on_transaction is not None:
                    self.on_transaction()                                # (it only wakes the event loop)
                return None
            group = doc["commit"]
            if "group" in doc:
                memberships = dict(self.memberships)         # replaced, never changed, as the offsets
                if doc["group"] is None:
                    memberships.pop(group, None)
                    self.emptied[group] = doc.get("ms", 0)
                else:
                    memberships[group] = Membership.from_json(doc["group"])
                self.memberships = memberships
                return group
            if "forget" in doc:
                self._forget(group, doc["forget"], doc.get("before"))
                return group
            committed = dict(self.groups.get(group, {}))
            for topic, partition, offset, epoch, metadata in doc["offsets"]:
                committed[(topic, partition)] = Committed(offset, epoch, metadata, doc.get("ms", 0))
            self.groups[group] = committed              # replaced, never changed: readers hold a stable dict
            self.txns.superseded(group, {(topic, partition) for topic, partition, *_ in doc["offsets"]})
        return group

    def _forget(self, group: str, partitions, before: int | None) -> None:
        """_forget applies a forget record (see the module doc); the caller holds the lock."""
        if before is not None and (group in self.memberships or self.emptied.get(group, 0) >= before):
            return                                          # the group came back before the record
        committed = dict(self.groups.get(group, {}))
        doomed = set(committed) if partitions is None else {(t, p) for t, p in partitions}
        for key in doomed:
            if key in committed and (before is None or committed[key].ms < before):
                del committed[key]
        if committed:
            self.groups[group] = committed
        else:
            self.groups.pop(group, None)
        if partitions is None and before is None:
            memberships = dict(self.memberships)
            memberships.pop(group, None)
            self.memberships = memberships
        if group not in self.groups and group not in self.memberships:
            self.emptied.pop(group, None)

    def expired(self, now_ms: int, retention_ms: int, active) -> list[str]:
        """expired lists the groups with offsets to expire at `now_ms` (see the module doc); `active(group)`
        tells whether the coordinator has members of it not yet stored."""
        before = now_ms - retention_ms
        with self.lock:
            return [group for group, committed in self.groups.items()
                    if group not in self.memberships and self.emptied.get(group, 0) < before and not active(group)
                    and any(c.ms < before for c in committed.values())]

    def checkpoint_record(self) -> bytes:
        """checkpoint_record is a record that holds the whole state."""
        with self.lock:
            emptied = dict(self.emptied)
            groups, memberships, txns = dict(self.groups), self.memberships, self.txns.to_json()
        return json.dumps({"checkpoint": {
            group: [[t, p, c.offset, c.leader_epoch, c.metadata, c.ms] for (t, p), c in sorted(offsets.items())]
            for group, offsets in groups.items()},
            "groups": {group: kept.to_json() for group, kept in memberships.items()}, "emptied": emptied, **txns},
            separators=(",", ":")).encode()

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

    def stored_memberships(self) -> dict[str, Membership]:
        """stored_memberships maps each group with a stored membership to it; the dict is not changed later."""
        with self.lock:
            return self.memberships

    def group_ids(self) -> list[str]:
        """group_ids lists the groups with committed offsets."""
        with self.lock:
            return list(self.groups)


def commit_record(group: str, offsets: list[tuple[str, int, int, int, str | None]], ms: int) -> bytes:
    """commit_record is the log record of one OffsetCommit request's offsets."""
    return json.dumps({"commit": group, "offsets": [list(o) for o in offsets], "ms": ms},
                      separators=(",", ":")).encode()


def membership_record(group: str, membership: Membership | None, ms: int = 0) -> bytes:
    """membership_record is the log record of a group's membership (None: the group emptied, at `ms`)."""
    return json.dumps({"commit": group, "offsets": [], "group": None if membership is None else membership.to_json(),
                       "ms": ms}, separators=(",", ":")).encode()


def forget_record(group: str, partitions: list[tuple[str, int]] | None, before: int | None = None) -> bytes:
    """forget_record is the log record that removes a group's committed offsets (see the module doc)."""
    return json.dumps({"commit": group, "offsets": [], "forget": None if partitions is None else
                       [list(p) for p in partitions], "before": before}, separators=(",", ":")).encode()
