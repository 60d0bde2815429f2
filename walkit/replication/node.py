"""walkit.replication.node runs one member of a replicated state machine: the shell around walkit.core.replica.

Everything a node decides (whether it follows or leads, when it may write after an election,
when its lease lets it answer reads from its own state, which records of an entry are new and
which are a client's retry, the order entries are applied in) is decided by the sans-IO
ReplicaMachine, which the simulator runs under faults (walkit.testing.sim.replica). This module
is its shell:

- the machine runs on the client's I/O thread, as a driver of the client's loop; the log writer
  and reader it runs send their I/O through the same loop, each under an owner of its own;
- the election (walkit.election) runs on a thread of its own: `Campaign` starts it, a win is
  reported as Elected, a lost registration as ElectionLost; the metadata session's state is
  reported as SessionChanged;
- the application's state machine (walkit.StateMachine) runs on one apply thread: ApplyEntry
  is applied there and answered with EntryApplied (asking for a snapshot when one is due);
  SnapshotState takes the state between two entries; LoadSnapshot restores the latest snapshot;
- snapshots are written to ledgers in the background, published, old ones dropped, and the log
  truncated behind them (walkit.replication.snapshots); a snapshot carries the client sessions.

Records (leader): `submit_async` hands a record to the machine, which batches records into
entries (walkit.core.batch; `max_batch_records`, `max_batch_bytes`, at most
`max_entries_in_flight` appended and not yet acknowledged, `linger_ms`: see walkit.replicate)
and applies each entry once the log acknowledged it, in log order. A record over
`max_record_bytes` is refused at once with RecordTooLarge: never split, never appended, and the
leadership is untouched (docs/internals/protocol.md#bounded-requests). A submit may name a client
session (`client`, `seq`): a retry with the same seq is answered with the first application's result
and never applied again (walkit.core.sessions), across leader changes, restarts and snapshots.

Reads: `read_barrier()` returns once this node applied every record acknowledged before the
call (walkit.core.replica: the leader within its lease at once, otherwise after proving it
still leads; a follower once it applied the log's end as of the call). The lease (`lease_ms`)
is safe under partitions given clocks whose rates stay within `max_clock_drift` of real time:
a new leader writes only after any earlier leader's lease ran out (see walkit.core.replica).

Health: a node whose apply thread failed, or whose machine found an entry it cannot apply,
reports it in `failed` / `health` and stops leading; it never skips an entry. A failure the
node retries on its own (the log cannot be read, an append failed) is its `trouble` until it is
over. `status` reports all of it; walkit.metrics.replica_metrics exports it to Prometheus.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable

from walkit import permissions
from walkit.client.loop import Driver, now_ms, wall_ms
from walkit.core import batch
from walkit.core import events as ev
from walkit.core import replicaevents as rev
from walkit.core.batch import MAX_CLIENT_ID, Session
from walkit.core.digest import Digest, master_key, password_check
from walkit.core.loglist import LOG_PREFIX, LogConfig, LogMetadata, Position, log_key
from walkit.core.replica import IDLE_TICK_MS, LEADING, ReplicaConfig, ReplicaMachine, Role
from walkit.core.sessions import DEFAULT_TTL_MS
from walkit.election import LeaderElection
from walkit.errors import (
    ClientClosed, ConfigError, NodeExists, NoSuchKey, NoSuchLedger, NoSuchLog, NotLeader, RecordTooLarge, Timeout,
    WalkitError,
)
from walkit.faults import failpoint
from walkit.futures import LightFuture
from walkit.metrics import replica_metrics
from walkit.replication.machine import StateMachine
from walkit.replication.snapshots import (
    SnapshotPointer, adopt_unindexed, collect_garbage, list_snapshots, load_snapshot_and_sessions, publish,
    read_pointer, retained, spool, write_snapshot,
)
from walkit.spi import SessionState
from walkit.watchhub import watch_shared

log = logging.getLogger("walkit.replication")

#: How long a failed campaign, snapshot load or start-up step waits before it is tried again.
RETRY_S = 0.5
#: How long a step_down holds this node back from campaigning again.
CAMPAIGN_SLICE_S = 1.0
#: How long one campaign call lasts before it is started again (with a new watch).
CAMPAIGN_WAIT_S = 300.0
#: How often a waiting campaign tries again without a watch event (the watch is the usual wake-up).
CAMPAIGN_RECHECK_S = 30.0
#: How often `campaign_when` is asked while it holds the node back (recheck_campaign asks at once).
GATE_S = 1.0
#: How long a follower that applied everything lingers before it asks the bookies for more (follow_linger_ms):
#: what was appended meanwhile then comes in one answer and one read, not one long poll per entry.
FOLLOW_LINGER_MS = 10

#: The longest `linger_ms` (a minute: a wait is meant to be a fraction of a log round trip).
MAX_LINGER_MS = 60_000
#: How long the name of the leader a follower reports is reused before it is read again.
LEADER_CACHE_S = 1.0
#: How long `known_lag` reuses a measure of the lag before it measures again.
LAG_CACHE_S = 1.0
class _Background:
    """_Background is a value read in the background: `get()` answers at once with the last reading
    (`initial` before any) and starts a new read once that one is older than `max_age_s`, one read
    at a time. A node answers its callers' questions with it (a server's event loop among them),
    so a metadata store or bookie that stops answering slows no caller down."""

    def __init__(self, read: Callable[[], Any], max_age_s: float, executor, initial: Any = None) -> None:
        self._read, self.max_age_s, self._executor = read, max_age_s, executor
        self.value, self.read_at = initial, 0.0
        self._lock = threading.Lock()
        self._reading = False

    def get(self) -> Any:
        if time.monotonic() - self.read_at >= self.max_age_s:
            self.refresh()
        return self.value

    def set(self, value: Any) -> None:
        """set records a value learnt another way (it counts as read now)."""
        self.value, self.read_at = value, time.monotonic()

    def refresh(self) -> None:
        """refresh starts a read now, unless one is under way (or the node is closed)."""
        with self._lock:
            if self._reading:
                return
            self._reading = True
        try:
            self._executor.submit(self._run)
        except RuntimeError:                          # the executor was shut down: the node is closed
            self._reading = False

    def _run(self) -> None:
        try:
            self.set(self._read())
        except WalkitError as exc:                    # the last reading stays; the next get reads again
            log.debug("a background read failed: %s: %s", type(exc).__name__, exc)
        finally:
            self._reading = False


class _Sub(Driver):
    """_Sub is the owner of one sub-machine's I/O (the log writer or a reader the node's machine runs)."""

    def __init__(self, node: "ReplicatedNode", key: str) -> None:
        self.node = node
        self.key = key
        self.machine = self

    def step(self, event) -> list:
        core = self.node.core
        now = now_ms()
        core.at(now, wall_ms())
        commands = core.step(rev.From(self.key, event))
        self.node._driver.quiet_until = now + IDLE_TICK_MS if core.quiet() else 0
        self.node._prompt = core.waits_for_applied()
        return commands

    def handle(self, command) -> None:
        self.node._handle(command)

    def fail(self, error: Exception) -> None:
        self.finished = True


class _Driver(Driver):
    """_Driver is the node's main driver on the client's loop: its machine's outcomes go to the node."""

    def __init__(self, node: "ReplicatedNode") -> None:
        self.node = node
        self.machine = self

    def step(self, event) -> list:
        """step feeds the node's machine; a quiet machine is ticked only every IDLE_TICK_MS (or at its Wake)."""
        core = self.node.core
        commands = core.step(event)
        self.quiet_until = core._now + IDLE_TICK_MS if core.quiet() else 0
        self.node._prompt = core.waits_for_applied()
        return commands

    def handle(self, command) -> None:
        self.node._handle(command)

    def fail(self, error: Exception) -> None:
        self.finished = True
        self.node._client_closed(error)


