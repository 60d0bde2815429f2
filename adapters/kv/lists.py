"""walkit.adapters.kv.lists holds the commands of list values: LPUSH, LPOP, LRANGE, LMOVE and their kin.

A List is a deque: pushes and pops at either end cost O(1); an index costs up to half the
list, as in Redis' quicklist. Indexes follow Redis: a negative index counts from the tail
(-1 is the last element), and a range is clamped to the list. A command that empties a list
removes its key. Blocking pops (BLPOP...) are not served: a replicated write cannot wait.
"""

from __future__ import annotations

import itertools

from walkit.adapters.kv.resp import NIL_ARRAY, OK, ReplyError
from walkit.adapters.kv.state import INT64_MIN, List, parse_int
from walkit.adapters.kv.table import READ, SYNTAX, WRITE, command, integer

NO_SUCH_KEY = "ERR no such key"
OUT_OF_RANGE = "ERR index out of range"


def _positive(text: bytes, error: str) -> int:
    """_positive reads a count that must be >= 0; `error` (with ERR) for anything else, as redis-server's
    getPositiveLongFromObjectOrReply answers both a negative number and a non-number."""
    value = parse_int(text)
    if value is None or value < 0:
        raise ReplyError(error)
    return value


def _end(text: bytes) -> bool:
    """_end reads LEFT or RIGHT (any case): True for LEFT."""
    end = text.upper()
    if end not in (b"LEFT", b"RIGHT"):
        raise ReplyError(SYNTAX)
    return end == b"LEFT"


def _span(length: int, start: int, stop: int) -> tuple[int, int]:
    """_span clamps LRANGE/LTRIM's inclusive range to a list of `length`: (start, stop) with
    stop < start when it is empty."""
    if start < 0:
        start += length
    if stop < 0:
        stop += length
    start = max(start, 0)
    if start > stop or start >= length:
        return 0, -1
    return start, min(stop, length - 1)


def _slice(items: List, start: int, stop: int) -> list[bytes]:
    """_slice is items[start:stop + 1], walked from the nearer end."""
    if start > len(items) - 1 - stop:
        tail = len(items) - 1
        return list(itertools.islice(reversed(items), tail - stop, tail - start + 1))[::-1]
    return list(itertools.islice(items, start, stop + 1))


def _push(ctx, args, left: bool, existing: bool):
    """_push runs LPUSH/RPUSH (and with `existing` LPUSHX/RPUSHX): the list's new length."""
    state, key = ctx.state, args[1]
    if existing and state.get_typed(key, ctx.now, List) is None:
        return 0
    items = state.writable(key, ctx.now, List)
    (items.extendleft if left else items.extend)(args[2:])
    return len(items)


@command("LPUSH", -3, WRITE)
def lpush(ctx, args):
    """lpush runs LPUSH key element...: each element goes to the head in turn; the new length."""
    return _push(ctx, args, True, False)


@command("RPUSH", -3, WRITE)
def rpush(ctx, args):
    """rpush runs RPUSH key element...: the elements go to the tail; the new length."""
    return _push(ctx, args, False, False)


@command("LPUSHX", -3, WRITE)
def lpushx(ctx, args):
    """lpushx runs LPUSHX key element...: LPUSH if the list exists, else 0."""
    return _push(ctx, args, True, True)


@command("RPUSHX", -3, WRITE)
def rpushx(ctx, args):
    """rpushx runs RPUSHX key element...: RPUSH if the list exists, else 0."""
    return _push(ctx, args, False, True)


def _pop(ctx, args, left: bool):
    """_pop runs LPOP/RPOP key [count]: an element (nil if absent), or with a count an array of
    up to count elements (the nil array if absent)."""
    if len(args) > 3:
        name = "lpop" if left else "rpop"
        raise ReplyError(f"ERR wrong number of arguments for '{name}' command")
    count = _positive(args[2], "ERR value is out of range, must be positive") if len(args) == 3 else None
    state, key = ctx.state, args[1]
    if state.get_typed(key, ctx.now, List) is None:
        return None if count is None else NIL_ARRAY
    if count == 0:
        return []
    items = state.writable(key, ctx.now, List, create=False)
    take = items.popleft if left else items.pop
    popped = take() if count is None else [take() for _ in range(min(count, len(items)))]
    state.drop_if_empty(key)
    return popped


