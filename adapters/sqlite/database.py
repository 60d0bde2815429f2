"""walkit.adapters.sqlite.database is one replicated SQLite file in this process: its node and its write lock.

All connections of a process to one file share a Database: the walkit.replicate node whose
state machine (walkit.adapters.sqlite.machine) applies the log to the file, and the lock that
serializes write transactions on the leader, so a transaction is always captured against a
file that applied every transaction committed before it (no changeset can conflict). A
Database also publishes what it knows (role, applied position, lag) in the metadata store
under ``sqlite/<name>/nodes/<node_id>`` for `walkit sqlite status`.
"""

from __future__ import annotations

import concurrent.futures
from concurrent.futures import Future
import json
import logging
import os
import shutil
import socket
import threading
import time
import weakref

import walkit
from walkit.errors import NotLeader as WalkitNotLeader
from walkit.errors import RecordTooLarge, WalkitError

from walkit.adapters.sqlite import adoption, definition, forwarding
from walkit.adapters.sqlite.errors import CommitFailed, NotLeader, ReplicaStopped, TransactionTooLarge
from walkit.adapters.sqlite.machine import SqliteMachine, _show

log = logging.getLogger("walkit.adapters.sqlite")

#: The options of walkit.replicate that an adoption's image ledger is written with too.
ADOPTION_OPTIONS = ("ensemble", "write_quorum", "ack_quorum", "password")
#: How soon an idle leader tells the bookies its last acknowledged entry (walkit.replicate's
#: explicit_lac_ms, 100 there): followers apply a transaction nothing follows this much later,
#: and a forwarded COMMIT waits for it; each idle spell costs one message to each bookie.
EXPLICIT_LAC_MS = 10
#: How often the leader looks whether the adopted image of its database can go (adoption.collect_image).
IMAGE_CHECK_S = 60.0
#: How often a node refreshes what it publishes for `walkit sqlite status`.
STATUS_EVERY_S = 1.0
_registry: dict[str, "Database"] = {}
_registry_lock = threading.Lock()


def status_prefix(name: str) -> str:
    """status_prefix is where the nodes of database `name` publish their status."""
    return f"sqlite/{name}/nodes"


