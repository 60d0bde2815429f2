"""walkit.adapters.kv.membership runs a replica's life on its own thread: follow, campaign, lead, step down.

    follower:  load the snapshot; tail the log from its position (Tailer); campaign
    elected:   stop tailing; open_log (this fences the previous leader's writer); replay the
               log from the last applied entry to its end; then serve writes
    deposed:   an append failed (LedgerFenced: someone else opened the log) or the metadata
               session was lost: the replica already refuses writes; close the writer,
               resign, and follow again

Blocking walkit calls happen here and in the tailer and snapshot threads; the state changes
only on the event loop (replica.py). The candidate id is the server's RESP address, so
followers can tell clients where the leader is.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from typing import Callable

from walkit.election import LeaderElection
from walkit.errors import LogTruncated, NoSuchLedger, NoSuchLog, Timeout, WalkitError
from walkit.adapters.kv.replica import FOLLOWER, PROMOTING, STOPPED, Replica
from walkit.adapters.kv.resp import ReplyError
from walkit.adapters.kv.snapshot import (
    Image, SnapshotPointer, collect_garbage, delete_quietly, load_snapshot, publish, read_pointer, write_snapshot,
)
from walkit.adapters.kv.state import State
from walkit.adapters.kv.tailer import Tailer, read_from

log = logging.getLogger("walkit.adapters.kv")

#: How long a campaign waits before the follower refreshes the leader's name and its lag.
CAMPAIGN_SLICE_S = 1.0
#: How long to wait before campaigning again after a leadership failed.
RETRY_S = 1.0


class Membership:
    """Membership is one server's part in the store `name`: election, tailing, leading and snapshots.

    `new_client()` makes a walkit Client on the store's cluster. `address` is this server's
    RESP address (its candidate id). `log_options` are walkit.LogConfig fields for the log;
    its ensemble and quorums also apply to snapshot ledgers.
    """

    def __init__(self, replica: Replica, new_client: Callable[[], object], *, name: str, address: str,
                 password: bytes = b"", log_options: dict | None = None) -> None:
        self.replica = replica
        self.loop = replica.loop
        self.new_client = new_client
        self.name = name
        self.log_name = f"kv-{name}"
        self.address = address
        self.password = password
        self.log_options = dict(log_options or {})
        self.client = new_client()
        self.election = LeaderElection(self.client.store, f"kv/{name}", address, on_lost=self._on_session_lost)
        self.failed: BaseException | None = None
        self._stopping = threading.Event()
        self._deposed = threading.Event()
        self._writer = None
        self._snapshots = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="walkit-kv-snapshot")
        self._thread = threading.Thread(target=self._run, name="walkit-kv-membership", daemon=True)
        replica._take_snapshot = self._take_snapshot
        replica._on_deposed = lambda error: self._deposed.set()

    def start(self) -> "Membership":
        """start starts the membership thread."""
        self._thread.start()
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """stop steps down cleanly (writes in flight complete first), stops tailing and closes the client."""
        self._stopping.set()
        self._deposed.set()
        self._thread.join(timeout)
        self._snapshots.shutdown(wait=True, cancel_futures=True)
        self.client.close()

    # -- calls into the event loop --------------------------------------------------------
    def _on_loop(self, fn, *args, timeout: float = 30.0):
        """_on_loop runs fn(*args) on the event loop after all work handed to it earlier and returns the result."""
        future: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                future.set_exception(exc)
        self.loop.call_soon_threadsafe(run)
        return future.result(timeout)

    def _set(self, **fields) -> None:
        for key, value in fields.items():
            setattr(self.replica, key, value)

    # -- the role thread --------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._load_initial_snapshot()
            while not self._stopping.is_set():
                epoch = self._follow_until_elected()
                if epoch is None:
                    break
                try:
                    self._lead(epoch)
                except WalkitError as exc:
                    log.warning("leadership failed: %s: %s", type(exc).__name__, exc)
                finally:
                    self._step_down()
                self._stopping.wait(RETRY_S)    # then follow and campaign again
        except BaseException as exc:  # noqa: BLE001 - reported by the server
            log.exception("the replica stopped")
            self.failed = exc

    def _load_initial_snapshot(self) -> None:
        """_load_initial_snapshot installs the current snapshot, retrying while the cluster cannot be reached.

        A snapshot that does not match its header (SnapshotError) stops the replica.
        """
        while not self._stopping.is_set():
            try:
                loaded = self.load_latest(self.client)
            except WalkitError as exc:
                log.warning("cannot load the snapshot yet (%s: %s); retrying", type(exc).__name__, exc)
                self._stopping.wait(RETRY_S)
                continue
            if loaded is not None:
                self._on_loop(self.replica.install, *loaded)
            return

    def _follow_until_elected(self) -> int | None:
        """_follow_until_elected tails the log while campaigning; it returns the epoch won (None when stopping)."""
        start, index = self._on_loop(lambda: (self.replica.next_position, self.replica.index))
        tailer = Tailer(self, start, index).start()
        try:
            while not self._stopping.is_set():
                self._observe()
                try:
                    return self.election.campaign(timeout=CAMPAIGN_SLICE_S)
                except Timeout:
                    continue
                except WalkitError as exc:
                    log.warning("campaign failed: %s: %s", type(exc).__name__, exc)
                    self._stopping.wait(RETRY_S)
            return None
        finally:
            tailer.stop()

    def _observe(self) -> None:
        """_observe refreshes what a follower reports: the leader's address and how far behind it is."""
        try:
            leader = self.election.leader()
            lag = self._lag()
        except WalkitError as exc:
            log.debug("cannot observe the leader: %s", exc)
            return
        if leader == self.address:
            leader = None                       # the lease of this server's previous run, until it expires
        self.loop.call_soon_threadsafe(lambda: self._set(leader=leader, lag_entries=lag))

    def _lag(self) -> int | None:
        """_lag counts the log's entries after the last applied one (None if unknown)."""
        position = self.replica.position
        try:
            segments = self.client.log_metadata(self.log_name).segments
        except NoSuchLog:
            return 0
        if not segments:
            return 0
        last = segments[-1]
        end = last.last_entry_id if last.is_closed else \
            self.client.open_ledger(last.ledger_id, password=self.password).last_add_confirmed
        lag = 0
        for segment in segments:
            if position is not None and segment.ledger_id < position.ledger_id:
                continue
            top = end if segment is last else segment.last_entry_id
            if top is None:
                return None
            here = position is not None and segment.ledger_id == position.ledger_id
            first = position.entry_id + 1 if here else 0
            lag += max(0, top - first + 1)
        return lag

    def _lead(self, epoch: int) -> None:
        """_lead opens the log (fencing the previous writer), replays it, then serves writes until deposed."""
        self._deposed.clear()
        self._on_loop(lambda: self._set(role=PROMOTING, leader=self.address))
        self._writer = self.client.open_log(self.log_name, password=self.password, **self.log_options)
        self._replay()
        if not self.election.is_leader:
            raise WalkitError("the leadership was lost while the log was replayed")
        self._on_loop(self.replica.start_leading, self._writer, epoch, self.address)
        if not self._stopping.is_set():         # stop() sets _deposed too, maybe before the clear() above
            self._deposed.wait()

    def _replay(self) -> None:
        """_replay applies the log from the last applied entry to its end (the log is ours: it ends here)."""
        while True:
            start, index = self._on_loop(lambda: (self.replica.next_position, self.replica.index))
            try:
                batch = []
                for record in read_from(self.client, self.log_name, start, index, follow=False,
                                        password=self.password):
                    batch.append(record)
                    if len(batch) >= 256:
                        self.loop.call_soon_threadsafe(self.replica.apply_log_records, batch)
                        batch = []
                if batch:
                    self.loop.call_soon_threadsafe(self.replica.apply_log_records, batch)
                return
            except LogTruncated as exc:
                log.info("replay: %s; loading the snapshot", exc)
                loaded = self.load_latest(self.client)
                if loaded is None:
                    raise
                self._on_loop(self.replica.install, *loaded)

    def _step_down(self) -> None:
        """_step_down ends a leadership: writes in flight finish (when stopping) or fail, then resign."""
        replica = self.replica
        try:
            if self._stopping.is_set():
                self._on_loop(replica.stop_writes)
                deadline = time.monotonic() + 10
                while self._on_loop(lambda: replica.writes_in_flight) and time.monotonic() < deadline:
                    time.sleep(0.01)
            closing = ReplyError("ERR this server stopped leading; the write may or may not have taken effect")
            self._on_loop(replica.abandon_writes, closing)
            self._on_loop(lambda: self._set(role=STOPPED if self._stopping.is_set() else FOLLOWER))
        except (concurrent.futures.TimeoutError, RuntimeError) as exc:
            log.warning("could not reach the event loop while stepping down: %s", exc)
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close(timeout=5)
            except WalkitError as exc:
                log.info("closing the log writer: %s: %s", type(exc).__name__, exc)
        self.election.resign()

    def _on_session_lost(self) -> None:
        error = WalkitError("the metadata session was lost (leadership is gone)")
        self._deposed.set()
        try:
            self.loop.call_soon_threadsafe(self.replica.lose_leadership, error)
        except RuntimeError:
            pass                                # the loop is closed: the server is gone

    # -- snapshots --------------------------------------------------------------------------
    def load_latest(self, client) -> tuple[State, SnapshotPointer] | None:
        """load_latest loads the snapshot the pointer names (None if there is none yet)."""
        for _ in range(10):
            pointer, _ = read_pointer(client.store, self.name)
            if pointer is None:
                return None
            try:
                state = load_snapshot(client, pointer, self.password)
            except NoSuchLedger:
                continue                        # replaced by a newer snapshot meanwhile
            log.info("loaded snapshot at %s (%d keys)", pointer.position, pointer.keys)
            return state, pointer
        raise WalkitError(f"the snapshot of {self.name!r} kept changing while it was loaded")

    def _take_snapshot(self, image: Image) -> None:
        """_take_snapshot gets a copy of the state on the loop and writes it on the snapshot thread."""
        self._snapshots.submit(self._snapshot, image, self._writer)

    def _snapshot(self, image: Image, writer) -> None:
        pointer = None
        try:
            config = writer.metadata.config
            written = write_snapshot(self.client, self.name, image, ensemble=config.ensemble,
                                     write_quorum=config.write_quorum, ack_quorum=config.ack_quorum,
                                     password=self.password)
            replaced = publish(self.client.store, self.name, written)
            if replaced is None:
                delete_quietly(self.client, written.ledger_id)
            else:
                pointer = written
                collect_garbage(self.client, self.name, written)     # the replaced one, and any leaked
                deleted = writer.truncate(before=image.position)
                log.info("snapshot at %s: %d keys in ledger %d; truncated ledgers %s", image.position,
                         written.keys, written.ledger_id, deleted or "none")
        except Exception as exc:  # noqa: BLE001 - a failed snapshot is retried after the next N records
            log.warning("snapshot at %s failed: %s: %s", image.position, type(exc).__name__, exc)
        try:
            self.loop.call_soon_threadsafe(self.replica.snapshot_done, pointer)
        except RuntimeError:
            pass
