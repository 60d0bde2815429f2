"""walkit.adapters.topics.transactions holds Kafka transactions as data: an id's state, its records, its markers.

Kafka's transactions (KIP-98), as this broker keeps them. A transactional id is coordinated by
the group bucket its id hashes to (catalog.group_bucket, the same hash as a consumer group's),
and its state is a record of that bucket's walkit.replicate log (offsets.py applies it), so the
broker that takes a bucket over holds every transaction of it. The buckets were chosen over a
parallel set of transaction buckets because a bucket already is a replicated, fenced,
snapshotted log with a leader found by FindCoordinator, and transactional ids are few and
their records small; another set of slots would cost a node per slot on every broker.

    Empty -> Ongoing -> PrepareCommit -> CompleteCommit -> Ongoing ...
                     -> PrepareAbort  -> CompleteAbort  -> Ongoing ...

`TxnMeta` is the whole state of one transactional id; every change writes it whole:

    {"commit": "", "offsets": [], "txn": id, "meta": meta or null}     (null: the id expired)
    meta := {"pid", "epoch", "state", "timeout_ms", "partitions": [[topic or null, partition], ...],
             "number", "started_ms", "ms"}

A partition entry with topic null is a group bucket (AddOffsetsToTxn): the transaction's
offsets wait there (TxnOffsetCommit) until its marker. `number` counts the id's transactions;
it tells one transaction's markers from the last one's when the epoch stays the same (Kafka
keeps the epoch between transactions). `ms` is the coordinator's clock when it wrote the
record: expiry and timeouts compare the leader's clock with times inside records, never
with the clock at apply, so every broker applies the same records to the same state.

Markers. A prepared transaction (PrepareCommit, PrepareAbort) is completed by the leaders of
its partitions, not by messages from the coordinator: every broker applies every bucket's log,
so a partition's leader sees the prepared transaction and appends its marker, a Kafka control
batch (attributes: control and transactional; one record, key (version 0, type 0 abort or
1 commit), value (version 0, coordinator epoch)), into the partition; a group bucket's leader
appends a marker record that makes the transaction's offsets committed or drops them:

    {"commit": "", "offsets": [], "txn_marker": [pid, number, committed, epoch]}

A TxnOffsetCommit's record and a group marker carry the producer's epoch (records from before
carry none and match any): a bucket ignores offsets of an epoch older than those it holds for
the producer id, drops those of an older epoch at a newer one's, and a commit marker commits
only the offsets of its own epoch, so a fenced producer's offsets are never committed by its
successor's transaction (Kafka fences them by the producer epoch of the offsets topic's batch).

The control record's coordinator epoch carries the transaction's number (clients read only
the key). Each partition's state remembers the last number marked per producer id
(partition.py, offsets.py), and the coordinator writes CompleteX once every partition of the
transaction shows it. Brokers connect to nobody for this: they share state only through
walkit logs. A marker written twice (a leader died after appending it) changes nothing the
second time, even when the producer's next transaction began in between: a partition and a
bucket ignore a marker whose number is not above the last one they marked for its producer
(an orphan's abort, number -1, always applies). The first field, "commit" of no offsets, is what a broker from before
transactions reads of these records: a commit of nothing by the group "".
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, replace

from kafka.record.util import calc_crc32c, encode_varint

from walkit.adapters.topics.batches import CONTROL, TRANSACTIONAL, info

EMPTY, ONGOING = "Empty", "Ongoing"
PREPARE_COMMIT, PREPARE_ABORT = "PrepareCommit", "PrepareAbort"
COMPLETE_COMMIT, COMPLETE_ABORT = "CompleteCommit", "CompleteAbort"
PREPARED = (PREPARE_COMMIT, PREPARE_ABORT)
#: The states an EndTxn moves a transaction to, per outcome: (prepared, completed).
OUTCOME = {True: (PREPARE_COMMIT, COMPLETE_COMMIT), False: (PREPARE_ABORT, COMPLETE_ABORT)}
#: The states in which a transactional id may start a transaction or be given to a new producer.
IDLE = (EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT)
#: Kafka's producer epochs are int16; an id whose epoch would pass this gets a new producer id.
MAX_EPOCH = 32_766
ABORT_TYPE, COMMIT_TYPE = 0, 1

#: A marker control batch's header fields after the CRC (attributes .. records), and a record's key and value.
_AFTER_CRC = struct.Struct(">hiqqqhii")
_HEAD = struct.Struct(">qiib")
_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")


@dataclass(frozen=True, slots=True)
class TxnMeta:
    """TxnMeta is a transactional id's state (see the module doc); changes make a new one (`replace`)."""

    pid: int
    epoch: int
    state: str
    timeout_ms: int
    partitions: tuple[tuple[str | None, int], ...] = ()
    number: int = 0
    started_ms: int = 0
    ms: int = 0

    @property
    def committed(self) -> bool:
        """committed tells a prepared or completed commit from an abort."""
        return self.state in (PREPARE_COMMIT, COMPLETE_COMMIT)

    def to_json(self) -> dict:
        """to_json is the meta as the JSON object the records and checkpoints hold."""
        return {"pid": self.pid, "epoch": self.epoch, "state": self.state, "timeout_ms": self.timeout_ms,
                "partitions": [list(p) for p in self.partitions], "number": self.number,
                "started_ms": self.started_ms, "ms": self.ms}

    @classmethod
    def from_json(cls, doc: dict) -> "TxnMeta":
        """from_json decodes what `to_json` wrote."""
        return cls(doc["pid"], doc["epoch"], doc["state"], doc["timeout_ms"],
                   tuple((t, p) for t, p in doc["partitions"]), doc["number"], doc["started_ms"], doc["ms"])

    def begun(self, partitions, ms: int) -> "TxnMeta":
        """begun is the meta with `partitions` added: a new transaction (the next number) if none was open."""
        added = tuple(dict.fromkeys(self.partitions + tuple(partitions)))
        if self.state == ONGOING:
            return replace(self, partitions=added, ms=ms)
        return replace(self, state=ONGOING, partitions=tuple(dict.fromkeys(partitions)), number=self.number + 1,
                       started_ms=ms, ms=ms)


