"""Keys and strings at the Context level: expiry decided by the record's stamp, determinism, errors that change
nothing, no-ops that touch nothing (WATCH), reads that change nothing, INCRBYFLOAT's digits, OBJECT ENCODING."""

from __future__ import annotations

import random

import pytest

from walkit.adapters.kv.keyspace import encoding_of
from walkit.adapters.kv.resp import OK, ReplyError
from walkit.adapters.kv.state import Hash, List, SetValue, State, ZSet
from tests.support.kv_apply import StateApplier, as_bytes

T = 1_700_000_000_000           # a stamp, ms since the epoch


class Applier(StateApplier):
    """Applier is a StateApplier called as a(stamp, *args) and a.read(now, *args)."""

    def __call__(self, stamp: int, *args):
        return self.write(stamp, args)

    def read(self, now: int, *args):
        """read runs a command as a read: at a server's clock, outside any record."""
        return self.read_at(now, args)


encode = as_bytes


def dump(state: State):
    """dump is everything a state holds, comparable with ==."""
    def plain(value):
        if type(value) is bytes:
            return value
        if isinstance(value, ZSet):
            return ("zset", list(value.order))
        if isinstance(value, Hash):
            return ("hash", sorted(value.items()))
        return (value.type_name, sorted(value) if isinstance(value, SetValue) else list(value))
    return ({key: plain(value) for key, value in state.data.items()}, dict(state.expires),
            dict(state.touched), state.forgotten)


# -- expiry at the record's stamp ------------------------------------------------------------------
def test_relative_expiry_counts_from_the_records_stamp():
    a = Applier()
    a(T, b"SET", b"k", b"v")
    assert a(T, b"EXPIRE", b"k", 10) == 1
    assert a.state.expires[b"k"] == T + 10_000
    assert a(T + 5, b"PEXPIRE", b"k", 100) == 1 and a.state.expires[b"k"] == T + 105
    assert a(T, b"SETEX", b"s", 3, b"v") is OK and a.state.expires[b"s"] == T + 3000
    assert a(T + 1, b"PSETEX", b"p", 3, b"v") is OK and a.state.expires[b"p"] == T + 4
    assert a(T, b"GETEX", b"s", b"PX", 50) == b"v" and a.state.expires[b"s"] == T + 50
    assert a.read(T + 49, b"GET", b"s") == b"v" and a.read(T + 50, b"GET", b"s") is None
    assert a.read(T + 104, b"TTL", b"k") == 0 and a.read(T, b"TTL", b"k") == 0     # (105 + 500) // 1000
    assert a.read(T - 400, b"TTL", b"k") == 1                                        # 505 ms rounds up


