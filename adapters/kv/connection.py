"""walkit.adapters.kv.connection is one client connection: commands in, replies out in command order.

A write becomes a stamped record submitted to the node at once (walkit.replicate groups the
records of all connections into shared log entries) and is answered with what applying it
returned, once the log acknowledged it and it was applied. A read waits only for this
connection's own earlier writes (read-your-writes): chained to the connection's last pending
write, it runs in that write's Future callback, on the node's apply thread right after the
write was applied and before the next record, so a pipeline ``SET k 1; GET k; SET k 2`` reads
1. Other connections are never blocked by it. Reads that are not chained follow reads.py: at
once, or after a read barrier. A read that is all a connection holds while nothing of the
connection is pending (a client that waits for each reply) is answered straight from
data_received, with the same checks and reply (`_plain_read`).

Backpressure: commands run only while the connection can take their replies. While the
transport's write buffer is full (the client does not read), or more than HIGH_WATER replies
are pending, or the answer to a failed AUTH is being held back (auth.py), no further command
runs and reading pauses; what was received stays in the parser until the connection can go on.
So a client that pipelines thousands of GETs of a large value and reads none of them costs
one reply's worth of memory above the buffer, not thousands.

Authentication: on a server that requires it (auth.py) a connection starts without a user; it
may then send only AUTH, HELLO and QUIT (others are answered NOAUTH), with RESP's lower limits
for unauthenticated connections (resp.py). Commands are split by reader.py: hiredis, in C, for
an authenticated connection's multibulk commands, resp.py's parser for the rest.

Threads: everything here runs on the event loop thread, except the Future callbacks, which run
on the apply thread; they read the state under the machine's lock and hand their replies to the
loop through the server's Inbox. While the node is not ready data commands are answered LOADING.

Transactions: MULTI starts queueing; each command is checked as redis-server checks it when it
is queued (unknown, wrong arity, a write on a server that does not lead: an error now, and EXEC
answers EXECABORT). EXEC sends every queued command, with the watches, as one record
(records.py): every node runs all of it or, if a watched key changed, none of it (execute.py).
A transaction without writes runs as one read. WATCH is a read too: it runs after the
connection's own pending writes and notes how many records were applied then, so its own
writes never break it, and any other write to the key applied after that does.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools

from walkit.adapters.kv.auth import FAILED_AUTH_DELAY_S
from walkit.adapters.kv.commands import (
    COMMANDS, NO_AUTH, NOAUTH, OTHER, READ, SESSION, WHILE_LOADING, WRITE, AuthFailed, check_arity, session_args, unknown,
)
from walkit.adapters.kv.execute import run, watches_hold
from walkit.adapters.kv.records import Watch
from walkit.adapters.kv.reader import CommandReader
from walkit.adapters.kv.resp import NIL_ARRAY, OK, QUEUED, ProtocolError, ReplyError, encode
from walkit.adapters.kv.table import PREPARE, Command, fits_arity
from walkit.errors import NotLeader, RecordTooLarge

#: Pause reading a connection while this many of its replies are pending; resume below LOW_WATER.
HIGH_WATER, LOW_WATER = 10_000, 1_000
#: Replies ready to send are written once they add up to this many bytes, also mid-pipeline.
FLUSH_BYTES = 64 * 1024

#: The commands of transactions: the connection runs them (they decide what happens to the others).
TRANSACTION_COMMANDS = frozenset({b"MULTI", b"EXEC", b"DISCARD", b"WATCH", b"UNWATCH"})

LOADING = "LOADING walkit kv is loading the store: it applies the log up to where it ended at start-up"


class Slot:
    """Slot is one reply a connection owes, in command order (None until it is known; `silent`:
    the command runs but its reply is not sent, CLIENT REPLY OFF or SKIP)."""

    __slots__ = ("reply", "silent", "then")

    def __init__(self, silent: bool = False) -> None:
        self.reply: bytes | None = None
        self.silent = silent
        self.then = None                        # called on the event loop once the reply is known


class Connection(asyncio.Protocol):
    """Connection is one client connection: it parses commands and writes replies in order."""

    _ids = itertools.count(1)

    def __init__(self, server) -> None:
        self.server = server
        self.id = next(self._ids)
        self.name: bytes | None = None
        self.user: str | None = None if server.users.required else "default"
        self.resp3 = False
        self.close_after_reply = False
        self.peer = "?"
        self._parser = CommandReader()
        self._parser.unauthenticated = self.user is None
        self._slots: collections.deque[Slot] = collections.deque()
        self._last_write = None                 # the Future of this connection's last write, while pending
        self._unanswered: list = []             # writes of this read batch whose answer is not awaited yet
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._transport = None
        self._flush_scheduled = False
        self._reading_paused = False
        self._writing_paused = False
        self._held = None                       # the timer of a failed AUTH's answer, while it waits
        self._stalled = False                   # commands wait in the parser until the connection may go on
        self._running = False
        self._closed = False
        self._queued: list[list[bytes]] | None = None     # MULTI's commands, while in a transaction
        self._queue_failed = False              # a queued command was refused: EXEC answers EXECABORT
        self._watches: dict[bytes, Watch] = {}
        self._watching = 0                      # WATCHes not answered yet (they wait for earlier writes)
        self._watch_era = 0                     # bumped by UNWATCH and DISCARD: a WATCH of an earlier era notes nothing
        self._exec_waiting = None               # an EXEC that waits for them: (slot, commands, failed)
        self._replies_off = False               # CLIENT REPLY OFF
        self._skip = 0                          # CLIENT REPLY SKIP: 2 while it runs, 1 for the next command
        self._silent = False                    # the running command's reply is not sent

    # -- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.server.connections.add(self)

    def connection_lost(self, exc) -> None:
        self._closed = True
        self.server.connections.discard(self)
        if self._held is not None:
            self._held.cancel()
            self._held = None

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._update_reading()

    def data_received(self, data: bytes) -> None:
        """data_received runs the complete commands received while the connection may, then writes the replies."""
        parser = self._parser
        parser.feed(data)
        if self._slots or not self._plain_read(parser):
            self._run()

    def _plain_read(self, parser) -> bool:
        """_plain_read answers a read on its own and returns True if it is all the connection holds
        and `_run` would answer it at once (the common case: a client that waits for each reply);
        otherwise it runs nothing and returns False, and `_run` does all of it. It makes the
        checks `_execute` and `_read` make, in their order, for that one case."""
        if (self._queued is not None or self._silent or self._replies_off or self._skip or self.user is None
                or self.close_after_reply or self._closed or self._busy()):
            return False
        args = parser.only()
        if args is None:
            return False
        name = args[0].upper()
        spec = COMMANDS.get(name)
        server = self.server
        if (spec is None or spec.kind is not READ or name in TRANSACTION_COMMANDS or not fits_arity(spec, len(args))
                or not server.ready or server.reads.must_wait()):
            return False
        parser.next()
        self._transport.write(encode(server.read(self, spec, args), self.resp3))
        return True

    def logged_in(self, user: str) -> None:
        """logged_in makes `user` this connection's user (AUTH or HELLO succeeded)."""
        self.user = user
        self._parser.unauthenticated = False

    # -- commands -------------------------------------------------------------------------
    def _busy(self) -> bool:
        """_busy tells whether the connection must wait before it runs another command (see the module doc)."""
        return (self._writing_paused or self._held is not None or self._exec_waiting is not None
                or len(self._slots) > HIGH_WATER)

    def _run(self) -> None:
        """_run executes buffered commands until none is complete or the connection is busy, then flushes."""
        if self._running:
            return
        self._running = True
        parser = self._parser
        try:
            while not (self.close_after_reply or self._closed):
                if self._busy():
                    self._stalled = parser.buffered > 0
                    break
                args = parser.next()
                if args is None:
                    break
                self._silent = self._replies_off or self._skip > 0
                self._execute(args)
                if self._skip:
                    self._skip -= 1
                if self._out_bytes > FLUSH_BYTES:
                    self.flush()                # the transport may say it is full: then this stops
        except ProtocolError as exc:
            self._reply(ReplyError(f"ERR Protocol error: {exc}"))
            self.close_after_reply = True
        finally:
            self._running = False
            self._await_writes()
        self.flush()

    def _execute(self, args: list[bytes]) -> None:
        name = args[0].upper()
        if self.user is None and name not in NO_AUTH:
            self._reply(ReplyError(NOAUTH))
            return
        if name in TRANSACTION_COMMANDS:
            self._transaction_command(name, args)
            return
        if name == SESSION:
            self._session_write(args)
            return
        spec = COMMANDS.get(name)
        if spec is None:
            self._refuse_in_transaction(unknown(args))
            return
        server = self.server
        try:
            check_arity(spec, args)
            if not server.ready and name not in WHILE_LOADING:
                raise ReplyError(LOADING)
            if self._queued is not None:
                self._queue(spec, args)
            elif spec.kind is WRITE:
                self._write(self._prepared(name, args))
            elif spec.kind is READ:
                self._read(spec, args)
            else:
                self._reply(spec.handler(server, self, args))
        except AuthFailed as exc:
            self._hold(exc)
        except ReplyError as exc:
            self._refuse_in_transaction(exc)

    def _prepared(self, name: bytes, args: list[bytes]) -> list[bytes]:
        """_prepared is what goes into a record for a write or a queued command (EVALSHA becomes EVAL,
        a queued EVALSHA_RO EVAL_RO: table.PREPARE)."""
        prepare = PREPARE.get(name)
        return args if prepare is None else prepare(self.server, args)

    # -- transactions -----------------------------------------------------------------------------
    def _refuse_in_transaction(self, error: ReplyError) -> None:
        """_refuse_in_transaction answers `error`; inside MULTI it also dooms the transaction (EXECABORT)."""
        if self._queued is not None:
            self._queue_failed = True
        self._reply(error)

    def _queue(self, spec: Command, args: list[bytes]) -> None:
        """_queue keeps a command for EXEC, checked as far as it can be now (as redis-server does)."""
        if spec.kind is OTHER:
            raise ReplyError(f"ERR walkit kv does not run '{spec.name}' inside MULTI (only data commands)")
        if spec.kind is WRITE and not self.server.is_leader:
            raise self.server.not_leader_error()
        self._queued.append(self._prepared(args[0].upper(), args))
        self._reply(QUEUED)

    def _transaction_command(self, name: bytes, args: list[bytes]) -> None:
        """_transaction_command runs MULTI, EXEC, DISCARD, WATCH and UNWATCH (see the module doc)."""
        in_multi = self._queued is not None
        n = len(args)
        if (name in (b"MULTI", b"EXEC", b"DISCARD", b"UNWATCH") and n != 1) or (name == b"WATCH" and n < 2):
            self._refuse_in_transaction(ReplyError(f"ERR wrong number of arguments for '{name.decode().lower()}' "
                                                   f"command"))
            return
        if name == b"MULTI":
            if in_multi:
                self._reply(ReplyError("ERR MULTI calls can not be nested"))
                return
            self._queued, self._queue_failed = [], False
            self._reply(OK)
        elif name == b"DISCARD":
            if not in_multi:
                self._reply(ReplyError("ERR DISCARD without MULTI"))
                return
            self._end_transaction()
            self._reply(OK)
        elif name == b"UNWATCH":
            if in_multi:
                self._queued.append(args)
                self._reply(QUEUED)
            else:
                self._unwatch()
                self._reply(OK)
        elif name == b"WATCH":
            if in_multi:
                self._reply(ReplyError("ERR WATCH inside MULTI is not allowed"))
            elif not self.server.ready:
                self._reply(ReplyError(LOADING))
            else:
                self._watching += 1
                era = self._watch_era
                self._read(Command("watch", -2, READ, lambda ctx, args: self._watch(ctx, args, era)), args,
                           self._watched)
        elif not in_multi:
            self._reply(ReplyError("ERR EXEC without MULTI"))
        else:
            self._exec()

    def _watch(self, ctx, args: list[bytes], era: int):
        """_watch notes, for each key, how many records were applied and whether it is alive (a read:
        it runs after this connection's own writes, so they never break its watch). A WATCH that
        waited for a write while UNWATCH or DISCARD came after it (another `era`) notes nothing."""
        if era != self._watch_era:
            return OK
        index = ctx.machine.index
        for key in args[1:]:
            self._watches.setdefault(key, Watch(key, index, ctx.state.alive(key, ctx.now)))
        return OK

    def _watched(self) -> None:
        """_watched runs once a WATCH was answered; the last one lets a waiting EXEC go on."""
        self._watching -= 1
        if self._watching == 0 and self._exec_waiting is not None:
            slot, commands, failed = self._exec_waiting
            self._exec_waiting = None
            self._run_exec(commands, failed, tuple(self._watches.values()), slot)
            self._unwatch()
            self._update_reading()              # the commands after EXEC go on

    def _end_transaction(self) -> None:
        self._queued, self._queue_failed = None, False
        self._unwatch()

    def _unwatch(self) -> None:
        """_unwatch forgets every watch, also those of WATCHes still waiting for a write (see _watch)."""
        self._watches = {}
        self._watch_era += 1

    def _exec(self) -> None:
        """_exec ends MULTI: one record with every command and the watches, or a read if none writes.
        While a WATCH still waits for the connection's earlier writes, EXEC waits for it, and the
        connection runs no later command meanwhile (_busy)."""
        commands, failed = self._queued, self._queue_failed
        if self._watching:
            self._queued, self._queue_failed = None, False
            self._exec_waiting = (self._new_slot(), commands, failed)
            return
        watches = tuple(self._watches.values())
        self._end_transaction()
        self._run_exec(commands, failed, watches, None)

    def _run_exec(self, commands, failed: bool, watches, slot: Slot | None) -> None:
        if failed:
            self._answer(slot, ReplyError("EXECABORT Transaction discarded because of previous errors."))
        elif any(COMMANDS[args[0].upper()].kind is WRITE for args in commands):
            self._write(commands, multi=watches, slot=slot)
        else:
            def read_all(ctx, _args):
                return [run(ctx, args) for args in commands] if watches_hold(ctx, watches) else NIL_ARRAY
            self._read(Command("exec", 1, READ, read_all), [b"EXEC"], slot=slot)

    def _answer(self, slot: Slot | None, value) -> None:
        """_answer fills `slot`, or replies now if there is none."""
        if slot is None:
            self._reply(value)
        else:
            self._fill(slot, value)

    def _session_write(self, args: list[bytes]) -> None:
        """_session_write runs ``SESSION <client> <seq> <write command> [args...]``: the write applies once.

        A client that names itself and numbers its writes (seq 1, 2, 3, ...; a retry reuses the
        number, on any server) gets, for a retry of a write that was applied, the first reply,
        and the write is not applied again (walkit.replicate's client sessions).
        """
        try:
            client, seq, inner = session_args(args)
            spec = COMMANDS.get(inner[0].upper())
            if spec is None or spec.kind is not WRITE:
                raise ReplyError(f"ERR SESSION runs a write command (SET, INCR, DEL, ...), not "
                                 f"'{inner[0].decode('utf-8', 'replace')[:64]}'")
            check_arity(spec, inner)
            if not self.server.ready:
                raise ReplyError(LOADING)
            self._write(self._prepared(inner[0].upper(), inner), (client, seq))
        except ReplyError as exc:
            self._reply(exc)

    def _hold(self, error: AuthFailed) -> None:
        """_hold answers a failed AUTH after FAILED_AUTH_DELAY_S; until then no later command of this connection runs."""
        slot = self._new_slot()

        def release() -> None:
            self._held = None
            self._fill(slot, error)
        self._held = self.server.loop.call_later(FAILED_AUTH_DELAY_S, release)
        self._update_reading()

    def _write(self, args, session: tuple[str, int] | None = None, *, multi=None, slot: Slot | None = None) -> None:
        """_write submits a write command (or, with `multi` the watches, a transaction's commands)."""
        slot = slot or self._new_slot()
        try:
            future = self.server.submit(args, self, session, multi=None if multi is None else (args, multi))
        except NotLeader as exc:
            self._fill(slot, self.server.not_leader_error(exc.leader))
            return
        except RecordTooLarge as exc:          # refused before anything was sent: the connection goes on
            what = "transaction" if multi is not None else "write"
            self._fill(slot, ReplyError(f"ERR the {what} is {exc.size} bytes as a log record, over the store's "
                                        f"limit of {exc.limit} bytes (max_record_bytes); nothing of it was applied"))
            return
        self._last_write = future
        self._unanswered.append((slot, multi is not None, future))
        if not self._running:                   # an EXEC that waited for its WATCHes
            self._await_writes()

    def _await_writes(self) -> None:
        """_await_writes answers the writes of the read batch together, once the last of them is applied.

        A connection's records are applied in the order it submitted them, so when the last one
        is done the others are too; one that is not (it failed apart from the others) is answered
        on its own when it is.
        """
        batch = self._unanswered
        if batch:
            self._unanswered = []
            batch[-1][2].add_done_callback(functools.partial(self._written, batch))

    def _written(self, batch: list, _last) -> None:
        """_written runs on the apply thread right after the batch's last write was applied (or failed)."""
        server = self.server
        replies = []
        for slot, transaction, future in batch:
            if not future.done():
                future.add_done_callback(functools.partial(self._written, [(slot, transaction, future)]))
                continue
            reply = server.write_reply(future)
            if transaction and reply is None:
                reply = NIL_ARRAY               # a watched key changed: nothing ran
            replies.append((slot, reply))
        if replies:
            server.inbox.put(functools.partial(self._fill_all, replies))

    def _read(self, spec, args: list[bytes], then=None, slot: Slot | None = None) -> None:
        """_read answers a read when it may run (see the module doc), into `slot` if given (an EXEC
        that waited for its WATCHes); `then()` is called on the event loop once its reply is known,
        whichever way it was answered."""
        if self._unanswered:
            self._await_writes()                # the read's answer follows theirs
        last = self._last_write
        if last is not None and not last.done():
            slot = slot or self._new_slot()
            slot.then = then
            last.add_done_callback(functools.partial(self._read_after_write, slot, spec, args))
            return
        reads = self.server.reads
        if reads.must_wait():
            slot = slot or self._new_slot()
            slot.then = then
            reads.after_barrier(functools.partial(self._read_after_barrier, slot, spec, args))
            return
        if slot is not None:
            slot.then = then
            self._fill(slot, self.server.read(self, spec, args))
            return
        self._reply(self.server.read(self, spec, args))
        if then is not None:
            then()

    def _read_after_write(self, slot: Slot, spec, args: list[bytes], write) -> None:
        """_read_after_write runs right after the write it waited for was applied (apply thread, usually).

        It reads then and there, so it sees exactly the connection's writes up to that one. A
        leader whose lease ran out keeps that reply until a read barrier proved it still leads
        (then nothing was acknowledged elsewhere before the read arrived); if it did not, the
        read is refused: the reply could be stale, and reading again could see later writes.
        """
        server = self.server
        node = server.node
        if write.exception() is not None or not node.is_leader:
            server.inbox.put(functools.partial(self._read_into, slot, spec, args))
            return
        epoch = node.election.epoch
        value = server.read(self, spec, args)
        if node.lease_valid:
            server.inbox.put(functools.partial(self._fill, slot, value))
        else:
            server.inbox.put(functools.partial(self._confirm, slot, value, epoch))

    def _confirm(self, slot: Slot, value, epoch: int | None) -> None:
        def then(error: ReplyError | None) -> None:
            node = self.server.node
            if error is None and not (node.is_leader and node.election.epoch == epoch):
                error = ReplyError("TRYAGAIN this server stopped leading while the read waited for the write "
                                   "before it; read again")
            self._fill(slot, error if error is not None else value)
        self.server.reads.after_barrier(then)

    def _read_into(self, slot: Slot, spec, args: list[bytes]) -> None:
        reads = self.server.reads
        if reads.must_wait():
            reads.after_barrier(functools.partial(self._read_after_barrier, slot, spec, args))
        else:
            self._fill(slot, self.server.read(self, spec, args))

    def _read_after_barrier(self, slot: Slot, spec, args: list[bytes], error: ReplyError | None) -> None:
        self._fill(slot, error if error is not None else self.server.read(self, spec, args))

    # -- replies in order -----------------------------------------------------------------------
    def reply_mode(self, mode: bytes) -> None:
        """reply_mode is CLIENT REPLY as redis-server runs it: ON sends replies again (its own too),
        OFF sends none, SKIP sends none for itself and the next command (nothing changes while OFF)."""
        if mode == b"ON":
            self._replies_off, self._skip, self._silent = False, 0, False
        elif mode == b"OFF":
            self._replies_off = self._silent = True
        else:
            self._silent = True
            if not self._replies_off:
                self._skip = 2

    def _new_slot(self) -> Slot:
        slot = Slot(self._silent)
        self._slots.append(slot)
        return slot

    def _reply(self, value) -> None:
        if self._silent:
            return
        if self._slots:
            self._new_slot().reply = encode(value, self.resp3)
        else:
            reply = encode(value, self.resp3)
            self._out.append(reply)
            self._out_bytes += len(reply)

    def _fill_all(self, replies: list) -> None:
        for slot, value in replies:
            self._fill(slot, value)

    def _fill(self, slot: Slot, value) -> None:
        slot.reply = encode(value, self.resp3)
        if slot.then is not None:
            slot.then()
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.server.loop.call_soon(self.flush)

    def flush(self) -> None:
        """flush writes every reply that is ready, in order, up to the first one still pending."""
        self._flush_scheduled = False
        slots, out = self._slots, self._out
        while slots and slots[0].reply is not None:
            slot = slots.popleft()
            if not slot.silent:
                out.append(slot.reply)
        if not slots:
            self._last_write = None
        if out and not self._closed:
            self._transport.write(b"".join(out) if len(out) > 1 else out[0])
        out.clear()
        self._out_bytes = 0
        if self.close_after_reply and not slots and not self._closed:
            self._transport.close()
            self._closed = True
        if self._reading_paused or self._stalled or self._busy():
            self._update_reading()

    def _update_reading(self) -> None:
        """_update_reading pauses reading while the connection is busy, and goes on with stalled commands after."""
        if self._closed:
            return
        busy = self._busy()
        if not self._reading_paused and busy:
            self._reading_paused = True
            self._transport.pause_reading()
        elif self._reading_paused and not busy and len(self._slots) < LOW_WATER:
            self._reading_paused = False
            self._transport.resume_reading()
        if self._stalled and not busy and not self._running:
            self._stalled = False
            self.server.loop.call_soon(self._run)

    def describe(self) -> str:
        """describe is this connection's line in CLIENT LIST."""
        name = (self.name or b"").decode("utf-8", "replace")
        return (f"id={self.id} addr={self.peer} name={name} db=0 user={self.user or ''} "
                f"resp={3 if self.resp3 else 2}\n")
