"""The key-value state: Redis semantics of the string commands run at a stamp, expiry by stamps,
scans, WATCH's window of changes, snapshot views, determinism."""

from __future__ import annotations

import random

from walkit.adapters.kv.execute import run
from walkit.adapters.kv.resp import OK, ReplyError
from walkit.adapters.kv.state import TOUCH_WINDOW, Hash, State, compile_pattern, parse_int
from walkit.adapters.kv.table import Context
from tests.support.kv_apply import StateApplier

T = 1_000_000


class Applier(StateApplier):
    """Applier is a StateApplier called as a(stamp, *args)."""

    def __call__(self, stamp: int, *args):
        return self.write(stamp, args)

    def get(self, key: bytes, now: int):
        return self.state.get_string(key, now)


def test_set_flags_follow_redis():
    a = Applier()
    assert a(T, b"SET", b"k", b"1", b"XX") is None and a.get(b"k", T) is None
    assert a(T, b"SET", b"k", b"1", b"NX") is OK
    assert a(T, b"SET", b"k", b"2", b"NX") is None and a.get(b"k", T) == b"1"
    assert a(T, b"SET", b"k", b"3", b"XX", b"GET") == b"1" and a.get(b"k", T) == b"3"
    assert a(T, b"SET", b"new", b"x", b"GET") is None and a.get(b"new", T) == b"x"


def test_expiry_is_judged_by_the_stamp_and_keepttl_keeps_it():
    a = Applier()
    s = a.state
    a(T, b"SET", b"k", b"v", b"PX", 100)                    # relative to the record's stamp
    assert a.get(b"k", T + 99) == b"v" and a.get(b"k", T + 100) is None
    assert s.ttl_ms(b"k", T + 40) == 60
    a(T + 50, b"SET", b"k", b"w", b"KEEPTTL")
    assert s.ttl_ms(b"k", T + 50) == 50
    a(T + 60, b"SET", b"k", b"x")                           # a plain SET clears the expiry
    assert s.ttl_ms(b"k", T + 60) == -1 and s.ttl_ms(b"absent", T) == -2
    a(T, b"SET", b"e", b"v", b"PXAT", T + 10)
    assert a(T + 10, b"SET", b"e", b"again", b"NX") is OK    # expired counts as absent


def test_incr_errors_and_expired_counters():
    a = Applier()
    s = a.state
    assert a(T, b"INCRBY", b"c", 5) == 5
    assert a(T, b"DECRBY", b"c", 7) == -2
    a(T, b"SET", b"text", b"abc")
    assert isinstance(a(T, b"INCR", b"text"), ReplyError)
    a(T, b"SET", b"big", (1 << 63) - 1)
    error = a(T, b"INCR", b"big")
    assert isinstance(error, ReplyError) and "overflow" in error.message
    a(T, b"SET", b"ttl", b"10", b"PX", 5)
    assert a(T, b"INCR", b"ttl") == 11 and s.ttl_ms(b"ttl", T) == 5     # INCR keeps the expiry
    assert a(T + 5, b"INCR", b"ttl") == 1 and s.ttl_ms(b"ttl", T + 5) == -1


def test_parse_int_is_strict_like_redis():
    assert [parse_int(t) for t in (b"0", b"-1", b"9223372036854775807", b"-9223372036854775808")] == \
        [0, -1, (1 << 63) - 1, -(1 << 63)]
    assert all(parse_int(t) is None for t in (b"", b"+1", b"01", b"-0", b" 1", b"1.0", b"9223372036854775808"))


def test_delete_mset_flush_and_size():
    a = Applier()
    s = a.state
    assert a(T, b"MSET", b"a", b"1", b"b", b"2", b"c", b"3") is OK
    a(T, b"SET", b"d", b"4", b"PX", 1)
    assert s.size(T) == 4 and s.size(T + 1) == 3
    assert a(T + 1, b"DEL", b"a", b"a", b"zz", b"d") == 1    # d had expired
    assert s.keys(b"*", T) == [b"b", b"c"]
    assert a(T, b"FLUSHALL") is OK and s.size(T) == 0 and not s.expires


def test_glob_patterns():
    cases = {b"h?llo": [b"hello", b"hallo", b"hbllo", b"hxllo"],
             b"h*llo": [b"hello", b"hallo", b"hbllo", b"hxllo", b"hllo", b"heeeello"],
             b"h[ae]llo": [b"hello", b"hallo"], b"h[^e]llo": [b"hallo", b"hbllo", b"hxllo"],
             b"h[a-b]llo": [b"hallo", b"hbllo"], b"h\\*": [b"h*"]}
    words = {b"hello", b"hallo", b"hllo", b"heeeello", b"hbllo", b"hxllo", b"h*", b"hx"}
    for pattern, expected in cases.items():
        assert sorted(w for w in words if compile_pattern(pattern).match(w)) == sorted(expected), pattern


def test_scan_visits_every_key_once_while_keys_change():
    a = Applier()
    s = a.state
    a(T, b"MSET", *(x for i in range(500) for x in (b"k%04d" % i, b"v")))
    a(T, b"MSET", b"other", b"1")
    seen, cursor = [], 0
    while True:
        found, cursor = s.scan(cursor, 37, b"k*", T)
        seen += found
        a(T, b"DEL", b"k%04d" % random.randrange(500))      # deletions never make it skip others
        a(T, b"SET", b"k-new-%d" % len(seen), b"v")        # nor do keys created meanwhile
        if cursor == 0:
            break
    assert len(seen) == len(set(seen)) and all(k.startswith(b"k") for k in seen)
    survivors = {key for key in s.keys(b"k*", T) if not key.startswith(b"k-new")}
    assert survivors <= set(seen)


