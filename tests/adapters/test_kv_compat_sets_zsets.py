"""Sets and sorted sets against a real redis-server 7.0, byte for byte (tests/support/redis_compare.py).

Replies that Redis orders by its hash tables (SMEMBERS, SUNION...) are compared as sorted lists,
random ones (SPOP, SRANDMEMBER, ZRANDMEMBER) by their shape, and scans by what a whole
iteration returned.
"""

from __future__ import annotations

from tests.support.redis_compare import _encode, _parse

SET_COMMANDS = [
    ["SADD", "k", "a"], ["SREM", "k", "a"], ["SMEMBERS", "k"], ["SISMEMBER", "k", "a"], ["SMISMEMBER", "k", "a"],
    ["SCARD", "k"], ["SPOP", "k"], ["SPOP", "k", "1"], ["SRANDMEMBER", "k"], ["SRANDMEMBER", "k", "2"],
    ["SMOVE", "k", "s", "a"], ["SMOVE", "s", "k", "a"], ["SUNION", "s", "k"], ["SINTER", "s", "k"],
    ["SDIFF", "s", "k"], ["SUNIONSTORE", "d", "s", "k"], ["SINTERSTORE", "d", "s", "k"],
    ["SDIFFSTORE", "d", "s", "k"], ["SINTERCARD", "2", "s", "k"], ["SSCAN", "k", "0"],
]
ZSET_COMMANDS = [
    ["ZADD", "k", "1", "a"], ["ZREM", "k", "a"], ["ZSCORE", "k", "a"], ["ZMSCORE", "k", "a"],
    ["ZINCRBY", "k", "1", "a"], ["ZCARD", "k"], ["ZCOUNT", "k", "-inf", "+inf"], ["ZLEXCOUNT", "k", "-", "+"],
    ["ZRANGE", "k", "0", "-1"], ["ZRANGEBYSCORE", "k", "0", "1"], ["ZREVRANGEBYSCORE", "k", "1", "0"],
    ["ZRANGEBYLEX", "k", "-", "+"], ["ZREVRANGEBYLEX", "k", "+", "-"], ["ZREVRANGE", "k", "0", "-1"],
    ["ZRANGESTORE", "d", "k", "0", "-1"], ["ZRANK", "k", "a"], ["ZREVRANK", "k", "a"],
    ["ZREMRANGEBYSCORE", "k", "0", "1"], ["ZREMRANGEBYRANK", "k", "0", "1"], ["ZREMRANGEBYLEX", "k", "-", "+"],
    ["ZPOPMIN", "k"], ["ZPOPMAX", "k", "2"], ["ZRANDMEMBER", "k"], ["ZRANDMEMBER", "k", "2", "WITHSCORES"],
    ["ZSCAN", "k", "0"],
]

#: redis-server 7.0's arity of each command (negative: at least that many, the name included).
ARITY = {
    "SADD": -3, "SREM": -3, "SMEMBERS": 2, "SISMEMBER": 3, "SMISMEMBER": -3, "SCARD": 2, "SPOP": -2,
    "SRANDMEMBER": -2, "SMOVE": 4, "SUNION": -2, "SINTER": -2, "SDIFF": -2, "SUNIONSTORE": -3, "SINTERSTORE": -3,
    "SDIFFSTORE": -3, "SINTERCARD": -3, "SSCAN": -3, "ZADD": -4, "ZREM": -3, "ZSCORE": 3, "ZMSCORE": -3,
    "ZINCRBY": 4, "ZCARD": 2, "ZCOUNT": 4, "ZLEXCOUNT": 4, "ZRANGE": -4, "ZRANGEBYSCORE": -4,
    "ZREVRANGEBYSCORE": -4, "ZRANGEBYLEX": -4, "ZREVRANGEBYLEX": -4, "ZREVRANGE": -4, "ZRANGESTORE": -5,
    "ZRANK": 3, "ZREVRANK": 3, "ZREMRANGEBYSCORE": 4, "ZREMRANGEBYRANK": 4, "ZREMRANGEBYLEX": 4, "ZPOPMIN": -2,
    "ZPOPMAX": -2, "ZRANDMEMBER": -2, "ZSCAN": -3,
}


def ask(pair, name: str, *args):
    """ask sends one command to one of the servers and returns its parsed RESP2 reply."""
    reader = pair.readers[name]
    reader.sock.sendall(_encode(args))
    return _parse(reader.read())


def scan_all(pair, name: str, *command) -> tuple[list, int]:
    """scan_all runs an SSCAN/ZSCAN (`command` with the cursor after the key) on one server until
    cursor 0; it returns every item returned and the number of calls."""
    key, options = command[1], command[2:]
    cursor, items, calls = b"0", [], 0
    while True:
        cursor, page = ask(pair, name, command[0], key, cursor, *options)
        items.extend(page)
        calls += 1
        if cursor == b"0":
            return items, calls


