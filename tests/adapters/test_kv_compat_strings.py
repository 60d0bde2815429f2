"""Keys and strings against a real redis-server 7.0, byte for byte: expiry, SET and kin, INCRBYFLOAT, RENAME, OBJECT.

Times that could differ by a millisecond between the two servers are compared only through TTL in
seconds (long TTLs) or through absolute times the test chooses (EXPIREAT, PXAT).
"""

from __future__ import annotations

import pytest

from walkit.adapters.kv.commands import COMMANDS

FAR = b"4102444800"             # 2100-01-01 in unix seconds: an absolute time that is still to come
FAR_MS = FAR + b"000"


def wrong_type_key(pair, key: bytes = b"list") -> bytes:
    """wrong_type_key makes `key` a list on both servers (a value no string command takes)."""
    pair.same([b"RPUSH", key, b"a", b"b"])
    return key


def test_set_options_and_their_errors(redis_pair):
    redis_pair.reset()
    redis_pair.same(
        [b"SET", b"k", b"v"], [b"GET", b"k"], [b"SET", b"k", b"w", b"NX"], [b"SET", b"k", b"w", b"XX"], [b"GET", b"k"],
        [b"SET", b"new", b"v", b"XX"], [b"EXISTS", b"new"], [b"SET", b"k", b"x", b"nx", b"nx"],
        [b"SET", b"k", b"v", b"NX", b"XX"], [b"SET", b"k", b"v", b"XX", b"NX"],
        [b"SET", b"k", b"y", b"GET"], [b"SET", b"absent", b"y", b"GET"], [b"SET", b"k", b"z", b"NX", b"GET"],
        [b"SET", b"k2", b"z", b"NX", b"GET"], [b"SET", b"k3", b"z", b"XX", b"GET"], [b"EXISTS", b"k3"],
        [b"SET", b"k", b"v", b"EX", b"1000"], [b"TTL", b"k"], [b"SET", b"k", b"v", b"PX", b"1000000"], [b"TTL", b"k"],
        [b"SET", b"k", b"v", b"EX", b"10", b"EX", b"1000"], [b"TTL", b"k"],
        [b"SET", b"k", b"v", b"EX", b"abc", b"EX", b"2000"], [b"TTL", b"k"],
        [b"SET", b"k", b"w", b"KEEPTTL"], [b"TTL", b"k"], [b"SET", b"k", b"w", b"KEEPTTL", b"KEEPTTL"], [b"TTL", b"k"],
        [b"SET", b"k", b"w"], [b"TTL", b"k"], [b"SET", b"fresh", b"w", b"KEEPTTL"], [b"TTL", b"fresh"],
        [b"SET", b"k", b"v", b"EXAT", FAR], [b"TTL", b"k"], [b"EXPIRETIME", b"k"],
        [b"SET", b"k", b"v", b"PXAT", FAR_MS + b"1"], [b"PEXPIRETIME", b"k"],
        [b"SET", b"k", b"v", b"PXAT", b"1"], [b"GET", b"k"], [b"EXISTS", b"k"],
        [b"SET", b"k", b"v", b"EXAT", b"1", b"GET"], [b"SET", b"k", b"v", b"GET", b"EX", b"1000"], [b"TTL", b"k"],
        [b"SET", b"k", b"v", b"PX", b"1000000000000000000"], [b"TTL", b"k"],
        [b"SET", b"k", b"v", b"EXAT", b"9223372036854775"], [b"TTL", b"k"],
        [b"SET", b"k", b"v", b"PXAT", b"9223372036854775807"], [b"TTL", b"k"], [b"EXPIRETIME", b"k"],
        [b"SET", b"k", b"v", b"set", b"xx", b"get", b"px", b"5000000"],
    )
    errors = [
        [b"SET", b"k", b"v", b"EX", b"0"], [b"SET", b"k", b"v", b"EX", b"-1"], [b"SET", b"k", b"v", b"PX", b"0"],
        [b"SET", b"k", b"v", b"EXAT", b"0"], [b"SET", b"k", b"v", b"PXAT", b"-5"], [b"SET", b"k", b"v", b"EX", b"abc"],
        [b"SET", b"k", b"v", b"EX", b"1.5"], [b"SET", b"k", b"v", b"EX", b"9223372036854775"],
        [b"SET", b"k", b"v", b"EX", b"9223372036854776"], [b"SET", b"k", b"v", b"EXAT", b"9223372036854776"],
        [b"SET", b"k", b"v", b"PX", b"9223372036854775807"], [b"SET", b"k", b"v", b"PX", b"9223372036854775806"],
        [b"SET", b"k", b"v", b"PX", b"9223372036854775808"],
        [b"SET", b"k", b"v", b"EX"], [b"SET", b"k", b"v", b"EX", b"0", b"foo"], [b"SET", b"k", b"v", b"foo"],
        [b"SET", b"k", b"v", b"EX", b"10", b"KEEPTTL"], [b"SET", b"k", b"v", b"KEEPTTL", b"EX", b"10"],
        [b"SET", b"k", b"v", b"PX", b"10", b"EX", b"10"], [b"SET", b"k", b"v", b"EX", b"10", b"PXAT", b"10"],
        [b"SET", b"k", b"v", b"EX", b"10", b"PERSIST"], [b"SET", b"k", b"v", b"PERSIST"],
        [b"SET", b"k"], [b"SET"],
    ]
    redis_pair.same([b"SET", b"k", b"before"], *errors, [b"GET", b"k"], [b"TTL", b"k"])


