"""walkit.adapters.kv.commands is the command table of the RESP server: arity, kind and handler.

Each handler takes (server, connection, args) where args[0] is the command name:

- read commands return the reply, computed from the machine's state at the time they run (the
  server holds the machine's lock around them and decides when they may run: reads.py);
- write commands return the record to append (records.py) or raise ReplyError for bad
  arguments; the reply is what applying the record returns;
- other commands (PING, INFO, CONFIG, HELLO...) return the reply and change no data.

Errors follow Redis' wording, so clients map them to the same exceptions. On a server that
requires a password (auth.py) a connection that has not authenticated may send only the
NO_AUTH commands; connection.py answers every other one NOAUTH.
"""

from __future__ import annotations

import time
from typing import Callable, NamedTuple

from walkit.adapters.kv import info as reports
from walkit.adapters.kv.patterns import compile_pattern
from walkit.adapters.kv.records import GET, KEEPTTL, NX, XX, Delete, FlushDb, IncrBy, MSet, Set
from walkit.adapters.kv.resp import OK, PONG, ReplyError, Simple
from walkit.adapters.kv.state import INT64_MAX, NOT_AN_INTEGER, parse_int

READ, WRITE, OTHER = "read", "write", "other"
SYNTAX = "ERR syntax error"

#: The commands answered while the store loads (redis-server's "loading" flag): they concern the
#: connection or the server, not the data. Every other command gets LOADING; PING answers LOADING
#: also after the store loaded, until this server can tell a writer where to write
#: (KVServer.ping_error).
WHILE_LOADING = frozenset({b"AUTH", b"CLIENT", b"COMMAND", b"CONFIG", b"HELLO", b"INFO", b"PING", b"QUIT",
                           b"ROLE", b"SELECT", b"TIME"})
#: The commands a connection may send before it authenticated (redis-server's no-auth flag).
NO_AUTH = frozenset({b"AUTH", b"HELLO", b"QUIT"})
NOAUTH = "NOAUTH Authentication required."
WRONGPASS = "WRONGPASS invalid username-password pair or user is disabled."


class AuthFailed(ReplyError):
    """AuthFailed is the WRONGPASS answer to AUTH or HELLO AUTH; the connection sends it late (auth.py)."""

    def __init__(self) -> None:
        super().__init__(WRONGPASS)


class Command(NamedTuple):
    """Command is one entry of the table: `arity` counts the name (negative: at least that many)."""

    name: str
    arity: int
    kind: str
    handler: Callable


COMMANDS: dict[bytes, Command] = {}


def command(name: str, arity: int, kind: str):
    """command registers a handler under `name` (and returns it unchanged)."""
    def register(handler: Callable) -> Callable:
        """register adds the handler to COMMANDS."""
        COMMANDS[name.encode()] = Command(name.lower(), arity, kind, handler)
        return handler
    return register


def _integer(text: bytes) -> int:
    value = parse_int(text)
    if value is None:
        raise ReplyError(NOT_AN_INTEGER)
    return value


# -- reads -------------------------------------------------------------------------------
@command("GET", 2, READ)
def get(server, conn, args):
    """get answers GET key: the value, or nil if absent or expired."""
    return server.machine.state.get(args[1], server.now_ms())


@command("MGET", -2, READ)
def mget(server, conn, args):
    """mget answers MGET key...: the values, nil for absent keys."""
    state, now = server.machine.state, server.now_ms()
    return [state.get(key, now) for key in args[1:]]


@command("EXISTS", -2, READ)
def exists(server, conn, args):
    """exists answers EXISTS key...: how many of the keys exist (repeats count again)."""
    state, now = server.machine.state, server.now_ms()
    return sum(1 for key in args[1:] if state.alive(key, now))


@command("TTL", 2, READ)
def ttl(server, conn, args):
    """ttl answers TTL key: seconds left, -1 without expiry, -2 if absent."""
    left = server.machine.state.ttl_ms(args[1], server.now_ms())
    return left if left < 0 else (left + 500) // 1000


@command("PTTL", 2, READ)
def pttl(server, conn, args):
    """pttl answers PTTL key: milliseconds left, -1 without expiry, -2 if absent."""
    return server.machine.state.ttl_ms(args[1], server.now_ms())


@command("TYPE", 2, READ)
def type_(server, conn, args):
    """type_ answers TYPE key: string, or none if absent."""
    return Simple("string" if server.machine.state.alive(args[1], server.now_ms()) else "none")


@command("KEYS", 2, READ)
def keys(server, conn, args):
    """keys answers KEYS pattern: every live key matching a glob, in key order."""
    return server.machine.state.keys(args[1], server.now_ms())