def same_scan(pair, *command, pairs: bool = False) -> list:
    """same_scan scans on both servers and asserts both returned the same items (in any order)."""
    found = {}
    for name in ("redis", "walkit"):
        items, _ = scan_all(pair, name, *command)
        if pairs:
            items = [tuple(items[i:i + 2]) for i in range(0, len(items), 2)]
            assert len(set(m for m, _ in items)) == len(items), f"{name} repeated a member"
        found[name] = sorted(set(items))
    assert found["walkit"] == found["redis"]
    return found["redis"]


def resp3_set(pair, *command) -> list[bytes]:
    """resp3_set sends a command answered with a RESP3 set of bulk strings and compares the members in any order."""
    got = pair.send(*command)
    parts = {}
    for name, raw in got.items():
        head, *rest = raw.split(b"\r\n")
        parts[name] = (head, sorted(zip(rest[0:-1:2], rest[1:-1:2])))
    assert parts["walkit"] == parts["redis"], got
    return [member for _, member in parts["redis"][1]]


def test_sadd_srem_and_membership(redis_pair):
    redis_pair.reset()
    redis_pair.same(["SADD", "s", "a", "b", "c", "a"], ["SADD", "s", "a"], ["SADD", "s", "a", "d"], ["SCARD", "s"],
                    ["SISMEMBER", "s", "a"], ["SISMEMBER", "s", "zz"], ["SISMEMBER", "nosuch", "a"],
                    ["SMISMEMBER", "s", "a", "zz", "d", "a"], ["SMISMEMBER", "nosuch", "a", "b"],
                    ["SREM", "s", "a", "zz", "a"], ["SREM", "nosuch", "a"], ["SREM", "s", "zz"], ["TYPE", "s"],
                    ["SREM", "s", "b", "c", "d"], ["EXISTS", "s"], ["SCARD", "s"], ["TYPE", "s"])
    redis_pair.same(["SADD", "n", "1", "2", "30", "-4"], ["SCARD", "n"], ["SADD", "n", "x"], ["SCARD", "n"])
    redis_pair.same_unordered(["SMEMBERS", "n"], ["SMEMBERS", "nosuch"])


def test_spop(redis_pair):
    redis_pair.reset()
    redis_pair.same(["SADD", "one", "x"], ["SPOP", "one"], ["EXISTS", "one"], ["SPOP", "nosuch"],
                    ["SPOP", "nosuch", "3"], ["SADD", "s", "a"], ["SPOP", "s", "0"], ["SCARD", "s"],
                    ["SPOP", "s", "-1"], ["SPOP", "s", "x"], ["SPOP", "s", "1", "2"], ["SPOP", "s", "1.5"])
    redis_pair.same(["SADD", "s", "b", "c"])
    redis_pair.same_unordered(["SPOP", "s", "10"])
    redis_pair.same(["EXISTS", "s"], ["SADD", "s", *"abcdefghij"])
    got = redis_pair.send("SPOP", "s", "4")
    popped = {name: _parse(raw) for name, raw in got.items()}
    for members in popped.values():
        assert len(members) == len(set(members)) == 4 and set(members) <= set(b"abcdefghij"[i:i + 1] for i in range(10))
    redis_pair.same(["SCARD", "s"])
    single = {name: _parse(raw) for name, raw in redis_pair.send("SPOP", "s").items()}
    assert all(len(member) == 1 for member in single.values())
    redis_pair.same(["SCARD", "s"])


def test_srandmember(redis_pair):
    redis_pair.reset()
    redis_pair.same(["SRANDMEMBER", "nosuch"], ["SRANDMEMBER", "nosuch", "5"], ["SRANDMEMBER", "nosuch", "-5"],
                    ["SADD", "one", "x"], ["SRANDMEMBER", "one"], ["SRANDMEMBER", "one", "1"],
                    ["SRANDMEMBER", "one", "-3"], ["SRANDMEMBER", "one", "0"], ["SRANDMEMBER", "one", "x"],
                    ["SRANDMEMBER", "one", "1", "2"], ["SRANDMEMBER", "one", "-9223372036854775808"],
                    ["SRANDMEMBER", "one", "9223372036854775808"], ["SADD", "s", *"abcdef"])
    redis_pair.same_unordered(["SRANDMEMBER", "s", "6"], ["SRANDMEMBER", "s", "100"])
    universe = {bytes([c]) for c in b"abcdef"}
    for count, size, distinct in (("3", 3, True), ("5", 5, True), ("-20", 20, False)):
        for members in (_parse(raw) for raw in redis_pair.send("SRANDMEMBER", "s", count).values()):
            assert len(members) == size and set(members) <= universe
            assert not distinct or len(set(members)) == size
    for member in (_parse(raw) for raw in redis_pair.send("SRANDMEMBER", "s").values()):
        assert member in universe
    redis_pair.same(["SCARD", "s"])


