"""walkit.adapters.kv.table is the command table of the RESP server and what a data command sees.

Every command is registered with `@command(name, arity, kind)`:

- READ and WRITE commands are data commands: `handler(ctx, args)` with a Context (the state and
  the time) and args[0] the command name. A read runs on the server that received it, at its
  clock (reads.py decides when); a write is not run where it arrives: its arguments go into a
  log record and every node runs it when it applies the record, at the record's stamp
  (execute.py). So a write handler must depend only on the Context and its arguments, and it
  checks everything before it changes anything: an error reply changes nothing, on every node.
- OTHER commands concern the connection or the server (PING, INFO, CONFIG, HELLO...):
  `handler(server, conn, args)`, run where they arrive; they change no data.

Errors are raised as ReplyError with Redis' wording, so clients map them to the same exceptions.
The data commands live in keyspace.py, strings.py, hashes.py, lists.py, sets.py, zsets.py and
scripting.py; commands.py imports them all and holds the OTHER commands.
"""

from __future__ import annotations

import random
from typing import Callable, NamedTuple

from walkit.adapters.kv.resp import ReplyError
from walkit.adapters.kv.state import INT64_MAX, INT64_MIN, NOT_AN_INTEGER, State, parse_int

READ, WRITE, OTHER = "read", "write", "other"
SYNTAX = "ERR syntax error"


class Command(NamedTuple):
    """Command is one entry of the table: `arity` counts the name (negative: at least that many)."""

    name: str
    arity: int
    kind: str
    handler: Callable


COMMANDS: dict[bytes, Command] = {}
#: What a write command becomes in its record, where that is not the command itself:
#: `prepare(server, args) -> args`, run where the command arrives (EVALSHA becomes EVAL).
PREPARE: dict[bytes, Callable] = {}


def command(name: str, arity: int, kind: str, *aliases: str):
    """command registers a handler under `name` (and `aliases`), and returns it unchanged."""
    def register(handler: Callable) -> Callable:
        """register adds the handler to COMMANDS."""
        for each in (name, *aliases):
            COMMANDS[each.encode()] = Command(each.lower(), arity, kind, handler)
        return handler
    return register


class Context:
    """Context is what a data command sees: the state, the time and, for a write, the record's randomness.

    `now` is the record's stamp while a record is applied, the serving node's clock for a read.
    `random` is seeded from the record (its index) while one is applied, so a command that picks
    at random (SPOP, a script's math.random) picks alike on every node. `machine` is the KVMachine (scripts
    use its Lua interpreter); `writing` tells whether a record is being applied.
    """

    __slots__ = ("state", "now", "machine", "writing", "_random")

    def __init__(self, state: State, now: int, machine=None, *, writing: bool = False) -> None:
        self.state = state
        self.now = now
        self.machine = machine
        self.writing = writing
        self._random: random.Random | None = None

    @property
    def random(self) -> random.Random:
        """random is the generator of a command that picks at random: seeded from the record being
        applied (every node picks alike), this server's own for a read."""
        if not self.writing:
            return _LOCAL_RANDOM
        if self._random is None:
            self._random = random.Random(self.state.applying)
        return self._random


_LOCAL_RANDOM = random.Random()


def integer(text: bytes, error: str = NOT_AN_INTEGER) -> int:
    """integer reads a Redis integer argument, or raises `error`."""
    value = parse_int(text)
    if value is None:
        raise ReplyError(error)
    return value


def random_count(text: bytes) -> int:
    """random_count reads the count of HRANDFIELD, SRANDMEMBER and ZRANDMEMBER: any int64 but INT64_MIN."""
    value = integer(text)
    if value == INT64_MIN:
        raise ReplyError(f"ERR value is out of range, value must between {-INT64_MAX} and {INT64_MAX}")
    return value


def fits_arity(spec: Command, count: int) -> bool:
    """fits_arity tells whether `count` arguments (the command's name included) fit the command's arity."""
    arity = spec.arity
    return count == arity if arity >= 0 else count >= -arity


def check_arity(spec: Command, args) -> None:
    """check_arity raises Redis' error for a wrong number of arguments."""
    if not fits_arity(spec, len(args)):
        raise ReplyError(f"ERR wrong number of arguments for '{spec.name}' command")


def unknown(args) -> ReplyError:
    """unknown is Redis' error for an unknown command (its arguments shown up to 128 bytes, as redis-server does)."""
    shown = b""
    for arg in args[1:]:
        if len(shown) >= 128:
            break
        shown += b"'%s' " % arg[:128 - len(shown)]
    return ReplyError(f"ERR unknown command '{args[0][:128].decode('utf-8', 'replace')}', "
                      f"with args beginning with: {shown.decode('utf-8', 'replace')}")
