"""Seeded random command sequences over every data type, answered byte for byte as redis-server answers them.

Each seed draws commands over a few keys (so types collide and WRONGTYPE, empty containers and
missing keys come up often), with arguments from small pools (so fields, members and ranges
repeat). Every reply is compared with a real redis-server 7.0's; replies whose order Redis leaves
to its hash tables (SMEMBERS, HGETALL...) are compared as sorted lists. A failure names the seed
and the command; replay one with `pytest tests/adapters/test_kv_compat_random.py -k 'seed7]'`.
"""

from __future__ import annotations

import random

import pytest

KEYS = [b"k0", b"k1", b"k2", b"k3"]
VALUES = [b"0", b"1", b"-3", b"10", b"a", b"bb", b"x y", b"2.5", b""]
FIELDS = [b"f0", b"f1", b"f2", b"f3"]
INDEXES = [b"0", b"1", b"-1", b"2", b"-2", b"5", b"-5"]
SCORES = [b"0", b"1", b"1.5", b"-2", b"+inf", b"-inf", b"3"]
BOUNDS = [b"0", b"1", b"(1", b"-inf", b"+inf", b"(1.5", b"2"]
LEX = [b"-", b"+", b"[a", b"(b", b"[f1", b"(f2"]

#: Commands whose replies list members in an order Redis leaves to its hash tables.
UNORDERED = {b"SMEMBERS", b"SUNION", b"SINTER", b"SDIFF", b"HKEYS", b"HVALS", b"KEYS"}
PAIRED = {b"HGETALL"}


def draw(rng: random.Random) -> list[bytes]:
    """draw returns one random command."""
    k, k2 = rng.choice(KEYS), rng.choice(KEYS)
    v, f, i, j = rng.choice(VALUES), rng.choice(FIELDS), rng.choice(INDEXES), rng.choice(INDEXES)
    s, lo, hi = rng.choice(SCORES), rng.choice(BOUNDS), rng.choice(BOUNDS)
    choices = [
        [b"SET", k, v], [b"GET", k], [b"DEL", k], [b"EXISTS", k, k2], [b"TYPE", k], [b"INCR", k],
        [b"INCRBY", k, rng.choice(INDEXES)], [b"APPEND", k, v], [b"STRLEN", k], [b"GETRANGE", k, i, j],
        [b"SETRANGE", k, rng.choice([b"0", b"2"]), v], [b"GETSET", k, v], [b"GETDEL", k], [b"SETNX", k, v],
        [b"MSET", k, v, k2, v], [b"MGET", k, k2], [b"RENAME", k, k2], [b"RENAMENX", k, k2], [b"COPY", k, k2],
        [b"PERSIST", k], [b"TTL", k], [b"EXPIRE", k, b"1000"], [b"INCRBYFLOAT", k, rng.choice([b"1.5", b"-0.25", b"3"])],
        [b"HSET", k, f, v], [b"HSET", k, f, v, rng.choice(FIELDS), v], [b"HGET", k, f], [b"HDEL", k, f],
        [b"HLEN", k], [b"HEXISTS", k, f], [b"HGETALL", k], [b"HKEYS", k], [b"HVALS", k], [b"HMGET", k, f, b"f9"],
        [b"HINCRBY", k, f, b"2"], [b"HSETNX", k, f, v], [b"HSTRLEN", k, f],
        [b"LPUSH", k, v], [b"RPUSH", k, v, v], [b"LPOP", k], [b"RPOP", k], [b"LRANGE", k, i, j], [b"LLEN", k],
        [b"LINDEX", k, i], [b"LSET", k, i, v], [b"LREM", k, rng.choice(INDEXES), v], [b"LTRIM", k, i, j],
        [b"LINSERT", k, rng.choice([b"BEFORE", b"AFTER"]), v, v], [b"LPOS", k, v], [b"RPOPLPUSH", k, k2],
        [b"LMOVE", k, k2, rng.choice([b"LEFT", b"RIGHT"]), rng.choice([b"LEFT", b"RIGHT"])],
        [b"SADD", k, v, f], [b"SREM", k, v], [b"SMEMBERS", k], [b"SISMEMBER", k, v], [b"SCARD", k],
        [b"SUNION", k, k2], [b"SINTER", k, k2], [b"SDIFF", k, k2], [b"SMOVE", k, k2, v],
        [b"SINTERSTORE", k, k, k2], [b"SMISMEMBER", k, v, f],
        [b"ZADD", k, s, f], [b"ZADD", k, rng.choice([b"NX", b"XX", b"GT", b"LT", b"CH"]), s, f],
        [b"ZINCRBY", k, s, f], [b"ZSCORE", k, f], [b"ZREM", k, f], [b"ZCARD", k], [b"ZCOUNT", k, lo, hi],
        [b"ZRANGE", k, i, j], [b"ZRANGE", k, i, j, b"WITHSCORES"], [b"ZRANGE", k, lo, hi, b"BYSCORE"],
        [b"ZRANGE", k, rng.choice(LEX), rng.choice(LEX), b"BYLEX"], [b"ZRANK", k, f], [b"ZREVRANK", k, f],
        [b"ZRANGEBYSCORE", k, lo, hi, b"WITHSCORES"], [b"ZREVRANGE", k, i, j], [b"ZPOPMIN", k], [b"ZPOPMAX", k],
        [b"ZREMRANGEBYSCORE", k, lo, hi], [b"ZREMRANGEBYRANK", k, i, j], [b"ZMSCORE", k, f, b"f9"],
    ]
    return rng.choice(choices)


@pytest.mark.parametrize("seed", range(12), ids=lambda seed: f"seed{seed}")
def test_random_commands_are_answered_as_redis_server_answers_them(redis_pair, seed):
    rng = random.Random(seed)
    redis_pair.reset()
    for step in range(250):
        command = draw(rng)
        try:
            if command[0] in UNORDERED or command[0] in PAIRED:
                redis_pair.same_unordered(command, pairs=command[0] in PAIRED)
            else:
                redis_pair.same(command)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}, step {step}: {exc}") from None