def test_set_on_a_key_of_another_type(redis_pair):
    redis_pair.reset()
    key = wrong_type_key(redis_pair)
    redis_pair.same(
        [b"SET", key, b"v", b"GET"], [b"SET", key, b"v", b"GET", b"NX"], [b"SET", key, b"v", b"GET", b"XX"],
        [b"SET", key, b"v", b"GET", b"EX", b"0"], [b"TYPE", key], [b"SET", key, b"v", b"NX"], [b"TYPE", key],
        [b"EXPIRE", key, b"1000"], [b"SET", key, b"v", b"KEEPTTL"], [b"TYPE", key], [b"TTL", key],
        [b"RPUSH", b"l2", b"a"], [b"SET", b"l2", b"v"], [b"GET", b"l2"],
    )


def test_setex_psetex_setnx_getset_getdel(redis_pair):
    redis_pair.reset()
    key = wrong_type_key(redis_pair)
    redis_pair.same(
        [b"SETEX", b"k", b"1000", b"v"], [b"GET", b"k"], [b"TTL", b"k"],
        [b"PSETEX", b"k", b"2000000", b"w"], [b"GET", b"k"], [b"TTL", b"k"],
        [b"SETEX", b"k", b"0", b"v"], [b"SETEX", b"k", b"-1", b"v"], [b"SETEX", b"k", b"abc", b"v"],
        [b"SETEX", b"k", b"9223372036854775", b"v"], [b"SETEX", b"k", b"9223372036854774", b"v"],
        [b"PSETEX", b"k", b"0", b"v"], [b"PSETEX", b"k", b"9223372036854775807", b"v"], [b"GET", b"k"],
        [b"SETEX", b"k", b"10"], [b"PSETEX", b"k"], [b"SETEX", b"k", b"10", b"v", b"x"], [b"SETEX", key, b"1000", b"v"],
        [b"GET", key], [b"TTL", key],
        [b"SETNX", b"n", b"1"], [b"SETNX", b"n", b"2"], [b"GET", b"n"], [b"SETNX", b"k", b"x"], [b"SETNX", b"n"],
        [b"RPUSH", b"l", b"a"], [b"SETNX", b"l", b"x"], [b"TYPE", b"l"],
        [b"GETSET", b"k", b"new"], [b"TTL", b"k"], [b"GETSET", b"nokey", b"v"], [b"GET", b"nokey"],
        [b"GETSET", b"l", b"v"], [b"GETSET", b"k"], [b"GETSET", b"k", b"v", b"w"],
        [b"GETDEL", b"k"], [b"EXISTS", b"k"], [b"GETDEL", b"k"], [b"GETDEL", b"l"], [b"TYPE", b"l"], [b"GETDEL"],
        [b"GETDEL", b"a", b"b"],
    )


def test_mset_and_msetnx(redis_pair):
    redis_pair.reset()
    redis_pair.same(
        [b"MSETNX", b"a", b"1", b"b", b"2"], [b"MGET", b"a", b"b"], [b"MSETNX", b"a", b"9", b"c", b"3"],
        [b"MGET", b"a", b"c"], [b"EXISTS", b"c"], [b"MSETNX", b"x", b"1", b"x", b"2"], [b"GET", b"x"],
        [b"RPUSH", b"l", b"a"], [b"MSETNX", b"l", b"1", b"d", b"2"], [b"EXISTS", b"d"],
        [b"MSETNX", b"a", b"1", b"b"], [b"MSETNX", b"a"], [b"MSETNX"],
        [b"MSET", b"a", b"1", b"b"], [b"MSET", b"l", b"x", b"a", b"y"], [b"MGET", b"l", b"a", b"nokey"],
        [b"SET", b"t", b"v", b"EX", b"1000"], [b"MSET", b"t", b"w"], [b"TTL", b"t"],
    )


