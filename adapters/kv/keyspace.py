"""walkit.adapters.kv.keyspace holds the commands about keys of any type: DEL, TTL, EXPIRE, RENAME, COPY, SCAN...

SCAN's cursor is a position in scan order (state.scan_order: a key's 64-bit hash, then the key),
as redis-server's cursor is a position in its hash table: 0 starts, 0 ends, and any other cursor
is where the next call begins. Every server orders the same keys alike, so a cursor means the
same on every server and never runs out: a scan goes on across a failover or on another server,
and keys that exist throughout it are returned (once, unless a key is deleted and created again
meanwhile), as Redis promises. A cursor is an unsigned 64-bit number, as clients expect
(redis-cli and go-redis read it into a uint64). HSCAN, SSCAN and ZSCAN page a large collection
the same way (`page_of`).

EXPIRE and its kin decide at the record's stamp (ctx.now), on every node alike: a time at or
before it deletes the key, as redis-server 7.0 does on a primary. OBJECT ENCODING names what
redis-server 7.0 would use for the value as it is now (`encoding_of`); Redis also remembers how
a value was made (APPEND leaves "raw", a hash that grew past the listpack limits stays a
"hashtable" when it shrinks), which walkit does not keep.
"""

from __future__ import annotations

import bisect
import re

from walkit.adapters.kv.limits import HASH_ENTRIES, INTSET_ENTRIES, LISTPACK_VALUE, ZSET_ENTRIES
from walkit.adapters.kv.resp import OK, ReplyError, Simple
from walkit.adapters.kv.state import (
    INT64_MAX, Hash, List, SetValue, ZSet, parse_int, type_name,
)
from walkit.adapters.kv.table import READ, SYNTAX, WRITE, command, integer

INVALID_CURSOR = "ERR invalid cursor"
#: The last position of the scan order (a cursor is 64 bits).
MAX_CURSOR = (1 << 64) - 1


def parse_cursor(text: bytes) -> int:
    """parse_cursor reads a SCAN cursor as redis-server does (strtoul: a sign is allowed, a negative
    cursor wraps); ERR invalid cursor for anything else."""
    if not _CURSOR.match(text):
        raise ReplyError(INVALID_CURSOR)
    value = int(text)
    if abs(value) >= 1 << 64:
        raise ReplyError(INVALID_CURSOR)
    return value % (1 << 64)


_CURSOR = re.compile(rb"[+-]?[0-9]{1,25}\Z")


def page_of(index: list[bytes], cursor: int, count: int) -> tuple[list[bytes], int]:
    """page_of pages a collection's fields or members in scan order, given their sorted scan orders
    (State.scan_index): those from `cursor` on, about `count` of them (names sharing a position
    come together), and the cursor after them (0: none)."""
    start = bisect.bisect_left(index, cursor.to_bytes(8, "big"))
    end = start + count
    if end < len(index):
        edge = int.from_bytes(index[end - 1][:8], "big")
        end = len(index) if edge == MAX_CURSOR else bisect.bisect_left(index, (edge + 1).to_bytes(8, "big"))
    page = [order[8:] for order in index[start:end]]
    return page, int.from_bytes(index[end][:8], "big") if end < len(index) else 0


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
    cursor = parse_cursor(args[1])
    pattern, count, kind = scan_options(args, 2, types=True)
    found, following = ctx.state.scan(cursor, count, pattern, ctx.now, kind)
    return [b"%d" % following, found]


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


# -- expiry ------------------------------------------------------------------------------------
def expiry_of(state, key: bytes) -> int | None:
    """expiry_of is when `key` (which is alive) expires, in ms since the epoch (None: never)."""
    return state.expires.get(key)


def invalid_expire(args) -> ReplyError:
    """invalid_expire is Redis' error for an expire time out of range, naming the command."""
    return ReplyError(f"ERR invalid expire time in '{args[0].decode('utf-8', 'replace').lower()}' command")


_EXPIRE_FLAGS = (b"NX", b"XX", b"GT", b"LT")


def expire_flags(args) -> set[bytes]:
    """expire_flags reads EXPIRE's NX, XX, GT and LT from args[3:], refusing the combinations Redis refuses."""
    flags = set()
    for option in args[3:]:
        flag = option.upper()
        if flag not in _EXPIRE_FLAGS:
            raise ReplyError(f"ERR Unsupported option {option.decode('utf-8', 'replace')}")
        flags.add(flag)
    if b"NX" in flags and len(flags) > 1:
        raise ReplyError("ERR NX and XX, GT or LT options at the same time are not compatible")
    if b"GT" in flags and b"LT" in flags:
        raise ReplyError("ERR GT and LT options at the same time are not compatible")
    return flags


