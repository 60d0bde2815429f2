"""Lua scripting (scripting.py, lua.py): conversions both ways, errors, the sandbox, determinism across nodes,
the instruction budget; then EVAL, EVALSHA, SCRIPT, redis-py's Script objects and Lock on an in-process server."""

from __future__ import annotations

import os
import threading

import pytest

from walkit import Position
from walkit.adapters.kv import commands  # noqa: F401 - registers every command
from walkit.adapters.kv import lua, scripting
from walkit.adapters.kv.execute import run
from walkit.adapters.kv.machine import KVMachine
from walkit.adapters.kv.records import Record, encode
from walkit.adapters.kv.resp import Double, ReplyError, SetReply, Simple
from walkit.adapters.kv.table import Context

from ..integration.helpers import wait_until

import redis  # noqa: E402  (a test dependency)

T = 1_700_000_000_123
INT64_MIN = -(1 << 63)


def context(machine: KVMachine | None = None, *, now: int = T, index: int = 1, writing: bool = True) -> Context:
    """context is what applying record `index` at stamp `now` gives a command."""
    machine = machine or KVMachine()
    machine.state.applying = index
    return Context(machine.state, now, machine, writing=writing)


def EVAL(ctx: Context, body: str, keys=(), args=(), command: bytes = b"EVAL"):
    """EVAL runs a script in `ctx` and returns its reply (an error as a ReplyError)."""
    encoded = [k if isinstance(k, bytes) else str(k).encode() for k in (*keys, *args)]
    return run(ctx, [command, body.encode(), b"%d" % len(keys), *encoded])


def error_of(reply) -> str:
    assert isinstance(reply, ReplyError), reply
    return reply.message


def sha(body: str) -> str:
    return scripting.sha1hex(body.encode()).decode()


# -- Lua values as replies ---------------------------------------------------------------------------
def test_lua_values_become_replies_as_in_redis():
    ctx = context()
    assert EVAL(ctx, "return 42") == 42
    assert EVAL(ctx, "return 3.99") == 3 and EVAL(ctx, "return -3.99") == -3          # truncated
    assert EVAL(ctx, "return 1e30") == INT64_MIN and EVAL(ctx, "return 0/0") == INT64_MIN
    assert EVAL(ctx, "return 2^62") == 1 << 62
    assert EVAL(ctx, "return 'text'") == b"text"
    assert EVAL(ctx, "return true") == 1
    assert EVAL(ctx, "return false") is None and EVAL(ctx, "return nil") is None and EVAL(ctx, "return") is None
    assert EVAL(ctx, "return {1, 'two', {3, {}}, true, false, 'after'}") == [1, b"two", [3, []], 1, None, b"after"]
    assert EVAL(ctx, "return {1, 2, nil, 4}") == [1, 2]                         # up to the first nil
    assert EVAL(ctx, "return {a = 1}") == [] and EVAL(ctx, "return function() end") is None
    status = EVAL(ctx, "return {ok = 'fine'}")
    assert type(status) is Simple and status == "fine"
    assert EVAL(ctx, "return redis.status_reply('a\\r\\nb')") == "a  b"
    assert error_of(EVAL(ctx, "return {err = 'MY boom'}")) == "MY boom"
    assert error_of(EVAL(ctx, "return {err = 'plain\\r\\n'}")) == "plain"
    assert error_of(EVAL(ctx, "return redis.error_reply('boom')")) == "ERR boom"
    assert error_of(EVAL(ctx, "return redis.error_reply('-CODE boom')")) == "CODE boom"
    assert error_of(EVAL(ctx, "return redis.status_reply(3)")) == "ERR wrong number or type of arguments"
    assert error_of(EVAL(ctx, "return {err = 'x', ok = 'y'}")) == "x"               # err is looked at first
    assert EVAL(ctx, "return {ok = 5}") == []                                      # not a string: an array
    double = EVAL(ctx, "return {double = 2.5}")
    assert type(double) is Double and double == 2.5
    assert EVAL(ctx, "return {map = {a = 1}}") == {b"a": 1}
    assert EVAL(ctx, "return {set = {m = true}}") == SetReply([b"m"])
    assert EVAL(ctx, "return {KEYS[1], ARGV[1], #KEYS, #ARGV}", keys=["k"], args=["a", "b"]) == [b"k", b"a", 1, 2]