def test_smove(redis_pair):
    redis_pair.reset()
    redis_pair.same(["SADD", "src", "a", "b"], ["SADD", "dst", "b"], ["SET", "str", "v"],
                    ["SMOVE", "src", "dst", "a"], ["SMOVE", "src", "dst", "a"], ["SISMEMBER", "dst", "a"],
                    ["SMOVE", "src", "dst", "b"], ["EXISTS", "src"], ["SCARD", "dst"],
                    ["SMOVE", "nosuch", "str", "a"], ["SMOVE", "dst", "str", "a"], ["SMOVE", "str", "dst", "a"],
                    ["SMOVE", "dst", "dst", "a"], ["SMOVE", "dst", "dst", "zz"], ["SMOVE", "dst", "new", "a"],
                    ["SMEMBERS", "new"], ["SCARD", "dst"], ["SMOVE", "dst", "new", "zz"])


def test_set_algebra(redis_pair):
    redis_pair.reset()
    redis_pair.same(["SADD", "a", "1", "2", "3", "x"], ["SADD", "b", "2", "3", "4", "y"], ["SADD", "c", "3", "x", "z"])
    redis_pair.same_unordered(
        ["SUNION", "a"], ["SUNION", "a", "b", "c", "nosuch"], ["SUNION", "nosuch"],
        ["SINTER", "a", "b"], ["SINTER", "a", "b", "c"], ["SINTER", "a", "nosuch"], ["SINTER", "a", "a"],
        ["SDIFF", "a", "b"], ["SDIFF", "a", "b", "c"], ["SDIFF", "a", "nosuch"], ["SDIFF", "nosuch", "a"],
        ["SDIFF", "a", "a"], ["SDIFF", "b", "a", "c"])
    redis_pair.same(["SUNIONSTORE", "u", "a", "b"], ["SCARD", "u"], ["SINTERSTORE", "i", "a", "b", "c"],
                    ["SMEMBERS", "i"], ["SDIFFSTORE", "d", "a", "b"], ["SCARD", "d"],
                    ["SINTERSTORE", "u", "a", "nosuch"], ["EXISTS", "u"], ["SDIFFSTORE", "d", "a", "a"],
                    ["EXISTS", "d"], ["SUNIONSTORE", "a", "a", "c"], ["SCARD", "a"],
                    ["SET", "str", "v"], ["SUNIONSTORE", "str", "b"], ["TYPE", "str"],
                    ["SET", "exp", "v", "EX", "100"], ["SINTERSTORE", "exp", "b", "b"], ["TTL", "exp"],
                    ["SUNIONSTORE", "nothing", "nosuch"], ["EXISTS", "nothing"])
    redis_pair.same(["SINTERCARD", "2", "a", "b"], ["SINTERCARD", "3", "a", "b", "c"],
                    ["SINTERCARD", "2", "a", "b", "LIMIT", "1"], ["SINTERCARD", "2", "a", "b", "limit", "0"],
                    ["SINTERCARD", "1", "a", "LIMIT", "2", "LIMIT", "3"], ["SINTERCARD", "2", "a", "nosuch"],
                    ["SINTERCARD", "0", "a"], ["SINTERCARD", "-1", "a"], ["SINTERCARD", "x", "a"],
                    ["SINTERCARD", "3", "a", "b"], ["SINTERCARD", "1", "a", "LIMIT"],
                    ["SINTERCARD", "1", "a", "LIMIT", "-1"], ["SINTERCARD", "1", "a", "LIMIT", "x"],
                    ["SINTERCARD", "1", "a", "b"], ["SINTERCARD", "2", "a", "str"],
                    ["SINTERCARD", "2", "nosuch", "str"])


def test_sscan(redis_pair):
    redis_pair.reset()
    redis_pair.same(["SSCAN", "nosuch", "0"], ["SSCAN", "nosuch", "0", "COUNT", "0"], ["SSCAN", "nosuch", "x"],
                    ["SADD", "small", "a", "b", "c"], ["SSCAN", "small", "0", "COUNT", "0"],
                    ["SSCAN", "small", "0", "COUNT", "x"], ["SSCAN", "small", "0", "MATCH"],
                    ["SSCAN", "small", "0", "TYPE", "set"], ["SSCAN", "small", "abc"])
    assert same_scan(redis_pair, "SSCAN", "small") == [b"a", b"b", b"c"]
    members = [f"member:{i}" for i in range(300)]
    redis_pair.same(["SADD", "big", *members], ["SADD", "ints", *range(200)])
    assert same_scan(redis_pair, "SSCAN", "big") == sorted(m.encode() for m in members)
    assert len(same_scan(redis_pair, "SSCAN", "big", "COUNT", "7")) == 300
    assert len(same_scan(redis_pair, "SSCAN", "big", "MATCH", "member:1*", "COUNT", "50")) == 111
    assert len(same_scan(redis_pair, "SSCAN", "ints", "MATCH", "1?")) == 10
    _, calls = scan_all(redis_pair, "walkit", "SSCAN", "big", "COUNT", "100")
    assert calls == 3


