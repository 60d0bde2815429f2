"""walkit.adapters.kv.server is the RESP server: it listens, stamps and submits writes, and runs reads.

    server = KVServer(KVMachine(), loop, port=6380)
    await server.start()                      # answers LOADING until `node` is set and ready
    server.node = walkit.replicate(server.machine, client=client, name="kv-default", node_id=address)

Connections (connection.py) keep each client's replies in order; the server holds what they
share: the machine and its node, the clock records are stamped with, the read gate (reads.py),
the scripts loaded with SCRIPT LOAD (scripting.py), the users who may connect (auth.py), and
the Inbox through which the node's apply thread hands replies to the event loop. INFO, ROLE and CONFIG are answered from info.py.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import ssl
import time

from walkit.adapters.kv.auth import Users
from walkit.adapters.kv.connection import LOADING, Connection
from walkit.adapters.kv.machine import KVMachine
from walkit.adapters.kv.reads import ReadGate
from walkit.adapters.kv.records import Record, command_record, encode as encode_record
from walkit.adapters.kv.resp import ReplyError, Simple
from walkit.adapters.kv.table import Context
from walkit.errors import DuplicateError, NotLeader, StaleSubmit, WalkitError
from walkit.tls import HANDSHAKE_TIMEOUT_S

log = logging.getLogger("walkit.adapters.kv")

#: Failed AUTH attempts are logged at most once in this many seconds (with a count of the others).
AUTH_WARNING_EVERY_S = 10.0


def wall_ms() -> int:
    """wall_ms is this machine's clock in ms since the epoch."""
    return int(time.time() * 1000)


class Inbox:
    """Inbox hands calls from other threads to the event loop, many per wake-up of the loop."""

    def __init__(self, loop) -> None:
        self.loop = loop
        self._calls: collections.deque = collections.deque()
        self._scheduled = False

    def put(self, call) -> None:
        """put runs `call()` on the event loop soon, after the calls put before it."""
        self._calls.append(call)
        if not self._scheduled:
            self._scheduled = True
            try:
                self.loop.call_soon_threadsafe(self._drain)
            except RuntimeError:
                pass                            # the loop is closed: the server is gone

    def _drain(self) -> None:
        self._scheduled = False
        calls = self._calls
        while calls:
            try:
                calls.popleft()()
            except Exception:  # noqa: BLE001 - one broken reply must not stop the others
                log.exception("delivering a reply failed")