def test_a_time_not_after_the_stamp_deletes_the_key():
    a = Applier()
    for command in ([b"EXPIRE", b"k", 0], [b"PEXPIRE", b"k", -1], [b"EXPIREAT", b"k", T // 1000],
                    [b"PEXPIREAT", b"k", T], [b"GETEX", b"k", b"PXAT", T], [b"GETEX", b"k", b"EXAT", 1]):
        a(T, b"SET", b"k", b"v")
        assert a(T, *command) in (1, b"v")
        assert b"k" not in a.state.data and b"k" not in a.state.expires
    a(T, b"SET", b"k", b"v")
    assert a(T, b"PEXPIREAT", b"k", T + 1) == 1 and a.state.data[b"k"] == b"v"


def test_expired_keys_count_as_absent_for_every_command():
    a = Applier()
    a(T, b"SET", b"k", b"old", b"PX", 10)
    later = T + 10
    assert a(later, b"EXPIRE", b"k", 100) == 0
    assert a(later, b"PERSIST", b"k") == 0
    assert a(later, b"SETNX", b"k", b"new") == 1 and b"k" not in a.state.expires
    a(T, b"SET", b"g", b"1.5", b"PX", 10)
    assert a(later, b"INCRBYFLOAT", b"g", b"1") == b"1" and b"g" not in a.state.expires
    a(T, b"SET", b"r", b"v", b"PX", 10)
    assert isinstance(a(later, b"RENAME", b"r", b"x"), ReplyError)
    assert a(later, b"COPY", b"r", b"x") == 0
    a(T, b"SET", b"ap", b"abc", b"PX", 10)
    assert a(later, b"APPEND", b"ap", b"d") == 1 and a.state.data[b"ap"] == b"d"
    assert a.read(later, b"EXPIRETIME", b"ap") == -1 and a.read(later, b"EXPIRETIME", b"r") == -2


def test_rename_keeps_the_expiry_and_moves_the_value():
    a = Applier()
    a(T, b"RPUSH", b"l", b"a")
    a(T, b"PEXPIRE", b"l", 5000)
    value = a.state.data[b"l"]
    a(T, b"SET", b"m", b"x")
    assert a(T + 1, b"RENAME", b"l", b"m") is OK
    assert a.state.data[b"m"] is value and a.state.expires[b"m"] == T + 5000 and b"l" not in a.state.data
    assert a(T + 1, b"RENAMENX", b"m", b"m") == 0 and a(T + 1, b"RENAME", b"m", b"m") is OK
    a(T, b"SET", b"n", b"v")
    assert a(T + 1, b"RENAMENX", b"m", b"n") == 0 and a.state.data[b"n"] == b"v"


def test_copy_is_independent_of_its_source():
    a = Applier()
    a(T, b"RPUSH", b"l", b"a", b"b")
    a(T, b"PEXPIRE", b"l", 5000)
    assert a(T, b"COPY", b"l", b"c") == 1
    assert a.state.data[b"c"] is not a.state.data[b"l"] and a.state.expires[b"c"] == T + 5000
    a(T, b"RPUSH", b"c", b"z")
    assert list(a.state.data[b"l"]) == [b"a", b"b"]
    assert a(T, b"COPY", b"l", b"c") == 0 and a(T, b"COPY", b"l", b"c", b"REPLACE", b"DB", 0) == 1
    assert isinstance(a(T, b"COPY", b"l", b"d", b"DB", 1), ReplyError)


# -- determinism -------------------------------------------------------------------------------------
def _script(seed: int, length: int = 400) -> list[tuple[int, list]]:
    """_script is a seeded list of (stamp, command) over few keys, using every command of the two modules."""
    rng = random.Random(seed)
    keys = [b"a", b"b", b"c", b"n", b"f"]
    numbers = [b"1", b"-3", b"0.5", b"1e3", b"x", b"0x10", b"inf"]
    out, stamp = [], T
    for _ in range(length):
        stamp += rng.randrange(0, 40)
        k, k2 = rng.choice(keys), rng.choice(keys)
        n = rng.choice([b"1", b"2", b"30", b"0", b"-1", b"abc"])
        command = rng.choice([
            [b"SET", k, rng.choice(numbers)], [b"SET", k, b"v", b"PX", n], [b"SET", k, b"w", b"KEEPTTL", b"XX"],
            [b"SET", k, b"g", b"GET", b"NX"], [b"SETEX", k, n, b"v"], [b"PSETEX", k, n, b"v"], [b"SETNX", k, b"s"],
            [b"MSETNX", k, b"1", k2, b"2"], [b"GETSET", k, b"5"], [b"GETDEL", k], [b"GETEX", k, b"PX", n],
            [b"GETEX", k, b"PERSIST"], [b"GETEX", k, b"PXAT", b"%d" % (stamp + rng.randrange(-20, 60))],
            [b"APPEND", k, b"z"], [b"SETRANGE", k, n, b"Q"], [b"INCRBYFLOAT", k, rng.choice(numbers)],
            [b"INCR", k], [b"EXPIRE", k, n, *rng.sample([b"NX", b"XX", b"GT", b"LT"], rng.randrange(2))],
            [b"PEXPIRE", k, n], [b"PEXPIREAT", k, b"%d" % (stamp + rng.randrange(-20, 60))], [b"PERSIST", k],
            [b"RENAME", k, k2], [b"RENAMENX", k, k2], [b"COPY", k, k2, *rng.choice([[], [b"REPLACE"]])],
            [b"RPUSH", k, b"e"], [b"DEL", k], [b"RANDOMKEY"],
        ])
        out.append((stamp, command))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_two_states_fed_the_same_records_end_identical(seed):
    first, second = Applier(), Applier()
    replies = []
    for stamp, command in _script(seed):
        one, two = first(stamp, *command), second(stamp, *command)
        if isinstance(one, ReplyError):
            assert isinstance(two, ReplyError) and one.message == two.message
        else:
            assert one == two, command
        replies.append(one)
        if stamp % 7 == 0:
            first.state.purge_expired(stamp)
            second.state.purge_expired(stamp)
    first.state.purge_expired(T * 2, limit=1000)
    second.state.purge_expired(T * 2, limit=1000)
    assert dump(first.state) == dump(second.state)
    assert any(isinstance(reply, ReplyError) for reply in replies) and any(reply == 1 for reply in replies)


def test_the_outcome_depends_on_the_stamp_not_on_the_clock():
    """The same record applied at another wall-clock time (later, on a node catching up) decides alike."""
    states = []
    for _ in range(2):
        a = Applier()
        a(T, b"SET", b"k", b"v", b"EX", 1)
        a(T + 999, b"GETEX", b"k", b"PX", 10)       # alive at the stamp: the expiry moves to T + 1009
        a(T + 2000, b"SETNX", b"k", b"new")         # expired at this stamp: SETNX sets it
        states.append(dump(a.state))
    assert states[0] == states[1] and states[0][0][b"k"] == b"new"


def test_randomkey_picks_alike_in_a_record_and_skips_expired_keys():
    first, second = Applier(), Applier()
    for a in (first, second):
        for i in range(50):
            a(T, b"SET", b"k%d" % i, b"v", *((b"PX", 5) if i % 5 else ()))
    picks = [(first(T + 10, b"RANDOMKEY"), second(T + 10, b"RANDOMKEY")) for _ in range(20)]
    assert all(one == two for one, two in picks)
    assert {one for one, _ in picks} <= {b"k%d" % i for i in range(0, 50, 5)}
    assert first.read(T + 10, b"RANDOMKEY") in {b"k%d" % i for i in range(0, 50, 5)}
    empty = Applier()
    empty(T, b"SET", b"gone", b"v", b"PX", 1)
    assert empty.read(T + 1, b"RANDOMKEY") is None


# -- errors and no-ops change nothing --------------------------------------------------------------
ERRORS = [
    [b"SET", b"s", b"v", b"EX", b"0"], [b"SET", b"s", b"v", b"EX", b"10", b"PX", b"10"], [b"SET", b"l", b"v", b"GET"],
    [b"SET", b"s", b"v", b"PX", b"9223372036854775807"], [b"SETEX", b"s", b"0", b"v"], [b"PSETEX", b"s", b"x", b"v"],
    [b"MSETNX", b"s", b"1", b"t"], [b"GETSET", b"l", b"v"], [b"GETDEL", b"l"], [b"GETEX", b"s", b"EX", b"0"],
    [b"GETEX", b"s", b"PERSIST", b"EX", b"1"], [b"GETEX", b"l", b"PERSIST"], [b"APPEND", b"l", b"x"],
    [b"SETRANGE", b"s", b"-1", b"x"], [b"SETRANGE", b"s", b"536870910", b"xyz"], [b"SETRANGE", b"l", b"0", b"x"],
    [b"INCRBYFLOAT", b"s", b"1"], [b"INCRBYFLOAT", b"f", b"inf"], [b"INCRBYFLOAT", b"f", b"1e5000"],
    [b"INCRBYFLOAT", b"f", b"1.18e4932"], [b"INCRBYFLOAT", b"l", b"1"], [b"EXPIRE", b"s", b"10", b"NX", b"XX"],
    [b"EXPIRE", b"s", b"10", b"foo"], [b"EXPIRE", b"s", b"9223372036854776"],
    [b"PEXPIRE", b"s", b"9223372036854775807"],
    [b"EXPIREAT", b"s", b"abc"], [b"RENAME", b"nokey", b"s"], [b"RENAMENX", b"nokey", b"s"], [b"COPY", b"s", b"s"],
    [b"COPY", b"s", b"t", b"DB", b"1"], [b"COPY", b"s", b"t", b"foo"], [b"SETNX", b"s"],
    [b"GETRANGE", b"s", b"a", b"1"],
]


@pytest.mark.parametrize("command", ERRORS, ids=lambda c: b" ".join(c).decode()[:40])
def test_an_error_changes_nothing(command):
    a = Applier()
    a(T, b"SET", b"s", b"abc", b"PX", 100_000)
    a(T, b"SET", b"f", b"1.18e4932")
    a(T, b"RPUSH", b"l", b"a")
    before = dump(a.state)
    assert isinstance(a(T + 1, *command), ReplyError)
    assert dump(a.state) == before


NO_OPS = [
    [b"SET", b"s", b"v", b"NX"], [b"SET", b"nokey", b"v", b"XX"], [b"SETNX", b"s", b"v"],
    [b"MSETNX", b"x", b"1", b"s", b"2"],
    [b"GETEX", b"s"], [b"GETEX", b"p", b"PERSIST"], [b"GETEX", b"nokey", b"EX", b"10"], [b"GETDEL", b"nokey"],
    [b"SETRANGE", b"s", b"3", b""], [b"SETRANGE", b"nokey", b"3", b""], [b"PERSIST", b"p"], [b"PERSIST", b"nokey"],
    [b"EXPIRE", b"s", b"10", b"NX"], [b"EXPIRE", b"p", b"10", b"XX"], [b"EXPIRE", b"p", b"10", b"GT"],
    [b"EXPIRE", b"s", b"1000", b"LT"], [b"EXPIRE", b"s", b"10", b"GT"], [b"EXPIRE", b"nokey", b"10"],
    [b"RENAMENX", b"s", b"p"], [b"RENAMENX", b"s", b"s"], [b"RENAME", b"s", b"s"], [b"COPY", b"s", b"p"],
    [b"COPY", b"nokey", b"x"],
]


@pytest.mark.parametrize("command", NO_OPS, ids=lambda c: b" ".join(c).decode()[:40])
def test_a_command_that_changes_nothing_touches_nothing(command):
    """Redis signals no change for these, so a WATCH on the key must hold (state.touched is WATCH's record)."""
    a = Applier()
    a(T, b"SET", b"s", b"abc", b"PX", 100_000)
    a(T, b"SET", b"p", b"v")
    before = dump(a.state)
    assert not isinstance(a(T + 1, *command), ReplyError)
    assert dump(a.state) == before


READS = [[b"GET", b"s"], [b"STRLEN", b"s"], [b"GETRANGE", b"s", b"0", b"-1"], [b"SUBSTR", b"s", b"1", b"2"],
         [b"EXPIRETIME", b"s"], [b"PEXPIRETIME", b"s"], [b"RANDOMKEY"], [b"OBJECT", b"ENCODING", b"s"],
         [b"OBJECT", b"REFCOUNT", b"l"], [b"OBJECT", b"IDLETIME", b"s"], [b"OBJECT", b"HELP"], [b"TTL", b"s"]]


def test_reads_change_nothing_even_on_expired_keys():
    a = Applier()
    a(T, b"SET", b"s", b"abc", b"PX", 100)
    a(T, b"RPUSH", b"l", b"a")
    before = dump(a.state)
    for now in (T, T + 100):
        for command in READS:
            a.read(now, *command)
    assert dump(a.state) == before


def test_writes_that_change_mark_the_key_for_watch():
    a = Applier()
    a(T, b"SET", b"s", b"abc")
    for command in ([b"APPEND", b"s", b"d"], [b"SETRANGE", b"s", b"0", b"x"], [b"INCRBYFLOAT", b"n", b"1"],
                    [b"EXPIRE", b"s", b"100"], [b"PERSIST", b"s"], [b"GETEX", b"s", b"PX", b"5"],
                    [b"GETSET", b"s", b"v"], [b"RENAME", b"s", b"t"], [b"COPY", b"t", b"u"], [b"GETDEL", b"u"]):
        index = a.index
        a(T, *command)
        changed = {key for key in (b"s", b"t", b"u", b"n") if a.state.changed_since(key, index)}
        assert changed, command


# -- replies ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("start, step, expected", [
    (None, b"0.1", b"0.1"), (b"0.1", b"0.2", b"0.3"), (b"0.3", b"1e3", b"1000.29999999999999999"),
    (b"1000.29999999999999999", b"-1000.3", b"0"), (b"0", b"0x1p-3", b"0.125"), (b"5", b"1.5e-7", b"5.00000015"),
    (b"0", b"0.000003814697265625", b"0.00000381469726562"),        # printf rounds a tie to even
    (b"0", b"0.000011444091796875", b"0.00001144409179688"),
    (b"-0", b"-0", b"0"), (b"0", b"-0.000000000000000001", b"0"), (b"3.0", b"0", b"3"),
    (b"5", b"123456789012345678901234567890", b"123456789012345678899921813504"),   # 5 is below an ulp
    (b"0", b"3.6e-4951", b"0"),
])
def test_incrbyfloat_writes_the_digits_of_redis(start, step, expected):
    a = Applier()
    if start is not None:
        a(T, b"SET", b"k", start)
    assert a(T, b"INCRBYFLOAT", b"k", step) == expected
    assert a.state.data[b"k"] == expected


