"""walkit.adapters.kv.strings holds the commands of string values: GET, SET, INCR, APPEND and their kin.

Expiry options are decided at the record's stamp (ctx.now): SET k v EX 10 expires 10 s after
the leader stamped the record, on every node. The options of SET and GETEX are read as
redis-server 7.0's parseExtendedStringArgumentsOrReply reads them (`string_options`): the same
expiry option may repeat (the last one counts), two different ones are a syntax error, and the
time is checked only after every option was read.

INCRBYFLOAT computes as redis-server's `long double` does on x86-64 (longdouble.LongDouble: exact
arithmetic rounded to the x87 format, not the host's), so every node writes the same digits.
"""

from __future__ import annotations

from fractions import Fraction

from walkit.adapters.kv.longdouble import LongDouble
from walkit.adapters.kv.keyspace import invalid_expire
from walkit.adapters.kv.resp import OK, ReplyError
from walkit.adapters.kv.state import INT64_MAX, INT64_MIN, NOT_AN_INTEGER, parse_int
from walkit.adapters.kv.table import READ, SYNTAX, WRITE, command, integer

#: The longest string APPEND and SETRANGE make (redis-server's proto-max-bulk-len).
MAX_STRING = 512 * 1024 * 1024
TOO_LONG = "ERR string exceeds maximum allowed size (proto-max-bulk-len)"
NOT_A_FLOAT = "ERR value is not a valid float"

_NX, _XX, _GET, _KEEPTTL, _PERSIST = b"NX", b"XX", b"GET", b"KEEPTTL", b"PERSIST"
#: An expiry option: (ms per unit, whether the time is absolute).
_EXPIRY_OPTIONS = {b"EX": (1000, False), b"PX": (1, False), b"EXAT": (1000, True), b"PXAT": (1, True)}


def string_options(args, at: int, setting: bool) -> tuple[set, bytes | None, bytes | None]:
    """string_options reads SET's options (`setting`) or GETEX's from args[at:]: (flags, expiry option, its time)."""
    flags: set = set()
    expiry = amount = None
    i, n = at, len(args)
    while i < n:
        option = args[i].upper()
        if option == _NX and setting and _XX not in flags:
            flags.add(_NX)
        elif option == _XX and setting and _NX not in flags:
            flags.add(_XX)
        elif option == _GET and setting:
            flags.add(_GET)
        elif option == _KEEPTTL and setting and expiry is None:
            flags.add(_KEEPTTL)
        elif option == _PERSIST and not setting and expiry is None:
            flags.add(_PERSIST)
        elif (option in _EXPIRY_OPTIONS and i + 1 < n and expiry in (None, option)
              and _KEEPTTL not in flags and _PERSIST not in flags):
            expiry, amount = option, args[i + 1]
            i += 1
        else:
            raise ReplyError(SYNTAX)
        i += 1
    return flags, expiry, amount


def expire_at(ctx, args, option: bytes, amount: bytes) -> int:
    """expire_at is the absolute time (ms) an EX/PX/EXAT/PXAT option names, checked as redis-server's
    getExpireMillisecondsOrReply checks it (positive, no overflow once in ms and added to now)."""
    scale, absolute = _EXPIRY_OPTIONS[option]
    when = integer(amount)
    if when <= 0 or when > INT64_MAX // scale:
        raise invalid_expire(args)
    when *= scale
    if not absolute:
        when += ctx.now
    if when > INT64_MAX:                # where redis' signed addition wraps to a negative time
        raise invalid_expire(args)
    return when


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


def set_value(ctx, key: bytes, value: bytes, flags=(), when: int | None = None) -> tuple[bool, bytes | None]:
    """set_value is redis-server's setGenericCommand once the options were checked: it stores `value`
    (expiring at `when`) unless NX or XX forbid it; it returns (whether it stored, the old string
    if GET is among `flags`)."""
    state = ctx.state
    old = state.get_string(key, ctx.now) if _GET in flags else state.lookup(key, ctx.now)
    found = old is not None
    if (_NX in flags and found) or (_XX in flags and not found):
        return False, old
    if _KEEPTTL in flags and found:
        state.keep_value(key, value)
    else:
        state.store(key, value, when)
    return True, old


@command("SET", -3, WRITE)
def set_(ctx, args):
    """set_ runs SET key value [NX|XX] [GET] [EX s|PX ms|EXAT t|PXAT t|KEEPTTL]."""
    if len(args) == 3:                          # the common case: no option to read
        ctx.state.store(args[1], args[2])
        return OK
    flags, expiry, amount = string_options(args, 3, setting=True)
    when = expire_at(ctx, args, expiry, amount) if expiry else None
    done, old = set_value(ctx, args[1], args[2], flags, when)
    if _GET in flags:
        return old
    return OK if done else None


@command("SETNX", 3, WRITE)
def setnx(ctx, args):
    """setnx runs SETNX key value: 1 if the key was set, 0 if it existed."""
    done, _ = set_value(ctx, args[1], args[2], (_NX,))
    return int(done)


@command("SETEX", 4, WRITE)
def setex(ctx, args):
    """setex runs SETEX key seconds value."""
    set_value(ctx, args[1], args[3], (), expire_at(ctx, args, b"EX", args[2]))
    return OK


@command("PSETEX", 4, WRITE)
def psetex(ctx, args):
    """psetex runs PSETEX key milliseconds value."""
    set_value(ctx, args[1], args[3], (), expire_at(ctx, args, b"PX", args[2]))
    return OK