def test_zadd_options(redis_pair):
    redis_pair.reset()
    redis_pair.same(["ZADD", "z", "1", "a", "2", "b"], ["ZADD", "z", "1", "a"], ["ZADD", "z", "5", "a", "CH"],
                    ["ZADD", "z", "CH", "5", "a", "3", "c"], ["ZADD", "z", "NX", "9", "a", "4", "d"],
                    ["ZADD", "z", "XX", "9", "a", "4", "e"], ["ZADD", "z", "XX", "CH", "10", "a", "4", "e"],
                    ["ZADD", "z", "GT", "CH", "1", "a", "20", "b"], ["ZADD", "z", "LT", "CH", "30", "a", "1", "b"],
                    ["ZADD", "z", "GT", "XX", "CH", "40", "a", "0", "f"], ["ZADD", "z", "2", "x", "3", "x"],
                    ["ZADD", "z", "CH", "7", "y", "8", "y"], ["ZRANGE", "z", "0", "-1", "WITHSCORES"],
                    ["ZADD", "z", "INCR", "5", "a"], ["ZADD", "z", "INCR", "5", "new"],
                    ["ZADD", "z", "NX", "INCR", "5", "a"], ["ZADD", "z", "XX", "INCR", "5", "nosuch"],
                    ["ZADD", "z", "GT", "INCR", "-1", "a"], ["ZADD", "z", "LT", "INCR", "-1", "a"],
                    ["ZADD", "nokey", "XX", "1", "a"], ["ZADD", "nokey", "XX", "INCR", "1", "a"], ["EXISTS", "nokey"],
                    ["ZADD", "z", "nx", "xx", "1", "a"], ["ZADD", "z", "NX", "GT", "1", "a"],
                    ["ZADD", "z", "GT", "LT", "1", "a"], ["ZADD", "z", "NX", "LT", "1", "a"],
                    ["ZADD", "z", "INCR", "1", "a", "2", "b"], ["ZADD", "z", "1"], ["ZADD", "z", "1", "a", "2"],
                    ["ZADD", "z", "NX"], ["ZADD", "z", "NX", "XX"], ["ZADD", "z", "1", "a", "x", "b"],
                    ["ZADD", "z", "nan", "a"], ["ZADD", "z", "1", "a", "nan", "b"], ["ZADD", "z", "INCR", "nan", "a"],
                    ["ZRANGE", "z", "0", "-1", "WITHSCORES"])


def test_score_formats(redis_pair):
    redis_pair.reset()
    scores = ["0", "-0", "1.5", "0.1", "-3", "1e17", "1e-5", "123456789012345678", "inf", "-inf", "+inf",
              "0x10", "1E3", ".5", "5.", "3.0000000000000001", "4e-320", "-1.7976931348623157e308"]
    for i, score in enumerate(scores):
        redis_pair.same(["ZADD", "z", score, f"m{i}"], ["ZSCORE", "z", f"m{i}"])
    for bad in ["", " 1", "1 ", "abc", "1e400", "1e-400", "nan", "-nan", "1,5", "1_0", "0x", "infinity1", "1e"]:
        redis_pair.same(["ZADD", "z", bad, "bad"], ["ZINCRBY", "z", bad, "bad"])
    redis_pair.same(["ZRANGE", "z", "0", "-1", "WITHSCORES"], ["ZSCAN", "z", "0"], ["ZCARD", "z"])
    redis_pair.same(["ZADD", "inf", "inf", "a"], ["ZINCRBY", "inf", "-inf", "a"], ["ZADD", "inf", "INCR", "-inf", "a"],
                    ["ZSCORE", "inf", "a"], ["ZINCRBY", "inf", "1", "a"], ["ZINCRBY", "inf", "-0", "b"],
                    ["ZSCORE", "inf", "b"], ["ZINCRBY", "inf", "0.1", "c"], ["ZINCRBY", "inf", "0.2", "c"])


def test_zrem_zscore_zcard_zrank(redis_pair):
    redis_pair.reset()
    redis_pair.same(["ZADD", "z", "1", "a", "2", "b", "2", "c", "-1", "d"], ["ZREM", "z", "a", "zz", "a"],
                    ["ZREM", "nosuch", "a"], ["ZREM", "z", "zz"], ["ZSCORE", "z", "b"], ["ZSCORE", "z", "zz"],
                    ["ZSCORE", "nosuch", "b"], ["ZMSCORE", "z", "b", "zz", "d"], ["ZMSCORE", "nosuch", "a", "b"],
                    ["ZCARD", "z"], ["ZCARD", "nosuch"], ["ZRANK", "z", "d"], ["ZRANK", "z", "c"],
                    ["ZREVRANK", "z", "d"], ["ZREVRANK", "z", "b"], ["ZRANK", "z", "zz"], ["ZRANK", "nosuch", "a"],
                    ["ZREVRANK", "nosuch", "a"], ["ZREM", "z", "b", "c", "d"], ["EXISTS", "z"])


