"""walkit.adapters.kv.zsets holds the commands of sorted sets: ZADD, ZRANGE, ZPOPMIN, ZSCAN and their kin.

A ZSet (state.py) keeps its members in Redis' order, (score, member), so ranges by rank and by
score are bisections. Numbers are read as redis-server 7.0 reads them: a score (ZADD, ZINCRBY)
as its string2d does, a range bound (ZCOUNT, BYSCORE) as its strtod does (an empty bound is 0,
"(" makes it exclusive), inf, -inf and +inf included, NaN refused. A score of -0 is stored as 0,
as redis-server stores it in the small encoding (listpack) every sorted set starts in.

Lexicographic ranges (BYLEX) are bisections too when every member has the same score, the case
they are meant for; otherwise they are walked as redis-server walks a listpack.

Replies of (member, score) pairs (WITHSCORES, ZPOPMIN with a count) are one flat array in RESP2
and an array of [member, score] arrays in RESP3 (`scored`).
"""

from __future__ import annotations

import math
import re

from walkit.adapters.kv.keyspace import parse_cursor
from walkit.adapters.kv.limits import LISTPACK_VALUE, ZSET_ENTRIES
from walkit.adapters.kv.resp import Double, Pairs, ReplyError, format_double
from walkit.adapters.kv.sets import MUST_BE_POSITIVE, positive, repeats, scan_reply
from walkit.adapters.kv.state import INT64_MAX, ZSet
from walkit.adapters.kv.table import READ, SYNTAX, WRITE, command, integer, random_count

NOT_A_FLOAT = "ERR value is not a valid float"
BAD_SCORE_RANGE = "ERR min or max is not a float"
BAD_LEX_RANGE = "ERR min or max not valid string range item"
NAN_RESULT = "ERR resulting score is not a number (NaN)"

#: What C's strtod reads: leading spaces, a sign, then a decimal or hexadecimal number, inf or nan.
_STRTOD = re.compile(rb"""[ \t\n\v\f\r]*[+-]?(?:
    (?P<dec>(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)
  | (?P<hex>0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?[0-9]+)?)
  | (?P<inf>[iI][nN][fF](?:[iI][nN][iI][tT][yY])?)
  | (?P<nan>[nN][aA][nN](?:\([0-9a-zA-Z_]*\))?)
)\Z""", re.X)
_MANTISSA = re.compile(rb"[1-9a-fA-F]")


def _strtod(text: bytes) -> tuple[float, bool] | None:
    """_strtod reads all of `text` as C's strtod: (value, whether it overflowed or underflowed), or None."""
    found = _STRTOD.match(text)
    if found is None:
        return None
    if found.group("nan"):
        return math.nan, False
    negative = text.lstrip(b" \t\n\v\f\r")[:1] == b"-"
    if found.group("inf"):
        return (-math.inf if negative else math.inf), False
    number = found.group("hex") or found.group("dec")
    if found.group("hex"):
        try:
            value = float.fromhex(number.decode())
        except OverflowError:
            value = math.inf
        digits = number[2:].split(b"p")[0].split(b"P")[0]
    else:
        value = float(number)
        digits = re.split(rb"[eE]", number)[0]
    ranged = math.isinf(value) or (value == 0 and _MANTISSA.search(digits) is not None)
    return (-value if negative else value), ranged


def parse_score(text: bytes) -> float:
    """parse_score reads a score or an increment as redis-server's string2d: ERR value is not a valid float."""
    read = _strtod(text) if text and text[:1] not in b" \t\n\v\f\r" else None
    if read is None or read[1] or math.isnan(read[0]):
        raise ReplyError(NOT_A_FLOAT)
    return read[0]