@command("GETSET", 3, WRITE)
def getset(ctx, args):
    """getset runs GETSET key value: the old string (nil if absent); the key loses its expiry."""
    _, old = set_value(ctx, args[1], args[2], (_GET,))
    return old


@command("GETDEL", 2, WRITE)
def getdel(ctx, args):
    """getdel runs GETDEL key: the string, which is deleted (nil if absent)."""
    value = ctx.state.get_string(args[1], ctx.now)
    if value is not None:
        ctx.state.remove(args[1])
    return value


@command("GETEX", -2, WRITE)
def getex(ctx, args):
    """getex runs GETEX key [EX s|PX ms|EXAT t|PXAT t|PERSIST]: the string, its expiry changed.

    As in redis-server, an absent key answers nil before the time is checked, and a time in the past
    (EXAT, PXAT) deletes the key.
    """
    flags, expiry, amount = string_options(args, 2, setting=False)
    state, key = ctx.state, args[1]
    value = state.get_string(key, ctx.now)
    if value is None:
        return None
    if expiry:
        when = expire_at(ctx, args, expiry, amount)
        if when <= ctx.now:
            state.remove(key)
        else:
            state.set_expiry(key, when)
    elif _PERSIST in flags and key in state.expires:
        state.set_expiry(key, None)
    return value


@command("MSET", -3, WRITE)
def mset(ctx, args):
    """mset runs MSET key value [key value...]."""
    if len(args) % 2 == 0:
        raise ReplyError("ERR wrong number of arguments for 'mset' command")
    state = ctx.state
    for i in range(1, len(args), 2):
        state.store(args[i], args[i + 1])
    return OK


@command("MSETNX", -3, WRITE)
def msetnx(ctx, args):
    """msetnx runs MSETNX key value [key value...]: 1 if all were set, 0 (nothing set) if any key existed."""
    if len(args) % 2 == 0:
        raise ReplyError("ERR wrong number of arguments for 'msetnx' command")
    state, now = ctx.state, ctx.now
    if any(state.alive(args[i], now) for i in range(1, len(args), 2)):
        return 0
    for i in range(1, len(args), 2):
        state.store(args[i], args[i + 1])
    return 1


@command("STRLEN", 2, READ)
def strlen(ctx, args):
    """strlen answers STRLEN key: the string's length in bytes (0 if absent)."""
    value = ctx.state.get_string(args[1], ctx.now)
    return 0 if value is None else len(value)


@command("APPEND", 3, WRITE)
def append(ctx, args):
    """append runs APPEND key value: the string's new length (an absent key is created)."""
    state, key, tail = ctx.state, args[1], args[2]
    old = state.get_string(key, ctx.now)
    if old is None:
        state.store(key, tail)
        return len(tail)
    if len(old) + len(tail) > MAX_STRING:
        raise ReplyError(TOO_LONG)
    state.keep_value(key, old + tail)
    return len(old) + len(tail)


@command("GETRANGE", 4, READ, "SUBSTR")
def getrange(ctx, args):
    """getrange answers GETRANGE key start end (and SUBSTR): the bytes between two inclusive offsets,
    negative ones counting from the end ("" if absent or empty)."""
    start, end = integer(args[2]), integer(args[3])
    value = ctx.state.get_string(args[1], ctx.now)
    if value is None or (start < 0 and end < 0 and start > end):
        return b""
    size = len(value)
    start = max(start + size if start < 0 else start, 0)
    end = min(max(end + size if end < 0 else end, 0), size - 1)
    return b"" if start > end else value[start:end + 1]


@command("SETRANGE", 4, WRITE)
def setrange(ctx, args):
    """setrange runs SETRANGE key offset value: the string's new length, zero bytes filling any gap."""
    offset = integer(args[2])
    if offset < 0:
        raise ReplyError("ERR offset is out of range")
    state, key, part = ctx.state, args[1], args[3]
    old = state.get_string(key, ctx.now)
    if not part:
        return 0 if old is None else len(old)
    if offset + len(part) > MAX_STRING:
        raise ReplyError(TOO_LONG)
    if old is None:
        value = bytes(offset) + part
        state.store(key, value)
    else:
        value = old[:offset] + bytes(max(offset - len(old), 0)) + part + old[offset + len(part):]
        state.keep_value(key, value)
    return len(value)


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
        state.store(key, b"%d" % value)     # an expired key starts over, without its expiry
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


def long_double(text: bytes):
    """long_double reads a float as redis-server's string2ld does, or raises "value is not a valid float".

    string2ld refuses a NUL byte (strtold would stop there, short of the whole string).
    """
    value = None if b"\0" in text else LongDouble.parse(text)
    if value is None:
        raise ReplyError(NOT_A_FLOAT)
    return value


@command("INCRBYFLOAT", 3, WRITE)
def incrbyfloat(ctx, args):
    """incrbyfloat runs INCRBYFLOAT key x: the new value, computed and written as redis-server's long double."""
    state, key = ctx.state, args[1]
    old = state.get_string(key, ctx.now)
    current = Fraction(0) if old is None else long_double(old)
    delta = long_double(args[2])
    if isinstance(current, float) or isinstance(delta, float):
        raise ReplyError("ERR increment would produce NaN or Infinity")
    result = LongDouble.round(current + delta)
    if isinstance(result, float):
        raise ReplyError("ERR increment would produce NaN or Infinity")
    text = LongDouble.format(result)
    if old is None:
        state.store(key, text)
    else:
        state.keep_value(key, text)
    return text