class KVServer:
    """KVServer serves RESP on `host:port` over a KVMachine replicated by `node` (set once it started).

    Until `node` is set the server answers LOADING. `cluster` is the metadata URI INFO reports;
    `users` who may connect (default: anyone, as a Redis without requirepass); with `tls` the
    port speaks TLS only (a failed handshake closes that connection, nothing else).
    """

    def __init__(self, machine: KVMachine, loop, *, host: str = "127.0.0.1", port: int = 6380, cluster: str = "",
                 snapshot_every: int = 0, users: Users | None = None, tls: ssl.SSLContext | None = None) -> None:
        self.machine = machine
        self.tls = tls                          # serve TLS (walkit.tls) instead of plain RESP
        self.users = users or Users()
        self.auth_failures = 0                  # INFO's acl_access_denied_auth
        self._auth_logged = (float("-inf"), 0)  # when the last warning was logged, and the count then
        self.loop = loop
        self.node = None
        self.host = host
        self.port = port
        self.cluster = cluster
        self.snapshot_every = snapshot_every
        self.stopping = False
        self.connections: set[Connection] = set()
        self.scripts: dict[bytes, bytes] = {}   # SCRIPT LOAD's cache: sha1 hex -> body (this server's)
        self.inbox = Inbox(loop)
        self.reads = ReadGate(self)
        self.started = time.monotonic()
        self._stamped = 0                       # the last stamp handed out
        self._holding = False                   # the node holds this turn's submits (submit)
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        """start listens on host:port (port 0: a free one, then `port` says which)."""
        self._server = await self.loop.create_server(lambda: Connection(self), self.host, self.port,
                                                     reuse_address=True, backlog=1024, ssl=self.tls,
                                                     ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if self.tls else None)
        self.port = self._server.sockets[0].getsockname()[1]

    def stop_listening(self) -> None:
        """stop_listening refuses new connections; open ones are served on."""
        if self._server is not None:
            self._server.close()

    async def close(self) -> None:
        """close stops listening, writes the replies that are ready and closes every connection."""
        self.stop_listening()
        for conn in list(self.connections):
            conn.flush()
            if conn._transport is not None:
                conn._transport.close()

    # -- what the server knows --------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """ready is True once the node applied what the log held when it started (data commands are served)."""
        return self.node is not None and self.node.ready

    @property
    def is_leader(self) -> bool:
        """is_leader tells whether this server serves writes now."""
        return self.node is not None and self.node.is_leader

    def now_ms(self) -> int:
        """now_ms is this server's clock: never behind a stamp it applied or, as leader, handed out."""
        return max(wall_ms(), self.machine.stamp, self._stamped)

    def auth_failed(self, conn: Connection, name: bytes) -> None:
        """auth_failed counts a failed AUTH and logs it, at most once per AUTH_WARNING_EVERY_S.

        The line names the user only if it exists (a password typed where the user name goes
        must not reach the log) and never the password.
        """
        self.auth_failures += 1
        now = time.monotonic()
        logged_at, logged_count = self._auth_logged
        if now - logged_at < AUTH_WARNING_EVERY_S:
            return
        who = f"user {name.decode('utf-8', 'replace')!r}" if self.users.known(name) else "an unknown user"
        others = self.auth_failures - logged_count - 1
        log.warning("walkit kv: failed AUTH from %s as %s%s", conn.peer, who,
                    f" ({others} more failed since the last such line)" if others else "")
        self._auth_logged = (now, self.auth_failures)

    def role_changed(self, role: str) -> None:
        """role_changed is the node's on_role callback (role thread): a new leadership is noted for reads.py."""
        if role == "leader":
            self.inbox.put(self.reads.saw_leader)

    # -- writes and reads -------------------------------------------------------------------------
    def submit(self, args, submitter=None, session: tuple[str, int] | None = None, *, multi=None):
        """submit stamps the write command `args` (or, with `multi`, a transaction: (commands,
        watches)) and submits it to the node; the Future resolves to its reply value.

        `submitter` is the connection (the node's linger waits for connections, not records).
        `session` is (client, seq) for a SESSION command: applied once however often it is retried.
        It raises NotLeader unless this server leads now. The writes of one turn of the event loop
        (every connection that had data) reach the node's I/O thread together (`hold_submits`),
        on the loop's next turn.
        """
        node = self.node
        if node is None or self.stopping:
            raise NotLeader("this server does not serve writes now", None)
        stamp = self.now_ms()
        if multi is None:
            data = command_record(stamp, args)
        else:
            commands, watches = multi
            data = encode_record(Record(stamp, tuple(map(tuple, commands)), True, tuple(watches)))
        client, seq = session if session is not None else (None, None)
        if not self._holding:                   # this turn's writes go to the node together
            node.hold_submits()
            self._holding = True
            self.loop.call_soon(self._release, node)
        future = node.submit_async(data, submitter, client=client, seq=seq)
        self._stamped = stamp                   # later records are stamped no earlier than this one
        self.reads.saw_leader()
        return future

    def _release(self, node) -> None:
        """_release hands the writes submitted in the event loop's last turn to the node's I/O thread."""
        self._holding = False
        node.release_submits()

    def write_reply(self, future):
        """write_reply is the reply to a write whose Future is done: apply's result, or why it failed."""
        error = future.exception()
        if error is None:
            result = future.result()
            # A SESSION retry's reply is the first one's, kept as text: a str is a status (+OK).
            return Simple(result) if type(result) is str else result
        if isinstance(error, DuplicateError):       # the first application's error reply
            return ReplyError(str(error) if error.kind == "ReplyError" else f"ERR {error.kind}: {error}")
        if isinstance(error, StaleSubmit):
            return ReplyError(f"ERR {error}; this write was not applied (a SESSION seq is used once, in order)")
        if isinstance(error, NotLeader) and not error.maybe_in_log:
            return self.not_leader_error(error.leader)      # READONLY: it was never appended
        if isinstance(error, WalkitError):
            return ReplyError(f"ERR the log refused the write ({type(error).__name__}: {error}); this server "
                              f"stepped down as leader, and the write may or may not have taken effect")
        return ReplyError(f"ERR {type(error).__name__}: {error}")

    def read(self, conn: Connection, spec, args: list[bytes]):
        """read runs a read command against the state now, under the machine's lock, and returns its reply."""
        machine = self.machine
        with machine.lock:
            try:
                return spec.handler(Context(machine.state, self.now_ms(), machine), args)
            except ReplyError as exc:
                return exc

    def loading_error(self) -> ReplyError | None:
        """loading_error is the LOADING reply a write gets now, or None: while the store loads and
        while this server, elected, replays the log before it leads."""
        node = self.node
        if self.stopping or (node is not None and node.ready and (node.is_leader or not node.election.is_leader)):
            return None
        if node is None or not node.ready:
            return ReplyError(LOADING)
        return ReplyError("LOADING this server was elected leader and is replaying the log; retry shortly")

    def ping_error(self) -> ReplyError | None:
        """ping_error is what PING answers instead of PONG (INFO says `loading:1` meanwhile): LOADING
        while a write gets it, and while no server leads (an election is under way). So a client
        that waits for PONG can write at once on a single server, fresh or restarted; a follower
        that knows its leader answers PONG, and its writes get READONLY, as a Redis replica's do.
        A write while no server leads gets READONLY, not LOADING: redis-py retries LOADING with
        backoff, which would slow every write to a server cut off from the metadata store."""
        loading = self.loading_error()
        if loading is not None or self.stopping:
            return loading
        if not self.node.is_leader and self.node.leader is None:
            return ReplyError("LOADING no server leads yet: an election is under way; retry shortly")
        return None

    def not_leader_error(self, leader: str | None = None) -> ReplyError:
        """not_leader_error is the reply to a write this server cannot take now."""
        if self.stopping:
            return ReplyError("ERR this server is shutting down")
        loading = self.loading_error()
        if loading is not None:
            return loading
        leader = leader or self.node.leader or "unknown (an election is under way)"
        return ReplyError(f"READONLY You can't write against a read only replica. Leader: {leader}")