def test_incrbyfloat_keeps_the_expiry_and_refuses_what_redis_refuses():
    a = Applier()
    a(T, b"SET", b"k", b"10.5", b"PX", 5000)
    assert a(T, b"INCRBYFLOAT", b"k", b"1") == b"11.5" and a.state.expires[b"k"] == T + 5000
    for bad in (b"1\x002", b" 1", b"1 ", b"nan", b"", b"0x", b"1e"):
        reply = a(T, b"INCRBYFLOAT", b"k", bad)
        assert isinstance(reply, ReplyError) and reply.message == "ERR value is not a valid float"
    reply = a(T, b"INCRBYFLOAT", b"k", b"-inf")
    assert reply.message == "ERR increment would produce NaN or Infinity"


def test_getrange_and_setrange():
    a = Applier()
    a(T, b"SET", b"k", b"abcdef")
    assert [a.read(T, b"GETRANGE", b"k", s, e) for s, e in [(0, -1), (-3, -1), (-1, -3), (5, 2), (-100, 2), (2, 100)]] \
        == [b"abcdef", b"def", b"", b"", b"abc", b"cdef"]
    assert a.read(T, b"GETRANGE", b"nokey", 0, 5) == b""
    assert a(T, b"SETRANGE", b"k", 8, b"XY") == 10 and a.state.data[b"k"] == b"abcdef\0\0XY"
    assert a(T, b"SETRANGE", b"k", 1, b"--") == 10 and a.state.data[b"k"] == b"a--def\0\0XY"
    assert a(T, b"SETRANGE", b"new", 2, b"z") == 3 and a.state.data[b"new"] == b"\0\0z"