def test_zcount_and_zlexcount(redis_pair):
    redis_pair.reset()
    redis_pair.same(["ZADD", "z", "1", "a", "2", "b", "3", "c", "4", "d", "inf", "e", "-inf", "f"])
    ranges = [("-inf", "+inf"), ("1", "3"), ("(1", "3"), ("1", "(3"), ("(1", "(3"), ("(1", "(2"), ("3", "1"),
              ("2", "2"), ("(2", "2"), ("", "2"), ("(", "10"), ("inf", "inf"), ("(inf", "inf"), ("-inf", "(-inf"),
              ("0x1", "0x3"), (" 2", "3"), ("2 ", "3"), ("a", "1"), ("1", "nan"), ("(nan", "1"), ("((1", "2"),
              ("1e400", "+inf"), ("-1e400", "1"), ("2\x00junk", "3")]
    for low, high in ranges:
        redis_pair.same(["ZCOUNT", "z", low, high], ["ZCOUNT", "nosuch", low, high])
    redis_pair.same(["ZADD", "lex", "0", "a", "0", "b", "0", "c", "0", "d", "0", "e", "0", "aa", "0", ""])
    lex = [("-", "+"), ("[a", "[c"), ("(a", "[c"), ("[a", "(c"), ("(a", "(b"), ("[c", "[a"), ("[b", "(b"),
           ("-", "(c"), ("[c", "+"), ("+", "-"), ("+", "+"), ("-", "-"), ("[", "[a"), ("(", "+"), ("a", "[c"),
           ("[a", "c"), ("-a", "+"), ("[a", "++"), ("", "+")]
    for low, high in lex:
        redis_pair.same(["ZLEXCOUNT", "lex", low, high], ["ZLEXCOUNT", "nosuch", low, high])
    redis_pair.same(["ZADD", "mixed", "1", "d", "2", "b", "3", "c", "4", "a"])
    for low, high in lex:
        redis_pair.same(["ZLEXCOUNT", "mixed", low, high], ["ZRANGEBYLEX", "mixed", low, high],
                        ["ZREVRANGEBYLEX", "mixed", high, low])


def test_zrange_forms(redis_pair):
    redis_pair.reset()
    redis_pair.same(["ZADD", "z", "1", "a", "2", "b", "3", "c", "4", "d", "5", "e", "1.5", "ab"])
    commands = [
        ["ZRANGE", "z", "0", "-1"], ["ZRANGE", "z", "0", "-1", "WITHSCORES"], ["ZRANGE", "z", "1", "2"],
        ["ZRANGE", "z", "-2", "-1"], ["ZRANGE", "z", "-100", "100"], ["ZRANGE", "z", "3", "1"],
        ["ZRANGE", "z", "10", "20"], ["ZRANGE", "z", "0", "-1", "REV"], ["ZRANGE", "z", "0", "1", "REV", "WITHSCORES"],
        ["ZRANGE", "z", "(1", "4", "BYSCORE"], ["ZRANGE", "z", "4", "(1", "BYSCORE", "REV", "WITHSCORES"],
        ["ZRANGE", "z", "-inf", "+inf", "BYSCORE", "LIMIT", "1", "2"],
        ["ZRANGE", "z", "+inf", "-inf", "BYSCORE", "REV", "LIMIT", "1", "2"],
        ["ZRANGE", "z", "-inf", "+inf", "BYSCORE", "LIMIT", "1", "-1"],
        ["ZRANGE", "z", "-inf", "+inf", "BYSCORE", "LIMIT", "-1", "2"],
        ["ZRANGE", "z", "-inf", "+inf", "BYSCORE", "LIMIT", "10", "2"],
        ["ZRANGE", "z", "-inf", "+inf", "BYSCORE", "LIMIT", "0", "0"],
        ["ZRANGE", "z", "[a", "[c", "BYLEX"], ["ZRANGE", "z", "[c", "-", "BYLEX", "REV"],
        ["ZRANGE", "z", "-", "+", "BYLEX", "LIMIT", "2", "2"], ["ZRANGE", "z", "0", "-1", "LIMIT", "0", "-1"],
        ["ZRANGE", "z", "0", "-1", "LIMIT", "5", "-1"], ["ZRANGE", "z", "0", "-1", "rev", "withscores"],
        # errors, in the order redis-server checks them
        ["ZRANGE", "z", "0", "-1", "LIMIT", "0", "1"], ["ZRANGE", "z", "-", "+", "BYLEX", "WITHSCORES"],
        ["ZRANGE", "z", "0", "-1", "BYSCORE", "BYLEX"], ["ZRANGE", "z", "0", "-1", "REV", "REV"],
        ["ZRANGE", "z", "0", "-1", "BYSCORE", "BYSCORE"], ["ZRANGE", "z", "0", "-1", "LIMIT", "1"],
        ["ZRANGE", "z", "0", "-1", "LIMIT", "x", "1", "BYSCORE"], ["ZRANGE", "z", "0", "-1", "FOO"],
        ["ZRANGE", "z", "a", "-1"], ["ZRANGE", "z", "0", "1.5"], ["ZRANGE", "z", "x", "1", "BYSCORE"],
        ["ZRANGE", "z", "a", "b", "BYLEX"], ["ZRANGE", "nosuch", "0", "-1"], ["ZRANGE", "nosuch", "x", "-1"],
        ["ZRANGE", "nosuch", "0", "-1", "WITHSCORES", "LIMIT", "0", "1"],
        ["ZREVRANGE", "z", "0", "-1"], ["ZREVRANGE", "z", "0", "2", "WITHSCORES"], ["ZREVRANGE", "z", "-2", "-1"],
        ["ZREVRANGE", "z", "0", "-1", "REV"], ["ZREVRANGE", "z", "0", "-1", "BYSCORE"],
        ["ZREVRANGE", "z", "0", "-1", "LIMIT", "0", "1"],
        ["ZRANGEBYSCORE", "z", "2", "4"], ["ZRANGEBYSCORE", "z", "-inf", "+inf", "WITHSCORES", "LIMIT", "1", "3"],
        ["ZRANGEBYSCORE", "z", "(1", "(5"], ["ZRANGEBYSCORE", "z", "4", "2"], ["ZRANGEBYSCORE", "z", "0", "1", "REV"],
        ["ZRANGEBYSCORE", "z", "0", "1", "BYSCORE"], ["ZRANGEBYSCORE", "z", "x", "1"],
        ["ZREVRANGEBYSCORE", "z", "4", "2"], ["ZREVRANGEBYSCORE", "z", "+inf", "-inf", "WITHSCORES", "LIMIT", "1", "2"],
        ["ZREVRANGEBYSCORE", "z", "2", "4"], ["ZREVRANGEBYSCORE", "z", "(4", "(1"],
        ["ZRANGEBYLEX", "z", "-", "+"], ["ZRANGEBYLEX", "z", "-", "+", "LIMIT", "1", "1"],
        ["ZRANGEBYLEX", "z", "-", "+", "WITHSCORES"], ["ZRANGEBYLEX", "z", "a", "+"],
        ["ZREVRANGEBYLEX", "z", "+", "-"], ["ZREVRANGEBYLEX", "z", "[c", "(a", "LIMIT", "0", "2"],
        ["ZREVRANGEBYLEX", "z", "-", "+"],
    ]
    redis_pair.same(*commands)