def test_getex_options(redis_pair):
    redis_pair.reset()
    key = wrong_type_key(redis_pair)
    redis_pair.same(
        [b"SET", b"k", b"v"], [b"GETEX", b"k"], [b"TTL", b"k"], [b"GETEX", b"k", b"EX", b"1000"], [b"TTL", b"k"],
        [b"GETEX", b"k", b"PX", b"2000000"], [b"TTL", b"k"], [b"GETEX", b"k", b"EX", b"10", b"EX", b"3000"],
        [b"TTL", b"k"], [b"GETEX", b"k", b"EXAT", FAR], [b"EXPIRETIME", b"k"],
        [b"GETEX", b"k", b"PXAT", FAR_MS + b"7"], [b"PEXPIRETIME", b"k"], [b"GETEX", b"k", b"PERSIST"], [b"TTL", b"k"],
        [b"GETEX", b"k", b"PERSIST"], [b"TTL", b"k"], [b"GETEX", b"k", b"pxat", b"9223372036854775807"], [b"TTL", b"k"],
        [b"GETEX", b"k", b"EXAT", b"1"], [b"EXISTS", b"k"], [b"SET", b"k", b"v"],
        [b"GETEX", b"k", b"PXAT", b"5"], [b"EXISTS", b"k"], [b"SET", b"k", b"v"],
        [b"GETEX", b"k", b"EX", b"0"], [b"GETEX", b"k", b"EX", b"-1"], [b"GETEX", b"k", b"EX", b"abc"],
        [b"GETEX", b"k", b"EX", b"9223372036854776"], [b"GETEX", b"k", b"PX", b"9223372036854775807"],
        [b"GETEX", b"k", b"EXAT", b"0"], [b"GETEX", b"k", b"EX"], [b"GETEX", b"k", b"PERSIST", b"EX", b"10"],
        [b"GETEX", b"k", b"EX", b"10", b"PERSIST"], [b"GETEX", b"k", b"KEEPTTL"], [b"GETEX", b"k", b"NX"],
        [b"GETEX", b"k", b"GET"], [b"GETEX", b"k", b"EX", b"10", b"PX", b"10"], [b"GETEX", b"k", b"foo"],
        [b"TTL", b"k"], [b"GETEX", b"nokey", b"EX", b"0"], [b"GETEX", b"nokey", b"EX", b"10", b"foo"],
        [b"GETEX", key], [b"GETEX", key, b"EX", b"0"], [b"GETEX", key, b"PERSIST"], [b"GETEX"],
    )


def test_append_strlen_getrange_setrange(redis_pair):
    redis_pair.reset()
    key = wrong_type_key(redis_pair)
    redis_pair.same(
        [b"APPEND", b"k", b"abc"], [b"APPEND", b"k", b"def"], [b"GET", b"k"], [b"APPEND", b"k", b""],
        [b"APPEND", key, b"x"], [b"APPEND", b"k"], [b"STRLEN", b"k"], [b"STRLEN", b"nokey"], [b"STRLEN", key],
        [b"STRLEN"], [b"SET", b"t", b"v", b"EX", b"1000"], [b"APPEND", b"t", b"w"], [b"TTL", b"t"],
        [b"SET", b"n", b"12"], [b"APPEND", b"n", b"3"], [b"INCR", b"n"], [b"STRLEN", b"n"],
    )
    ranges = [(b"0", b"-1"), (b"-3", b"-1"), (b"-1", b"-3"), (b"5", b"2"), (b"100", b"200"), (b"-100", b"2"),
              (b"0", b"100"), (b"2", b"2"), (b"-1", b"-1"), (b"0", b"0"), (b"-100", b"-50"), (b"3", b"-100"),
              (b"-9223372036854775808", b"9223372036854775807"), (b"9223372036854775807", b"-9223372036854775808")]
    redis_pair.same(*([b"GETRANGE", b"k", start, end] for start, end in ranges))
    redis_pair.same(*([b"SUBSTR", b"k", start, end] for start, end in ranges[:4]))
    redis_pair.same(
        [b"SET", b"e", b""], [b"GETRANGE", b"e", b"0", b"-1"], [b"GETRANGE", b"e", b"-1", b"0"],
        [b"GETRANGE", b"n", b"1", b"2"], [b"GETRANGE", b"nokey", b"0", b"1"], [b"GETRANGE", key, b"0", b"1"],
        [b"GETRANGE", b"k", b"a", b"1"], [b"GETRANGE", b"k", b"0", b"b"], [b"GETRANGE", b"nokey", b"a", b"1"],
        [b"GETRANGE", key, b"x", b"1"], [b"GETRANGE", b"k", b"0"], [b"SUBSTR", b"k", b"1"],
        [b"GETRANGE", b"k", b"0", b"1", b"2"],
    )
    redis_pair.same(
        [b"SETRANGE", b"k", b"1", b"ZZ"], [b"GET", b"k"], [b"SETRANGE", b"k", b"10", b"end"], [b"GET", b"k"],
        [b"SETRANGE", b"k", b"0", b""], [b"SETRANGE", b"k", b"-1", b"x"], [b"SETRANGE", b"k", b"abc", b"x"],
        [b"SETRANGE", b"k", b"536870912", b"x"], [b"SETRANGE", b"k", b"536870911", b"xy"],
        [b"SETRANGE", b"k", b"536870912", b""], [b"SETRANGE", b"k", b"9223372036854775807", b"x"],
        [b"SETRANGE", b"new", b"536870912", b""], [b"SETRANGE", b"new", b"536870912", b"x"],
        [b"SETRANGE", b"new", b"3", b""], [b"EXISTS", b"new"], [b"SETRANGE", b"new", b"3", b"x"], [b"GET", b"new"],
        [b"SETRANGE", key, b"0", b"x"], [b"SETRANGE", key, b"-1", b"x"], [b"SETRANGE", key, b"0", b""],
        [b"SETRANGE", b"t", b"0", b"W"], [b"GET", b"t"], [b"TTL", b"t"], [b"SETRANGE", b"n", b"0", b"9"],
        [b"INCR", b"n"], [b"SETRANGE", b"k", b"1"], [b"SETRANGE", b"k", b"1", b"x", b"y"],
        [b"GET", b"k"],
    )


