"""Lua scripts sent to a real redis-server 7.0 and to walkit's KV server, replies compared byte for byte
(tests/support/redis_compare.py): conversions both ways, pcall and the reply helpers, errors with
their script and line, the sandbox, SCRIPT LOAD/EXISTS/FLUSH, EVALSHA and NOSCRIPT, the _RO forms.

Never sent: error({}) (redis-server 7.0.15 crashes on it) and endless loops (Redis answers BUSY to
everyone until SCRIPT KILL). The differences scripting.py's module doc lists are left out, except
where a test says so.
"""

from __future__ import annotations

import hashlib

import pytest


def EVAL(body: str, *keys_and_args, numkeys: int | None = None) -> list[bytes]:
    """EVAL is the command that runs `body` with its keys (all arguments, unless `numkeys` says otherwise)."""
    rest = [str(a).encode() for a in keys_and_args]
    count = len(rest) if numkeys is None else numkeys
    return [b"EVAL", body.encode(), b"%d" % count, *rest]


def sha(body: str) -> bytes:
    return hashlib.sha1(body.encode()).hexdigest().encode()


@pytest.fixture
def p(redis_pair):
    redis_pair.reset()
    return redis_pair


def test_lua_values_become_replies(p):
    p.same(*(EVAL(body) for body in [
        "return 42", "return 3.99", "return -3.99", "return 1e30", "return -1e30", "return 0/0", "return 2^63",
        "return 2^62", "return 'text'", "return ''", "return true", "return false", "return nil", "return",
        "return {1, 2.7, -2.7, 'x', true, false, nil, 5}", "return {1, {2, {3}}, {}}",
        "return {[1]=1, [2]=2, [4]=4}", "return {a=1}", "return function() end",
        "return coroutine.create(function() end)", "return {ok='fine'}", "return {ok='a\\r\\nb'}",
        "return {ok=''}", "return {ok=5}", "return {err='boom'}", "return {err='MY boom'}",
        "return {err='a\\r\\n'}", "return {err='\\r\\na'}", "return {err=''}", "return {err=5}",
        "return {err='x', ok='y'}", "return {ok=false, 1}", "return {double=3.5}", "return {double='3.5'}",
        "return {map={a=1}}", "return {set={a=true}}", "return {big_number='123'}",
        "return {verbatim_string={format='txt', string='hi'}}",
        "local t = setmetatable({}, {__index=function(t, k) return 'x' end}) return t",
        "return ...", "return select('#', ...)", "", "return ", "local x = 1 --",
    ]))
    p.same(EVAL("return {KEYS[1], ARGV[1], #KEYS, #ARGV}", "k", "a", "b", numkeys=1),
           EVAL("return {KEYS, ARGV}", "k", numkeys=0), EVAL("return KEYS"))


def test_replies_become_lua_values(p):
    p.same([b"SET", b"n", b"5"], [b"RPUSH", b"l", b"a", b"b"], [b"HSET", b"h", b"f", b"v"], [b"SADD", b"s", b"m"])
    p.same(*(EVAL(body) for body in [
        "return redis.call('get', 'n')", "return type(redis.call('incr', 'n'))", "return redis.call('incr', 'n')",
        "return type(redis.call('get', 'n'))", "return redis.call('get', 'nothing')",
        "return tostring(redis.call('get', 'nothing'))", "return {type(redis.call('get', 'nothing'))}",
        "local r = redis.call('set', 'k', 'v') return type(r) .. r.ok", "return redis.call('set', 'k', 'v')",
        "return redis.call('mget', 'k', 'nothing', 'n')", "return redis.call('lrange', 'l', 0, -1)",
        "return redis.call('hgetall', 'h')", "return redis.call('smembers', 's')", "return redis.call('exists', 'k')",
        "return redis.call('ping')", "return redis.call('ping', 'x')", "return redis.call('echo', 'x')",
        "return redis.call('select', '0')", "return #redis.call('time')", "return type(redis.call('time')[1])",
        "return redis.call('type', 'h')", "return redis.call('dbsize')",
        "local r = redis.pcall('incr', 'k') return type(r) .. r.err .. tostring(r.ignore_error_stats_update)",
        "return redis.pcall('incr', 'k')", "return {pcall(redis.call, 'incr', 'n')}",
        "return {pcall(error, 'x')}", "local ok, e = pcall(redis.call, 'nope') return e",
        "return {pcall(redis.call, 'incr', 'k')}", "return {pcall(error, {err = 'MY x'})}", "return {pcall(error, {})}",
        "local ok, e = xpcall(function() redis.call('nope') end, function(e) return type(e) end) return e",
        "local co = coroutine.create(function() redis.call('nope') end) local ok, e = coroutine.resume(co) "
        "return {tostring(ok), type(e), e.err}",
        "local x = redis.call('mget', 'a', 'b') return {type(x[1]), tostring(x[1])}",
        "return redis.call('SET', 'k', 'v')",
    ]))