class Database:
    """Database is the node and write lock of one replicated SQLite file (see the module doc).

    `voting=False` makes a replica that never campaigns for leadership (`walkit sqlite replica`).
    `private` is a ":memory:" database: its file's directory and its log are deleted at close.
    """

    def __init__(self, path: str, name: str, *, client, owns_client: bool, node_id: str | None = None,
                 voting: bool = True, options: dict | None = None, timeout: float | None = None,
                 forward_address: str | bool | None = None, adopt: bool = False, private: bool = False) -> None:
        self.path = path
        self.private = private
        self.name = name
        self.client = client
        self.owns_client = owns_client
        self.node_id = node_id or f"{socket.gethostname()}:{os.getpid()}:{os.path.basename(path)}"
        self.voting = voting
        self.write_lock = threading.Lock()
        self.users = 0
        #: The connections of this process to the file (definitions registered later reach them too).
        self.connections: weakref.WeakSet = weakref.WeakSet()
        options = dict(options or {})
        adopting = adopt and adoption.needs_adoption(path)
        if adopting:                                   # its content becomes the first record (AdoptionRefused)
            adoption.adopt(client, path, name, self.node_id,
                           **{key: options[key] for key in ADOPTION_OPTIONS if key in options})
        self.machine = SqliteMachine(path, name, timeout, adopting=adopting)   # MissingFunction: see definition
        self.machine.find_skip = self._find_skip
        self.machine.load_image = adoption.image_loader(client, options.get("password", b""))
        self._applied = threading.Condition()
        self.machine.on_applied = self._on_applied
        options.setdefault("snapshot_every_records", 10_000)
        options.setdefault("explicit_lac_ms", EXPLICIT_LAC_MS)
        if not voting:
            options["campaign_when"] = lambda: False
        self.retention_ms = int(options.get("retention_s", 0) * 1000)
        if self.retention_ms > 0:
            options.setdefault("keep_log_from", self._keep_log_from)
        self.node = walkit.replicate(self.machine, client=client, name=name, node_id=self.node_id, **options)
        #: The Server of forwarded writes (walkit.adapters.sqlite.forwarding), or why there is none (a str).
        try:
            self.forwarding = forwarding.serve(self, forward_address) if voting else "it is a replica: it never leads"
        except BaseException:
            self.node.close()
            self.machine.close()
            raise
        self._stop = threading.Event()
        self._registration = None
        self._publisher = threading.Thread(target=self._publish_loop, name=f"walkit-sqlite-status-{name}", daemon=True)
        self._publisher.start()

    # -- state ----------------------------------------------------------------------------------------
    @property
    def is_leader(self) -> bool:
        """is_leader is True while this node accepts write transactions."""
        return self.node.is_leader

    @property
    def leader(self) -> str | None:
        """leader is the node id of the leader as last known."""
        return self.node.leader

    def check(self) -> None:
        """check raises ReplicaStopped once the file stopped applying the log."""
        if self.machine.failed is not None:
            raise self.machine.failed
        failed = self.node.failed
        if failed is not None:
            error = getattr(failed, "error", None)
            raise error if isinstance(error, ReplicaStopped) else ReplicaStopped(
                f"the node of {self.name!r} stopped: {type(failed).__name__}: {failed}")

    def not_leader(self, why: str | None = None) -> NotLeader:
        """not_leader is the error for a write on this node while it does not lead (`why` the writes cannot be forwarded)."""
        leader = self.node.leader
        where = why or (f"node {leader!r} leads it" if leader else "no leader is known yet")
        return NotLeader(f"cannot write {self.name!r} on node {self.node_id!r}: it is not the leader; {where}",
                         leader)

    def wait_applied(self, at) -> None:
        """wait_applied waits until this file applied the record at position `at` (a write forwarded from here).

        It waits as long as the log takes, as a local COMMIT does; ReplicaStopped if the file
        stopped applying the log. The node is told what it waits for, so a follower that lingers
        (walkit.replicate's follow_linger_ms) reads the log at once.
        """
        try:                                      # said, not waited for (timeout 0): the wait below does that
            self.node.wait_applied(at[:2], timeout=0)     # its entry (a record's position ends with its index)
        except WalkitError:
            pass                                  # not applied yet, or stopped: the wait below says which
        self._wait_committed(at)

    def wait_started(self, timeout: float) -> None:
        """wait_started waits until the node applied what the log held and knows a leader (or `timeout` ran out)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check()
            if self.node.ready and (self.node.leader is not None or not self.voting):
                return
            time.sleep(0.02)

    def _keep_log_from(self):
        """_keep_log_from keeps the whole log while no snapshot is older than the retention window.

        walkit.replicate's retention keeps the oldest snapshot and truncates the log before it
        when none is older than the window, so a restore to a time before the first snapshot
        would find nothing to start from; until a snapshot that old exists, the log from its
        start is the only way to rebuild those states.
        """
        from walkit.replication.snapshots import list_snapshots
        start = int(time.time() * 1000) - self.retention_ms
        older = [s for s in list_snapshots(self.client, self.name) if s.created_ms <= start]
        return older[-1].position if older else None

    # -- committing -----------------------------------------------------------------------------------
    def _on_applied(self, at) -> None:
        with self._applied:
            self._applied.notify_all()

    def _find_skip(self, at) -> bool:
        from walkit.adapters.sqlite.skips import skip_recorded
        return skip_recorded(self.client, self.name, at)

    def submit(self, record: bytes):
        """submit applies `record` as every node will, appends it and waits until this node applied it; it returns
        its position.

        For a transaction that ran on its own connection: the caller holds `write_lock` and
        drained the group (SqliteMachine.drain). First the trial (SqliteMachine.trial): a record
        that does not apply here raises the DB-API error it meets and never reaches the log.
        While this node leads, it waits as long as the log takes. A record over the node's
        `max_record_bytes` raises TransactionTooLarge before anything is sent. On any failure
        what the trial kept applied is rolled back.
        """
        epoch = self._epoch()
        self.check()
        member = self.machine.trial(record, epoch)     # nothing enters the log that the nodes cannot apply
        try:
            future = self._send(member, record)
        except BaseException:
            self.machine.drop(member)
            raise
        return self.finish(member, future)

    def join(self, timeout: float):
        """join makes the caller's transaction a member of the group (SqliteMachine.join); None if the group took
        no member within `timeout` seconds. The caller holds `write_lock`; NotLeader if this node does not lead."""
        return self.machine.join(self._epoch(), timeout)

    def send(self, member, record: bytes) -> Future:
        """send is a member's COMMIT (the caller holds `write_lock`): the trial (SqliteMachine.settle), then the
        append with the group's epoch; the Future resolves once the log has it. See `finish`."""
        self.machine.settle(member, record)
        return self._send(member, record)

    def finish(self, member, future: Future):
        """finish waits (without `write_lock`) for a member's record: in the log, then committed to this file with
        its group; it returns its position. On failure the member is dropped (SqliteMachine.drop)."""
        try:
            at = self._outcome(future)
        except BaseException:
            self.machine.drop(member)
            raise
        if at is not None:
            self._wait_committed(at)
        return at

    def _epoch(self) -> int:
        epoch = self.node.epoch
        if epoch is None:
            raise self.not_leader()
        return epoch

    def _send(self, member, record: bytes) -> Future:
        try:
            self.check()
            member.future = self._append(record, member.epoch)      # one line: sent is sent
        except BaseException:
            self.machine.drop(member)
            raise
        return member.future

    def read_through(self, member) -> None:
        """read_through is the COMMIT of a member that wrote nothing: it read the members before it, so it waits
        (without `write_lock`) until they are in the log and in this file; CommitFailed if one is not."""
        for earlier in member.before:
            try:
                at = self._outcome(earlier.future)
            except (NotLeader, CommitFailed) as exc:
                raise CommitFailed(f"COMMIT failed on node {self.node_id!r}: the transaction read a transaction "
                                   f"committed before it whose record did not reach the log ({exc}); what it read "
                                   f"may not be in the database", self.node.leader) from None
            self._wait_committed(at)

    def _wait_committed(self, at) -> None:
        """_wait_committed waits until this file committed the record at `at` (with its group)."""
        with self._applied:
            while self.machine.position is None or self.machine.position < at:
                self.check()
                self._applied.wait(0.05)

    def _append(self, record: bytes, epoch: int) -> Future:
        try:
            return self.node.submit_async(record, epoch=epoch)
        except WalkitNotLeader:
            raise self.not_leader() from None
        except RecordTooLarge as exc:
            raise TransactionTooLarge(
                f"string or blob too big: COMMIT refused on node {self.node_id!r}: the transaction's record of "
                f"{exc.size} bytes is over the limit of {exc.limit} bytes of {self.name!r} (max_record_bytes, "
                f"a keyword of connect(); at most the walkit.Client's max_entry_bytes less 9); nothing reached the "
                f"log and the transaction was rolled back. Transactions are refused, not split: commit the change "
                f"in smaller transactions", exc.size, exc.limit, "connect(..., max_record_bytes=...)") from None

    def _outcome(self, future: Future):
        while True:
            try:
                return future.result(0.5)
            except concurrent.futures.TimeoutError:
                self.check()
                continue
            except WalkitNotLeader as exc:
                if not exc.maybe_in_log:
                    raise NotLeader(f"COMMIT failed: node {self.node_id!r} stopped leading {self.name!r} before the "
                                    f"transaction reached the log; it was rolled back", exc.leader) from None
                self.check()
                raise CommitFailed(f"COMMIT failed on node {self.node_id!r}: it stopped leading {self.name!r} while the "
                                   f"transaction was on its way to the log; it was rolled back here, and if the log "
                                   f"kept it every node applies it", exc.leader) from None
            except WalkitError as exc:
                self.check()
                raise CommitFailed(f"COMMIT failed on node {self.node_id!r}: the log did not confirm the transaction "
                                   f"({type(exc).__name__}: {exc}); it was rolled back here, and if the log kept it "
                                   f"every node applies it", self.node.leader) from None

    # -- status ---------------------------------------------------------------------------------------
    def describe(self) -> dict:
        """describe is what this node publishes: role, applied position, lag, file."""
        machine = self.machine
        return {"node_id": self.node_id, "role": "leader" if self.node.is_leader else ("follower" if self.voting
                                                                                        else "replica"),
                "leader": self.node.leader, "applied": _show(machine.position) if machine.position else None,
                "commit_ms": machine.commit_ms, "lag": self.node.lag, "file": os.path.abspath(self.path),
                "stopped": str(machine.failed) if machine.failed else None, "updated_ms": int(time.time() * 1000),
                "forwarding": (self.forwarding.address if isinstance(self.forwarding, forwarding.Server)
                               else f"none: {self.forwarding}")}

    def _publish_loop(self) -> None:
        key = f"{status_prefix(self.name)}/{self.node_id.replace('/', '_')}"
        image_checked, image_collected = 0.0, False
        while not self._stop.is_set():
            try:
                value = json.dumps(self.describe()).encode()
                if self._registration is None:
                    self._registration = self.client.store.register(key, value)
                else:
                    self._registration.update(value)
            except Exception as exc:  # noqa: BLE001 - status is best effort; the node goes on
                log.debug("%s: cannot publish the status: %s", self.node_id, exc)
                self._registration = None
            if not image_collected and self.node.is_leader and time.monotonic() - image_checked >= IMAGE_CHECK_S:
                image_checked = time.monotonic()
                try:
                    image_collected = adoption.collect_image(self.client, self.name)
                except WalkitError as exc:     # tried again later
                    log.debug("%s: the adopted image of %r was not collected: %s", self.node_id, self.name, exc)
            self._stop.wait(STATUS_EVERY_S)

    # -- closing --------------------------------------------------------------------------------------
    def close(self) -> None:
        """close stops the node (it steps down cleanly if it leads) and closes the file."""
        self._stop.set()
        if isinstance(self.forwarding, forwarding.Server):
            self.forwarding.close()
        self._publisher.join(5)
        if self._registration is not None:
            try:
                self._registration.close()
            except Exception:  # noqa: BLE001
                pass
        self.node.close()
        self.machine.close()
        if self.private:
            shutil.rmtree(os.path.dirname(self.path), ignore_errors=True)
            try:
                self.client.delete_log(f"replicated-{self.name}")
            except WalkitError as exc:
                log.warning("%s: the log of private database %r was not deleted: %s", self.node_id, self.name, exc)
        if self.owns_client:
            self.client.close()