def test_purge_is_deterministic_and_snapshot_items_rebuild_the_same_state():
    rng = random.Random(3)
    a, b = Applier(), Applier()
    stamp = T
    for _ in range(3000):
        stamp += rng.randrange(3)
        key = b"k%d" % rng.randrange(200)
        command = rng.choice([(b"SET", key, b"v", b"PX", rng.randrange(1, 50)), (b"SET", key, b"w"),
                              (b"INCR", key), (b"DEL", key), (b"SET", key, b"x", b"KEEPTTL", b"XX"),
                              (b"HSET", key, b"f", b"v")])
        assert repr(a(stamp, *command)) == repr(b(stamp, *command))
        assert a.state.purge_expired(stamp, limit=3) == b.state.purge_expired(stamp, limit=3)
    assert a.state.data == b.state.data and a.state.expires == b.state.expires
    assert a.state.touched == b.state.touched
    c = State.from_items(((k, v, a.state.expires.get(k, 0)) for k, v in a.state.data.items()),
                         a.state.touch_window())
    assert c.keys(b"*", stamp) == a.state.keys(b"*", stamp) and c.expires == a.state.expires
    assert c.touched == a.state.touched and c.forgotten == a.state.forgotten
    assert c.purge_expired(stamp + 100, limit=10_000) == a.state.purge_expired(stamp + 100, limit=10_000)


def test_the_touch_window_remembers_the_last_changes_and_what_it_forgot():
    a = Applier()
    s = a.state
    a(T, b"SET", b"k", b"1")                                # index 1
    assert not s.changed_since(b"k", 1) and s.changed_since(b"k", 0)
    assert not s.changed_since(b"other", 0)
    a(T, b"SET", b"nx", b"1", b"NX")
    a(T, b"SET", b"nx", b"2", b"NX")                        # refused: nothing changed
    assert not s.changed_since(b"nx", 2)
    a(T, b"GET", b"k")                                      # a read changes nothing
    assert not s.changed_since(b"k", 1)
    for i in range(50):                                     # a hot key takes one place, however often it changes
        s.applying = 10 + i
        s.store(b"hot", b"%d" % i)
    assert s.forgotten == 0 and not s.changed_since(b"k", 1) and len(s.touched) == 3
    for i in range(TOUCH_WINDOW):
        s.applying = 100 + i
        s.store(b"w%d" % i, b"v")
    assert s.forgotten == 59                                 # hot, last changed by record 59, went last
    assert s.changed_since(b"k", 1)                         # forgotten: assumed changed
    assert len(s.touched) == TOUCH_WINDOW
    a.index = 100 + TOUCH_WINDOW
    a(T, b"FLUSHALL")
    assert s.changed_since(b"never-written", a.index - 1)   # FLUSHALL changes every key


def test_a_snapshot_view_sees_the_keys_as_they_were_while_changes_go_on():
    a = Applier()
    s = a.state
    for i in range(50):
        a(T, b"SET", b"k%02d" % i, b"old", *((b"PXAT", T + 1000) if i % 2 else ()))
    s.store(b"k25", Hash({b"f": b"old"}))
    view = s.open_view()
    expected = {key: (value if type(value) is bytes else value.copy(), s.expires.get(key, 0))
                for key, value in s.data.items()}
    got, done, step = {}, False, 0
    while not done:
        done = view.chunk(7, lambda key, value, at: got.update({key: (value if type(value) is bytes else value.copy(),
                                                                       at)}))
        step += 1
        # between chunks: change keys before and after the cursor, create and delete some
        a(T, b"SET", b"k%02d" % (step * 3 % 50), b"new")
        a(T, b"DEL", b"k%02d" % (step * 5 % 50))
        a(T, b"SET", b"k%02d-new" % step, b"created")
        s.writable(b"k25", T, Hash)[b"f"] = b"new%d" % step           # a change in place (HSET)
        if step == 4:
            a(T, b"FLUSHALL")
            a(T, b"SET", b"k49", b"after-flush")
    s.close_view(view)
    assert got == expected
    assert isinstance(got[b"k25"][0], Hash) and got[b"k25"][0] == {b"f": b"old"}


def test_scan_cursors_after_long_keys_name_them_exactly_and_miss_no_key():
    a = Applier()
    long_keys = [b"L" * 3000 + b"%03d" % i for i in range(40)] + [b"L" * 3000 + b"\x00" * 5, b"\x00" * 1100]
    for key in long_keys:
        a(T, b"SET", key, b"v")
    seen, cursor = [], b"0"
    for _ in range(1000):
        cursor, keys = run(Context(a.state, T), [b"SCAN", cursor, b"COUNT", b"3"])
        seen += keys
        if cursor == b"0":
            break
    assert sorted(seen) == sorted(long_keys)                    # each once
    error = run(Context(a.state, T), [b"SCAN", b"9" * 5000])
    assert isinstance(error, ReplyError) and error.message == "ERR invalid cursor"
