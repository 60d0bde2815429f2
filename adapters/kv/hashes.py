"""walkit.adapters.kv.hashes holds the commands of hash values: HSET, HGET, HINCRBY, HSCAN and their kin.

A Hash keeps its fields in insertion order, as redis-server's listpack does for a small hash,
so HGETALL, HKEYS, HVALS and HSCAN answer in Redis' order for hashes up to SMALL_HASH fields
(a larger Redis hash answers in its hash table's order, which nothing promises).

HSCAN's cursor names the last field visited (keyspace.cursor_of): a hash of up to SMALL_HASH
fields is returned whole with cursor 0, as Redis returns a listpack; a larger one is walked in
field order, so the cursor means the same on every server and never runs out.

HINCRBYFLOAT computes in x87 extended precision (a 64-bit significand), as redis-server's
`long double` does on x86-64, and writes the result with "%.17Lf" and trailing zeros trimmed.
The arithmetic is exact rational arithmetic rounded to that format (`LongDouble`), not the
host's `long double`, so every node computes the same digits on any machine.
"""

from __future__ import annotations

import heapq
import random
import re
from fractions import Fraction

from walkit.adapters.kv.keyspace import cursor_of, key_of_cursor, scan_options
from walkit.adapters.kv.patterns import compile_pattern
from walkit.adapters.kv.resp import OK, Pairs, ReplyError
from walkit.adapters.kv.state import INT64_MAX, INT64_MIN, Hash, parse_int
from walkit.adapters.kv.table import READ, SYNTAX, WRITE, command, integer

#: The most fields of a hash HSCAN returns whole (redis-server's hash-max-listpack-entries).
SMALL_HASH = 128
#: The largest count HRANDFIELD serves. Redis has no such bound without WITHVALUES and would
#: build any reply it is asked for; a larger count is refused rather than exhaust the memory.
MAX_RANDOM_COUNT = 1 << 24

_LOCAL_RANDOM = random.Random()


def _arity(name: str) -> ReplyError:
    """_arity is Redis' error for a command given a wrong number of arguments."""
    return ReplyError(f"ERR wrong number of arguments for '{name}' command")


def random_of(ctx) -> random.Random:
    """random_of is the generator a command that picks at random uses: the record's while one is
    applied (every node picks alike), this server's own for a read (Context.random would repeat
    itself within a millisecond)."""
    return ctx.random if ctx.writing else _LOCAL_RANDOM


# -- x87 extended precision (redis-server's long double) ---------------------------------------
class LongDouble:
    """LongDouble reads, rounds and writes numbers as a C `long double` (x87 80-bit) does.

    A finite value is an exact Fraction; an infinite one is float("inf") or float("-inf").
    """

    MANTISSA = 64                   # significand bits, the leading one included
    MIN_EXP = -16382                # the exponent of the smallest normal number
    MAX_EXP = 16383                 # the exponent of the largest finite number
    TINY = MIN_EXP - (MANTISSA - 1)  # the exponent of the smallest subnormal's one bit
    MAX_CHARS = 5 * 1024            # redis-server's MAX_LONG_DOUBLE_CHARS

    _DECIMAL = re.compile(rb"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")
    _HEX = re.compile(rb"([+-]?)0[xX]([0-9a-fA-F]*)\.?([0-9a-fA-F]*)(?:[pP]([+-]?[0-9]+))?\Z")
    _INF = re.compile(rb"([+-]?)inf(?:inity)?\Z", re.IGNORECASE)
    _SPACE = b" \t\n\v\f\r"

    @classmethod
    def round(cls, exact: Fraction):
        """round is the long double nearest `exact` (ties to even); an infinity if it overflows."""
        if exact == 0:
            return Fraction(0)
        num, den = abs(exact.numerator), exact.denominator
        exp = num.bit_length() - den.bit_length()
        if (num << max(-exp, 0)) < (den << max(exp, 0)):
            exp -= 1                    # now 2**exp <= |exact| < 2**(exp + 1)
        shift = (cls.MANTISSA - 1 - exp) if exp >= cls.MIN_EXP else -cls.TINY
        top, bottom = (num << shift, den) if shift >= 0 else (num, den << -shift)
        units, rest = divmod(top, bottom)
        if 2 * rest > bottom or (2 * rest == bottom and units & 1):
            units += 1
        if units.bit_length() + (-shift) > cls.MAX_EXP + 1:
            return float("inf") if exact > 0 else float("-inf")
        value = Fraction(units, 1 << shift) if shift >= 0 else Fraction(units << -shift)
        return value if exact > 0 else -value

    @classmethod
    def parse(cls, text: bytes):
        """parse reads `text` as redis-server's string2ld does (strtold, whole string); None if it is not a float.

        Rejected as there: empty or longer than MAX_CHARS, leading space, trailing bytes (a NUL
        byte too), NaN, an overflow and an underflow to zero.
        """
        if not text or len(text) >= cls.MAX_CHARS or text[0] in cls._SPACE:
            return None
        if cls._DECIMAL.match(text):
            exact = cls._decimal(text)
        elif (found := cls._HEX.match(text)) and (found.group(2) or found.group(3)):
            exact = cls._hex(*found.groups())
        elif found := cls._INF.match(text):
            return float("-inf") if found.group(1) == b"-" else float("inf")
        else:
            return None
        value = cls.round(exact)
        if isinstance(value, float) or (value == 0 and exact != 0):
            return None                 # ERANGE: overflow, or underflow to zero
        return value

    @classmethod
    def _decimal(cls, text: bytes) -> Fraction:
        mantissa, _, exponent = text.lower().partition(b"e")
        whole, _, fraction = mantissa.lstrip(b"+-").partition(b".")
        significant = (whole + fraction).lstrip(b"0")
        if not significant:
            return Fraction(0)
        power = _exponent(exponent) - len(fraction)
        magnitude = power + len(significant)    # 10**(magnitude - 1) <= |value| < 10**magnitude
        if magnitude > 4940:
            return Fraction(10 ** 4941)         # overflows
        if magnitude < -4960:
            return Fraction(1, 10 ** 4961)      # underflows to zero
        digits = significant.rstrip(b"0")
        value = _big_int(digits) * Fraction(10) ** (power + len(significant) - len(digits))
        return -value if text.startswith(b"-") else value

    @classmethod
    def _hex(cls, sign: bytes, whole: bytes, fraction: bytes, exponent: bytes | None) -> Fraction:
        digits = (whole + fraction).lstrip(b"0")
        if not digits:
            return Fraction(0)
        power = _exponent(exponent) - 4 * len(fraction)
        magnitude = power + 4 * len(digits)     # 2**(magnitude - 4) <= |value| < 2**magnitude
        if magnitude > cls.MAX_EXP + 8:
            return Fraction(2) ** (cls.MAX_EXP + 8)
        if magnitude < cls.TINY - 8:
            return Fraction(1, 1 << (-cls.TINY + 8))
        value = Fraction(int(digits, 16)) * Fraction(2) ** power
        return -value if sign == b"-" else value

    @classmethod
    def format(cls, value) -> bytes:
        """format writes a long double as redis-server's ld2string(LD_STR_HUMAN): "%.17Lf", trailing
        zeros trimmed, "-0" as "0"."""
        if isinstance(value, float):
            return b"inf" if value > 0 else b"-inf"
        units = round(abs(value) * 10 ** 17)    # printf rounds the exact value, ties to even
        whole, fraction = divmod(units, 10 ** 17)
        text = (_big_str(whole) + b".%017d" % fraction).rstrip(b"0").rstrip(b".")
        return b"-" + text if value < 0 and text != b"0" else text


