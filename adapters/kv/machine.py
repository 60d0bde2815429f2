"""walkit.adapters.kv.machine is the key-value store as a walkit.StateMachine: apply, snapshot, restore.

    machine = KVMachine()
    node = walkit.replicate(machine, client=client, name="kv-default", node_id="127.0.0.1:6380")

walkit.replicate does the rest (election, fencing, the log, followers, snapshots in ledgers,
truncation); this module only says what a record does to the State and how the State is
written down.

Threads: `apply`, `snapshot` and `restore` run on the node's apply thread; the RESP server
reads the state from its event loop thread. Every change to the State happens under `lock`,
and readers hold it too, so a read never sees a record half applied.

Determinism: a record carries the stamp the leader gave it (records.py); the record is run at
that stamp (execute.py) and expired keys are purged at it, so every node holds the same state
after the same records. `stamp` is the largest stamp applied and `index` counts the records
applied since the store began; both travel in snapshots.

Snapshots do not stall applies: `snapshot` (on the apply thread, between two records) only
opens a view of the state (state.SnapshotView) and copies WATCH's window of recent changes;
the function it returns writes the keys a chunk of SNAPSHOT_CHUNK at a time, taking the lock
for each chunk, while records go on being applied in between. A key changed before the
snapshot wrote it was copied as it was, so the snapshot holds the state of the moment it began.

Snapshot format (the bytes walkit.replicate stores in a ledger):

    snapshot := FORMAT:u8 index:u64 stamp:u64 forgotten:u64 touches:u32 (index:u64 key)* item* END:u8
    item     := type:u8 key expire_at:i64 payload        (expire_at 0: no expiry)
    payload  := value                                      string (type 0)
              | count:u32 (field value)*                  hash (1)
              | count:u32 element*                        list (2)
              | count:u32 member*                         set (3)
              | count:u32 (member score:f64)*             sorted set (4)
    key, value, field, element, member := length:u32 bytes

Format 1 (strings only: count:u64 then key value expire_at items, no touches) is still read.
"""

from __future__ import annotations

import struct
import threading
import time
from typing import BinaryIO, Callable

import walkit
from walkit.adapters.kv import commands  # noqa: F401 - registers every command the records run
from walkit.adapters.kv.execute import run_record
from walkit.adapters.kv.records import decode
from walkit.adapters.kv.state import Hash, List, SetValue, State, ZSet
from walkit.errors import WalkitError

#: The snapshot format written; restore reads it and format 1.
FORMAT = 2
#: Expired keys purged after each record, at most (the rest go with later records).
PURGE_PER_RECORD = 16
#: Keys written to a snapshot per turn of the lock.
SNAPSHOT_CHUNK = 1000
#: Bytes of items written to the snapshot buffer at a time.
WRITE_BYTES = 1 << 20

_HEADER_V1 = struct.Struct(">BQQQ")
_HEADER = struct.Struct(">BQQQI")
_LEN = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_ITEM = struct.Struct(">q")
_SCORE = struct.Struct(">d")
_KIND_LEN = struct.Struct(">BI")
_EXPIRE_LEN = struct.Struct(">qI")
STRING, HASH, LIST, SET, ZSET, END = 0, 1, 2, 3, 4, 0xFF
_TYPE_OF = {bytes: STRING, Hash: HASH, List: LIST, SetValue: SET, ZSet: ZSET}


class SnapshotFormatError(WalkitError):
    """SnapshotFormatError is raised by restore for bytes that are not a KV snapshot of a known format."""


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
        self.scripts = None                     # the Lua interpreter, once a script ran (scripting.py)

    def apply(self, record: bytes, position: walkit.Position):
        """apply runs one stamped record and returns its reply value (a ReplyError for a failed command).

        A record that does not decode raises RecordError, on every node alike, and changes nothing.
        """
        decoded = decode(record)
        stamp = decoded.stamp
        state = self.state
        with self.lock:
            self.index += 1
            state.applying = self.index
            result = run_record(self, decoded)
            state.purge_expired(stamp, PURGE_PER_RECORD)
            if stamp > self.stamp:
                self.stamp = stamp
        self.position = position
        self.last_apply = time.monotonic()
        return result

    def snapshot(self, out: BinaryIO) -> Callable[[], None]:
        """snapshot opens a view of the state now (between two records) and returns the function that
        writes it to `out`, a chunk at a time, while records are applied (see the module doc)."""
        state = self.state
        view = state.open_view()
        forgotten, touches = state.touch_window()
        index, stamp = self.index, self.stamp
        self.snapshots += 1
        self.snapshot_taken_at = self.position

        def persist() -> None:
            """persist writes the snapshot (on the node's snapshot thread)."""
            try:
                write_snapshot(out, index, stamp, forgotten, touches, self._chunks(state, view, stamp))
            finally:
                with self.lock:
                    state.close_view(view)
        return persist

    def _chunks(self, state: State, view, stamp: int):
        """_chunks yields the encoded items of a snapshot, encoding each chunk under the lock."""
        done = False
        while not done:
            parts: list[bytes] = []

            def emit(key: bytes, value, expire_at: int) -> None:
                if not 0 < expire_at <= stamp:
                    parts.append(encode_item(key, value, expire_at))
            with self.lock:
                done = view.chunk(SNAPSHOT_CHUNK, emit)
            yield b"".join(parts)

    def restore(self, src: BinaryIO) -> None:
        """restore replaces the state with the one a snapshot holds."""
        state, index, stamp = read_snapshot(src.read())
        with self.lock:
            self.state, self.index, self.stamp = state, index, max(self.stamp, stamp)
        self.last_apply = time.monotonic()


