"""walkit.adapters.kv.sets holds the commands of set values: SADD, SREM, SPOP, SINTER, SSCAN and their kin.

A Python set's order is not the same in two processes (bytes hashes are salted per process),
so nothing a write does may depend on it: SPOP picks with ctx.random among the members in
sorted order, and while a record is applied (a transaction, a script that goes on to write
what it read) every reply that lists members lists them sorted (`listed`). A read elsewhere
lists them in the set's own order, as Redis leaves that order to its hash tables.

SSCAN pages a set in scan order (keyspace.page_of), so any server continues its cursor; a set
of up to limits.SMALL_SCAN members is returned whole with cursor 0, as redis-server returns its small
encodings.
"""

from __future__ import annotations

from walkit.adapters.kv.hashes import MAX_RANDOM_COUNT
from walkit.adapters.kv.keyspace import page_of, parse_cursor, scan_options
from walkit.adapters.kv.limits import SMALL_SCAN
from walkit.adapters.kv.patterns import compile_pattern
from walkit.adapters.kv.resp import ReplyError, SetReply
from walkit.adapters.kv.state import SetValue, parse_int
from walkit.adapters.kv.table import READ, SYNTAX, WRITE, command, random_count

MUST_BE_POSITIVE = "ERR value is out of range, must be positive"


def positive(text: bytes, error: str = MUST_BE_POSITIVE) -> int:
    """positive reads a count of 0 or more (Redis' getPositiveLong), or raises `error`."""
    value = parse_int(text)
    if value is None or value < 0:
        raise ReplyError(error)
    return value


def repeats(count: int) -> int:
    """repeats is how many members a negative random count asks for (at most hashes.MAX_RANDOM_COUNT:
    Redis would build any reply it is asked for)."""
    if -count > MAX_RANDOM_COUNT:
        raise ReplyError(f"ERR value is out of range, a negative count is at most {MAX_RANDOM_COUNT} here")
    return -count


def listed(ctx, members) -> list:
    """listed lists `members` in sorted order while a record is applied, in their own order otherwise."""
    return sorted(members) if ctx.writing else list(members)


def scan_reply(ctx, args, cursor: int, members, visit) -> list:
    """scan_reply answers SSCAN and ZSCAN from `cursor` (args[2], read already) on the collection
    at args[1] of `members`: `visit(page)` turns the members visited that match into the reply's items."""
    pattern, count, _ = scan_options(args, 3)
    if len(members) <= SMALL_SCAN:
        page, following = list(members), 0
    else:
        page, following = page_of(ctx.state.scan_index(args[1], members), cursor, count)
    if pattern is not None:
        match = compile_pattern(pattern).match
        page = [m for m in page if match(m)]
    return [b"%d" % following, visit(page)]


def _get(ctx, key: bytes) -> SetValue | None:
    return ctx.state.get_typed(key, ctx.now, SetValue)


def _all(ctx, keys) -> list[SetValue | None]:
    """_all looks up every key (WRONGTYPE for the first that is not a set)."""
    state, now = ctx.state, ctx.now
    return [state.get_typed(key, now, SetValue) for key in keys]


@command("SADD", -3, WRITE)
def sadd(ctx, args):
    """sadd runs SADD key member...: how many members were new."""
    key = args[1]
    old = _get(ctx, key)
    new = set(args[2:])
    if old is not None:
        new -= old
        if not new:
            return 0
    ctx.state.writable(key, ctx.now, SetValue).update(new)
    return len(new)


@command("SREM", -3, WRITE)
def srem(ctx, args):
    """srem runs SREM key member...: how many members were there."""
    key = args[1]
    old = _get(ctx, key)
    gone = old.intersection(args[2:]) if old is not None else None
    if not gone:
        return 0
    ctx.state.writable(key, ctx.now, SetValue).difference_update(gone)
    ctx.state.drop_if_empty(key)
    return len(gone)


@command("SMEMBERS", 2, READ)
def smembers(ctx, args):
    """smembers answers SMEMBERS key: every member."""
    value = _get(ctx, args[1])
    return SetReply(listed(ctx, value) if value is not None else ())


@command("SISMEMBER", 3, READ)
def sismember(ctx, args):
    """sismember answers SISMEMBER key member: 1 or 0."""
    value = _get(ctx, args[1])
    return int(value is not None and args[2] in value)


@command("SMISMEMBER", -3, READ)
def smismember(ctx, args):
    """smismember answers SMISMEMBER key member...: 1 or 0 for each."""
    value = _get(ctx, args[1]) or ()
    return [int(member in value) for member in args[2:]]


@command("SCARD", 2, READ)
def scard(ctx, args):
    """scard answers SCARD key: the number of members."""
    value = _get(ctx, args[1])
    return 0 if value is None else len(value)


