"""walkit.adapters.kv.server is the RESP server: connections, per-connection ordering, INFO and ROLE.

Per connection, replies go out in command order. A write is submitted to the replica at once
(pipelined writes share log entries) and answered once the log acked it and it was applied.
A read waits only for this connection's own earlier writes (read-your-writes): it is chained
to the connection's last pending write and runs right after that write is applied, before
any later record, so a pipeline ``SET k 1; GET k; SET k 2`` reads 1. Other connections are
never blocked by it. Reads on a follower see its state as far as it has applied the log.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
import time

from walkit import __version__ as walkit_version
from walkit.adapters.kv.commands import COMMANDS, WRITE, check_arity, unknown
from walkit.adapters.kv.replica import LEADER, PROMOTING, STOPPED, NotLeader, Replica
from walkit.adapters.kv.resp import ProtocolError, ReplyError, RespParser, encode

log = logging.getLogger("walkit.adapters.kv")

#: Pause reading a connection while this many of its replies are pending; resume below LOW_WATER.
HIGH_WATER, LOW_WATER = 10_000, 1_000


class Slot:
    """Slot is one reply a connection owes, in command order; `after` runs once it is filled."""

    __slots__ = ("reply", "after")

    def __init__(self) -> None:
        self.reply: bytes | None = None
        self.after: list | None = None


class ScanCursors:
    """ScanCursors maps the numbers SCAN hands out to the last key each visited (the most recent 10,000)."""

    def __init__(self, limit: int = 10_000) -> None:
        self._cursors: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self._numbers = itertools.count(1)
        self._limit = limit

    def add(self, key: bytes) -> int:
        """add remembers `key` and returns the cursor number that continues after it."""
        number = next(self._numbers)
        self._cursors[number] = key
        if len(self._cursors) > self._limit:
            self._cursors.popitem(last=False)
        return number

    def pop(self, number: int, default=None):
        """pop returns (and forgets) the key a cursor number continues after, or `default`."""
        return self._cursors.pop(number, default)


class Connection(asyncio.Protocol):
    """Connection is one client connection: it parses commands and writes replies in order."""

    _ids = itertools.count(1)

    def __init__(self, server: "KVServer") -> None:
        self.server = server
        self.id = next(self._ids)
        self.name: bytes | None = None
        self.resp3 = False
        self.close_after_reply = False
        self.peer = "?"
        self._parser = RespParser()
        self._slots: collections.deque[Slot] = collections.deque()
        self._last_write: Slot | None = None
        self._out: list[bytes] = []
        self._transport = None
        self._flush_scheduled = False
        self._reading_paused = False
        self._writing_paused = False
        self._closed = False

    # -- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.server.connections.add(self)

    def connection_lost(self, exc) -> None:
        self._closed = True
        self.server.connections.discard(self)

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._update_reading()

    def data_received(self, data: bytes) -> None:
        """data_received runs every complete command received, then writes the replies that are ready."""
        parser = self._parser
        parser.feed(data)
        try:
            while not self.close_after_reply:
                args = parser.next()
                if args is None:
                    break
                self._execute(args)
        except ProtocolError as exc:
            self._reply(ReplyError(f"ERR Protocol error: {exc}"))
            self.close_after_reply = True
        self.flush()
        self._update_reading()

    # -- commands -------------------------------------------------------------------------
    def _execute(self, args: list[bytes]) -> None:
        spec = COMMANDS.get(args[0].upper())
        if spec is None:
            self._reply(unknown(args))
            return
        server = self.server
        try:
            check_arity(spec, args)
            if spec.kind is WRITE:
                record = spec.handler(server, self, args)
                slot = Slot()
                self._slots.append(slot)
                try:
                    server.replica.submit(record, lambda result, slot=slot: self._fill(slot, result))
                except NotLeader:
                    self._fill(slot, server.not_leader_error())
                else:
                    self._last_write = slot
                return
            last = self._last_write
            if last is not None and last.reply is None:
                slot = Slot()
                self._slots.append(slot)
                if last.after is None:
                    last.after = []
                last.after.append(lambda: self._fill(slot, self._run(spec, args)))
                return
            reply = spec.handler(server, self, args)
        except ReplyError as exc:
            reply = exc
        self._reply(reply)

    def _run(self, spec, args):
        try:
            return spec.handler(self.server, self, args)
        except ReplyError as exc:
            return exc

    def _reply(self, value) -> None:
        if self._slots:
            slot = Slot()
            slot.reply = encode(value, self.resp3)
            self._slots.append(slot)
        else:
            self._out.append(encode(value, self.resp3))

    def _fill(self, slot: Slot, value) -> None:
        slot.reply = encode(value, self.resp3)
        if slot.after is not None:
            for then in slot.after:
                then()
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.server.loop.call_soon(self.flush)

    def flush(self) -> None:
        """flush writes every reply that is ready, in order, up to the first one still pending."""
        self._flush_scheduled = False
        slots, out = self._slots, self._out
        while slots and slots[0].reply is not None:
            out.append(slots.popleft().reply)
        if not slots:
            self._last_write = None
        if out and not self._closed:
            self._transport.write(b"".join(out) if len(out) > 1 else out[0])
        out.clear()
        if self.close_after_reply and not slots and not self._closed:
            self._transport.close()
            self._closed = True
        self._update_reading()

    def _update_reading(self) -> None:
        if self._closed:
            return
        pending = len(self._slots)
        if not self._reading_paused and (pending > HIGH_WATER or self._writing_paused):
            self._reading_paused = True
            self._transport.pause_reading()
        elif self._reading_paused and pending < LOW_WATER and not self._writing_paused:
            self._reading_paused = False
            self._transport.resume_reading()

    def describe(self) -> str:
        """describe is this connection's line in CLIENT LIST."""
        name = (self.name or b"").decode("utf-8", "replace")
        return f"id={self.id} addr={self.peer} name={name} db=0 resp={3 if self.resp3 else 2}\n"