def _field(data: bytes) -> bytes:
    return _LEN.pack(len(data)) + data


def encode_item(key: bytes, value, expire_at: int) -> bytes:
    """encode_item is the bytes of one snapshot item."""
    kind = _TYPE_OF[type(value)]
    if kind == STRING:                          # the common case, without a list
        return _KIND_LEN.pack(kind, len(key)) + key + _EXPIRE_LEN.pack(expire_at, len(value)) + value
    parts = [bytes((kind,)), _field(key), _ITEM.pack(expire_at)]
    if kind == HASH:
        parts.append(_LEN.pack(len(value)))
        for field, item in value.items():
            parts += (_field(field), _field(item))
    elif kind == ZSET:
        parts.append(_LEN.pack(len(value)))
        for score, member in value.order:
            parts += (_field(member), _SCORE.pack(score))
    else:
        parts.append(_LEN.pack(len(value)))
        parts += map(_field, value)
    return b"".join(parts)


def write_snapshot(out: BinaryIO, index: int, stamp: int, forgotten: int, touches, chunks) -> None:
    """write_snapshot writes a snapshot: its header, WATCH's window, then the encoded item chunks."""
    parts = [_HEADER.pack(FORMAT, index, stamp, forgotten, len(touches))]
    for key, at in touches:
        parts += (_U64.pack(at), _field(key))
    out.write(b"".join(parts))
    pending, size = [], 0
    for chunk in chunks:
        pending.append(chunk)
        size += len(chunk)
        if size >= WRITE_BYTES:
            out.write(b"".join(pending))
            pending, size = [], 0
    pending.append(bytes((END,)))
    out.write(b"".join(pending))


class _Reader:
    def __init__(self, data: bytes, at: int) -> None:
        self.data, self.at = data, at

    def take(self, layout: struct.Struct):
        (value,) = layout.unpack_from(self.data, self.at)
        self.at += layout.size
        return value

    def field(self) -> bytes:
        length = self.take(_LEN)
        end = self.at + length
        if end > len(self.data):
            raise struct.error("a field runs past the end")
        value = self.data[self.at:end]
        self.at = end
        return value


def read_snapshot(data: bytes) -> tuple[State, int, int]:
    """read_snapshot decodes a snapshot (format 2, or 1): (state, index, stamp)."""
    if data[:1] == b"\x01":
        return read_items_v1(data)
    try:
        version, index, stamp, forgotten, count = _HEADER.unpack_from(data, 0)
    except struct.error:
        raise SnapshotFormatError("a KV snapshot of %d bytes is too short for its header" % len(data)) from None
    if version != FORMAT:
        raise SnapshotFormatError(f"KV snapshot format {version} is neither {FORMAT} nor 1")
    reader = _Reader(data, _HEADER.size)
    items = []
    try:
        touches = []
        for _ in range(count):
            at = reader.take(_U64)
            touches.append((reader.field(), at))
        while True:
            kind = data[reader.at]
            reader.at += 1
            if kind == END:
                break
            key = reader.field()
            expire_at = reader.take(_ITEM)
            if kind == STRING:
                value = reader.field()
            elif kind == HASH:
                value = Hash((reader.field(), reader.field()) for _ in range(reader.take(_LEN)))
            elif kind == LIST:
                value = List(reader.field() for _ in range(reader.take(_LEN)))
            elif kind == SET:
                value = SetValue(reader.field() for _ in range(reader.take(_LEN)))
            elif kind == ZSET:
                value = ZSet([(score, member) for member, score in
                              ((reader.field(), reader.take(_SCORE)) for _ in range(reader.take(_LEN)))])
            else:
                raise SnapshotFormatError(f"a KV snapshot item of unknown type {kind}")
            items.append((key, value, expire_at))
    except (struct.error, IndexError):
        raise SnapshotFormatError(f"a KV snapshot ends inside item {len(items) + 1}") from None
    if reader.at != len(data):
        raise SnapshotFormatError(f"a KV snapshot has {len(data) - reader.at} bytes after its end")
    return State.from_items(items, (forgotten, touches)), index, stamp


def read_items_v1(data: bytes) -> tuple[State, int, int]:
    """read_items_v1 decodes a format 1 snapshot (strings only): (state, index, stamp)."""
    try:
        _, index, stamp, count = _HEADER_V1.unpack_from(data, 0)
    except struct.error:
        raise SnapshotFormatError("a KV snapshot of %d bytes is too short for its header" % len(data)) from None
    reader = _Reader(data, _HEADER_V1.size)
    items = []
    try:
        for _ in range(count):
            items.append((reader.field(), reader.field(), reader.take(_ITEM)))
    except struct.error:
        raise SnapshotFormatError(f"a KV snapshot ends inside item {len(items)} of {count}") from None
    if reader.at != len(data):
        raise SnapshotFormatError(f"a KV snapshot has {len(data) - reader.at} bytes after its {count} items")
    # A format 1 store never watched: every watch from before it is broken.
    return State.from_items(items, (index, ())), index, stamp
