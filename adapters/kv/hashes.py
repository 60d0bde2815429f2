"""walkit.adapters.kv.hashes holds the commands of hash values: HSET, HGET, HINCRBY, HSCAN and their kin.

A Hash keeps its fields in insertion order, as redis-server's listpack does for a small hash,
so HGETALL, HKEYS, HVALS and HSCAN answer in Redis' order for hashes up to HASH_ENTRIES fields
(a larger Redis hash answers in its hash table's order, which nothing promises).

HSCAN returns a hash of up to limits.HASH_ENTRIES fields whole with cursor 0, as Redis returns a listpack;
a larger one is paged in scan order (keyspace.page_of), so the cursor means the same on every
server and never runs out.

HINCRBYFLOAT computes as redis-server's `long double` does (longdouble.py), so every node
computes the same digits on any machine.
"""

from __future__ import annotations

from fractions import Fraction

from walkit.adapters.kv.longdouble import LongDouble
from walkit.adapters.kv.keyspace import page_of, parse_cursor, scan_options
from walkit.adapters.kv.limits import HASH_ENTRIES
from walkit.adapters.kv.patterns import compile_pattern
from walkit.adapters.kv.resp import OK, Pairs, ReplyError
from walkit.adapters.kv.state import INT64_MAX, INT64_MIN, Hash, parse_int
from walkit.adapters.kv.table import READ, SYNTAX, WRITE, command, integer, random_count

#: The largest count HRANDFIELD serves. Redis has no such bound without WITHVALUES and would
#: build any reply it is asked for; a larger count is refused rather than exhaust the memory.
MAX_RANDOM_COUNT = 1 << 24


def _arity(name: str) -> ReplyError:
    """_arity is Redis' error for a command given a wrong number of arguments."""
    return ReplyError(f"ERR wrong number of arguments for '{name}' command")


def _pairs(args, at: int, name: str) -> list[tuple[bytes, bytes]]:
    """_pairs reads the field value pairs from args[at:] (an odd count is a wrong number of arguments)."""
    if (len(args) - at) % 2:
        raise _arity(name)
    return list(zip(args[at::2], args[at + 1::2]))


@command("HSET", -4, WRITE)
def hset(ctx, args):
    """hset runs HSET key field value [field value...]: how many fields were created."""
    pairs = _pairs(args, 2, "hset")
    value = ctx.state.writable(args[1], ctx.now, Hash)
    created = len(value)
    value.update(pairs)
    return len(value) - created


@command("HMSET", -4, WRITE)
def hmset(ctx, args):
    """hmset runs HMSET key field value [field value...]: HSET answering OK."""
    pairs = _pairs(args, 2, "hmset")
    ctx.state.writable(args[1], ctx.now, Hash).update(pairs)
    return OK


@command("HSETNX", 4, WRITE)
def hsetnx(ctx, args):
    """hsetnx runs HSETNX key field value: 1 if the field was created, 0 if it existed (unchanged)."""
    value = ctx.state.get_typed(args[1], ctx.now, Hash)
    if value is not None and args[2] in value:
        return 0
    ctx.state.writable(args[1], ctx.now, Hash)[args[2]] = args[3]
    return 1


@command("HGET", 3, READ)
def hget(ctx, args):
    """hget answers HGET key field: the value, or nil."""
    value = ctx.state.get_typed(args[1], ctx.now, Hash)
    return None if value is None else value.get(args[2])


@command("HMGET", -3, READ)
def hmget(ctx, args):
    """hmget answers HMGET key field...: the values, nil for absent fields."""
    value = ctx.state.get_typed(args[1], ctx.now, Hash) or {}
    return [value.get(field) for field in args[2:]]


@command("HGETALL", 2, READ)
def hgetall(ctx, args):
    """hgetall answers HGETALL key: every field and value (a map in RESP3)."""
    value = ctx.state.get_typed(args[1], ctx.now, Hash)
    return {} if value is None else dict(value)


@command("HKEYS", 2, READ)
def hkeys(ctx, args):
    """hkeys answers HKEYS key: every field."""
    value = ctx.state.get_typed(args[1], ctx.now, Hash)
    return [] if value is None else list(value)


@command("HVALS", 2, READ)
def hvals(ctx, args):
    """hvals answers HVALS key: every value."""
    value = ctx.state.get_typed(args[1], ctx.now, Hash)
    return [] if value is None else list(value.values())


@command("HLEN", 2, READ)
def hlen(ctx, args):
    """hlen answers HLEN key: the number of fields (0 if absent)."""
    value = ctx.state.get_typed(args[1], ctx.now, Hash)
    return 0 if value is None else len(value)


@command("HEXISTS", 3, READ)
def hexists(ctx, args):
    """hexists answers HEXISTS key field: 1 if the field exists, else 0."""
    value = ctx.state.get_typed(args[1], ctx.now, Hash)
    return int(value is not None and args[2] in value)