class KVServer:
    """KVServer serves RESP on `host:port` over a Replica; `address` is what followers name as leader."""

    REDIS_VERSION = "7.0.0"

    def __init__(self, replica: Replica, *, host: str = "127.0.0.1", port: int = 6380, cluster: str = "") -> None:
        self.replica = replica
        self.loop = replica.loop
        self.host = host
        self.port = port
        self.cluster = cluster
        self.connections: set[Connection] = set()
        self.cursors = ScanCursors()
        self.started = time.monotonic()
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        """start listens on host:port (port 0: a free one, then `port` says which)."""
        self._server = await self.loop.create_server(lambda: Connection(self), self.host, self.port,
                                                     reuse_address=True, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]

    def stop_listening(self) -> None:
        """stop_listening refuses new connections; open ones are served on."""
        if self._server is not None:
            self._server.close()

    async def close(self) -> None:
        """close stops listening and closes every connection."""
        self.stop_listening()
        for conn in list(self.connections):
            if conn._transport is not None:
                conn._transport.close()

    @property
    def is_leader(self) -> bool:
        """is_leader tells whether this server serves writes now."""
        return self.replica.role is LEADER

    def not_leader_error(self) -> ReplyError:
        """not_leader_error is the reply to a write this server cannot take now."""
        replica = self.replica
        if replica.role is PROMOTING:
            return ReplyError("LOADING this server was elected leader and is replaying the log; retry shortly")
        if replica.role is STOPPED:
            return ReplyError("ERR this server is shutting down")
        leader = replica.leader or "unknown (an election is under way)"
        return ReplyError(f"READONLY You can't write against a read only replica. Leader: {leader}")

    # -- INFO, ROLE, CONFIG -------------------------------------------------------------------
    def role_reply(self) -> list:
        """role_reply answers ROLE as Redis does: [master, offset, []] or [slave, host, port, state, offset]."""
        replica = self.replica
        if replica.role is LEADER:
            return [b"master", replica.index, []]
        host, _, port = (replica.leader or ":").rpartition(":")
        state = b"connected" if replica.leader else b"connecting"
        return [b"slave", host.encode(), int(port) if port.isdigit() else -1, state, replica.index]

    def config_values(self) -> dict[str, str]:
        """config_values are the settings CONFIG GET reports (enough for redis-benchmark and redis-cli)."""
        return {"port": str(self.port), "bind": self.host, "databases": "1", "save": "", "appendonly": "yes",
                "appendfsync": "always", "maxmemory": "0", "timeout": "0", "protected-mode": "no"}

    def info_text(self, sections: list[str]) -> str:
        """info_text is the INFO reply: Redis' sections plus walkit's replication details."""
        replica = self.replica
        now = replica.now_ms()
        leading = replica.role is LEADER
        lag = 0 if leading else replica.lag_entries
        host, _, port = (replica.leader or ":").rpartition(":")
        parts = {
            "server": [f"redis_version:{self.REDIS_VERSION}", f"walkit_version:{walkit_version}",
                       "redis_mode:standalone", f"process_id:{os.getpid()}", f"tcp_port:{self.port}",
                       f"uptime_in_seconds:{int(time.monotonic() - self.started)}"],
            "clients": [f"connected_clients:{len(self.connections)}"],
            "replication": [
                f"role:{'master' if leading else 'slave'}", f"walkit_role:{replica.role}",
                f"leader:{replica.leader or ''}", f"epoch:{'' if replica.epoch is None else replica.epoch}",
                f"applied_position:{replica.position or ''}", f"applied_records:{replica.index}",
                f"lag_entries:{'' if lag is None else lag}",
                f"lag_ms:{0 if leading or not lag else max(0, now - replica.stamp)}",
                f"last_apply_seconds_ago:{time.monotonic() - replica.last_apply:.3f}",
                *([] if leading else [f"master_host:{host}", f"master_port:{port}",
                                      f"master_link_status:{'up' if replica.leader else 'down'}"]),
                f"master_repl_offset:{replica.index}", f"cluster:{self.cluster}"],
            "persistence": ["loading:0", "aof_enabled:1", f"snapshots:{replica.snapshots}",
                            f"snapshot_position:{replica.snapshot_position or ''}",
                            f"snapshot_every:{replica.snapshot_every}"],
            "keyspace": [f"db0:keys={replica.state.size(now)},expires={len(replica.state.expires)},avg_ttl=0"],
        }
        wanted = [s for s in sections if s in parts] or list(parts)
        if sections and not any(s in parts or s in ("all", "default", "everything") for s in sections):
            wanted = []
        return "".join(f"# {name.capitalize()}\r\n" + "\r\n".join(parts[name]) + "\r\n\r\n"
                       for name in wanted)

