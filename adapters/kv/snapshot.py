"""walkit.adapters.kv.snapshot writes a store's state into a ledger and points the store at it.

A snapshot is a ledger of the store's cluster. Entry 0 is a JSON header (the log position the
state was copied at, how many records were applied up to it, the leader stamp of that entry,
the number of keys); the following entries are chunks of ``key, value, expire_at`` items:

    item := klen:u32 key vlen:u32 value expire_at:i64       (0: no expiry)

Order of a snapshot (replica.py): copy the state at position P on the event loop, write and
close the ledger from a background thread, CAS the pointer ``kv/<name>/snapshot`` in the
metadata store to {ledger id, P}, delete the previous snapshot ledger, then truncate the log
before P. The pointer moves only forward and only to closed ledgers, so a reader that follows
it always finds a whole snapshot and the log from P on.
"""

from __future__ import annotations

import json
import struct
import time
from dataclasses import asdict, dataclass

from walkit import Position
from walkit.errors import BadVersion, NodeExists, NoSuchKey, NoSuchLedger
from walkit.adapters.kv.state import State

FORMAT = 1
CHUNK_BYTES = 1 << 20
_ITEM = struct.Struct(">I")
_EXPIRE = struct.Struct(">q")
_IN_FLIGHT = 16


class SnapshotError(Exception):
    """SnapshotError is raised when a snapshot ledger does not hold what its header promises."""


def pointer_key(name: str) -> str:
    """pointer_key is the metadata key that names the store's current snapshot."""
    return f"kv/{name}/snapshot"


@dataclass(frozen=True)
class SnapshotPointer:
    """SnapshotPointer names a snapshot ledger and the log position its state was taken at."""

    ledger_id: int
    position: Position
    index: int
    stamp: int
    keys: int
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


@dataclass(frozen=True)
class Image:
    """Image is a copy of the state at `position`, taken on the event loop for a snapshot."""

    data: dict
    expires: dict
    position: Position
    index: int
    stamp: int


def read_pointer(store, name: str) -> tuple[SnapshotPointer | None, int | None]:
    """read_pointer returns the current snapshot pointer and its version (None, None if there is none)."""
    try:
        value, version = store.get(pointer_key(name))
    except NoSuchKey:
        return None, None
    return SnapshotPointer.from_bytes(value), version


def _chunks(image: Image):
    """_chunks yields the encoded items of the image, about CHUNK_BYTES each, without expired keys."""
    parts: list[bytes] = []
    size = 0
    expires, stamp = image.expires, image.stamp
    pack_len, pack_expire = _ITEM.pack, _EXPIRE.pack
    for key, value in image.data.items():
        expire_at = expires.get(key, 0)
        if expire_at and expire_at <= stamp:
            continue
        parts += (pack_len(len(key)), key, pack_len(len(value)), value, pack_expire(expire_at))
        size += len(key) + len(value) + 16
        if size >= CHUNK_BYTES:
            yield b"".join(parts)
            parts, size = [], 0
    if parts:
        yield b"".join(parts)


def write_snapshot(client, name: str, image: Image, *, ensemble: int, write_quorum: int, ack_quorum: int,
                   password: bytes = b"") -> SnapshotPointer:
    """write_snapshot writes `image` to a new ledger, closes it and returns a pointer to it (not yet published)."""
    keys = len(image.data) - sum(1 for at in image.expires.values() if at <= image.stamp)
    writer = client.create_ledger(ensemble, write_quorum, ack_quorum, password=password,
                                  custom={"kv": name, "snapshot": str(image.position)})
    header = {"format": FORMAT, "position": str(image.position), "index": image.index, "stamp": image.stamp,
              "keys": keys}
    pending = [writer.append_async(json.dumps(header).encode())]
    for chunk in _chunks(image):
        pending.append(writer.append_async(chunk))
        if len(pending) >= _IN_FLIGHT:
            pending.pop(0).result(client.timeout)
    for future in pending:
        future.result(client.timeout)
    writer.close()
    return SnapshotPointer(writer.ledger_id, image.position, image.index, image.stamp, keys,
                           created_ms=int(time.time() * 1000))