INCREMENTS = [
    b"0.1", b"0.2", b"1e3", b"-1000.3", b"0x10", b"0x1p-3", b"+.5", b"5.", b"0e-5000", b"1.5e-7", b"-0", b"3.0",
    b"123456789012345678901234567890", b"0.000003814697265625", b"0.000011444091796875", b"-1.00000000000000000001",
    b"1E5", b"-0X1P+2", b"00001", b"1e+0", b"0.1", b"-0.30000000000000004", b"17", b"-99999999999999999999",
]
BAD_INCREMENTS = [
    b"abc", b"inf", b"-inf", b"infinity", b"-INF", b"nan", b" 1", b"1 ", b"1e5000", b"1e-5000", b"", b"1e", b".",
    b"0x", b"0x1p", b"1\x002", b"1,5", b"++1", b"1.19e4932",
]


def test_incrbyfloat_digits_match(redis_pair):
    redis_pair.reset()
    redis_pair.same(*([b"INCRBYFLOAT", b"k", step] for step in INCREMENTS))
    redis_pair.same(*([b"INCRBYFLOAT", b"k", step] for step in BAD_INCREMENTS), [b"GET", b"k"])
    starts = [b"1e4000", b"1.7976931348623157e308", b"-0.000000000000000006", b"10.5", b"1.18e4932", b"0x1p-16445",
              b"3.6e-4951", b"-5", b"9223372036854775807", b"0.1"]
    for start in starts:
        redis_pair.same([b"SET", b"f", start], [b"INCRBYFLOAT", b"f", b"1"], [b"INCRBYFLOAT", b"f", b"-1.5e-3"],
                        [b"GET", b"f"])
    redis_pair.same([b"SET", b"f", b"1.18e4932"], [b"INCRBYFLOAT", b"f", b"1.18e4932"], [b"GET", b"f"])


def test_incrbyfloat_errors_keep_the_value_and_the_expiry(redis_pair):
    redis_pair.reset()
    key = wrong_type_key(redis_pair)
    redis_pair.same(
        [b"SET", b"k", b"10.5", b"EX", b"1000"], [b"INCRBYFLOAT", b"k", b"1"], [b"TTL", b"k"],
        [b"SET", b"s", b"abc"], [b"INCRBYFLOAT", b"s", b"1"], [b"INCRBYFLOAT", b"s", b"x"],
        [b"SET", b"i", b"inf"], [b"INCRBYFLOAT", b"i", b"0"], [b"INCRBYFLOAT", b"i", b"x"], [b"GET", b"i"],
        [b"SET", b"z", b"1\x002"], [b"INCRBYFLOAT", b"z", b"1"],
        [b"INCRBYFLOAT", key, b"1"], [b"INCRBYFLOAT", key, b"x"],
        [b"INCRBYFLOAT", b"k"], [b"INCRBYFLOAT", b"k", b"1", b"2"], [b"GET", b"k"],
    )


