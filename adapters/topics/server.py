"""walkit.adapters.topics.server accepts Kafka connections and answers requests in order.

Per connection, requests are decoded as they arrive and each runs as its own task, so a
long-polling Fetch or a JoinGroup waiting for a rebalance does not hold up the requests
behind it, yet responses go out strictly in request order, as the protocol requires. A
Produce with acks=0 takes its place in the order but sends nothing.

Hostile input: a size prefix below zero or above `max_request_bytes`, an unknown api key,
an unsupported version (except ApiVersions, which gets Kafka's UNSUPPORTED_VERSION answer),
or a body that does not decode closes that connection, as Kafka's broker does; other
connections are not affected. A handler that fails unexpectedly closes its connection too.
"""

from __future__ import annotations

import asyncio
import collections
import logging

from walkit.adapters.topics import handlers
from walkit.adapters.topics.wire import BadRequest, api_versions_error, frame_size, parse_request

log = logging.getLogger("walkit.adapters.topics")

#: Pause reading a connection while this many of its requests are unanswered.
MAX_IN_FLIGHT = 1000
_NO_RESPONSE = object()


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
        buffer = self._buffer
        buffer += data
        limit = self.server.max_request_bytes
        while not self._closed and len(buffer) >= 4:
            size = frame_size(buffer)
            if size < 0 or size > limit:
                self.close(f"a frame of {size} bytes (limit {limit})")
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
        self._queue(slot)
        task = self.server.loop.create_task(handlers.handle(self.server.broker, self, request))
        task.add_done_callback(lambda t: self._handled(slot, t, request))

    def _queue(self, slot: asyncio.Future) -> None:
        self._slots.append(slot)
        slot.add_done_callback(lambda _: self._wake.set())

    def _handled(self, slot: asyncio.Future, task: asyncio.Task, request) -> None:
        if slot.done():
            return
        if task.cancelled():
            slot.cancel()
            return
        error = task.exception()
        if error is not None:
            log.error("%s: %s v%d failed: %s: %s", self.peer, type(request.body).__name__, request.version,
                      type(error).__name__, error, exc_info=error)
            slot.set_result(None)
            self.close("an internal error")
            return
        response = task.result()
        slot.set_result(_NO_RESPONSE if response is None else response)

    async def _write_responses(self) -> None:
        """_write_responses writes answers in request order as they become ready."""
        slots = self._slots
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            out = []
            while slots and slots[0].done():
                slot = slots.popleft()
                if slot.cancelled():
                    continue
                answer = slot.result()
                if answer is None:
                    break
                if answer is not _NO_RESPONSE:
                    out.append(answer)
            if out and not self._closed:
                self._transport.write(b"".join(out))
            if self._paused and len(slots) < MAX_IN_FLIGHT // 2 and not self._closed:
                self._paused = False
                self._transport.resume_reading()

    def close(self, reason: str) -> None:
        """close drops the connection (after a protocol violation)."""
        if self._closed:
            return
        log.info("closing the connection from %s: %s", self.peer, reason)
        self._closed = True
        self._transport.close()
        self._wake.set()


class KafkaServer:
    """KafkaServer listens on host:port and serves the Kafka protocol for a Broker."""

    def __init__(self, loop, *, host: str = "127.0.0.1", port: int = 9092,
                 max_request_bytes: int = 100 * 1024 * 1024) -> None:
        self.broker = None                  # set once the broker exists (it needs the port)
        self.loop = loop
        self.host = host
        self.port = port
        self.max_request_bytes = max_request_bytes
        self.connections: set[Connection] = set()
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        """start listens (port 0: a free port, then `port` says which)."""
        self._server = await self.loop.create_server(lambda: Connection(self), self.host, self.port,
                                                     reuse_address=True, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """close stops listening and closes every connection."""
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close("the broker is stopping")
