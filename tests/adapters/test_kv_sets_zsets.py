"""Sets and sorted sets run on a State as records are: types, empty containers, failed commands that
change nothing, WATCH's view of no-op writes, determinism of SPOP, scans, and score parsing."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from walkit.adapters.kv.resp import Double, ReplyError, SetReply
from walkit.adapters.kv.limits import SMALL_SCAN
from walkit.adapters.kv.state import WRONGTYPE, SetValue, ZSet
from walkit.adapters.kv.zsets import parse_score
from tests.support.kv_apply import StateApplier

T = 1_000_000


class Applier(StateApplier):
    """Applier is a StateApplier called as a(*args, stamp=T) and a.read(*args, stamp=T)."""

    def __call__(self, *args, stamp: int = T):
        return self.write(stamp, args)

    def read(self, *args, stamp: int = T):
        return self.read_at(stamp, args)

    def picture(self) -> dict:
        """picture is every key with a copy of its value and its expiry."""
        return {key: (value if type(value) is bytes else sorted(value) if type(value) is SetValue
                      else list(value.order), self.state.expires.get(key)) for key, value in self.state.data.items()}


def error(reply) -> str:
    assert isinstance(reply, ReplyError), reply
    return reply.message


WRITES = [
    ["SADD", "k", "a"], ["SREM", "k", "a"], ["SPOP", "k"], ["SPOP", "k", "2"], ["SMOVE", "k", "s", "a"],
    ["SMOVE", "s", "k", "a"], ["SUNIONSTORE", "d", "k"], ["SINTERSTORE", "d", "s", "k"], ["SDIFFSTORE", "d", "s", "k"],
    ["ZADD", "k", "1", "a"], ["ZINCRBY", "k", "1", "a"], ["ZREM", "k", "a"], ["ZRANGESTORE", "d", "k", "0", "-1"],
    ["ZREMRANGEBYRANK", "k", "0", "-1"], ["ZREMRANGEBYSCORE", "k", "-inf", "inf"], ["ZREMRANGEBYLEX", "k", "-", "+"],
    ["ZPOPMIN", "k"], ["ZPOPMAX", "k", "3"],
]
READS = [
    ["SMEMBERS", "k"], ["SISMEMBER", "k", "a"], ["SMISMEMBER", "k", "a"], ["SCARD", "k"], ["SRANDMEMBER", "k"],
    ["SRANDMEMBER", "k", "-3"], ["SUNION", "k"], ["SINTER", "k", "s"], ["SDIFF", "s", "k"],
    ["SINTERCARD", "2", "s", "k"], ["SSCAN", "k", "0"], ["ZSCORE", "k", "a"], ["ZMSCORE", "k", "a"], ["ZCARD", "k"],
    ["ZCOUNT", "k", "0", "1"],
    ["ZLEXCOUNT", "k", "-", "+"], ["ZRANGE", "k", "0", "-1"], ["ZRANGEBYSCORE", "k", "0", "1"],
    ["ZREVRANGEBYLEX", "k", "+", "-"], ["ZREVRANGE", "k", "0", "1"], ["ZRANK", "k", "a"], ["ZREVRANK", "k", "a"],
    ["ZRANDMEMBER", "k", "2", "WITHSCORES"], ["ZSCAN", "k", "0"],
]


@pytest.mark.parametrize("command", WRITES + READS, ids=lambda c: " ".join(c))
def test_wrongtype_changes_nothing(command):
    a = Applier()
    a("SET", "k", "v")
    a("SADD", "s", "a", "b")
    before = a.picture()
    assert error(a(*command)) == WRONGTYPE
    assert a.picture() == before


def test_set_commands_follow_redis():
    a = Applier()
    assert a("SADD", "s", "a", "b", "a") == 2 and a("SADD", "s", "b") == 0
    assert sorted(a.read("SMEMBERS", "s")) == [b"a", b"b"] and type(a.read("SMEMBERS", "s")) is SetReply
    assert a.read("SMISMEMBER", "s", "a", "x") == [1, 0] and a.read("SMISMEMBER", "none", "a") == [0]
    assert a("SMOVE", "s", "t", "a") == 1 and a.read("SMEMBERS", "t") == [b"a"]
    assert a("SINTERSTORE", "i", "s", "t") == 0 and not a.state.alive(b"i", T)
    assert a("SUNIONSTORE", "u", "s", "t", "none") == 2 and sorted(a.read("SMEMBERS", "u")) == [b"a", b"b"]
    assert a("SDIFFSTORE", "u", "u", "t") == 1 and a.read("SMEMBERS", "u") == [b"b"]
    assert a.read("SINTERCARD", "2", "u", "s") == 1
    assert a.read("SINTERCARD", "1", "u", "LIMIT", "1") == 1


def test_empty_containers_are_removed():
    a = Applier()
    a("SADD", "s", "a", "b")
    assert a("SREM", "s", "a", "b") == 2 and b"s" not in a.state.data
    a("SADD", "s", "a")
    assert a("SPOP", "s") == b"a" and b"s" not in a.state.data
    a("SADD", "s", "a", "b")
    assert sorted(a("SPOP", "s", "5")) == [b"a", b"b"] and b"s" not in a.state.data
    a("SADD", "s", "a")
    assert a("SMOVE", "s", "t", "a") == 1 and b"s" not in a.state.data and a.state.alive(b"t", T)
    for command in (["ZREM", "z", "a", "b"], ["ZPOPMIN", "z", "2"], ["ZPOPMAX", "z", "9"],
                    ["ZREMRANGEBYRANK", "z", "0", "-1"], ["ZREMRANGEBYSCORE", "z", "1", "2"],
                    ["ZREMRANGEBYLEX", "z", "-", "+"]):
        a("ZADD", "z", "1", "a", "2", "b")
        assert a(*command) in (2, [b"a", Double(1), b"b", Double(2)], [b"b", Double(2), b"a", Double(1)]), command
        assert b"z" not in a.state.data, command
    a("SET", "d", "v", "EX", "100")
    assert a("ZRANGESTORE", "d", "none", "0", "-1") == 0 and b"d" not in a.state.data


@pytest.mark.parametrize("command", [
    ["ZADD", "z", "1", "new", "x", "other"], ["ZADD", "z", "INCR", "-inf", "inf"], ["ZADD", "z", "NX", "XX", "1", "a"],
    ["ZADD", "z", "GT", "LT", "1", "a"], ["ZINCRBY", "z", "nan", "a"], ["ZADD", "z", "1", "a", "2"],
    ["SMOVE", "s", "str", "a"], ["SUNIONSTORE", "s", "s", "str"], ["SINTERSTORE", "d", "s", "str"],
    ["ZRANGESTORE", "d", "z", "(x", "1", "BYSCORE"], ["ZRANGESTORE", "d", "str", "0", "-1"],
    ["ZRANGESTORE", "d", "z", "0", "-1", "LIMIT", "0", "1"], ["ZREMRANGEBYSCORE", "z", "0", "nan"],
    ["ZREMRANGEBYLEX", "z", "a", "+"], ["ZREMRANGEBYRANK", "z", "0", "x"], ["SPOP", "s", "-1"], ["ZPOPMIN", "z", "x"],
    ["SPOP", "s", "1", "2"],
], ids=lambda c: " ".join(c))
def test_an_error_changes_nothing(command):
    a = Applier()
    a("SADD", "s", "a", "b")
    a("ZADD", "z", "1", "a", "inf", "inf")
    a("SET", "str", "v")
    a("ZADD", "d", "1", "x")
    before, touched = a.picture(), dict(a.state.touched)
    assert isinstance(a(*command), ReplyError)
    assert a.picture() == before and a.state.touched == touched


@pytest.mark.parametrize("command", [
    ["SADD", "s", "a"], ["SREM", "s", "x"], ["SREM", "none", "x"], ["SMOVE", "s", "t", "x"], ["SMOVE", "s", "s", "a"],
    ["SPOP", "s", "0"], ["ZADD", "z", "1", "a"], ["ZADD", "z", "NX", "5", "a"], ["ZADD", "z", "XX", "5", "x"],
    ["ZADD", "z", "GT", "0", "a"], ["ZINCRBY", "z", "0", "a"], ["ZREM", "z", "x"], ["ZREMRANGEBYRANK", "z", "5", "9"],
    ["ZREMRANGEBYSCORE", "z", "5", "9"], ["ZPOPMIN", "none"], ["ZPOPMAX", "z", "0"],
], ids=lambda c: " ".join(c))
def test_a_write_that_changes_nothing_leaves_watches_alone(command):
    a = Applier()
    a("SADD", "s", "a", "b")
    a("SADD", "t", "b")
    a("ZADD", "z", "1", "a")
    before, touched = a.picture(), dict(a.state.touched)
    a(*command)
    assert a.picture() == before and a.state.touched == touched


def test_smove_into_a_set_that_has_the_member_touches_only_the_source():
    a = Applier()
    a("SADD", "s", "a", "b")
    a("SADD", "t", "a")
    a("SMOVE", "s", "t", "a")
    assert a.state.touched[b"s"] == a.index and a.state.touched[b"t"] < a.index


def test_store_commands_replace_the_destination_and_its_expiry():
    a = Applier()
    a("SADD", "s", "a", "b")
    a("SET", "d", "v", "EX", "100")
    assert a("SUNIONSTORE", "d", "s") == 2 and a.state.ttl_ms(b"d", T) == -1
    a.state.data[b"s"].add(b"sneaky")      # the stored set is a copy, not the source itself
    assert sorted(a.read("SMEMBERS", "d")) == [b"a", b"b"]
    a("ZADD", "z", "1", "a", "2", "b")
    a("SET", "e", "v", "EX", "100")
    assert a("ZRANGESTORE", "e", "z", "0", "0") == 1 and a.state.ttl_ms(b"e", T) == -1
    assert a.read("ZRANGE", "e", "0", "-1", "WITHSCORES") == [b"a", Double(1)]


def test_an_expired_container_starts_over():
    a = Applier()
    a("SADD", "s", "a")
    a.state.set_expiry(b"s", T + 10)
    assert a("SADD", "s", "b", stamp=T + 10) == 1
    assert a.read("SMEMBERS", "s", stamp=T + 10) == [b"b"] and a.state.ttl_ms(b"s", T + 10) == -1
    a("ZADD", "z", "1", "a")
    a.state.set_expiry(b"z", T + 10)
    assert a.read("ZCARD", "z", stamp=T + 9) == 1 and a.read("ZCARD", "z", stamp=T + 10) == 0
    assert a("ZADD", "z", "XX", "2", "a", stamp=T + 10) == 0


def test_spop_picks_alike_on_every_node():
    members = [f"m{i}" for i in range(50)]
    first, second = Applier(), Applier()
    first("SADD", "s", *members)
    second("SADD", "s", *reversed(members))       # another history, so another set order
    for command in (["SPOP", "s"], ["SPOP", "s", "7"], ["SPOP", "s", "1"], ["SRANDMEMBER", "s", "-5"],
                    ["SPOP", "s", "30"]):
        assert first(*command) == second(*command)
        assert first.picture() == second.picture()


def test_spop_picks_by_the_record():
    picks = set()
    for index in range(8):
        a = Applier()
        a("SADD", "s", *[f"m{i}" for i in range(50)])
        a.index = index * 10
        picks.add(tuple(sorted(a("SPOP", "s", "5"))))
    assert len(picks) > 1


_NODE = """
import sys
from walkit.adapters.kv import commands
from walkit.adapters.kv.execute import run
from walkit.adapters.kv.state import State
from walkit.adapters.kv.table import Context
state = State()
members = [b"m%d" % i for i in range(300)]
for index, args in enumerate([[b"SADD", b"s", *members[::int(sys.argv[1])]], [b"SADD", b"s", *members],
                              [b"SPOP", b"s"], [b"SPOP", b"s", b"9"], [b"SRANDMEMBER", b"s", b"-4"],
                              [b"SMEMBERS", b"s"], [b"SPOP", b"s", b"100"]], 1):
    state.applying = index
    reply = run(Context(state, 1000, writing=True), args)
    if index > 2:
        print(reply)
