"""The key-value state: Redis semantics of each record, expiry by stamps, scans, determinism."""

from __future__ import annotations

import random

from walkit.adapters.kv.records import GET, KEEPTTL, NX, XX, Delete, FlushDb, IncrBy, MSet, Set
from walkit.adapters.kv.resp import OK, ReplyError
from walkit.adapters.kv.state import State, compile_pattern, parse_int

T = 1_000_000


def test_set_flags_follow_redis():
    s = State()
    assert s.apply(Set(b"k", b"1", 0, XX), T) is None and s.get(b"k", T) is None
    assert s.apply(Set(b"k", b"1", 0, NX), T) is OK
    assert s.apply(Set(b"k", b"2", 0, NX), T) is None and s.get(b"k", T) == b"1"
    assert s.apply(Set(b"k", b"3", 0, XX | GET), T) == b"1" and s.get(b"k", T) == b"3"
    assert s.apply(Set(b"new", b"x", 0, GET), T) is None and s.get(b"new", T) == b"x"


def test_expiry_is_judged_by_the_stamp_and_keepttl_keeps_it():
    s = State()
    s.apply(Set(b"k", b"v", T + 100), T)
    assert s.get(b"k", T + 99) == b"v" and s.get(b"k", T + 100) is None
    assert s.ttl_ms(b"k", T + 40) == 60
    s.apply(Set(b"k", b"w", 0, KEEPTTL), T + 50)
    assert s.ttl_ms(b"k", T + 50) == 50
    s.apply(Set(b"k", b"x"), T + 60)                       # a plain SET clears the expiry
    assert s.ttl_ms(b"k", T + 60) == -1 and s.ttl_ms(b"absent", T) == -2
    s.apply(Set(b"e", b"v", T + 10), T)
    assert s.apply(Set(b"e", b"again", 0, NX), T + 10) is OK  # expired counts as absent


def test_incr_errors_and_expired_counters():
    s = State()
    assert s.apply(IncrBy(b"c", 5), T) == 5
    assert s.apply(IncrBy(b"c", -7), T) == -2
    s.apply(Set(b"text", b"abc"), T)
    assert isinstance(s.apply(IncrBy(b"text", 1), T), ReplyError)
    s.apply(Set(b"big", b"%d" % ((1 << 63) - 1)), T)
    error = s.apply(IncrBy(b"big", 1), T)
    assert isinstance(error, ReplyError) and "overflow" in error.message
    s.apply(Set(b"ttl", b"10", T + 5), T)
    assert s.apply(IncrBy(b"ttl", 1), T) == 11 and s.ttl_ms(b"ttl", T) == 5   # INCR keeps the expiry
    assert s.apply(IncrBy(b"ttl", 1), T + 5) == 1 and s.ttl_ms(b"ttl", T + 5) == -1


def test_parse_int_is_strict_like_redis():
    assert [parse_int(t) for t in (b"0", b"-1", b"9223372036854775807", b"-9223372036854775808")] == \
        [0, -1, (1 << 63) - 1, -(1 << 63)]
    assert all(parse_int(t) is None for t in (b"", b"+1", b"01", b"-0", b" 1", b"1.0", b"9223372036854775808"))


def test_delete_mset_flush_and_size():
    s = State()
    assert s.apply(MSet((b"a", b"1", b"b", b"2", b"c", b"3")), T) is OK
    s.apply(Set(b"d", b"4", T + 1), T)
    assert s.size(T) == 4 and s.size(T + 1) == 3
    assert s.apply(Delete((b"a", b"a", b"zz", b"d")), T + 1) == 1    # d had expired
    assert s.keys(b"*", T) == [b"b", b"c"]
    assert s.apply(FlushDb(), T) is OK and s.size(T) == 0 and not s.expires


def test_glob_patterns():
    cases = {b"h?llo": [b"hello", b"hallo", b"hbllo", b"hxllo"],
             b"h*llo": [b"hello", b"hallo", b"hbllo", b"hxllo", b"hllo", b"heeeello"],
             b"h[ae]llo": [b"hello", b"hallo"], b"h[^e]llo": [b"hallo", b"hbllo", b"hxllo"],
             b"h[a-b]llo": [b"hallo", b"hbllo"], b"h\\*": [b"h*"]}
    words = {b"hello", b"hallo", b"hllo", b"heeeello", b"hbllo", b"hxllo", b"h*", b"hx"}
    for pattern, expected in cases.items():
        assert sorted(w for w in words if compile_pattern(pattern).match(w)) == sorted(expected), pattern


def test_scan_visits_every_key_once_while_keys_change():
    s = State()
    s.apply(MSet(tuple(x for i in range(500) for x in (b"k%04d" % i, b"v"))), T)
    s.apply(MSet((b"other", b"1")), T)
    seen, after = [], None
    while True:
        found, after = s.scan(after, 37, b"k*", T)
        seen += found
        s.apply(Delete((b"k%04d" % random.randrange(500),)), T)    # deletions never make it skip others
        if after is None:
            break
    assert len(seen) == len(set(seen)) and all(k.startswith(b"k") for k in seen)
    survivors = set(s.keys(b"k*", T))
    assert survivors <= set(seen)


def test_purge_is_deterministic_and_snapshot_items_rebuild_the_same_state():
    rng = random.Random(3)
    a, b = State(), State()
    stamp = T
    for _ in range(3000):
        stamp += rng.randrange(3)
        key = b"k%d" % rng.randrange(200)
        record = rng.choice([Set(key, b"v", stamp + rng.randrange(1, 50)), Set(key, b"w"), IncrBy(key, 1),
                             Delete((key,)), Set(key, b"x", 0, KEEPTTL | XX)])
        assert repr(a.apply(record, stamp)) == repr(b.apply(record, stamp))
        assert a.purge_expired(stamp, limit=3) == b.purge_expired(stamp, limit=3)
    assert a.data == b.data and a.expires == b.expires
    data, expires = a.copy_items()
    c = State.from_items((k, v, expires.get(k, 0)) for k, v in data.items())
    assert c.keys(b"*", stamp) == a.keys(b"*", stamp) and c.expires == a.expires
    assert c.purge_expired(stamp + 100, limit=10_000) == a.purge_expired(stamp + 100, limit=10_000)