def test_zrangestore(redis_pair):
    redis_pair.reset()
    redis_pair.same(["ZADD", "z", "1", "a", "2", "b", "3", "c", "4", "d"], ["SET", "str", "v"],
                    ["ZRANGESTORE", "d", "z", "1", "2"], ["ZRANGE", "d", "0", "-1", "WITHSCORES"],
                    ["ZRANGESTORE", "d", "z", "(1", "+inf", "BYSCORE", "LIMIT", "1", "5"],
                    ["ZRANGE", "d", "0", "-1", "WITHSCORES"], ["ZRANGESTORE", "d", "z", "[c", "-", "BYLEX", "REV"],
                    ["ZRANGE", "d", "0", "-1", "WITHSCORES"], ["ZRANGESTORE", "d", "z", "0", "-1", "WITHSCORES"],
                    ["ZRANGESTORE", "d", "z", "5", "10"], ["EXISTS", "d"], ["ZRANGESTORE", "d", "nosuch", "0", "-1"],
                    ["ZRANGESTORE", "str", "z", "0", "0"], ["TYPE", "str"], ["ZRANGESTORE", "d", "str", "0", "-1"],
                    ["ZRANGESTORE", "d", "z", "x", "1"], ["ZRANGESTORE", "z", "z", "0", "1"],
                    ["ZRANGE", "z", "0", "-1", "WITHSCORES"], ["SET", "e", "v", "EX", "100"],
                    ["ZRANGESTORE", "e", "z", "0", "0"], ["TTL", "e"])


def test_zremrange(redis_pair):
    redis_pair.reset()
    members = ["ZADD", "z"] + [part for i in range(10) for part in (str(i), f"m{i}")]
    redis_pair.same(members, ["ZREMRANGEBYRANK", "z", "0", "1"], ["ZREMRANGEBYRANK", "z", "-2", "-1"],
                    ["ZREMRANGEBYRANK", "z", "5", "1"], ["ZREMRANGEBYRANK", "z", "100", "200"],
                    ["ZREMRANGEBYRANK", "z", "x", "1"], ["ZREMRANGEBYRANK", "nosuch", "0", "-1"],
                    ["ZRANGE", "z", "0", "-1"], ["ZREMRANGEBYSCORE", "z", "(2", "4"],
                    ["ZREMRANGEBYSCORE", "z", "9", "1"],
                    ["ZREMRANGEBYSCORE", "z", "x", "1"], ["ZREMRANGEBYSCORE", "nosuch", "x", "1"],
                    ["ZRANGE", "z", "0", "-1"], ["ZREMRANGEBYRANK", "z", "0", "-1"], ["EXISTS", "z"])
    redis_pair.same(["ZADD", "lex", "0", "a", "0", "b", "0", "c", "0", "d"], ["ZREMRANGEBYLEX", "lex", "(a", "[c"],
                    ["ZREMRANGEBYLEX", "lex", "a", "c"], ["ZREMRANGEBYLEX", "nosuch", "a", "c"],
                    ["ZRANGE", "lex", "0", "-1"], ["ZREMRANGEBYLEX", "lex", "-", "+"], ["EXISTS", "lex"],
                    ["ZADD", "z", "1", "a"], ["ZREMRANGEBYSCORE", "z", "-inf", "+inf"], ["EXISTS", "z"])


