"""walkit.adapters.kv.machine is the key-value store as a walkit.StateMachine: apply, snapshot, restore.

    machine = KVMachine()
    node = walkit.replicate(machine, client=client, name="kv-default", node_id="127.0.0.1:6380")

walkit.replicate does the rest (election, fencing, the log, followers, snapshots in ledgers,
truncation); this module only says what a record does to the State and how the State is
written down.

Threads: `apply`, `snapshot` and `restore` run on the node's apply thread; the RESP server
reads the state from its event loop thread. Every change to the State happens under `lock`,
and readers hold it too, so a read never sees a record half applied.

Determinism: a record carries the stamp the leader gave it (records.py); the record is applied
at that stamp and expired keys are purged at it, so every node holds the same state after
the same records. `stamp` is the largest stamp applied and `index` counts the records applied
since the store began; both travel in snapshots.

Snapshot format (the bytes walkit.replicate stores in a ledger):

    snapshot := FORMAT:u8 index:u64 stamp:u64 count:u64 item*
    item     := klen:u32 key vlen:u32 value expire_at:i64       (0: no expiry)
"""

from __future__ import annotations

import struct
import threading
import time
from typing import BinaryIO, Callable

import walkit
from walkit.adapters.kv.records import decode
from walkit.adapters.kv.state import State
from walkit.errors import WalkitError

#: The snapshot format version; restore refuses others.
FORMAT = 1
#: Expired keys purged after each record, at most (the rest go with later records).
PURGE_PER_RECORD = 16
#: Bytes of items written to the snapshot buffer at a time.
WRITE_BYTES = 1 << 20

_HEADER = struct.Struct(">BQQQ")
_LEN = struct.Struct(">I")
_EXPIRE = struct.Struct(">q")


class SnapshotFormatError(WalkitError):
    """SnapshotFormatError is raised by restore for bytes that are not a KV snapshot of this format."""


class KVMachine(walkit.StateMachine):
    """KVMachine holds the store's State and applies stamped records to it (see the module doc)."""

    def __init__(self) -> None:
        self.state = State()
        self.lock = threading.RLock()
        self.stamp = 0                          # the largest stamp applied
        self.index = 0                          # records applied since the store began
        self.position: walkit.Position | None = None     # of the last record applied here
        self.last_apply = time.monotonic()
        self.snapshots = 0                      # snapshots this node started (on the leader)
        self.snapshot_taken_at: walkit.Position | None = None    # where the last one started

    def apply(self, record: bytes, position: walkit.Position):
        """apply applies one stamped record and returns its reply value (a ReplyError for a failed command).

        A record that does not decode raises RecordError, on every node alike, and changes nothing.
        """
        stamp, change = decode(record)
        state = self.state
        with self.lock:
            result = state.apply(change, stamp)
            state.purge_expired(stamp, PURGE_PER_RECORD)
            if stamp > self.stamp:
                self.stamp = stamp
            self.index += 1
        self.position = position
        self.last_apply = time.monotonic()
        return result

    def snapshot(self, out: BinaryIO) -> Callable[[], None]:
        """snapshot copies the state now (between two records) and returns the function that writes it to `out`."""
        data, expires = self.state.copy_items()
        index, stamp = self.index, self.stamp
        self.snapshots += 1
        self.snapshot_taken_at = self.position
        return lambda: write_items(out, data, expires, index, stamp)

    def restore(self, src: BinaryIO) -> None:
        """restore replaces the state with the one a snapshot holds."""
        state, index, stamp = read_items(src.read())
        with self.lock:
            self.state, self.index, self.stamp = state, index, max(self.stamp, stamp)
        self.last_apply = time.monotonic()


def write_items(out: BinaryIO, data: dict, expires: dict, index: int, stamp: int) -> None:
    """write_items writes a snapshot of `data` and `expires` to `out`, leaving out keys expired at `stamp`."""
    live = [(key, value, expires.get(key, 0)) for key, value in data.items()
            if not 0 < expires.get(key, 0) <= stamp]
    out.write(_HEADER.pack(FORMAT, index, stamp, len(live)))
    parts: list[bytes] = []
    size = 0
    pack_len, pack_expire = _LEN.pack, _EXPIRE.pack
    for key, value, expire_at in live:
        parts += (pack_len(len(key)), key, pack_len(len(value)), value, pack_expire(expire_at))
        size += len(key) + len(value) + 16
        if size >= WRITE_BYTES:
            out.write(b"".join(parts))
            parts, size = [], 0
    out.write(b"".join(parts))


def read_items(data: bytes) -> tuple[State, int, int]:
    """read_items decodes a snapshot written by `write_items`: (state, index, stamp)."""
    try:
        version, index, stamp, count = _HEADER.unpack_from(data, 0)
    except struct.error:
        raise SnapshotFormatError("a KV snapshot of %d bytes is too short for its header" % len(data)) from None
    if version != FORMAT:
        raise SnapshotFormatError(f"KV snapshot format {version} is not {FORMAT}")
    items = []
    at, end = _HEADER.size, len(data)
    unpack_len, unpack_expire = _LEN.unpack_from, _EXPIRE.unpack_from
    try:
        for _ in range(count):
            (length,) = unpack_len(data, at)
            key = data[at + 4:at + 4 + length]
            at += 4 + length
            (length,) = unpack_len(data, at)
            value = data[at + 4:at + 4 + length]
            at += 4 + length
            (expire_at,) = unpack_expire(data, at)
            at += 8
            items.append((key, value, expire_at))
    except struct.error:
        raise SnapshotFormatError(f"a KV snapshot ends inside item {len(items)} of {count}") from None
    if at != end:
        raise SnapshotFormatError(f"a KV snapshot has {end - at} bytes after its {count} items")
    return State.from_items(items), index, stamp
