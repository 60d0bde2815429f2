"""walkit.adapters.kv.execute runs what a record says: a write command, a transaction or a script.

    reply = run_record(machine, decode(data))

It runs on every node, in log order, under the machine's lock (machine.py), with a Context at
the record's stamp. A write command returns its reply (an error reply is returned, not raised:
a command that fails changes nothing, on every node alike). A transaction (MULTI ... EXEC) first
checks its watches: if a watched key may have changed after the index at which the leader
watched it, or was alive then and has expired since, nothing runs and the reply is None (EXEC's
nil array); otherwise every command runs, and the reply is the list of their replies (an error
in one does not stop the others, as in Redis). Reads inside a transaction run here too, so they
see the transaction's own writes.
"""

from __future__ import annotations

import logging

from walkit.adapters.kv.records import Record
from walkit.adapters.kv.resp import ReplyError
from walkit.adapters.kv.table import COMMANDS, OTHER, Context, unknown

log = logging.getLogger("walkit.adapters.kv")


def run(ctx: Context, args) -> object:
    """run executes one data command in `ctx` and returns its reply (an error as a ReplyError value)."""
    spec = COMMANDS.get(args[0].upper())
    if spec is None or spec.kind is OTHER:
        return unknown(args) if spec is None else ReplyError(f"ERR '{spec.name}' is not a data command")
    arity, n = spec.arity, len(args)
    if n != arity and (arity >= 0 or n < -arity):
        return ReplyError(f"ERR wrong number of arguments for '{spec.name}' command")
    try:
        return spec.handler(ctx, args)
    except ReplyError as exc:
        return exc
    except Exception as exc:  # noqa: BLE001 - a bug in one command must not stop the log
        log.exception("walkit kv: %r failed", args[0])
        return ReplyError(f"ERR internal error running '{spec.name}': {type(exc).__name__}")


def watches_hold(ctx: Context, watches) -> bool:
    """watches_hold tells whether no watched key changed (nor expired) since it was watched."""
    state = ctx.state
    for watch in watches:
        if state.changed_since(watch.key, watch.index):
            return False
        if watch.alive and not state.alive(watch.key, ctx.now):
            return False
    return True


def run_record(machine, record: Record) -> object:
    """run_record applies one decoded record to `machine.state` and returns the reply."""
    ctx = Context(machine.state, record.stamp, machine, writing=True)
    if not record.multi:
        return run(ctx, record.commands[0])
    if not watches_hold(ctx, record.watches):
        return None
    return [run(ctx, args) for args in record.commands]
