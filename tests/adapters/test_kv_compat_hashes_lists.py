"""Hash and list commands sent to a real redis-server 7.0 and to walkit's KV server, replies compared
byte for byte (tests/support/redis_compare.py), in RESP2 and RESP3.

A small hash (up to 128 fields of up to 64 bytes) is a listpack in Redis, kept in insertion order
as walkit keeps every hash, so its replies compare byte for byte; a larger one answers in its hash
table's order and is compared as a set (`same_unordered`). Commands are written as text split at
spaces; one with an empty or binary argument is written as a list of bytes.
"""

from __future__ import annotations

import pytest

from tests.support.redis_compare import _parse

LONG_MAX, LONG_MIN = 9223372036854775807, -9223372036854775808


def _args(command) -> list[bytes]:
    return command.encode().split() if isinstance(command, str) else command


def same(pair, *commands) -> None:
    """same compares the replies to each command (text split at spaces, or a list of bytes) byte for byte."""
    pair.same(*map(_args, commands))


def same_unordered(pair, *commands, pairs: bool = False) -> None:
    """same_unordered compares replies whose order is a Redis hash table's as sorted lists."""
    pair.same_unordered(*map(_args, commands), pairs=pairs)


def _fields(count: int, prefix: str = "f") -> list[bytes]:
    return [part for i in range(count) for part in (f"{prefix}{i}".encode(), f"v{i}".encode())]


def _resp3(pair) -> None:
    """_resp3 switches both connections to RESP3 (HELLO's own reply differs: server name, version, id)."""
    replies = pair.send(b"HELLO", b"3")
    assert all(reply.startswith(b"%") for reply in replies.values()), replies


# -- hashes ------------------------------------------------------------------------------------------
def test_hset_hget_and_friends(redis_pair):
    p = redis_pair
    p.reset()
    same(p, "HSET h f1 v1 f2 v2", "HSET h f1 x f3 y", "HSET h d 1 d 2", "HGET h f1", "HGET h d", "HGET h nope",
         "HGET absent f", [b"HMSET", b"h", b"a", b"1", b"b", b""], "HSETNX h a z", "HSETNX h new v", "HSETNX h2 f v",
         "HMGET h a nope b a", "HMGET absent a b", "HLEN h", "HLEN absent", "HEXISTS h a", "HEXISTS h zz",
         "HEXISTS absent a", "HSTRLEN h f1", "HSTRLEN h b", "HSTRLEN h zz", "HSTRLEN absent f",
         "HGETALL h", "HKEYS h", "HVALS h", "HGETALL absent", "HKEYS absent", "HVALS absent", "HGETALL h2",
         [b"HSET", b"bin", b"\x00\xff", b"\r\n", b"", b"empty"], "HGETALL bin", [b"HSTRLEN", b"bin", b"\x00\xff"])


def test_hdel_removes_the_key_with_its_last_field(redis_pair):
    p = redis_pair
    p.reset()
    same(p, "HSET h a 1 b 2 c 3", "HDEL h a nope a", "HDEL h nope", "HGETALL h", "HDEL h b c", "EXISTS h", "TYPE h",
         "HDEL h a", "HDEL absent a", "HLEN h")


def test_hincrby(redis_pair):
    p = redis_pair
    p.reset()
    same(p, "HINCRBY h c 5", "HINCRBY h c -10", "HINCRBY h c abc", "HINCRBY h c 1.5",
         "HINCRBY h c 99999999999999999999", f"HINCRBY h c {LONG_MAX}", f"HINCRBY h c {LONG_MIN}",
         f"HSET h s notint z 007 big {LONG_MAX} neg -0", "HINCRBY h s 1", "HINCRBY h z 1", "HINCRBY h neg 1",
         "HINCRBY h big 1", "HINCRBY h big -1", "HINCRBY h big 0", "HGETALL h", "HINCRBY new f x", "EXISTS new")