@command("DBSIZE", 1, READ)
def dbsize(server, conn, args):
    """dbsize answers DBSIZE: the number of live keys."""
    return server.machine.state.size(server.now_ms())


@command("SCAN", -2, READ)
def scan(server, conn, args):
    """scan answers SCAN cursor [MATCH p] [COUNT n] [TYPE t]: the next cursor and some keys."""
    cursor = parse_int(args[1])
    if cursor is None or cursor < 0:
        raise ReplyError("ERR invalid cursor")
    pattern, count, only_strings = None, 10, True
    options = args[2:]
    for i in range(0, len(options), 2):
        if i + 1 >= len(options):
            raise ReplyError(SYNTAX)
        option, value = options[i].upper(), options[i + 1]
        if option == b"MATCH":
            pattern = None if value == b"*" else value
        elif option == b"COUNT":
            count = _integer(value)
            if count < 1:
                raise ReplyError(SYNTAX)
        elif option == b"TYPE":
            only_strings = value.lower() == b"string"
        else:
            raise ReplyError(SYNTAX)
    if cursor == 0:
        after = None
    else:
        after = server.cursors.pop(cursor, None)
        if after is None:
            return [b"0", []]                   # unknown or expired cursor: the iteration ends
    found, last = server.machine.state.scan(after, count, pattern, server.now_ms())
    if not only_strings:
        found = []
    return [b"%d" % (server.cursors.add(last) if last is not None else 0), found]


# -- writes ------------------------------------------------------------------------------
_EXPIRY_OPTIONS = {b"EX": 1000, b"PX": 1, b"EXAT": 1000, b"PXAT": 1}


@command("SET", -3, WRITE)
def set_(server, conn, args):
    """set_ turns SET key value [NX|XX] [GET] [EX s|PX ms|EXAT t|PXAT t|KEEPTTL] into a Set record."""
    flags, expire_at, expiry_seen = 0, 0, False
    i, n = 3, len(args)
    while i < n:
        option = args[i].upper()
        if option == b"NX" and not flags & XX:
            flags |= NX
        elif option == b"XX" and not flags & NX:
            flags |= XX
        elif option == b"GET":
            flags |= GET
        elif option == b"KEEPTTL" and not expiry_seen:
            flags |= KEEPTTL
            expiry_seen = True
        elif option in _EXPIRY_OPTIONS and not expiry_seen and i + 1 < n:
            amount = _integer(args[i + 1])
            scale = _EXPIRY_OPTIONS[option]
            absolute = option.endswith(b"AT")
            if amount <= 0 or amount > INT64_MAX // 1000:
                raise ReplyError("ERR invalid expire time in 'set' command")
            expire_at = amount * scale if absolute else server.now_ms() + amount * scale
            expiry_seen = True
            i += 1
        else:
            raise ReplyError(SYNTAX)
        i += 1
    return Set(args[1], args[2], expire_at, flags)


@command("MSET", -3, WRITE)
def mset(server, conn, args):
    """mset turns MSET key value [key value...] into an MSet record."""
    if len(args) % 2 == 0:
        raise ReplyError("ERR wrong number of arguments for 'mset' command")
    return MSet(tuple(args[1:]))


@command("DEL", -2, WRITE)
def delete(server, conn, args):
    """delete turns DEL key... (and UNLINK) into a Delete record."""
    return Delete(tuple(args[1:]))


COMMANDS[b"UNLINK"] = Command("unlink", -2, WRITE, delete)


@command("INCR", 2, WRITE)
def incr(server, conn, args):
    """incr turns INCR key into IncrBy(key, 1)."""
    return IncrBy(args[1], 1)


@command("DECR", 2, WRITE)
def decr(server, conn, args):
    """decr turns DECR key into IncrBy(key, -1)."""
    return IncrBy(args[1], -1)


@command("INCRBY", 3, WRITE)
def incrby(server, conn, args):
    """incrby turns INCRBY key n into IncrBy(key, n)."""
    return IncrBy(args[1], _integer(args[2]))


@command("DECRBY", 3, WRITE)
def decrby(server, conn, args):
    """decrby turns DECRBY key n into IncrBy(key, -n)."""
    delta = _integer(args[2])
    if delta == -(1 << 63):
        raise ReplyError("ERR decrement would overflow")
    return IncrBy(args[1], -delta)


@command("FLUSHDB", -1, WRITE)
def flushdb(server, conn, args):
    """flushdb turns FLUSHDB [ASYNC|SYNC] (and FLUSHALL) into a FlushDb record."""
    if len(args) > 2 or (len(args) == 2 and args[1].upper() not in (b"ASYNC", b"SYNC")):
        raise ReplyError(SYNTAX)
    return FlushDb()