def _score_bound(text: bytes) -> tuple[float, bool]:
    """_score_bound reads a range bound, "(" for exclusive, as redis-server's zslParseRange: (value, exclusive)."""
    text = text.split(b"\0", 1)[0]          # strtod stops at a NUL byte
    exclusive = text[:1] == b"("
    if exclusive:
        text = text[1:]
    read = _strtod(text) if text else (0.0, False)
    if read is None or math.isnan(read[0]):
        raise ReplyError(BAD_SCORE_RANGE)
    return read[0], exclusive


class _Above:
    """_Above sorts after every member, so (score, ABOVE) follows every (score, member)."""

    def __lt__(self, other) -> bool:
        return False

    def __gt__(self, other) -> bool:
        return True


ABOVE = _Above()


def score_span(z: ZSet, low: tuple[float, bool], high: tuple[float, bool]) -> tuple[int, int]:
    """score_span is the (start, stop) indexes of z.order whose scores lie between the bounds."""
    order = z.order
    start = order.bisect_right((low[0], ABOVE)) if low[1] else order.bisect_left((low[0],))
    stop = order.bisect_left((high[0],)) if high[1] else order.bisect_right((high[0], ABOVE))
    return start, max(start, stop)


# -- lexicographic ranges --------------------------------------------------------------------
_LEAST, _GREATEST = "-", "+"


def _lex_bound(text: bytes) -> tuple[object, bool]:
    """_lex_bound reads "-", "+", "(member" or "[member": (member or a sentinel, exclusive)."""
    first = text[:1]
    if first in (b"-", b"+"):
        if len(text) != 1:
            raise ReplyError(BAD_LEX_RANGE)
        return (_LEAST if first == b"-" else _GREATEST), True
    if first in (b"(", b"["):
        return text[1:], first == b"("
    raise ReplyError(BAD_LEX_RANGE)


def _above_low(member: bytes, low) -> bool:
    value, exclusive = low
    if value is _LEAST or value is _GREATEST:
        return value is _LEAST
    return member > value if exclusive else member >= value


def _below_high(member: bytes, high) -> bool:
    value, exclusive = high
    if value is _LEAST or value is _GREATEST:
        return value is _GREATEST
    return member < value if exclusive else member <= value


def _lex_empty(low, high) -> bool:
    """_lex_empty tells whether no member can lie between the bounds (redis-server's sdscmplex test)."""
    a, b = low[0], high[0]
    if a is b:
        order = 0
    elif a is _LEAST or b is _GREATEST:
        order = -1
    elif a is _GREATEST or b is _LEAST:
        order = 1
    else:
        order = (a > b) - (a < b)
    return order > 0 or (order == 0 and (low[1] or high[1]))


def _lex_index(z: ZSet, score: float, bound, after: bool) -> int:
    value, exclusive = bound
    if value is _LEAST or value is _GREATEST:
        return 0 if value is _LEAST else len(z)
    if exclusive == after:
        return z.order.bisect_right((score, value))
    return z.order.bisect_left((score, value))


def lex_span(z: ZSet, low, high, reverse: bool = False) -> tuple[int, int]:
    """lex_span is the (start, stop) indexes of z.order whose members lie between the bounds, as
    redis-server finds them walking from the front (from the back if `reverse`)."""
    order, n = z.order, len(z)
    if _lex_empty(low, high) or not _above_low(order[-1][1], low) or not _below_high(order[0][1], high):
        return 0, 0
    if order[0][0] == order[-1][0]:                 # one score: the members are sorted
        start = _lex_index(z, order[0][0], low, True)
        return start, max(start, _lex_index(z, order[0][0], high, False))
    if reverse:
        stop = n
        while stop > 0 and not _below_high(order[stop - 1][1], high):
            stop -= 1
        start = stop
        while start > 0 and _above_low(order[start - 1][1], low):
            start -= 1
        return start, stop
    start = 0
    while start < n and not _above_low(order[start][1], low):
        start += 1
    stop = start
    while stop < n and _below_high(order[stop][1], high):
        stop += 1
    return start, stop