def test_setresp_3(p):
    p.same([b"HSET", b"h", b"f", b"v"], [b"SADD", b"s", b"m"])
    p.same(*(EVAL(body) for body in [
        "redis.setresp(3) return redis.call('hgetall', 'nokey')",
        "redis.setresp(3) return redis.call('get', 'nokey')",
        "redis.setresp(3) return tostring(redis.call('get', 'nokey'))",
        "redis.setresp(3) return redis.call('hgetall', 'h').map.f",
        "redis.setresp(3) return redis.call('hgetall', 'h')",
        "redis.setresp(3) return redis.call('smembers', 's')",
        "redis.setresp(3) return tostring(redis.call('smembers', 's').set.m)",
        "redis.setresp(3) return nil", "redis.setresp(3) return false", "redis.setresp(3) return true",
        "redis.setresp('3') return 1", "redis.setresp(4)", "redis.setresp()",
    ]))


def test_numbers_passed_to_redis_call(p):
    for number in ["1.5", "1e20", "2^53", "-0.5", "123456789012345678", "1/0", "-1/0", "0/0", "7", "0.1"]:
        p.same(EVAL(f"return redis.call('set', 'k', {number})"), [b"GET", b"k"])
    p.same(EVAL("return redis.call('incrby', 'n', 2^53)"), EVAL("return redis.call('incrby', 'n', 0.1)"),
           EVAL("return redis.call('set', 'k', 'v', 'EX', 1.5)"))


def test_helpers_of_the_redis_table(p):
    p.same(*(EVAL(body) for body in [
        "return redis.error_reply('boom')", "return redis.error_reply('MY boom')",
        "return redis.error_reply('-MY boom')",
        "return redis.error_reply('a\\r\\nb')", "return redis.error_reply('a\\r\\n')", "return redis.error_reply('')",
        "return redis.error_reply('-')", "return redis.error_reply(3)", "return redis.error_reply()",
        "return redis.status_reply('fine')", "return redis.status_reply('a\\r\\nb')", "return redis.status_reply('')",
        "return redis.status_reply(3)", "return redis.sha1hex('')", "return redis.sha1hex('abc')",
        "return redis.sha1hex(1)", "return redis.sha1hex(nil)", "return redis.sha1hex()",
        "return redis.sha1hex('a', 'b')",
        "redis.log(redis.LOG_WARNING, 'hello', 'x')", "redis.log(redis.LOG_WARNING)", "redis.log('x', 'y')",
        "redis.log(7, 'y')", "redis.log(2, {})", "return redis.set_repl(redis.REPL_ALL)",
        "return redis.set_repl(9)", "return redis.set_repl()", "return redis.replicate_commands()",
        "return redis.breakpoint()", "return redis.debug('x')", "return redis.acl_check_cmd('get', 'k')",
        "return redis.acl_check_cmd('nope')", "return redis.acl_check_cmd()",
        "return {redis.LOG_DEBUG, redis.LOG_VERBOSE, redis.LOG_NOTICE, redis.LOG_WARNING}",
        "return {redis.REPL_NONE, redis.REPL_AOF, redis.REPL_SLAVE, redis.REPL_REPLICA, redis.REPL_ALL}",
        "return {redis.REDIS_VERSION, redis.REDIS_VERSION_NUM}",
        "local t = {} for k, v in pairs(redis) do t[#t+1] = k end table.sort(t) return t",
    ]))