COMMANDS[b"FLUSHALL"] = Command("flushall", -1, WRITE, flushdb)


# -- connection and server commands ------------------------------------------------------
@command("PING", -1, OTHER)
def ping(server, conn, args):
    """ping answers PING [message], or LOADING until a write can be placed (KVServer.ping_error)."""
    if len(args) > 2:
        raise ReplyError("ERR wrong number of arguments for 'ping' command")
    loading = server.ping_error()
    if loading is not None:
        raise loading
    return args[1] if len(args) == 2 else PONG


@command("ECHO", 2, OTHER)
def echo(server, conn, args):
    """echo answers ECHO message."""
    return args[1]


@command("TIME", 1, OTHER)
def time_(server, conn, args):
    """time_ answers TIME: seconds and microseconds."""
    now = time.time_ns() // 1000
    return [b"%d" % (now // 1_000_000), b"%d" % (now % 1_000_000)]


@command("SELECT", 2, OTHER)
def select(server, conn, args):
    """select answers SELECT db: only database 0 exists."""
    if _integer(args[1]) != 0:
        raise ReplyError("ERR DB index is out of range")
    return OK


@command("QUIT", -1, OTHER)
def quit_(server, conn, args):
    """quit_ answers QUIT: OK, then the connection closes."""
    conn.close_after_reply = True
    return OK


@command("INFO", -1, OTHER)
def info(server, conn, args):
    """info answers INFO [section...] (info.info_text)."""
    return reports.info_text(server, [a.decode("utf-8", "replace").lower() for a in args[1:]])


@command("ROLE", 1, OTHER)
def role(server, conn, args):
    """role answers ROLE (info.role_reply)."""
    return reports.role_reply(server)


def _client_name(name: bytes) -> bytes:
    if any(c <= 32 or c > 126 for c in name):
        raise ReplyError("ERR Client names cannot contain spaces, newlines or special characters.")
    return name


def _log_in(server, conn, name: bytes, password: bytes) -> None:
    """_log_in makes the connection user `name`, or raises AuthFailed (its state stays as it was)."""
    user = server.users.authenticate(name, password)
    if user is None:
        server.auth_failed(conn, name)
        raise AuthFailed()
    conn.logged_in(user)


@command("HELLO", -1, OTHER)
def hello(server, conn, args):
    """hello answers HELLO [2|3 [AUTH user pass] [SETNAME name]]: it may log in, and switches the protocol version.

    As redis-server: options are checked first, then the credentials; an unauthenticated
    connection without AUTH gets NOAUTH, and nothing changes unless all of it succeeds.
    """
    version, credentials, name = None, None, None
    if len(args) > 1:
        version = parse_int(args[1])
        if version not in (2, 3):
            raise ReplyError("NOPROTO unsupported protocol version")
        i = 2
        while i < len(args):
            option = args[i].upper()
            if option == b"AUTH" and i + 2 < len(args):
                credentials = args[i + 1], args[i + 2]
                i += 3
            elif option == b"SETNAME" and i + 1 < len(args):
                name = _client_name(args[i + 1])
                i += 2
            else:
                raise ReplyError(f"ERR Syntax error in HELLO option '{args[i][:64].decode('utf-8', 'replace')}'")
    if credentials is not None:
        _log_in(server, conn, *credentials)
    if conn.user is None:
        raise ReplyError("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO "
                         "<proto> AUTH <user> <pass> option can be used to authenticate the client and select the "
                         "RESP protocol version at the same time")
    if name is not None:
        conn.name = name
    if version is not None:
        conn.resp3 = version == 3
    return {"server": "redis", "version": reports.REDIS_VERSION, "proto": 3 if conn.resp3 else 2,
            "id": conn.id, "mode": "standalone", "role": "master" if server.is_leader else "replica",
            "modules": []}


@command("AUTH", -2, OTHER)
def auth(server, conn, args):
    """auth answers AUTH password (the default user) and AUTH user password, as redis-server 7 does."""
    if len(args) > 3:
        raise ReplyError(SYNTAX)
    if len(args) == 2:
        if server.users.default_nopass:
            raise ReplyError("ERR AUTH <password> called without any password configured for the default user. "
                             "Are you sure your configuration is correct?")
        _log_in(server, conn, b"default", args[1])
    else:
        _log_in(server, conn, args[1], args[2])
    return OK


@command("CLIENT", -2, OTHER)
def client(server, conn, args):
    """client answers CLIENT SETNAME, GETNAME, ID, SETINFO, INFO and LIST."""
    sub = args[1].upper()
    if sub == b"SETNAME" and len(args) == 3:
        conn.name = _client_name(args[2])
        return OK
    if sub == b"GETNAME" and len(args) == 2:
        return conn.name
    if sub == b"ID" and len(args) == 2:
        return conn.id
    if sub in (b"SETINFO", b"NO-EVICT", b"NO-TOUCH", b"REPLY"):
        return OK
    if sub in (b"INFO", b"LIST"):
        return conn.describe() if sub == b"INFO" else "".join(c.describe() for c in server.connections)
    raise ReplyError(f"ERR unknown subcommand '{args[1].decode('utf-8', 'replace')}'. Try CLIENT HELP.")


@command("CONFIG", -2, OTHER)
def config(server, conn, args):
    """config answers CONFIG GET pattern... (info.config_values); CONFIG SET is accepted and ignored,
    except for the settings of passwords and users, which are refused: ignoring them would leave
    the server open while the client believes it closed it."""
    sub = args[1].upper()
    if sub == b"GET" and len(args) >= 3:
        settings = reports.config_values(server)
        matchers = [compile_pattern(p.lower()).match for p in args[2:]]
        return {name: value for name, value in settings.items() if any(m(name.encode()) for m in matchers)}
    if sub == b"SET" and any(p.lower() in (b"requirepass", b"masterauth", b"masteruser", b"aclfile")
                             for p in args[2::2]):
        raise ReplyError("ERR walkit kv takes passwords and users only at start (walkit kv serve --requirepass, "
                         "--user, --acl-file)")
    if sub in (b"SET", b"RESETSTAT", b"REWRITE"):
        return OK
    raise ReplyError(f"ERR unknown subcommand '{args[1].decode('utf-8', 'replace')}'. Try CONFIG HELP.")


@command("COMMAND", -1, OTHER)
def command_(server, conn, args):
    """command_ answers COMMAND, COMMAND COUNT, INFO, LIST and DOCS (empty), enough for redis-cli."""
    if len(args) == 1:
        return [[name.lower(), spec.arity] for name, spec in sorted(COMMANDS.items())]
    sub = args[1].upper()
    if sub == b"COUNT":
        return len(COMMANDS)
    if sub == b"DOCS":
        return {}
    if sub == b"INFO":
        return [[name.lower(), COMMANDS[name.upper()].arity] if name.upper() in COMMANDS else None
                for name in args[2:]]
    if sub == b"LIST":
        return [name.lower() for name in sorted(COMMANDS)]
    raise ReplyError(f"ERR unknown subcommand '{args[1].decode('utf-8', 'replace')}'. Try COMMAND HELP.")


SESSION = b"SESSION"
#: The longest client name of a SESSION (walkit.replicate's limit on a session's client id).
MAX_SESSION_CLIENT = 256


@command("SESSION", -4, OTHER)
def session(server, conn, args):
    """session is ``SESSION <client> <seq> <write command> [args...]``; connection.py runs it (session_args)."""
    raise ReplyError("ERR SESSION is run by the connection")


def session_args(args: list[bytes]) -> tuple[str, int, list[bytes]]:
    """session_args checks ``SESSION <client> <seq> <command> ...`` and returns (client, seq, the command's args).

    `client` names the client (1 to 256 bytes of UTF-8) and `seq` numbers its writes from 1; a
    retry reuses the seq and is answered with the first reply without being applied again.
    """
    check_arity(COMMANDS[SESSION], args)
    try:
        client = args[1].decode("utf-8")
    except UnicodeDecodeError:
        raise ReplyError("ERR SESSION's client name is UTF-8 text") from None
    if not 1 <= len(args[1]) <= MAX_SESSION_CLIENT:
        raise ReplyError(f"ERR SESSION's client name is 1 to {MAX_SESSION_CLIENT} bytes")
    seq = parse_int(args[2])
    if seq is None or not 1 <= seq <= INT64_MAX:
        raise ReplyError("ERR SESSION's seq is an integer from 1 (a retry reuses its write's seq)")
    return client, seq, args[3:]


def check_arity(spec: Command, args: list[bytes]) -> None:
    """check_arity raises Redis' error for a wrong number of arguments."""
    n = len(args)
    if (spec.arity >= 0 and n != spec.arity) or (spec.arity < 0 and n < -spec.arity):
        raise ReplyError(f"ERR wrong number of arguments for '{spec.name}' command")


def unknown(args: list[bytes]) -> ReplyError:
    """unknown is Redis' error for an unknown command."""
    shown = " ".join(f"'{a[:64].decode('utf-8', 'replace')}'" for a in args[1:8])
    return ReplyError(f"ERR unknown command '{args[0][:64].decode('utf-8', 'replace')}', "
                      f"with args beginning with: {shown}")