def _big_int(digits: bytes) -> int:
    """_big_int reads a decimal integer of any length (int() refuses more than 4300 digits)."""
    value = 0
    for at in range(0, len(digits), 1000):
        chunk = digits[at:at + 1000]
        value = value * 10 ** len(chunk) + int(chunk)
    return value


def _big_str(value: int) -> bytes:
    """_big_str writes a non-negative integer of any length in decimal (str() refuses more than 4300 digits)."""
    chunks = []
    while value >= 10 ** 1000:
        value, chunk = divmod(value, 10 ** 1000)
        chunks.append(b"%01000d" % chunk)
    chunks.append(b"%d" % value)
    return b"".join(reversed(chunks))


def _exponent(text: bytes | None) -> int:
    """_exponent reads a float's exponent; one of more than nine digits is taken as +-2**40 (far out of range)."""
    if not text:
        return 0
    if len(text.lstrip(b"+-").lstrip(b"0")) > 9:
        return -1 << 40 if text.startswith(b"-") else 1 << 40
    return int(text)


# -- commands ------------------------------------------------------------------------------------
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


def _count(text: bytes) -> int:
    """_count reads HRANDFIELD's count: a long other than LONG_MIN (redis-server's getRangeLongFromObject)."""
    count = integer(text)
    if count == INT64_MIN:
        raise ReplyError(f"ERR value is out of range, value must between {-INT64_MAX} and {INT64_MAX}")
    return count


@command("HRANDFIELD", -2, READ)
def hrandfield(ctx, args):
    """hrandfield answers HRANDFIELD key [count [WITHVALUES]]: random fields (a negative count may repeat them).

    WITHVALUES answers Pairs: flat in RESP2, [field, value] arrays in RESP3, as redis-server does.
    """
    if len(args) == 2:
        value = ctx.state.get_typed(args[1], ctx.now, Hash)
        return None if value is None else random_of(ctx).choice(list(value))
    count = _count(args[2])
    if len(args) > 4 or (len(args) == 4 and args[3].upper() != b"WITHVALUES"):
        raise ReplyError(SYNTAX)
    with_values = len(args) == 4
    if with_values and not -(INT64_MAX // 2) <= count <= INT64_MAX // 2:
        raise ReplyError("ERR value is out of range")
    value = ctx.state.get_typed(args[1], ctx.now, Hash)
    if value is None or count == 0:
        return []
    items, pick = list(value.items()), random_of(ctx)
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
    after = key_of_cursor(args[2])
    value = ctx.state.get_typed(args[1], ctx.now, Hash)
    if value is None:
        return [b"0", []]
    pattern, count, _ = scan_options(args, 3)
    if len(value) <= SMALL_HASH:
        fields, last = list(value), None
    else:
        later = value if after is None else (field for field in value if field > after)
        fields = heapq.nsmallest(count + 1, later)
        last = fields[count - 1] if len(fields) > count else None
        del fields[count:]
    match = compile_pattern(pattern).match if pattern is not None else None
    found = []
    for field in fields:
        if match is None or match(field):
            found += (field, value[field])
    return [cursor_of(last), found]