print(sorted(state.data[b"s"]))
"""


@pytest.mark.processes
def test_spop_picks_alike_in_processes_with_other_hash_seeds(tmp_path):
    outputs = set()
    for seed, step in (("1", "1"), ("2", "-1"), ("3", "7")):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        done = subprocess.run([sys.executable, "-c", _NODE, step], cwd=tmp_path, env=env, capture_output=True,
                              check=True, timeout=60)
        outputs.add(done.stdout)
    assert len(outputs) == 1


def test_replies_listed_while_applying_are_sorted():
    a = Applier()
    members = [f"m{i}" for i in range(100, 0, -1)]
    a("SADD", "s", *members)
    a("SADD", "t", *members[:10])
    for command in (["SMEMBERS", "s"], ["SUNION", "s", "t"], ["SINTER", "s", "t"], ["SDIFF", "s", "t"],
                    ["SRANDMEMBER", "s", "200"], ["SSCAN", "s", "0"]):
        reply = a(*command)                         # as a transaction or a script runs it
        listed = reply[1] if command[0] == "SSCAN" else reply
        assert listed == sorted(listed), command


def test_sscan_pages_through_a_big_set_and_goes_on_after_changes():
    a = Applier()
    members = {f"m{i:04d}".encode() for i in range(1000)}
    a("SADD", "s", *members)
    cursor, seen, calls = b"0", [], 0
    while True:
        cursor, page = a.read("SSCAN", "s", cursor, "COUNT", "100")
        seen.extend(page)
        calls += 1
        if calls == 3:
            gone = min(members - set(seen))
            a("SREM", "s", gone)                    # gone before the scan reached it
            a("SADD", "s", "m0000x")                # added meanwhile: may be returned or not
        if cursor == b"0":
            break
    assert calls == 10 and len(seen) == len(set(seen))
    assert set(seen) - {b"m0000x"} == members - {gone}
    small = a.read("SSCAN", "t", "0")
    assert small == [b"0", []]
    a("SADD", "small", *range(SMALL_SCAN))
    cursor, page = a.read("SSCAN", "small", "0", "COUNT", "1")
    assert cursor == b"0" and len(page) == SMALL_SCAN
    assert error(a.read("SSCAN", "s", "1x")) == error(a.read("SSCAN", "s", str(1 << 64))) == "ERR invalid cursor"


def test_zscan_pages_by_member_position_so_a_changed_score_is_not_missed():
    a = Applier()
    a("ZADD", "z", *[part for i in range(500) for part in (str(i), f"m{i:03d}")])
    cursor, seen = b"0", {}
    while True:
        cursor, page = a.read("ZSCAN", "z", cursor, "COUNT", "50")
        seen.update(zip(page[::2], page[1::2]))
        a("ZADD", "z", "-1", "m499")                # moves to the front of the scores
        if cursor == b"0":
            break
    assert len(seen) == 500 and seen[b"m499"] in (b"499", b"-1") and seen[b"m010"] == b"10"


def test_zadd_options_and_scores():
    a = Applier()
    assert a("ZADD", "z", "1", "a", "2", "a") == 1 and a.read("ZSCORE", "z", "a") == 2.0
    assert a("ZADD", "z", "CH", "2", "a", "3", "b") == 1
    assert a("ZADD", "z", "GT", "CH", "1", "a", "5", "b") == 1 and a.read("ZMSCORE", "z", "a", "b", "x") == [2, 5, None]
    assert a("ZADD", "z", "INCR", "-0", "a") == 2.0
    assert a("ZINCRBY", "z", "-0", "new") == 0.0 and math.copysign(1, a("ZINCRBY", "z", "-0", "new2")) == -1
    assert math.copysign(1, a.read("ZSCORE", "z", "new2")) == 1      # stored as 0, as in a listpack
    assert a("ZADD", "z", "INCR", "inf", "a") == math.inf
    assert error(a("ZINCRBY", "z", "-inf", "a")) == "ERR resulting score is not a number (NaN)"
    assert a.read("ZSCORE", "z", "a") == math.inf and type(a.read("ZSCORE", "z", "a")) is Double


def test_zset_ranges():
    a = Applier()
    a("ZADD", "z", "1", "a", "2", "b", "2", "c", "3", "d")
    assert a.read("ZRANGE", "z", "(1", "2", "BYSCORE") == [b"b", b"c"]
    assert a.read("ZRANGE", "z", "+inf", "(1", "BYSCORE", "REV", "LIMIT", "1", "5") == [b"c", b"b"]
    assert a.read("ZRANGE", "z", "-1", "-2", "REV") == []
    assert a.read("ZRANGE", "z", "0", "1", "REV", "WITHSCORES") == [b"d", Double(3), b"c", Double(2)]
    assert a.read("ZRANK", "z", "c") == 2 and a.read("ZREVRANK", "z", "c") == 1
    assert a.read("ZCOUNT", "z", "(2", "+inf") == 1 and a.read("ZCOUNT", "z", "2", "(2") == 0
    a("ZADD", "lex", *[part for m in ("a", "b", "c", "d") for part in ("0", m)])
    assert a.read("ZRANGEBYLEX", "lex", "(a", "[c") == [b"b", b"c"]
    assert a.read("ZREVRANGEBYLEX", "lex", "+", "(b", "LIMIT", "1", "1") == [b"c"]
    assert a("ZREMRANGEBYLEX", "lex", "[b", "(d") == 2 and a.read("ZRANGE", "lex", "0", "-1") == [b"a", b"d"]
    assert isinstance(a.state.data[b"lex"], ZSet)


@pytest.mark.parametrize("text, value", [
    (b"1", 1.0), (b"-1.5", -1.5), (b"+2", 2.0), (b".5", 0.5), (b"5.", 5.0), (b"1e3", 1000.0), (b"0x10", 16.0),
    (b"0x1p-2", 0.25), (b"inf", math.inf), (b"-Infinity", -math.inf), (b"+inf", math.inf), (b"4e-320", 4e-320),
])
def test_scores_are_read_as_redis_reads_them(text, value):
    assert parse_score(text) == value


@pytest.mark.parametrize("text", [b"", b" 1", b"1 ", b"nan", b"-nan", b"1e400", b"1e-400", b"0x", b"1_0", b"1e",
                                  b"1\x00", b"abc", b"--1", b"0x1p99999"])
def test_bad_scores_are_refused(text):
    with pytest.raises(ReplyError, match="not a valid float"):
        parse_score(text)