def test_math_random_after_randomseed_is_redis_sequence(p):
    p.same(*(EVAL(body) for body in [
        "math.randomseed(42) return {tostring(math.random()), math.random(100), math.random(5, 8)}",
        "math.randomseed(-7) local t = {} for i = 1, 20 do t[i] = math.random(1000) end return t",
        "math.randomseed('7') return math.random(10)", "math.randomseed(2^40) return tostring(math.random())",
        "return math.random(0)", "return math.random(1, 2, 3)", "return math.random('x')", "return math.random(3, 1)",
        "math.randomseed(1) return math.random(2.9)", "return math.randomseed()", "return math.random({})",
    ]))


def test_errors_name_the_script_and_the_line(p):
    p.same([b"SET", b"k", b"text"])
    p.same(*(EVAL(body) for body in [
        "error('boom')", "error('a\\nb')", "error('a\\n')", "error(123)", "error()", "error({err='MY thing'})",
        "error({err=5})", "local function g() error('deep') end\nlocal x = 1\ng()", "\n\nlocal x = nil + 1",
        "return redis.call('incr', 'k')", "redis.call('incr', 'k')", "return redis.call('nope')",
        "return redis.call('get')", "return redis.call('get', 'k', 'x')", "return redis.call('multi')",
        "return redis.call('exec')", "return redis.call('discard')", "return redis.call('unwatch')",
        "return redis.call('watch', 'k')", "return redis.call('eval', 'return 1', 0)",
        "return redis.call('evalsha', 'x', 0)", "return redis.call('eval_ro', 'x', 0)",
        "return redis.call('script', 'load', 'return 1')", "return redis.call('auth', 'x')",
        "return redis.call('client', 'list') ~= nil", "return redis.call('config', 'get', 'maxmemory')",
        "return redis.call('hello')", "return redis.call('quit')", "return redis.call('echo')",
        "return redis.call('time', 'x')", "return redis.call('ping', 'a', 'b')", "return redis.call()",
        "return redis.call('set', 'k', {})", "return redis.call('set', 'k', true)",
        "return redis.call('set', 'k', nil)",
        "return redis.call(1)", "return redis.pcall('nope')", "return redis.pcall('get')", "return redis.pcall()",
        "return redis.pcall('set', 'k')", "local co = coroutine.wrap(function() redis.call('nope') end) co()",
        "local ok, e = pcall(function() x = 1 end) return e", "local ok, e = pcall(function() return y end) return e",
        "redis.call('set', 'a', 1) error('after')",
    ]))
    p.same([b"GET", b"a"])                                        # a script is not rolled back


def test_compile_errors(p):
    p.same(*(EVAL(body) for body in [
        "return (", "return 1 end function f_x() return 2", "return 1 --[[", "return [[a", "#!lua\nreturn (",
        "return 'a\\", "local = 1", "x = = 1", "return @",
    ]))


def test_the_sandbox(p):
    p.same(*(EVAL(body) for body in [
        "x = 1", "function f() end", "rawset(_G, 'x', 1)", "setmetatable(_G, nil)", "return loadstring('x = 1')()",
        "return loadstring('return 7')()", "return {loadstring('return (')}",
        "local a, b = loadstring('return (') return {tostring(a), b}",
        "local a, b = loadstring('return (', 'named') return {tostring(a), b}",
        "local a, b = loadstring('return (', '@named') return {tostring(a), b}",
        "local a, b = loadstring(string.dump(function() return 1 end)) return {tostring(a), b}",
        "local f = load(function() return nil end) return type(f)", "return type(debug)", "return type(os)",
        "return type(io)", "return type(print)", "return type(require)", "return type(package)", "return type(module)",
        "return type(dofile)", "return type(loadfile)", "return type(setfenv)", "return type(getfenv)",
        "return type(newproxy)", "return x", "return type(_G)", "return type(getmetatable(_G))",
        "return getmetatable(_G).__index == nil", "return tostring(rawequal(_G, _G._G))",
        "return rawget(_G, 'redis') ~= nil", "return rawget(_G, 'nope') == nil", "return _VERSION",
        "return type(getmetatable(''))", "return type(getmetatable('').__index)", "KEYS[1] = 'x' return KEYS[1]",
        "local t = {} t.x = 1 return t.x", "return tonumber('0x10')",
        "return string.format('%d %s %5.2f', 3, 'x', 1.5)",
        "return tostring(1e15)", "return {type(string.gfind), type(table.getn), type(math.mod)}",
        "local co = coroutine.create(function() coroutine.yield(1) return 2 end) "
        "local a, b = coroutine.resume(co) return {tostring(a), b}",
        "return {type(coroutine.wrap(function() end)), coroutine.running()}",
        "return pcall()", "return {xpcall(function() error('x') end, function(e) return 'handled ' .. e end)}",
        "return {pcall(pcall)}", "return select('#', pcall(error))",
        # not as `return f(...)`: these are Lua functions in walkit, and a tail call loses the line (module doc)
        "local r = xpcall(function() end) return r", "local r = coroutine.resume(1) return r",
        "local r = loadstring() return r", "local r = load(1) return r", "local r = coroutine.create(print) return r",
        "local r = rawset(1, 2, 3) return r", "local r = setmetatable(1, {}) return r",
        "local r = setmetatable({}, 1) return r", "local r = setmetatable(string, {}) return r",
    ]))