@command("SPOP", -2, WRITE)
def spop(ctx, args):
    """spop runs SPOP key [count]: removes and returns members picked with the record's randomness."""
    if len(args) > 3:
        raise ReplyError(SYNTAX)
    count = positive(args[2]) if len(args) == 3 else None
    key = args[1]
    value = _get(ctx, key)
    if value is None or count == 0:
        return None if count is None else SetReply()
    members = sorted(value)
    if count is None:
        picked = [ctx.random.choice(members)]
    elif count >= len(members):
        picked = members
    else:
        picked = ctx.random.sample(members, count)
    ctx.state.writable(key, ctx.now, SetValue).difference_update(picked)
    ctx.state.drop_if_empty(key)
    return picked[0] if count is None else SetReply(picked)


@command("SRANDMEMBER", -2, READ)
def srandmember(ctx, args):
    """srandmember answers SRANDMEMBER key [count]: random members (a negative count may repeat them)."""
    if len(args) > 3:
        raise ReplyError(SYNTAX)
    count = random_count(args[2]) if len(args) == 3 else None
    value = _get(ctx, args[1])
    if value is None:
        return None if count is None else []
    members, pick = listed(ctx, value), ctx.random
    if count is None:
        return pick.choice(members)
    if count < 0:
        return pick.choices(members, k=repeats(count))
    if count >= len(members):
        return members
    return pick.sample(members, count)


@command("SMOVE", 4, WRITE)
def smove(ctx, args):
    """smove runs SMOVE source destination member: 1 if the member moved (or is in both, the same set)."""
    state, now = ctx.state, ctx.now
    source, destination, member = args[1], args[2], args[3]
    if state.lookup(source, now) is None:
        return 0
    old, target = _all(ctx, (source, destination))
    if source == destination or member not in old:
        return int(member in old)
    state.writable(source, now, SetValue).discard(member)
    state.drop_if_empty(source)
    if target is None or member not in target:
        state.writable(destination, now, SetValue).add(member)
    return 1


def _union(sets) -> set:
    return set().union(*(s for s in sets if s is not None))


def _inter(sets) -> set:
    if any(s is None for s in sets):
        return set()
    smallest, *others = sorted(sets, key=len)
    return smallest.intersection(*others)


def _diff(sets) -> set:
    first, *others = sets
    if first is None:
        return set()
    return first.difference(*(s for s in others if s is not None))


def _store(ctx, destination: bytes, result: set) -> int:
    """_store makes `destination` the set `result` (without expiry), or removes it if empty."""
    if result:
        ctx.state.store(destination, SetValue(result))
    else:
        ctx.state.remove(destination)
    return len(result)


@command("SUNION", -2, READ)
def sunion(ctx, args):
    """sunion answers SUNION key...: the members of any of the sets."""
    return SetReply(listed(ctx, _union(_all(ctx, args[1:]))))


@command("SINTER", -2, READ)
def sinter(ctx, args):
    """sinter answers SINTER key...: the members of all the sets."""
    return SetReply(listed(ctx, _inter(_all(ctx, args[1:]))))


@command("SDIFF", -2, READ)
def sdiff(ctx, args):
    """sdiff answers SDIFF key...: the members of the first set that are in none of the others."""
    return SetReply(listed(ctx, _diff(_all(ctx, args[1:]))))


@command("SUNIONSTORE", -3, WRITE)
def sunionstore(ctx, args):
    """sunionstore runs SUNIONSTORE destination key...: the size of the union it stored."""
    return _store(ctx, args[1], _union(_all(ctx, args[2:])))


@command("SINTERSTORE", -3, WRITE)
def sinterstore(ctx, args):
    """sinterstore runs SINTERSTORE destination key...: the size of the intersection it stored."""
    return _store(ctx, args[1], _inter(_all(ctx, args[2:])))


@command("SDIFFSTORE", -3, WRITE)
def sdiffstore(ctx, args):
    """sdiffstore runs SDIFFSTORE destination key...: the size of the difference it stored."""
    return _store(ctx, args[1], _diff(_all(ctx, args[2:])))


@command("SINTERCARD", -3, READ)
def sintercard(ctx, args):
    """sintercard answers SINTERCARD numkeys key... [LIMIT limit]: the size of the intersection, up to limit."""
    numkeys = parse_int(args[1])
    if numkeys is None or numkeys < 1:
        raise ReplyError("ERR numkeys should be greater than 0")
    if numkeys > len(args) - 2:
        raise ReplyError("ERR Number of keys can't be greater than number of args")
    limit, at = 0, 2 + numkeys
    while at < len(args):
        if args[at].upper() == b"LIMIT" and at + 1 < len(args):
            limit = positive(args[at + 1], "ERR LIMIT can't be negative")
            at += 2
        else:
            raise ReplyError(SYNTAX)
    sets = _all(ctx, args[2:2 + numkeys])
    if any(s is None for s in sets):
        return 0
    smallest, *others = sorted(sets, key=len)
    found = 0
    for member in smallest:
        if all(member in s for s in others):
            found += 1
            if found == limit:
                break
    return found


@command("SSCAN", -3, READ)
def sscan(ctx, args):
    """sscan answers SSCAN key cursor [MATCH pattern] [COUNT n]: the next cursor and some members."""
    cursor = parse_cursor(args[2])
    value = _get(ctx, args[1])
    if value is None:
        return [b"0", []]
    return scan_reply(ctx, args, cursor, value, lambda page: listed(ctx, page))