def test_set_options_are_read_as_redis_reads_them():
    a = Applier()
    assert a(T, b"SET", b"k", b"v", b"EX", b"abc", b"EX", b"10") is OK and a.state.expires[b"k"] == T + 10_000
    assert a(T, b"SET", b"k", b"v", b"KEEPTTL", b"KEEPTTL") is OK and a.state.expires[b"k"] == T + 10_000
    assert a(T, b"SET", b"k", b"v", b"PX", b"1000000000000000000") is OK
    assert a.state.expires[b"k"] == T + 10 ** 18
    assert a(T, b"SET", b"k", b"v", b"EX", b"0", b"foo").message == "ERR syntax error"
    assert a(T, b"SET", b"k", b"v", b"EX", b"9223372036854775").message == "ERR invalid expire time in 'set' command"
    assert a(T, b"SETEX", b"k", b"0", b"v").message == "ERR invalid expire time in 'setex' command"
    assert a(T, b"GETEX", b"k", b"PX", b"0").message == "ERR invalid expire time in 'getex' command"
    assert a(T, b"EXPIRE", b"k", b"9223372036854776").message == "ERR invalid expire time in 'expire' command"
    assert a(T, b"PEXPIREAT", b"k", b"9223372036854775807") == 1
    assert a.read(T, b"EXPIRETIME", b"k") == 9223372036854776