def test_zpop(redis_pair):
    redis_pair.reset()
    redis_pair.same(["ZADD", "z", "1", "a", "2", "b", "3", "c", "4", "d", "5", "e"], ["ZPOPMIN", "z"],
                    ["ZPOPMAX", "z"], ["ZPOPMIN", "z", "2"], ["ZPOPMAX", "z", "0"], ["ZPOPMIN", "z", "-1"],
                    ["ZPOPMIN", "z", "x"], ["ZPOPMIN", "z", "1", "2"], ["ZPOPMAX", "z", "10"], ["EXISTS", "z"],
                    ["ZPOPMIN", "nosuch"], ["ZPOPMAX", "nosuch", "2"], ["ZPOPMAX", "nosuch", "0"],
                    ["ZADD", "z", "1", "a", "1", "b", "1", "c"], ["ZPOPMAX", "z", "2"], ["ZPOPMIN", "z", "1"])


def test_zrandmember(redis_pair):
    redis_pair.reset()
    redis_pair.same(["ZRANDMEMBER", "nosuch"], ["ZRANDMEMBER", "nosuch", "3"],
                    ["ZRANDMEMBER", "nosuch", "-3", "WITHSCORES"], ["ZADD", "one", "1.5", "x"], ["ZRANDMEMBER", "one"],
                    ["ZRANDMEMBER", "one", "1", "WITHSCORES"], ["ZRANDMEMBER", "one", "-3", "WITHSCORES"],
                    ["ZRANDMEMBER", "one", "0"], ["ZRANDMEMBER", "one", "x"], ["ZRANDMEMBER", "one", "1", "FOO"],
                    ["ZRANDMEMBER", "one", "1", "WITHSCORES", "x"], ["ZRANDMEMBER", "nosuch", "1", "FOO"],
                    ["ZRANDMEMBER", "one", "-9223372036854775808"],
                    ["ZRANDMEMBER", "one", "4611686018427387904", "WITHSCORES"],
                    ["ZRANDMEMBER", "one", "-4611686018427387904", "WITHSCORES"],
                    ["ZADD", "z", "1", "a", "2", "b", "3", "c", "4", "d"], ["ZRANDMEMBER", "z", "4", "WITHSCORES"],
                    ["ZRANDMEMBER", "z", "10"])
    universe = {b"a", b"b", b"c", b"d"}
    for count, size, distinct in (("2", 2, True), ("3", 3, True), ("-10", 10, False)):
        for members in (_parse(raw) for raw in redis_pair.send("ZRANDMEMBER", "z", count).values()):
            assert len(members) == size and set(members) <= universe
            assert not distinct or len(set(members)) == size
    for flat in (_parse(raw) for raw in redis_pair.send("ZRANDMEMBER", "z", "-5", "WITHSCORES").values()):
        assert len(flat) == 10
        assert all(b"abcd".index(m) + 1 == int(s) for m, s in zip(flat[::2], flat[1::2]))


def test_zscan(redis_pair):
    redis_pair.reset()
    redis_pair.same(["ZSCAN", "nosuch", "0"], ["ZSCAN", "nosuch", "0", "COUNT", "0"],
                    ["ZADD", "small", "3", "c", "1.5", "a", "2", "b", "1e17", "big"], ["ZSCAN", "small", "0"],
                    ["ZSCAN", "small", "0", "MATCH", "b*"], ["ZSCAN", "small", "0", "COUNT", "1"],
                    ["ZSCAN", "small", "0", "COUNT", "0"], ["ZSCAN", "small", "0", "TYPE", "zset"],
                    ["ZSCAN", "small", "x"])
    redis_pair.same(["ZADD", "big", *[part for i in range(300) for part in (f"{i / 7}", f"member:{i}")]],
                    ["ZADD", "long", "1", "x" * 100, "2", "y"])
    assert len(same_scan(redis_pair, "ZSCAN", "big", pairs=True)) == 300
    assert len(same_scan(redis_pair, "ZSCAN", "big", "COUNT", "33", pairs=True)) == 300
    assert len(same_scan(redis_pair, "ZSCAN", "big", "MATCH", "*7", pairs=True)) == 30
    assert len(same_scan(redis_pair, "ZSCAN", "long", pairs=True)) == 2