@command("LPOP", -2, WRITE)
def lpop(ctx, args):
    """lpop runs LPOP key [count]: elements taken from the head."""
    return _pop(ctx, args, True)


@command("RPOP", -2, WRITE)
def rpop(ctx, args):
    """rpop runs RPOP key [count]: elements taken from the tail."""
    return _pop(ctx, args, False)


@command("LLEN", 2, READ)
def llen(ctx, args):
    """llen answers LLEN key: the list's length (0 if absent)."""
    items = ctx.state.get_typed(args[1], ctx.now, List)
    return 0 if items is None else len(items)


@command("LRANGE", 4, READ)
def lrange(ctx, args):
    """lrange answers LRANGE key start stop: the elements from start to stop, both included."""
    start, stop = integer(args[2]), integer(args[3])
    items = ctx.state.get_typed(args[1], ctx.now, List)
    if items is None:
        return []
    start, stop = _span(len(items), start, stop)
    return _slice(items, start, stop)


@command("LINDEX", 3, READ)
def lindex(ctx, args):
    """lindex answers LINDEX key index: the element at index, or nil."""
    items = ctx.state.get_typed(args[1], ctx.now, List)
    if items is None:
        return None
    index = integer(args[2])
    if index < 0:
        index += len(items)
    return items[index] if 0 <= index < len(items) else None


@command("LSET", 4, WRITE)
def lset(ctx, args):
    """lset runs LSET key index element: OK, or an error for an absent key or an index out of range."""
    state, key = ctx.state, args[1]
    items = state.get_typed(key, ctx.now, List)
    if items is None:
        raise ReplyError(NO_SUCH_KEY)
    index = integer(args[2])
    if index < 0:
        index += len(items)
    if not 0 <= index < len(items):
        raise ReplyError(OUT_OF_RANGE)
    state.writable(key, ctx.now, List, create=False)[index] = args[3]
    return OK


@command("LREM", 4, WRITE)
def lrem(ctx, args):
    """lrem runs LREM key count element: removes count matches from the head (a negative count:
    from the tail; 0: all of them); how many were removed."""
    count = integer(args[2])
    state, key, element = ctx.state, args[1], args[3]
    items = state.get_typed(key, ctx.now, List)
    if items is None or element not in items:
        return 0
    limit = abs(count) if count else len(items)
    kept, removed = [], 0
    for item in reversed(items) if count < 0 else items:
        if removed < limit and item == element:
            removed += 1
        else:
            kept.append(item)
    if count < 0:
        kept.reverse()
    items = state.writable(key, ctx.now, List, create=False)
    items.clear()
    items.extend(kept)
    state.drop_if_empty(key)
    return removed


@command("LTRIM", 4, WRITE)
def ltrim(ctx, args):
    """ltrim runs LTRIM key start stop: keeps only the elements from start to stop; OK."""
    start, stop = integer(args[2]), integer(args[3])
    state, key = ctx.state, args[1]
    items = state.get_typed(key, ctx.now, List)
    if items is None:
        return OK
    start, stop = _span(len(items), start, stop)
    kept = stop - start + 1
    if kept == len(items):
        return OK
    items = state.writable(key, ctx.now, List, create=False)
    if kept <= len(items) - kept:
        keep = _slice(items, start, stop)
        items.clear()
        items.extend(keep)
    else:
        for _ in range(len(items) - 1 - stop):
            items.pop()
        for _ in range(start):
            items.popleft()
    state.drop_if_empty(key)
    return OK