def test_expire_family(redis_pair):
    redis_pair.reset()
    redis_pair.same(
        [b"SET", b"k", b"v"], [b"EXPIRE", b"k", b"1000"], [b"TTL", b"k"], [b"PEXPIRE", b"k", b"2000000"],
        [b"TTL", b"k"], [b"PEXPIRE", b"k", b"2000"], [b"TTL", b"k"],      # 1999.x ms round to 2 s, not down to 1
        [b"EXPIREAT", b"k", FAR], [b"EXPIRETIME", b"k"], [b"PEXPIRETIME", b"k"], [b"TTL", b"nokey"],
        [b"PEXPIREAT", b"k", FAR_MS + b"499"], [b"EXPIRETIME", b"k"], [b"PEXPIRETIME", b"k"],
        [b"PEXPIREAT", b"k", FAR_MS + b"500"], [b"EXPIRETIME", b"k"],
        [b"EXPIRE", b"nokey", b"10"], [b"PEXPIRE", b"nokey", b"10"], [b"EXPIREAT", b"nokey", FAR],
        [b"PEXPIREAT", b"nokey", FAR_MS], [b"PEXPIREAT", b"k", b"9223372036854775807"], [b"PEXPIRETIME", b"k"],
        [b"EXPIRETIME", b"k"], [b"EXPIREAT", b"k", b"9223372036854775"], [b"EXPIRETIME", b"k"],
        [b"EXPIRE", b"k", b"0"], [b"EXISTS", b"k"], [b"SET", b"k", b"v"], [b"EXPIRE", b"k", b"-1"], [b"EXISTS", b"k"],
        [b"SET", b"k", b"v"], [b"PEXPIRE", b"k", b"0"], [b"GET", b"k"], [b"SET", b"k", b"v"],
        [b"EXPIREAT", b"k", b"1"], [b"EXISTS", b"k"], [b"SET", b"k", b"v"], [b"PEXPIREAT", b"k", b"-100"],
        [b"EXISTS", b"k"], [b"SET", b"k", b"v"], [b"EXPIRE", b"k", b"-9223372036854775"], [b"EXISTS", b"k"],
        [b"SET", b"k", b"v"], [b"PEXPIRE", b"k", b"-9223372036854775808"], [b"EXISTS", b"k"],
        [b"SET", b"gone", b"v", b"PXAT", b"1"], [b"EXPIRE", b"gone", b"100"], [b"PERSIST", b"gone"],
        [b"EXPIRETIME", b"gone"], [b"TTL", b"gone"],
    )


def test_expire_flags(redis_pair):
    redis_pair.reset()
    redis_pair.same(
        [b"SET", b"k", b"v"], [b"EXPIRE", b"k", b"1000", b"XX"], [b"TTL", b"k"], [b"EXPIRE", b"k", b"1000", b"GT"],
        [b"TTL", b"k"], [b"EXPIRE", b"k", b"1000", b"LT"], [b"TTL", b"k"], [b"EXPIRE", b"k", b"500", b"LT"],
        [b"TTL", b"k"], [b"EXPIRE", b"k", b"2000", b"nx"], [b"TTL", b"k"], [b"EXPIRE", b"k", b"400", b"GT"],
        [b"TTL", b"k"], [b"EXPIRE", b"k", b"3000", b"gt"], [b"TTL", b"k"], [b"EXPIRE", b"k", b"4000", b"XX", b"GT"],
        [b"TTL", b"k"], [b"EXPIRE", b"k", b"100", b"XX", b"LT"], [b"TTL", b"k"], [b"EXPIRE", b"k", b"5000", b"LT"],
        [b"TTL", b"k"], [b"EXPIRE", b"k", b"0", b"GT"], [b"EXISTS", b"k"], [b"EXPIRE", b"k", b"0", b"XX"],
        [b"EXISTS", b"k"], [b"SET", b"k", b"v"], [b"EXPIRE", b"k", b"-5", b"LT"], [b"EXISTS", b"k"],
        [b"SET", b"k", b"v"], [b"EXPIRE", b"k", b"100", b"NX"], [b"TTL", b"k"],
        [b"EXPIRE", b"k", b"1000", b"XX", b"XX"], [b"TTL", b"k"], [b"PEXPIRE", b"k", b"2000000", b"GT"],
        [b"TTL", b"k"], [b"EXPIREAT", b"k", FAR, b"LT"], [b"TTL", b"k"], [b"PEXPIREAT", b"k", FAR_MS, b"GT"],
        [b"EXPIRETIME", b"k"], [b"EXPIRE", b"nokey", b"10", b"NX"], [b"EXPIRE", b"nokey", b"10", b"GT"],
    )
    errors = [
        [b"EXPIRE", b"k", b"10", b"foo"], [b"EXPIRE", b"k", b"abc", b"nx"], [b"EXPIRE", b"k", b"abc", b"foo"],
        [b"EXPIRE", b"k", b"10", b"NX", b"XX"], [b"EXPIRE", b"k", b"10", b"GT", b"LT"],
        [b"EXPIRE", b"k", b"10", b"NX", b"GT"], [b"EXPIRE", b"k", b"10", b"LT", b"NX"],
        [b"EXPIRE", b"k", b"10", b"XX", b"GT", b"LT"], [b"EXPIRE", b"k", b"10", b"nx", b"foo"],
        [b"EXPIRE", b"k", b"9223372036854776"], [b"EXPIRE", b"k", b"-9223372036854776"],
        [b"EXPIRE", b"k", b"9223372036854775"], [b"PEXPIRE", b"k", b"9223372036854775807"],
        [b"EXPIREAT", b"k", b"9223372036854776"], [b"EXPIREAT", b"k", b"-9223372036854776"],
        [b"EXPIRE", b"nokey", b"abc"], [b"EXPIRE", b"nokey", b"9223372036854776"], [b"PEXPIRE", b"k", b"1.5"],
        [b"EXPIRE", b"k"], [b"PEXPIRE"], [b"EXPIREAT", b"k"], [b"PEXPIREAT", b"k"],
    ]
    redis_pair.same(*errors, [b"TTL", b"k"], [b"EXISTS", b"k"])


