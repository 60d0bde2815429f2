"""walkit.replication.snapshots keeps a replicated machine's snapshots in ledgers of its own cluster.

A snapshot is a ledger: entry 0 is a JSON header (the log position the state was taken at, the
byte size and crc32c of the state), the following entries are the bytes `StateMachine.snapshot`
wrote, in chunks of CHUNK_BYTES. The metadata key ``replication/<name>/snapshot`` points at
the current one (`SnapshotPointer`).

Order (walkit.replication.node): take the state at position P between two entries, write and
close the ledger in the background, CAS the pointer to {ledger, P}, delete the snapshot
ledgers it replaced, then truncate the log before P. The pointer moves only forward and only
to closed ledgers, so whoever follows it finds a whole snapshot and the log from P on.

Cost: the keys under ``replication/<name>/snapshots`` index the machine's snapshot ledgers, so
listing and collecting them reads those ledgers' metadata only, however many ledgers the
cluster holds (a node reads every ledger once, when it starts: `adopt_unindexed`).
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import BinaryIO

import crc32c

from walkit import permissions
from walkit.core.loglist import LOG_OWNER, LogMetadata, Position, log_key
from walkit.errors import (
    BadVersion, MetadataError, MetadataNotAuthorized, NodeExists, NoSuchKey, NoSuchLedger, WalkitError,
)
from walkit.permissions import REPLICATED_PREFIX

log = logging.getLogger("walkit.replication")

FORMAT = 1
CHUNK_BYTES = 1 << 20
#: Chunks written, or read, at once: what a snapshot holds in flight is this many CHUNK_BYTES.
_IN_FLIGHT = 16
#: Snapshots up to this size are loaded in memory; larger ones spill to a temporary file.
SPOOL_BYTES = 64 << 20


class SnapshotError(WalkitError):
    """SnapshotError is raised when a snapshot ledger does not hold what its header promises."""


def pointer_key(name: str) -> str:
    """pointer_key is the metadata key naming the current snapshot of replicated machine `name`."""
    return f"replication/{name}/snapshot"


def index_prefix(name: str) -> str:
    """index_prefix holds one key per snapshot ledger of `name` (see `index_key`)."""
    return f"replication/{name}/snapshots"


def index_key(name: str, ledger_id: int) -> str:
    """index_key names snapshot ledger `ledger_id` of `name` in the index, so listing them reads only them.

    The key is created right after the ledger and deleted right after it. A ledger whose
    writer died between the two is found by `adopt_unindexed`, which a node runs once when it
    starts taking snapshots (it also indexes snapshots written by walkit before the index).
    """
    return f"{index_prefix(name)}/{ledger_id:020d}"


@dataclass(frozen=True)
class SnapshotPointer:
    """SnapshotPointer names a snapshot ledger and the log position its state was taken at."""

    ledger_id: int
    position: Position
    size: int
    created_ms: int = 0

    def to_bytes(self) -> bytes:
        """to_bytes encodes the pointer as JSON."""
        doc = asdict(self)
        doc["position"] = str(self.position)
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "SnapshotPointer":
        """from_bytes decodes a pointer written by `to_bytes`."""
        doc = json.loads(data)
        doc["position"] = Position.parse(doc["position"])
        return cls(**doc)


def read_pointer(store, name: str) -> tuple[SnapshotPointer | None, int | None]:
    """read_pointer returns the current pointer and its version: (None, None) if there is no snapshot, and
    (None, version) if the pointer's key is empty (ZooKeeper's principal mode: the cluster makes it empty)."""
    try:
        value, version = store.get(pointer_key(name))
    except NoSuchKey:
        return None, None
    return (SnapshotPointer.from_bytes(value) if value else None), version


def spool() -> BinaryIO:
    """spool returns the buffer a snapshot is written into: memory first, a temporary file when large."""
    return tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)


def write_snapshot(client, name: str, state: BinaryIO, position: Position, *, ensemble: int, write_quorum: int,
                   ack_quorum: int, password: bytes = b"", sessions: bytes = b"") -> SnapshotPointer:
    """write_snapshot copies `state` (a local buffer, read from its start) into a new closed ledger.

    It returns the pointer to publish. The state is read twice: once for the header's size and
    crc32c, once to write it. `sessions` (walkit.core.sessions, as of `position`) go in the header.
    """
    state.seek(0)
    size = crc = 0
    while chunk := state.read(CHUNK_BYTES):
        size += len(chunk)
        crc = crc32c.crc32c(chunk, crc)
    state.seek(0)
    created_ms = int(time.time() * 1000)
    custom = {"replication": name, "snapshot": str(position), "created_ms": str(created_ms)}
    try:                                   # the snapshot is of this instance of the name's log (LogMetadata.holds)
        custom.update(LogMetadata.from_bytes(client.store.get(log_key(REPLICATED_PREFIX + name))[0])
                      .ledger_custom("replication", name))
    except NoSuchKey:
        pass
    writer = client.create_ledger(ensemble, write_quorum, ack_quorum, password=password, custom=custom)
    _index(client.store, name, writer.ledger_id)
    header = {"format": FORMAT, "name": name, "position": str(position), "size": size, "crc32c": crc}
    if sessions:
        header["sessions"] = sessions.decode()
    append_chunks(client, writer, state, [writer.append_async(json.dumps(header).encode())])
    writer.close()
    return SnapshotPointer(writer.ledger_id, position, size, created_ms=created_ms)


def append_chunks(client, writer, state: BinaryIO, pending: list | None = None) -> None:
    """append_chunks appends what `state` holds from where it is, CHUNK_BYTES an entry, at most _IN_FLIGHT
    entries unacknowledged (`pending` ones included), and waits for every acknowledgement."""
    pending = list(pending or [])
    while chunk := state.read(CHUNK_BYTES):
        pending.append(writer.append_async(chunk))
        if len(pending) >= _IN_FLIGHT:
            pending.pop(0).result(client.timeout)
    for future in pending:
        future.result(client.timeout)


def read_chunks(reader, first: int, last: int) -> tuple[BinaryIO, int, int]:
    """read_chunks reads entries `first` to `last` of an open ledger into a buffer (`spool`), _IN_FLIGHT entries
    a request, each range streamed in before the next is asked for; it returns (the buffer at its start, its
    size, its crc32c)."""
    out, size, crc = spool(), 0, 0
    for start in range(first, last + 1, _IN_FLIGHT):
        for entry in reader.read(start, min(last, start + _IN_FLIGHT - 1)):
            out.write(entry.payload)
            size += len(entry.payload)
            crc = crc32c.crc32c(entry.payload, crc)
    out.seek(0)
    return out, size, crc


def publish(store, name: str, pointer: SnapshotPointer) -> SnapshotPointer | None:
    """publish moves the pointer to `pointer` by compare-and-swap, only forward.

    It returns the pointer it replaced (its ledger is now unused), `pointer` itself if there was
    none before, or None if the current pointer is already at or past `pointer.position`.
    """
    key = pointer_key(name)
    while True:
        current, version = read_pointer(store, name)
        if current is not None and current.position >= pointer.position:
            return None
        try:
            if version is None:
                store.create(key, pointer.to_bytes())
                return pointer
            store.put(key, pointer.to_bytes(), version)
            return pointer if current is None else current
        except (BadVersion, NodeExists, NoSuchKey):
            continue                        # another node moved it: look again


def load_snapshot(client, pointer: SnapshotPointer, password: bytes = b"") -> BinaryIO:
    """load_snapshot is `load_snapshot_and_sessions` without the sessions: the state, positioned at its start."""
    return load_snapshot_and_sessions(client, pointer, password)[0]


def load_snapshot_and_sessions(client, pointer: SnapshotPointer, password: bytes = b"") -> tuple[BinaryIO, bytes]:
    """load_snapshot_and_sessions reads the ledger a pointer names into a buffer positioned at its start,
    and returns it with the client sessions the header carries (b"" if none).

    The chunks are read _IN_FLIGHT at a time (16 MiB), each range streamed into the buffer
    (a temporary file past SPOOL_BYTES) before the next is asked for, so a snapshot of any
    size loads with a bounded amount of it in memory. It raises NoSuchLedger if the ledger was
    deleted (a newer snapshot replaced it: read the pointer again) and SnapshotError if the
    ledger does not match its header.
    """
    reader = client.open_ledger(pointer.ledger_id, password=password)
    name = reader.metadata.custom.get("replication", "")
    if not is_snapshot_of(client.store, name, reader.metadata, by_writer=False):
        raise SnapshotError(f"ledger {pointer.ledger_id}, which the snapshot pointer of {name!r} names, is not a "
                            f"snapshot of the name's log as it is now (a log of that name deleted since, or a ledger "
                            f"its owner may not write): it is not loaded")
    last = reader.last_add_confirmed
    if last < 0:
        raise SnapshotError(f"snapshot ledger {pointer.ledger_id} is empty")
    header = json.loads(next(iter(reader.read(0, 0))).payload)
    if header.get("format") != FORMAT or header.get("position") != str(pointer.position):
        raise SnapshotError(f"snapshot ledger {pointer.ledger_id} holds {header}, not position {pointer.position}")
    out, size, crc = read_chunks(reader, 1, last)
    if (size, crc) != (header["size"], header["crc32c"]):
        raise SnapshotError(f"snapshot ledger {pointer.ledger_id} holds {size} bytes (crc {crc:#x}), its header "
                            f"says {header['size']} (crc {header['crc32c']:#x})")
    out.seek(0)
    return out, header.get("sessions", "").encode()


def list_snapshots(client, name: str, *, scan: bool = False) -> list[SnapshotPointer]:
    """list_snapshots lists the closed snapshot ledgers of `name`, oldest position first.

    Each comes back as the pointer that would name it (sizes are 0: only the header knows them).
    Point-in-time restores pick their starting snapshot here. It reads the index of `name`'s
    snapshots and their ledgers' metadata, not the cluster's; `scan` reads every ledger's
    metadata instead (snapshots written before the index, by a walkit that had none), on a
    cluster without security only (`trusts_unindexed`).
    """
    return [p for p, closed in _snapshots(client, name, scan) if closed]


def _snapshots(client, name: str, scan: bool = False) -> list[tuple[SnapshotPointer, bool]]:
    """_snapshots lists (pointer, closed) for every snapshot ledger of `name`, oldest position first."""
    if scan and trusts_unindexed(client):
        ledger_ids = client.list_ledgers()
    else:
        ledger_ids = [int(key.rsplit("/", 1)[-1]) for key in client.store.children(index_prefix(name))]
    found = []
    for ledger_id in ledger_ids:
        try:
            metadata = client.ledger_metadata(ledger_id)
        except NoSuchLedger:
            if not scan:
                _unindex(client.store, name, ledger_id)   # deleted before its key was
            continue
        except MetadataNotAuthorized:
            continue                                      # another principal's: none of the name's
        custom = metadata.custom
        if custom.get("replication") != name or "snapshot" not in custom:
            continue
        if not is_snapshot_of(client.store, name, metadata):
            continue                                      # says it is one: any principal may write that
        found.append((SnapshotPointer(ledger_id, Position.parse(custom["snapshot"]), 0,
                                      created_ms=int(custom.get("created_ms", metadata.created_ms))),
                      metadata.state == "CLOSED"))
    return sorted(found, key=lambda item: item[0].position)


def trusts_unindexed(client) -> bool:
    """trusts_unindexed says whether a ledger that says it is a snapshot counts without the name's index naming it:
    only on a cluster without security (a client without a key). With security, only a writer of the name writes
    its index, while any principal may write a ledger that says it is the name's snapshot, and even name another
    principal as its owner (a ledger's value is its owner's to write), so no check of the ledger alone tells."""
    return not client.principal


def is_snapshot_of(store, name: str, metadata, *, by_writer: bool = True) -> bool:
    """is_snapshot_of says whether a ledger (its metadata) is a snapshot of replicated name `name`: one of the current
    instance of its log ``replicated-<name>`` (walkit.permissions.bound_log), whose owner may write the name now.

    A ledger's custom metadata is whatever its creator wrote, so a principal without any right on the name could
    make one that says it is the name's snapshot, with the position and time of its choosing. The one a pointer
    names (`by_writer` False) was published by a writer of the name: it only has to be of the log as it is now
    (a pointer left by an earlier log of that name is not), unless it was made before instances were recorded.
    """
    log = REPLICATED_PREFIX + name
    if not name or permissions.bound_log(store, metadata) != log:
        return False
    if not by_writer and LOG_OWNER in metadata.custom:
        return True
    return permissions.writes(store, metadata.owner, log)


def adopt_unindexed(client, name: str) -> list[int]:
    """adopt_unindexed indexes the snapshot ledgers of `name` the index does not name; it returns their ids.

    It reads every ledger's metadata once: a node runs it when it starts taking snapshots, to
    find ledgers of a snapshot whose writer died before indexing it, and snapshots written
    before the index existed. Garbage collection then deletes those no longer needed. On a
    cluster with security it adopts none (`trusts_unindexed`): such ledgers stay, unused.
    """
    if not trusts_unindexed(client):
        return []
    known = {int(key.rsplit("/", 1)[-1]) for key in client.store.children(index_prefix(name))}
    adopted = []
    for pointer, _ in _snapshots(client, name, scan=True):
        if pointer.ledger_id not in known:
            _index(client.store, name, pointer.ledger_id)
            adopted.append(pointer.ledger_id)
    return adopted


def _index(store, name: str, ledger_id: int) -> None:
    try:
        store.create(index_key(name, ledger_id), b"")
    except NodeExists:
        pass


def _unindex(store, name: str, ledger_id: int) -> None:
    try:
        store.delete(index_key(name, ledger_id))
    except NoSuchKey:
        pass
    except MetadataError as exc:          # a key someone holds with keys under it: the index names a deleted ledger
        log.warning("snapshot index of %r keeps ledger %d: %s", name, ledger_id, exc)


def retained(snapshots: list[SnapshotPointer], pointer: SnapshotPointer, retention_ms: int,
             now_ms: int) -> SnapshotPointer:
    """retained is the oldest snapshot a retention window of `retention_ms` must keep.

    Restoring to any time inside the window needs the newest snapshot taken at or before the
    window's start (or the oldest one, if none is that old) and the log after it. With no window
    it is the current `pointer`.
    """
    if retention_ms <= 0:
        return pointer
    start = now_ms - retention_ms
    older = [s for s in snapshots if s.created_ms <= start and s.position <= pointer.position]
    if older:
        return older[-1]
    candidates = [s for s in snapshots if s.position <= pointer.position]
    return candidates[0] if candidates else pointer


def collect_garbage(client, name: str, keep_from: SnapshotPointer, current: SnapshotPointer) -> list[int]:
    """collect_garbage deletes the snapshot ledgers of `name` before `keep_from`, except `current`.

    Snapshots from `keep_from` on (up to and including the current pointer) are kept: a
    retention window needs them for point-in-time restores. Ledgers of snapshots past the
    pointer are left alone (their writer may still publish them); ledgers before `keep_from`
    can never be published again (the pointer only moves forward), closed or not (a writer that
    died). Only the index of `name`'s snapshots is read. Returns the deleted ids.
    """
    deleted = []
    for snapshot, _ in _snapshots(client, name):
        if snapshot.ledger_id in (current.ledger_id, keep_from.ledger_id) or snapshot.position >= keep_from.position:
            continue
        try:
            client.delete_ledger(snapshot.ledger_id)
            deleted.append(snapshot.ledger_id)
        except NoSuchLedger:
            pass
        _unindex(client.store, name, snapshot.ledger_id)
    return deleted
