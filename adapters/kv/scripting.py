"""walkit.adapters.kv.scripting runs Lua scripts as redis-server 7.0 does: EVAL, EVALSHA, their _RO forms, SCRIPT.

    EVAL "return redis.call('SET', KEYS[1], ARGV[1])" 1 greeting hello

A script is one log record. EVAL is a write: its record holds the command as sent (body,
numkeys, keys, args) and every node runs the script when it applies the record, at the
record's stamp, in one Lua 5.1 interpreter per KVMachine (`machine.scripts`, compiling each
body once). EVALSHA becomes EVAL where it arrives (table.PREPARE), from this server's script
cache (SCRIPT LOAD, and every EVAL it received); a sha it does not know is NOSCRIPT there, at
once. EVAL_RO and EVALSHA_RO are reads: they run on the server that received them, and a
write command inside them fails as in Redis. As in Redis a script is not rolled back: what it
wrote before an error stays, on every node alike.

What makes a script deterministic, and where scripts differ from redis-server 7.0.15: lua.py.
"""

from __future__ import annotations

from walkit.adapters.kv.lua import (
    NOSCRIPT, WRITE_FLAG_RO, attach, check_compiles, interpreter, parse_script, sha1hex, split_keys, text_of,
)
from walkit.adapters.kv.resp import OK, ReplyError, Simple
from walkit.adapters.kv.table import OTHER, PREPARE, READ, WRITE, command


# -- the commands ---------------------------------------------------------------------------------
def run_script(ctx, body: bytes, args, *, read_only: bool):
    """run_script runs EVAL-shaped `args` with `body`: checked as Redis checks it, then run; its reply."""
    keys, argv = split_keys(args)
    script = parse_script(body)
    lua = interpreter(ctx.machine)
    lua.function(script)
    if read_only:
        if script.writes:
            raise ReplyError(WRITE_FLAG_RO)
        lua.loaded.setdefault(script.sha, body)
    no_writes = read_only or (script.flags is not None and not script.writes) or not ctx.writing
    return lua.run(ctx, script, keys, argv, no_writes)


@command("EVAL", -3, WRITE)
def eval_(ctx, args):
    """eval_ runs EVAL script numkeys [key...] [arg...]: every node runs the script when it applies the record."""
    return run_script(ctx, args[1], args, read_only=False)


@command("EVALSHA", -3, WRITE)
def evalsha(ctx, args):
    """evalsha answers an EVALSHA that reached a record unprepared (it becomes EVAL where it arrives): NOSCRIPT."""
    split_keys(args)
    raise ReplyError(NOSCRIPT)


@command("EVAL_RO", -3, READ)
def eval_ro(ctx, args):
    """eval_ro runs EVAL_RO script numkeys [key...] [arg...] on this server; writes inside it fail."""
    return run_script(ctx, args[1], args, read_only=True)


@command("EVALSHA_RO", -3, READ)
def evalsha_ro(ctx, args):
    """evalsha_ro runs EVALSHA_RO sha numkeys [key...] [arg...] from this server's script cache."""
    if len(args[1]) != 40:
        raise ReplyError(NOSCRIPT)
    split_keys(args)
    body = None if ctx.writing else interpreter(ctx.machine).loaded.get(args[1].lower())
    if body is None:
        raise ReplyError(NOSCRIPT)
    return run_script(ctx, body, args, read_only=True)


def prepare_eval(server, args):
    """prepare_eval keeps an EVAL's body in the server's script cache, as Redis does, if it compiles."""
    loaded = attach(server)
    if sha1hex(args[1]) not in loaded:
        try:
            script = parse_script(args[1])
            check_compiles(script)
        except ReplyError:
            return args                         # the record answers the error, on every node
        loaded[script.sha] = args[1]
    return args


def prepare_evalsha(server, args):
    """prepare_evalsha turns EVALSHA into the EVAL of the body this server knows by that sha, or raises NOSCRIPT."""
    if len(args[1]) != 40:
        raise ReplyError(NOSCRIPT)
    split_keys(args)
    body = attach(server).get(args[1].lower())
    if body is None:
        raise ReplyError(NOSCRIPT)
    return [b"EVAL", body, *args[2:]]


def prepare_evalsha_ro(server, args):
    """prepare_evalsha_ro turns a queued EVALSHA_RO into EVAL_RO with its body (a transaction's record
    runs on every node, and only this server has the cache), or raises NOSCRIPT."""
    return [b"EVAL_RO", *prepare_evalsha(server, args)[1:]]


PREPARE[b"EVAL"] = prepare_eval
PREPARE[b"EVALSHA"] = prepare_evalsha
PREPARE[b"EVALSHA_RO"] = prepare_evalsha_ro

SCRIPT_HELP = [Simple(line) for line in (
    "SCRIPT <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "DEBUG (YES|SYNC|NO)",
    "    Set the debug mode for subsequent scripts executed.",
    "EXISTS <sha1> [<sha1> ...]",
    "    Return information about the existence of the scripts in the script cache.",
    "FLUSH [ASYNC|SYNC]",
    "    Flush the Lua scripts cache. Very dangerous on replicas.",
    "    When called without the optional mode argument, the behavior is determined by the",
    "    lazyfree-lazy-user-flush configuration directive. Valid modes are:",
    "    * ASYNC: Asynchronously flush the scripts cache.",
    "    * SYNC: Synchronously flush the scripts cache.",
    "KILL",
    "    Kill the currently executing Lua script.",
    "LOAD <script>",
    "    Load a script into the scripts cache without executing it.",
    "HELP",
    "    Prints this help.",
)]
#: SCRIPT's subcommands and their arity (counting SCRIPT).
SCRIPT_ARITY = {b"LOAD": 3, b"EXISTS": -3, b"FLUSH": -2, b"KILL": 2, b"HELP": 2, b"DEBUG": 3}


@command("SCRIPT", -2, OTHER)
def script_(server, conn, args):
    """script_ answers SCRIPT LOAD|EXISTS|FLUSH|KILL|DEBUG|HELP on this server's script cache."""
    sub = args[1].upper()
    arity = SCRIPT_ARITY.get(sub)
    if arity is None:
        raise ReplyError(f"ERR unknown subcommand '{text_of(args[1][:128])}'. Try SCRIPT HELP.")
    if (arity > 0 and len(args) != arity) or len(args) < -arity:
        raise ReplyError(f"ERR wrong number of arguments for 'script|{sub.decode().lower()}' command")
    loaded = attach(server)
    if sub == b"LOAD":
        script = parse_script(args[2])
        check_compiles(script)
        loaded[script.sha] = args[2]
        return script.sha
    if sub == b"EXISTS":
        return [int(sha.lower() in loaded) for sha in args[2:]]
    if sub == b"FLUSH":
        if len(args) > 3 or (len(args) == 3 and args[2].upper() not in (b"ASYNC", b"SYNC")):
            raise ReplyError("ERR SCRIPT FLUSH only support SYNC|ASYNC option")
        loaded.clear()
        return OK
    if sub == b"KILL":
        raise ReplyError("NOTBUSY No scripts in execution right now.")
    if sub == b"DEBUG":
        mode = args[2].upper()
        if mode == b"NO":
            return OK
        if mode in (b"YES", b"SYNC"):
            raise ReplyError("ERR walkit kv has no Lua debugger: SCRIPT DEBUG YES and SYNC are not supported")
        raise ReplyError("ERR Use SCRIPT DEBUG YES/SYNC/NO")
    return SCRIPT_HELP