def test_a_table_that_contains_itself_ends_in_an_error_at_the_depth_limit():
    reply = EVAL(context(), "local t = {} t[1] = t return t")
    depth = 0
    while isinstance(reply, list):
        assert len(reply) == 1
        reply, depth = reply[0], depth + 1
    assert depth == lua.MAX_REPLY_DEPTH and error_of(reply) == "ERR reached lua stack limit"


# -- replies as Lua values ---------------------------------------------------------------------------
def test_replies_become_lua_values_as_in_redis():
    ctx = context()
    assert EVAL(ctx, "return type(redis.call('incr', 'n'))") == b"number"
    assert EVAL(ctx, "return type(redis.call('get', 'n'))") == b"string"
    assert EVAL(ctx, "local v = redis.call('get', 'nothing') return {type(v), tostring(v)}") == [b"boolean", b"false"]
    assert EVAL(ctx, "local r = redis.call('set', 'k', 'v') return {type(r), r.ok}") == [b"table", b"OK"]
    assert EVAL(ctx, "return redis.call('mget', 'k', 'nothing', 'n')") == [b"v", None, b"1"]
    assert EVAL(ctx, "local r = redis.call('mget', 'k', 'nothing') return type(r[2])") == b"boolean"
    assert EVAL(ctx, "local r = redis.pcall('incr', 'k') return {type(r), r.err}") == [
        b"table", b"ERR value is not an integer or out of range"]
    assert error_of(EVAL(ctx, "return redis.pcall('incr', 'k')")) == "ERR value is not an integer or out of range"
    assert EVAL(ctx, "return {pcall(redis.call, 'incr', 'n')}") == [1, 2]                # true becomes 1


def test_with_setresp_3_nil_is_nil_and_maps_sets_and_doubles_are_tables():
    ctx = context()
    EVAL(ctx, "redis.call('hset', 'h', 'f', 'v') redis.call('sadd', 's', 'm')")
    assert EVAL(ctx, "redis.setresp(3) return tostring(redis.call('get', 'nothing'))") == b"nil"
    assert EVAL(ctx, "redis.setresp(3) return redis.call('hgetall', 'h').map.f") == b"v"
    assert EVAL(ctx, "redis.setresp(3) return tostring(redis.call('smembers', 's').set.m)") == b"true"
    assert EVAL(ctx, "return redis.call('hgetall', 'h')") == [b"f", b"v"]                # RESP2: flat
    assert EVAL(ctx, "redis.setresp(3) return false") is False
    assert error_of(EVAL(ctx, "redis.setresp(4)")).startswith("ERR RESP version must be 2 or 3.")


def test_numbers_passed_to_redis_call_are_written_as_redis_writes_them():
    ctx = context()
    for number, text in [("1.5", b"1.5"), ("1e20", b"1e+20"), ("2^53", b"9007199254740992"),
                         ("123456789012345678", b"1.2345678901234568e+17"), ("1/0", b"inf"), ("7", b"7")]:
        assert EVAL(ctx, f"redis.call('set', 'k', {number}) return redis.call('get', 'k')") == text