def txn_record(txn_id: str, meta: TxnMeta | None) -> bytes:
    """txn_record is the bucket record of a transactional id's state (None: the id expired)."""
    return json.dumps({"commit": "", "offsets": [], "txn": txn_id, "meta": None if meta is None else meta.to_json()},
                      separators=(",", ":")).encode()


def txn_offsets_record(group: str, pid: int, offsets: list[tuple[str, int, int, int, str | None]], ms: int,
                       epoch: int | None = None) -> bytes:
    """txn_offsets_record is the bucket record of a TxnOffsetCommit of producer (`pid`, `epoch`): offsets that wait
    for the transaction's marker."""
    return json.dumps({"commit": group, "offsets": [], "txn_offsets": [pid, [list(o) for o in offsets]], "ms": ms,
                       "epoch": epoch}, separators=(",", ":")).encode()


def group_marker_record(pid: int, number: int, committed: bool, epoch: int | None = None) -> bytes:
    """group_marker_record is a group bucket's marker of transaction `number` of producer `pid` at `epoch`."""
    return json.dumps({"commit": "", "offsets": [], "txn_marker": [pid, number, committed, epoch]},
                      separators=(",", ":")).encode()


def control_batch(pid: int, epoch: int, committed: bool, number: int, timestamp: int) -> bytes:
    """control_batch is a COMMIT or ABORT marker of producer `pid` as a Kafka control batch (base offset 0).

    Its coordinator epoch field carries the transaction's `number` (see the module doc).
    """
    key = _KEY.pack(0, COMMIT_TYPE if committed else ABORT_TYPE)
    value = _VALUE.pack(0, number & 0x7FFFFFFF)
    body = bytearray([0])                          # record attributes
    encode_varint(0, body.append)                  # timestamp delta
    encode_varint(0, body.append)                  # offset delta
    encode_varint(len(key), body.append)
    body += key
    encode_varint(len(value), body.append)
    body += value
    encode_varint(0, body.append)                  # headers
    record = bytearray()
    encode_varint(len(body), record.append)
    record += body
    after_crc = _AFTER_CRC.pack(CONTROL | TRANSACTIONAL, 0, timestamp, timestamp, pid, epoch, -1, 1) + bytes(record)
    crc = calc_crc32c(after_crc)
    length = 4 + 1 + 4 + len(after_crc)            # partitionLeaderEpoch, magic, crc, the rest
    return _HEAD.pack(0, length, -1, 2) + struct.pack(">I", crc) + after_crc


def marker_of(batch: bytes) -> tuple[bool, int] | None:
    """marker_of returns (committed, transaction number) of a marker control batch, None for any other batch."""
    head = info(batch)
    if not head.attributes & CONTROL:
        return None
    # the single record: length, attributes, timestamp delta, offset delta, key length (all 1-byte varints)
    position = 61 + 5
    kind = _KEY.unpack_from(batch, position)[1]
    number = _VALUE.unpack_from(batch, position + _KEY.size + 1)[1]
    return kind == COMMIT_TYPE, number


def _epoch_of(groups: dict[str, list]) -> int | None:
    """_epoch_of is the producer epoch of a producer's pending offsets (None: from before epochs, or none)."""
    return max((row[6] for rows in groups.values() for row in rows if len(row) > 6 and row[6] is not None),
               default=None)