def rank_span(n: int, start: int, end: int) -> tuple[int, int]:
    """rank_span is the (start, stop) indexes of ranks start..end (negative from the end), clipped."""
    if start < 0:
        start += n
    if end < 0:
        end += n
    start = max(start, 0)
    if start > end or start >= n:
        return 0, 0
    return start, min(end, n - 1) + 1


# -- replies -------------------------------------------------------------------------------
def scored(items) -> Pairs:
    """scored is the reply of (score, member) items: member and score pairs (see the module doc)."""
    return Pairs(part for score, member in items for part in (member, Double(score)))


def scan_score(score: float, listpack: bool) -> bytes:
    """scan_score writes a score as ZSCAN does: as redis-server's d2string in a listpack, %.17g otherwise."""
    if listpack and score.is_integer() and abs(score) <= float(INT64_MAX // 2):
        return b"%d" % score
    return format_double(score)


# -- commands ---------------------------------------------------------------------------------
def _get(ctx, key: bytes) -> ZSet | None:
    return ctx.state.get_typed(key, ctx.now, ZSet)


def _zadd(ctx, key: bytes, pairs, *, nx=False, xx=False, gt=False, lt=False, ch=False, incr=False):
    """_zadd adds (score, member) pairs as ZADD does with its options, once all of them were checked."""
    z = _get(ctx, key)
    changes: dict[bytes, float] = {}
    added = updated = processed = 0
    score = 0.0
    for score, member in pairs:
        current = changes.get(member)
        if current is None and z is not None:
            current = z.scores.get(member)
        if current is None:
            if xx:
                continue
            added += 1
        else:
            if nx:
                continue
            if incr:
                score += current
                if math.isnan(score):
                    raise ReplyError(NAN_RESULT)
            if (lt and score >= current) or (gt and score <= current):
                continue
            if score == current:
                processed += 1
                continue
            updated += 1
        processed += 1
        changes[member] = score
    if changes:
        target = ctx.state.writable(key, ctx.now, ZSet)
        for member, new in changes.items():
            target.add(member, new + 0.0)       # + 0.0 turns -0 into 0
    if incr:
        return Double(score) if processed else None
    return added + updated if ch else added


_ZADD_FLAGS = {b"NX": "nx", b"XX": "xx", b"GT": "gt", b"LT": "lt", b"CH": "ch", b"INCR": "incr"}


@command("ZADD", -4, WRITE)
def zadd(ctx, args):
    """zadd runs ZADD key [NX|XX] [GT|LT] [CH] [INCR] score member...: how many members were added (or changed)."""
    flags, at = {}, 2
    while at < len(args) and args[at].upper() in _ZADD_FLAGS:
        flags[_ZADD_FLAGS[args[at].upper()]] = True
        at += 1
    elements = len(args) - at
    if elements == 0 or elements % 2:
        raise ReplyError(SYNTAX)
    if flags.get("nx") and flags.get("xx"):
        raise ReplyError("ERR XX and NX options at the same time are not compatible")
    if sum(flags.get(f, False) for f in ("nx", "gt", "lt")) > 1:
        raise ReplyError("ERR GT, LT, and/or NX options at the same time are not compatible")
    if flags.get("incr") and elements > 2:
        raise ReplyError("ERR INCR option supports a single increment-element pair")
    pairs = [(parse_score(args[i]), args[i + 1]) for i in range(at, len(args), 2)]
    return _zadd(ctx, args[1], pairs, **flags)


@command("ZINCRBY", 4, WRITE)
def zincrby(ctx, args):
    """zincrby runs ZINCRBY key increment member: the new score."""
    return _zadd(ctx, args[1], [(parse_score(args[2]), args[3])], incr=True)


@command("ZREM", -3, WRITE)
def zrem(ctx, args):
    """zrem runs ZREM key member...: how many members were there."""
    key = args[1]
    z = _get(ctx, key)
    gone = {m for m in args[2:] if m in z.scores} if z is not None else None
    if not gone:
        return 0
    _remove(ctx, key, gone)
    return len(gone)


def _remove(ctx, key: bytes, members) -> None:
    """_remove takes `members` (which are there) out of the sorted set at `key`."""
    target = ctx.state.writable(key, ctx.now, ZSet)
    for member in members:
        target.discard(member)
    ctx.state.drop_if_empty(key)


@command("ZSCORE", 3, READ)
def zscore(ctx, args):
    """zscore answers ZSCORE key member: the score, or nil."""
    z = _get(ctx, args[1])
    score = z.scores.get(args[2]) if z is not None else None
    return None if score is None else Double(score)


@command("ZMSCORE", -3, READ)
def zmscore(ctx, args):
    """zmscore answers ZMSCORE key member...: the scores, nil for absent members."""
    z = _get(ctx, args[1])
    scores = z.scores if z is not None else {}
    return [None if m not in scores else Double(scores[m]) for m in args[2:]]


@command("ZCARD", 2, READ)
def zcard(ctx, args):
    """zcard answers ZCARD key: the number of members."""
    z = _get(ctx, args[1])
    return 0 if z is None else len(z)


@command("ZCOUNT", 4, READ)
def zcount(ctx, args):
    """zcount answers ZCOUNT key min max: how many scores lie in the range."""
    low, high = _score_bound(args[2]), _score_bound(args[3])
    z = _get(ctx, args[1])
    if z is None:
        return 0
    start, stop = score_span(z, low, high)
    return stop - start


@command("ZLEXCOUNT", 4, READ)
def zlexcount(ctx, args):
    """zlexcount answers ZLEXCOUNT key min max: how many members lie in the lexicographic range."""
    low, high = _lex_bound(args[2]), _lex_bound(args[3])
    z = _get(ctx, args[1])
    if z is None:
        return 0
    start, stop = lex_span(z, low, high)
    return stop - start


def _range(ctx, args, at: int, *, store: bool = False, by: str | None = None, reverse: bool | None = None):
    """_range reads `key min max [BYSCORE|BYLEX] [REV] [WITHSCORES] [LIMIT offset count]` from args[at:]
    as redis-server's zrangeGenericCommand (`by` and `reverse` fixed by the older commands) and
    returns (the sorted set or None, its (score, member) items in the range, WITHSCORES)."""
    withscores, offset, limit = False, 0, -1
    i = at + 3
    while i < len(args):
        option = args[i].upper()
        if not store and option == b"WITHSCORES":
            withscores = True
        elif option == b"LIMIT" and len(args) - i - 1 >= 2:
            offset, limit = integer(args[i + 1]), integer(args[i + 2])
            i += 2
        elif reverse is None and option == b"REV":
            reverse = True
        elif by is None and option in (b"BYSCORE", b"BYLEX"):
            by = "score" if option == b"BYSCORE" else "lex"
        else:
            raise ReplyError(SYNTAX)
        i += 1
    by, reverse = by or "rank", bool(reverse)
    if limit != -1 and by == "rank":
        raise ReplyError("ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX")
    if withscores and by == "lex":
        raise ReplyError("ERR syntax error, WITHSCORES not supported in combination with BYLEX")
    first, second = args[at + 1], args[at + 2]
    if reverse and by != "rank":
        first, second = second, first       # given as max min
    if by == "rank":
        bounds = integer(first), integer(second)
    elif by == "score":
        bounds = _score_bound(first), _score_bound(second)
    else:
        bounds = _lex_bound(first), _lex_bound(second)
    z = _get(ctx, args[at])
    if z is None:
        return None, [], withscores
    n = len(z)
    if by == "rank":
        start, stop = rank_span(n, *bounds)
        if reverse:
            start, stop = n - stop, n - start
    elif by == "score":
        start, stop = score_span(z, *bounds)
    else:
        start, stop = lex_span(z, *bounds, reverse=reverse)
    if by != "rank":                        # LIMIT (a rank range takes only LIMIT x -1, and ignores it)
        if offset < 0:
            return z, [], withscores
        if reverse:
            stop -= offset
            if limit >= 0:
                start = max(start, stop - limit)
        else:
            start += offset
            if limit >= 0:
                stop = min(stop, start + limit)
    if start >= stop:
        return z, [], withscores
    return z, list(z.order.islice(start, stop, reverse=reverse)), withscores


def _range_reply(ctx, args, **fixed):
    """_range_reply answers a ZRANGE-like command: the members, with their scores if asked."""
    _, items, withscores = _range(ctx, args, 1, **fixed)
    return scored(items) if withscores else [member for _, member in items]


@command("ZRANGE", -4, READ)
def zrange(ctx, args):
    """zrange answers ZRANGE key min max [BYSCORE|BYLEX] [REV] [LIMIT offset count] [WITHSCORES]."""
    return _range_reply(ctx, args)


@command("ZREVRANGE", -4, READ)
def zrevrange(ctx, args):
    """zrevrange answers ZREVRANGE key start stop [WITHSCORES]."""
    return _range_reply(ctx, args, by="rank", reverse=True)


@command("ZRANGEBYSCORE", -4, READ)
def zrangebyscore(ctx, args):
    """zrangebyscore answers ZRANGEBYSCORE key min max [WITHSCORES] [LIMIT offset count]."""
    return _range_reply(ctx, args, by="score", reverse=False)


@command("ZREVRANGEBYSCORE", -4, READ)
def zrevrangebyscore(ctx, args):
    """zrevrangebyscore answers ZREVRANGEBYSCORE key max min [WITHSCORES] [LIMIT offset count]."""
    return _range_reply(ctx, args, by="score", reverse=True)


@command("ZRANGEBYLEX", -4, READ)
def zrangebylex(ctx, args):
    """zrangebylex answers ZRANGEBYLEX key min max [LIMIT offset count]."""
    return _range_reply(ctx, args, by="lex", reverse=False)


@command("ZREVRANGEBYLEX", -4, READ)
def zrevrangebylex(ctx, args):
    """zrevrangebylex answers ZREVRANGEBYLEX key max min [LIMIT offset count]."""
    return _range_reply(ctx, args, by="lex", reverse=True)


@command("ZRANGESTORE", -5, WRITE)
def zrangestore(ctx, args):
    """zrangestore runs ZRANGESTORE dst src min max [BYSCORE|BYLEX] [REV] [LIMIT offset count]: how many it stored."""
    _, items, _ = _range(ctx, args, 2, store=True)
    if items:
        ctx.state.store(args[1], ZSet(items))
    else:
        ctx.state.remove(args[1])
    return len(items)


def _rank(ctx, args, reverse: bool):
    z = _get(ctx, args[1])
    score = z.scores.get(args[2]) if z is not None else None
    if score is None:
        return None
    rank = z.order.bisect_left((score, args[2]))
    return len(z) - 1 - rank if reverse else rank


@command("ZRANK", 3, READ)
def zrank(ctx, args):
    """zrank answers ZRANK key member: its rank from the lowest score, or nil."""
    return _rank(ctx, args, False)


@command("ZREVRANK", 3, READ)
def zrevrank(ctx, args):
    """zrevrank answers ZREVRANK key member: its rank from the highest score, or nil."""
    return _rank(ctx, args, True)


def _remove_span(ctx, key: bytes, span) -> int:
    """_remove_span removes the members at indexes span(z) of the sorted set at `key`: how many."""
    z = _get(ctx, key)
    if z is None:
        return 0
    start, stop = span(z)
    if start >= stop:
        return 0
    _remove(ctx, key, [member for _, member in z.order.islice(start, stop)])
    return stop - start


@command("ZREMRANGEBYRANK", 4, WRITE)
def zremrangebyrank(ctx, args):
    """zremrangebyrank runs ZREMRANGEBYRANK key start stop: how many members it removed."""
    start, end = integer(args[2]), integer(args[3])
    return _remove_span(ctx, args[1], lambda z: rank_span(len(z), start, end))


@command("ZREMRANGEBYSCORE", 4, WRITE)
def zremrangebyscore(ctx, args):
    """zremrangebyscore runs ZREMRANGEBYSCORE key min max: how many members it removed."""
    low, high = _score_bound(args[2]), _score_bound(args[3])
    return _remove_span(ctx, args[1], lambda z: score_span(z, low, high))


@command("ZREMRANGEBYLEX", 4, WRITE)
def zremrangebylex(ctx, args):
    """zremrangebylex runs ZREMRANGEBYLEX key min max: how many members it removed."""
    low, high = _lex_bound(args[2]), _lex_bound(args[3])
    return _remove_span(ctx, args[1], lambda z: lex_span(z, low, high))


def _pop(ctx, args, highest: bool):
    """_pop runs ZPOPMIN and ZPOPMAX key [count]."""
    if len(args) > 3:
        raise ReplyError(SYNTAX)
    count = positive(args[2], MUST_BE_POSITIVE) if len(args) == 3 else None
    key = args[1]
    z = _get(ctx, key)
    if z is None or count == 0:
        return []
    n = min(len(z), 1 if count is None else count)
    items = list(z.order.islice(len(z) - n, len(z), reverse=True) if highest else z.order.islice(0, n))
    _remove(ctx, key, [member for _, member in items])
    if count is None:
        return [items[0][1], Double(items[0][0])]
    return scored(items)


@command("ZPOPMIN", -2, WRITE)
def zpopmin(ctx, args):
    """zpopmin runs ZPOPMIN key [count]: removes and returns the members of lowest score."""
    return _pop(ctx, args, False)


@command("ZPOPMAX", -2, WRITE)
def zpopmax(ctx, args):
    """zpopmax runs ZPOPMAX key [count]: removes and returns the members of highest score."""
    return _pop(ctx, args, True)


@command("ZRANDMEMBER", -2, READ)
def zrandmember(ctx, args):
    """zrandmember answers ZRANDMEMBER key [count [WITHSCORES]]: random members (a negative count may repeat them)."""
    count, withscores = None, False
    if len(args) >= 3:
        count = random_count(args[2])
        if len(args) > 4 or (len(args) == 4 and args[3].upper() != b"WITHSCORES"):
            raise ReplyError(SYNTAX)
        withscores = len(args) == 4
        if withscores and abs(count) > INT64_MAX // 2:
            raise ReplyError("ERR value is out of range")
    z = _get(ctx, args[1])
    if z is None:
        return None if count is None else []
    order, n, pick = z.order, len(z), ctx.random
    if count is None:
        return order[pick.randrange(n)][1]
    if count < 0:
        items = [order[pick.randrange(n)] for _ in range(repeats(count))]
    elif count >= n:
        items = list(reversed(order))           # redis-server walks the whole set from the end
    else:
        items = [order[i] for i in pick.sample(range(n), count)]
    return scored(items) if withscores else [member for _, member in items]


@command("ZSCAN", -3, READ)
def zscan(ctx, args):
    """zscan answers ZSCAN key cursor [MATCH pattern] [COUNT n]: the next cursor and some members with their scores."""
    cursor = parse_cursor(args[2])
    z = _get(ctx, args[1])
    if z is None:
        return [b"0", []]
    scores = z.scores
    listpack = len(z) <= ZSET_ENTRIES and all(len(m) <= LISTPACK_VALUE for m in scores)

    def visit(page) -> list:
        """visit lists the members of a page in the set's order, each followed by its score."""
        items = sorted((scores[m], m) for m in page)
        return [part for score, member in items for part in (member, scan_score(score, listpack))]
    return scan_reply(ctx, args, cursor, scores, visit)
