"""walkit.adapters.topics.snapshots keeps partition state in ledgers, so a new leader replays only the tail.

Every `snapshot_every` batches the partition's leader copies its PartitionState (partition.py)
on the event loop and, on a worker thread, writes it to a new ledger of the cluster (entry 0:
a JSON header naming the log and the position the state was copied at; then 1 MiB chunks of
`PartitionState.snapshot`), closes it, and moves the pointer ``topics/snapshots/<log>`` to it
by compare-and-swap, only forward; the replaced snapshot's ledger is then deleted. A broker
taking the partition over restores the pointed snapshot and replays the log after its
position (from the log's first ledger if retention removed that position).

The pointer only names closed ledgers, so a reader that follows it finds a whole snapshot. The
header also holds the log's creation time: a snapshot a deleted topic's last leader left behind
is not restored into a new topic of the same name (the new log's first snapshot replaces it).
A leader that dies between writing a ledger and publishing it leaks that ledger (its custom
metadata names the log and position, for an operator or a later collector to find).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass

from walkit import Position
from walkit.errors import BadVersion, NodeExists, NoSuchKey, NoSuchLedger

FORMAT = 1
CHUNK_BYTES = 1 << 20
PREFIX = "topics/snapshots"


class SnapshotError(Exception):
    """SnapshotError is raised when a snapshot ledger does not hold what its header promises."""


@dataclass(frozen=True)
class SnapshotPointer:
    """SnapshotPointer names a snapshot ledger and the log position its state was copied at."""

    ledger_id: int
    position: Position

    def to_bytes(self) -> bytes:
        """to_bytes encodes the pointer as JSON."""
        return json.dumps({"ledger_id": self.ledger_id, "position": str(self.position)}).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "SnapshotPointer":
        """from_bytes decodes a pointer written by `to_bytes`."""
        doc = json.loads(data)
        return cls(int(doc["ledger_id"]), Position.parse(doc["position"]))


def pointer_key(log_name: str) -> str:
    """pointer_key is the metadata key naming a log's current snapshot."""
    return f"{PREFIX}/{log_name}"


def read_pointer(store, log_name: str) -> tuple[SnapshotPointer | None, int | None]:
    """read_pointer returns a log's snapshot pointer and its version (None, None if there is none)."""
    try:
        value, version = store.get(pointer_key(log_name))
    except NoSuchKey:
        return None, None
    return SnapshotPointer.from_bytes(value), version


def write(client, log_name: str, state, *, ensemble: int, write_quorum: int, ack_quorum: int,
          password: bytes = b"") -> SnapshotPointer:
    """write stores `state` (applied up to state.applied) in a new, closed ledger and returns its pointer."""
    out = io.BytesIO()
    state.snapshot(out)
    data = out.getvalue()
    position = state.applied
    writer = client.create_ledger(ensemble, write_quorum, ack_quorum, password=password,
                                  custom={"topics-snapshot": log_name, "position": str(position)})
    header = {"format": FORMAT, "log": log_name, "log_created_ms": client.log_metadata(log_name).created_ms,
              "position": str(position), "size": len(data)}
    pending = [writer.append_async(json.dumps(header).encode())]
    for at in range(0, len(data), CHUNK_BYTES):
        pending.append(writer.append_async(data[at:at + CHUNK_BYTES]))
    for future in pending:
        future.result(client.timeout)
    writer.close()
    return SnapshotPointer(writer.ledger_id, position)


def publish(client, log_name: str, pointer: SnapshotPointer) -> bool:
    """publish moves the log's pointer forward to `pointer` (CAS) and deletes the replaced snapshot's ledger.

    It returns False (and deletes `pointer`'s ledger) when the pointer is already at or past it.
    """
    store = client.store
    key = pointer_key(log_name)
    while True:
        current, version = read_pointer(store, log_name)
        if current is not None and current.position >= pointer.position:
            _delete_quietly(client, pointer.ledger_id)
            return False
        try:
            if current is None:
                store.create(key, pointer.to_bytes())
            else:
                store.put(key, pointer.to_bytes(), version)
        except (BadVersion, NodeExists, NoSuchKey):
            continue                            # moved meanwhile: look again
        if current is not None:
            _delete_quietly(client, current.ledger_id)
        return True


def load(client, log_name: str, state, password: bytes = b"") -> SnapshotPointer | None:
    """load restores `state` from the log's current snapshot; it returns the pointer (None: no snapshot)."""
    for _ in range(10):
        pointer, _ = read_pointer(client.store, log_name)
        if pointer is None:
            return None
        try:
            entries = [entry.payload for entry in client.open_ledger(pointer.ledger_id, password=password).read()]
        except NoSuchLedger:
            continue                            # replaced meanwhile: read the pointer again
        if not entries:
            raise SnapshotError(f"snapshot ledger {pointer.ledger_id} is empty")
        header = json.loads(entries[0])
        data = b"".join(entries[1:])
        if header.get("format") != FORMAT or header.get("position") != str(pointer.position) \
                or header.get("size") != len(data):
            raise SnapshotError(f"snapshot ledger {pointer.ledger_id} holds {header}, not {pointer}")
        if header.get("log_created_ms") != client.log_metadata(log_name).created_ms:
            return None                         # left by a deleted topic of the same name: not this log's
        state.restore(io.BytesIO(data))
        return pointer
    raise SnapshotError(f"the snapshot of {log_name!r} kept changing while it was loaded")


def delete(client, log_name: str) -> None:
    """delete removes a log's snapshot pointer and ledger (when its topic is deleted)."""
    pointer, version = read_pointer(client.store, log_name)
    if pointer is None:
        return
    try:
        client.store.delete(pointer_key(log_name), version)
    except (BadVersion, NoSuchKey):
        return
    _delete_quietly(client, pointer.ledger_id)


def _delete_quietly(client, ledger_id: int) -> None:
    try:
        client.delete_ledger(ledger_id)
    except NoSuchLedger:
        pass
