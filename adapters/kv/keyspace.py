"""walkit.adapters.kv.keyspace holds the commands about keys of any type: DEL, EXISTS, TTL, TYPE, KEYS, SCAN...

SCAN's cursor names the last key it visited (`cursor_of`): 0 starts, 0 ends, and any other
cursor is the key's bytes as a number. So a cursor means the same on every server (they hold
the same keys in the same order) and never runs out: a scan goes on across a failover or on
another server, and keys that exist throughout it are returned (once, unless a key is
deleted and created again meanwhile), as Redis promises.
"""

from __future__ import annotations

from walkit.adapters.kv.resp import OK, ReplyError, Simple
from walkit.adapters.kv.state import type_name
from walkit.adapters.kv.table import READ, SYNTAX, WRITE, command, integer

INVALID_CURSOR = "ERR invalid cursor"


def cursor_of(key: bytes | None) -> bytes:
    """cursor_of is the cursor that continues after `key` (None: the scan is over, cursor 0)."""
    return b"0" if key is None else b"%d" % int.from_bytes(b"\x01" + key, "big")


def key_of_cursor(cursor: bytes) -> bytes | None:
    """key_of_cursor is the key a cursor continues after (None for 0); ERR invalid cursor otherwise."""
    if cursor == b"0":
        return None
    if not cursor.isdigit() or cursor.startswith(b"0"):
        raise ReplyError(INVALID_CURSOR)
    number = int(cursor)
    raw = number.to_bytes((number.bit_length() + 7) // 8, "big")
    if raw[:1] != b"\x01":
        raise ReplyError(INVALID_CURSOR)
    return raw[1:]


def scan_options(args, at: int, *, types: bool = False) -> tuple[bytes | None, int, str | None]:
    """scan_options reads [MATCH pattern] [COUNT n] [TYPE t] from args[at:]: (pattern, count, type)."""
    pattern, count, kind = None, 10, None
    while at < len(args):
        option = args[at].upper()
        if at + 1 >= len(args):
            raise ReplyError(SYNTAX)
        value = args[at + 1]
        if option == b"MATCH":
            pattern = None if value == b"*" else value
        elif option == b"COUNT":
            count = integer(value)
            if count < 1:
                raise ReplyError(SYNTAX)
        elif option == b"TYPE" and types:
            kind = value.decode("utf-8", "replace").lower()
        else:
            raise ReplyError(SYNTAX)
        at += 2
    return pattern, count, kind


@command("EXISTS", -2, READ)
def exists(ctx, args):
    """exists answers EXISTS key...: how many of the keys exist (repeats count again)."""
    state, now = ctx.state, ctx.now
    return sum(1 for key in args[1:] if state.alive(key, now))


@command("TTL", 2, READ)
def ttl(ctx, args):
    """ttl answers TTL key: seconds left, -1 without expiry, -2 if absent."""
    left = ctx.state.ttl_ms(args[1], ctx.now)
    return left if left < 0 else (left + 500) // 1000


@command("PTTL", 2, READ)
def pttl(ctx, args):
    """pttl answers PTTL key: milliseconds left, -1 without expiry, -2 if absent."""
    return ctx.state.ttl_ms(args[1], ctx.now)


@command("TYPE", 2, READ)
def type_(ctx, args):
    """type_ answers TYPE key: string, hash, list, set, zset, or none if absent."""
    value = ctx.state.lookup(args[1], ctx.now)
    return Simple("none" if value is None else type_name(value))


@command("KEYS", 2, READ)
def keys(ctx, args):
    """keys answers KEYS pattern: every live key matching a glob, in key order."""
    return ctx.state.keys(args[1], ctx.now)


@command("DBSIZE", 1, READ)
def dbsize(ctx, args):
    """dbsize answers DBSIZE: the number of live keys."""
    return ctx.state.size(ctx.now)


@command("SCAN", -2, READ)
def scan(ctx, args):
    """scan answers SCAN cursor [MATCH p] [COUNT n] [TYPE t]: the next cursor and some keys."""
    after = key_of_cursor(args[1])
    pattern, count, kind = scan_options(args, 2, types=True)
    found, last = ctx.state.scan(after, count, pattern, ctx.now, kind)
    return [cursor_of(last), found]


@command("DEL", -2, WRITE, "UNLINK")
def delete(ctx, args):
    """delete runs DEL key... (and UNLINK): how many of the keys existed."""
    state, now = ctx.state, ctx.now
    removed = 0
    for key in args[1:]:
        if state.alive(key, now):
            removed += 1
        state.remove(key)
    return removed


@command("FLUSHDB", -1, WRITE, "FLUSHALL")
def flushdb(ctx, args):
    """flushdb runs FLUSHDB [ASYNC|SYNC] (and FLUSHALL): every key goes."""
    if len(args) > 2 or (len(args) == 2 and args[1].upper() not in (b"ASYNC", b"SYNC")):
        raise ReplyError(SYNTAX)
    ctx.state.flush()
    return OK