FLOATS = ["10.5", "0.1", "0.2", "-0.3", "5.0e3", "2.0e2", "3.0", "1.", ".5", "-.5e1", "0x10", "0X1.8P1", "1e20",
          "0.333333333333333333333", "-1.5", "1e-18", "-0.0000000000000000001", "1.5e-4950",
          "1.23456789012345678901234", "9223372036854775807", "+7", "1e4000", "1.18973149535723176502e+4932",
          "-1e4932", "1\x00junk"]


@pytest.mark.parametrize("start", [None, "10", "0.1", "-7.25", "1e300"])
def test_hincrbyfloat_computes_and_writes_a_long_double(redis_pair, start):
    p = redis_pair
    p.reset()
    if start is not None:
        same(p, f"HSET h f {start}")
    for delta in FLOATS:
        same(p, ["HINCRBYFLOAT", "h", "f", delta], "HGET h f", ["HINCRBYFLOAT", "h", "g" + delta[:20], delta])
    same_unordered(p, "HGETALL h", pairs=True)          # values over 64 bytes: a hash table in Redis


def test_hincrbyfloat_errors(redis_pair):
    p = redis_pair
    p.reset()
    same(p, [b"HSET", b"h", b"inf", b"inf", b"text", b"abc", b"empty", b"", b"space", b" 1", b"nul", b"\x00",
             b"max", b"1.18973149535723176502e+4932", b"hex", b"0x1p-3"])
    for delta in [b"inf", b"-inf", b"Infinity", b"nan", b"NaN", b"abc", b"", b" 1", b"1 ", b"1e", b"0x", b"-",
                  b"1e-5000", b"1e5000", b"1" * 5120, b"1e99999999999", b"0x1p-16446", b"1" * 5000]:
        same(p, [b"HINCRBYFLOAT", b"h", b"new", delta])
    for field in ["inf", "text", "empty", "space", "nul", "max", "hex"]:
        same(p, f"HINCRBYFLOAT h {field} 1")
    same(p, "HINCRBYFLOAT h max 1e4932", "HINCRBYFLOAT h max -1e4932", "HINCRBYFLOAT absent f nan", "EXISTS absent")
    same_unordered(p, "HGETALL h", pairs=True)


def test_hrandfield_where_redis_does_not_pick(redis_pair):
    p = redis_pair
    p.reset()
    same(p, "HSET h a 1 b 2 c 3", "HSET one only x", "HRANDFIELD absent", "HRANDFIELD absent 3",
         "HRANDFIELD absent -3 WITHVALUES", "HRANDFIELD absent abc", "HRANDFIELD h 0", "HRANDFIELD h 0 withvalues",
         "HRANDFIELD h 3", "HRANDFIELD h 10 WITHVALUES", "HRANDFIELD one", "HRANDFIELD one 1", "HRANDFIELD one -4",
         "HRANDFIELD one -3 WITHVALUES", "HRANDFIELD h abc", "HRANDFIELD h 1.5", f"HRANDFIELD h {LONG_MIN}",
         "HRANDFIELD h 1 WITHVALUE", "HRANDFIELD h 1 WITHVALUES x", "HRANDFIELD absent 1 x",
         "HRANDFIELD h -4611686018427387904 WITHVALUES", "HRANDFIELD h 4611686018427387904 WITHVALUES")


def test_hrandfield_picks_fields_of_the_hash(redis_pair):
    p = redis_pair
    p.reset()
    p.same([b"HSET", b"h", *_fields(200)])
    fields = {b"f%d" % i for i in range(200)}
    for command in ("HRANDFIELD h", "HRANDFIELD h 5", "HRANDFIELD h -300", "HRANDFIELD h 50 WITHVALUES",
                    "HRANDFIELD h -5 WITHVALUES"):
        replies = {name: _parse(raw) for name, raw in p.send(*_args(command)).items()}
        shapes = {name: (type(reply), len(reply) if isinstance(reply, list) else 1) for name, reply in replies.items()}
        assert shapes["walkit"] == shapes["redis"], (command, replies)
        reply = replies["walkit"]
        picked = [reply] if isinstance(reply, bytes) else reply[::2] if "WITHVALUES" in command else reply
        assert set(picked) <= fields
        if "WITHVALUES" in command:
            assert all(value == b"v" + field[1:] for field, value in zip(reply[::2], reply[1::2]))
        if command == "HRANDFIELD h 5":
            assert len(set(picked)) == 5