# -- errors --------------------------------------------------------------------------------------------
def test_errors_read_as_redis_7_0_s():
    ctx = context()
    body = "error('boom')"
    assert error_of(EVAL(ctx, body)) == f"ERR user_script:1: boom script: {sha(body)}, on @user_script:1."
    body = "\n\nlocal x = nil + 1"
    assert error_of(EVAL(ctx, body)) == (
        f"ERR user_script:3: attempt to perform arithmetic on a nil value script: {sha(body)}, on @user_script:3.")
    body = "redis.call('set', 'k', 'v') return redis.call('incr', 'k')"             # a tail call keeps the line
    assert error_of(EVAL(ctx, body)) == (
        f"ERR value is not an integer or out of range script: {sha(body)}, on @user_script:1.")
    body = "error({err = 'MY thing'})"
    assert error_of(EVAL(ctx, body)) == f"MY thing script: {sha(body)}, on @user_script:1."
    body = "error()"
    assert error_of(EVAL(ctx, body)) == f"ERR nil script: {sha(body)}, on @user_script:1."
    assert error_of(EVAL(ctx, "return (")) == (
        "ERR Error compiling script (new function): user_script:1: unexpected symbol near '<eof>'")
    assert error_of(EVAL(ctx, "#!lua\nreturn (")).endswith("user_script:2: unexpected symbol near '<eof>'")
    for args, message in [
        ("'nope'", "Unknown Redis command called from script"),
        ("'get'", "Wrong number of args calling Redis command from script"),
        ("", "Please specify at least one argument for this redis lib call"),
        ("'set', 'k', {}", "Lua redis lib command arguments must be strings or integers"),
        ("'set', 'k', nil", "Lua redis lib command arguments must be strings or integers"),
        ("'multi'", "This Redis command is not allowed from script"),
        ("'watch', 'k'", "This Redis command is not allowed from script"),
        ("'eval', 'return 1', 0", "This Redis command is not allowed from script"),
        ("'script', 'flush'", "This Redis command is not allowed from script"),
    ]:
        body = f"return redis.call({args})"
        assert error_of(EVAL(ctx, body)) == f"ERR {message} script: {sha(body)}, on @user_script:1.", args
        assert error_of(EVAL(ctx, f"return redis.pcall({args})")) == f"ERR {message}", args
    for call, message in [("redis.sha1hex()", "wrong number of arguments"),
                          ("redis.log(redis.LOG_WARNING)", "redis.log() requires two arguments or more.")]:
        body = f"return {call}"
        assert error_of(EVAL(ctx, body)) == f"ERR {message} script: {sha(body)}, on @user_script:1.", call
    assert error_of(EVAL(ctx, "error({})")).startswith("ERR unknown error script: ")


def test_numkeys_and_the_shebang_are_checked_as_redis_checks_them():
    ctx = context()
    assert error_of(run(ctx, [b"EVAL", b"return 1", b"x"])) == "ERR value is not an integer or out of range"
    assert error_of(run(ctx, [b"EVAL", b"return 1", b"2", b"k"])) == (
        "ERR Number of keys can't be greater than number of args")
    assert error_of(run(ctx, [b"EVAL", b"return 1", b"-1"])) == "ERR Number of keys can't be negative"
    assert error_of(run(ctx, [b"EVAL", b"return 1"])) == "ERR wrong number of arguments for 'eval' command"
    assert EVAL(ctx, "#!lua flags=no-writes,allow-oom\nreturn 1") == 1
    for body, message in [("#!lua", "ERR Invalid script shebang"),
                          ("#!lua flags=bad\nreturn 1", "ERR Unexpected flag in script shebang: bad"),
                          ("#!lua foo=bar\nreturn 1", "ERR Unknown lua shebang option: foo=bar"),
                          ("#!python\nreturn 1", "ERR Unexpected engine in script shebang: #!python")]:
        assert error_of(EVAL(ctx, body)) == message


def test_read_only_scripts_refuse_writes():
    ctx = context(writing=False)
    body = "return redis.call('set', 'k', 'v')"
    assert error_of(EVAL(ctx, body, command=b"EVAL_RO")) == (
        f"ERR Write commands are not allowed from read-only scripts. script: {sha(body)}, on @user_script:1.")
    assert error_of(EVAL(ctx, "return redis.pcall('del', 'k')", command=b"EVAL_RO")) == (
        "ERR Write commands are not allowed from read-only scripts.")
    assert error_of(EVAL(ctx, "#!lua\nreturn 1", command=b"EVAL_RO")) == (
        "ERR Can not execute a script with write flag using *_ro command.")
    assert EVAL(ctx, "#!lua flags=no-writes\nreturn redis.call('exists', 'k')", command=b"EVAL_RO") == 0
    writing = context()
    assert error_of(EVAL(writing, "#!lua flags=no-writes\nredis.call('set', 'k', 'v')")).startswith(
        "ERR Write commands are not allowed from read-only scripts. script: ")
    assert writing.state.lookup(b"k", T) is None