def publish(store, name: str, pointer: SnapshotPointer) -> SnapshotPointer | None:
    """publish moves the store's pointer to `pointer` by compare-and-swap, only forward.

    It returns the pointer it replaced (its ledger is now unused), `pointer` itself if there was
    none before, or None if the current pointer is already at or past `pointer.position`.
    """
    key = pointer_key(name)
    while True:
        current, version = read_pointer(store, name)
        if current is not None and current.position >= pointer.position:
            return None
        try:
            if current is None:
                store.create(key, pointer.to_bytes())
                return pointer
            store.put(key, pointer.to_bytes(), version)
            return current
        except (BadVersion, NodeExists, NoSuchKey):
            continue                        # another writer moved it: look again


def load_snapshot(client, pointer: SnapshotPointer, password: bytes = b"") -> State:
    """load_snapshot reads the ledger a pointer names and returns its state.

    It raises NoSuchLedger if the ledger was deleted (a newer snapshot replaced it: read the
    pointer again) and SnapshotError if the ledger does not match its header.
    """
    reader = client.open_ledger(pointer.ledger_id, password=password)
    entries = iter(reader.read())
    try:
        header = json.loads(next(entries).payload)
    except StopIteration:
        raise SnapshotError(f"snapshot ledger {pointer.ledger_id} is empty") from None
    if header.get("format") != FORMAT or header.get("position") != str(pointer.position):
        raise SnapshotError(f"snapshot ledger {pointer.ledger_id} holds {header}, not position {pointer.position}")
    items = []
    for entry in entries:
        items.extend(_decode_chunk(entry.payload))
    if len(items) != header["keys"]:
        raise SnapshotError(f"snapshot ledger {pointer.ledger_id} holds {len(items)} keys, "
                            f"its header says {header['keys']}")
    return State.from_items(items)


def _decode_chunk(data: bytes):
    at, end = 0, len(data)
    unpack_len, unpack_expire = _ITEM.unpack_from, _EXPIRE.unpack_from
    try:
        while at < end:
            (length,) = unpack_len(data, at)
            key = data[at + 4:at + 4 + length]
            at += 4 + length
            (length,) = unpack_len(data, at)
            value = data[at + 4:at + 4 + length]
            at += 4 + length
            (expire_at,) = unpack_expire(data, at)
            at += 8
            yield key, value, expire_at
    except struct.error:
        raise SnapshotError("a snapshot chunk is truncated") from None
    if at != end:
        raise SnapshotError("a snapshot chunk is truncated")


def collect_garbage(client, name: str, pointer: SnapshotPointer) -> list[int]:
    """collect_garbage deletes the store's snapshot ledgers at or before `pointer` except its own.

    The pointer only moves forward, so such a ledger can never be published again: it is the
    previous snapshot, or one whose writer died before publishing it. Ledgers of snapshots
    past the pointer are left alone (their writer may still publish them); once a later
    snapshot is published they are collected too. Returns the deleted ledger ids.
    """
    deleted = []
    for ledger_id in client.list_ledgers():
        if ledger_id == pointer.ledger_id:
            continue
        try:
            custom = client.ledger_metadata(ledger_id).custom
        except NoSuchLedger:
            continue
        if custom.get("kv") != name or "snapshot" not in custom:
            continue
        if Position.parse(custom["snapshot"]) <= pointer.position:
            delete_quietly(client, ledger_id)
            deleted.append(ledger_id)
    return deleted


def delete_quietly(client, ledger_id: int) -> None:
    """delete_quietly deletes a snapshot ledger that is no longer pointed to (absent is fine)."""
    try:
        client.delete_ledger(ledger_id)
    except NoSuchLedger:
        pass
