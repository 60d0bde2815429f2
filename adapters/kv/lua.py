"""walkit.adapters.kv.lua is the Lua 5.1 interpreter scripts run in, made deterministic (scripting.py has the commands).

Determinism (every node must compute the same writes and the same reply):

- scripts see what redis 7.0 gives them (base, string, table, math, coroutine, redis), and
  nothing of the machine: no os, io, print, require, loadfile, dofile, debug, setfenv;
  precompiled chunks are not loaded (loadstring parses them as text and fails, as Redis' Lua
  does), so only source the script itself holds runs;
- math.random is redis' own generator (rand.c, lrand48) seeded, for each script, from the
  record (ctx.random); math.randomseed(n) then gives exactly Redis' sequence for n;
- TIME inside a script answers the record's stamp (ctx.now), not the node's clock;
- a script may not create globals ("Attempt to modify a readonly table", as redis 7.0), and
  whatever else it changes in the shared tables (string.x = 1, KEYS = t) is undone after it
  ran, so one script never sees another's leftovers and a node that restarted (a fresh
  interpreter) runs the next script exactly as one that ran every script before;
- a script that does not end is stopped after MAX_SCRIPT_INSTRUCTIONS Lua instructions
  (counted per node, so every node stops it at the same point; Redis instead answers BUSY
  to other clients until SCRIPT KILL): a script runs under the machine's lock, on every node.

Not deterministic, so a script must not let its writes depend on them (Redis replicates a
script's effects, walkit the script): tostring() of a table or function (an address),
pairs() order over a table whose keys are tables or functions, collectgarbage("count") and
gcinfo(), weak tables. Lua's memory is capped at LUA_MEMORY bytes: a script that needs more
fails ("not enough memory") instead of taking the node down, and where exactly a script
close to the cap fails may differ between nodes.

Differences from redis-server 7.0.15 (the compat tests compare against it byte for byte):

- no cjson, cmsgpack, struct or bit library;
- tables other than the globals are not read-only: `string.x = 1` or `redis.call = f`
  succeed within the script (Redis: "Attempt to modify a readonly table") and are undone
  after it; assigning an existing global (`KEYS = {}`) is allowed the same way;
- from a script, PING, ECHO, SELECT 0 and TIME run, and every other command that is not a
  data command (INFO, COMMAND, ROLE...) is "not allowed from script";
- with redis.setresp(3), big numbers and verbatim strings reach a RESP3 client as bulk strings;
- a reply nested deeper than MAX_REPLY_DEPTH ends in "reached lua stack limit" there
  (Redis: about 8000 levels); error({}) answers "ERR unknown error" (redis-server 7.0.15 crashes);
- pcall, xpcall, coroutine.create, .wrap and .resume, loadstring, load, rawset and setmetatable
  are Lua functions here (redis' are C), so when one of them raises its own error (a bad
  argument, a read-only table) from `return f(...)`, Lua's tail call has dropped the script's
  frame and the error names no line;
- EVAL is always a write, so a follower answers it READONLY even for a script that only reads
  (a Redis replica runs it): reads use EVAL_RO or EVALSHA_RO;
- SCRIPT DEBUG YES|SYNC is refused (no Lua debugger); SCRIPT KILL answers NOTBUSY;
- EVALSHA of an unknown sha inside MULTI is refused when queued, so EXEC answers EXECABORT
  (Redis queues it and fails that one command); EVALSHA_RO is queued as EVAL_RO with its body.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import math
import pathlib
import threading
from typing import NamedTuple

from walkit.adapters.kv.execute import run
from walkit.adapters.kv.info import REDIS_VERSION
from walkit.adapters.kv.resp import (
    NIL_ARRAY, OK, Double, ProtocolError, ReplyError, SetReply, Simple, format_double, split_inline,
)
from walkit.adapters.kv.state import INT64_MAX, INT64_MIN
from walkit.adapters.kv.table import COMMANDS, OTHER, WRITE, integer

try:
    import lupa.lua51 as lupa
except ImportError as exc:  # pragma: no cover - lupa is a dependency of the KV adapter
    raise ImportError("walkit's KV adapter runs Lua scripts with lupa: pip install 'lupa>=2.0'") from exc

log = logging.getLogger("walkit.adapters.kv")

#: A script is stopped after this many Lua instructions (see the module doc), about 2 s of Lua.
MAX_SCRIPT_INSTRUCTIONS = 500_000_000
#: The instruction count is checked every this many instructions.
HOOK_EVERY = 10_000
#: The most memory one Lua interpreter may hold.
LUA_MEMORY = 512 * 1024 * 1024
#: Compiled scripts kept per interpreter (their bodies travel in the records; this is only a cache).
COMPILED_SCRIPTS = 1000
#: A script's reply nested deeper than this ends in an error there.
MAX_REPLY_DEPTH = 200

NOSCRIPT = "NOSCRIPT No matching script. Please use EVAL."
WRITE_FLAG_RO = "ERR Can not execute a script with write flag using *_ro command."
SHEBANG_FLAGS = frozenset({b"no-writes", b"allow-oom", b"allow-stale", b"no-cluster", b"allow-cross-slot-keys"})
#: Commands a script may not call, besides the connection and server commands (OTHER); with the
#: arity of those that are not in the command table.
NOT_IN_SCRIPTS = {b"EVAL": -3, b"EVALSHA": -3, b"EVAL_RO": -3, b"EVALSHA_RO": -3,
                  b"MULTI": 1, b"EXEC": 1, b"DISCARD": 1, b"WATCH": -2, b"UNWATCH": 1}
LOG_LEVELS = (logging.DEBUG, logging.INFO, logging.INFO, logging.WARNING)
REDIS_VERSION_NUM = sum(int(part) << shift for part, shift in zip(REDIS_VERSION.split("."), (16, 8, 0)))


def sha1hex(body: bytes) -> bytes:
    """sha1hex is the name of a script: the SHA1 of its body, in lower-case hex."""
    return hashlib.sha1(body).hexdigest().encode()


def error_line(buffer: bytes) -> bytes:
    """error_line is the `err` of a Redis error table made from "-CODE message" or a bare message (luaPushErrorBuff)."""
    if buffer.startswith(b"-"):
        code, space, message = buffer[1:].partition(b" ")
        if not space:
            code, message = b"ERR", buffer[1:]
    else:
        code, message = b"ERR", buffer
    return code + b" " + message.strip(b"\r\n")


def lua_integer(number) -> int:
    """lua_integer is a Lua number as a Redis integer reply: truncated, INT64_MIN out of range (C's cast, x86)."""
    if type(number) is int:
        return number if INT64_MIN <= number <= INT64_MAX else INT64_MIN
    if number != number or not -9.223372036854775808e18 <= number < 9.223372036854775808e18:
        return INT64_MIN
    return int(number)


def argument_text(number) -> bytes:
    """argument_text is a Lua number passed to redis.call, as Redis writes it (%.17g)."""
    if number != number:
        return b"-nan" if math.copysign(1.0, number) < 0 else b"nan"
    return b"%.17g" % number


def _c_int(number) -> int:
    """_c_int is luaL_checkint's value of a Lua number: truncated to 64 bits, then to a C int."""
    if number != number or not -9.223372036854775808e18 <= number < 9.223372036854775808e18:
        wide = INT64_MIN
    else:
        wide = int(number)
    return ((wide + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)


def text_of(data: bytes) -> str:
    """text_of is bytes as text for an error message (undecodable bytes replaced)."""
    return data.decode("utf-8", "replace")


class Rand48:
    """Rand48 is redis' math.random generator (rand.c): the lrand48 recurrence, 48 bits."""

    __slots__ = ("x",)

    def __init__(self, seed: int) -> None:
        self.seed(seed)

    def seed(self, value: int) -> None:
        """seed restarts the sequence as redisSrand48(value) does."""
        self.x = ((value & 0xFFFFFFFF) << 16) | 0x330E

    def next(self) -> float:
        """next is the next number in [0, 1), as redis' math.random computes it."""
        self.x = (self.x * 0x5DEECE66D + 0xB) & 0xFFFFFFFFFFFF
        return ((self.x >> 17) % 2147483647) / 2147483647


class Script(NamedTuple):
    """Script is a body as Lua compiles it, and its shebang's flags (None without one: redis' eval compat mode)."""

    sha: bytes                          # of the whole body
    source: bytes                       # the body without its shebang line (its line end kept: lines keep numbers)
    flags: frozenset | None

    @property
    def writes(self) -> bool:
        """writes tells whether the script declared it may write (a shebang without no-writes)."""
        return self.flags is not None and b"no-writes" not in self.flags


def parse_script(body: bytes) -> Script:
    """parse_script reads a body's `#!lua flags=...` line, or raises Redis' error for a bad one."""
    sha = sha1hex(body)
    if not body.startswith(b"#!"):
        return Script(sha, body, None)
    end = body.find(b"\n")
    if end < 0:
        raise ReplyError("ERR Invalid script shebang")
    try:
        parts = split_inline(body[:end])
    except ProtocolError:
        parts = []
    if not parts:
        raise ReplyError("ERR Invalid engine in script shebang")
    if parts[0] != b"#!lua":
        raise ReplyError(f"ERR Unexpected engine in script shebang: {text_of(parts[0])}")
    flags = set()
    for part in parts[1:]:
        if not part.startswith(b"flags="):
            raise ReplyError(f"ERR Unknown lua shebang option: {text_of(part)}")
        for flag in part[6:].split(b",") if len(part) > 6 else ():
            if flag not in SHEBANG_FLAGS:
                raise ReplyError(f"ERR Unexpected flag in script shebang: {text_of(flag)}")
            flags.add(flag)
    return Script(sha, body[end:], frozenset(flags))


def split_keys(args) -> tuple[list[bytes], list[bytes]]:
    """split_keys reads EVAL's `numkeys key... arg...` (args[2:]): (keys, args), or Redis' error."""
    numkeys = integer(args[2])
    if numkeys > len(args) - 3:
        raise ReplyError("ERR Number of keys can't be greater than number of args")
    if numkeys < 0:
        raise ReplyError("ERR Number of keys can't be negative")
    return list(args[3:3 + numkeys]), list(args[3 + numkeys:])


class ErrorTable(NamedTuple):
    """ErrorTable is a Redis error table as Python data: {err = message}, marked when a command raised it."""

    message: bytes
    from_command: bool = False


class ScriptError(Exception):
    """ScriptError raises a Lua error from a Python function scripts call (the bridge).

    `value` is the error as Python data (bytes, or an ErrorTable), made a Lua value only when Lua
    asks for it (Interpreter._unwrap), and the bridge raises it without a traceback. So the error
    never holds a Lua object: lupa ties an object made during a call from a coroutine to that
    coroutine's state and keeps the last error past the call, and releasing such an object after
    Lua collected the coroutine wrote into freed memory (lupa GH#84; it crashed a test worker).
    """

    def __init__(self, value: bytes | ErrorTable) -> None:
        super().__init__(value)
        self.value = value


#: The scripts' environment (environment.lua), run once in each interpreter: every function a
#: script calls is a Lua builtin or a Python function made a C function, as redis' own are.
ENVIRONMENT = (pathlib.Path(__file__).parent / "environment.lua").read_bytes()


class Interpreter:
    """Interpreter is one Lua 5.1 runtime with redis' scripting API (one per KVMachine: machine.scripts).

    `run` is called under the machine's lock, so one script runs at a time. `loaded` is this
    server's script cache (SCRIPT LOAD and the EVALs it received): KVServer.scripts, once the
    server touched scripts (`attach`).
    """

    def __init__(self) -> None:
        self.lua = lupa.LuaRuntime(encoding=None, register_eval=False, register_builtins=False,
                                   unpack_returned_tuples=True, attribute_filter=_no_attributes,
                                   max_memory=LUA_MEMORY)
        self.loaded: dict[bytes, bytes] = {}
        self._compiled: collections.OrderedDict[bytes, object] = collections.OrderedDict()
        self._ctx = None
        self._read_only = True
        self._resp = 2
        self._rand = Rand48(0)
        lua_globals = self.lua.globals()
        self._loadstring = lua_globals.loadstring
        self._getinfo = lua_globals.debug.getinfo
        self._tonumber = lua_globals.tonumber
        self._table = self.lua.table_from
        setup = self._loadstring(ENVIRONMENT, b"=walkit")
        if type(setup) is tuple:
            raise RuntimeError(f"walkit's Lua environment does not compile: {setup[1]!r}")
        self._execute, self._shape, self._error_parts = setup(
            self._bridge(self._call, protected=False), self._bridge(self._call, protected=True),
            self._bridge(self._error_reply), self._bridge(self._status_reply), self._bridge(self._sha1hex),
            self._bridge(self._log), self._bridge(self._setresp), self._bridge(self._set_repl),
            self._bridge(self._acl_check_cmd), self._bridge(self._random), self._bridge(self._randomseed),
            self._unwrap, REDIS_VERSION.encode(), REDIS_VERSION_NUM, HOOK_EVERY, LUA_MEMORY / 4 / 1024)

    # -- running ------------------------------------------------------------------------------
    def function(self, script: Script):
        """function is the compiled `script` (compiled once), or Redis' compile error is raised."""
        compiled = self._compiled.get(script.sha)
        if compiled is not None:
            self._compiled.move_to_end(script.sha)
            return compiled
        result = self._loadstring(script.source, b"@user_script")
        if type(result) is tuple:
            raise ReplyError("ERR Error compiling script (new function): " + text_of(result[1]))
        self._compiled[script.sha] = result
        while len(self._compiled) > COMPILED_SCRIPTS:
            self._compiled.popitem(last=False)
        return result

    def run(self, ctx, script: Script, keys: list[bytes], argv: list[bytes], read_only: bool):
        """run executes `script` in `ctx` with KEYS and ARGV, and returns its reply (an error as a ReplyError)."""
        function = self.function(script)
        self._ctx, self._read_only, self._resp = ctx, read_only, 2
        self._rand = Rand48(ctx.random.getrandbits(32))
        try:
            exhausted, ok, value = self._execute(function, self._table(keys), self._table(argv),
                                                 MAX_SCRIPT_INSTRUCTIONS // HOOK_EVERY)
        finally:
            self._ctx = None
        if exhausted:
            return ReplyError(f"ERR Script {text_of(script.sha)} ran more than {MAX_SCRIPT_INSTRUCTIONS} Lua "
                              f"instructions and was stopped (every node stops it at the same point; what it "
                              f"wrote before stays)")
        return self._reply(value) if ok else self._raised(script.sha, value)

    # -- the bridge: Python functions scripts call --------------------------------------------
    def _bridge(self, method, **options):
        """_bridge is `method` for Lua: a Python error that is not a ScriptError is a bug, logged and reported."""
        def bridged(*args):
            try:
                return method(*args, **options)
            except ScriptError as exc:
                error = exc
            except Exception as exc:  # noqa: BLE001 - a bug must fail the script, not the node
                log.exception("walkit kv: the script bridge failed")
                error = ScriptError(ErrorTable(b"ERR internal error in a script call: %s" % type(exc).__name__.encode()))
            del args                    # the arguments may be Lua objects: no frame the error keeps holds them
            error.__context__ = error.__cause__ = None
            raise error.with_traceback(None)
        return bridged

    def _unwrap(self, error):
        """_unwrap is the Lua error value a ScriptError stands for (other values are returned as they are)."""
        return self._lua_value(error.value) if isinstance(error, ScriptError) else error

    def _lua_value(self, value):
        """_lua_value is an error's value as Lua sees it: an ErrorTable becomes a table, made now."""
        return self._error(value.message, from_command=value.from_command) if type(value) is ErrorTable else value

    def _error(self, message: bytes, *, from_command: bool = False):
        """_error is a Redis error table; a command's own error is marked as redis marks it."""
        fields = {b"err": message}
        if from_command:
            fields[b"ignore_error_stats_update"] = True
        return self._table(fields)

    def _fail(self, message: bytes) -> ScriptError:
        """_fail is the error redis raises with luaPushError(message) (an ERR unless it has a code)."""
        return ScriptError(ErrorTable(error_line(message)))

    def _call(self, *args, protected: bool):
        """_call runs redis.call (raises a command's error) or redis.pcall (returns it)."""
        try:
            reply = self._command(args)
        except ScriptError as exc:
            if protected:
                return self._lua_value(exc.value)
            raise
        if isinstance(reply, ReplyError):
            error = ErrorTable(error_line(b"-" + reply.message.encode("utf-8", "replace")), from_command=True)
            if protected:
                return self._lua_value(error)
            raise ScriptError(error)
        return self._to_lua(reply)

    def _arguments(self, args) -> list[bytes]:
        """_arguments are redis.call's arguments as a command's: strings, and numbers written %.17g."""
        argv = []
        for arg in args:
            kind = type(arg)
            if kind is bytes:
                argv.append(arg)
            elif kind is int or kind is float:
                argv.append(argument_text(arg))
            else:
                raise self._fail(b"Lua redis lib command arguments must be strings or integers")
        return argv

    def _command(self, args):
        """_command runs one command for a script, checked as redis' scriptCall checks it; its reply."""
        if not args:
            raise self._fail(b"Please specify at least one argument for this redis lib call")
        argv = self._arguments(args)
        name = argv[0].upper()
        spec = COMMANDS.get(name)
        arity = NOT_IN_SCRIPTS.get(name, spec.arity if spec is not None else None)
        if arity is None:
            raise self._fail(b"Unknown Redis command called from script")
        if (arity > 0 and arity != len(argv)) or len(argv) < -arity:
            raise self._fail(b"Wrong number of args calling Redis command from script")
        emulated = IN_SCRIPTS.get(name)
        if name in NOT_IN_SCRIPTS or (spec.kind is OTHER and emulated is None):
            raise self._fail(b"This Redis command is not allowed from script")
        if spec.kind is WRITE and self._read_only:
            raise self._fail(b"Write commands are not allowed from read-only scripts.")
        if emulated is not None:
            try:
                return emulated(self._ctx, argv)
            except ReplyError as exc:
                return exc
        return run(self._ctx, argv)

    def _acl_check_cmd(self, *args):
        """_acl_check_cmd runs redis.acl_check_cmd: true for a known command (scripts run with every right)."""
        if not args:
            raise self._fail(b"Please specify at least one argument for this redis lib call")
        name = self._arguments(args)[0].upper()
        if name not in COMMANDS and name not in NOT_IN_SCRIPTS:
            raise self._fail(b"Invalid command passed to redis.acl_check_cmd()")
        return True

    def _status_reply(self, *args):
        """_status_reply runs redis.status_reply(text): {ok = text}."""
        if len(args) != 1 or type(args[0]) is not bytes:
            return self._error(b"ERR wrong number or type of arguments")
        return self._table({b"ok": args[0]})

    def _error_reply(self, *args):
        """_error_reply runs redis.error_reply(text): {err = text}, with ERR unless text has a code."""
        if len(args) != 1 or type(args[0]) is not bytes:
            return self._error(b"ERR wrong number or type of arguments")
        text = args[0]
        return self._error(error_line(text if text.startswith(b"-") else b"-" + text))

    def _lua_text(self, value) -> bytes | None:
        """_lua_text is lua_tolstring's string of a value: strings, and numbers as Lua writes them (%.14g)."""
        kind = type(value)
        if kind is bytes:
            return value
        if kind is int or kind is float:
            return b"-nan" if value != value and math.copysign(1.0, value) < 0 else b"%.14g" % value
        return None

    def _number(self, value):
        """_number is lua_tonumber's number of a value (numeric strings included), or None."""
        kind = type(value)
        if kind is int or kind is float:
            return value
        return self._tonumber(value) if kind is bytes else None

    def _sha1hex(self, *args):
        """_sha1hex runs redis.sha1hex(text)."""
        if len(args) != 1:
            raise self._fail(b"wrong number of arguments")
        return sha1hex(self._lua_text(args[0]) or b"")

    def _log(self, *args):
        """_log runs redis.log(level, message...): to the Python log, on every node that runs the script."""
        if len(args) < 2:
            raise self._fail(b"redis.log() requires two arguments or more.")
        level = self._number(args[0])
        if level is None:
            raise self._fail(b"First argument must be a number (log level).")
        level = lua_integer(level)
        if not 0 <= level < len(LOG_LEVELS):
            raise self._fail(b"Invalid debug level.")
        text = b" ".join(part for part in map(self._lua_text, args[1:]) if part is not None)
        log.log(LOG_LEVELS[level], "walkit kv script: %s", text_of(text))

    def _setresp(self, *args):
        """_setresp runs redis.setresp(2|3): the protocol of the replies redis.call gives the script."""
        if len(args) != 1:
            raise self._fail(b"redis.setresp() requires one argument.")
        version = lua_integer(self._number(args[0]) or 0)
        if version not in (2, 3):
            raise self._fail(b"RESP version must be 2 or 3.")
        self._resp = version

    def _set_repl(self, *args):
        """_set_repl runs redis.set_repl(flags): checked, then nothing (a script's record is what replicates)."""
        if len(args) != 1:
            raise self._fail(b"redis.set_repl() requires two arguments.")
        if lua_integer(self._number(args[0]) or 0) & ~3:
            raise self._fail(b"Invalid replication flags. Use REPL_AOF, REPL_REPLICA, REPL_ALL or REPL_NONE.")

    def _where(self) -> bytes:
        """_where is the position of the script's line that called a bridge function ("user_script:3: ")."""
        info = self._getinfo(2, b"Sl")
        if info is None or info[b"currentline"] <= 0:
            return b""
        return b"%s:%d: " % (info[b"short_src"], info[b"currentline"])

    def _checkint(self, function: bytes, args, i: int) -> int:
        """_checkint is luaL_checkint(i) of a library function's arguments (numbered from 0)."""
        number = self._number(args[i]) if i < len(args) else None
        if number is None:
            got = b"no value" if i >= len(args) else _type_name(args[i])
            raise ScriptError(self._where() + b"bad argument #%d to '%s' (number expected, got %s)"
                              % (i + 1, function, got))
        return _c_int(number)

    def _random(self, *args):
        """_random runs math.random([m [, n]]) on the script's generator (redis_math_random)."""
        r = self._rand.next()
        if not args:
            return r
        if len(args) == 1:
            upper = self._checkint(b"random", args, 0)
            if upper < 1:
                raise ScriptError(self._where() + b"bad argument #1 to 'random' (interval is empty)")
            return math.floor(r * upper) + 1
        if len(args) == 2:
            lower, upper = self._checkint(b"random", args, 0), self._checkint(b"random", args, 1)
            if lower > upper:
                raise ScriptError(self._where() + b"bad argument #2 to 'random' (interval is empty)")
            return math.floor(r * (upper - lower + 1)) + lower
        raise ScriptError(self._where() + b"wrong number of arguments")

    def _randomseed(self, *args):
        """_randomseed runs math.randomseed(n): the script's generator restarts as Redis' would."""
        self._rand.seed(self._checkint(b"randomseed", args, 0))

    # -- replies ------------------------------------------------------------------------------
    def _to_lua(self, value):
        """_to_lua is a command's reply as the script sees it, in the protocol it chose (redis.setresp)."""
        kind = type(value)
        if kind is bytes or kind is int:
            return value
        resp3 = self._resp == 3
        if value is None or value is NIL_ARRAY:
            return None if resp3 else False
        if kind is Simple:
            return self._table({b"ok": value.encode()})
        if isinstance(value, ReplyError):
            return self._error(error_line(b"-" + value.message.encode("utf-8", "replace")), from_command=True)
        if kind is str:
            return value.encode()
        if kind is bool:
            return value if resp3 else int(value)
        if kind is Double:
            return self._table({b"double": float(value)}) if resp3 else format_double(value)
        if kind is SetReply and resp3:
            return self._table({b"set": self._table({self._to_lua(member): True for member in value})})
        if kind is dict:
            if resp3:
                return self._table({b"map": self._table({self._to_lua(k): self._to_lua(v) for k, v in value.items()})})
            return self._table([self._to_lua(part) for pair in value.items() for part in pair])
        if kind in (list, tuple, SetReply):
            return self._table([self._to_lua(item) for item in value])
        if kind is bytearray or kind is memoryview:
            return bytes(value)
        raise TypeError(f"a {kind.__name__} reply has no Lua form")

    def _reply(self, value, depth: int = 0):
        """_reply is a script's value as a reply (luaReplyToRedisReply)."""
        kind = type(value)
        if kind is bytes:
            return value
        if kind is int or kind is float:
            return lua_integer(value)
        if kind is bool:
            if self._resp == 3:
                return value
            return 1 if value else None
        if value is None or lupa.lua_type(value) != "table":
            return None                         # nil, and functions, coroutines, userdata
        if depth >= MAX_REPLY_DEPTH:
            return ReplyError("ERR reached lua stack limit")
        shape = self._shape(value)
        kind = shape[0]
        if kind == b"err":
            return ReplyError(text_of(shape[1].rstrip(b"\r\n")))
        if kind == b"ok":
            return Simple(text_of(shape[1]).replace("\r", " ").replace("\n", " "))
        if kind == b"double":
            return Double(shape[1])
        if kind == b"text":
            return shape[1]
        items, n = shape[1], shape[2]
        if kind == b"map":
            return {_hashable(self._reply(items[i], depth + 1)): self._reply(items[i + 1], depth + 1)
                    for i in range(1, n, 2)}
        if kind == b"set":
            return SetReply(self._reply(items[i], depth + 1) for i in range(1, n + 1))
        return [self._reply(items[i], depth + 1) for i in range(1, n + 1)]

    def _raised(self, sha: bytes, error) -> ReplyError:
        """_raised is the reply to a script that raised `error` (luaCallFunction's message)."""
        if lupa.lua_type(error) != "table":
            reason = error if type(error) is bytes else b"execution failure"
            return ReplyError(f"ERR Error running script {text_of(sha)}, {text_of(reason[:100])}")
        message, source, line = self._error_parts(error)
        text = message if message is not None else b"ERR unknown error"
        if source is not None and line is not None:
            text += b" script: %s, on %s:%s." % (sha, source, line)
        return ReplyError(text_of(text))


def _no_attributes(obj, name, is_setting):
    """_no_attributes refuses scripts every attribute of a Python object (lupa's attribute_filter)."""
    raise AttributeError("scripts see no Python attributes")


def _type_name(value) -> bytes:
    """_type_name is Lua's name of a value's type."""
    if value is None:
        return b"nil"
    kind = type(value)
    if kind is bool:
        return b"boolean"
    if kind is bytes:
        return b"string"
    if kind is int or kind is float:
        return b"number"
    return (lupa.lua_type(value) or "userdata").encode()


def _hashable(value):
    """_hashable is a map key usable in a dict (an array becomes a tuple, which RESP writes alike)."""
    if type(value) is list:
        return tuple(map(_hashable, value))
    if type(value) is dict:
        return tuple((k, _hashable(v)) for k, v in value.items())
    if type(value) is SetReply:
        return tuple(map(_hashable, value))
    return value


# -- commands scripts run here rather than through the command table ----------------------------------
def _time(ctx, argv):
    """_time answers TIME in a script: the record's stamp, so every node answers alike."""
    return [b"%d" % (ctx.now // 1000), b"%d" % (ctx.now % 1000 * 1000)]


def _ping(ctx, argv):
    """_ping answers PING [message] in a script."""
    if len(argv) > 2:
        raise ReplyError("ERR wrong number of arguments for 'ping' command")
    return argv[1] if len(argv) == 2 else Simple("PONG")


def _select(ctx, argv):
    """_select answers SELECT db in a script: only database 0 exists."""
    if integer(argv[1]) != 0:
        raise ReplyError("ERR DB index is out of range")
    return OK


def _echo(ctx, argv):
    """_echo answers ECHO message in a script."""
    return argv[1]


IN_SCRIPTS = {b"TIME": _time, b"PING": _ping, b"ECHO": _echo, b"SELECT": _select}

_creating = threading.Lock()


def interpreter(machine) -> Interpreter:
    """interpreter is the machine's Lua interpreter (machine.scripts), made on first use."""
    found = machine.scripts
    if found is None:
        with _creating:
            if machine.scripts is None:
                machine.scripts = Interpreter()
            found = machine.scripts
    return found


def attach(server) -> dict[bytes, bytes]:
    """attach makes server.scripts the cache where the server's interpreter finds EVALSHA_RO's bodies; it returns it."""
    found = interpreter(server.machine)
    if found.loaded is not server.scripts:
        server.scripts.update(found.loaded)
        found.loaded = server.scripts
    return server.scripts


_checker: object = None
_checking = threading.Lock()


def check_compiles(script: Script) -> None:
    """check_compiles raises EVAL's error for a body that does not compile (in a Lua kept for checking)."""
    global _checker
    with _checking:
        if _checker is None:
            _checker = lupa.LuaRuntime(encoding=None, register_eval=False, register_builtins=False,
                                       attribute_filter=_no_attributes, max_memory=LUA_MEMORY).globals().loadstring
        result = _checker(script.source, b"@user_script")
    if type(result) is tuple:
        raise ReplyError("ERR Error compiling script (new function): " + text_of(result[1]))
