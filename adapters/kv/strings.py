"""walkit.adapters.kv.strings holds the commands of string values: GET, SET, INCR and their kin.

Expiry options are decided at the record's stamp (ctx.now): SET k v EX 10 expires 10 s after
the leader stamped the record, on every node.
"""

from __future__ import annotations

from walkit.adapters.kv.resp import OK, ReplyError
from walkit.adapters.kv.state import INT64_MAX, INT64_MIN, NOT_AN_INTEGER, parse_int
from walkit.adapters.kv.table import READ, SYNTAX, WRITE, command, integer


@command("GET", 2, READ)
def get(ctx, args):
    """get answers GET key: the value, or nil if absent or expired."""
    return ctx.state.get_string(args[1], ctx.now)


@command("MGET", -2, READ)
def mget(ctx, args):
    """mget answers MGET key...: the values, nil for absent keys and for keys of other types."""
    state, now = ctx.state, ctx.now
    values = []
    for key in args[1:]:
        value = state.lookup(key, now)
        values.append(value if type(value) is bytes else None)
    return values


_EXPIRY_OPTIONS = {b"EX": 1000, b"PX": 1, b"EXAT": 1000, b"PXAT": 1}


@command("SET", -3, WRITE)
def set_(ctx, args):
    """set_ runs SET key value [NX|XX] [GET] [EX s|PX ms|EXAT t|PXAT t|KEEPTTL]."""
    nx = xx = get_old = keepttl = False
    expire_at, expiry_seen = None, False
    i, n = 3, len(args)
    while i < n:
        option = args[i].upper()
        if option == b"NX" and not xx:
            nx = True
        elif option == b"XX" and not nx:
            xx = True
        elif option == b"GET":
            get_old = True
        elif option == b"KEEPTTL" and not expiry_seen:
            keepttl = expiry_seen = True
        elif option in _EXPIRY_OPTIONS and not expiry_seen and i + 1 < n:
            amount = integer(args[i + 1])
            scale = _EXPIRY_OPTIONS[option]
            if amount <= 0 or amount > INT64_MAX // 1000:
                raise ReplyError("ERR invalid expire time in 'set' command")
            expire_at = amount * scale if option.endswith(b"AT") else ctx.now + amount * scale
            expiry_seen = True
            i += 1
        else:
            raise ReplyError(SYNTAX)
        i += 1
    state, key = ctx.state, args[1]
    old = state.get_string(key, ctx.now) if get_old else state.lookup(key, ctx.now)
    if (nx and old is not None) or (xx and old is None):
        return old if get_old else None
    if keepttl and old is not None:
        state.keep_value(key, args[2])
    else:
        state.store(key, args[2], expire_at)
    return old if get_old else OK


@command("MSET", -3, WRITE)
def mset(ctx, args):
    """mset runs MSET key value [key value...]."""
    if len(args) % 2 == 0:
        raise ReplyError("ERR wrong number of arguments for 'mset' command")
    state = ctx.state
    for i in range(1, len(args), 2):
        state.store(args[i], args[i + 1])
    return OK


def incr_by(ctx, key: bytes, delta: int):
    """incr_by adds `delta` to the integer at `key` (absent counts as 0) and returns the new value."""
    state = ctx.state
    old = state.get_string(key, ctx.now)
    if old is None:
        current = 0
    else:
        current = parse_int(old)
        if current is None:
            raise ReplyError(NOT_AN_INTEGER)
    value = current + delta
    if not INT64_MIN <= value <= INT64_MAX:
        raise ReplyError("ERR increment or decrement would overflow")
    if old is None:
        state.remove(key)                   # an expired key starts over, without its expiry
        state.store(key, b"%d" % value)
    else:
        state.keep_value(key, b"%d" % value)
    return value


@command("INCR", 2, WRITE)
def incr(ctx, args):
    """incr runs INCR key."""
    return incr_by(ctx, args[1], 1)


@command("DECR", 2, WRITE)
def decr(ctx, args):
    """decr runs DECR key."""
    return incr_by(ctx, args[1], -1)


@command("INCRBY", 3, WRITE)
def incrby(ctx, args):
    """incrby runs INCRBY key n."""
    return incr_by(ctx, args[1], integer(args[2]))


@command("DECRBY", 3, WRITE)
def decrby(ctx, args):
    """decrby runs DECRBY key n."""
    delta = integer(args[2])
    if delta == INT64_MIN:
        raise ReplyError("ERR decrement would overflow")
    return incr_by(ctx, args[1], -delta)