def test_hrandfield_withvalues_in_resp3(redis_pair):
    p = redis_pair
    p.reset()
    _resp3(p)
    same(p, "HSET h a 1 b 2", "HRANDFIELD h 5 WITHVALUES")


def test_hscan_of_a_small_hash_is_whole(redis_pair):
    p = redis_pair
    p.reset()
    p.same([b"HSET", b"h", *_fields(20)])
    same(p, "SET s x", "HSCAN h 0", "HSCAN h 0 COUNT 2", "HSCAN h 0 MATCH f1*", "HSCAN h 0 MATCH * COUNT 1000",
         "HSCAN h 0 MATCH nothing", "HSCAN h 0 count 3 match f?", "HSCAN absent 0", "HSCAN absent 0 COUNT 0",
         "HSCAN absent 0 BAD", "HSCAN h 0 COUNT 0", "HSCAN h 0 COUNT -1", "HSCAN h 0 COUNT abc",
         "HSCAN h 0 TYPE string", "HSCAN h 0 MATCH", "HSCAN h 0 NOVALUES", "HSCAN h abc", "HSCAN s 0", "HSCAN s x",
         "HSCAN s 0 COUNT 0")


def _hscan_all(pair, server: str, *options) -> list[tuple[bytes, bytes]]:
    """_hscan_all iterates HSCAN on one server until cursor 0: the (field, value) pairs it returned."""
    cursor, found = b"0", []
    for _ in range(10_000):
        cursor, items = _parse(pair.send(b"HSCAN", b"h", cursor, *options)[server])
        found += zip(items[::2], items[1::2])
        if cursor == b"0":
            return found
    raise AssertionError(f"{server}: HSCAN did not end")


@pytest.mark.parametrize("options", ["", "COUNT 7", "MATCH f1* COUNT 50", "COUNT 1000"])
def test_hscan_of_a_large_hash_visits_every_field(redis_pair, options):
    p = redis_pair
    p.reset()
    p.same([b"HSET", b"h", *_fields(500)])
    results = {server: _hscan_all(p, server, *_args(options)) for server in ("redis", "walkit")}
    assert len(results["walkit"]) == len(set(results["walkit"])), "a field returned twice"
    assert set(results["walkit"]) == set(results["redis"]) and results["walkit"]


def test_large_hashes_compare_as_sets(redis_pair):
    p = redis_pair
    p.reset()
    p.same([b"HSET", b"h", *_fields(300)])
    same(p, f"HSET wide f {'x' * 100} g y", "HLEN h")
    same_unordered(p, "HGETALL h", "HGETALL wide", pairs=True)
    same_unordered(p, "HKEYS h", "HVALS h", "HKEYS wide", "HMGET h f1 f299 x")
    same(p, ["HDEL", "h", *[f"f{i}" for i in range(0, 300, 2)]], "HLEN h", "HGET h f7")
    same_unordered(p, "HGETALL h", pairs=True)


def test_hash_commands_against_a_string_are_wrongtype(redis_pair):
    p = redis_pair
    p.reset()
    same(p, "SET s x", "HSET s f v", "HMSET s f v", "HSETNX s f v", "HGET s f", "HMGET s f", "HGETALL s", "HDEL s f",
         "HLEN s", "HEXISTS s f", "HKEYS s", "HVALS s", "HINCRBY s f 1", "HINCRBYFLOAT s f 1", "HSTRLEN s f",
         "HRANDFIELD s", "HRANDFIELD s 0", "HRANDFIELD s 2 WITHVALUES", "HSCAN s 0", "HINCRBY s f x",
         "HINCRBYFLOAT s f x", "GET s")


