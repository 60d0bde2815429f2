"""Hash and list commands run in a Context as records run them: WRONGTYPE, no empty containers,
errors that change nothing, determinism, HSCAN's stateless cursor and long double arithmetic.
(tests/adapters/test_kv_compat_hashes_lists.py compares the replies with a real redis-server.)"""

from __future__ import annotations

from fractions import Fraction

import pytest

from walkit.adapters.kv.execute import run
from walkit.adapters.kv.limits import HASH_ENTRIES as SMALL_HASH
from walkit.adapters.kv.state import scan_order
from walkit.adapters.kv.longdouble import LongDouble
from walkit.adapters.kv.resp import NIL_ARRAY, OK, ReplyError
from walkit.adapters.kv.state import WRONGTYPE, Hash, List
from walkit.adapters.kv.table import Context
from tests.support.kv_apply import StateApplier

T = 1_000_000


def _args(args) -> list[bytes]:
    return [a if isinstance(a, bytes) else str(a).encode() for a in args]


class Applier(StateApplier):
    """Applier is a StateApplier called as a(*args, at=T) and a.read(*args, at=T)."""

    def __call__(self, *args, at: int = T):
        return self.write(at, args)

    def read(self, *args, at: int = T):
        return self.read_at(at, args)

    def snapshot(self) -> dict:
        """snapshot is every key with a copy of its value and its expiry."""
        return {key: (value if type(value) is bytes else value.copy(), self.state.expires.get(key))
                for key, value in self.state.data.items()}


def _error(reply) -> str:
    assert isinstance(reply, ReplyError), reply
    return reply.message


HASH_COMMANDS = [
    ("HSET", "s", "f", "v"), ("HMSET", "s", "f", "v"), ("HSETNX", "s", "f", "v"), ("HGET", "s", "f"),
    ("HMGET", "s", "f"), ("HGETALL", "s"), ("HDEL", "s", "f"), ("HLEN", "s"), ("HEXISTS", "s", "f"),
    ("HKEYS", "s"), ("HVALS", "s"), ("HINCRBY", "s", "f", 1), ("HINCRBYFLOAT", "s", "f", 1),
    ("HSTRLEN", "s", "f"), ("HRANDFIELD", "s"), ("HRANDFIELD", "s", 2), ("HSCAN", "s", 0),
]
LIST_COMMANDS = [
    ("LPUSH", "s", "a"), ("RPUSH", "s", "a"), ("LPUSHX", "s", "a"), ("RPUSHX", "s", "a"), ("LPOP", "s"),
    ("RPOP", "s", 2), ("LRANGE", "s", 0, -1), ("LLEN", "s"), ("LINDEX", "s", 0), ("LSET", "s", 0, "x"),
    ("LREM", "s", 0, "a"), ("LTRIM", "s", 0, 1), ("LINSERT", "s", "BEFORE", "a", "b"), ("LPOS", "s", "a"),
    ("LMOVE", "s", "l", "LEFT", "RIGHT"), ("LMOVE", "l", "s", "LEFT", "RIGHT"), ("RPOPLPUSH", "s", "l"),
    ("RPOPLPUSH", "l", "s"),
]


@pytest.mark.parametrize("args", HASH_COMMANDS + LIST_COMMANDS, ids=lambda a: " ".join(map(str, a)))
def test_a_key_of_another_type_is_wrongtype_and_unchanged(args):
    a = Applier()
    a("SET", "s", "x")
    a("RPUSH", "l", "a", "b")
    before = a.snapshot()
    assert _error(a(*args)) == WRONGTYPE
    assert a.snapshot() == before


def test_hashes_and_lists_are_typed_values():
    a = Applier()
    assert a("HSET", "h", "f", "v") == 1 and type(a.state.data[b"h"]) is Hash
    assert a("RPUSH", "l", "a") == 1 and type(a.state.data[b"l"]) is List
    assert a.read("TYPE", "h") == "hash" and a.read("TYPE", "l") == "list"
    assert _error(a("RPUSH", "h", "x")) == WRONGTYPE and _error(a("HSET", "l", "f", "v")) == WRONGTYPE


