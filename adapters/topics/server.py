"""walkit.adapters.topics.server accepts Kafka connections and answers requests in order.

Per connection, requests are decoded as they arrive and each runs as its own task, so a
long-polling Fetch or a JoinGroup waiting for a rebalance does not hold up the requests
behind it, yet responses go out strictly in request order, as the protocol requires. A
Produce with acks=0 takes its place in the order but sends nothing.

Hostile input: a size prefix below zero or above `max_request_bytes`, an unknown api key,
an unsupported version (except ApiVersions, which gets Kafka's UNSUPPORTED_VERSION answer),
or a body that does not decode closes that connection, as Kafka's broker does; other
connections are not affected. A handler that fails unexpectedly closes its connection too.

With users (`--sasl-users`), every connection starts behind a sasl.SaslGate: until it
authenticates, its frames go to the gate (ApiVersions, SaslHandshake, SaslAuthenticate, at
most sasl.MAX_UNAUTHENTICATED_FRAME bytes each) and anything else closes it; a failed
authentication is answered, then the connection closes. With TLS (`tls`) the port speaks
TLS only; a failed TLS handshake closes that connection before it reaches the code here.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import ssl

from walkit.adapters.topics import handlers
from walkit.adapters.topics.sasl import MAX_UNAUTHENTICATED_FRAME, Reply, SaslGate, Users, UsersFile
from walkit.adapters.topics.wire import BadRequest, api_versions_error, frame_size, parse_request
from walkit.tls import HANDSHAKE_TIMEOUT_S

log = logging.getLogger("walkit.adapters.topics")

#: Pause reading a connection while this many of its requests are unanswered.
MAX_IN_FLIGHT = 1000
#: How long a connection stays open after its last answer (a failed authentication) unless the
#: client closes it first: kafka-python drops an answer that arrives together with the close.
LAST_ANSWER_GRACE = 1.0
_NO_RESPONSE = object()


class _Last:
    """_Last is a connection's last answer: the writer sends `frame` (if any), then closes for `reason`."""

    def __init__(self, frame: bytes | None, reason: str) -> None:
        self.frame = frame
        self.reason = reason


