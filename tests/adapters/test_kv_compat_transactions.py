"""Transactions answered byte for byte as redis-server answers them (tests/support/redis_compare.py)."""

from __future__ import annotations

import time

from tests.support.redis_compare import RedisPair


def test_multi_exec_discard_and_their_errors(redis_pair):
    redis_pair.reset()
    redis_pair.same([b"EXEC"], [b"DISCARD"], [b"MULTI"], [b"MULTI"], [b"SET", b"a", b"1"], [b"INCR", b"a"],
                    [b"GET", b"a"], [b"INCRBY", b"a", b"x"], [b"EXEC"], [b"GET", b"a"],
                    [b"MULTI"], [b"SET", b"a", b"2"], [b"DISCARD"], [b"GET", b"a"],
                    [b"MULTI"], [b"EXEC"],
                    [b"MULTI"], [b"GET", b"a"], [b"EXISTS", b"a", b"b"], [b"EXEC"])


def test_a_queued_error_aborts_exec(redis_pair):
    redis_pair.reset()
    redis_pair.same([b"MULTI"], [b"SET", b"a", b"1"], [b"GET"], [b"NOSUCH", b"x"], [b"SET", b"b", b"2"], [b"EXEC"],
                    [b"GET", b"a"], [b"EXISTS", b"b"],
                    [b"MULTI"], [b"WATCH", b"a"], [b"MULTI"], [b"EXEC"])


def test_watch_aborts_when_another_connection_changed_the_key(redis_pair):
    redis_pair.reset()
    other = RedisPair(*redis_pair.ports.values())
    try:
        redis_pair.same([b"SET", b"w", b"1"], [b"WATCH", b"w", b"v"], [b"GET", b"w"])
        other.same([b"INCR", b"w"])
        redis_pair.same([b"MULTI"], [b"SET", b"w", b"10"], [b"EXEC"], [b"GET", b"w"])
        # EXEC forgot the watches: the next transaction runs
        redis_pair.same([b"MULTI"], [b"SET", b"w", b"10"], [b"EXEC"])
        # UNWATCH forgets them too; DISCARD as well
        redis_pair.same([b"WATCH", b"w"], [b"UNWATCH"])
        other.same([b"INCR", b"w"])
        redis_pair.same([b"MULTI"], [b"INCR", b"w"], [b"EXEC"])
        redis_pair.same([b"WATCH", b"w"], [b"MULTI"], [b"DISCARD"])
        other.same([b"INCR", b"w"])
        redis_pair.same([b"MULTI"], [b"INCR", b"w"], [b"EXEC"])
        # a key absent when watched and created by another: abort; deleted by another: abort
        redis_pair.same([b"WATCH", b"fresh"])
        other.same([b"SET", b"fresh", b"x"])
        redis_pair.same([b"MULTI"], [b"GET", b"fresh"], [b"EXEC"])
        redis_pair.same([b"WATCH", b"fresh"])
        other.same([b"DEL", b"fresh"])
        redis_pair.same([b"MULTI"], [b"GET", b"fresh"], [b"EXEC"])
        # the watching connection's own change aborts its transaction too
        redis_pair.same([b"WATCH", b"w"], [b"SET", b"w", b"own"], [b"MULTI"], [b"GET", b"w"], [b"EXEC"])
        # a watched key that expires before EXEC aborts it: watched alive (its TTL outlasts a loaded
        # machine's pause between the commands, which the PTTLs show), then its second passes
        set_at = time.monotonic()
        redis_pair.same([b"SET", b"t", b"v", b"PX", b"1000"], [b"WATCH", b"t"])
        ttls = redis_pair.send(b"PTTL", b"t")
        assert all(int(reply[1:-2]) > 0 for reply in ttls.values()), f"watched after it expired: {ttls}"
        time.sleep(max(0.0, 1.1 - (time.monotonic() - set_at)))     # the key's lifetime itself
        other.same([b"SET", b"unrelated", b"1"])
        redis_pair.same([b"MULTI"], [b"SET", b"t2", b"x"], [b"EXEC"], [b"EXISTS", b"t2"])
    finally:
        other.close()