def test_hash_commands_with_a_wrong_number_of_arguments(redis_pair):
    p = redis_pair
    p.reset()
    same(p, "HSET h", "HSET h f", "HSET h f v g", "HMSET h f", "HMSET h f v g", "HSETNX h f", "HSETNX h f v x",
         "HGET h", "HGET h f g", "HMGET h", "HGETALL", "HGETALL h x", "HDEL h", "HLEN", "HEXISTS h", "HKEYS h x",
         "HVALS", "HINCRBY h f", "HINCRBYFLOAT h f 1 2", "HSTRLEN h", "HRANDFIELD", "HSCAN h", "EXISTS h")


def test_hashes_in_resp3(redis_pair):
    p = redis_pair
    p.reset()
    _resp3(p)
    p.same([b"HSET", b"h", *_fields(10)])
    same(p, "HGETALL h", "HGETALL absent", "HGET h f1", "HGET h nope", "HMGET h f1 nope", "HKEYS h", "HVALS absent",
         "HRANDFIELD absent", "HRANDFIELD absent 2 WITHVALUES", "HRANDFIELD h 20", "HSCAN h 0", "HSCAN absent 0",
         "HINCRBYFLOAT h x 1.5", "HINCRBY h n 2", "HLEN h", "HSETNX h n 1", "HMSET h a b")
    p.same([b"HSET", b"big", *_fields(300)])
    replies = p.send(b"HGETALL", b"big")
    assert [reply.split(b"\r\n", 1)[0] for reply in replies.values()] == [b"%300", b"%300"]
    contents = {name: _bulk_pairs(reply) for name, reply in replies.items()}
    assert contents["walkit"] == contents["redis"] and len(contents["redis"]) == 300


def _bulk_pairs(raw: bytes) -> set[tuple[bytes, bytes]]:
    """_bulk_pairs reads a RESP3 map of bulk strings as a set of (key, value)."""
    head, rest = raw.split(b"\r\n", 1)
    items = _parse(b"*%d\r\n" % (2 * int(head[1:])) + rest)
    return set(zip(items[::2], items[1::2]))


# -- lists ---------------------------------------------------------------------------------------
def test_push_and_pop(redis_pair):
    p = redis_pair
    p.reset()
    same(p, "RPUSH l a b c", "LPUSH l x y", "LRANGE l 0 -1", "LLEN l", "LLEN absent", "LPUSHX absent a",
         "RPUSHX absent a b", "EXISTS absent", "LPUSHX l z", "RPUSHX l w v", "LRANGE l 0 -1", "LPOP l", "RPOP l",
         "LPOP l 2", "RPOP l 2", "RPOP l 0", "LPOP l 0", "LPOP l 100", "EXISTS l", "LPOP l", "RPOP l", "LPOP l 1",
         "RPOP l 0", "RPUSH l a b", "LPOP l -1", "LPOP l abc", "RPOP l 1.5", "LPOP absent -1", "LPOP l 1 2",
         "RPOP l 1 2", f"RPOP l {LONG_MAX}", "EXISTS l", [b"RPUSH", b"l", b"", b"\x00\r\n"], "LRANGE l 0 -1")


RANGES = [(0, -1), (1, 3), (-3, -1), (-100, 100), (3, 1), (5, 10), (4, 4), (-1, -5), (0, 0), (-1, -1),
          (2, -2), (-5, 0), (-6, -5), (LONG_MAX, LONG_MIN), (LONG_MIN, LONG_MAX), (0, LONG_MAX), (LONG_MIN, -1)]