@pytest.mark.parametrize("value, expected", [
    (b"1", b"int"), (b"-9223372036854775808", b"int"), (b"9223372036854775808", b"embstr"), (b"01", b"embstr"),
    (b"-0", b"embstr"), (b"x" * 44, b"embstr"), (b"x" * 45, b"raw"), (b"", b"embstr"),
    (List([b"a"]), b"quicklist"), (Hash({b"f": b"v"}), b"listpack"), (Hash({b"f": b"v" * 65}), b"hashtable"),
    (Hash({b"f%d" % i: b"v" for i in range(513)}), b"hashtable"),
    (Hash({b"f%d" % i: b"v" for i in range(512)}), b"listpack"),
    (SetValue({b"1", b"-2"}), b"intset"), (SetValue({b"a"}), b"hashtable"),
    (SetValue({b"%d" % i for i in range(513)}), b"hashtable"), (ZSet([(1.0, b"a")]), b"listpack"),
    (ZSet([(1.0, b"a" * 65)]), b"skiplist"), (ZSet([(float(i), b"m%d" % i) for i in range(129)]), b"skiplist"),
])
def test_object_encoding_follows_redis_default_limits(value, expected):
    assert encoding_of(value) == expected


def test_object_replies():
    a = Applier()
    a(T, b"SET", b"k", b"123")
    a(T, b"SET", b"big", b"10000")
    assert a.read(T, b"OBJECT", b"ENCODING", b"k") == b"int"
    assert a.read(T, b"OBJECT", b"REFCOUNT", b"k") == 2147483647 and a.read(T, b"OBJECT", b"REFCOUNT", b"big") == 1
    assert a.read(T, b"OBJECT", b"ENCODING", b"nokey") is None
    assert a.read(T, b"OBJECT", b"FREQ", b"k").message.startswith("ERR An LFU maxmemory policy is not selected")
    assert a.read(T, b"OBJECT", b"nope", b"k").message == "ERR unknown subcommand 'nope'. Try OBJECT HELP."
    assert a.read(T, b"OBJECT", b"ENCODING").message == "ERR wrong number of arguments for 'object|encoding' command"
    assert len(a.read(T, b"OBJECT", b"HELP")) == 15


def test_a_snapshot_sees_keys_as_they_were_before_rename_copy_and_append():
    a = Applier()
    a(T, b"RPUSH", b"a", b"x")
    a(T, b"SET", b"s", b"v", b"PX", 9000)
    view = a.state.open_view()
    a(T, b"RENAME", b"a", b"z")
    a(T, b"RPUSH", b"z", b"y")
    a(T, b"COPY", b"s", b"c")
    a(T, b"APPEND", b"s", b"w")
    a(T, b"PERSIST", b"s")
    items = []
    done = view.chunk(100, lambda key, value, at: items.append((key, value, at)))
    assert done
    assert sorted((key, list(value) if isinstance(value, List) else value, at) for key, value, at in items) == [
        (b"a", [b"x"], 0), (b"s", b"v", T + 9000)]
