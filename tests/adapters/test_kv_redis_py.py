"""redis-py's everyday calls against an in-process server: expiry, scans, the data types, transactions."""

from __future__ import annotations

import pytest

from ..integration.helpers import wait_until

import redis  # noqa: E402  (a test dependency)


@pytest.fixture
def r(kv_nodes):
    node = kv_nodes()
    wait_until(lambda: node.is_leader, 10)
    return node.redis()


def test_setex_expire_persist_and_getex(r):
    assert r.setex("session", 100, "token") is True
    assert 99 <= r.ttl("session") <= 100
    assert r.expire("session", 500) is True and 499 <= r.ttl("session") <= 500
    assert r.expire("session", 10, gt=True) is False                  # GT: 10 is not greater
    assert r.persist("session") is True and r.ttl("session") == -1
    assert r.getex("session", px=250_000) == b"token" and 249 <= r.ttl("session") <= 250
    assert r.psetex("short", 50_000, "v") is True and 0 < r.pttl("short") <= 50_000
    assert r.expire("missing", 10) is False
    assert r.set("gone", "v", px=1) is True
    wait_until(lambda: r.get("gone") is None, 5, message="a 1 ms key did not expire")


def test_scan_iter_and_the_collection_scans_visit_everything_once(r):
    r.mset({f"user:{i:04d}": i for i in range(1500)})
    r.mset({f"other:{i}": i for i in range(50)})
    keys = list(r.scan_iter(match="user:*", count=100))
    assert sorted(keys) == sorted(f"user:{i:04d}".encode() for i in range(1500)) and len(keys) == len(set(keys))
    r.hset("big-hash", mapping={f"f{i}": i for i in range(1000)})
    assert dict(r.hscan_iter("big-hash", count=50)) == {f"f{i}".encode(): str(i).encode() for i in range(1000)}
    r.sadd("big-set", *range(700))
    assert sorted(int(m) for m in r.sscan_iter("big-set", count=33)) == list(range(700))
    r.zadd("big-zset", {f"m{i}": i for i in range(600)})
    assert sorted(r.zscan_iter("big-zset", count=40)) == sorted((f"m{i}".encode(), float(i)) for i in range(600))
    assert list(r.scan_iter(_type="zset")) == [b"big-zset"]


def test_the_data_types_through_redis_py(r):
    r.hset("h", mapping={"a": 1, "b": 2})
    assert r.hgetall("h") == {b"a": b"1", b"b": b"2"} and r.hincrby("h", "a", 5) == 6
    r.rpush("l", 1, 2, 3)
    r.lpush("l", 0)
    assert r.lrange("l", 0, -1) == [b"0", b"1", b"2", b"3"] and r.lpop("l") == b"0"
    r.sadd("s", "x", "y")
    assert r.smembers("s") == {b"x", b"y"} and r.sismember("s", "x")
    r.zadd("z", {"a": 1, "b": 2.5})
    assert r.zrange("z", 0, -1, withscores=True) == [(b"a", 1.0), (b"b", 2.5)] and r.zscore("z", "b") == 2.5
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        r.get("h")
    assert r.type("z") == b"zset" and r.incrbyfloat("f", 1.5) == 1.5


def test_resp3_clients_get_maps_sets_and_doubles(kv_nodes):
    node = kv_nodes()
    wait_until(lambda: node.is_leader, 10)
    r3 = node.redis(protocol=3)
    r3.hset("h", mapping={"a": 1})
    r3.sadd("s", "x")
    r3.zadd("z", {"m": 1.5})
    assert r3.hgetall("h") == {b"a": b"1"} and r3.smembers("s") == {b"x"} and r3.zscore("z", "m") == 1.5
    assert r3.zrange("z", 0, -1, withscores=True) == [[b"m", 1.5]]     # RESP3 pairs, as redis-py reads redis 7
