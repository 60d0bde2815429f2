"""walkit.bookie.server is the bookie process: a ZeroMQ ROUTER socket in front of BookieService.

One thread serves the socket. Each round it takes every frame that is already waiting (up to
`max_batch_frames`), hands them to the service, lets the service sync storage once for all of
them (group commit: one sync covers every add that arrived while the previous one ran), then
sends the replies. A background thread registers the bookie in the metadata store and collects
garbage: ledgers stored here whose metadata no longer exists are deleted; a ledger whose
metadata cannot be read is kept.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass

import zmq

from walkit.bookie.service import BookieService
from walkit.core.messages import ErrorResponse, Status
from walkit.core.metadata import ledger_key
from walkit.errors import ConfigError, MetadataError, NodeExists, NoSuchKey
from walkit.plugins import open_metadata, open_storage
from walkit.registry import BookieInfo, BookieRegistry
from walkit.wire.codec import DEFAULT_MAX_FRAME, encode_responses

log = logging.getLogger("walkit.bookie")


@dataclass(slots=True)
class BookieConfig:
    """BookieConfig is everything a bookie process needs; see `walkit bookie --help`."""

    metadata: str
    storage: str = "memory://"
    host: str = "127.0.0.1"
    port: int = 3181
    max_frame_bytes: int = DEFAULT_MAX_FRAME
    max_batch_frames: int = 1024
    gc_interval_s: float = 60.0
    tick_ms: int = 10
    parent_pid: int | None = None       # exit when this process is gone (LocalCluster children)
    register_timeout_s: float = 30.0    # how long to wait for a dead predecessor's registration to expire

    def validate(self) -> None:
        """validate raises ConfigError for values the bookie cannot run with."""
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in 0..65535, got {self.port}")
        if self.max_frame_bytes < 1024:
            raise ConfigError(f"max_frame_bytes must be at least 1024, got {self.max_frame_bytes}")
        if self.max_batch_frames < 1:
            raise ConfigError(f"max_batch_frames must be at least 1, got {self.max_batch_frames}")
        if self.gc_interval_s <= 0:
            raise ConfigError(f"gc_interval_s must be positive, got {self.gc_interval_s}")
        if self.tick_ms < 1:
            raise ConfigError(f"tick_ms must be at least 1, got {self.tick_ms}")
        if self.register_timeout_s < 0:
            raise ConfigError(f"register_timeout_s must not be negative, got {self.register_timeout_s}")


class BookieServer:
    """BookieServer runs one bookie until `stop()` (or SIGTERM/SIGINT via `serve_forever`)."""

    def __init__(self, config: BookieConfig) -> None:
        config.validate()
        self.config = config
        self._stopping = threading.Event()
        self._deletions: deque[int] = deque()
        self._gc_candidates: deque[list[int]] = deque()
        self._context = zmq.Context.instance()
        self.storage = open_storage(config.storage)
        self.service = BookieService(self.storage, max_frame=config.max_frame_bytes)
        self.metadata = open_metadata(config.metadata)
        self.socket = self._context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        # Frames above max_frame_bytes get BAD_REQUEST; far larger ones make ZeroMQ drop the peer.
        self.socket.setsockopt(zmq.MAXMSGSIZE, 2 * config.max_frame_bytes)
        try:
            try:
                if config.port:
                    self.socket.bind(f"tcp://{config.host}:{config.port}")
                    port = config.port
                else:
                    port = self.socket.bind_to_random_port(f"tcp://{config.host}")
            except zmq.ZMQError as exc:
                raise ConfigError(f"cannot listen on {config.host}:{config.port}: {exc.strerror}") from None
            self.address = f"{config.host}:{port}"
            self._registration = self._register(
                BookieInfo(self.address, read_only=self.service.read_only, storage=config.storage))
        except BaseException:
            for action in (self.socket.close, self.metadata.close, self.storage.close):
                try:
                    action()
                except Exception:  # noqa: BLE001 - already failing; report the first error
                    pass
            raise
        self._gc_thread = threading.Thread(target=self._gc_loop, name="walkit-bookie-gc", daemon=True)

    def _register(self, info: BookieInfo):
        """_register registers this bookie, first waiting out a registration left by a dead one.

        A bookie killed on this address (SIGKILL, crash) leaves its ephemeral registration until
        its session or lease expires; a restart within that time must wait, not fail (BookKeeper
        waits for the old znode the same way).
        """
        registry = BookieRegistry(self.metadata)
        deadline = time.monotonic() + self.config.register_timeout_s
        waiting = False
        while True:
            try:
                return registry.register(info)
            except NodeExists:
                if time.monotonic() >= deadline:
                    raise
                if not waiting:
                    waiting = True
                    log.info("bookie %s is still registered by a previous process; waiting for it to expire",
                             info.address)
                time.sleep(0.1)

    def serve_forever(self) -> None:
        """serve_forever serves until SIGTERM or SIGINT, then shuts down cleanly."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stopping.set())
        self.serve()

    def serve(self) -> None:
        """serve runs the request loop on this thread until `stop()`."""
        log.info("bookie %s serving (storage %s, metadata %s)", self.address, self.config.storage,
                 self.config.metadata)
        self._gc_thread.start()
        sock, service, config = self.socket, self.service, self.config
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        next_gc = time.monotonic() + config.gc_interval_s
        next_parent_check = 0.0
        try:
            while not self._stopping.is_set():
                poller.poll(config.tick_ms)
                for _ in range(config.max_batch_frames):
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK, copy=True)
                    except zmq.Again:
                        break
                    if len(frames) != 2:
                        self._refuse(frames[0], f"expected one frame per message, got {len(frames) - 1}")
                        continue
                    service.receive(frames[0], frames[1])
                service.tick(int(time.monotonic() * 1000))
                while self._deletions:
                    ledger_id = self._deletions.popleft()
                    log.info("garbage collection: deleting ledger %d (no metadata)", ledger_id)
                    service.delete_ledger(ledger_id)
                for peer, frame in service.flush():
                    sock.send_multipart((peer, frame), zmq.NOBLOCK)
                now = time.monotonic()
                if now >= next_gc:
                    next_gc = now + config.gc_interval_s
                    self._gc_candidates.append(list(self.storage.ledgers()))
                if config.parent_pid is not None and now >= next_parent_check:
                    next_parent_check = now + 0.5
                    if os.getppid() != config.parent_pid:
                        log.warning("parent process %d is gone; stopping", config.parent_pid)
                        break
        finally:
            self._shutdown()

    def _refuse(self, peer: bytes, message: str) -> None:
        frame = encode_responses([ErrorResponse(txn=0, status=Status.BAD_REQUEST, message=message)])
        self.socket.send_multipart((peer, frame), zmq.NOBLOCK)

    def stop(self) -> None:
        """stop asks the serving loop to finish; it deregisters and closes storage."""
        self._stopping.set()

    def _shutdown(self) -> None:
        for action in (self._registration.close, self.metadata.close, self.storage.close, self.socket.close):
            try:
                action()
            except Exception as exc:  # noqa: BLE001 - shut down as much as possible
                log.warning("shutdown step failed: %s", exc)
        log.info("bookie %s stopped", self.address)

    def _gc_loop(self) -> None:
        """_gc_loop checks candidate ledgers against the metadata, off the serving thread."""
        while not self._stopping.wait(0.05):
            if not self._gc_candidates:
                continue
            for ledger_id in self._gc_candidates.popleft():
                try:
                    self.metadata.get(ledger_key(ledger_id))
                except NoSuchKey:
                    self._deletions.append(ledger_id)
                except MetadataError as exc:
                    log.warning("garbage collection: keeping ledger %d, metadata unreadable: %s", ledger_id, exc)
                    break