class TxnBook:
    """TxnBook is the transaction part of a group bucket's state: transactional ids, waiting offsets, markers.

    `transactions` maps the transactional ids this bucket coordinates to their TxnMeta, and
    `prepared` those of them in PrepareCommit or PrepareAbort (what markers are written for);
    `pending` maps a producer id to the offsets its open transaction committed per group of
    this bucket ([topic, partition, offset, leader epoch, metadata, ms, producer epoch] rows; a
    checkpoint from before producer epochs has rows without it); `marked` maps a
    producer id to the number of its last transaction marked in this bucket. The dicts are
    replaced, never changed, so a reader holding one sees it stay as it was.
    """

    KEYS = ("txn", "txn_offsets", "txn_marker")

    def __init__(self) -> None:
        self.transactions: dict[str, TxnMeta] = {}
        self.prepared: dict[str, TxnMeta] = {}
        self.pending: dict[int, dict[str, list]] = {}
        self.marked: dict[int, int] = {}

    @classmethod
    def handles(cls, doc: dict) -> bool:
        """handles tells whether a bucket record is a transaction's (see the module doc)."""
        return any(key in doc for key in cls.KEYS)

    def apply(self, doc: dict) -> dict[str, list]:
        """apply applies a transaction's record; it returns the offsets a commit marker commits, per group."""
        if "txn" in doc:
            txn_id, meta = doc["txn"], None if doc["meta"] is None else TxnMeta.from_json(doc["meta"])
            transactions, prepared = dict(self.transactions), dict(self.prepared)
            transactions.pop(txn_id, None)
            prepared.pop(txn_id, None)
            if meta is not None:
                transactions[txn_id] = meta
                if meta.state in PREPARED:
                    prepared[txn_id] = meta
            self.transactions, self.prepared = transactions, prepared
            return {}
        if "txn_offsets" in doc:
            pid, rows = doc["txn_offsets"]
            epoch, pending = doc.get("epoch"), dict(self.pending)
            groups = dict(pending.get(pid, {}))
            held = _epoch_of(groups)
            if epoch is not None and held is not None:
                if epoch < held:
                    return {}                    # a fenced producer's offsets
                if epoch > held:
                    groups = {}                  # a fenced producer's offsets: its successor's come
            kept = {(row[0], row[1]): row for row in groups.get(doc["commit"], [])}
            kept.update({(t, p): [t, p, o, e, m, doc.get("ms", 0), epoch] for t, p, o, e, m in rows})
            groups[doc["commit"]] = list(kept.values())
            pending[pid] = groups
            self.pending = pending
            return {}
        pid, number, committed, *rest = doc["txn_marker"]
        if number <= self.marked.get(pid, 0):
            return {}               # a transaction's marker written again: the next one's offsets stay pending
        epoch = rest[0] if rest else None
        pending = dict(self.pending)
        waiting = pending.pop(pid, {})
        self.pending = pending
        self.marked = {**self.marked, pid: number}
        if not committed:
            return {}
        return {group: [row[:6] for row in rows if epoch is None or len(row) < 7 or row[6] in (None, epoch)]
                for group, rows in waiting.items()}

    def superseded(self, group: str, partitions: set[tuple[str, int]]) -> None:
        """superseded drops the pending offsets of `group` for `partitions`, which a plain OffsetCommit applied
        after them replaced: as in Kafka, a transaction's offset applies at its marker only if the committed
        one is older in the log."""
        if not any((row[0], row[1]) in partitions for groups in self.pending.values() for row in groups.get(group, [])):
            return
        pending = {}
        for pid, groups in self.pending.items():
            groups = dict(groups)
            if group in groups:
                groups[group] = [row for row in groups[group] if (row[0], row[1]) not in partitions]
            pending[pid] = groups
        self.pending = pending

    def unstable(self, group: str, since_ms: int) -> set[tuple[str, int]]:
        """unstable is the partitions of `group` whose offsets an open transaction committed (KIP-447): those
        waiting for a marker, sent at `since_ms` or later (older ones no transaction can still hold: the
        caller's bound is txncoordinator.ORPHAN_S; a marker never comes for them)."""
        return {(row[0], row[1]) for groups in self.pending.values() for row in groups.get(group, [])
                if row[5] >= since_ms}

    def to_json(self) -> dict:
        """to_json is the book as the checkpoint's "transactions", "pending" and "marked" fields."""
        return {"transactions": {i: m.to_json() for i, m in self.transactions.items()},
                "pending": {str(pid): groups for pid, groups in self.pending.items()},
                "marked": {str(pid): number for pid, number in self.marked.items()}}

    @classmethod
    def from_json(cls, doc: dict) -> "TxnBook":
        """from_json reads a checkpoint's fields (a checkpoint from before transactions has none)."""
        book = cls()
        book.transactions = {i: TxnMeta.from_json(m) for i, m in doc.get("transactions", {}).items()}
        book.prepared = {i: m for i, m in book.transactions.items() if m.state in PREPARED}
        book.pending = {int(pid): groups for pid, groups in doc.get("pending", {}).items()}
        book.marked = {int(pid): number for pid, number in doc.get("marked", {}).items()}
        return book