@pytest.mark.parametrize("setup, emptying", [
    (("HSET", "k", "a", 1, "b", 2), ("HDEL", "k", "a", "b", "c")),
    (("RPUSH", "k", "a"), ("LPOP", "k")),
    (("RPUSH", "k", "a", "b"), ("RPOP", "k", 5)),
    (("RPUSH", "k", "a", "a"), ("LREM", "k", 0, "a")),
    (("RPUSH", "k", "a", "b"), ("LTRIM", "k", 5, 10)),
    (("RPUSH", "k", "a", "b"), ("LTRIM", "k", 1, 0)),
    (("RPUSH", "k", "a"), ("LMOVE", "k", "other", "LEFT", "LEFT")),
    (("RPUSH", "k", "a"), ("RPOPLPUSH", "k", "other")),
])
def test_a_command_that_empties_a_container_removes_its_key(setup, emptying):
    a = Applier()
    a(*setup)
    assert not isinstance(a(*emptying), ReplyError)
    assert b"k" not in a.state.data and a.read("EXISTS", "k") == 0


def test_moving_onto_the_same_list_keeps_it():
    a = Applier()
    a("RPUSH", "k", "a")
    assert a("RPOPLPUSH", "k", "k") == b"a" and a.read("LRANGE", "k", 0, -1) == [b"a"]
    a("RPUSH", "k", "b", "c")
    assert a("LMOVE", "k", "k", "LEFT", "RIGHT") == b"a"
    assert a.read("LRANGE", "k", 0, -1) == [b"b", b"c", b"a"]


@pytest.mark.parametrize("args, message", [
    (("HSET", "h", "f", "v", "g"), "ERR wrong number of arguments for 'hset' command"),
    (("HMSET", "new", "f"), "ERR wrong number of arguments for 'hmset' command"),
    (("HINCRBY", "h", "text", 1), "ERR hash value is not an integer"),
    (("HINCRBY", "h", "n", "x"), "ERR value is not an integer or out of range"),
    (("HINCRBY", "h", "n", 9223372036854775807), "ERR increment or decrement would overflow"),
    (("HINCRBY", "new", "n", "1.5"), "ERR value is not an integer or out of range"),
    (("HINCRBYFLOAT", "h", "text", 1), "ERR hash value is not a float"),
    (("HINCRBYFLOAT", "h", "inf", 1), "ERR increment would produce NaN or Infinity"),
    (("HINCRBYFLOAT", "new", "f", "inf"), "ERR value is NaN or Infinity"),
    (("HINCRBYFLOAT", "new", "f", "nan"), "ERR value is not a valid float"),
    (("HINCRBYFLOAT", "new", "f", "1e-5000"), "ERR value is not a valid float"),
    (("HINCRBYFLOAT", "h", "big", "1e4932"), "ERR increment would produce NaN or Infinity"),
    (("HRANDFIELD", "h", 1, "WITHVALUE"), "ERR syntax error"),
    (("LPOP", "l", -1), "ERR value is out of range, must be positive"),
    (("LPOP", "l", 1, 2), "ERR wrong number of arguments for 'lpop' command"),
    (("LSET", "l", 9, "x"), "ERR index out of range"),
    (("LSET", "new", 0, "x"), "ERR no such key"),
    (("LINSERT", "l", "MIDDLE", "a", "x"), "ERR syntax error"),
    (("LMOVE", "l", "new", "LEFT", "UP"), "ERR syntax error"),
    (("LMOVE", "l", "h", "LEFT", "LEFT"), WRONGTYPE),
    (("LREM", "l", "x", "a"), "ERR value is not an integer or out of range"),
    (("LTRIM", "l", 0, "x"), "ERR value is not an integer or out of range"),
])
def test_an_error_changes_nothing_not_even_watches(args, message):
    a = Applier()
    a("HSET", "h", "text", "abc", "n", 5, "inf", "inf", "big", "1.18973149535723176502e+4932")
    a("RPUSH", "l", "a", "b")
    before, touched = a.snapshot(), dict(a.state.touched)
    assert _error(a(*args)) == message
    assert a.snapshot() == before and a.state.touched == touched


def test_a_command_that_changes_nothing_touches_no_watch():
    a = Applier()
    a("HSET", "h", "f", "v")
    a("RPUSH", "l", "a", "b")
    touched = dict(a.state.touched)
    assert a("HDEL", "h", "nope") == 0 and a("HSETNX", "h", "f", "w") == 0
    assert a("LREM", "l", 0, "nope") == 0 and a("LINSERT", "l", "BEFORE", "nope", "x") == -1
    assert a("LTRIM", "l", 0, -1) is OK and a("LPUSHX", "absent", "x") == 0
    assert a("LPOP", "absent", 2) is NIL_ARRAY and a("RPOPLPUSH", "absent", "l") is None
    assert a.state.touched == touched