@command("LINSERT", 5, WRITE)
def linsert(ctx, args):
    """linsert runs LINSERT key BEFORE|AFTER pivot element: the new length, -1 without the pivot, 0 if absent."""
    where = args[2].upper()
    if where not in (b"BEFORE", b"AFTER"):
        raise ReplyError(SYNTAX)
    state, key = ctx.state, args[1]
    items = state.get_typed(key, ctx.now, List)
    if items is None:
        return 0
    try:
        index = items.index(args[3])
    except ValueError:
        return -1
    items = state.writable(key, ctx.now, List, create=False)
    items.insert(index + (where == b"AFTER"), args[4])
    return len(items)


@command("LPOS", -3, READ)
def lpos(ctx, args):
    """lpos answers LPOS key element [RANK r] [COUNT n] [MAXLEN m]: the index of the rank-th match
    (nil if none), or with COUNT an array of the indexes of up to n matches (0: all)."""
    rank, count, maxlen = 1, None, 0
    at = 3
    while at < len(args):
        option = args[at].upper()
        if at + 1 >= len(args) or option not in (b"RANK", b"COUNT", b"MAXLEN"):
            raise ReplyError(SYNTAX)
        if option == b"RANK":
            rank = integer(args[at + 1])
            if rank == 0:
                raise ReplyError("ERR RANK can't be zero: use 1 to start from the first match, 2 from the "
                                 "second ... or use negative to start from the end of the list")
        elif option == b"COUNT":
            count = _positive(args[at + 1], "ERR COUNT can't be negative")
        else:
            maxlen = _positive(args[at + 1], "ERR MAXLEN can't be negative")
        at += 2
    items = ctx.state.get_typed(args[1], ctx.now, List)
    if items is None:
        return None if count is None else []
    found = _matches(items, args[2], rank, count if count is not None else 1, maxlen)
    if count is not None:
        return found
    return found[0] if found else None


def _matches(items: List, element: bytes, rank: int, count: int, maxlen: int) -> list[int]:
    """_matches lists the indexes of up to `count` matches (0: all), from the rank-th on, looking
    at no more than `maxlen` elements (0: all) from the head, or from the tail for a negative rank.

    redis-server negates a negative rank in a C long: RANK -2**63 stays negative, so every match
    counts from the first, and its test for enough matches overflows and never holds."""
    length = len(items)
    walk = zip(range(length), items) if rank > 0 else zip(range(length - 1, -1, -1), reversed(items))
    if maxlen:
        walk = itertools.islice(walk, maxlen)
    skip = abs(rank) - 1 if rank != INT64_MIN else 0
    if rank == INT64_MIN:
        count = 0
    found = []
    for index, item in walk:
        if item == element:
            if skip:
                skip -= 1
                continue
            found.append(index)
            if count and len(found) >= count:
                break
    return found


def _move(ctx, source: bytes, destination: bytes, from_left: bool, to_left: bool):
    """_move runs LMOVE/RPOPLPUSH: pops an element from `source`, pushes it onto `destination`, returns it."""
    state = ctx.state
    if state.get_typed(source, ctx.now, List) is None:
        return None
    state.get_typed(destination, ctx.now, List)     # WRONGTYPE before anything changes
    items = state.writable(source, ctx.now, List, create=False)
    element = items.popleft() if from_left else items.pop()
    target = state.writable(destination, ctx.now, List)
    (target.appendleft if to_left else target.append)(element)
    state.drop_if_empty(source)
    return element


@command("LMOVE", 5, WRITE)
def lmove(ctx, args):
    """lmove runs LMOVE source destination LEFT|RIGHT LEFT|RIGHT: the element moved, or nil."""
    from_left, to_left = _end(args[3]), _end(args[4])
    return _move(ctx, args[1], args[2], from_left, to_left)


@command("RPOPLPUSH", 3, WRITE)
def rpoplpush(ctx, args):
    """rpoplpush runs RPOPLPUSH source destination: LMOVE source destination RIGHT LEFT."""
    return _move(ctx, args[1], args[2], False, True)