def test_lrange_and_lindex_indexes(redis_pair):
    p = redis_pair
    p.reset()
    same(p, "RPUSH l a b c d e", *[f"LRANGE l {start} {stop}" for start, stop in RANGES])
    same(p, *[f"LINDEX l {i}" for i in (0, 1, -1, 4, 5, -5, -6, LONG_MAX, LONG_MIN)])
    same(p, "LRANGE l a 1", "LRANGE l 0 1.5", "LRANGE absent 0 -1", "LRANGE absent x 1", "LINDEX l abc",
         "LINDEX absent abc", "LINDEX absent 0")


def test_long_lists(redis_pair):
    p = redis_pair
    p.reset()
    same(p, ["RPUSH", "l", *[str(i) for i in range(1000)]], "LRANGE l -10 -1", "LRANGE l 990 2000", "LRANGE l 10 20",
         "LINDEX l -500", "LSET l -2 x", "LPOS l x", "LTRIM l 100 -100", "LLEN l", "LTRIM l -700 -690",
         "LRANGE l 0 -1", "LTRIM l 1 -1", "LRANGE l 0 -1")


def test_lset(redis_pair):
    p = redis_pair
    p.reset()
    same(p, "RPUSH l a b c", "SET s x", "LSET l 0 x", "LSET l -1 y", "LSET l 3 z", "LSET l -4 z",
         f"LSET l {LONG_MIN} z", "LSET absent 0 x", "LSET absent x x", "LSET l abc x", "LSET s 0 x", "LSET s x x",
         "LRANGE l 0 -1")


def test_lrem(redis_pair):
    p = redis_pair
    p.reset()
    same(p, "RPUSH l a b a c a b a", "LREM l 2 a", "LRANGE l 0 -1", "LREM l -1 a", "LRANGE l 0 -1", "LREM l 0 b",
         "LREM l 0 zz", "LREM l abc a", "LREM absent 1 a", "LREM absent x a", "LRANGE l 0 -1", "LREM l -100 c",
         f"LREM l {LONG_MIN} a", "EXISTS l")


@pytest.mark.parametrize("start, stop", RANGES)
def test_ltrim(redis_pair, start, stop):
    p = redis_pair
    p.reset()
    same(p, "RPUSH l a b c d e", f"LTRIM l {start} {stop}", "LRANGE l 0 -1", "EXISTS l")


def test_ltrim_arguments(redis_pair):
    p = redis_pair
    p.reset()
    same(p, "LTRIM absent 0 1", "LTRIM absent a 1", "RPUSH l a", "LTRIM l 0 x", "LRANGE l 0 -1")


def test_linsert(redis_pair):
    p = redis_pair
    p.reset()
    same(p, "RPUSH l a b a", "LINSERT l BEFORE a x", "LINSERT l after a y", "LINSERT l After b z",
         "LINSERT l BEFORE nope x", "LINSERT l MIDDLE a x", "LINSERT absent BEFORE a x", "LINSERT absent MIDDLE a x",
         "EXISTS absent", "LRANGE l 0 -1")


LPOS_OPTIONS = ["", "RANK 2", "RANK -1", "RANK -2", "RANK 4", "COUNT 0", "COUNT 2", "RANK 2 COUNT 0", "MAXLEN 3",
                "MAXLEN 3 COUNT 0", "RANK -1 MAXLEN 2 COUNT 0", "RANK -2 COUNT 5 MAXLEN 0", "rank 1 count 1 maxlen 1",
                f"RANK {LONG_MIN}", f"RANK {LONG_MIN} COUNT 1", f"RANK {LONG_MIN} COUNT 0", f"RANK {LONG_MAX}",
                f"RANK {-LONG_MAX} COUNT 1", "COUNT 1 COUNT 3",
                # errors
                "RANK 0", "COUNT -1", "MAXLEN -1", "COUNT abc", "MAXLEN 1.5", "RANK abc", "RANK", "FOO 1",
                "COUNT 1 RANK", "RANK 0 COUNT -1"]


