"""walkit.transport.memory links clients to in-process bookies, for tests.

A `MemoryNetwork` holds `BookieService`s by address; each client gets a `MemoryTransport` on it
with the same methods as the ZeroMQ transport. Frames are the real Cap'n Proto bytes, so the
codec is exercised; a bookie can be taken down (`kill`) and brought back (`revive`), and a
`tamper` hook may rewrite a bookie's reply frames (to inject corruption).
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Callable

from walkit.bookie.service import BookieService


class MemoryNetwork:
    """MemoryNetwork is a set of in-process bookies reachable by address."""

    def __init__(self) -> None:
        self.bookies: dict[str, BookieService] = {}
        self.down: set[str] = set()
        self.tamper: Callable[[str, bytes], bytes] | None = None
        self._lock = threading.RLock()
        self._transports: dict[bytes, "MemoryTransport"] = {}
        self._ids = itertools.count(1)

    def add_bookie(self, address: str, storage, disk: int = 0) -> BookieService:
        """add_bookie serves `storage` (disk id `disk`) at `address` and returns its service."""
        with self._lock:
            service = self.bookies[address] = BookieService(storage, disk=disk)
            self.down.discard(address)
            return service

    def kill(self, address: str) -> None:
        """kill makes a bookie unreachable; clients see it go down."""
        with self._lock:
            self.down.add(address)
            for transport in self._transports.values():
                transport._went_down(address)

    def revive(self, address: str) -> None:
        """revive makes a killed bookie reachable again, with the storage it had."""
        with self._lock:
            self.down.discard(address)

    def transport(self) -> "MemoryTransport":
        """transport returns a new client-side transport on this network."""
        with self._lock:
            peer = next(self._ids).to_bytes(4, "big")
            transport = self._transports[peer] = MemoryTransport(self, peer)
            return transport

    def _deliver(self, address: str, replies: list[tuple[bytes, bytes]]) -> None:
        for peer, frame in replies:
            transport = self._transports.get(peer)
            if transport is not None:
                if self.tamper is not None:
                    frame = self.tamper(address, frame)
                transport._inbox_put(address, frame)

    def _send(self, peer: bytes, address: str, frame: bytes) -> bool:
        with self._lock:
            service = self.bookies.get(address)
            if service is None or address in self.down:
                return False
            service.receive(peer, frame)
            self._deliver(address, service.flush())
            return True

    def _tick(self) -> None:
        with self._lock:
            now = int(time.monotonic() * 1000)
            for address, service in self.bookies.items():
                if address not in self.down:
                    service.tick(now)
                    self._deliver(address, service.flush())


class MemoryTransport:
    """MemoryTransport is one client's end of a MemoryNetwork (same API as ZmqTransport)."""

    def __init__(self, network: MemoryNetwork, peer: bytes) -> None:
        self.network = network
        self.peer = peer
        self._inbox: list[tuple[str, bytes]] = []
        self._down: list[str] = []
        self._woken = False
        self._cond = threading.Condition()

    def send(self, address: str, frame: bytes) -> bool:
        """send delivers `frame` to the bookie at once; False if it is down or unknown."""
        return self.network._send(self.peer, address, frame)

    def poll(self, timeout_ms: int) -> tuple[list[tuple[str, bytes]], list[str]]:
        """poll returns replies and bookies gone down, waiting up to `timeout_ms` for either."""
        self.network._tick()
        with self._cond:
            if not self._inbox and not self._down and not self._woken:
                self._cond.wait(timeout_ms / 1000)
            self._woken = False
            received, self._inbox = self._inbox, []
            down, self._down = self._down, []
        return received, down

    def revive(self, address: str) -> None:
        """revive does nothing: an in-memory bookie that is back is reachable at once."""

    def is_up(self, address: str) -> bool:
        """is_up tells whether the bookie is reachable."""
        return address in self.network.bookies and address not in self.network.down

    def wake(self) -> None:
        """wake interrupts a poll in progress."""
        with self._cond:
            self._woken = True
            self._cond.notify_all()

    def close(self) -> None:
        """close detaches this transport from the network."""
        with self.network._lock:
            self.network._transports.pop(self.peer, None)

    def _inbox_put(self, address: str, frame: bytes) -> None:
        with self._cond:
            self._inbox.append((address, frame))
            self._cond.notify_all()

    def _went_down(self, address: str) -> None:
        with self._cond:
            self._down.append(address)
            self._cond.notify_all()