def test_the_globals_scripts_see(p):
    listing = ("local t = {} for k, v in pairs(_G) do t[#t+1] = k .. ':' .. type(v) end table.sort(t) "
               "return table.concat(t, ' ')")
    got = p.send(*EVAL(listing))
    walkit_names = set(got["walkit"].split(b"\r\n")[1].split())
    redis_names = set(got["redis"].split(b"\r\n")[1].split())
    assert redis_names - walkit_names == {b"bit:table", b"cjson:table", b"cmsgpack:table", b"struct:table"}
    assert walkit_names - redis_names == set()                    # the libraries walkit lacks, and nothing else
    for table in ("string", "math", "table", "coroutine"):
        p.same(EVAL(f"local t = {{}} for k in pairs({table}) do t[#t+1] = k end table.sort(t) return t"))


def test_numkeys(p):
    p.same(EVAL("return 1", numkeys=-1), EVAL("return 1", "a", numkeys=2), [b"EVAL", b"return 1", b"x"],
           [b"EVAL", b"return 1"], [b"EVAL"], [b"EVALSHA", b"abc"], [b"EVAL_RO", b"return 1"])


def test_script_load_exists_flush(p):
    body = "return redis.call('get', KEYS[1])"
    p.same([b"SET", b"k", b"v"], [b"SCRIPT", b"LOAD", body.encode()], [b"SCRIPT", b"LOAD", b"return ("],
           [b"SCRIPT", b"LOAD", b"#!lua flags=bad\nreturn 1"],
           [b"SCRIPT", b"EXISTS", sha(body), b"f" * 40, sha(body).upper()],
           [b"EVALSHA", sha(body), b"1", b"k"], [b"EVALSHA", sha(body).upper(), b"1", b"k"],
           [b"EVALSHA_RO", sha(body), b"1", b"k"],
           [b"SCRIPT", b"FLUSH", b"BAD"], [b"SCRIPT", b"FLUSH", b"SYNC", b"X"], [b"SCRIPT", b"FLUSH", b"ASYNC"],
           [b"SCRIPT", b"EXISTS", sha(body)], [b"EVALSHA", sha(body), b"1", b"k"],
           [b"SCRIPT", b"LOAD", body.encode()], [b"SCRIPT", b"FLUSH"], [b"SCRIPT", b"FLUSH", b"sync"],
           [b"SCRIPT", b"EXISTS", sha(body)], [b"SCRIPT", b"EXISTS"], [b"SCRIPT", b"LOAD"], [b"SCRIPT", b"NOPE"],
           [b"SCRIPT"], [b"SCRIPT", b"HELP"], [b"SCRIPT", b"help", b"x"], [b"SCRIPT", b"KILL"],
           [b"SCRIPT", b"KILL", b"x"], [b"SCRIPT", b"DEBUG", b"NO"], [b"SCRIPT", b"DEBUG"])