# -- the sandbox -----------------------------------------------------------------------------------------
def test_scripts_cannot_create_globals_nor_reach_the_machine():
    ctx = context()
    body = "x = 1"
    assert error_of(EVAL(ctx, body)) == (
        f"ERR user_script:1: Attempt to modify a readonly table script: {sha(body)}, on @user_script:1.")
    assert error_of(EVAL(ctx, "function helper() end")).startswith("ERR user_script:1: Attempt to modify a readonly")
    assert error_of(EVAL(ctx, "rawset(_G, 'x', 1)")).startswith("ERR Attempt to modify a readonly table script:")
    assert error_of(EVAL(ctx, "setmetatable(_G, nil)")).startswith("ERR Attempt to modify a readonly table script:")
    assert error_of(EVAL(ctx, "return loadstring('y = 1')()")).startswith(
        'ERR [string "y = 1"]:1: Attempt to modify a readonly table script:')
    for name in ("os", "io", "debug", "print", "require", "dofile", "loadfile", "setfenv", "getfenv", "python",
                 "package", "newproxy"):
        body = f"return type({name})"
        assert error_of(EVAL(ctx, body)) == (f"ERR user_script:1: Script attempted to access nonexistent global "
                                             f"variable '{name}' script: {sha(body)}, on @user_script:1.")
    dumped = EVAL(ctx, "local f, e = loadstring(string.dump(function() return 1 end)) return {tostring(f), e}")
    assert dumped == [b"nil", b"[string \"\x1bLuaQ\"]:1: unexpected symbol near 'char(27)'"]
    assert EVAL(ctx, "return loadstring('return 7')()") == 7
    assert EVAL(ctx, "local ok, e = pcall(coroutine.wrap(function() redis.call('nope') end)) return e") == (
        b"ERR Unknown Redis command called from script")          # pcall gives an error table's message
    assert error_of(EVAL(ctx, "return redis.call.__class__")).startswith("ERR user_script:1: attempt to index")
    assert EVAL(ctx, "return {type(redis.call), type(math.random), type(_G), _VERSION}") == [
        b"function", b"function", b"table", b"Lua 5.1"]


def test_what_a_script_changes_in_the_shared_tables_is_undone_after_it():
    ctx = context()
    assert EVAL(ctx, "string.extra = 'left over' KEYS = {1, 2} redis.call = nil "
                     "getmetatable('').__index = nil return 'changed'") == b"changed"
    assert EVAL(ctx, "return {tostring(string.extra), #KEYS, type(redis.call), ('x'):upper()}") == [
        b"nil", 0, b"function", b"X"]
    assert EVAL(ctx, "return #KEYS", keys=["a", "b"]) == 2
    assert EVAL(ctx, "return #KEYS") == 0
    EVAL(ctx, "collectgarbage('stop') collectgarbage('setpause', 1000)")
    assert EVAL(ctx, "return collectgarbage('setpause', 200)") == 200              # the defaults are back


# -- determinism ----------------------------------------------------------------------------------------------
def apply(machine: KVMachine, index: int, stamp: int, *args):
    return machine.apply(encode(Record(stamp, (tuple(args),))), Position(1, index))


