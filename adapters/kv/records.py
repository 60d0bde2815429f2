"""walkit.adapters.kv.records defines what the key-value store writes to its log, and its encoding.

A record is a write command, or a transaction, or a script, exactly as the client sent it, with
the leader's clock stamped on it. Every node applies it by running the same command at that
stamp (execute.py), so the leader and its followers compute the same state and the same replies:

    record  := FORMAT:u8 stamp_ms:u64 kind:u8 body
    COMMAND := command                                   (one write command, EVAL included)
    EXEC    := watches:u32 watch* commands:u32 command*  (MULTI ... EXEC: all or nothing)
    watch   := key index:u64 alive:u8                    (WATCH key, seen at `index` records applied)
    command := argc:u32 arg*
    key, arg := length:u32 bytes

Integers are big-endian. The leader stamps each record with its clock, never earlier than any
stamp it applied or handed out, so stamps never go back, also across leaders; relative expiry
times (SET EX, EXPIRE) and a script's clock are read from the stamp, so applying is
deterministic. A transaction or a script is one record: a crash applies all of it or none.

Format 2 (before transactions and data types) wrote one change per record (SET, INCRBY, DEL,
MSET, FLUSH); `decode` still reads it, as the command that change was, so a store written by an
older walkit replays unchanged.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

#: The record format written; decode reads it and FORMAT_V2.
FORMAT = 3
FORMAT_V2 = 2

KIND_COMMAND, KIND_EXEC = 1, 2

_HEADER = struct.Struct(">BQB")
_U32 = struct.Struct(">I")
_WATCH = struct.Struct(">QB")


class Watch(NamedTuple):
    """Watch is one WATCHed key: the records the leader had applied when WATCH ran, and whether the key was alive."""

    key: bytes
    index: int
    alive: bool


class Record(NamedTuple):
    """Record is what one log record says: run `commands` at `stamp`.

    `multi` marks MULTI ... EXEC: the reply is the list of the commands' replies, or None (a nil
    array) if a watched key changed since it was watched.
    """

    stamp: int
    commands: tuple[tuple[bytes, ...], ...]
    multi: bool = False
    watches: tuple[Watch, ...] = ()


class RecordError(ValueError):
    """RecordError is raised for bytes that are not a valid record."""


def _command(args) -> bytes:
    pack = _U32.pack
    return pack(len(args)) + b"".join([pack(len(arg)) + arg for arg in args])


def encode(record: Record) -> bytes:
    """encode returns the bytes of `record`."""
    if not record.multi:
        if len(record.commands) != 1 or record.watches:
            raise ValueError("a record that is not a transaction holds exactly one command and no watch")
        return _HEADER.pack(FORMAT, record.stamp, KIND_COMMAND) + _command(record.commands[0])
    parts = [_HEADER.pack(FORMAT, record.stamp, KIND_EXEC), _U32.pack(len(record.watches))]
    for watch in record.watches:
        parts += (_U32.pack(len(watch.key)), watch.key, _WATCH.pack(watch.index, watch.alive))
    parts.append(_U32.pack(len(record.commands)))
    parts += map(_command, record.commands)
    return b"".join(parts)


def command_record(stamp: int, args) -> bytes:
    """command_record is the bytes of one write command stamped `stamp` (the common case, without a Record)."""
    return _HEADER.pack(FORMAT, stamp, KIND_COMMAND) + _command(args)


def decode(data: bytes) -> Record:
    """decode returns the Record of bytes written by `encode` (or by format 2); RecordError if malformed."""
    if data[:1] == bytes((FORMAT_V2,)):
        return _decode_v2(data)
    try:
        version, stamp, kind = _HEADER.unpack_from(data, 0)
    except struct.error:
        raise RecordError("truncated record header") from None
    if version != FORMAT:
        raise RecordError(f"unknown record format {version}")
    try:
        if kind == KIND_COMMAND:                # the common case, in one pass
            args, at = _args(data, _HEADER.size)
            if at != len(data):
                raise RecordError(f"{len(data) - at} stray bytes after a record")
            return Record(stamp, (args,))
        if kind != KIND_EXEC:
            raise RecordError(f"unknown record kind {kind}")
        reader = _Reader(data, _HEADER.size)
        watches = []
        for _ in range(reader.u32()):
            key = reader.field()
            index, alive = reader.unpack(_WATCH)
            watches.append(Watch(key, index, bool(alive)))
        commands = []
        for _ in range(reader.u32()):
            args, reader.at = _args(data, reader.at)
            commands.append(args)
    except struct.error as exc:
        raise RecordError(f"truncated record: {exc}") from None
    if reader.at != len(data):
        raise RecordError(f"{len(data) - reader.at} stray bytes after a record")
    return Record(stamp, tuple(commands), True, tuple(watches))


def _args(data: bytes, at: int) -> tuple[tuple[bytes, ...], int]:
    """_args reads one command (argc:u32 then the arguments) at `at`: (the arguments, the offset after)."""
    unpack, size = _U32.unpack_from, len(data)
    (count,) = unpack(data, at)
    at += 4
    if count == 0 or count > size:
        raise RecordError(f"a command of {count} arguments")
    args = []
    for _ in range(count):
        (length,) = unpack(data, at)
        at += 4
        end = at + length
        if end > size:
            raise RecordError("a field runs past the end of the record")
        args.append(data[at:end])
        at = end
    return tuple(args), at


class _Reader:
    def __init__(self, data: bytes, at: int) -> None:
        self.data, self.at = data, at

    def unpack(self, layout: struct.Struct) -> tuple:
        values = layout.unpack_from(self.data, self.at)
        self.at += layout.size
        return values

    def u32(self) -> int:
        (value,) = _U32.unpack_from(self.data, self.at)
        self.at += 4
        return value

    def field(self) -> bytes:
        length = self.u32()
        end = self.at + length
        if end > len(self.data):
            raise RecordError("a field runs past the end of the record")
        value = self.data[self.at:end]
        self.at = end
        return value



# -- format 2 ----------------------------------------------------------------------------------
_V2_OPS = {1: "SET", 2: "INCRBY", 3: "DEL", 4: "MSET", 5: "FLUSH"}
_V2_NX, _V2_XX, _V2_KEEPTTL, _V2_GET = 1, 2, 4, 8


def _decode_v2(data: bytes) -> Record:
    """_decode_v2 reads a format 2 record as the command its change was."""
    try:
        _, stamp = struct.unpack_from(">BQ", data, 0)
        op = data[9]
        reader = _Reader(data, 10)
        if op == 1:
            flags, expire_at = reader.unpack(struct.Struct(">Bq"))
            args = [b"SET", reader.field(), reader.field()]
            args += [name for bit, name in ((_V2_NX, b"NX"), (_V2_XX, b"XX"), (_V2_GET, b"GET"),
                                            (_V2_KEEPTTL, b"KEEPTTL")) if flags & bit]
            if expire_at:
                args += [b"PXAT", b"%d" % expire_at]
        elif op == 2:
            (delta,) = reader.unpack(struct.Struct(">q"))
            args = [b"INCRBY", reader.field(), b"%d" % delta]
        elif op in (3, 4):
            count = reader.u32()
            args = [b"DEL" if op == 3 else b"MSET", *(reader.field() for _ in range(count * (1 if op == 3 else 2)))]
        elif op == 5:
            args = [b"FLUSHALL"]
        else:
            raise RecordError(f"unknown record op {op}")
    except (struct.error, IndexError) as exc:
        raise RecordError(f"truncated record: {exc}") from None
    if reader.at != len(data):
        raise RecordError(f"{len(data) - reader.at} stray bytes after a record")
    return Record(stamp, (tuple(args),))