def test_reads_change_nothing():
    a = Applier()
    a("HSET", "h", *[x for i in range(300) for x in (f"f{i}", i)])
    a("RPUSH", "l", *range(50))
    before, touched = a.snapshot(), dict(a.state.touched)
    for args in [("HGET", "h", "f1"), ("HMGET", "h", "f1", "x"), ("HGETALL", "h"), ("HKEYS", "h"), ("HVALS", "h"),
                 ("HLEN", "h"), ("HEXISTS", "h", "f"), ("HSTRLEN", "h", "f2"), ("HRANDFIELD", "h", -5),
                 ("HSCAN", "h", 0, "COUNT", 20), ("LRANGE", "l", 5, -5), ("LLEN", "l"), ("LINDEX", "l", -2),
                 ("LPOS", "l", "7", "COUNT", 0)]:
        assert not isinstance(a.read(*args), ReplyError), args
    assert a.snapshot() == before and a.state.touched == touched


def test_an_expired_container_starts_over():
    a = Applier()
    a.state.store(b"h", Hash({b"old": b"1"}), T + 10)
    a.state.store(b"l", List([b"old"]), T + 10)
    assert a.read("HGET", "h", "old", at=T + 9) == b"1" and a.read("HGET", "h", "old", at=T + 10) is None
    assert a("HSET", "h", "f", "v", at=T + 10) == 1 and a("RPUSH", "l", "x", at=T + 10) == 1
    assert a.read("HGETALL", "h", at=T + 20) == {b"f": b"v"} and a.read("LRANGE", "l", 0, -1, at=T + 20) == [b"x"]
    assert a.state.ttl_ms(b"h", T + 20) == -1 and a.state.ttl_ms(b"l", T + 20) == -1
    a.state.store(b"gone", List([b"a"]), T + 10)
    assert a("LPUSHX", "gone", "b", at=T + 10) == 0 and a("LPOP", "gone", at=T + 10) is None


def test_the_same_records_give_the_same_state_and_replies():
    script = [("HSET", "h", *[x for i in range(20) for x in (f"f{i}", i)]), ("HINCRBYFLOAT", "h", "f1", "0.1"),
              ("HINCRBYFLOAT", "h", "f1", "1e-3"), ("HINCRBY", "h", "f2", -7),
              ("HRANDFIELD", "h", 5, "WITHVALUES"), ("HRANDFIELD", "h", -8), ("RPUSH", "l", *range(30)),
              ("LREM", "l", -1, 3), ("LMOVE", "l", "m", "LEFT", "RIGHT"), ("LTRIM", "l", 2, -3),
              ("LINSERT", "l", "AFTER", "7", "x"), ("LPOS", "l", "x", "RANK", -1)]
    runs = []
    for _ in range(2):
        a = Applier()
        runs.append(([a(*args, at=T + i) for i, args in enumerate(script)], a.snapshot()))
    assert runs[0] == runs[1]
    assert runs[0][0][1] == b"1.1" and runs[0][0][2] == b"1.101"


def test_hash_order_is_insertion_order():
    a = Applier()
    a("HSET", "h", "c", 1, "a", 2, "b", 3)
    a("HSET", "h", "a", 9, "d", 4)
    a("HDEL", "h", "c")
    assert a.read("HGETALL", "h") == {b"a": b"9", b"b": b"3", b"d": b"4"}
    assert a.read("HKEYS", "h") == [b"a", b"b", b"d"] and a.read("HVALS", "h") == [b"9", b"3", b"4"]
    assert a.read("HSCAN", "h", 0) == [b"0", [b"a", b"9", b"b", b"3", b"d", b"4"]]


def _hscan_all(a: Applier, *options) -> tuple[list[bytes], int]:
    cursor, fields, calls = b"0", [], 0
    while True:
        cursor, found = a.read("HSCAN", "h", cursor, *options)
        fields += found[::2]
        calls += 1
        if cursor == b"0":
            return fields, calls