def test_persist_and_expiretime(redis_pair):
    redis_pair.reset()
    key = wrong_type_key(redis_pair)
    redis_pair.same(
        [b"PERSIST", b"nokey"], [b"SET", b"p", b"v"], [b"PERSIST", b"p"], [b"EXPIRE", b"p", b"1000"],
        [b"PERSIST", b"p"], [b"TTL", b"p"], [b"PERSIST", b"p"], [b"EXPIRETIME", b"nokey"], [b"EXPIRETIME", b"p"],
        [b"PEXPIRETIME", b"p"], [b"PEXPIRETIME", b"nokey"], [b"EXPIREAT", key, FAR], [b"EXPIRETIME", key],
        [b"PERSIST", key],
        [b"EXPIRETIME", key], [b"PERSIST"], [b"PERSIST", b"a", b"b"], [b"EXPIRETIME"], [b"PEXPIRETIME", b"a", b"b"],
    )


def test_rename_and_renamenx(redis_pair):
    redis_pair.reset()
    key = wrong_type_key(redis_pair)
    redis_pair.same(
        [b"RENAME", b"a", b"b"], [b"RENAMENX", b"a", b"b"], [b"SET", b"a", b"1"], [b"RENAME", b"a", b"a"],
        [b"RENAMENX", b"a", b"a"], [b"EXPIRE", b"a", b"1000"], [b"RENAME", b"a", b"b"], [b"TTL", b"b"],
        [b"EXISTS", b"a"], [b"GET", b"b"], [b"SET", b"c", b"2"], [b"RENAMENX", b"b", b"c"], [b"GET", b"c"],
        [b"RENAME", b"b", b"c"], [b"TTL", b"c"], [b"GET", b"c"], [b"EXISTS", b"b"], [b"RENAMENX", b"c", b"d"],
        [b"TTL", b"d"], [b"RENAME", key, b"d"], [b"TYPE", b"d"], [b"TTL", b"d"], [b"LRANGE", b"d", b"0", b"-1"],
        [b"RENAME", b"d", b"d"], [b"RENAMENX", b"nokey", b"d"], [b"RENAME", b"a"], [b"RENAMENX", b"a", b"b", b"c"],
        [b"SET", b"gone", b"v", b"PXAT", b"1"], [b"RENAME", b"gone", b"x"], [b"RENAMENX", b"d", b"gone"],
        [b"GET", b"gone"], [b"TYPE", b"gone"],
    )