def expire_generic(ctx, args, base: int, scale: int) -> int:
    """expire_generic runs EXPIRE and its kin as redis-server 7.0's expireGenericCommand: the time is
    args[2] units of `scale` ms after `base`; 1 if the expiry was set (or the key deleted, for a
    time not after now), 0 if the key is absent or a flag said no."""
    flags = expire_flags(args)
    when = integer(args[2])
    if scale != 1:
        if not -(INT64_MAX // scale) <= when <= INT64_MAX // scale:
            raise invalid_expire(args)
        when *= scale
    if when > INT64_MAX - base:
        raise invalid_expire(args)
    when += base
    state, key = ctx.state, args[1]
    if not state.alive(key, ctx.now):
        return 0
    current = expiry_of(state, key)
    if ((b"NX" in flags and current is not None) or (b"XX" in flags and current is None)
            or (b"GT" in flags and (current is None or when <= current))
            or (b"LT" in flags and current is not None and when >= current)):
        return 0
    if when <= ctx.now:
        state.remove(key)
    else:
        state.set_expiry(key, when)
    return 1


@command("EXPIRE", -3, WRITE)
def expire(ctx, args):
    """expire runs EXPIRE key seconds [NX|XX|GT|LT]."""
    return expire_generic(ctx, args, ctx.now, 1000)


@command("PEXPIRE", -3, WRITE)
def pexpire(ctx, args):
    """pexpire runs PEXPIRE key milliseconds [NX|XX|GT|LT]."""
    return expire_generic(ctx, args, ctx.now, 1)


@command("EXPIREAT", -3, WRITE)
def expireat(ctx, args):
    """expireat runs EXPIREAT key unix-seconds [NX|XX|GT|LT]."""
    return expire_generic(ctx, args, 0, 1000)


@command("PEXPIREAT", -3, WRITE)
def pexpireat(ctx, args):
    """pexpireat runs PEXPIREAT key unix-milliseconds [NX|XX|GT|LT]."""
    return expire_generic(ctx, args, 0, 1)


@command("PERSIST", 2, WRITE)
def persist(ctx, args):
    """persist runs PERSIST key: 1 if the key lost its expiry, 0 if absent or without one."""
    state, key = ctx.state, args[1]
    if not state.alive(key, ctx.now) or expiry_of(state, key) is None:
        return 0
    state.set_expiry(key, None)
    return 1


@command("EXPIRETIME", 2, READ)
def expiretime(ctx, args):
    """expiretime answers EXPIRETIME key: when it expires in unix seconds (rounded), -1 without expiry, -2 if absent."""
    at = pexpiretime(ctx, args)
    return at if at < 0 else (at + 500) // 1000


@command("PEXPIRETIME", 2, READ)
def pexpiretime(ctx, args):
    """pexpiretime answers PEXPIRETIME key: when it expires in unix ms, -1 without expiry, -2 if absent."""
    state, key = ctx.state, args[1]
    if not state.alive(key, ctx.now):
        return -2
    at = expiry_of(state, key)
    return -1 if at is None else max(at, 0)


# -- moving keys -------------------------------------------------------------------------------
def rename_generic(ctx, args, nx: bool):
    """rename_generic runs RENAME (and RENAMENX, `nx`): the value moves with its expiry."""
    state, source, target = ctx.state, args[1], args[2]
    value = state.lookup(source, ctx.now)
    if value is None:
        raise ReplyError("ERR no such key")
    if source == target:
        return 0 if nx else OK
    if nx and state.alive(target, ctx.now):
        return 0
    state.store(target, value, expiry_of(state, source))
    state.remove(source)
    return 1 if nx else OK


@command("RENAME", 3, WRITE)
def rename(ctx, args):
    """rename runs RENAME key newkey: ERR no such key if absent; newkey is replaced."""
    return rename_generic(ctx, args, nx=False)


@command("RENAMENX", 3, WRITE)
def renamenx(ctx, args):
    """renamenx runs RENAMENX key newkey: 1 if renamed, 0 if newkey exists."""
    return rename_generic(ctx, args, nx=True)


@command("COPY", -3, WRITE)
def copy(ctx, args):
    """copy runs COPY source destination [DB 0] [REPLACE]: 1 if copied (with its expiry), 0 otherwise.

    Only database 0 exists (as SELECT says), so DB with any other index is out of range.
    """
    replace, i = False, 3
    while i < len(args):
        option = args[i].upper()
        if option == b"REPLACE":
            replace = True
        elif option == b"DB" and i + 1 < len(args):
            db = integer(args[i + 1])
            if not -(1 << 31) <= db < 1 << 31:          # redis-server reads an int
                raise ReplyError("ERR value is out of range, value must between -2147483648 and 2147483647")
            if db != 0:
                raise ReplyError("ERR DB index is out of range")
            i += 1
        else:
            raise ReplyError(SYNTAX)
        i += 1
    state, source, target = ctx.state, args[1], args[2]
    if source == target:
        raise ReplyError("ERR source and destination objects are the same")
    value = state.lookup(source, ctx.now)
    if value is None or (state.alive(target, ctx.now) and not replace):
        return 0
    state.store(target, value if type(value) is bytes else value.copy(), expiry_of(state, source))
    return 1


@command("RANDOMKEY", 1, READ)
def randomkey(ctx, args):
    """randomkey answers RANDOMKEY: a live key picked at random, nil if there is none."""
    state, now = ctx.state, ctx.now
    if state.size(now) == 0:
        return None
    data, pick = state.data, ctx.random
    for _ in range(64):
        key = data.peekitem(pick.randrange(len(data)))[0]
        if state.alive(key, now):
            return key
    return pick.choice([key for key in data if state.alive(key, now)])    # mostly expired keys


# -- OBJECT ------------------------------------------------------------------------------------
#: The refcount redis-server reports for a shared integer (0 to 9999): INT_MAX.
SHARED_REFCOUNT, SHARED_INTEGERS = 2147483647, 10000
_OBJECT_ARITY = {b"ENCODING": 3, b"FREQ": 3, b"IDLETIME": 3, b"REFCOUNT": 3, b"HELP": 2}
_OBJECT_HELP = (
    "OBJECT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "ENCODING <key>",
    "    Return the kind of internal representation used in order to store the value",
    "    associated with a <key>.",
    "FREQ <key>",
    "    Return the access frequency index of the <key>. The returned integer is",
    "    proportional to the logarithm of the recent access frequency of the key.",
    "IDLETIME <key>",
    "    Return the idle time of the <key>, that is the approximated number of",
    "    seconds elapsed since the last access to the key.",
    "REFCOUNT <key>",
    "    Return the number of references of the value associated with the specified",
    "    <key>.",
    "HELP",
    "    Prints this help.",
)


def encoding_of(value) -> bytes:
    """encoding_of is what redis-server 7.0's OBJECT ENCODING would answer for a value made by SET (or
    HSET, RPUSH...) with the default limits of the small encodings."""
    kind = type(value)
    if kind is bytes:
        if len(value) <= 20 and parse_int(value) is not None:
            return b"int"
        return b"embstr" if len(value) <= 44 else b"raw"
    if kind is List:
        return b"quicklist"
    if kind is Hash:
        small = len(value) <= HASH_ENTRIES and all(
            len(field) <= LISTPACK_VALUE and len(item) <= LISTPACK_VALUE for field, item in value.items())
        return b"listpack" if small else b"hashtable"
    if kind is SetValue:
        small = len(value) <= INTSET_ENTRIES and all(parse_int(member) is not None for member in value)
        return b"intset" if small else b"hashtable"
    if kind is ZSet:
        small = len(value) <= ZSET_ENTRIES and all(len(member) <= LISTPACK_VALUE for member in value.scores)
        return b"listpack" if small else b"skiplist"
    raise AssertionError(f"no encoding for {kind.__name__}")


@command("OBJECT", -2, READ)
def object_(ctx, args):
    """object_ answers OBJECT ENCODING|FREQ|IDLETIME|REFCOUNT key and OBJECT HELP.

    IDLETIME is 0 (walkit does not track accesses), FREQ answers as redis-server does without an
    LFU policy, REFCOUNT is redis-server's for a shared integer and 1 otherwise.
    """
    sub = args[1].upper()
    if sub not in _OBJECT_ARITY:
        raise ReplyError(f"ERR unknown subcommand '{args[1][:128].decode('utf-8', 'replace')}'. "
                         f"Try {args[0].upper().decode('utf-8', 'replace')} HELP.")
    if len(args) != _OBJECT_ARITY[sub]:
        raise ReplyError(f"ERR wrong number of arguments for 'object|{sub.lower().decode()}' command")
    if sub == b"HELP":
        return [Simple(line) for line in _OBJECT_HELP]
    value = ctx.state.lookup(args[2], ctx.now)
    if value is None:
        return None
    if sub == b"ENCODING":
        return encoding_of(value)
    if sub == b"FREQ":
        raise ReplyError("ERR An LFU maxmemory policy is not selected, access frequency not tracked. Please note "
                         "that when switching between policies at runtime LRU and LFU data will take some time "
                         "to adjust.")
    if sub == b"IDLETIME":
        return 0
    number = parse_int(value) if type(value) is bytes and len(value) <= 20 else None
    return SHARED_REFCOUNT if number is not None and 0 <= number < SHARED_INTEGERS else 1
