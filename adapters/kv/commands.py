"""walkit.adapters.kv.commands completes the command table (table.py): the connection and server commands.

Importing it registers every command: the data commands of keyspace.py, strings.py,
hashes.py, lists.py, sets.py, zsets.py and scripting.py, and the OTHER commands below, which
take (server, connection, args) and change no data. MULTI, EXEC, DISCARD, WATCH and UNWATCH
are run by the connection itself (connection.py), since they decide what happens to the
commands around them.

On a server that requires a password (auth.py) a connection that has not authenticated may
send only the NO_AUTH commands; connection.py answers every other one NOAUTH.
"""

from __future__ import annotations

import time

from walkit.adapters.kv import info as reports
from walkit.adapters.kv import hashes, keyspace, lists, scripting, sets, strings, zsets  # noqa: F401 - they register
from walkit.adapters.kv.patterns import compile_pattern
from walkit.adapters.kv.resp import OK, PONG, ReplyError
from walkit.adapters.kv.state import INT64_MAX, parse_int
from walkit.adapters.kv.table import (  # noqa: F401 - the connection's names
    COMMANDS, OTHER, READ, SYNTAX, WRITE, Command, check_arity, command, integer, unknown,
)

#: The commands answered while the store loads (redis-server's "loading" flag): they concern the
#: connection or the server, not the data. Every other command gets LOADING; PING answers LOADING
#: also after the store loaded, until this server can tell a writer where to write
#: (KVServer.ping_error).
WHILE_LOADING = frozenset({b"AUTH", b"CLIENT", b"COMMAND", b"CONFIG", b"HELLO", b"INFO", b"PING", b"QUIT",
                           b"ROLE", b"SELECT", b"TIME", b"MULTI", b"DISCARD", b"UNWATCH", b"SCRIPT"})
#: The commands a connection may send before it authenticated (redis-server's no-auth flag).
NO_AUTH = frozenset({b"AUTH", b"HELLO", b"QUIT"})
NOAUTH = "NOAUTH Authentication required."
WRONGPASS = "WRONGPASS invalid username-password pair or user is disabled."


class AuthFailed(ReplyError):
    """AuthFailed is the WRONGPASS answer to AUTH or HELLO AUTH; the connection sends it late (auth.py)."""

    def __init__(self) -> None:
        super().__init__(WRONGPASS)





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
    if integer(args[1]) != 0:
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
    """client answers CLIENT SETNAME, GETNAME, ID, SETINFO, INFO, LIST and REPLY ON|OFF|SKIP."""
    sub = args[1].upper()
    if sub == b"SETNAME" and len(args) == 3:
        conn.name = _client_name(args[2])
        return OK
    if sub == b"GETNAME" and len(args) == 2:
        return conn.name
    if sub == b"ID" and len(args) == 2:
        return conn.id
    if sub == b"REPLY" and len(args) == 3 and args[2].upper() in (b"ON", b"OFF", b"SKIP"):
        conn.reply_mode(args[2].upper())
        return OK                               # sent only for ON: the connection drops it otherwise
    if sub in (b"SETINFO", b"NO-EVICT", b"NO-TOUCH"):
        return OK
    if sub in (b"INFO", b"LIST"):
        return conn.describe() if sub == b"INFO" else "".join(c.describe() for c in server.connections)
    raise ReplyError(f"ERR unknown subcommand '{args[1].decode('utf-8', 'replace')}'. Try CLIENT HELP.")


@command("CONFIG", -2, OTHER)
def config(server, conn, args):
    """config answers CONFIG GET pattern... (info.config_values), RESETSTAT and REWRITE.

    CONFIG SET changes nothing at run time: setting a parameter to the value CONFIG GET reports
    is answered OK (it is already so); anything else is an error that says so, never a silent
    OK, so a client that believes it changed a setting (a password, a memory limit) learns it
    did not."""
    sub = args[1].upper()
    if sub == b"GET" and len(args) >= 3:
        settings = reports.config_values(server)
        matchers = [compile_pattern(p.lower()).match for p in args[2:]]
        return {name: value for name, value in settings.items() if any(m(name.encode()) for m in matchers)}
    if sub == b"SET":
        if len(args) < 4 or len(args) % 2:
            raise ReplyError("ERR wrong number of arguments for 'config|set' command")
        settings = reports.config_values(server)
        for name, value in zip(args[2::2], args[3::2]):
            text = name.decode("utf-8", "replace").lower()
            if text in ("requirepass", "masterauth", "masteruser", "aclfile"):
                raise ReplyError("ERR walkit kv takes passwords and users only at start (walkit kv serve "
                                 "--requirepass, --user, --acl-file)")
            if text not in settings:
                raise ReplyError(f"ERR Unknown option or number of arguments for CONFIG SET - '{text}'")
            if settings[text].encode() != value:
                raise ReplyError(f"ERR walkit kv does not change '{text}' at run time (it is "
                                 f"'{settings[text]}'; CONFIG SET changes nothing)")
        return OK
    if sub in (b"RESETSTAT", b"REWRITE") and len(args) == 2:
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


@command("MULTI", 1, OTHER)
@command("EXEC", 1, OTHER)
@command("DISCARD", 1, OTHER)
@command("WATCH", -2, OTHER)
def transaction(server, conn, args):
    """transaction names MULTI, EXEC, DISCARD and WATCH in the table; connection.py runs them."""
    raise ReplyError("ERR transactions are run by the connection")


@command("UNWATCH", 1, READ)
def unwatch(ctx, args):
    """unwatch is UNWATCH inside a transaction (OK); outside, connection.py forgets the watches."""
    return OK


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