def test_lpos(redis_pair):
    p = redis_pair
    p.reset()
    same(p, "RPUSH l a b c a b c a")
    for element in ("a", "c", "zz"):
        same(p, *[f"LPOS l {element} {options}" for options in LPOS_OPTIONS])
    same(p, "LPOS absent a", "LPOS absent a COUNT 1", "LPOS absent a RANK 0")


def test_lmove_and_rpoplpush(redis_pair):
    p = redis_pair
    p.reset()
    same(p, "RPUSH src a b c d e", "SET s x")
    for ends in ("LEFT RIGHT", "RIGHT LEFT", "left left", "Right Right"):
        same(p, f"LMOVE src dst {ends}", "LRANGE src 0 -1", "LRANGE dst 0 -1")
    same(p, "LMOVE src src LEFT RIGHT", "LRANGE src 0 -1", "LMOVE src s LEFT RIGHT", "LMOVE s dst LEFT RIGHT",
         "LMOVE absent s LEFT RIGHT", "LMOVE absent dst LEFT RIGHT", "LMOVE src dst UP RIGHT",
         "LMOVE src dst LEFT DOWN", "LMOVE s dst UP RIGHT", "LRANGE src 0 -1", "RPOPLPUSH src dst",
         "RPOPLPUSH src s", "RPOPLPUSH s dst", "RPOPLPUSH absent dst", "RPOPLPUSH src new", "EXISTS src",
         "LRANGE dst 0 -1", "LRANGE new 0 -1", "RPUSH one x", "RPOPLPUSH one one", "LRANGE one 0 -1",
         "LMOVE one one LEFT LEFT", "LMOVE one two LEFT LEFT", "EXISTS one", "LRANGE two 0 -1")


def test_list_commands_against_a_string_are_wrongtype(redis_pair):
    p = redis_pair
    p.reset()
    same(p, "SET s x", "RPUSH l a", "LPUSH s a", "RPUSH s a", "LPUSHX s a", "RPUSHX s a", "LPOP s", "RPOP s 2",
         "LPOP s 0", "LRANGE s 0 -1", "LLEN s", "LINDEX s 0", "LINDEX s x", "LSET s 0 x", "LREM s 0 a",
         "LTRIM s 0 1", "LINSERT s BEFORE a b", "LPOS s a", "LPOS s a COUNT 0", "LMOVE s l LEFT RIGHT",
         "LMOVE l s LEFT RIGHT", "RPOPLPUSH s l", "RPOPLPUSH l s", "LRANGE l 0 -1", "GET s", "HSET l f v",
         "LPUSH h x", "HSET h2 f v", "LLEN h2", "RPOPLPUSH l h2")


def test_list_commands_with_a_wrong_number_of_arguments(redis_pair):
    p = redis_pair
    p.reset()
    same(p, "LPUSH l", "RPUSH", "LPUSHX l", "RPUSHX l", "LPOP", "RPOP", "LPOP l 1 2", "LRANGE l 0", "LRANGE l 0 1 2",
         "LLEN", "LINDEX l", "LSET l 0", "LREM l 0", "LTRIM l 0", "LINSERT l BEFORE a", "LPOS l", "LMOVE a b LEFT",
         "RPOPLPUSH a", "RPOPLPUSH a b c")


def test_lists_in_resp3(redis_pair):
    p = redis_pair
    p.reset()
    _resp3(p)
    same(p, "RPUSH l a b a", "LPOP absent", "LPOP absent 1", "RPOP absent 0", "LPOP l 0", "RPOP l 1", "LRANGE l 0 -1",
         "LRANGE absent 0 -1", "LINDEX l 9", "LINDEX absent 0", "LPOS l a", "LPOS l zz", "LPOS absent a",
         "LPOS l a COUNT 0", "LMOVE absent l LEFT LEFT", "RPOPLPUSH absent l", "LSET l 0 x", "LTRIM l 0 0",
         "LINSERT l BEFORE x w", "LREM l 0 w", "LLEN l", "RPOP l 5", "EXISTS l")