def test_the_same_record_gives_the_same_randomness_time_and_writes_on_two_nodes():
    script = (b"local t = redis.call('TIME') "
              b"local picks = {math.random(), math.random(1000), math.random(5, 8)} "
              b"for i = 1, 20 do redis.call('rpush', KEYS[1], math.random(1000000)) end "
              b"redis.call('set', 'when', t[1] .. '.' .. t[2]) "
              b"return {t[1], t[2], tostring(picks[1]), picks[2], picks[3]}")
    first, second = KVMachine(), KVMachine()
    apply(second, 0, T - 5, b"EVAL", b"return redis.call('set', 'warm', 'up')", b"0")   # a used interpreter
    second.index = 0
    replies = [apply(m, 1, T, b"EVAL", script, b"1", b"list") for m in (first, second)]
    assert replies[0] == replies[1]
    assert replies[0][:2] == [b"%d" % (T // 1000), b"%d" % (T % 1000 * 1000)]           # the record's stamp
    assert list(first.state.lookup(b"list", T)) == list(second.state.lookup(b"list", T))
    again = apply(first, 2, T, b"EVAL", script, b"1", b"other")
    assert again[2] != replies[0][2]                                  # another record, another sequence


def test_math_randomseed_gives_redis_own_sequence():
    ctx = context()
    assert EVAL(ctx, "math.randomseed(42) return {tostring(math.random()), math.random(100)}") == [
        b"0.74452500033403", 35]                                      # what redis-server 7.0 answers
    assert error_of(EVAL(ctx, "return math.random(0)")).startswith(
        "ERR user_script:1: bad argument #1 to 'random' (interval is empty) script: ")
    assert error_of(EVAL(ctx, "return math.random(1, 2, 3)")).startswith("ERR user_script:1: wrong number of arguments")


def test_a_failing_script_keeps_its_writes_and_fails_alike_on_every_node():
    body = (b"redis.call('set', 'a', '1') redis.call('incr', 'a') redis.call('lpush', 'a', 'x') "
            b"redis.call('set', 'b', 1)")
    machines = [KVMachine(), KVMachine()]
    replies = [apply(m, 1, T, b"EVAL", body, b"0") for m in machines]
    assert error_of(replies[0]) == error_of(replies[1])
    assert "WRONGTYPE" in error_of(replies[0])
    for m in machines:
        assert m.state.get_string(b"a", T) == b"2" and m.state.lookup(b"b", T) is None


def test_a_script_that_does_not_end_is_stopped_at_the_same_point_on_every_node(monkeypatch):
    monkeypatch.setattr(lua, "MAX_SCRIPT_INSTRUCTIONS", 200_000)
    machines = [KVMachine(), KVMachine()]
    for body in (b"while true do redis.call('incr', 'n') end",
                 b"while true do pcall(function() while true do end end) end",
                 b"local co = coroutine.wrap(function() while true do end end) co()",
                 b"local co = coroutine.create(function() while true do end end) return {coroutine.resume(co)}"):
        for m in machines:
            m.index = 0
        replies = [apply(m, 1, T, b"EVAL", body, b"0") for m in machines]
        assert "ran more than 200000 Lua instructions" in error_of(replies[0]), body
        assert error_of(replies[0]) == error_of(replies[1])
    assert machines[0].state.get_string(b"n", T) == machines[1].state.get_string(b"n", T) is not None
    assert apply(machines[0], 2, T, b"EVAL", b"return redis.call('incr', 'n')", b"0") > 1   # the interpreter goes on


# -- the server: EVAL, EVALSHA, SCRIPT, redis-py -----------------------------------------------------------
@pytest.fixture
def client(kv_nodes):
    node = kv_nodes()
    wait_until(lambda: node.is_leader, 10)
    return node.redis()


def test_eval_evalsha_and_the_script_cache(client):
    assert client.eval("return redis.call('set', KEYS[1], ARGV[1])", 1, "k", "v") == b"OK"
    assert client.eval("return redis.call('get', KEYS[1])", 1, "k") == b"v"
    body = "return {KEYS[1], ARGV[1], 7}"
    loaded = client.script_load(body)
    assert loaded == sha(body)
    assert client.evalsha(loaded, 1, "key", "arg") == [b"key", b"arg", 7]
    assert client.evalsha(loaded.upper(), 1, "key", "arg") == [b"key", b"arg", 7]
    assert client.script_exists(loaded, "f" * 40) == [True, False]
    eval_only = "return 'eval caches too'"
    client.eval(eval_only, 0)
    assert client.script_exists(sha(eval_only)) == [True]
    assert client.evalsha_ro(loaded, 1, "key", "arg") == [b"key", b"arg", 7]
    assert client.eval_ro("return redis.call('get', 'k')", 0) == b"v"
    with pytest.raises(redis.ResponseError, match="Write commands are not allowed from read-only scripts"):
        client.eval_ro("return redis.call('del', 'k')", 0)
    with pytest.raises(redis.exceptions.NoScriptError):
        client.evalsha("f" * 40, 0)
    with pytest.raises(redis.exceptions.NoScriptError):
        client.evalsha_ro("f" * 40, 0)
    with pytest.raises(redis.ResponseError, match="Error compiling script"):
        client.script_load("return (")
    assert client.script_flush() is True
    assert client.script_exists(loaded, sha(eval_only)) == [False, False]
    with pytest.raises(redis.exceptions.NoScriptError):
        client.evalsha(loaded, 1, "key", "arg")


def test_register_script_loads_the_script_again_after_a_flush(client):
    add = client.register_script("return redis.call('incrby', KEYS[1], ARGV[1])")
    assert add(keys=["total"], args=[5]) == 5                     # EVALSHA, NOSCRIPT, SCRIPT LOAD, EVALSHA
    assert add(keys=["total"], args=[2]) == 7
    client.script_flush()
    assert add(keys=["total"], args=[1]) == 8
    with client.pipeline() as pipe:                               # a Script in a transaction
        add(keys=["total"], args=[10], client=pipe)
        pipe.get("total")
        assert pipe.execute() == [18, b"18"]


def test_redis_py_lock(client, kv_nodes):
    other = redis.Redis(port=client.connection_pool.connection_kwargs["port"], socket_timeout=20)
    lock = client.lock("resource", timeout=5)
    assert lock.acquire(blocking=False)
    assert lock.owned() and 4000 < client.pttl("resource") <= 5000
    rival = other.lock("resource", timeout=5)
    assert not rival.acquire(blocking=False)                      # held: the second client fails
    assert lock.extend(10)                                        # adds 10 s to what is left
    assert client.pttl("resource") > 10_000
    assert lock.reacquire()                                       # back to 5 s
    assert client.pttl("resource") <= 5000
    token = lock.local.token
    lock.release()
    assert not lock.owned() and client.get("resource") is None
    assert rival.acquire(blocking=False)                          # free again
    lock.local.token = token                                      # a stale holder: the scripts refuse it
    with pytest.raises(redis.exceptions.LockNotOwnedError):
        lock.extend(10)
    with pytest.raises(redis.exceptions.LockNotOwnedError):
        lock.release()
    assert rival.owned()
    rival.release()


def test_a_lock_serialises_concurrent_writers(client):
    port = client.connection_pool.connection_kwargs["port"]
    client.set("counter", 0)

    def worker() -> None:
        own = redis.Redis(port=port, socket_timeout=20)
        for _ in range(10):
            with own.lock("counter-lock", timeout=5, blocking_timeout=20, sleep=0.005):
                value = int(own.get("counter"))
                own.set("counter", value + 1)                     # lost if two held the lock at once
    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert client.get("counter") == b"30"


def test_a_script_runs_on_the_follower_too(kv_nodes):
    leader = kv_nodes()
    wait_until(lambda: leader.is_leader, 10)
    follower = kv_nodes()
    wait_until(lambda: follower.server.ready, 20)
    r = leader.redis()
    r.eval("for i = 1, 10 do redis.call('rpush', 'l', math.random(1000000)) end "
           "redis.call('set', 'at', redis.call('time')[1])", 0)
    r.set("marker", 1)
    wait_until(lambda: follower.machine.state.lookup(b"marker", T) is not None, 20)
    with leader.machine.lock, follower.machine.lock:
        assert list(leader.machine.state.lookup(b"l", T)) == list(follower.machine.state.lookup(b"l", T))
        assert leader.machine.state.lookup(b"at", T) == follower.machine.state.lookup(b"at", T)
    f = follower.redis()
    assert f.eval_ro("return redis.call('llen', 'l')", 0) == 10
    with pytest.raises(redis.ResponseError):
        f.eval("return 1", 0)                                     # EVAL is a write: the leader's


@pytest.mark.slow
def test_errors_raised_in_coroutines_survive_collection_in_another_thread():
    """Lua errors raised from the bridge inside coroutines, machines dropped, and the collector run
    by another thread: the process lives (before the bridge stopped keeping Lua objects in its
    errors, it died with SIGSEGV within 2-3 s of this loop; see tests/support/kv_lua_gc_stress.py)."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-m", "tests.support.kv_lua_gc_stress", "8"], capture_output=True,
                          text=True, timeout=120, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stderr[-3000:]}"
    assert "survived" in done.stdout