class Connection(asyncio.Protocol):
    """Connection is one client connection (see the module doc)."""

    def __init__(self, server: "KafkaServer") -> None:
        self.server = server
        self.peer = "?"
        self.host = ""
        self._buffer = bytearray()
        self._slots: collections.deque[asyncio.Future] = collections.deque()
        self._transport = None
        self._closed = False
        self._paused = False
        self._writer_task: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self._ending = False                # the last answer is queued: read nothing more
        self.gate = SaslGate(server.users) if server.users is not None else None
        self.user: str | None = None        # the authenticated SASL user

    def connection_made(self, transport) -> None:
        self._transport = transport
        peer = transport.get_extra_info("peername")
        if peer:
            self.host, self.peer = peer[0], f"{peer[0]}:{peer[1]}"
        self.server.connections.add(self)
        self._writer_task = self.server.loop.create_task(self._write_responses())

    def connection_lost(self, exc) -> None:
        self._closed = True
        self.server.connections.discard(self)
        for slot in self._slots:
            slot.cancel()
        self._wake.set()

    def data_received(self, data: bytes) -> None:
        """data_received splits the stream into frames and starts one task per request."""
        if self._ending:
            return
        buffer = self._buffer
        buffer += data
        while not self._closed and not self._ending and len(buffer) >= 4:
            size = frame_size(buffer)
            limit = self.server.max_request_bytes if self.gate is None else MAX_UNAUTHENTICATED_FRAME
            if size < 0 or size > limit:
                self.close(f"a frame of {size} bytes (limit {limit}{'' if self.gate is None else ' before authentication'})")
                return
            if len(buffer) < 4 + size:
                break
            frame = bytes(buffer[4:4 + size])
            del buffer[:4 + size]
            self._dispatch(frame)
        if not self._paused and len(self._slots) >= MAX_IN_FLIGHT:
            self._paused = True
            self._transport.pause_reading()

    def _dispatch(self, frame: bytes) -> None:
        if self.server.broker is None:
            self.close("the broker is starting")
            return
        if self.gate is not None:
            self._authenticate(frame)
            return
        slot = self.server.loop.create_future()
        try:
            request = parse_request(frame)
        except BadRequest as exc:
            answer = api_versions_error(frame)
            if answer is None:
                self.close(str(exc))
                return
            slot.set_result(answer)
            self._queue(slot)
            return
        self._serve(request)

    def _serve(self, request) -> None:
        slot = self.server.loop.create_future()
        self._queue(slot)
        task = self.server.loop.create_task(handlers.handle(self.server.broker, self, request))
        task.add_done_callback(lambda t: self._handled(slot, t, request))

    def _authenticate(self, frame: bytes) -> None:
        """_authenticate passes a frame of a connection not yet authenticated to its SaslGate."""
        gate = self.gate
        step = gate.receive(frame)
        if not isinstance(step, Reply):
            self._serve(step)                           # ApiVersions
            return
        if gate.user is not None:
            self.gate, self.user = None, gate.user
            log.info("%s authenticated as SASL user %r", self.peer, gate.user)
        if step.close is not None and step.answer is None:
            self.close(step.close)
            return
        answer = step.answer if step.close is None else _Last(step.answer, step.close)
        if step.close is not None:
            self._ending = True
        slot = self.server.loop.create_future()
        self._queue(slot)
        if step.delay:
            self.server.loop.call_later(step.delay, lambda: slot.done() or slot.set_result(answer))
        else:
            slot.set_result(answer)

    def _queue(self, slot: asyncio.Future) -> None:
        self._slots.append(slot)
        slot.add_done_callback(lambda _: self._wake.set())

    def _handled(self, slot: asyncio.Future, task: asyncio.Task, request) -> None:
        if task.cancelled():
            if not slot.done():
                slot.cancel()
            return
        error = task.exception()                    # retrieved (and logged) even if the client left meanwhile
        if error is not None:
            log.error("%s: %s v%d failed: %s: %s", self.peer, type(request.body).__name__, request.version,
                      type(error).__name__, error, exc_info=error)
            if not slot.done():
                slot.set_result(None)
                self.close("an internal error")
            return
        if not slot.done():
            response = task.result()
            slot.set_result(_NO_RESPONSE if response is None else response)

    async def _write_responses(self) -> None:
        """_write_responses writes answers in request order as they become ready."""
        slots = self._slots
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            out, last = [], None
            while slots and slots[0].done():
                slot = slots.popleft()
                if slot.cancelled():
                    continue
                answer = slot.result()
                if answer is None:
                    break
                if isinstance(answer, _Last):
                    last = answer
                    if answer.frame is not None:
                        out.append(answer.frame)
                    break
                if answer is not _NO_RESPONSE:
                    out.append(answer)
            if out and not self._closed:
                self._transport.write(b"".join(out))
            if last is not None:
                self.close(last.reason, after=LAST_ANSWER_GRACE)
                return
            if self._paused and len(slots) < MAX_IN_FLIGHT // 2 and not self._closed:
                self._paused = False
                self._transport.resume_reading()

    def close(self, reason: str, *, after: float = 0.0) -> None:
        """close drops the connection (after a protocol violation), `after` seconds from now unless the client goes first."""
        if self._closed:
            return
        log.info("closing the connection from %s: %s", self.peer, reason)
        if after:
            self._ending = True
            self.server.loop.call_later(after, self._transport.close)
            return
        self._closed = True
        self._transport.close()
        self._wake.set()


class KafkaServer:
    """KafkaServer listens on host:port and serves the Kafka protocol for a Broker.

    The port is one Kafka listener: PLAINTEXT, SASL_PLAINTEXT with `users`, SSL with `tls`,
    SASL_SSL with both (`security_protocol`).
    """

    def __init__(self, loop, *, host: str = "127.0.0.1", port: int = 9092,
                 max_request_bytes: int = 100 * 1024 * 1024, users: Users | UsersFile | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.broker = None                  # set once the broker exists (it needs the port)
        self._users = users                 # SASL users (a sasl.UsersFile reads its file again); None: no SASL
        self.tls = tls                      # serve TLS (walkit.tls): listener SSL, or SASL_SSL with users
        self.loop = loop
        self.host = host
        self.port = port
        self.max_request_bytes = max_request_bytes
        self.connections: set[Connection] = set()
        self._server: asyncio.AbstractServer | None = None

    @property
    def users(self) -> Users | None:
        """users are the SASL users a new connection logs in as now, None if the broker does not use SASL."""
        return None if self._users is None else self._users.current()

    @property
    def security_protocol(self) -> str:
        """security_protocol is the Kafka security.protocol clients set for this port."""
        return ("SASL_" if self.users is not None else "") + ("SSL" if self.tls is not None else "PLAINTEXT")

    async def start(self) -> None:
        """start listens (port 0: a free port, then `port` says which)."""
        self._server = await self.loop.create_server(lambda: Connection(self), self.host, self.port,
                                                     reuse_address=True, backlog=1024, ssl=self.tls,
                                                     ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if self.tls else None)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """close stops listening and closes every connection."""
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close("the broker is stopping")
