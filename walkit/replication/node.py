"""walkit.replication.node runs one member of a replicated state machine: the WAL a database embeds.

Life of a node (its role thread):

    start:     load the latest snapshot (restore), then follow the log from its position
    follower:  tail the log and apply every record; campaign for leadership meanwhile
    elected:   stop tailing; open the log (this fences the previous leader's writer); replay it
               from the last applied entry to its end; then accept submissions
    deposed:   an append failed (LedgerFenced: another node opened the log), the metadata
               session was lost, or a read barrier found another writer: stop accepting at once,
               fail what was not appended, resign, and follow again

Records (leader): `submit_async` puts a record in the next batch; batches leave as one log
entry each (walkit.replication.batch) with at most `max_entries_in_flight` entries appended and
not yet acknowledged, so concurrent submitters share entries. An entry is applied only once the
log acknowledged it, in log order, and each submitter gets its record's result. With
`linger_ms`, the batch that follows an acknowledged entry waits (at most that long) until it
holds a record of every submitter that entry answered or that was queued behind it (or fills an
entry: `max_batch_records`, `max_batch_bytes`): the submitters the entry just answered usually
submit again, and without the wait, the few records queued first would leave alone and the
answered ones wait a whole round trip behind them (two groups taking turns, each record
waiting for two entries). Submitters are counted once each (`submit_async(record, submitter)`;
by default each record is a submitter of its own), and when there is only one, nothing waits.
A wait that runs is not pushed back by later acknowledgements. An entry is never larger than the
client's `max_entry_bytes` (walkit.replication.batch.take cuts it before the record that would
take it over), and a record too large for an entry of its own (`max_record_bytes`) is refused at
once with RecordTooLarge: never split, never appended, and the leadership is untouched (an
append that failed would depose the leader, so nothing that cannot fit is ever handed to the
log; DESIGN.md §9). Followers apply
the same entries in the same order from the log, so every node applies every record exactly
once, in log order, also across snapshots, restarts and leader changes (entries at or before
the applied position are skipped).

Everything that touches the machine runs on one apply thread. Snapshots: after
`snapshot_every_records` records, `snapshot_every_bytes` record bytes or `snapshot_every_s`
seconds (leader only), the machine is snapshotted between two entries; the bytes go to a ledger
in the background, the pointer moves forward by CAS, the log is truncated behind it and earlier
snapshot ledgers are deleted (walkit.replication.snapshots). With `retention_s`, the snapshots
and the log needed to rebuild any state of the last `retention_s` seconds are kept (the newest
snapshot taken before the window, and everything after it): point-in-time restores. A node overtaken by truncation
loads the latest snapshot. An application whose log is also its data (a Kafka partition) passes
`keep_log_from`: the log is then truncated only before the earlier of that position and the
snapshot's.

Placement: `campaign_when`, if given, is asked before every campaign round; while it answers
False the node follows without campaigning, so an application can prefer some nodes as leaders
(and `step_down` a leader to hand over to them).

Reads: `read_barrier()` returns once the node applied everything acknowledged before the call.
A leader proves it still leads (its ledger is still the log's last and still OPEN) unless its
lease is valid: `lease_ms` after an append it sent was acknowledged or its leadership was proved.
The lease assumes the metadata session timeout is well above `lease_ms` (the default 1 s
against sessions of 3 s or more); `lease_ms=0` proves leadership on every barrier. A follower
waits until it applied the log's end as of the call: the highest entry the bookies of its last
ledger store, which bounds everything acknowledged.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable

from walkit.core.loglist import Position
from walkit.election import LeaderElection
from walkit.errors import (
    ConfigError, LogTruncated, NoSuchLedger, NoSuchLog, NotLeader, RecordTooLarge, Timeout, WalkitError,
)
from walkit.futures import LightFuture
from walkit.replication import batch
from walkit.replication.machine import StateMachine
from walkit.replication.snapshots import (
    SnapshotPointer, collect_garbage, list_snapshots, load_snapshot, publish, read_pointer, retained, spool,
    write_snapshot,
)

log = logging.getLogger("walkit.replication")

#: How long a campaign waits before the follower refreshes the leader's name and its lag.
CAMPAIGN_SLICE_S = 1.0
#: How often a follower that `campaign_when` holds back asks it again.
GATE_S = 0.2
#: How long to wait before trying again after a leadership or a load failed.
RETRY_S = 0.5
#: The longest `linger_ms` (a minute: a wait is meant to be a fraction of a log round trip).
MAX_LINGER_MS = 60_000
#: The position a node that applied nothing reads from: before any ledger, so truncation shows.
START = Position(0, 0)


def after(position: Position | None) -> Position:
    """after is where reading resumes past `position` (the log's start if None)."""
    return START if position is None else Position(position.ledger_id, position.entry_id + 1)


class _Entry:
    """_Entry is one log entry to apply: its records and, on the leader, their submitters' futures."""

    __slots__ = ("position", "records", "futures", "sent")

    def __init__(self, position: Position, records: list[bytes], futures: list[Future] | None, sent: float = 0.0):
        self.position = position
        self.records = records
        self.futures = futures
        self.sent = sent


class ReplicatedNode:
    """ReplicatedNode is one node of replicated machine `name` (see the module doc); use walkit.replicate.

    `client` is this node's own walkit.Client (the node campaigns through its metadata store, so
    two nodes must not share one). `node_id` names the node to the others (followers report it
    as the leader): a network address clients can reach is a good choice. `max_record_bytes` is
    the largest record `submit` takes (default and most: the client's `max_entry_bytes` less the
    9 bytes an entry spends on a lone record's framing); larger ones are refused, not split.
    """

    def __init__(self, machine: StateMachine, *, client, name: str, node_id: str, password: bytes | str = b"",
                 ensemble: int = 3, write_quorum: int = 2, ack_quorum: int = 2, roll_bytes: int = 64 << 20,
                 roll_entries: int = 0, roll_age_s: float = 0.0, snapshot_every_records: int = 100_000,
                 snapshot_every_bytes: int = 0, snapshot_every_s: float = 0.0, retention_s: float = 0.0,
                 lease_ms: int = 1000, max_batch_records: int = 4096, max_batch_bytes: int = 1 << 20,
                 max_entries_in_flight: int = 8, linger_ms: float = 0.0, poll_s: float = 0.2,
                 max_record_bytes: int | None = None,
                 on_role: Callable[[str], None] | None = None, campaign_when: Callable[[], bool] | None = None,
                 keep_log_from: Callable[[], Position | None] | None = None) -> None:
        if not isinstance(machine, StateMachine):
            raise ConfigError(f"replicate needs a walkit.StateMachine, not {type(machine).__name__}")
        if not isinstance(node_id, str) or not node_id:
            raise ConfigError(f"node_id is a non-empty string, not {node_id!r}")
        for option, value in (("snapshot_every_records", snapshot_every_records), ("lease_ms", lease_ms),
                              ("retention_s", retention_s), ("linger_ms", linger_ms),
                              ("snapshot_every_bytes", snapshot_every_bytes), ("snapshot_every_s", snapshot_every_s)):
            if value < 0:
                raise ConfigError(f"{option} must not be negative, got {value}")
        if not linger_ms <= MAX_LINGER_MS:
            raise ConfigError(f"linger_ms is at most {MAX_LINGER_MS}, got {linger_ms}")
        largest = batch.max_record(client.max_entry_bytes)
        if max_record_bytes is None:
            max_record_bytes = largest
        elif (not isinstance(max_record_bytes, int) or isinstance(max_record_bytes, bool)
              or not 1 <= max_record_bytes <= largest):
            raise ConfigError(f"max_record_bytes is from 1 to {largest} (the client's max_entry_bytes, "
                              f"{client.max_entry_bytes}, less {client.max_entry_bytes - largest} bytes of entry "
                              f"framing), got {max_record_bytes!r}")
        self.machine = machine
        self.client = client
        self.name = name
        self.log_name = f"replicated-{name}"
        self.node_id = node_id
        self.password = password.encode() if isinstance(password, str) else bytes(password)
        self.quorums = dict(ensemble=ensemble, write_quorum=write_quorum, ack_quorum=ack_quorum)
        self.log_options = dict(self.quorums, roll_bytes=roll_bytes, roll_entries=roll_entries,
                                roll_age_s=roll_age_s)
        self.snapshot_every_records = snapshot_every_records
        self.snapshot_every_bytes = snapshot_every_bytes
        self.snapshot_every_s = snapshot_every_s
        self.retention_ms = int(retention_s * 1000)
        self.lease_s = lease_ms / 1000
        self.max_batch_records = max_batch_records
        self.max_batch_bytes = max_batch_bytes
        self.max_record_bytes = max_record_bytes
        self.max_entry_bytes = client.max_entry_bytes
        self.max_entries_in_flight = max_entries_in_flight
        self.linger_s = linger_ms / 1000
        self.poll_s = poll_s
        self.on_role = on_role
        self.campaign_when = campaign_when
        self.keep_log_from = keep_log_from
        self._resigning = threading.Event()
        self.election = LeaderElection(client.store, f"replication/{name}", node_id, on_lost=self._session_lost)
        # applied state (written by the apply thread)
        self._applied: Position | None = None
        self.snapshot_position: Position | None = None
        self.records_applied = 0
        self._applied_cond = threading.Condition()
        # role
        self._lock = threading.Lock()
        self._leading = False
        self._writer = None
        self._leader: str | None = None
        self._ready = threading.Event()
        self._ready_target: Position | None = None
        self._lag: int | None = None
        self._stopping = threading.Event()
        self._deposed = threading.Event()
        self._reading = None                          # the follower's LogReading
        # submissions (leader)
        self._batch: collections.deque[tuple[bytes, Future, object]] = collections.deque()   # record, future, submitter
        self._queued_by: dict[object, int] = {}       # records in the batch per submitter (kept with linger_ms)
        self._batch_bytes = 0
        self._flushing = False
        self._in_flight = 0
        self._linger_target = 0                       # submitters the next entry waits for (see _acked)
        self._linger_until = 0.0                      # ... until then (monotonic); 0: no wait
        self._linger_cond = threading.Condition(self._lock)
        self._last_acked: Position | None = None
        self._lease_until = 0.0
        # snapshots
        self._since_records = 0
        self._since_bytes = 0
        self._since_time = time.monotonic()
        self._snapshotting = False
        self._snapshot_waiters: list[Future] = []
        self._snapshots = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"walkit-snapshot-{name}")
        # threads
        self._apply_queue: queue.Queue = queue.Queue()
        self.failed: BaseException | None = None
        self._apply_thread = threading.Thread(target=self._apply_loop, name=f"walkit-apply-{name}", daemon=True)
        self._role_thread = threading.Thread(target=self._run, name=f"walkit-role-{name}", daemon=True)
        self._linger_thread = (threading.Thread(target=self._linger_loop, name=f"walkit-linger-{name}", daemon=True)
                               if self.linger_s else None)

    def start(self) -> "ReplicatedNode":
        """start starts the node's threads; it returns at once (see `wait_ready`)."""
        self._apply_thread.start()
        self._role_thread.start()
        if self._linger_thread is not None:
            self._linger_thread.start()
        return self

    # -- what the node knows ---------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        """is_leader is True while this node accepts submissions."""
        return self._leading

    @property
    def leader(self) -> str | None:
        """leader is the node id of the current leader, as last known (None while unknown)."""
        return self.node_id if self._leading else self._leader

    @property
    def applied(self) -> Position | None:
        """applied is the Position of the last applied log entry (None before any)."""
        return self._applied

    @property
    def ready(self) -> bool:
        """ready is True once the node applied what the log held when it started (or leads)."""
        return self._ready.is_set()

    @property
    def lag(self) -> int | None:
        """lag is how many log entries a follower has not applied yet (0 on the leader; None if unknown)."""
        return 0 if self._leading else self._lag

    @property
    def lease_valid(self) -> bool:
        """lease_valid is True on a leader whose lease runs (see the module doc): its state is current."""
        return self._leading and time.monotonic() < self._lease_until

    def step_down(self) -> None:
        """step_down makes a leader give up leadership (cleanly, like close) and campaign again later.

        Records in flight complete first. Another node may win the election meanwhile; this
        one waits `RETRY_S` before it campaigns again. Nothing happens on a follower.
        """
        if self._leading:
            self._resigning.set()
            self._depose("asked to step down")

    def _role_changed(self, role: str) -> None:
        if self.on_role is not None:
            try:
                self.on_role(role)
            except Exception:  # noqa: BLE001 - the application's callback must not stop the node
                log.exception("%s: on_role(%r) failed", self.node_id, role)

    def wait_ready(self, timeout: float | None = None) -> None:
        """wait_ready blocks until `ready`; Timeout after `timeout` seconds."""
        if not self._ready.wait(timeout):
            raise Timeout(f"node {self.node_id} of {self.name!r} was not ready within {timeout:g} s")

    # -- submitting -------------------------------------------------------------------------------
    def submit_async(self, record: bytes, submitter: object = None) -> Future:
        """submit_async appends `record` with the next entry; the Future resolves to apply's result.

        `submitter` (hashable) names who submits, for `linger_ms`: the next entry waits for
        submitters, not records, so one that sends many records and then waits for them all (a
        pipelining connection) counts once. None: every record is a submitter of its own.

        It raises NotLeader (with the leader's node id) on a node that is not the leader. A
        submission that fails because leadership was lost may or may not be in the log: the log
        decides, and every node applies it if it is.

        A record over `max_record_bytes` raises RecordTooLarge at once, on any node: it is not
        queued, not appended and not split, and the node's role does not change.
        """
        if not isinstance(record, (bytes, bytearray, memoryview)):
            raise TypeError(f"records are bytes, not {type(record).__name__}")
        record = bytes(record)
        if len(record) > self.max_record_bytes:
            raise RecordTooLarge(
                f"a record of {len(record)} bytes is over the limit of {self.max_record_bytes} bytes of "
                f"replicated machine {self.name!r} (walkit.replicate's max_record_bytes; at most the client's "
                f"max_entry_bytes less {batch.HEADER_BYTES + batch.RECORD_OVERHEAD}); it was refused, not "
                f"appended: records are never split", len(record), self.max_record_bytes,
                "walkit.replicate(max_record_bytes=...)")
        future: Future = LightFuture()
        with self._lock:
            if not self._leading:
                raise NotLeader(f"node {self.node_id} of {self.name!r} is not the leader", self._leader)
            key = future if submitter is None else submitter
            self._batch.append((record, future, key))
            self._batch_bytes += len(record)
            if self.linger_s:
                self._queued_by[key] = self._queued_by.get(key, 0) + 1
            if self._flushing or self._lingering():
                return future
            self._flushing = True
        self._flush()
        return future

    def submit(self, record: bytes, timeout: float | None = None) -> Any:
        """submit submits `record` and waits until it was applied; it returns apply's result.

        It raises what `submit_async` raises (NotLeader, RecordTooLarge) and apply's exception.
        """
        timeout = timeout or self.client.timeout
        try:
            return self.submit_async(record).result(timeout)
        except concurrent.futures.TimeoutError:
            raise Timeout(f"record not applied within {timeout:g} s") from None

    def _flush(self) -> None:
        """_flush appends batches while there are some and the in-flight limit allows (one flusher at a time)."""
        while True:
            with self._lock:
                if (not self._batch or self._in_flight >= self.max_entries_in_flight or not self._leading
                        or self._lingering()):
                    self._flushing = False
                    return
                self._linger_until = 0.0
                taken, size = batch.take(self._batch, self.max_batch_records, self.max_batch_bytes,
                                         self.max_entry_bytes)
                if self.linger_s:
                    counts = self._queued_by
                    for _, _, key in taken:
                        if counts[key] == 1:
                            del counts[key]
                        else:
                            counts[key] -= 1
                self._batch_bytes -= size
                self._in_flight += 1
                writer = self._writer
            records = [r for r, _, _ in taken]
            futures = [f for _, f, _ in taken]
            submitters = {k for _, _, k in taken} if self.linger_s else None
            sent = time.monotonic()
            try:
                appended = writer.append_async(batch.encode(records))
            except RecordTooLarge as exc:     # the client's limit shrank since: nothing was sent
                self._append_failed(futures, exc, depose=False)
                continue
            except WalkitError as exc:
                self._append_failed(futures, exc)
                continue
            appended.add_done_callback(
                lambda f, r=records, fs=futures, t=sent, by=submitters: self._acked(f, r, fs, t, by))

    def _acked(self, appended: Future, records: list[bytes], futures: list[Future], sent: float,
               submitters: set | None = None) -> None:
        """_acked runs on the client's I/O thread, in log order: it hands the entry to the apply thread."""
        error = appended.exception()
        if error is not None:
            self._append_failed(futures, error)
            return
        position = appended.result()
        with self._lock:
            self._in_flight -= 1
            self._last_acked = position
            self._lease_until = max(self._lease_until, sent + self.lease_s)
            if submitters is not None:
                # wait for whoever this entry answered and whoever is queued, each once
                self._linger_target = target = len(submitters.union(self._queued_by))
                if target <= 1:
                    self._linger_until = 0.0
                elif self._linger_until == 0.0:     # one that runs already is not pushed back
                    self._linger_until = time.monotonic() + self.linger_s
                    self._linger_cond.notify()
            flush = bool(self._batch) and not self._flushing and self._leading
            if flush:
                self._flushing = True
        self._apply_queue.put(_Entry(position, records, futures))
        if flush:
            self._flush()

    def _lingering(self) -> bool:
        """_lingering (under the lock) tells whether the next entry still waits for submitters (see linger_ms)."""
        return (self._linger_until != 0.0 and self._short() and time.monotonic() < self._linger_until)

    def _short(self) -> bool:
        """_short (under the lock): the batch has fewer submitters than awaited, and room for more."""
        return (len(self._queued_by) < self._linger_target and len(self._batch) < self.max_batch_records
                and self._batch_bytes < self.max_batch_bytes)

    def _linger_loop(self) -> None:
        """_linger_loop (its own thread, with linger_ms) appends a lingering batch once its time is up."""
        with self._lock:
            while not self._stopping.is_set():
                until = self._linger_until
                if until == 0.0:
                    self._linger_cond.wait()
                    continue
                delay = until - time.monotonic()
                if delay > 0 and self._short():
                    self._linger_cond.wait(delay)
                    continue
                self._linger_until = 0.0
                if not self._batch or self._flushing or not self._leading:
                    continue
                self._flushing = True
                self._lock.release()
                try:
                    self._flush()
                except Exception:  # noqa: BLE001 - this thread must go on; the batch is tried again
                    log.exception("%s: appending a lingering batch failed", self.node_id)
                    with self._lock:
                        self._flushing = False
                finally:
                    self._lock.acquire()

    def _append_failed(self, futures: list[Future], error: BaseException, depose: bool = True) -> None:
        """_append_failed fails an entry's records; with `depose` (it may have reached bookies) the node steps down."""
        with self._lock:
            self._in_flight -= 1
        for future in futures:
            if not future.done():
                future.set_exception(error)
        if depose:
            self._depose(f"an append failed: {type(error).__name__}: {error}")

    # -- reading ----------------------------------------------------------------------------------
    def read_barrier(self, timeout: float | None = None) -> Position | None:
        """read_barrier waits until this node applied every record acknowledged before the call.

        It returns the applied position. On the leader this also proves it still leads (unless
        its lease runs); a leader that finds it was deposed steps down and waits as a follower.
        """
        timeout = timeout or self.client.timeout
        deadline = time.monotonic() + timeout
        if self._leading:
            target = self._last_acked
            if self.lease_valid or self._prove_leadership():
                return self._wait_applied(target, deadline)
        target = self._log_end()
        while True:
            try:
                return self._wait_applied(target, min(deadline, time.monotonic() + 0.5))
            except Timeout:
                if time.monotonic() >= deadline:
                    raise
                target = self._recheck_target(target)

    def _prove_leadership(self) -> bool:
        """_prove_leadership checks that this node's ledger is still the log's last and still OPEN."""
        started = time.monotonic()
        writer = self._writer
        if writer is None:
            return False
        try:
            ledger_id = writer.ledger_id
            last = self.client.log_metadata(self.log_name).ledger_ids[-1]
            state = self.client.ledger_metadata(ledger_id).state
        except WalkitError as exc:
            log.warning("%s: cannot prove leadership: %s", self.node_id, exc)
            return False
        if last == ledger_id and state == "OPEN" and self._leading:
            with self._lock:
                self._lease_until = max(self._lease_until, started + self.lease_s)
            return True
        self._depose(f"ledger {ledger_id} is {state} and the log's last ledger is {last}: another node leads")
        return False

    def _log_end(self, up_to: int | None = None) -> Position | None:
        """_log_end is the position of the last record of the log that may have been acknowledged."""
        try:
            segments = self.client.log_metadata(self.log_name).segments
        except NoSuchLog:
            return None
        for segment in reversed(segments):
            if up_to is not None and segment.ledger_id > up_to:
                continue
            if segment.is_closed:
                last = segment.last_entry_id
            else:
                try:
                    last = self.client.ledger_end(segment.ledger_id)
                except NoSuchLedger:
                    continue
            if last >= 0:
                return Position(segment.ledger_id, last)
        return None

    def _recheck_target(self, target: Position | None) -> Position | None:
        """_recheck_target lowers a barrier's target if its ledger closed before it (its writer died)."""
        if target is None:
            return None
        try:
            metadata = self.client.ledger_metadata(target.ledger_id)
        except NoSuchLedger:
            return None                       # truncated: a snapshot covers it
        except WalkitError:
            return target
        if metadata.state == "CLOSED" and metadata.last_entry_id < target.entry_id:
            if metadata.last_entry_id >= 0:
                return Position(target.ledger_id, metadata.last_entry_id)
            return self._log_end(up_to=target.ledger_id - 1)
        return target

    def _wait_applied(self, target: Position | None, deadline: float) -> Position | None:
        with self._applied_cond:
            while target is not None and (self._applied is None or self._applied < target):
                left = deadline - time.monotonic()
                if left <= 0 or self.failed is not None:
                    raise Timeout(f"node {self.node_id} did not apply up to {target} in time "
                                  f"(applied {self._applied})") from self.failed
                self._applied_cond.wait(left)
            return self._applied

    # -- snapshots --------------------------------------------------------------------------------
    def snapshot_now(self, timeout: float | None = None) -> SnapshotPointer | None:
        """snapshot_now takes a snapshot (on the leader) and returns its pointer once published.

        It returns None if a newer snapshot was published meanwhile; NotLeader on a follower.
        """
        if not self._leading:
            raise NotLeader(f"node {self.node_id} of {self.name!r} is not the leader; snapshots are taken there",
                            self._leader)
        future: Future = Future()
        self._apply_queue.put(("snapshot", future))
        try:
            return future.result(timeout or self.client.timeout)
        except concurrent.futures.TimeoutError:
            raise Timeout("the snapshot was not published in time") from None

    def _snapshot_due(self) -> bool:
        return bool((self.snapshot_every_records and self._since_records >= self.snapshot_every_records)
                    or (self.snapshot_every_bytes and self._since_bytes >= self.snapshot_every_bytes)
                    or (self.snapshot_every_s and self._applied is not None
                        and time.monotonic() - self._since_time >= self.snapshot_every_s))

    def _start_snapshot(self) -> None:
        """_start_snapshot (apply thread) captures the state between two entries and writes it in the background."""
        position, writer = self._applied, self._writer
        if position is None or writer is None or self._snapshotting:
            return
        self._snapshotting = True
        self._since_records = self._since_bytes = 0
        self._since_time = time.monotonic()
        waiters, self._snapshot_waiters = self._snapshot_waiters, []
        out = spool()
        try:
            persist = self.machine.snapshot(out)
        except Exception as exc:  # noqa: BLE001 - the machine's bug; reported, retried later
            log.exception("%s: snapshot of %s failed", self.node_id, self.name)
            self._snapshotting = False
            for future in waiters:
                future.set_exception(exc)
            return
        self._snapshots.submit(self._write_snapshot, out, persist, position, writer, waiters)

    def _write_snapshot(self, out, persist, position: Position, writer, waiters: list[Future]) -> None:
        pointer = None
        error: BaseException | None = None
        try:
            if callable(persist):
                persist()
            written = write_snapshot(self.client, self.name, out, position, password=self.password, **self.quorums)
            replaced = publish(self.client.store, self.name, written)
            if replaced is None:
                self.client.delete_ledger(written.ledger_id)
            else:
                pointer = written
        except Exception as exc:  # noqa: BLE001 - a failed snapshot is tried again later
            error = exc
            log.warning("%s: snapshot at %s failed: %s: %s", self.node_id, position, type(exc).__name__, exc)
        finally:
            out.close()
        if pointer is not None:
            try:
                keep = retained(list_snapshots(self.client, self.name), pointer, self.retention_ms,
                                int(time.time() * 1000))
                collect_garbage(self.client, self.name, keep, pointer)
                before = self._truncation_point(keep.position)
                deleted = writer.truncate(before=before) if before is not None else []
                log.info("%s: snapshot of %s at %s in ledger %d (%d bytes); truncated ledgers %s", self.node_id,
                         self.name, position, pointer.ledger_id, pointer.size, deleted or "none")
            except WalkitError as exc:        # the next snapshot's truncation catches up
                log.info("%s: after the snapshot at %s: %s: %s", self.node_id, position, type(exc).__name__, exc)
        self._apply_queue.put(("snapshot_done", pointer))
        for future in waiters:
            if error is None:
                future.set_result(pointer)
            else:
                future.set_exception(error)

    def _truncation_point(self, position: Position) -> Position | None:
        """_truncation_point is where the log is truncated after a snapshot that keeps it from `position`.

        It is `position` itself, or the earlier of it and what `keep_log_from` says the
        application still reads from the log (None from it: nowhere); never past `position`, so
        every node finds the log from the snapshots it may load on.
        """
        if self.keep_log_from is None:
            return position
        try:
            keep = self.keep_log_from()
        except Exception:  # noqa: BLE001 - the application's callback must not stop snapshots
            log.exception("%s: keep_log_from failed; the log is not truncated", self.node_id)
            return None
        return None if keep is None else min(position, keep)

    def _load_latest(self) -> bool:
        """_load_latest restores the latest snapshot if it is past what was applied; False if there is none."""
        for _ in range(10):
            pointer, _ = read_pointer(self.client.store, self.name)
            if pointer is None:
                return False
            if self._applied is not None and self._applied >= pointer.position:
                return True
            try:
                state = load_snapshot(self.client, pointer, self.password)
            except NoSuchLedger:
                continue                        # replaced by a newer snapshot meanwhile
            done: Future = Future()
            self._apply_queue.put(("restore", pointer, state, done))
            done.result()
            log.info("%s: loaded the snapshot of %s at %s", self.node_id, self.name, pointer.position)
            return True
        raise WalkitError(f"the snapshot of {self.name!r} kept changing while it was loaded")

    # -- the apply thread -----------------------------------------------------------------------------
    def _apply_loop(self) -> None:
        while True:
            item = self._apply_queue.get()
            if item is None:
                return
            try:
                if type(item) is _Entry:
                    self._apply(item)
                else:
                    self._apply_control(item)
            except BaseException as exc:  # noqa: BLE001 - the node cannot go on; readers are told
                log.exception("%s: the apply thread stopped", self.node_id)
                self.failed = exc
                self._stopping.set()
                self._deposed.set()
                with self._applied_cond:
                    self._applied_cond.notify_all()
                return

    def _apply(self, entry: _Entry) -> None:
        position = entry.position
        if self._applied is not None and position <= self._applied:
            for future in entry.futures or ():
                future.set_exception(WalkitError(f"entry {position} was applied already"))
            return
        machine = self.machine
        futures = entry.futures
        size = 0
        for i, record in enumerate(entry.records):
            size += len(record)
            try:
                result, error = machine.apply(record, position), None
            except Exception as exc:  # noqa: BLE001 - deterministic: every node gets the same error
                result, error = None, exc
            if futures is not None:
                if error is None:
                    futures[i].set_result(result)
                else:
                    futures[i].set_exception(error)
        with self._applied_cond:
            self._applied = position
            self.records_applied += len(entry.records)
            self._applied_cond.notify_all()
        self._since_records += len(entry.records)
        self._since_bytes += size
        if self._ready_target is not None and position >= self._ready_target:
            self._ready_target = None
            self._ready.set()
        if self._leading and self._snapshot_due():
            self._start_snapshot()

    def _apply_control(self, item: tuple) -> None:
        kind = item[0]
        if kind == "restore":
            _, pointer, state, done = item
            try:
                if self._applied is None or self._applied < pointer.position:
                    self.machine.restore(state)
                    with self._applied_cond:
                        self._applied = pointer.position
                        self._applied_cond.notify_all()
                self.snapshot_position = pointer.position
            finally:
                state.close()
                done.set_result(None)
        elif kind == "snapshot":
            self._snapshot_waiters.append(item[1])
            if self._leading and not self._snapshotting:
                self._start_snapshot()
        elif kind == "snapshot_done":
            self._snapshotting = False
            if item[1] is not None:
                self.snapshot_position = item[1].position
            if self._snapshot_waiters and self._leading:
                self._start_snapshot()
        elif kind == "call":
            _, fn, done = item
            done.set_result(fn())

    def _on_apply_thread(self, fn: Callable[[], Any] = lambda: None) -> Any:
        """_on_apply_thread runs `fn` after everything queued for the apply thread so far; it waits."""
        done: Future = Future()
        self._apply_queue.put(("call", fn, done))
        while True:
            try:
                return done.result(1.0)
            except concurrent.futures.TimeoutError:
                if self.failed is not None or not self._apply_thread.is_alive():
                    raise WalkitError(f"node {self.node_id}: the apply thread stopped") from self.failed

    # -- the role thread ------------------------------------------------------------------------------
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
                    log.warning("%s: leadership of %s failed: %s: %s", self.node_id, self.name,
                                type(exc).__name__, exc)
                finally:
                    self._step_down()
                self._stopping.wait(RETRY_S)
        except BaseException as exc:  # noqa: BLE001 - reported through `failed`
            log.exception("%s: the node stopped", self.node_id)
            self.failed = exc

    def _load_initial_snapshot(self) -> None:
        while not self._stopping.is_set():
            try:
                self._load_latest()
                return
            except WalkitError as exc:
                log.warning("%s: cannot load the snapshot yet (%s: %s); retrying", self.node_id, type(exc).__name__, exc)
                self._stopping.wait(RETRY_S)

    def _follow_until_elected(self) -> int | None:
        """_follow_until_elected tails the log while campaigning; it returns the epoch won (None when stopping)."""
        tailer = threading.Thread(target=self._tail, name=f"walkit-tail-{self.name}", daemon=True)
        tailer.start()
        try:
            if not self._ready.is_set():
                self._set_ready_target()
            observed = 0.0
            while not self._stopping.is_set():
                if time.monotonic() - observed >= CAMPAIGN_SLICE_S:
                    self._observe()
                    observed = time.monotonic()
                if not self._may_campaign():
                    self._stopping.wait(GATE_S)
                    continue
                try:
                    return self.election.campaign(timeout=CAMPAIGN_SLICE_S)
                except Timeout:
                    continue
                except WalkitError as exc:
                    log.warning("%s: campaign failed: %s: %s", self.node_id, type(exc).__name__, exc)
                    self._stopping.wait(RETRY_S)
            return None
        finally:
            reading = self._reading
            self._tail_stop = True
            if reading is not None:
                reading.close()
            tailer.join(10)
            self._tail_stop = False

    def _may_campaign(self) -> bool:
        """_may_campaign asks the application's `campaign_when` (if any) whether this node may campaign now."""
        if self.campaign_when is None:
            return True
        try:
            return bool(self.campaign_when())
        except Exception:  # noqa: BLE001 - the application's callback must not stop the node
            log.exception("%s: campaign_when failed; campaigning", self.node_id)
            return True

    def _set_ready_target(self) -> None:
        """_set_ready_target makes the node ready once it applied what the log holds now."""
        while not self._stopping.is_set():
            try:
                target = self._log_end()
                break
            except WalkitError as exc:
                log.warning("%s: cannot read the log's end yet: %s", self.node_id, exc)
                self._stopping.wait(RETRY_S)
        else:
            return
        self._on_apply_thread(lambda: self._ready_at(target))

    def _ready_at(self, target: Position | None) -> None:
        if target is None or (self._applied is not None and self._applied >= target):
            self._ready.set()
        else:
            self._ready_target = target

    _tail_stop = False

    def _tail(self) -> None:
        """_tail follows the log and hands every entry to the apply thread, until the role thread stops it."""
        while not self._stopping.is_set() and not self._tail_stop:
            start = after(self._on_apply_thread(lambda: self._applied))
            try:
                self._reading = reading = self.client.read_log(self.log_name, start=start, follow=True,
                                                                password=self.password, poll=self.poll_s)
                if self._tail_stop:
                    reading.close()
                for record in reading:
                    self._apply_queue.put(_Entry(record.position, batch.decode(record.payload), None))
            except LogTruncated as exc:
                log.info("%s: %s; loading the snapshot", self.node_id, exc)
                try:
                    self._load_latest()
                except WalkitError as error:
                    log.warning("%s: loading the snapshot failed: %s", self.node_id, error)
                    self._stopping.wait(RETRY_S)
            except NoSuchLog:
                self._stopping.wait(self.poll_s)             # no leader created the log yet
            except WalkitError as exc:
                if self._tail_stop:
                    return
                log.warning("%s: following the log failed (%s: %s); retrying", self.node_id, type(exc).__name__, exc)
                self._stopping.wait(RETRY_S)

    def _observe(self) -> None:
        """_observe refreshes what a follower reports: the leader's node id and how far behind it is."""
        try:
            leader = self.election.leader()
            self._leader = None if leader == self.node_id else leader
            end = self._log_end()
        except WalkitError as exc:
            log.debug("%s: cannot observe the leader: %s", self.node_id, exc)
            return
        self._lag = self._entries_between(self._applied, end)

    def _entries_between(self, applied: Position | None, end: Position | None) -> int | None:
        if end is None or (applied is not None and applied >= end):
            return 0
        try:
            segments = self.client.log_metadata(self.log_name).segments
        except WalkitError:
            return None
        count = 0
        for segment in segments:
            if segment.ledger_id > end.ledger_id or (applied is not None and segment.ledger_id < applied.ledger_id):
                continue
            top = end.entry_id if segment.ledger_id == end.ledger_id else segment.last_entry_id
            if top is None:
                return None
            first = applied.entry_id + 1 if applied is not None and segment.ledger_id == applied.ledger_id else 0
            count += max(0, top - first + 1)
        return count

    def _lead(self, epoch: int) -> None:
        """_lead opens the log (fencing the previous writer), replays it, then accepts submissions until deposed."""
        self._deposed.clear()
        writer = self.client.open_log(self.log_name, password=self.password, **self.log_options)
        self._writer = writer
        self._replay()
        if not self.election.is_leader or self._deposed.is_set():
            raise WalkitError("the leadership was lost while the log was replayed")
        with self._lock:
            self._leading = True
            self._linger_until = 0.0
            self._last_acked = self._applied
            self._lease_until = time.monotonic() + self.lease_s
        self._leader = self.node_id
        self._ready.set()
        log.info("%s leads %s (epoch %d): applied up to %s", self.node_id, self.name, epoch, self._applied)
        self._role_changed("leader")
        while not self._stopping.is_set() and not self._deposed.is_set():
            self._deposed.wait(1.0)

    def _replay(self) -> None:
        """_replay applies the log from the last applied entry to its end (after open, the log ends here)."""
        while True:
            start = after(self._on_apply_thread(lambda: self._applied))
            try:
                for record in self.client.read_log(self.log_name, start=start, password=self.password):
                    self._apply_queue.put(_Entry(record.position, batch.decode(record.payload), None))
                self._on_apply_thread()
                return
            except LogTruncated as exc:
                log.info("%s: replay: %s; loading the snapshot", self.node_id, exc)
                if not self._load_latest():
                    raise

    def _depose(self, why: str) -> None:
        """_depose stops accepting submissions at once; the role thread steps down."""
        with self._lock:
            leading, self._leading = self._leading, False
        if leading:
            log.warning("%s: stepping down as leader of %s: %s", self.node_id, self.name, why)
        self._deposed.set()

    def _session_lost(self) -> None:
        self._depose("the metadata session was lost")

    def _step_down(self) -> None:
        """_step_down ends a leadership: submissions not appended fail, appended ones end with the log, resign."""
        with self._lock:
            self._leading = False
            pending, self._batch, self._batch_bytes = self._batch, collections.deque(), 0
            self._queued_by = {}
        error = NotLeader(f"node {self.node_id} stopped leading {self.name!r} before the record was appended",
                          self._leader if self._leader != self.node_id else None)
        for _, future, _ in pending:
            future.set_exception(error)
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close(timeout=10)     # appends in flight are acknowledged or fail first
            except WalkitError as exc:
                log.info("%s: closing the log writer: %s: %s", self.node_id, type(exc).__name__, exc)
        self._on_apply_thread()              # every acknowledged entry is applied before following again
        if self._leader == self.node_id:
            self._leader = None
        self.election.resign()
        self._role_changed("follower")
        if self._resigning.is_set():         # let another node win before this one campaigns again
            self._resigning.clear()
            self._stopping.wait(CAMPAIGN_SLICE_S)

    # -- closing ----------------------------------------------------------------------------------
    def close(self, timeout: float = 15.0) -> None:
        """close steps down cleanly (records in flight complete first), stops the threads and resigns."""
        if self._stopping.is_set() and not self._role_thread.is_alive():
            return
        self._stopping.set()
        self._deposed.set()
        with self._lock:
            self._linger_cond.notify_all()
        self._role_thread.join(timeout)
        if self._linger_thread is not None and self._linger_thread.is_alive():
            self._linger_thread.join(timeout)
        self._snapshots.shutdown(wait=True, cancel_futures=True)
        self._apply_queue.put(None)
        self._apply_thread.join(timeout)
        with self._applied_cond:
            self._applied_cond.notify_all()

    def __enter__(self) -> "ReplicatedNode":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