def test_wrongtype_against_a_string(redis_pair):
    redis_pair.reset()
    redis_pair.same(["SET", "k", "v"], ["SET", "s", "v"])
    redis_pair.same(*SET_COMMANDS, *ZSET_COMMANDS)
    redis_pair.same(["DEL", "s"], ["SADD", "s", "a"], ["ZADD", "z", "1", "a"], ["SADD", "z", "a"],
                    ["ZADD", "s", "1", "a"],
                    ["SUNIONSTORE", "d", "z"], ["ZRANGESTORE", "d", "s", "0", "-1"], ["SMOVE", "s", "z", "a"],
                    ["SINTER", "nosuch", "z"], ["SDIFF", "nosuch", "z"], ["GET", "k"], ["SMEMBERS", "s"])


def test_wrong_arity(redis_pair):
    redis_pair.reset()
    for name, arity in ARITY.items():
        redis_pair.same([name] + ["k"] * (abs(arity) - 2))          # one argument short
        if arity > 0:
            redis_pair.same([name] + ["k"] * arity)                 # one too many


def test_resp3_replies(redis_pair):
    redis_pair.reset()
    redis_pair.send("HELLO", "3")
    redis_pair.same(["ZADD", "z", "1", "a", "2.5", "b", "inf", "c"], ["ZSCORE", "z", "b"], ["ZSCORE", "z", "c"],
                    ["ZSCORE", "z", "zz"], ["ZMSCORE", "z", "a", "zz"], ["ZINCRBY", "z", "1", "a"],
                    ["ZADD", "z", "INCR", "1", "a"], ["ZADD", "z", "XX", "INCR", "1", "zz"], ["ZRANK", "z", "zz"],
                    ["ZPOPMIN", "z"], ["ZRANDMEMBER", "nosuch"], ["ZRANDMEMBER", "nosuch", "2"],
                    ["ZRANGE", "z", "0", "-1"], ["ZRANGE", "nosuch", "0", "-1", "WITHSCORES"], ["ZSCAN", "z", "0"],
                    ["SRANDMEMBER", "nosuch"], ["SRANDMEMBER", "nosuch", "2"], ["SPOP", "nosuch"],
                    ["SPOP", "nosuch", "2"], ["SMEMBERS", "nosuch"], ["SINTER", "z2", "nosuch"],
                    ["SADD", "s", "x"], ["SPOP", "s", "0"], ["SMEMBERS", "s"], ["SPOP", "s", "5"])
    redis_pair.same(["SADD", "s", "a", "b", "c"], ["SADD", "t", "b", "c", "d"])
    assert resp3_set(redis_pair, "SMEMBERS", "s") == [b"a", b"b", b"c"]
    assert resp3_set(redis_pair, "SUNION", "s", "t") == [b"a", b"b", b"c", b"d"]
    assert resp3_set(redis_pair, "SINTER", "s", "t") == [b"b", b"c"]
    assert resp3_set(redis_pair, "SDIFF", "s", "t") == [b"a"]
    assert resp3_set(redis_pair, "SPOP", "t", "3") == [b"b", b"c", b"d"]


def test_resp3_scored_pairs(redis_pair):
    redis_pair.reset()
    redis_pair.send("HELLO", "3")
    redis_pair.same(["ZADD", "z", "1", "a", "2.5", "b", "3", "c", "4", "d"], ["ZRANGE", "z", "0", "-1", "WITHSCORES"],
                    ["ZRANGEBYSCORE", "z", "2", "3", "WITHSCORES"], ["ZREVRANGE", "z", "0", "1", "WITHSCORES"],
                    ["ZRANDMEMBER", "z", "4", "WITHSCORES"], ["ZPOPMIN", "z", "2"], ["ZPOPMAX", "z", "1"],
                    ["ZPOPMAX", "z", "0"])


def test_edges(redis_pair):
    redis_pair.reset()
    redis_pair.same(["ZADD", "z", "GT", "1", "new"], ["ZADD", "z", "LT", "CH", "2", "other", "0", "new"],
                    ["ZADD", "z", "XX", "GT", "5", "new"], ["ZADD", "z", "ch", "incr", "1", "new"],
                    ["ZRANGE", "z", "+inf", "-inf", "BYSCORE", "REV", "LIMIT", "0", "-7", "WITHSCORES"],
                    ["ZRANGE", "z", "(6", "+inf", "BYSCORE", "REV"], ["ZRANGE", "z", "+inf", "(2", "BYSCORE", "REV"],
                    ["ZADD", "mixed", "1", "d", "2", "b", "3", "c", "4", "a"], ["ZREMRANGEBYLEX", "mixed", "[b", "+"],
                    ["ZRANGE", "mixed", "0", "-1"], ["ZREMRANGEBYLEX", "mixed", "-", "[c"], ["ZRANGE", "mixed", "0", "-1"],
                    ["SADD", "s", "apple", "banana", "cherry"], ["SSCAN", "s", "0", "MATCH", "b*"],
                    ["SSCAN", "s", "0", "MATCH", "x*", "COUNT", "100"], ["SDIFFSTORE", "s", "s", "nosuch"],
                    ["SCARD", "s"], ["SMOVE", "s", "s", "apple"], ["SINTERCARD", "1", "s", "LIMIT", "0"])