def test_hscan_pages_a_large_hash_in_scan_order():
    a = Applier()
    names = [b"f%04d" % i for i in range(SMALL_HASH + 100)]
    a("HSET", "h", *[x for name in reversed(names) for x in (name, name.upper())])
    fields, calls = _hscan_all(a, "COUNT", 7)
    assert fields == sorted(names, key=scan_order) and calls == -(-len(names) // 7)
    fields, _ = _hscan_all(a, "MATCH", "f01*", "COUNT", 50)
    assert sorted(fields) == [name for name in names if name.startswith(b"f01")]
    assert a.read("HSCAN", "h", 0, "COUNT", len(names))[0] == b"0"     # the last one visited ends the scan


def test_an_hscan_cursor_outlives_its_field_and_any_server():
    a = Applier()
    a("HSET", "h", *[x for i in range(SMALL_HASH + 50) for x in (b"f%04d" % i, i)])
    cursor, found = a.read("HSCAN", "h", 0, "COUNT", 10)
    order = sorted((b"f%04d" % i for i in range(SMALL_HASH + 50)), key=scan_order)
    assert found[::2] == order[:10]
    a("HDEL", "h", order[9], order[10])   # the last one visited, and the next one
    other = Applier()                   # another server holding the same hash, built in another order
    other("HSET", "h", *[x for i in reversed(range(SMALL_HASH + 50)) for x in (b"f%04d" % i, i)
                         if b"f%04d" % i not in (order[9], order[10])][::1])
    for server in (a, other):
        assert server.read("HSCAN", "h", cursor, "COUNT", 2)[1][::2] == order[11:13]
    assert _error(a.read("HSCAN", "h", "x5")) == "ERR invalid cursor"


def test_hscan_pages_the_hash_as_it_is_after_every_change():
    """A page is cut from the hash's scan index, which a change to the key drops: after fields
    come and go, or the hash is replaced by another of the same size, pages show the hash as it is."""
    a = Applier()
    names = [b"f%04d" % i for i in range(SMALL_HASH + 50)]
    a("HSET", "h", *[x for name in names for x in (name, b"1")])
    cursor, found = a.read("HSCAN", "h", 0, "COUNT", 10)
    order = sorted(names, key=scan_order)
    a("HSET", "h", "new", "2")
    a("HDEL", "h", order[20])
    rest = []
    while cursor != b"0":
        cursor, page = a.read("HSCAN", "h", cursor, "COUNT", 10)
        rest += page[::2]
    assert order[20] not in rest and set(order[10:]) - {order[20]} <= set(rest)
    assert (b"new" in rest) == (scan_order(b"new") >= scan_order(order[10]))
    a("DEL", "h")
    others = [b"g%04d" % i for i in range(SMALL_HASH + 50)]
    a("HSET", "h", *[x for name in others for x in (name, b"1")])
    fields, _ = _hscan_all(a, "COUNT", 10)
    assert fields == sorted(others, key=scan_order)


def test_hscan_returns_a_small_hash_whole():
    a = Applier()
    a("HSET", "h", *[x for i in range(SMALL_HASH) for x in (f"f{i}", i)])
    cursor, found = a.read("HSCAN", "h", 0, "COUNT", 1)
    assert cursor == b"0" and len(found) == 2 * SMALL_HASH
    a("HSET", "h", "one", "more")
    assert a.read("HSCAN", "h", 0, "COUNT", 1)[0] != b"0"


def test_hrandfield_in_a_record_is_the_same_on_every_node():
    replies = []
    for _ in range(2):
        a = Applier()
        a("HSET", "h", *[x for i in range(50) for x in (f"f{i}", i)])
        a.state.applying = 42
        ctx = Context(a.state, T, writing=True)
        replies.append([run(ctx, _args(args)) for args in (("HRANDFIELD", "h"), ("HRANDFIELD", "h", 10),
                                                           ("HRANDFIELD", "h", -10, "WITHVALUES"))])
    assert replies[0] == replies[1]
    one, unique, repeated = replies[0]
    assert len(set(unique)) == 10 and len(repeated) == 20


def test_hrandfield_counts():
    a = Applier()
    a("HSET", "h", "a", 1, "b", 2, "c", 3)
    assert a.read("HRANDFIELD", "h", 5) == [b"a", b"b", b"c"]
    assert a.read("HRANDFIELD", "h", 3, "withvalues") == [b"a", b"1", b"b", b"2", b"c", b"3"]
    assert sorted(a.read("HRANDFIELD", "h", 2)) in ([b"a", b"b"], [b"a", b"c"], [b"b", b"c"])
    assert len(a.read("HRANDFIELD", "h", -7)) == 7 and a.read("HRANDFIELD", "h", 0) == []
    assert a.read("HRANDFIELD", "absent") is None and a.read("HRANDFIELD", "absent", 3) == []
    assert _error(a.read("HRANDFIELD", "h", -(1 << 62), "WITHVALUES")) == "ERR value is out of range"


def test_lists_follow_redis_indexes():
    a = Applier()
    a("RPUSH", "l", *"abcdefghij")
    a("LPUSH", "l", "y", "z")
    assert a.read("LRANGE", "l", 0, 3) == [b"z", b"y", b"a", b"b"]
    assert a.read("LRANGE", "l", -3, -1) == [b"h", b"i", b"j"] and a.read("LRANGE", "l", -2, 100) == [b"i", b"j"]
    assert a.read("LRANGE", "l", 5, 2) == [] and a.read("LRANGE", "l", 12, 20) == []
    assert a.read("LINDEX", "l", -1) == b"j" and a.read("LINDEX", "l", 12) is None
    assert a("LSET", "l", -12, "Z") is OK and a.read("LINDEX", "l", 0) == b"Z"
    assert a("LTRIM", "l", 1, -2) is OK and a.read("LRANGE", "l", 0, -1) == [bytes([c]) for c in b"yabcdefghi"]
    assert a("LTRIM", "l", -3, -1) is OK and a.read("LRANGE", "l", 0, -1) == [b"g", b"h", b"i"]


def test_lpop_and_rpop_counts():
    a = Applier()
    a("RPUSH", "l", "a", "b", "c", "d")
    assert a("LPOP", "l", 0) == [] and a("LPOP", "l", 1) == [b"a"] and a("RPOP", "l") == b"d"
    assert a("RPOP", "l", 9) == [b"c", b"b"] and b"l" not in a.state.data
    assert a("LPOP", "l") is None and a("LPOP", "l", 0) is NIL_ARRAY


def test_lrem_lpos_and_linsert():
    a = Applier()
    a("RPUSH", "l", *"abacaba")
    assert a.read("LPOS", "l", "a", "RANK", -2) == 4 and a.read("LPOS", "l", "a", "COUNT", 0) == [0, 2, 4, 6]
    assert a.read("LPOS", "l", "a", "RANK", 2, "COUNT", 2, "MAXLEN", 4) == [2]
    assert a.read("LPOS", "l", "a", "RANK", -9223372036854775808, "COUNT", 1) == [6, 4, 2, 0]
    assert a("LREM", "l", -2, "a") == 2 and a.read("LRANGE", "l", 0, -1) == [b"a", b"b", b"a", b"c", b"b"]
    assert a("LREM", "l", 1, "b") == 1 and a("LINSERT", "l", "after", "c", "x") == 5
    assert a.read("LRANGE", "l", 0, -1) == [b"a", b"a", b"c", b"x", b"b"]


def test_hincrby_and_hincrbyfloat():
    a = Applier()
    assert a("HINCRBY", "h", "n", 5) == 5 and a("HINCRBY", "h", "n", -9) == -4
    assert a("HINCRBYFLOAT", "h", "n", "1.5") == b"-2.5" and a("HINCRBYFLOAT", "h", "x", "0x10") == b"16"
    assert a.read("HGET", "h", "n") == b"-2.5"


@pytest.mark.parametrize("text, shown", [
    (b"0.1", b"0.1"), (b"10.5", b"10.5"), (b"3.0", b"3"), (b"1.", b"1"), (b".5", b"0.5"), (b"-.5e1", b"-5"),
    (b"0x10", b"16"), (b"0x1.8p1", b"3"), (b"-0", b"0"),
    (b"-0.0000000000000000001", b"0"), (b"1.5e-4950", b"0"), (b"9223372036854775807", b"9223372036854775807"),
    (b"1e20", b"100000000000000000000"), (b"0.000000000000000015", b"0.00000000000000002"),
    (b"0.000000000000000025", b"0.00000000000000002"),
    (b"INF", b"inf"), (b"-Infinity", b"-inf"),
])
def test_long_double_reads_and_writes_as_redis(text, shown):
    assert LongDouble.format(LongDouble.parse(text)) == shown


@pytest.mark.parametrize("text", [b"", b"\x00", b"1\x00", b"1\x00junk", b" 1", b"1 ", b"abc", b"1e", b"0x", b"-",
                                  b".", b"nan", b"infinit", b"1e-5000", b"1e5000", b"0x1p-16446", b"1" * 5120,
                                  b"1e99999999999"])
def test_long_double_refuses_what_string2ld_refuses(text):
    assert LongDouble.parse(text) is None


def test_long_double_rounds_to_a_64_bit_significand():
    assert LongDouble.round(Fraction(2 ** 64 + 1)) == 2 ** 64                  # ties to even
    assert LongDouble.round(Fraction(2 ** 64 + 3)) == 2 ** 64 + 4
    assert LongDouble.round(Fraction(2 ** 63 + 1)) == 2 ** 63 + 1              # 64 bits fit
    total = LongDouble.round(LongDouble.parse(b"0.1") + LongDouble.parse(b"0.2"))
    assert LongDouble.format(total) == b"0.3"
    biggest = LongDouble.parse(b"0x0.ffffffffffffffffp16384")
    assert biggest == (2 ** 64 - 1) * 2 ** (16384 - 64)
    assert LongDouble.round(biggest + Fraction(2) ** (16384 - 66)) == biggest     # a quarter of a unit
    assert LongDouble.round(biggest + Fraction(2) ** (16384 - 65)) == float("inf")   # half: ties to even
