"""walkit.transport.zmq connects a client to bookies: one DEALER socket per bookie.

All methods but `wake()` belong to the client's I/O thread. Each bookie's socket is watched by
a ZeroMQ monitor, so the transport knows when a connection is up (handshake done) or down
(disconnected, refused, or not up within `connect_timeout_ms`). Sockets use ZMQ_IMMEDIATE, so nothing is
queued for a bookie that is down: `send` returns False at once and the caller fails the request
instead of waiting for a timeout. Frames sent while the first connection is being made are held
until it is up.

Bookies are named by id (BP-41, walkit.registry): `lookup(id)` returns the bookie's registration
(a BookieInfo) and its endpoint is dialled, or the id itself when there is no lookup or no
registration (an id is by default an address). A channel's endpoint is looked up on a thread
of its own, so a slow or unreachable metadata store never holds up the I/O thread: frames wait
as they do for a connection. A channel that is down looks its bookie up again (at most every
`RESOLVE_EVERY_S`) and moves to the new endpoint of a bookie that came back elsewhere.

Dead connections are found by ZeroMQ heartbeats (`HEARTBEAT_IVL_MS`, `HEARTBEAT_TIMEOUT_MS`):
a bookie whose host vanished or whose link was cut sends no RST, and without them its
connection would look up until TCP gave up, minutes later. A connection attempt that gets no
answer is abandoned after `CONNECT_TIMEOUT_MS` and tried again, so a healed link is used again
within about a second instead of after TCP's exponential SYN backoff.

Security: with `curve=(public key, secret key)` every socket is a CurveZMQ client that
verifies the bookie's public key (`server_key(address)`, from its registration). A bookie that
refuses the handshake (an unknown or revoked key, or a client without keys meeting a secured
bookie) is reported in `refused`: its requests fail with UNAUTHORIZED rather than UNREACHABLE.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import zmq
from zmq.utils.monitor import recv_monitor_message

log = logging.getLogger("walkit.client")

_UP = zmq.EVENT_HANDSHAKE_SUCCEEDED
_DOWN = zmq.EVENT_DISCONNECTED
_REFUSED = zmq.EVENT_CONNECT_RETRIED     # a connection attempt failed; ZeroMQ will try again
_DENIED = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
           | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)     # the bookie refused who we are


#: How long a bookie that refused our key is not asked again (then a new handshake tries again:
#: the key may have been allowed meanwhile).
REFUSED_RETRY_S = 0.2
#: How often a channel that is down looks up its bookie's endpoint again.
RESOLVE_EVERY_S = 1.0
#: ZeroMQ heartbeats: a PING every HEARTBEAT_IVL_MS; no traffic for HEARTBEAT_TIMEOUT_MS ends the connection.
HEARTBEAT_IVL_MS = 1000
HEARTBEAT_TIMEOUT_MS = 5000
#: A TCP connect unanswered this long is abandoned and retried (ZeroMQ's RECONNECT_IVL later).
CONNECT_TIMEOUT_MS = 1000


class _Channel:
    __slots__ = ("address", "endpoint", "socket", "monitor", "state", "held", "deadline", "refused_at",
                 "resolved_at", "resolving", "checking")

    def __init__(self, address: str, deadline: float) -> None:
        self.address = address           # the bookie's id
        self.endpoint = ""               # host:port dialled; "" while it is being looked up
        self.socket = None
        self.monitor = None
        self.state = "connecting"        # connecting | up | down
        self.held: list[bytes] = []
        self.deadline = deadline
        self.refused_at = 0.0
        self.resolved_at = 0.0
        self.resolving = False
        self.checking = False            # down, and being looked up again: frames wait for the answer


class ZmqTransport:
    """ZmqTransport is the client's ZeroMQ link to bookies, driven by one I/O thread."""

    def __init__(self, *, connect_timeout_ms: int = 2000, context: zmq.Context | None = None,
                 curve: tuple[bytes, bytes] | None = None, server_key=None, lookup=None) -> None:
        self.context = context or zmq.Context.instance()
        self.connect_timeout_ms = connect_timeout_ms
        self.curve = curve
        self.lookup = lookup              # (it gives the public key too: server_key is for callers without it)
        self.server_key = server_key
        self.refused: set[str] = set()
        self._resolver = None                        # a one-thread executor, started on first use
        self._resolved: deque[tuple[str, str, str | None]] = deque()   # (id, endpoint, public key) looked up
        self._channels: dict[str, _Channel] = {}
        self._by_socket: dict[object, _Channel] = {}
        self._poller = zmq.Poller()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._wake_lock = threading.Lock()
        self._poller.register(self._wake_fd, zmq.POLLIN)
        self._down: list[str] = []

    # -- channels -------------------------------------------------------------------------
    def _channel(self, address: str) -> _Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = _Channel(address, time.monotonic() + self.connect_timeout_ms / 1000)
            self._channels[address] = channel
            if self.lookup is None and self.server_key is None:
                self._connect(channel, address, None)
            else:
                self._resolve(channel)
        return channel

    def _resolve(self, channel: _Channel) -> None:
        """_resolve looks the bookie up on the resolver thread; `poll` connects with the answer."""
        if channel.resolving:
            return
        channel.resolving = True
        channel.resolved_at = time.monotonic()
        if self._resolver is None:
            self._resolver = ThreadPoolExecutor(max_workers=1, thread_name_prefix="walkit-resolve")
        self._resolver.submit(self._look_up, channel.address)

    def _look_up(self, bookie: str) -> None:
        """_look_up (on the resolver thread) finds a bookie's endpoint and key; the id on any failure."""
        endpoint, key = bookie, None
        try:
            if self.lookup is not None:
                info = self.lookup(bookie)
                endpoint = getattr(info, "dial", None) or bookie
                key = getattr(info, "public_key", None)
            elif self.server_key is not None:
                key = self.server_key(bookie)
        except Exception as exc:  # noqa: BLE001 - a failing store: dial the id, look again later
            log.debug("cannot look up bookie %s: %s", bookie, exc)
        self._resolved.append((bookie, endpoint, key))
        self.wake()                     # (a no-op once closed: the answer is dropped with the transport)

    def _on_resolved(self) -> None:
        while self._resolved:
            bookie, endpoint, key = self._resolved.popleft()
            channel = self._channels.get(bookie)
            if channel is None:
                continue
            channel.resolving = False
            checking, channel.checking = channel.checking, False
            if channel.socket is None:
                self._connect(channel, endpoint, key)
            elif endpoint != channel.endpoint:         # it came back elsewhere: a new connection there
                log.info("bookie %s moved from %s to %s", bookie, channel.endpoint, endpoint)
                self._close_channel(channel)
                moved = _Channel(bookie, time.monotonic() + self.connect_timeout_ms / 1000)
                moved.held, moved.resolved_at = channel.held, channel.resolved_at
                self._channels[bookie] = moved
                self._connect(moved, endpoint, key)
            elif checking and channel.state == "connecting":   # a down bookie looked up again: still there, down
                channel.state = "down"
                channel.held.clear()
                self._down.append(bookie)

    def _connect(self, channel: _Channel, endpoint: str, key: str | None) -> None:
        socket = self.context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.IMMEDIATE, 1)
        socket.setsockopt(zmq.SNDHWM, 0)
        socket.setsockopt(zmq.RCVHWM, 0)
        socket.setsockopt(zmq.RECONNECT_IVL, 100)
        socket.setsockopt(zmq.RECONNECT_IVL_MAX, 200)
        socket.setsockopt(zmq.CONNECT_TIMEOUT, CONNECT_TIMEOUT_MS)
        socket.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
        socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        socket.setsockopt(zmq.HEARTBEAT_TTL, HEARTBEAT_TIMEOUT_MS)
        if self.curve is not None:
            socket.curve_publickey, socket.curve_secretkey = self.curve
            socket.curve_serverkey = key.encode() if isinstance(key, str) and key else b"0" * 40
        monitor = socket.get_monitor_socket(_UP | _DOWN | _REFUSED | _DENIED)
        socket.connect(f"tcp://{endpoint}")
        channel.socket, channel.monitor, channel.endpoint = socket, monitor, endpoint
        self._by_socket[socket] = channel
        self._by_socket[monitor] = channel
        self._poller.register(socket, zmq.POLLIN)
        self._poller.register(monitor, zmq.POLLIN)

    def send(self, address: str, frame: bytes) -> bool:
        """send queues `frame` for a bookie; False means the bookie is unreachable right now."""
        channel = self._channel(address)
        if channel.state == "down" and address in self.refused and time.monotonic() - channel.refused_at > REFUSED_RETRY_S:
            self._close_channel(channel)          # a new handshake: the key may be allowed by now
            channel = self._channel(address)
        if (channel.state == "down" and self.lookup is not None and address not in self.refused
                and time.monotonic() - channel.resolved_at >= RESOLVE_EVERY_S):
            # It may have come back on another address: frames wait for the answer (a moved
            # bookie gets them there; otherwise they fail as they would have now).
            channel.state, channel.checking = "connecting", True
            channel.deadline = time.monotonic() + self.connect_timeout_ms / 1000
            self._resolve(channel)
        if channel.state == "up":
            try:
                channel.socket.send(frame, zmq.NOBLOCK, copy=len(frame) < 65536)
                return True
            except zmq.Again:          # the connection went away; the monitor will say so
                channel.state = "down"
                return False
        if channel.state == "connecting":
            channel.held.append(frame)
            return True
        return False

    def poll(self, timeout_ms: int) -> tuple[list[tuple[str, memoryview]], list[str]]:
        """poll waits up to `timeout_ms` and returns (frames from bookies, as buffers; bookies gone down)."""
        received: list[tuple[str, memoryview]] = []
        for item, _ in self._poller.poll(timeout_ms):
            if item == self._wake_fd:
                try:
                    os.eventfd_read(self._wake_fd)
                except BlockingIOError:
                    pass
                continue
            if item not in self._by_socket:         # its channel moved to a new endpoint in this round
                continue
            channel = self._by_socket[item]
            if item is channel.monitor:
                self._on_monitor(channel)
                continue
            socket = channel.socket
            while True:
                try:
                    # In place (a buffer, no copy): the codec reads large read answers where they landed.
                    received.append((channel.address, socket.recv(zmq.NOBLOCK, copy=False).buffer))
                except zmq.Again:
                    break
        self._on_resolved()
        now = time.monotonic()
        for channel in self._channels.values():
            if channel.state == "connecting" and now >= channel.deadline:
                channel.state, channel.checking = "down", False
                channel.held.clear()
                self._down.append(channel.address)
        down, self._down = self._down, []
        return received, down

    @staticmethod
    def _denied(event: int, value: int) -> bool:
        """_denied tells whether a failed handshake means the bookie refused who we are.

        ZAP's refusal (HANDSHAKE_FAILED_AUTH), a CURVE error, or a secured bookie meeting a client
        without keys (mechanism mismatch) is a refusal; any other failed handshake (a bookie dying
        mid-greeting, say) is only a connection that went down.
        """
        return event == zmq.EVENT_HANDSHAKE_FAILED_AUTH or (
            event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            and value in (zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC, zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH))

    def _on_monitor(self, channel: _Channel) -> None:
        while True:
            try:
                message = recv_monitor_message(channel.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            event = message["event"]
            if event == _UP:
                channel.state = "up"
                self.refused.discard(channel.address)
                held, channel.held = channel.held, []
                for frame in held:
                    channel.socket.send(frame, zmq.NOBLOCK)
            elif self._denied(event, message["value"]) and channel.state != "down":
                self.refused.add(channel.address)
                channel.refused_at = time.monotonic()
                self._went_down(channel)
            elif (event in (_DOWN, _REFUSED) or event & _DENIED) and channel.state != "down" and not channel.checking:
                self._went_down(channel)            # (while checking, the old endpoint failing is expected)

    def _went_down(self, channel: _Channel) -> None:
        """_went_down reports a channel down; the next send to it looks its bookie up again at once."""
        channel.state = "down"
        channel.held.clear()
        channel.resolved_at = 0.0
        self._down.append(channel.address)

    def revive(self, address: str) -> None:
        """revive reconnects to a bookie that is down now (it registered again after a restart).

        The channel starts over as a new connection: frames sent meanwhile are held until the
        handshake, or dropped (and the bookie reported down) after `connect_timeout_ms`.
        """
        channel = self._channels.get(address)
        if channel is None or channel.state != "down":
            return
        self._close_channel(channel)
        self._channel(address)                 # looked up again: it may have registered elsewhere

    def _close_channel(self, channel: _Channel) -> None:
        del self._channels[channel.address]
        if channel.socket is None:             # still being looked up
            return
        for item in (channel.socket, channel.monitor):
            self._poller.unregister(item)
            del self._by_socket[item]
        channel.socket.disable_monitor()
        channel.monitor.close(linger=0)
        channel.socket.close(linger=0)

    def is_up(self, address: str) -> bool:
        """is_up tells whether the connection to a bookie is established."""
        channel = self._channels.get(address)
        return channel is not None and channel.state == "up"

    def wake(self) -> None:
        """wake interrupts a `poll` in progress; any thread may call it, also after `close()` (then it does nothing)."""
        with self._wake_lock:
            if self._wake_fd >= 0:       # never write to a closed descriptor: its number may be reused
                os.eventfd_write(self._wake_fd, 1)

    def close(self) -> None:
        """close closes every socket."""
        for channel in list(self._channels.values()):
            self._close_channel(channel)
        if self._resolver is not None:
            self._resolver.shutdown(wait=False, cancel_futures=True)
        with self._wake_lock:
            os.close(self._wake_fd)
            self._wake_fd = -1