def test_copy(redis_pair):
    redis_pair.reset()
    redis_pair.same(
        [b"SET", b"c", b"2"], [b"EXPIRE", b"c", b"1000"], [b"COPY", b"c", b"d"], [b"GET", b"d"], [b"TTL", b"d"],
        [b"COPY", b"c", b"c"], [b"COPY", b"c", b"d"], [b"SET", b"c", b"3"], [b"COPY", b"c", b"d", b"REPLACE"],
        [b"GET", b"d"], [b"TTL", b"d"], [b"COPY", b"c", b"d", b"DB", b"0"], [b"COPY", b"c", b"c", b"DB", b"0"],
        [b"COPY", b"c", b"e", b"db", b"0", b"replace"], [b"GET", b"e"],
        [b"COPY", b"c", b"d", b"DB", b"16"], [b"COPY", b"c", b"d", b"DB", b"-1"], [b"COPY", b"c", b"d", b"DB", b"abc"],
        [b"COPY", b"c", b"d", b"DB", b"4294967296"], [b"COPY", b"c", b"d", b"DB"], [b"COPY", b"c", b"d", b"foo"],
        [b"COPY", b"nokey", b"d"], [b"COPY", b"nokey", b"d", b"foo"], [b"COPY", b"c", b"d", b"REPLACE", b"REPLACE"],
        [b"COPY", b"c", b"c", b"foo"], [b"COPY"], [b"COPY", b"a"],
        [b"RPUSH", b"l", b"a", b"b"], [b"COPY", b"l", b"l2"], [b"RPUSH", b"l2", b"c"], [b"LRANGE", b"l", b"0", b"-1"],
        [b"LRANGE", b"l2", b"0", b"-1"], [b"COPY", b"l", b"c", b"REPLACE"], [b"TYPE", b"c"], [b"TTL", b"c"],
    )
    got = redis_pair.send(b"COPY", b"c", b"x", b"DB", b"1")
    assert got["redis"] == b":1\r\n"                # redis has 16 databases, walkit only 0 (SELECT 1 fails too)
    assert got["walkit"] == b"-ERR DB index is out of range\r\n"


def test_copy_of_every_type_is_independent(redis_pair):
    redis_pair.reset()
    redis_pair.same([b"HSET", b"h", b"f", b"v"], [b"COPY", b"h", b"h2"], [b"HSET", b"h2", b"g", b"w"],
                    [b"HLEN", b"h"], [b"HLEN", b"h2"], [b"SADD", b"s", b"1", b"2"], [b"COPY", b"s", b"s2"],
                    [b"SREM", b"s2", b"1"], [b"SCARD", b"s"], [b"SCARD", b"s2"])
    if b"ZADD" in COMMANDS:
        redis_pair.same([b"ZADD", b"z", b"1", b"a"], [b"COPY", b"z", b"z2"], [b"ZADD", b"z2", b"2", b"b"],
                        [b"ZCARD", b"z"], [b"ZCARD", b"z2"])


def test_randomkey(redis_pair):
    redis_pair.reset()
    redis_pair.same([b"RANDOMKEY"], [b"SET", b"only", b"v"], [b"RANDOMKEY"], [b"RANDOMKEY", b"x"],
                    [b"SET", b"gone", b"v", b"PXAT", b"1"], [b"RANDOMKEY"], [b"DEL", b"only"], [b"RANDOMKEY"])
    keys = {b"k%d" % i for i in range(20)}
    for key in keys:
        redis_pair.same([b"SET", key, b"v"])
    seen = set()
    for _ in range(40):
        reply = redis_pair.send(b"RANDOMKEY")["walkit"]
        assert reply.startswith(b"$")
        seen.add(reply.split(b"\r\n")[1])
    assert seen <= keys and len(seen) > 1


def test_object_encoding_of_strings(redis_pair):
    redis_pair.reset()
    values = [b"1", b"0", b"-1", b"9999", b"10000", b"1234567890123456789", b"-1234567890123456789",
              b"12345678901234567890", b"9223372036854775807", b"-9223372036854775808", b"9223372036854775808",
              b"01", b"-0", b"+1", b" 1", b"1.5", b"", b"abc", b"x" * 44, b"x" * 45, b"1" * 44, b"1" * 45]
    for value in values:
        redis_pair.same([b"SET", b"k", value], [b"OBJECT", b"ENCODING", b"k"], [b"OBJECT", b"REFCOUNT", b"k"])
    redis_pair.same([b"INCR", b"i"], [b"OBJECT", b"ENCODING", b"i"], [b"OBJECT", b"REFCOUNT", b"i"],
                    [b"MSET", b"m", b"5"], [b"OBJECT", b"ENCODING", b"m"], [b"SETEX", b"m", b"100", b"5"],
                    [b"OBJECT", b"ENCODING", b"m"], [b"GETSET", b"m", b"x" * 50], [b"OBJECT", b"ENCODING", b"m"],
                    [b"OBJECT", b"ENCODING", b"nokey"], [b"OBJECT", b"REFCOUNT", b"nokey"],
                    [b"OBJECT", b"FREQ", b"nokey"], [b"OBJECT", b"IDLETIME", b"nokey"], [b"OBJECT", b"FREQ", b"k"],
                    [b"OBJECT", b"object", b"k"])


