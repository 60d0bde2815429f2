"""walkit.bookie.server is the bookie process: a ZeroMQ ROUTER socket in front of BookieService.

One thread serves the socket. Each round it takes every frame that is already waiting (up to
`max_batch_frames`), hands them to the service, optionally waits up to `group_wait_ms` for more
adds, lets the service sync storage once for all of them (group commit: one sync covers every
add that arrived while the previous sync ran), then sends the replies. Around that loop:

- garbage collection: a background thread checks the ledgers stored here against the metadata;
  a ledger is deleted only on a positive sign: its deletion marker (walkit.deletions; a
  missing key alone proves nothing, as a wrong or emptied metadata store looks the same), or
  a closed ledger whose fragments no longer name this bookie (re-replicated elsewhere; deleted
  under its replication lock), or an unbounded ledger truncated away from it. A round is
  skipped whole while the store does not hold this bookie's cluster id; a ledger whose
  metadata cannot be read or decoded is kept; an error is logged and the thread goes on.
  Storage is compacted after each round. An unbounded ledger this bookie still holds loses
  its entries below its first entry (truncation moved it; fragment-level deletion,
  docs/internals/protocol.md#truncation), up to the start of its last fragment, through the storage's optional
  `delete_entries` on the serving thread, and the storage is compacted at once;
- read-only mode: past `disk_usage_threshold` of the storage's disk in use, or with less than
  `disk_min_free_mb` free, adds get READ_ONLY and the registration says read-only (new ledgers
  avoid the bookie, writers replace it); below `disk_usage_lwm` with twice that free the bookie
  is writable again; reads are served throughout. A bookie starting on a full disk registers
  read-only. A disk that fills between two checks fails the journal's write (ENOSPC): that is
  a storage failure, as below;
- a storage that fails to sync (StorageError) stops the bookie: its data is intact up to the
  last sync and a restart replays its journal; a storage failure that concerns some ledgers
  only (LedgerStorageError) fails their requests and the bookie serves on;
- security (with `curve_key`): the socket is a CurveZMQ server; a ZAP handler admits only
  clients on the allow-list (watched in the metadata store, so no restart is needed to add or
  revoke one), each frame carries the client's principal, and walkit.bookie.access checks its
  rights on every request's ledger;
- disconnects: a monitor on the ROUTER socket reports closed connections by file descriptor;
  every frame's descriptor (ZMQ_SRCFD) says which peers used it, so the long polls of a client
  that went away are answered (and so dropped) at once;
- metrics and health (with `http_port`): GET /metrics, /health and /ready (walkit.metrics),
  values read from the service's counters when scraped; the registration names the address;
- auto-recovery (with `autorecovery`, the default): an auditor candidate and a replication
  worker run in the process (walkit.autorecovery);
- decommission: while ``autorecovery/decommission/<address>`` exists the bookie is draining:
  read-only (writers replace it at their next add, new ledgers avoid it) until the key goes;
- identity: before it registers, the bookie proves its storage is the disk the cluster knows
  at its address, of this cluster (walkit.bookie.identity, BookKeeper's cookies); an emptied,
  foreign or swapped disk stops it with IdentityError, before it serves, fences or deletes
  anything. Every answer names the disk, and the registration too.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import deque
import shutil

import zmq
from zmq.utils.monitor import recv_monitor_message

from walkit.autorecovery.marks import DECOMMISSION_PREFIX, UnderReplication
from walkit.bookie.config import BookieConfig
from walkit import deletions
from walkit.bookie.identity import DiskIdentity, bookie_id, check_identity, cluster_id
from walkit.bookie.service import BookieService
from walkit.core.messages import ErrorResponse, Status
from walkit.core.metadata import CLOSED, LedgerMetadata, ledger_key
from walkit.advertise import advertised_address, join_host_port, split_host_port
from walkit.errors import (
    ConfigError, MetadataError, MetadataNotAuthorized, NodeExists, NoSuchKey, StorageError, WalkitError,
)
from walkit.metrics import BookieMetrics, HttpEndpoint
from walkit.plugins import open_metadata, open_storage
from walkit.plugins.metadata.credentials import redact
from walkit.registry import BookieInfo, BookieRegistry
from walkit.wire.codec import encode_responses

__all__ = ["BookieConfig", "BookieServer"]

log = logging.getLogger("walkit.bookie")

#: How often the ledger count (a metric) is refreshed, and the decommission key read.
COUNT_INTERVAL_S = 2.0
DECOMMISSION_CHECK_S = 1.0
#: How often a bookie looks at the deletion requests besides their watch (walkit.plugins.metadata.zookeeper_reaper.Reaper).
REAP_SCAN_S = 30.0
#: /health fails once the serving loop has not turned for this long.
HEALTH_STALL_S = 10.0
_MB = 1024 * 1024


class _Security:
    """_Security is what a secured bookie holds: its keys, the allow-list, the ZAP handler, the access checks."""

    def __init__(self, keys, allow_list, authenticator, access) -> None:
        self.keys = keys
        self.allow_list = allow_list
        self.authenticator = authenticator
        self.access = access


class BookieServer:
    """BookieServer runs one bookie until `stop()` (or SIGTERM/SIGINT via `serve_forever`)."""

    def __init__(self, config: BookieConfig) -> None:
        config.validate()
        advertised_address(config.host, config.port or 1, config.advertise, config.metadata, what="the bookie")
        self.config = config                    # ^ refuses an address nobody could dial before touching anything
        self._stopping = threading.Event()
        self.recovery = None
        self._draining = self._want_draining = False
        self._last_round = time.perf_counter()
        self._round_bytes = 0           # bytes received in this serving round (max_batch_bytes)
        self._serving = False
        self.failed: StorageError | None = None
        # (ledger id, its replication lock or None, the adds seen before its metadata was read or None)
        self._deletions: deque[tuple[int, object, int | None]] = deque()
        self._released: deque = deque()                          # locks to release, their deletions synced
        self._gc_candidates: deque[list[int]] = deque()
        self._kept_unmarked: set[int] = set()                   # ledgers kept for want of a deletion marker
        self._trims: deque[tuple[int, int]] = deque()           # (ledger id, drop entries below) for the serving thread
        self._trimmed: dict[int, int] = {}                      # ledger id -> the point queued last (GC thread)
        self._context = zmq.Context.instance()
        self.storage = open_storage(config.storage)
        self.metadata = open_metadata(config.metadata)
        self._security = self._secure(config) if config.curve_key else None
        self.service = BookieService(self.storage, max_frame=config.max_frame_bytes,
                                     max_requests=config.max_requests_per_frame,
                                     max_long_poll_ms=config.max_long_poll_ms, max_long_polls=config.max_long_polls,
                                     access=self._security.access if self._security else None)
        self.socket = self._context.socket(zmq.ROUTER)
        if self._security is not None:
            self.socket.curve_server = True
            self.socket.curve_publickey, self.socket.curve_secretkey = self._security.keys
        self.socket.setsockopt(zmq.LINGER, 0)
        # Frames above max_frame_bytes get BAD_REQUEST; far larger ones make ZeroMQ drop the peer.
        self.socket.setsockopt(zmq.MAXMSGSIZE, 2 * config.max_frame_bytes)
        self.socket.setsockopt(zmq.RCVHWM, 1000)      # per client: then TCP pushes back (see max_batch_bytes)
        self.metrics = BookieMetrics(self)
        self.http = None
        try:
            if config.http_port >= 0:
                self.http = HttpEndpoint(config.host, config.http_port, [self.metrics.registry],
                                         health=self._health, ready=self._ready)
            try:
                if config.port:
                    self.socket.bind(f"tcp://{config.host}:{config.port}")
                    port = config.port
                else:
                    port = self.socket.bind_to_random_port(f"tcp://{config.host}")
            except zmq.ZMQError as exc:
                raise ConfigError(f"cannot listen on {config.host}:{config.port}: {exc.strerror}") from None
            self.endpoint = advertised_address(config.host, port, config.advertise, config.metadata,
                                               what="the bookie")
            # The name ledgers know it by (BP-41): the configured id, the one its storage was
            # formatted with, or on a new storage the address it advertises now.
            self.address = bookie_id(self.storage, config.bookie_id, self.endpoint)
            self._refuse_a_taken_id()
            # Which disk and cluster this storage is, proven before anything is served, fenced
            # or deleted (walkit.bookie.identity); IdentityError stops the bookie here.
            self.identity = check_identity(self.storage, self.metadata, self.address, config.storage,
                                           redact(config.metadata))
            self.service.disk = self.identity.disk
            disk = self._disk_usage()
            if disk is not None and self._disk_full(*disk):
                # A bookie restarted on a full disk must not register writable: its first adds
                # would fail to reach the journal and stop it again.
                self._warn_disk(disk, "read-only from the start")
                self.service.read_only = True
            self._registration = self._register(self._info(self.service.read_only))
            self._reaper = self._start_reaper()
        except BaseException:
            for action in (self.socket.close, self.metadata.close, self.storage.close,
                           self.http.close if self.http is not None else (lambda: None)):
                try:
                    action()
                except Exception:  # noqa: BLE001 - already failing; report the first error
                    pass
            raise
        self._gc_thread = threading.Thread(target=self._gc_loop, name="walkit-bookie-gc", daemon=True)
        self._monitor = self.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._peers_by_fd: dict[int, set[bytes]] = {}
        self._poller = zmq.Poller()
        self._next_gc = self._next_disk_check = self._next_parent_check = self._next_count = 0.0
        self.failed: StorageError | None = None

    def _refuse_a_taken_id(self) -> None:
        """_refuse_a_taken_id stops a bookie whose id another disk holds a registration for.

        Two bookies must not share an id (ledgers would count one's answers as the other's).
        A registration at this same address (no two processes listen on one) or by this same
        disk is a dead predecessor's, waited out by `_register`.
        """
        holder = BookieRegistry(self.metadata).info(self.address)
        if holder is None or holder.disk == 0 or holder.dial == self.endpoint:
            return
        raw = self.storage.identity() if getattr(self.storage, "durable", True) else None
        if raw is not None and DiskIdentity.from_bytes(raw, "the storage").disk == holder.disk:
            return
        raise ConfigError(
            f"bookie id {self.address} is registered by another bookie, at {holder.dial} with disk {holder.disk:x} "
            f"(a running bookie, or one that died less than a session ago): two bookies cannot share an id. Give "
            f"this one its own --bookie-id (and storage); refusing to start")

    def _secure(self, config: BookieConfig) -> "_Security":
        """_secure loads the bookie's keys and starts the ZAP handler that checks the allow-list."""
        from zmq.auth.thread import ThreadAuthenticator

        from walkit.bookie.access import LedgerAccess
        from walkit.security import AllowList, load_keys
        public, secret = load_keys(config.curve_key)
        if secret is None:
            raise ConfigError(f"bookie config: curve_key {config.curve_key!r} holds no secret key; "
                              "use the NAME.key_secret file")
        allow_list = AllowList(self.metadata)
        authenticator = ThreadAuthenticator(self._context)
        authenticator.start()
        authenticator.configure_curve_callback("*", credentials_provider=allow_list)
        authenticator.curve_user_id = lambda raw_key: raw_key.hex()    # frames carry the principal (hex)
        return _Security((public, secret), allow_list, authenticator, LedgerAccess(self.metadata, allow_list))

    def _info(self, read_only: bool) -> BookieInfo:
        public = self._security.keys[0].decode() if self._security else ""
        return BookieInfo(self.address, read_only=read_only, storage=self.config.storage, public_key=public,
                          rack=self.config.rack, draining=self._draining,
                          http=self._http_address(), disk=self.identity.disk, endpoint=self.endpoint)

    def _http_address(self) -> str:
        """_http_address is the metrics endpoint as clients dial it: the advertised host, the port it listens on."""
        if self.http is None:
            return ""
        return join_host_port(split_host_port(self.endpoint)[0], split_host_port(self.http.address)[1])

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
                    holder = registry.info(info.address)
                    raise ConfigError(
                        f"bookie id {info.address} is registered by another process"
                        f"{f' at {holder.dial}' if holder is not None else ''}, still there after "
                        f"{self.config.register_timeout_s:g} s: is it still running, or do two bookies share one "
                        f"--bookie-id (or one storage)? Refusing to start") from None
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
        log.info("bookie %s serving at %s (storage %s, metadata %s)", self.address, self.endpoint,
                 self.config.storage, redact(self.config.metadata))
        self._gc_thread.start()
        if self.config.autorecovery:
            self._start_recovery()
        self._serving = True
        metrics = self.metrics
        held: list = []
        sock, service, config = self.socket, self.service, self.config
        self._poller.register(sock, zmq.POLLIN)
        self._poller.register(self._monitor, zmq.POLLIN)
        self._next_gc = time.monotonic() + config.gc_interval_s
        try:
            while not self._stopping.is_set():
                self._poller.poll(config.tick_ms)
                started = self._last_round = time.perf_counter()
                self._round_bytes = 0
                service.resume()
                self._receive_round()
                self._disconnects()
                if config.group_wait_ms and service.unsynced_entries:
                    self._wait_for_group()
                service.tick(int(time.monotonic() * 1000))
                while self._deletions:
                    ledger_id, lock, writes = self._deletions.popleft()
                    if writes is not None and service.writes.get(ledger_id, 0) != writes:
                        continue                  # an add arrived since: a writer uses this bookie again
                    log.info("garbage collection: deleting ledger %d (%s)", ledger_id,
                             "its deletion marker" if lock is None and writes is None
                             else "not in its ensembles any more")
                    service.delete_ledger(ledger_id)
                    if lock is not None:
                        held.append(lock)
                adds, reads, batch = service.add_replies, service.read_replies, service.unsynced_entries
                flushing = time.perf_counter()
                frames = service.flush()
                metrics.round(started, flushing, batch, service.add_replies - adds, service.read_replies - reads)
                for peer, frame in frames:
                    sock.send_multipart((peer, frame), zmq.NOBLOCK)
                if held:                          # deleted and synced: the GC thread releases the locks
                    self._released.extend(held)
                    held.clear()
                if service.failed is not None:
                    raise service.failed
                if not self._maintain(time.monotonic()):
                    break
        except StorageError as exc:
            log.critical("storage failed, stopping the bookie (a restart replays its journal): %s", exc)
            self.failed = exc
        finally:
            self._shutdown()

    def _receive_round(self) -> int:
        """_receive_round hands waiting frames to the service: up to max_batch_frames, and max_batch_bytes a round."""
        sock, service, peers_by_fd = self.socket, self.service, self._peers_by_fd
        secured = self._security is not None
        count = 0
        budget = self.config.max_batch_bytes
        for count in range(1, self.config.max_batch_frames + 1):
            if self._round_bytes >= budget:
                return count - 1
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return count - 1
            peer = frames[0].bytes
            fd = frames[0].get(zmq.SRCFD)
            peers = peers_by_fd.get(fd)
            if peers is None:
                peers_by_fd[fd] = {peer}
            elif peer not in peers:
                peers.add(peer)
            self._round_bytes += sum(len(f) for f in frames)
            if len(frames) != 2:
                self._refuse(peer, f"expected one frame per message, got {len(frames) - 1}")
                continue
            service.receive(peer, frames[1].buffer, frames[1].get("User-Id") if secured else None)   # read in place
        return count

    def _disconnects(self) -> None:
        """_disconnects answers the long polls of peers whose connection closed."""
        while True:
            try:
                event = recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            for peer in self._peers_by_fd.pop(event["value"], ()):
                self.service.peer_gone(peer)

    def _wait_for_group(self) -> None:
        """_wait_for_group lets more adds join this group commit, for at most group_wait_ms."""
        config, service = self.config, self.service
        deadline = time.monotonic() + config.group_wait_ms / 1000
        while service.unsynced_entries < config.group_max_entries:
            left = deadline - time.monotonic()
            if left <= 0 or not self._poller.poll(left * 1000):
                return
            self._receive_round()

    def _maintain(self, now: float) -> bool:
        """_maintain runs the periodic work; it returns False when the bookie must stop."""
        config = self.config
        if now >= self._next_gc:
            self._next_gc = now + config.gc_interval_s
            self._gc_candidates.append(list(self.storage.ledgers()))
            compact = getattr(self.storage, "compact", None)
            if compact is not None:
                compact()
        if self._trims:
            self._trim()
        if now >= self._next_disk_check:
            self._next_disk_check = now + config.disk_check_interval_s
            self._check_disk()
        if self._want_draining != self._draining:
            self._drain(self._want_draining)
        if now >= self._next_count:
            self._next_count = now + COUNT_INTERVAL_S
            self.metrics.ledgers = sum(1 for _ in self.storage.ledgers())
        if config.parent_pid is not None and now >= self._next_parent_check:
            self._next_parent_check = now + 0.5
            if os.getppid() != config.parent_pid:
                log.warning("parent process %d is gone; stopping", config.parent_pid)
                return False
        return True

    def _disk_usage(self) -> tuple[float, int] | None:
        """_disk_usage is the used fraction and free bytes of the storage's disk (None: no path, or unreadable)."""
        path = getattr(self.storage, "path", None)
        if path is None:
            return None
        try:
            usage = shutil.disk_usage(path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path)))
        except OSError as exc:
            log.warning("cannot read disk usage of %s: %s", path, exc)
            return None
        return (usage.total - usage.free) / usage.total, usage.free

    def _disk_full(self, used: float, free: int) -> bool:
        return used >= self.config.disk_usage_threshold or free < self.config.disk_min_free_mb * _MB

    def _disk_roomy(self, used: float, free: int) -> bool:
        return used < self.config.disk_usage_lwm and free >= 2 * self.config.disk_min_free_mb * _MB

    def _warn_disk(self, disk: tuple[float, int], what: str) -> None:
        used, free = disk
        log.warning("disk %.1f%% full, %.0f MB free (read-only at %.1f%% or under %g MB free): bookie %s is %s",
                    used * 100, free / _MB, self.config.disk_usage_threshold * 100, self.config.disk_min_free_mb,
                    self.address, what)

    def _check_disk(self) -> None:
        """_check_disk switches read-only mode on and off with the disk usage of the storage."""
        disk = self._disk_usage()
        if disk is None:
            return
        used, free = disk
        service = self.service
        if not service.read_only and self._disk_full(used, free):
            self._warn_disk(disk, "read-only")
            self._set_read_only(True)
        elif service.read_only and not self._draining and self._disk_roomy(used, free):
            self._warn_disk(disk, "writable again")
            self._set_read_only(False)

    def _drain(self, draining: bool) -> None:
        """_drain starts or ends a decommission: read-only and flagged while it lasts."""
        self._draining = draining
        if draining:
            log.warning("bookie %s is being decommissioned: read-only while its data moves away", self.address)
            self._set_read_only(True)
        else:
            log.warning("bookie %s is no longer being decommissioned", self.address)
            disk = self._disk_usage()
            if disk is None or self._disk_roomy(*disk):
                self._set_read_only(False)
            else:                                 # the disk checks make it writable once there is room
                self._warn_disk(disk, "still read-only")

    def _set_read_only(self, read_only: bool) -> None:
        self.service.read_only = read_only
        info = self._info(read_only)
        try:
            self._registration.update(info.to_bytes())
        except MetadataError as exc:
            log.warning("could not update the registration of %s: %s", self.address, exc)

    def _refuse(self, peer: bytes, message: str) -> None:
        frame = encode_responses([ErrorResponse(txn=0, status=Status.BAD_REQUEST, message=message)])
        self.socket.send_multipart((peer, frame), zmq.NOBLOCK)

    def stop(self) -> None:
        """stop asks the serving loop to finish; it deregisters and closes storage."""
        self._stopping.set()

    def _shutdown(self) -> None:
        def close_monitor() -> None:
            self.socket.disable_monitor()
            self._monitor.close(linger=0)
        self._serving = False
        actions = [self.recovery.close] if self.recovery is not None else []
        actions.append(self._registration.close)
        if self._reaper is not None:
            actions.append(self._reaper.close)
        if self._security is not None:
            actions += [self._security.access.close, self._security.allow_list.close, self._security.authenticator.stop]
        if self.http is not None:
            actions.append(self.http.close)
        for action in (*actions, self.metadata.close, self.storage.close, close_monitor, self.socket.close):
            try:
                action()
            except Exception as exc:  # noqa: BLE001 - shut down as much as possible
                log.warning("shutdown step failed: %s", exc)
        log.info("bookie %s stopped", self.address)

    def _start_reaper(self):
        """_start_reaper carries out what principals ask of the cluster on a store that has principal identities:
        ZooKeeper's deletions (walkit.plugins.metadata.zookeeper_reaper.Reaper), etcd's creations and deletions
        (walkit.plugins.metadata.etcd_principals.Agent); a store that cannot be watched leaves them to the other
        bookies, and this bookie serves on."""
        if not hasattr(self.metadata, "principal_agent"):
            return None
        try:
            return self.metadata.principal_agent()
        except Exception as exc:  # noqa: BLE001 - principals write what it reads: serving entries comes first
            log.error("deletion requests are not watched by this bookie: %s", exc)
            return None

    def _start_recovery(self) -> None:
        """_start_recovery runs auto-recovery in this process; a failure to start leaves the bookie serving."""
        from walkit.autorecovery import AutoRecovery
        config = self.config.recovery_config()
        if self._security is not None and not os.environ.get("WALKIT_KEY"):
            log.warning("secured bookie without a client key (WALKIT_KEY): its replication worker cannot read "
                        "or write other bookies, so it runs the auditor only; give it a key allowed and granted "
                        "on the ledgers (walkit --key FILE bookie ...) or run `walkit --key FILE autorecovery`")
            config.worker = False
        try:
            self.recovery = AutoRecovery(self.config.metadata, self.address, config).start()
        except Exception as exc:  # noqa: BLE001 - serving entries matters more than auditing
            log.error("auto-recovery did not start: %s", exc)
            return
        self.metrics.registry.register(self.recovery.collector)

    def _health(self) -> tuple[bool, str]:
        """_health is False once the serving loop stopped turning (stuck or failed)."""
        if self.failed is not None or self.service.failed is not None:
            return False, f"storage failed: {self.failed or self.service.failed}"
        stalled = time.perf_counter() - self._last_round
        if self._serving and stalled > HEALTH_STALL_S:
            return False, f"the serving loop has not turned for {stalled:.1f} s"
        return True, "ok"

    def _ready(self) -> tuple[bool, str]:
        """_ready is True while the bookie serves and is registered (read-only bookies serve reads)."""
        healthy, why = self._health()
        if not healthy or not self._serving or self._stopping.is_set():
            return False, why if not healthy else "not serving"
        mode = "draining" if self._draining else "read-only" if self.service.read_only else "writable"
        return True, f"ready ({mode})"

    def _check_decommission(self) -> None:
        """_check_decommission notices the decommission key of this bookie (the serving loop acts)."""
        try:
            self.metadata.get(f"{DECOMMISSION_PREFIX}/{self.address}")
            self._want_draining = True
        except NoSuchKey:
            self._want_draining = False
        except MetadataError as exc:
            log.debug("cannot read the decommission key: %s", exc)

    def _gc_loop(self) -> None:
        """_gc_loop checks candidate ledgers against the metadata, off the serving thread.

        It also looks at this bookie's decommission key every DECOMMISSION_CHECK_S, and at the
        deletion requests principals left every REAP_SCAN_S (walkit.plugins.metadata.zookeeper_reaper.Reaper), if it runs
        one. An error in
        either is logged and the loop goes on: a thread that died here would leave the bookie
        serving with neither garbage collection nor decommissions, and nobody told.
        """
        next_decommission_check = next_reap = 0.0
        while not self._stopping.wait(0.05):
            try:
                if time.monotonic() >= next_decommission_check:
                    next_decommission_check = time.monotonic() + DECOMMISSION_CHECK_S
                    self._check_decommission()
                if self._reaper is not None and time.monotonic() >= next_reap:
                    next_reap = time.monotonic() + REAP_SCAN_S
                    self._reaper.scan()         # requests whose watch event was missed, or that failed before
                if self._gc_candidates:
                    self._collect(self._gc_candidates.popleft())
                while self._released:
                    self._released.popleft().close()
            except Exception:  # noqa: BLE001 - see the docstring
                log.exception("garbage collection or the decommission check failed; going on")

    def _collect(self, ledger_ids: list[int]) -> None:
        """_collect queues for deletion the ledgers whose deletion the metadata proves (one GC round).

        A ledger is dropped only on a positive sign: its deletion marker (walkit.deletions), or a
        closed ledger re-replicated away from this bookie, or an unbounded ledger truncated away
        from it. A missing key alone proves nothing (a wrong or emptied store looks the same), and
        the round is skipped whole if the store no longer holds this bookie's cluster.
        """
        try:
            cluster = cluster_id(self.metadata)
        except MetadataError as exc:
            log.warning("garbage collection: metadata unreadable, skipping this round: %s", exc)
            return
        if cluster != self.identity.cluster:
            log.error("garbage collection skipped: the metadata store holds cluster %s, not this bookie's cluster %s "
                      "(was it replaced, emptied or restored?); nothing is deleted", cluster, self.identity.cluster)
            return
        held = set(ledger_ids)
        self._trimmed = {ledger_id: point for ledger_id, point in self._trimmed.items() if ledger_id in held}
        for ledger_id in ledger_ids:
            writes = self.service.writes.get(ledger_id, 0)      # before the metadata is read
            try:
                value, _ = self.metadata.get(ledger_key(ledger_id))
            except NoSuchKey:
                if deletions.was_deleted(self.metadata, ledger_id):
                    self._deletions.append((ledger_id, None, None))
                elif ledger_id not in self._kept_unmarked:
                    self._kept_unmarked.add(ledger_id)
                    log.warning("garbage collection: ledger %d has no metadata and no deletion marker; keeping its "
                                "data (deleted by a walkit from before deletion markers, or an incomplete store?)",
                                ledger_id)
                continue
            except MetadataNotAuthorized as exc:
                # ZooKeeper's principal mode: a principal shut the cluster out of its own ledger's znode.
                # Its data stays; the other ledgers are collected as usual.
                log.warning("garbage collection: keeping ledger %d, its metadata is shut to this bookie: %s",
                            ledger_id, exc)
                continue
            except MetadataError as exc:
                log.warning("garbage collection: keeping ledger %d, metadata unreadable: %s", ledger_id, exc)
                return
            try:
                metadata = LedgerMetadata.from_bytes(value)
            except (WalkitError, ValueError, TypeError, KeyError) as exc:
                log.warning("garbage collection: keeping ledger %d, its metadata does not decode: %s", ledger_id, exc)
                continue
            try:
                lock = self._over_replicated(ledger_id, metadata)
            except MetadataError as exc:
                log.warning("garbage collection: keeping ledger %d: %s", ledger_id, exc)
                return
            if lock is not None:
                self._deletions.append((ledger_id, lock, None))
            elif self._truncated_away(metadata):
                self._deletions.append((ledger_id, None, writes))
            else:
                point = self._trim_point(metadata)
                if point > self._trimmed.get(ledger_id, 0):
                    self._trimmed[ledger_id] = point
                    self._trims.append((ledger_id, point))

    def _trim_point(self, metadata: LedgerMetadata) -> int:
        """_trim_point is the entry below which this bookie may drop an unbounded ledger's entries (0: none).

        That is the ledger's first entry (truncation moved it), but never past the start of
        its last fragment while it is not closed: a recovery reads from there (walkit.core.
        recovery) and would take an entry dropped there for an absent one, and the fragments
        a writer writes start at or after it. So no add this bookie takes for the ledger can
        be below the point, and no trim waits for adds to stop (unlike a deletion, which
        counts `writes`): the adds of a fenced writer below it store nothing (the storage
        keeps a trim), and its entries there are dirty anyway.
        """
        if not metadata.unbounded or getattr(self.storage, "delete_entries", None) is None:
            return 0
        if metadata.state == CLOSED:
            return metadata.first_entry_id
        return min(metadata.first_entry_id, metadata.last_fragment_start)

    def _trim(self) -> None:
        """_trim drops, on the serving thread, the entries garbage collection found truncated, then compacts.

        The storage's `delete_entries` is buffered; the compaction syncs it before it gives any
        space back (walkit.spi).
        """
        while self._trims:
            ledger_id, before = self._trims.popleft()
            log.info("garbage collection: dropping the entries of ledger %d below %d (truncated)", ledger_id, before)
            self.storage.delete_entries(ledger_id, before)
        compact = getattr(self.storage, "compact", None)
        if compact is not None:
            compact()

    def _truncated_away(self, metadata: LedgerMetadata) -> bool:
        """_truncated_away tells whether this bookie holds an unbounded ledger none of whose fragments name it.

        Truncation dropped the fragments this bookie was in (walkit.Client.truncate_ledger), so
        its copy holds nothing readable. The deletion runs on the serving thread only if no add
        for the ledger arrived since the metadata was read: a writer that put this bookie in a
        new fragment meanwhile keeps what it wrote.
        """
        return metadata.unbounded and metadata.state != CLOSED and self.address not in metadata.bookies

    def _over_replicated(self, ledger_id: int, metadata: LedgerMetadata):
        """_over_replicated returns the ledger's replication lock if this bookie should drop its copy.

        That is a CLOSED ledger whose fragments no longer name this bookie (re-replicated away
        while it was down or draining): the space is given back. The check is made again under
        the ledger's replication lock, which is released only after the deletion synced, so no
        worker can be copying entries of the ledger to this bookie meanwhile; an unclosed ledger
        is never touched (a writer or recoverer may add this bookie to it).
        """
        if metadata.state != CLOSED or self.address in metadata.bookies:
            return None
        lock = UnderReplication(self.metadata).lock(ledger_id, f"gc@{self.address}")
        if lock is None:
            return None                           # a worker is at it: look again next time
        try:
            value, _ = self.metadata.get(ledger_key(ledger_id))
            metadata = LedgerMetadata.from_bytes(value)
        except NoSuchKey:
            if deletions.was_deleted(self.metadata, ledger_id):
                return lock
            lock.close()
            return None
        except BaseException:
            lock.close()
            raise
        if metadata.state == CLOSED and self.address not in metadata.bookies:
            log.info("garbage collection: ledger %d no longer names this bookie; dropping its copy", ledger_id)
            return lock
        lock.close()
        return None