@command("HSTRLEN", 3, READ)
def hstrlen(ctx, args):
    """hstrlen answers HSTRLEN key field: the length of the value (0 if absent)."""
    value = ctx.state.get_typed(args[1], ctx.now, Hash)
    return 0 if value is None else len(value.get(args[2], b""))


@command("HDEL", -3, WRITE)
def hdel(ctx, args):
    """hdel runs HDEL key field...: how many fields were removed; the key goes with its last field."""
    state, key = ctx.state, args[1]
    value = state.get_typed(key, ctx.now, Hash)
    if value is None or not any(field in value for field in args[2:]):
        return 0
    value = state.writable(key, ctx.now, Hash, create=False)
    removed = sum(1 for field in args[2:] if value.pop(field, None) is not None)
    state.drop_if_empty(key)
    return removed


@command("HINCRBY", 4, WRITE)
def hincrby(ctx, args):
    """hincrby runs HINCRBY key field n: the field's new value (an absent field counts as 0)."""
    delta = integer(args[3])
    value = ctx.state.get_typed(args[1], ctx.now, Hash)
    old = None if value is None else value.get(args[2])
    current = 0 if old is None else parse_int(old)
    if current is None:
        raise ReplyError("ERR hash value is not an integer")
    result = current + delta
    if not INT64_MIN <= result <= INT64_MAX:
        raise ReplyError("ERR increment or decrement would overflow")
    ctx.state.writable(args[1], ctx.now, Hash)[args[2]] = b"%d" % result
    return result


@command("HINCRBYFLOAT", 4, WRITE)
def hincrbyfloat(ctx, args):
    """hincrbyfloat runs HINCRBYFLOAT key field x: the field's new value, computed as a long double."""
    delta = LongDouble.parse(args[3])
    if delta is None:
        raise ReplyError("ERR value is not a valid float")
    if isinstance(delta, float):
        raise ReplyError("ERR value is NaN or Infinity")
    value = ctx.state.get_typed(args[1], ctx.now, Hash)
    old = None if value is None else value.get(args[2])
    current = Fraction(0) if old is None else LongDouble.parse(old)
    if current is None:
        raise ReplyError("ERR hash value is not a float")
    result = current if isinstance(current, float) else LongDouble.round(current + delta)
    if isinstance(result, float):
        raise ReplyError("ERR increment would produce NaN or Infinity")
    text = LongDouble.format(result)
    ctx.state.writable(args[1], ctx.now, Hash)[args[2]] = text
    return text


@command("HRANDFIELD", -2, READ)
def hrandfield(ctx, args):
    """hrandfield answers HRANDFIELD key [count [WITHVALUES]]: random fields (a negative count may repeat them).

    WITHVALUES answers Pairs: flat in RESP2, [field, value] arrays in RESP3, as redis-server does.
    """
    if len(args) == 2:
        value = ctx.state.get_typed(args[1], ctx.now, Hash)
        return None if value is None else ctx.random.choice(list(value))
    count = random_count(args[2])
    if len(args) > 4 or (len(args) == 4 and args[3].upper() != b"WITHVALUES"):
        raise ReplyError(SYNTAX)
    with_values = len(args) == 4
    if with_values and not -(INT64_MAX // 2) <= count <= INT64_MAX // 2:
        raise ReplyError("ERR value is out of range")
    value = ctx.state.get_typed(args[1], ctx.now, Hash)
    if value is None or count == 0:
        return []
    items, pick = list(value.items()), ctx.random
    if count >= len(items):
        chosen = items
    elif count > 0:
        chosen = pick.sample(items, count)
    elif -count > MAX_RANDOM_COUNT:
        raise ReplyError(f"ERR value is out of range, a negative count is at most {MAX_RANDOM_COUNT} here")
    else:
        chosen = pick.choices(items, k=-count)
    if with_values:
        return Pairs(part for pair in chosen for part in pair)
    return [field for field, _ in chosen]


@command("HSCAN", -3, READ)
def hscan(ctx, args):
    """hscan answers HSCAN key cursor [MATCH p] [COUNT n]: the next cursor and some fields with their values."""
    cursor = parse_cursor(args[2])
    value = ctx.state.get_typed(args[1], ctx.now, Hash)
    if value is None:
        return [b"0", []]
    pattern, count, _ = scan_options(args, 3)
    if len(value) <= HASH_ENTRIES:
        fields, following = list(value), 0
    else:
        fields, following = page_of(ctx.state.scan_index(args[1], value), cursor, count)
    match = compile_pattern(pattern).match if pattern is not None else None
    found = []
    for field in fields:
        if match is None or match(field):
            found += (field, value[field])
    return [b"%d" % following, found]