def test_object_encoding_of_containers(redis_pair):
    redis_pair.reset()
    redis_pair.same(
        [b"RPUSH", b"l", b"1"], [b"OBJECT", b"ENCODING", b"l"], [b"OBJECT", b"REFCOUNT", b"l"],
        [b"HSET", b"h", b"f", b"v"], [b"OBJECT", b"ENCODING", b"h"], [b"HSET", b"big", b"f", b"v" * 65],
        [b"OBJECT", b"ENCODING", b"big"], [b"HSET", b"bigf", b"f" * 65, b"v"], [b"OBJECT", b"ENCODING", b"bigf"],
        [b"HSET", b"h64", b"f" * 64, b"v" * 64], [b"OBJECT", b"ENCODING", b"h64"],
        [b"HSET", b"many", *[b"f%d" % i for i in range(1024)]], [b"OBJECT", b"ENCODING", b"many"],
        [b"HSET", b"more", *[b"f%d" % i for i in range(1026)]], [b"OBJECT", b"ENCODING", b"more"],
        [b"SADD", b"s1", b"1", b"-5"], [b"OBJECT", b"ENCODING", b"s1"], [b"SADD", b"s2", b"a"],
        [b"OBJECT", b"ENCODING", b"s2"], [b"SADD", b"s3", *[b"%d" % i for i in range(512)]],
        [b"OBJECT", b"ENCODING", b"s3"], [b"SADD", b"s4", *[b"%d" % i for i in range(513)]],
        [b"OBJECT", b"ENCODING", b"s4"], [b"SADD", b"s5", b"01"], [b"OBJECT", b"ENCODING", b"s5"],
    )
    if b"ZADD" in COMMANDS:
        redis_pair.same(
            [b"ZADD", b"z", b"1", b"a"], [b"OBJECT", b"ENCODING", b"z"], [b"ZADD", b"z2", b"1", b"a" * 65],
            [b"OBJECT", b"ENCODING", b"z2"], [b"ZADD", b"z3", *[p for i in range(129) for p in (b"1", b"m%d" % i)]],
            [b"OBJECT", b"ENCODING", b"z3"], [b"ZADD", b"z4", *[p for i in range(128) for p in (b"1", b"m%d" % i)]],
            [b"OBJECT", b"ENCODING", b"z4"],
        )


def test_object_subcommand_errors(redis_pair):
    redis_pair.reset()
    redis_pair.same(
        [b"SET", b"k", b"v"], [b"OBJECT"], [b"OBJECT", b"ENCODING"], [b"OBJECT", b"encoding", b"k", b"x"],
        [b"OBJECT", b"foo"], [b"OBJECT", b"foo", b"k"], [b"object", b"bar", b"k"], [b"OBJECT", b"HELP", b"x"],
        [b"OBJECT", b"help"], [b"OBJECT", b"REFCOUNT"], [b"OBJECT", b"FREQ", b"k", b"x"], [b"OBJECT", b"IDLETIME"],
    )


def test_wrong_arity_of_every_command(redis_pair):
    redis_pair.reset()
    calls = [[b"SETNX", b"k"], [b"SETEX", b"k", b"1"], [b"PSETEX"], [b"MSETNX", b"k"], [b"GETSET", b"k"],
             [b"GETDEL"], [b"GETEX"], [b"APPEND", b"k"], [b"STRLEN"], [b"GETRANGE", b"k", b"0"], [b"SUBSTR"],
             [b"SETRANGE", b"k", b"0"], [b"INCRBYFLOAT", b"k"], [b"RENAME", b"k"], [b"RENAMENX"], [b"RANDOMKEY", b"k"],
             [b"COPY", b"k"], [b"OBJECT"], [b"EXPIRE", b"k"], [b"PEXPIRE", b"k"], [b"EXPIREAT"], [b"PEXPIREAT", b"k"],
             [b"PERSIST"], [b"EXPIRETIME", b"a", b"b"], [b"PEXPIRETIME"], [b"SET", b"k"], [b"GET"]]
    redis_pair.same(*calls)


@pytest.mark.parametrize("name", [b"GET", b"STRLEN", b"GETDEL", b"GETEX", b"APPEND", b"INCRBYFLOAT", b"GETSET",
                                  b"SETRANGE", b"GETRANGE"])
def test_wrong_type_of_every_string_command(redis_pair, name):
    redis_pair.reset()
    key = wrong_type_key(redis_pair)
    extra = {b"APPEND": [b"x"], b"INCRBYFLOAT": [b"1"], b"GETSET": [b"v"], b"SETRANGE": [b"0", b"x"],
             b"GETRANGE": [b"0", b"1"]}.get(name, [])
    redis_pair.same([name, key, *extra], [b"TYPE", key], [b"LLEN", key])