def test_eval_caches_its_body_for_evalsha(p):
    body = "return {KEYS[1], ARGV[1]}"
    broken = "return ("
    p.same([b"EVALSHA", sha(body), b"1", b"k", b"a"], EVAL(body, "k", "a", numkeys=1),
           [b"EVALSHA", sha(body), b"1", b"k", b"a"], [b"EVALSHA_RO", sha(body), b"1", b"k", b"a"],
           [b"SCRIPT", b"EXISTS", sha(body)], EVAL(broken), [b"SCRIPT", b"EXISTS", sha(broken)],
           [b"EVAL_RO", b"return 'ro'", b"0"], [b"SCRIPT", b"EXISTS", sha("return 'ro'")])


def test_evalsha_errors(p):
    p.same([b"EVALSHA", b"abc", b"0"], [b"EVALSHA", b"abc", b"x"], [b"EVALSHA", b"f" * 40, b"x"],
           [b"EVALSHA", b"f" * 40, b"0"], [b"EVALSHA", b"f" * 40, b"2", b"k"], [b"EVALSHA_RO", b"abc", b"x"],
           [b"EVALSHA_RO", b"f" * 40, b"0"], [b"EVALSHA_RO", b"f" * 40, b"-1"])


def test_read_only_scripts(p):
    p.same([b"SET", b"k", b"v"])
    p.same(*([b"EVAL_RO", *EVAL(body)[1:]] for body in [
        "return redis.call('get', 'k')", "return redis.call('set', 'k', 'v')", "return redis.pcall('set', 'k', 'v')",
        "return redis.call('del', 'k')", "#!lua\nreturn 1", "#!lua flags=no-writes\nreturn 1",
        "#!lua flags=no-writes\nreturn redis.call('set', 'k', 'v')", "return redis.call('nope')",
    ]))
    p.same(*(EVAL(body) for body in [
        "#!lua flags=no-writes\nreturn redis.call('set','k','v')",
        "#!lua flags=no-writes,allow-oom\nreturn redis.call('get','k')",
        "#!lua\nreturn 1", "#!lua flags=\nreturn 1", "#!lua\n\nerror('x')", "#!lua flags=bad\nreturn 1",
        "#!lua foo=bar\nreturn 1", "#!python\nreturn 1", "#!lua", "#!\nreturn 1", "#! lua\nreturn 1",
    ]))
    p.same([b"GET", b"k"])


def test_scripts_in_a_transaction(p):
    body = "return redis.call('incr', KEYS[1])"
    p.same([b"SCRIPT", b"LOAD", body.encode()], [b"MULTI"], EVAL(body, "n"), [b"EVALSHA", sha(body), b"1", b"n"],
           EVAL("return redis.call('nope')"), [b"EVAL_RO", b"return redis.call('get', 'n')", b"0"], [b"EXEC"],
           [b"GET", b"n"])


def test_resp3_clients_get_maps_sets_doubles_and_nulls(p):
    replies = p.send(b"HELLO", b"3")
    assert all(reply.startswith(b"%") for reply in replies.values()), replies
    p.same(*(EVAL(body) for body in [
        "return {map={a=1}}", "return {set={a=true}}", "return {double=3.5}", "return nil", "return false",
        "return {1, nil, 2}", "return redis.call('get', 'nothing')", "redis.setresp(3) return nil",
        "return {err='boom'}", "return {ok='fine'}",
    ]))


def test_a_resp3_boolean_from_a_script(p):
    """With redis.setresp(3), `return true` reaches a RESP3 client as RESP3's #t, false as #f."""
    p.send(b"HELLO", b"3")
    p.same(EVAL("redis.setresp(3) return true"), EVAL("redis.setresp(3) return false"), EVAL("return true"))


def test_scripts_inside_a_transaction_that_writes(p):
    sha = hashlib.sha1(b"return redis.call('GET', KEYS[1])").hexdigest().encode()
    p.same([b"SCRIPT", b"LOAD", b"return redis.call('GET', KEYS[1])"],
           [b"MULTI"], [b"SET", b"k", b"v"], [b"EVALSHA_RO", sha, b"1", b"k"],
           [b"EVAL", b"return redis.call('APPEND', KEYS[1], ARGV[1])", b"1", b"k", b"w"], [b"EVALSHA", sha, b"1", b"k"],
           [b"EXEC"])