def _register_everywhere(register) -> None:
    """_register_everywhere registers a definition made after connect on the open databases' connections."""
    with _registry_lock:
        databases = list(_registry.values())
    for database in databases:
        database.machine.register(register)
        for conn in list(database.connections):
            try:
                register(conn._db)
            except Exception as exc:  # noqa: BLE001 - a closed or busy connection keeps what it had
                log.warning("%s: a definition was not registered on a connection: %s", database.name, exc)


definition.listeners.append(_register_everywhere)


def acquire(path: str, name: str, *, client=None, metadata: str | None = None, node_id: str | None = None,
            voting: bool = True, options: dict | None = None, timeout: float | None = None,
            forward_address: str | bool | None = None, adopt: bool = False, private: bool = False) -> Database:
    """acquire returns this process's Database of `path`, starting it on first use (`release` when done).

    The node uses `client`, or a Client of its own on `metadata` (default: the embedded
    cluster under ./walkit-data, or WALKIT_METADATA). `timeout` bounds the wait for another
    program's lock on the file when it is opened.
    """
    key = os.path.realpath(path)
    with _registry_lock:
        database = _registry.get(key)
        if database is None:
            owns = client is None
            if owns:
                from walkit.cli.common import default_metadata
                client = walkit.Client(metadata or os.environ.get("WALKIT_METADATA") or default_metadata())
            try:
                database = Database(path, name, client=client, owns_client=owns, node_id=node_id, voting=voting,
                                    options=options, timeout=timeout, forward_address=forward_address,
                                    adopt=adopt, private=private)
            except BaseException:
                if owns:
                    client.close()
                raise
            _registry[key] = database
        elif database.name != name:
            from walkit.adapters.sqlite.errors import ProgrammingError
            raise ProgrammingError(f"{path} is open here as replicated database {database.name!r}, not {name!r}")
        database.users += 1
        return database


def release(database: Database) -> None:
    """release ends one use of `database`; the last one closes it."""
    with _registry_lock:
        database.users -= 1
        if database.users > 0:
            return
        _registry.pop(os.path.realpath(database.path), None)
    database.close()