class ReplicatedNode:
    """ReplicatedNode is one node of replicated machine `name` (see the module doc); use walkit.replicate.

    `client` is this node's own walkit.Client (the node campaigns through its metadata store, so
    two nodes must not share one). `node_id` names the node to the others (followers report it
    as the leader): a network address clients can reach is a good choice. `machine` is the
    application's walkit.StateMachine. See walkit.replicate for the options.
    """

    def __init__(self, machine: StateMachine, *, client, name: str, node_id: str, password: bytes | str = b"",
                 ensemble: int = 3, write_quorum: int = 2, ack_quorum: int = 2, roll_bytes: int = 64 << 20,
                 roll_entries: int = 0, roll_age_s: float = 0.0, snapshot_every_records: int = 100_000,
                 snapshot_every_bytes: int = 0, snapshot_every_s: float = 0.0, retention_s: float = 0.0,
                 lease_ms: int = 1000, max_clock_drift: float = 0.05, max_batch_records: int = 4096,
                 max_batch_bytes: int = 1 << 20, max_entries_in_flight: int = 8, linger_ms: float = 0.0,
                 poll_s: float = 0.2, tail_poll_s: float = 30.0, max_record_bytes: int | None = None, session_ttl_s: float = DEFAULT_TTL_MS / 1000,
                 explicit_lac_ms: int = 100, follow_linger_ms: int = FOLLOW_LINGER_MS,
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
        if not 1 <= explicit_lac_ms <= 60_000:
            raise ConfigError(f"explicit_lac_ms is from 1 to 60,000, got {explicit_lac_ms}")
        if not 0 <= follow_linger_ms <= 60_000:
            raise ConfigError(f"follow_linger_ms is from 0 to 60,000, got {follow_linger_ms}")
        if not linger_ms <= MAX_LINGER_MS:
            raise ConfigError(f"linger_ms is at most {MAX_LINGER_MS}, got {linger_ms}")
        if session_ttl_s <= 0:
            raise ConfigError(f"session_ttl_s must be positive, got {session_ttl_s}")
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
        self.snapshot_every_records = snapshot_every_records
        self.snapshot_every_bytes = snapshot_every_bytes
        self.snapshot_every_s = snapshot_every_s
        self.retention_ms = int(retention_s * 1000)
        self.max_record_bytes = max_record_bytes
        self.max_entry_bytes = client.max_entry_bytes
        self.poll_s = poll_s
        self.on_role = on_role
        self.campaign_when = campaign_when
        self.keep_log_from = keep_log_from
        self.config = ReplicaConfig(
            log=LogConfig(roll_bytes=roll_bytes, roll_entries=roll_entries, roll_age_s=roll_age_s, **self.quorums),
            lease_ms=int(lease_ms), max_clock_drift=max_clock_drift, max_batch_records=max_batch_records,
            max_batch_bytes=max_batch_bytes, max_entries_in_flight=max_entries_in_flight, linger_ms=linger_ms,
            max_entry_bytes=client.max_entry_bytes, session_ttl_ms=int(session_ttl_s * 1000),
            poll_ms=max(1, int(poll_s * 1000)), tail_poll_ms=max(1, int(tail_poll_s * 1000)), add_timeout_ms=int(client.add_timeout * 1000),
            read_timeout_ms=int(client.timeout * 1000), explicit_lac_ms=int(explicit_lac_ms),
            follow_linger_ms=int(follow_linger_ms))
        self.election = LeaderElection(client.store, f"replication/{name}", node_id, on_lost=self._election_lost)
        self.core: ReplicaMachine | None = None      # created at start, once the snapshot is loaded
        self._log_known = False                       # the log exists (_ensure_log)
        self._loop = client._loop
        self._tokens = itertools.count(1)
        self._submits: dict[int, Future] = {}
        self._collected: list = []                    # submits not handed to the machine yet
        self._collecting = False                      # a round that takes them is posted
        self._holds = 0                               # hold_submits() not yet released
        self._collect_lock = threading.Lock()
        self._reads: dict[int, Future] = {}
        self._truncations: dict[int, Future] = {}
        self._subs: dict[str, _Sub] = {}
        self._log_watch = None
        self._role = Role.FOLLOWING
        self._epoch: int | None = None               # the epoch of the last RoleChanged (see `epoch`)
        # what INFO, ROLE and READONLY replies tell, read in the background (never on a caller's thread)
        self._background = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix=f"walkit-status-{name}")
        self._leader = _Background(self._read_leader, LEADER_CACHE_S, self._background)
        self._lag = _Background(lambda: self.lag, LAG_CACHE_S, self._background)
        self._ready = threading.Event()
        self._ready_token: int | None = None
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self.failed: BaseException | None = None
        self.unhealthy: str | None = None
        self.trouble: str | None = None           # a failure the node retries now (walkit.core.replica's Trouble)
        self.troubles = 0                         # such failures so far
        # applied state (written by the apply thread)
        self._applied: Position | None = None
        self.snapshot_position: Position | None = None
        self.records_applied = 0
        self._applied_cond = threading.Condition()
        self._since_records = self._since_bytes = 0
        self._since_time = time.monotonic()
        self._snapshotting = False
        self._snapshot_wanted = False
        self._adopted = False                     # adopt_unindexed ran since this node started
        self._snapshot_waiters: list[Future] = []
        self._snapshots = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"walkit-snapshot-{name}")
        # threads
        self._apply_queue: queue.Queue = queue.Queue()
        self._handing: list = []                      # ApplyEntry of a group before its last (I/O thread)
        self._prompt = True                           # the machine waits for EntryApplied (waits_for_applied)
        self._group_applied: list = []                # EntryApplied of a group's entries before its last (apply thread)
        self._apply_thread = threading.Thread(target=self._apply_loop, name=f"walkit-apply-{name}", daemon=True)
        self._campaign_wanted = threading.Event()
        self._campaign_nudge = threading.Event()      # wakes a waiting campaign: look again now
        self._campaign_thread = threading.Thread(target=self._campaign_loop, name=f"walkit-campaign-{name}",
                                                 daemon=True)
        self._start_thread = threading.Thread(target=self._start, name=f"walkit-start-{name}", daemon=True)
        self._role_calls = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"walkit-role-{name}")
        client.store.add_state_listener(self._session_changed)
        replica_metrics().nodes.add(self)

    def start(self) -> "ReplicatedNode":
        """start starts the node's threads; it returns at once (see `wait_ready`)."""
        self._apply_thread.start()
        self._campaign_thread.start()
        self._start_thread.start()
        self._leader.refresh()                        # a follower names its leader from the start
        return self

    # -- what the node knows ---------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        """is_leader is True while this node accepts submissions."""
        return self._role is LEADING

    @property
    def epoch(self) -> int | None:
        """epoch is the election epoch of this node's leadership while it leads (None otherwise).

        A node that leads again later does so in another epoch; see `submit_async`'s `epoch`.
        """
        return self._epoch if self._role is LEADING else None

    @property
    def role(self) -> str:
        """role is what the node does now: FOLLOWING, OPENING, REPLAYING, LEADING, STEPPING_DOWN or STOPPED."""
        return self._role.value

    @property
    def leader(self) -> str | None:
        """leader is the node id of the current leader, as last known (None while unknown).

        It never waits for the metadata store: a reading older than LEADER_CACHE_S is given as it
        is and read again in the background, so a node cut off from its store (a server answering
        ROLE or READONLY on its event loop) still answers at once.
        """
        if self.is_leader:
            return self.node_id
        return self._leader.get()

    def _read_leader(self) -> str | None:
        known = self.election.leader()
        return None if known == self.node_id else known

    @property
    def applied(self) -> Position | None:
        """applied is the Position of the last applied log entry (None before any)."""
        return self._applied

    @property
    def ready(self) -> bool:
        """ready is True once the node applied what the log held when it started (or leads)."""
        return self._ready.is_set()

    @property
    def lease_valid(self) -> bool:
        """lease_valid is True on a leader whose lease runs: its state answers reads (walkit.core.replica)."""
        core = self.core
        return core is not None and core.lease_valid_at(now_ms())    # the clock now, not the machine's last tick

    @property
    def health(self) -> tuple[bool, str]:
        """health is (False, why) once the node cannot go on as it is (its apply failed, or an entry does not decode)."""
        if self.failed is not None:
            return False, f"the apply thread failed: {type(self.failed).__name__}: {self.failed}"
        if self.unhealthy is not None:
            return False, self.unhealthy
        return True, "ok"

    @property
    def status(self) -> dict:
        """status says what the node does and whether it can: what INFO, /health and `walkit` tools report.

        `healthy` False (with `why`) means the node cannot go on as it is and needs an operator;
        `trouble` names a failure it retries on its own now (the log unreadable, an append that
        failed), None when there is none.
        """
        healthy, why = self.health
        return {"name": self.name, "node_id": self.node_id, "role": self.role, "leader": self.leader,
                "ready": self.ready, "applied": None if self._applied is None else str(self._applied),
                "records_applied": self.records_applied, "healthy": healthy, "why": None if healthy else why,
                "trouble": self.trouble, "troubles": self.troubles,
                "snapshot": None if self.snapshot_position is None else str(self.snapshot_position)}

    @property
    def ledger_id(self) -> int | None:
        """ledger_id is the ledger this leader appends to now (None on a follower)."""
        core = self.core
        writer = core._subs.get(core._writer_key) if core is not None and core._writer_key else None
        return None if writer is None else writer.ledger_id

    @property
    def lag(self) -> int | None:
        """lag is how many log entries this follower has not applied yet (0 on the leader; None if unknown).

        It reads the log's end from the metadata store and a bookie, so it waits for them; a
        server answering on its event loop uses `known_lag`.
        """
        if self.is_leader:
            return 0
        try:
            end = self._log_end()
            return self._entries_between(self._applied, end)
        except WalkitError:
            return None

    @property
    def known_lag(self) -> int | None:
        """known_lag is `lag` as last measured, at most about LAG_CACHE_S old; it never waits (None
        before the first measure, and while the log's end cannot be read)."""
        if self.is_leader:
            return 0
        return self._lag.get()

    def wait_ready(self, timeout: float | None = None) -> None:
        """wait_ready blocks until `ready`; Timeout after `timeout` seconds."""
        if not self._ready.wait(timeout):
            raise Timeout(f"node {self.node_id} of {self.name!r} was not ready within {timeout:g} s")

    def step_down(self) -> None:
        """step_down makes a leader give up leadership (cleanly, like close) and campaign again later.

        Records in flight complete first. Another node may win the election meanwhile; this
        one waits `CAMPAIGN_SLICE_S` before it campaigns again. Nothing happens on a follower.
        """
        if self.is_leader:
            self._hold_campaign_until = time.monotonic() + CAMPAIGN_SLICE_S
            self._post(rev.StepDownRequested())

    _hold_campaign_until = 0.0

    # -- submitting -------------------------------------------------------------------------------
    def submit_async(self, record: bytes, submitter: object = None, *, client: str | None = None,
                     seq: int | None = None, epoch: int | None = None) -> Future:
        """submit_async appends `record` with the next entry; the Future resolves to apply's result.

        `submitter` (hashable) names who submits, for `linger_ms`. `client` and `seq` name a
        client session (walkit.core.sessions): `seq` counts the client's records from 1, and a
        retry reuses it; the record is applied once, and every answer to it is the first
        application's result (a StaleSubmit error for a seq below one applied already).
        Without them a submit whose answer was lost may be applied again if retried. `epoch` (an
        `epoch` this node reported) makes the submit conditional on this node still leading in that
        epoch: else NotLeader, and the record is not appended. Within one epoch the node appends
        through one writer, in order, and a failed append ends the epoch; so a record whose
        content depends on earlier records of that epoch still in flight is appended after them,
        or not at all.

        It raises NotLeader (with the leader's node id) on a node that is not the leader. A
        submission that fails because leadership was lost may or may not be in the log: the log
        decides, and every node applies it if it is. A record over `max_record_bytes` raises
        RecordTooLarge at once, on any node: it is not queued, not appended and not split. An
        apply that raises a BaseException stops the node (`failed`); the submit of that record and
        those of the records after it, which this node will not apply, fail with its cause.
        """
        if not isinstance(record, (bytes, bytearray, memoryview)):
            raise TypeError(f"records are bytes, not {type(record).__name__}")
        record = bytes(record)
        session = self._session(client, seq)
        limit = min(self.max_record_bytes, batch.max_record_of(session, self.max_entry_bytes))
        if len(record) > limit:
            raise RecordTooLarge(
                f"a record of {len(record)} bytes is over the limit of {limit} bytes of replicated machine "
                f"{self.name!r} (walkit.replicate's max_record_bytes; at most the client's max_entry_bytes less the "
                f"entry's framing); it was refused, not appended: records are never split", len(record), limit,
                "walkit.replicate(max_record_bytes=...)")
        if not self.is_leader:
            raise NotLeader(f"node {self.node_id} of {self.name!r} is not the leader", self.leader)
        future: Future = LightFuture()
        token = next(self._tokens)
        self._submits[token] = future
        submit = rev.SubmitRequested(token=token, record=record, session=session, submitter=submitter, epoch=epoch)
        with self._collect_lock:
            self._collected.append(submit)
            if self._collecting or self._holds:
                return future
            self._collecting = True
        self._post(self._collected_submits, self._collected_failed)       # one step takes every submit so far
        return future

    def hold_submits(self) -> None:
        """hold_submits keeps the submits made from now on from the I/O thread until `release_submits()`.

        For a caller that submits many records in one go, such as an event loop answering many
        connections in one turn: the records are handed over, and the I/O thread woken, once
        for all of them, not once each (the I/O thread would otherwise take the interpreter's
        lock from the caller for every record). Every thread's submits wait while a hold lasts:
        release it within the turn. Holds nest; closing the node fails what a hold kept.
        """
        with self._collect_lock:
            self._holds += 1

    def release_submits(self) -> None:
        """release_submits ends one `hold_submits()`; after the last, what they kept goes to the I/O thread."""
        with self._collect_lock:
            if self._holds <= 0:
                raise RuntimeError("release_submits() without hold_submits()")
            self._holds -= 1
            if self._holds or self._collecting or not self._collected:
                return
            self._collecting = True
        self._post(self._collected_submits, self._collected_failed)

    def _collected_submits(self) -> rev.SubmitsRequested:
        """_collected_submits (I/O thread) takes the submits collected since the last round: they share entries."""
        with self._collect_lock:
            submits, self._collected, self._collecting = self._collected, [], False
        return rev.SubmitsRequested(submits=submits)

    def _collected_failed(self, error: Exception) -> None:
        for submit in self._collected_submits().submits:
            future = self._submits.pop(submit.token, None)
            if future is not None:
                future.set_exception(error)

    @staticmethod
    def _session(client: str | None, seq: int | None) -> Session | None:
        if client is None and seq is None:
            return None
        if not isinstance(client, str) or not client or len(client.encode()) > MAX_CLIENT_ID:
            raise ConfigError(f"a session's client is a non-empty string of at most {MAX_CLIENT_ID} bytes, "
                              f"got {client!r}")
        if not isinstance(seq, int) or isinstance(seq, bool) or not 1 <= seq < 1 << 64:
            raise ConfigError(f"a session's seq is an integer from 1, got {seq!r}")
        return Session(client, seq)

    def submit(self, record: bytes, timeout: float | None = None, *, client: str | None = None,
               seq: int | None = None) -> Any:
        """submit submits `record` and waits until it was applied; it returns apply's result.

        It raises what `submit_async` raises (NotLeader, RecordTooLarge) and apply's exception.
        `timeout` None waits the client's timeout; 0 does not wait (Timeout unless applied).
        """
        future = self.submit_async(record, client=client, seq=seq)
        timeout = self.client.timeout if timeout is None else timeout
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise Timeout(f"record not applied within {timeout:g} s") from None

    # -- reading ----------------------------------------------------------------------------------
    def read_barrier(self, timeout: float | None = None) -> Position | None:
        """read_barrier waits until this node applied every record acknowledged before the call.

        It returns the applied position. On the leader this also proves it still leads (unless
        its lease runs); a leader that finds it was deposed steps down and waits as a follower.
        `timeout` None waits the client's timeout; 0 does not wait. A node that stopped, or stops
        meanwhile (closed, or its apply failed), raises NotLeader.
        """
        return self._wait_read(None, timeout, "what was acknowledged before the read")

    def wait_applied(self, position: Position, timeout: float | None = None) -> Position | None:
        """wait_applied waits until this node applied the record at `position`, one the caller knows is in the log
        (a write it had the leader make, say), and returns the applied position.

        Unlike read_barrier it proves nothing and looks nothing up: it only waits, on any node, and a
        follower that lingers (`follow_linger_ms`) reads at once. `timeout` None waits the client's
        timeout; 0 does not wait (Timeout unless applied; the follower still reads at once). A node
        that stopped, or stops meanwhile, raises NotLeader.
        """
        position = Position(*position)
        return self._wait_read(position, timeout, str(tuple(position)))

    def _wait_read(self, upto: Position | None, timeout: float | None, what: str) -> Position | None:
        """_wait_read asks the machine for a read (ReadRequested; `upto` as there) and waits for its answer."""
        if self._stopped.is_set():
            raise self._stopped_error()
        timeout = self.client.timeout if timeout is None else timeout
        future: Future = Future()
        token = next(self._tokens)
        self._reads[token] = future
        self._post(rev.ReadRequested(token=token, upto=upto),
                   lambda error: self._reads.pop(token, None) and future.set_exception(error))
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            self._reads.pop(token, None)
            raise Timeout(f"node {self.node_id} did not apply {what} within {timeout:g} s "
                          f"(applied {self._applied})") from self.failed

    # -- the machine on the client's loop -----------------------------------------------------------
    def _post(self, event, on_error: Callable[[Exception], None] | None = None, *, unhurried: bool = False) -> None:
        """_post feeds `event` (or what `event()` returns, on the I/O thread; or each event of a list, in order)
        to the machine."""
        def run() -> None:
            core = self.core
            if core is None:
                if on_error is not None:
                    on_error(NotLeader(f"node {self.node_id} of {self.name!r} has not started", None))
                return
            core.at(now_ms(), wall_ms())
            if type(event) is list:
                for each in event:
                    self._loop.step(self._driver, each)
            else:
                self._loop.step(self._driver, event() if callable(event) else event)
        try:
            if unhurried:
                self._loop.call_unhurried(run)
            else:
                self._loop.call(run)
        except ClientClosed as exc:
            if on_error is not None:
                on_error(exc)

    def _handle(self, command) -> None:
        """_handle carries out one of the machine's commands (on the I/O thread)."""
        kind = type(command)
        if kind is rev.Via:
            sub = self._subs.get(command.key)
            if sub is None:
                sub = self._subs[command.key] = _Sub(self, command.key)
            self._loop.execute(sub, command.commands)
        elif kind is rev.ApplyEntry:
            if command.last and not self._handing:
                self._apply_queue.put(command)
            else:                                     # a group: one hand-over, one wake-up of the apply thread
                self._handing.append(command)
                if command.last:
                    self._apply_queue.put(self._handing)
                    self._handing = []
        elif kind is rev.CompleteSubmit:
            future = self._submits.pop(command.token, None)
            if future is not None:
                if isinstance(command.result, BaseException):
                    future.set_exception(command.result)
                else:
                    future.set_result(command.result)
        elif kind is rev.FailSubmit:
            future = self._submits.pop(command.token, None)
            if future is not None:
                error = command.error
                if isinstance(error, NotLeader) and error.leader is None:
                    error = NotLeader(str(error), self._leader.value, maybe_in_log=error.maybe_in_log)
                future.set_exception(error)
        elif kind is rev.ReadReady:
            if command.token == self._ready_token:
                self._ready.set()
                return
            future = self._reads.pop(command.token, None)
            if future is not None:
                future.set_result(command.applied)
        elif kind is rev.SnapshotState:
            self._apply_queue.put(command)
        elif kind is rev.Truncated:
            future = self._truncations.pop(command.token, None)
            if future is not None:
                if command.error is not None:
                    future.set_exception(command.error)
                else:
                    future.set_result(command.ledger_ids)
        elif kind is rev.LoadSnapshot:
            self._snapshots.submit(self._load_latest)
        elif kind is rev.Campaign:
            self._campaign_wanted.set()
        elif kind is rev.Resign:
            self._campaign_wanted.clear()
            self._campaign_nudge.set()
            self._role_calls.submit(self.election.resign)
        elif kind is rev.RoleChanged:
            if command.why:
                log.warning("%s: %s %s: %s", self.node_id, command.role.lower().replace("_", " "), self.name,
                            command.why)
            self._role_changed(Role(command.role), command.epoch)
        elif kind is rev.AppendsDone:
            metrics = self.client.metrics
            now = now_ms()
            metrics.appends += len(command.sent_ms)
            metrics.failures += command.failed
            for sent in command.sent_ms:
                metrics.append_latency.observe(max(0, now - sent) / 1000)
        elif kind is rev.Wake:
            self._driver.quiet_until = min(self._driver.quiet_until, command.at_ms)
            self._loop.tick_at(command.at_ms)
        elif kind is rev.Unhealthy:
            log.error("%s: %s", self.node_id, command.why)
            self.unhealthy = command.why
        elif kind is rev.Trouble:
            if command.why is None:
                log.info("%s: %s is over (%s)", self.node_id, self.trouble, self.name)
            else:
                self.troubles += 1
                log.warning("%s: %s: %s; retrying", self.node_id, self.name, command.why)
            self.trouble = command.why
        elif kind is rev.Stopped:
            self._driver.finished = True
            self._stopped.set()
            self._fail_reads()
        elif kind is ev.Failpoint:
            failpoint(command.name)
        else:
            raise TypeError(f"node {self.node_id} cannot carry out {command!r}")

    def _role_changed(self, role: Role, epoch: int | None) -> None:
        self._epoch = epoch
        previous, self._role = self._role, role
        if role is LEADING:
            self._ready.set()
            self._leader.set(None)                    # `leader` answers node_id while leading
            log.info("%s leads %s (epoch %s): applied up to %s", self.node_id, self.name, self.core.epoch,
                     self._applied)
        elif previous is LEADING:
            self._leader.refresh()
        if self.on_role is not None and (role is LEADING) != (previous is LEADING):
            self._role_calls.submit(self._call_on_role, "leader" if role is LEADING else "follower")

    def _call_on_role(self, role: str) -> None:
        try:
            self.on_role(role)
        except Exception:  # noqa: BLE001 - the application's callback must not stop the node
            log.exception("%s: on_role(%r) failed", self.node_id, role)

    def _session_changed(self, state: SessionState) -> None:
        self._post(rev.SessionChanged(state=state.value))

    def _election_lost(self) -> None:
        self._post(rev.ElectionLost(why="the metadata session was lost"))

    def _stopped_error(self) -> NotLeader:
        """_stopped_error is what a read gets from a stopped node: NotLeader, caused by the apply's failure if one."""
        why = f": its apply failed: {type(self.failed).__name__}: {self.failed}" if self.failed is not None else ""
        error = NotLeader(f"node {self.node_id} of {self.name!r} stopped{why}", None)
        error.__cause__ = self.failed
        return error

    def _fail_reads(self) -> None:
        """_fail_reads answers the reads still waiting when the node stops (its machine drops them): NotLeader."""
        for token, future in list(self._reads.items()):
            self._reads.pop(token, None)
            if not future.done():
                future.set_exception(self._stopped_error())

    def _client_closed(self, error: Exception) -> None:
        for pending in (self._submits, self._reads, self._truncations):
            for future in list(pending.values()):
                if not future.done():
                    future.set_exception(error)
            pending.clear()

    # -- start-up and the campaign ----------------------------------------------------------------------
    def _start(self) -> None:
        """_start loads the latest snapshot, then starts the machine on the client's loop."""
        restored: tuple[Position | None, bytes] = (None, b"")
        while not self._stopping.is_set():
            try:
                restored = self._load(None)
                break
            except WalkitError as exc:
                log.warning("%s: cannot load the snapshot yet (%s: %s); retrying", self.node_id, type(exc).__name__,
                            exc)
                self._stopping.wait(RETRY_S)
        if self._stopping.is_set():
            self._stopped.set()
            return
        position, sessions = restored
        digest_for = {}

        def digest(kind: str) -> Digest:
            if kind not in digest_for:
                digest_for[kind] = Digest(kind, self.password)
            return digest_for[kind]
        self.core = ReplicaMachine(self.name, self.node_id, self.config, master_key=master_key(self.password),
                                   password_check=password_check(self.password), digest_for=digest,
                                   password=self.password, owner=getattr(self.client, "principal", ""),
                                   applied=position, sessions=sessions, now_ms=now_ms(), wall_ms=wall_ms())
        self._driver = _Driver(self)
        self._ready_token = next(self._tokens)
        ready = rev.ReadRequested(token=self._ready_token)

        def attach() -> None:
            self._loop.attach(self._driver, self.core.start())
            self._loop.step(self._driver, ready)
        try:
            self._loop.call(attach)
        except ClientClosed as exc:
            self.failed = exc
            return
        try:          # a roll or a new leader changes the log's metadata: the follower looks at once
            self._log_watch = watch_shared(self.client.store, LOG_PREFIX, log_key(self.log_name),
                                           lambda key: self._post(rev.LogChanged()))
        except WalkitError as exc:    # the reader still looks every tail_poll_s
            log.warning("%s: cannot watch the log's metadata (%s: %s); the follower looks every %g s", self.node_id,
                        type(exc).__name__, exc, self.config.tail_poll_ms / 1000)

    def _campaign_loop(self) -> None:
        """_campaign_loop campaigns whenever the machine asks (Campaign) and reports a win (Elected).

        While another node leads, the campaign waits for the election's watch (trying again every
        CAMPAIGN_RECHECK_S without one); `campaign_when` is asked every GATE_S, or at once after
        `recheck_campaign()`. An idle follower so costs no metadata requests.
        """
        while not self._stopping.is_set():
            self._campaign_wanted.wait()
            if self._stopping.is_set():
                return
            self._campaign_nudge.clear()
            if self._campaign_over():
                self._campaign_nudge.wait(GATE_S)
                continue
            try:
                self._ensure_log()
                epoch = self.election.campaign(timeout=CAMPAIGN_WAIT_S, recheck_s=CAMPAIGN_RECHECK_S,
                                               wake=self._campaign_nudge, give_up=self._campaign_over)
            except Timeout:
                continue
            except WalkitError as exc:
                log.warning("%s: campaign failed: %s: %s", self.node_id, type(exc).__name__, exc)
                self._stopping.wait(RETRY_S)
                continue
            if not self._campaign_wanted.is_set() or self._stopping.is_set():
                self.election.resign()
                continue
            self._campaign_wanted.clear()
            self._post(rev.Elected(epoch=epoch), lambda error: self.election.resign())

    def _ensure_log(self) -> None:
        """_ensure_log creates the name's log (no ledger yet) before the node's first campaign, as its first leader
        would: in ZooKeeper's principal mode the name's other znodes are made from the log's holders."""
        if self._log_known:
            return
        store = self.client.store
        try:
            store.get(log_key(self.log_name))
        except NoSuchKey:
            permissions.check_create(store, self.client.principal, f"log {self.log_name!r}")
            metadata = LogMetadata(name=self.log_name, config=self.config.log, created_ms=wall_ms(),
                                   owner=self.client.principal)
            try:
                store.create(log_key(self.log_name), metadata.to_bytes())
            except NodeExists:
                pass
        self._log_known = True

    def recheck_campaign(self) -> None:
        """recheck_campaign makes a follower ask `campaign_when` again now (its answer may have changed)."""
        self._campaign_nudge.set()

    def _campaign_over(self) -> bool:
        """_campaign_over is True when this node should not campaign now (stopping, told not to, or held back)."""
        return (self._stopping.is_set() or not self._campaign_wanted.is_set()
                or time.monotonic() < self._hold_campaign_until or not self._may_campaign())

    def _may_campaign(self) -> bool:
        """_may_campaign asks the application's `campaign_when` (if any) whether this node may campaign now."""
        if self.campaign_when is None:
            return True
        try:
            return bool(self.campaign_when())
        except Exception:  # noqa: BLE001 - the application's callback must not stop the node
            log.exception("%s: campaign_when failed; campaigning", self.node_id)
            return True

    # -- the apply thread -----------------------------------------------------------------------------
    def _apply_loop(self) -> None:
        while True:
            item = self._apply_queue.get()
            if item is None:
                return
            unapplied = [item]
            try:
                kind = type(item)
                if kind is rev.ApplyEntry:
                    self._apply(item)
                elif kind is list:                    # a group of ApplyEntry, in order
                    for index, command in enumerate(item):
                        unapplied = item[index:]
                        self._apply(command)
                elif kind is rev.SnapshotState:
                    self._start_snapshot(item.position, item.sessions)
                else:
                    item()
            except BaseException as exc:  # noqa: BLE001 - the node cannot go on; readers are told
                log.exception("%s: the apply thread stopped", self.node_id)
                self.failed = exc
                self._fail_unapplied(unapplied, exc)
                applied, self._group_applied = self._group_applied, []   # its group's entries before it were applied
                self._post(applied + [rev.StopRequested()])
                with self._applied_cond:
                    self._applied_cond.notify_all()
                return

    def _fail_unapplied(self, current: list, exc: BaseException) -> None:
        """_fail_unapplied answers the submits of the entry the apply thread stopped in, and of the entries
        queued after it, with what stopped it: this node will not apply them (they are in the log)."""
        error = exc if isinstance(exc, Exception) else exc.__cause__
        if not isinstance(error, Exception):
            error = NotLeader(f"node {self.node_id} of {self.name!r} stopped: its apply failed: "
                              f"{type(exc).__name__}: {exc}", None, maybe_in_log=True)
        items = list(current)
        while True:
            try:
                item = self._apply_queue.get_nowait()
            except queue.Empty:
                break
            items += item if type(item) is list else [item]
        for item in items:
            if type(item) is rev.ApplyEntry and item.tokens is not None:
                for token in item.tokens:
                    future = self._submits.pop(token, None) if token is not None else None
                    if future is not None and not future.done():
                        future.set_exception(error)

    def _apply(self, command: rev.ApplyEntry) -> None:
        position = command.position
        machine = self.machine
        results = []
        size = 0
        tokens = command.tokens
        submits = self._submits
        for index, record in enumerate(command.records):
            size += len(record)
            try:
                result, error = machine.apply(record, position), None
            except Exception as exc:  # noqa: BLE001 - deterministic: every node gets the same error
                result, error = exc, exc
            results.append(result)
            future = submits.pop(tokens[index], None) if tokens is not None and tokens[index] is not None else None
            if future is not None:            # answered now: its callbacks see the state up to this record
                if error is None:
                    future.set_result(result)
                else:
                    future.set_exception(error)
        with self._applied_cond:
            self._applied = position
            self.records_applied += len(command.records)
            self._applied_cond.notify_all()
        self._since_records += len(command.records)
        self._since_bytes += size
        snapshot = (command.last and self.is_leader and not self._snapshotting
                    and (self._snapshot_wanted or self._snapshot_due()))
        if snapshot:
            self._snapshotting = True
            self._snapshot_wanted = False
        applied = rev.EntryApplied(position=position, results=results, snapshot=snapshot)
        if not command.last:                  # more of its group follow: answered together, one wake-up
            self._group_applied.append(applied)
            return
        group, self._group_applied = self._group_applied, []
        self._post(group + [applied] if group else applied, unhurried=not snapshot and not self._prompt)

    # -- snapshots --------------------------------------------------------------------------------
    def snapshot_now(self, timeout: float | None = None) -> SnapshotPointer | None:
        """snapshot_now takes a snapshot (on the leader) and returns its pointer once published.

        It returns None if a newer snapshot was published meanwhile; NotLeader on a follower.
        """
        if not self.is_leader:
            raise NotLeader(f"node {self.node_id} of {self.name!r} is not the leader; snapshots are taken there",
                            self.leader)
        future: Future = Future()

        def ask() -> None:
            self._snapshot_waiters.append(future)
            if not self._snapshotting:
                self._snapshotting = True
                self._post(rev.SnapshotRequested())
        self._apply_queue.put(ask)
        try:
            return future.result(self.client.timeout if timeout is None else timeout)
        except concurrent.futures.TimeoutError:
            raise Timeout("the snapshot was not published in time") from None

    def _snapshot_due(self) -> bool:
        return bool((self.snapshot_every_records and self._since_records >= self.snapshot_every_records)
                    or (self.snapshot_every_bytes and self._since_bytes >= self.snapshot_every_bytes)
                    or (self.snapshot_every_s and self._applied is not None
                        and time.monotonic() - self._since_time >= self.snapshot_every_s))

    def _start_snapshot(self, position: Position, sessions: bytes) -> None:
        """_start_snapshot (apply thread) captures the state between two entries and writes it in the background."""
        waiters, self._snapshot_waiters = self._snapshot_waiters, []
        if position is None or position != self._applied:
            self._snapshotting = False
            for future in waiters:
                future.set_result(None)
            return
        self._since_records = self._since_bytes = 0
        self._since_time = time.monotonic()
        out = spool()
        try:
            persist = self.machine.snapshot(out)
        except Exception as exc:  # noqa: BLE001 - the machine's bug; reported, retried later
            log.exception("%s: snapshot of %s failed", self.node_id, self.name)
            self._snapshotting = False
            for future in waiters:
                future.set_exception(exc)
            return
        self._snapshots.submit(self._write_snapshot, out, persist, position, sessions, waiters)

    def _write_snapshot(self, out, persist, position: Position, sessions: bytes, waiters: list[Future]) -> None:
        pointer = None
        error: BaseException | None = None
        try:
            if callable(persist):
                persist()
            written = write_snapshot(self.client, self.name, out, position, sessions=sessions, password=self.password,
                                     **self.quorums)
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
                if not self._adopted:              # once per start: snapshots nobody indexed (see snapshots.py)
                    adopt_unindexed(self.client, self.name)
                    self._adopted = True
                keep = retained(list_snapshots(self.client, self.name), pointer, self.retention_ms, wall_ms())
                collect_garbage(self.client, self.name, keep, pointer)
                before = self._truncation_point(keep.position)
                if before is not None:
                    self._truncate(before)
                log.info("%s: snapshot of %s at %s in ledger %d (%d bytes)", self.node_id, self.name, position,
                         pointer.ledger_id, pointer.size)
            except WalkitError as exc:        # the next snapshot's truncation catches up
                log.info("%s: after the snapshot at %s: %s: %s", self.node_id, position, type(exc).__name__, exc)

        def done() -> None:
            self._snapshotting = False
            if pointer is not None:
                self.snapshot_position = pointer.position
            for future in waiters:
                if error is None:
                    future.set_result(pointer)
                else:
                    future.set_exception(error)
            if self._snapshot_waiters and self.is_leader:
                self._snapshotting = True
                self._post(rev.SnapshotRequested())
        self._apply_queue.put(done)

    def _truncate(self, before: Position) -> tuple[int, ...]:
        """_truncate has the leader truncate the log before `before` and waits for it; it returns the ledgers dropped."""
        future: Future = Future()
        token = next(self._tokens)
        self._truncations[token] = future
        self._post(rev.TruncateRequested(before=before, token=token),
                   lambda error: self._truncations.pop(token, None) and future.set_exception(error))
        try:
            return future.result(self.client.timeout)
        except concurrent.futures.TimeoutError:
            self._truncations.pop(token, None)
            raise Timeout(f"the log was not truncated before {before} in time") from None

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

    def _load(self, applied: Position | None) -> tuple[Position | None, bytes]:
        """_load restores the latest snapshot if it is past `applied`; it returns (its position, its sessions)."""
        for _ in range(10):
            pointer, _ = read_pointer(self.client.store, self.name)
            if pointer is None:
                return applied, b""
            if applied is not None and applied >= pointer.position:
                return applied, b""
            try:
                state, sessions = load_snapshot_and_sessions(self.client, pointer, self.password)
            except NoSuchLedger:
                continue                        # replaced by a newer snapshot meanwhile
            try:
                self.machine.restore(state)
            finally:
                state.close()
            with self._applied_cond:
                self._applied = pointer.position
                self._applied_cond.notify_all()
            self.snapshot_position = pointer.position
            log.info("%s: loaded the snapshot of %s at %s", self.node_id, self.name, pointer.position)
            return pointer.position, sessions
        raise WalkitError(f"the snapshot of {self.name!r} kept changing while it was loaded")

    def _load_latest(self) -> None:
        """_load_latest (LoadSnapshot) restores the latest snapshot on the apply thread and tells the machine."""
        done: Future = Future()

        def restore() -> None:
            try:
                position, sessions = self._load(self._applied)
            except Exception as exc:  # noqa: BLE001 - reported to the machine, which asks again later
                log.warning("%s: loading the snapshot failed: %s: %s", self.node_id, type(exc).__name__, exc)
                self._post(rev.RestoreFailed(error=exc))
            else:
                self._post(rev.Restored(position=position, sessions=sessions) if position is not None
                           else rev.RestoreFailed(error=WalkitError("there is no snapshot to load")))
            done.set_result(None)
        self._apply_queue.put(restore)

    # -- the log's end (lag) ------------------------------------------------------------------------
    def _log_end(self) -> Position | None:
        """_log_end is the position of the last record of the log that may have been acknowledged."""
        try:
            segments = self.client.log_metadata(self.log_name).segments
        except NoSuchLog:
            return None
        for segment in reversed(segments):
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

    # -- closing ----------------------------------------------------------------------------------
    def close(self, timeout: float = 15.0) -> None:
        """close steps down cleanly (records in flight complete first), stops the threads and resigns."""
        if self._stopping.is_set() and self._stopped.is_set():
            return
        self._stopping.set()
        self._campaign_wanted.set()                   # wakes the campaign thread, which sees _stopping
        self._campaign_nudge.set()
        replica_metrics().nodes.discard(self)
        if self._log_watch is not None:
            self._log_watch.cancel()
        if self.core is not None:
            self._post(rev.StopRequested())
            self._stopped.wait(timeout)
        self._start_thread.join(timeout)
        self._campaign_thread.join(timeout)
        self.election.resign()
        self._snapshots.shutdown(wait=True, cancel_futures=True)
        self._apply_queue.put(None)
        self._apply_thread.join(timeout)
        self._role_calls.shutdown(wait=True)
        self._background.shutdown(wait=False, cancel_futures=True)
        self._client_closed(NotLeader(f"node {self.node_id} of {self.name!r} was closed", None))
        with self._applied_cond:
            self._applied_cond.notify_all()

    def __enter__(self) -> "ReplicatedNode":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
