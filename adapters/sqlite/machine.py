"""walkit.adapters.sqlite.machine is the replicated state machine: a SQLite file that applies transaction records.

Every node, the leader included, applies each record (walkit.adapters.sqlite.records) in its own
SQLite transaction on its "apply" connection: the changesets and schema statements, then the
row of `_walkit_position` naming the record's log position, then COMMIT. So the file and the
position it has applied change together: after a crash the node resumes from the log past that
position, and a record at or before it is skipped, never applied twice. Records submitted
together share a log entry, so a position is (ledger, entry, index of the record in the entry).

Nothing enters the log that the nodes cannot apply: before the leader appends a record, it
applies it here as every node will (a trial: this connection, its setup and the database's
definitions, walkit.adapters.sqlite.definition); a record that fails is rolled back and
refused at the client, one that applies stays in the connection's open transaction until the
log gives it back (then only its position is written) or anything else comes first (then it is
rolled back).

Group commit (the leader only). Write transactions become members of a group: each runs in a
SAVEPOINT of the apply connection's open transaction, on top of the members before it, which
are in the log or on their way there and which no reader sees. A member's statements run on
this connection (`join`, walkit.adapters.sqlite.connection), its COMMIT rolls them back to
its savepoint and applies its record there as every node will (`settle`), and the record goes
to the log with the epoch of the leadership the members before it were appended in (so it is
appended after them by the same writer, or not at all). The next writer joins while it is in
flight. When the log gives a member's record back it is marked applied (`MATCHED`); once any
is, the group takes no new member, and once all are and none runs, the group commits with the
last one's position, in one SQLite COMMIT. A member whose append failed is dropped with every
member after it (their records were computed on its state): their savepoints are rolled back,
and what the log holds of them is applied as any record when it comes. Anything else coming
from the log first (another leader's record, a skip), a definition registered or a restore ends
the group: the members the log gave back are committed, the others rolled back. A transaction
that cannot run here (one that read before it wrote, or a connection with functions, hooks or
settings of its own) waits until no group is open and runs on its own connection
(`drain`, then a group of one made by `trial`). A record that does not apply anyway (a changeset conflict, a failing
statement, a function this node lacks) stops the node with ReplicaStopped naming the position
and the table, and the file stays as it was before that record. It is skipped only if the log
says so: a skip record (`walkit sqlite skip NAME POSITION`) after it, which `find_skip` looks
for when a record fails, so every node that cannot apply it skips the same record.

The apply connection runs with triggers off (their effects are in the changesets already) and
foreign keys off (cascades too), WAL mode (readers, such as the sqlite3 command line, read while
records are applied) and synchronous=NORMAL (the log, not the file, is what makes a commit durable).
Snapshots copy the file with the SQLite backup API from a read transaction, so records go on
being applied while the copy is written to its ledger.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import tempfile
import threading
import time
import weakref
from typing import BinaryIO, Callable

import walkit
from walkit.core.loglist import Position

from walkit.adapters.sqlite import definition
from walkit.adapters.sqlite.errors import IntegrityError, MissingFunction, OperationalError, ReplicaStopped
from walkit.adapters.sqlite.records import CHANGESET, SQL, Transaction

log = logging.getLogger("walkit.adapters.sqlite")

#: The table holding the applied position; its only row has id 0.
POSITION_TABLE = "_walkit_position"
_CREATE_POSITION = (f"CREATE TABLE IF NOT EXISTS {POSITION_TABLE}(id INTEGER PRIMARY KEY CHECK (id = 0), "
                    "name TEXT NOT NULL, ledger INTEGER, entry INTEGER, record INTEGER, commit_ms INTEGER)")
#: A record position: (ledger id, entry id, index of the record in the entry).
RecordPosition = tuple[int, int, int]
_BUSY_WAIT_MS = 60_000


class TransactionEnded(ReplicaStopped):
    """TransactionEnded: a record's step ended its own transaction (SQLite rolled it back for a constraint
    declared ON CONFLICT ROLLBACK); the trial refuses such a record with IntegrityError."""


class _Halt(BaseException):
    """_Halt carries a ReplicaStopped past walkit.replicate's "an exception is a result" rule: the node stops."""

    def __init__(self, error: ReplicaStopped) -> None:
        super().__init__(str(error))
        self.error = error


def open_file(path: str, name: str, timeout: float | None = None, *, adopting: bool = False):
    """open_file opens `path` as the apply connection of database `name` (creating it) and checks its name.

    `_walkit_position` is created with the first record applied (after that record's own
    tables), so a program listing sqlite_schema finds its first table first. A file with tables
    but no position is a plain SQLite database the log knows nothing of: it is refused, unless
    it is being adopted (`adopting`, walkit.adapters.sqlite.adoption). Opening waits at most
    `timeout` seconds (connect's `timeout`; None: _BUSY_WAIT_MS) for another program's lock on
    the file, then raises OperationalError "database is locked"; applying the log afterwards
    waits as long as it takes.
    """
    import apsw
    from walkit.adapters.sqlite.errors import translate
    db = apsw.Connection(path)
    try:
        db.set_busy_timeout(_BUSY_WAIT_MS if timeout is None else max(0, int(timeout * 1000)))
        try:
            mode = db.execute("PRAGMA journal_mode=WAL").fetchall()[0][0]
            if mode.lower() != "wal":
                raise OperationalError(f"{path}: cannot switch to WAL mode (it is {mode}); is another program "
                                       "holding it?")
            db.execute("PRAGMA synchronous=NORMAL")
            db.config(apsw.SQLITE_DBCONFIG_ENABLE_TRIGGER, 0)
            db.execute("PRAGMA foreign_keys=OFF")
            definition.register_all(db)
            if not adopting:
                check_name(db, path, name)
        except apsw.Error as exc:
            raise translate(exc) from None
        db.set_busy_timeout(_BUSY_WAIT_MS)
    except BaseException:
        db.close()
        raise
    return db


def check_name(db, path: str, name: str) -> None:
    """check_name refuses a file holding another replicated database, or a plain SQLite database with tables."""
    if has_position_table(db):
        rows = db.execute(f"SELECT name FROM {POSITION_TABLE} WHERE id = 0").fetchall()
        if rows and rows[0][0] != name:
            raise OperationalError(f"{path} holds replicated database {rows[0][0]!r}, not {name!r}")
        return
    tables = db.execute("SELECT count(*) FROM sqlite_schema WHERE name NOT LIKE 'sqlite_%'").fetchall()[0][0]
    if tables:
        raise OperationalError(f"{path} is a SQLite database that was not made by replicating {name!r} (it has "
                               f"{tables} schema objects and no {POSITION_TABLE}); give walkit a new file, or "
                               "one restored or replicated from this database, or adopt this one "
                               "(connect(..., adopt=True): its content becomes the database's)")


def has_position_table(db) -> bool:
    """has_position_table is True once the file applied a record."""
    return bool(db.execute("SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = ?",
                           (POSITION_TABLE,)).fetchall())


def read_position(db) -> tuple[RecordPosition | None, int]:
    """read_position returns the record position a file applied (None before any) and that record's commit time."""
    if not has_position_table(db):
        return None, 0
    rows = db.execute(f"SELECT ledger, entry, record, commit_ms FROM {POSITION_TABLE} WHERE id = 0").fetchall()
    if not rows or rows[0][0] is None:
        return None, 0
    ledger, entry, record, commit_ms = rows[0]
    return (ledger, entry, record), commit_ms or 0


def begin_immediate(db) -> None:
    """begin_immediate starts a write transaction, waiting as long as it takes for the file's write lock."""
    import apsw
    while True:
        try:
            db.execute("BEGIN IMMEDIATE")
            return
        except apsw.BusyError:
            log.warning("the SQLite file is locked by another program; waiting to apply the log")


#: The names of the group's savepoints start so; a connection refuses them in its statements.
GROUP_SAVEPOINTS = "_walkit_group_"
#: A member's states (module doc): statements running, record in flight, record applied from the log,
#: committed with the group, rolled back.
RUNNING, KEPT, MATCHED, COMMITTED, DROPPED = "running", "kept", "matched", "committed", "dropped"


class Member:
    """Member is one write transaction of the leader's group (module doc): its savepoint, the epoch its record
    is appended in, the record once its COMMIT came, and the position the log gave it back at."""

    __slots__ = ("savepoint", "epoch", "before", "record", "at", "commit_ms", "state", "future")

    def __init__(self, savepoint: str, epoch: int | None, before: tuple) -> None:
        self.savepoint = savepoint
        self.epoch = epoch
        self.before = before                    # the members before it when it joined: what it sees, not in the file
        self.future = None                      # its record's submit once handed to the log (Database sets it)
        self.record: bytes | None = None
        self.at: RecordPosition | None = None
        self.commit_ms = 0
        self.state = RUNNING


class SqliteMachine(walkit.StateMachine):
    """SqliteMachine applies transaction records to the SQLite file at `path` (see the module doc)."""

    def __init__(self, path: str, name: str, timeout: float | None = None, *, adopting: bool = False) -> None:
        self.path = path
        self.name = name
        self.db = open_file(path, name, timeout, adopting=adopting)
        self.position, self.commit_ms = read_position(self.db)
        self.failed: ReplicaStopped | None = None
        self._entry: tuple[int, int] | None = None
        self._index = -1
        self._using = threading.Lock()          # the apply connection: applying, or the group's bookkeeping
        self._changed = threading.Condition(self._using)     # a member ended, the group committed or ended
        #: The group: members in the apply connection's open transaction, in order (module doc).
        self._group: list[Member] = []
        self._running: Member | None = None     # the member whose statements run on the connection now
        self._closing = False                   # a member was matched: no new member until the group commits
        #: Members rolled back while their records may still reach the log: no member runs, and no transaction
        #: on its own connection either, until the log decided (their submits ended; see `_settled`).
        self._unsettled: list[Member] = []
        self._savepoints = itertools.count(1)
        #: The position of the last record applied or matched (`position` is the file's, committed).
        self.through = self.position
        self._may_commit = False                # the machine's own COMMIT (or backup) is under way
        self.db.set_commit_hook(_refuse_commits(self))
        #: Called on the apply thread after each applied record with its position (status, tests).
        self.on_applied: Callable[[RecordPosition], None] | None = None
        #: Called when the record at a position fails: True if a skip record later in the log names it.
        self.find_skip: Callable[[RecordPosition], bool] | None = None
        #: Called for an adoption record: the file image it names, checked (adoption.image_loader).
        self.load_image: Callable[[dict], BinaryIO] | None = None
        try:
            self.check_definitions()
        except BaseException:
            self.db.close()
            raise

    def register(self, register: Callable) -> None:
        """register registers a definition (walkit.adapters.sqlite.definition) on the apply connection; the
        group ends first (module doc)."""
        with self._using:
            committed = self._end_group()
            register(self.db)
        self._tell(committed)

    def check_definitions(self) -> None:
        """check_definitions raises MissingFunction if the file's schema uses a function or collation this process lacks."""
        with self._using:
            lacking = definition.missing(self.db)
        if lacking is not None:
            raise self._missing(lacking, self.position)

    def _missing(self, lacking: definition.Missing, at: RecordPosition | None) -> MissingFunction:
        register = "create_collation" if lacking.what == "collation" else "create_function"
        where = f" ({lacking.used_by})" if lacking.used_by else ""
        error = MissingFunction(
            f"{self.path} cannot apply replicated database {self.name!r} at {_show(at)}: its schema uses SQL "
            f"{lacking.what} {lacking.name!r}{where}, which is not registered on the database in this process. "
            f"Functions the schema uses are part of the database's definition: call walkit.adapters.sqlite."
            f"{register}({lacking.name!r}, ...) before connect, in every process of this database "
            f"(docs/guides/sqlite.md#functions-the-schema-uses)", lacking.name, _as_position(at))
        error.lacking = lacking
        return error

    # -- applying -------------------------------------------------------------------------------------
    def record_position(self, position: Position) -> RecordPosition:
        """record_position numbers the records of one log entry in the order they are applied."""
        entry = (position.ledger_id, position.entry_id)
        if entry == self._entry:
            self._index += 1
        else:
            self._entry, self._index = entry, 0
        return (entry[0], entry[1], self._index)

    def apply(self, record: bytes, position: Position) -> RecordPosition | None:
        """apply applies one transaction record with its position in one SQLite transaction.

        It returns the record's position, or None if the file had applied it already.
        """
        at = self.record_position(position)
        if self.failed is not None:
            raise _Halt(self.failed)
        if self.through is not None and at <= self.through:
            return None
        try:
            txn = Transaction.decode(record)
            self.apply_transaction(txn, at, record)
        except Exception as exc:  # noqa: BLE001 - only the log skips a record: any other failure stops this replica
            if self._skipped(exc, at):
                log.warning("%s: the record at %s does not apply here (%s: %s); the log skips it", self.name,
                            _show(at), type(exc).__name__, exc)
                self.apply_transaction(Transaction(), at)
            else:
                self._stop(exc, at)
        if self.on_applied is not None:
            self.on_applied(at)
        return at

    def _skipped(self, exc: Exception, at: RecordPosition) -> bool:
        """_skipped tells whether a skip record names the record at `at`, which failed with `exc`.

        If the log cannot be read to find out, the node stops (ReplicaStopped, raised as _Halt):
        an error let out of `apply` would be taken as the record's result and the record passed
        over on this node. A restart looks again.
        """
        if self.find_skip is None:
            return False
        try:
            return self.find_skip(at)
        except Exception as lookup:  # noqa: BLE001 - any failure to read the log: stop, do not guess
            self._stop(ReplicaStopped(f"replica of {self.name!r} stopped at log position {_show(at)}: the record "
                                      f"does not apply ({type(exc).__name__}: {exc}) and the log could not be "
                                      f"read to see whether a skip record names it ({type(lookup).__name__}: "
                                      f"{lookup}); restart the node to look again", _as_position(at)), at)

    def _stop(self, exc: Exception, at: RecordPosition):
        if not isinstance(exc, ReplicaStopped):
            exc = ReplicaStopped(f"replica of {self.name!r} stopped at log position {_show(at)}: "
                                 f"{type(exc).__name__}: {exc}", _as_position(at))
        if not isinstance(exc, MissingFunction):
            exc.args = (f"{exc}. This node serves nothing until the record applies: inspect it and skip it with "
                        f"`walkit sqlite skip {self.name} {_show(at)}` if no node can apply it, or replace this "
                        f"node's file from a snapshot (docs/guides/sqlite.md#a-record-that-does-not-apply)",)
        self.failed = exc
        log.error("%s: %s", self.name, exc)
        raise _Halt(exc) from exc

    def apply_transaction(self, txn: Transaction, at: RecordPosition, record: bytes | None = None) -> None:
        """apply_transaction runs `txn`'s steps and moves the position to `at`, all in one SQLite transaction.

        If `record` (`txn`'s bytes) is the group's first member not applied yet, its steps ran
        already in the open transaction: it is marked applied, and the group commits once all
        its members are (module doc). Anything else ends the group first.
        """
        if txn.adopted is not None:
            return self._adopt(txn, at)
        db = self.db
        with self._using:
            head = next((m for m in self._group if m.state is KEPT), None)
            if head is not None and record is not None and head.record == record:
                head.state, head.at, head.commit_ms = MATCHED, at, txn.commit_ms
                self.through = at
                self._closing = True
                self._settle_group()
                return
            self._end_group()
            begin_immediate(db)
            try:
                self._run(txn, at)
                self._write_position(at, txn.commit_ms)
                self._commit()
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        self.position, self.commit_ms = at, txn.commit_ms
        self.through = at

    def _adopt(self, txn: Transaction, at: RecordPosition) -> None:
        """_adopt makes the file the image an adoption record names, with position `at`, in one SQLite backup.

        The image gets the position row first, so the file's content and position change
        together. An image whose page size differs from the file's is rebuilt with the file's
        (VACUUM): a file in WAL mode takes a backup of its own page size only.
        """
        import apsw
        from walkit.adapters.sqlite.adoption import copy_to
        if self.load_image is None:
            raise OperationalError(f"{self.path} cannot read the image of adopted database {self.name!r}")
        with tempfile.TemporaryDirectory(prefix="walkit-sqlite-") as scratch:
            copy_path = os.path.join(scratch, "adopted.db")
            src = self.load_image(txn.adopted)
            try:
                copy_to(src, copy_path)
            finally:
                src.close()
            image = apsw.Connection(copy_path)
            try:
                image.execute("PRAGMA journal_mode=DELETE").fetchall()
                page_size = self.db.execute("PRAGMA page_size").fetchall()[0][0]
                if image.execute("PRAGMA page_size").fetchall()[0][0] != page_size:
                    image.execute(f"PRAGMA page_size={int(page_size)}")
                    image.execute("VACUUM")
                image.execute(_CREATE_POSITION)
                image.execute(f"INSERT OR REPLACE INTO {POSITION_TABLE}(id, name, ledger, entry, record, commit_ms) "
                              "VALUES (0, ?, ?, ?, ?, ?)", (self.name, *at, txn.commit_ms))
                self._load(image)
            finally:
                image.close()
        self.position, self.commit_ms = at, txn.commit_ms
        self.through = at
        log.info("%s: %s adopted the image of %d bytes in ledger %d at %s", self.name, self.path,
                 txn.adopted["size"], txn.adopted["ledger"], _show(at))
        lacking = definition.missing(self.db)
        if lacking is not None:
            raise self._missing(lacking, at)

    # -- the group (module doc) ------------------------------------------------------------------------
    def join(self, epoch: int, timeout: float) -> "Member | None":
        """join makes a new member whose statements run on this connection, in a savepoint, with triggers on.

        It waits while the group takes no member (one was applied, or it holds members of
        another leadership than `epoch`); None if that lasted `timeout` seconds, or another
        program held the file's write lock as long. The caller holds the leader's write lock, so
        no other member runs, and a member whose record was never sent was left by an interrupted
        commit: it is dropped first (`_drop_unsent`).
        """
        import apsw
        deadline = time.monotonic() + max(0.0, timeout)
        member = None
        if not self._using.acquire(timeout=max(0.0, timeout)):   # the apply thread waits for another program
            return None
        try:
            committed = self._drop_unsent()
            open_ = self._wait(lambda: not (self._closing or self._running is not None or (
                self._group and self._group[0].epoch != epoch)), deadline)
            if open_ and (self.db.in_transaction or self._begin_within(max(0.0, deadline - time.monotonic()))):
                member = self._new_member(epoch)
                self.db.config(apsw.SQLITE_DBCONFIG_ENABLE_TRIGGER, 1)
        except BaseException:
            self._disown()
            raise
        finally:
            self._using.release()
        self._tell(committed)
        return member

    def _new_member(self, epoch: int | None) -> "Member":
        """_new_member (holding `_using`, in the open transaction) adds the running member, with its savepoint."""
        member = Member(f"{GROUP_SAVEPOINTS}{next(self._savepoints)}", epoch, tuple(self._group))
        self.db.execute(f'SAVEPOINT "{member.savepoint}"')
        self._group.append(member)
        self._running = member
        return member

    def _disown(self) -> None:
        """_disown (holding `_using`) rolls back a member that an exception (an interrupt) left running while it
        was being made: with the write lock held, a running member in the group is the caller's."""
        orphan = next((m for m in self._group if m.state is RUNNING), None)
        if orphan is not None:
            self._running = orphan
            self._tell(self._leave(orphan))
        elif self.db.in_transaction and not self._group:           # (an interrupt right after BEGIN)
            self.db.execute("ROLLBACK")

    def _wait(self, ready: Callable[[], bool], deadline: float | None) -> bool:
        """_wait (holding `_using`) waits until `ready()` and every member rolled back in flight was settled by
        the log (`_settled`), or `deadline` (time.monotonic; None: no limit) passed; it tells which."""
        while not (self._settled() and ready()):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            self._changed.wait(0.05 if self._unsettled else left)   # a submit's end does not notify
        return True

    def _settled(self) -> bool:
        """_settled (holding `_using`) forgets the members rolled back in flight whose submits ended (a record
        the log took was applied before its submit ended) and tells whether none is left."""
        self._unsettled = [m for m in self._unsettled if not m.future.done()]
        return not self._unsettled

    def settle(self, member: "Member", record: bytes) -> None:
        """settle is a running member's COMMIT: its statements are rolled back to its savepoint and its record
        applied there as every node will (the trial); it is then in flight (`KEPT`).

        It raises the DB-API error the record meets (as `trial`), and the member leaves the group.
        """
        import apsw
        with self._using:
            self.db.config(apsw.SQLITE_DBCONFIG_ENABLE_TRIGGER, 0)
            if not self._rolled_back_to(member, release=False):     # SQLite ended the transaction under it
                committed = self._lost()
                failure: BaseException = OperationalError("cannot commit - no transaction is active")
            else:
                try:
                    self._try(record)
                except BaseException as exc:
                    committed, failure = self._leave(member), exc
                else:
                    member.record, member.state = record, KEPT
                    self._running = None
                    self._changed.notify_all()
                    return
        self._tell(committed)
        raise failure

    def leave(self, member: "Member") -> None:
        """leave ends a running member without a record: its statements are rolled back (ROLLBACK, close, or
        SQLite ended the transaction under it: then see `_lost`)."""
        with self._using:
            committed = self._leave(member)
        self._tell(committed)

    def trial(self, record: bytes, epoch: int | None = None) -> "Member":
        """trial applies `record` as every node will (this connection, the database's definitions) on top of the
        group, and keeps it as a member in flight (`KEPT`).

        It raises the DB-API error the record meets, with SQLite's message ("no such function:
        f"), and keeps nothing of it. For a transaction that ran on its own connection (module
        doc), with the write lock held: then the group is empty (`drain`) and this is a group of one.
        """
        with self._using:
            dropped = self._drop_unsent() if self._running is None else False
            self._wait(lambda: self._running is None, None)
            try:
                if not self.db.in_transaction:
                    begin_immediate(self.db)
                member = self._new_member(epoch)
                self._try(record)
            except BaseException:
                self._disown()
                raise
            member.record, member.state = record, KEPT
            self._running = None
            self._changed.notify_all()
        self._tell(dropped)
        return member

    def drop(self, member: "Member") -> None:
        """drop rolls back a member in flight whose append failed, and every member after it (module doc)."""
        with self._using:
            while self._running is not None:
                self._changed.wait()
            if member.state is not KEPT or member not in self._group:
                return
            committed = self._drop_from(self._group.index(member))
        self._tell(committed)

    def _drop_from(self, index: int) -> bool:
        """_drop_from (holding `_using`, no member running) rolls back the members from `index` on; True if
        the group then committed (those before it were all applied)."""
        if not self._rolled_back_to(self._group[index]):
            return self._lost()
        self._dropped(self._group[index:])
        del self._group[index:]
        committed = self._settle_group()
        self._changed.notify_all()
        return committed

    def _dropped(self, members: list) -> None:
        """_dropped (holding `_using`) marks `members` rolled back; those whose records are on their way to the log
        are kept until the log decided (`_unsettled`): a member made meanwhile would not see them, and its
        record would come after theirs."""
        for member in members:
            member.state = DROPPED
            if member.future is not None and not member.future.done():
                self._unsettled.append(member)

    def _drop_unsent(self) -> bool:
        """_drop_unsent (holding `_using`, with the leader's write lock) drops a member whose record was never
        handed to the log: a commit interrupted between its trial and its append left it, and nothing
        may be built on a record that will not be in the log. True if the group then committed."""
        unsent = next((i for i, m in enumerate(self._group) if m.state is KEPT and m.future is None), None)
        return False if unsent is None else self._drop_from(unsent)

    def drain(self, timeout: float) -> bool:
        """drain waits until no group is open (False after `timeout` seconds): for a transaction on its own
        connection, which needs the file's write lock. The caller holds the leader's write lock (see `join`
        for a member never sent)."""
        deadline = time.monotonic() + max(0.0, timeout)
        if not self._using.acquire(timeout=max(0.0, timeout)):   # the apply thread waits for another program
            return False
        try:
            committed = self._drop_unsent() if self._running is None else False
            drained = self._wait(lambda: not self._group and self._running is None, deadline)
            if drained and self.db.in_transaction:       # left by an interrupt right after a BEGIN
                self.db.execute("ROLLBACK")
        finally:
            self._using.release()
        self._tell(committed)
        return drained

    @property
    def members(self) -> list["Member"]:
        """members is the group, in order (a copy)."""
        with self._using:
            return list(self._group)

    @property
    def kept(self) -> list[bytes]:
        """kept is the records of the group's members on their way to the log (tried here, not applied yet)."""
        with self._using:
            return [m.record for m in self._group if m.state is KEPT]

    def _begin_within(self, timeout: float) -> bool:
        """_begin_within starts a write transaction, waiting at most `timeout` seconds for another program's lock."""
        import apsw
        self.db.set_busy_timeout(int(timeout * 1000))
        try:
            self.db.execute("BEGIN IMMEDIATE")
            return True
        except apsw.BusyError:
            return False
        finally:
            self.db.set_busy_timeout(_BUSY_WAIT_MS)

    def _try(self, record: bytes) -> None:
        """_try (holding `_using`, in a member's savepoint) runs `record`'s steps as every node will; on failure
        it raises the DB-API error they met, SQLite's message kept."""
        import apsw
        from walkit.adapters.sqlite.errors import translate
        try:
            self._run(Transaction.decode(record), None)
        except BaseException as exc:
            if isinstance(exc, MissingFunction):
                raise OperationalError(exc.lacking.message) from None
            if isinstance(exc, TransactionEnded):
                raise IntegrityError("constraint failed: a constraint declared ON CONFLICT ROLLBACK refuses "
                                     "this transaction's changes in the order the changeset applies them "
                                     "(docs/guides/sqlite.md#guarantees); nothing was changed") from None
            if isinstance(exc, ReplicaStopped):
                cause = exc.__cause__
                raise (translate(cause) if isinstance(cause, apsw.Error) else OperationalError(str(exc))) from None
            raise

    def _leave(self, member: "Member") -> bool:
        """_leave (holding `_using`) rolls back a running member and takes it out of the group; True if the
        group committed."""
        import apsw
        self.db.config(apsw.SQLITE_DBCONFIG_ENABLE_TRIGGER, 0)
        if self._running is member:
            self._running = None
        if member in self._group:
            return self._drop_from(self._group.index(member))
        member.state = DROPPED
        return False

    def _rolled_back_to(self, member: "Member", release: bool = True) -> bool:
        """_rolled_back_to (holding `_using`) undoes what ran since `member` joined (and ends its savepoint if
        `release`); False if SQLite had ended the transaction under it (it is rolled back: see `_lost`)."""
        import apsw
        if not self.db.in_transaction:
            return False
        try:
            self.db.execute(f'ROLLBACK TO "{member.savepoint}"')
            if release:
                self.db.execute(f'RELEASE "{member.savepoint}"')
        except apsw.SQLError:                   # no such savepoint: the transaction it was in ended
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            return False
        return True

    def _lost(self) -> bool:
        """_lost (holding `_using`): the open transaction ended under the group. The members the log gave back
        are applied again, from their records, and committed; the others are dropped (what the log holds
        of them is applied when it comes). True if anything was committed."""
        import apsw
        self.db.config(apsw.SQLITE_DBCONFIG_ENABLE_TRIGGER, 0)
        group, self._group, self._running, self._closing = self._group, [], None, False
        matched = [m for m in group if m.state is MATCHED]
        self._dropped([m for m in group if m.state is not MATCHED])
        self._changed.notify_all()
        if not matched:
            return False
        begin_immediate(self.db)
        try:
            for member in matched:
                self._run(Transaction.decode(member.record), member.at)
            self._write_position(matched[-1].at, matched[-1].commit_ms)
            self._commit()
        except BaseException:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise
        for member in matched:
            member.state = COMMITTED
        self.position, self.commit_ms = matched[-1].at, matched[-1].commit_ms
        self._changed.notify_all()
        return True

    def _settle_group(self) -> bool:
        """_settle_group (holding `_using`) commits the group once every member was applied and none runs, with
        the last one's position; an empty group's transaction is rolled back. True if it committed."""
        if self._running is not None:
            return False
        group = self._group
        if not group:
            self._closing = False
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            return False
        if any(m.state is not MATCHED for m in group):
            return False
        last = group[-1]
        self._write_position(last.at, last.commit_ms)
        self._commit()
        for member in group:
            member.state = COMMITTED
        self._group, self._closing = [], False
        self.position, self.commit_ms = last.at, last.commit_ms
        self._changed.notify_all()
        return True

    def _end_group(self) -> bool:
        """_end_group (holding `_using`) waits until no member runs, rolls back the members not applied yet and
        commits the others (module doc); True if it committed."""
        while self._running is not None:
            self._changed.wait()
        group = self._group
        if not group:
            if self.db.in_transaction:           # left by an interrupt right after a BEGIN
                self.db.execute("ROLLBACK")
            return False
        first = next((i for i, m in enumerate(group) if m.state is not MATCHED), None)
        if first is not None:
            return self._drop_from(first)
        if not self.db.in_transaction:
            return self._lost()
        committed = self._settle_group()
        self._changed.notify_all()
        return committed

    def _tell(self, committed: bool) -> None:
        """_tell reports a commit made off the apply thread to `on_applied` (waiters look at `position`)."""
        if committed and self.on_applied is not None:
            self.on_applied(self.position)

    def _write_position(self, at: RecordPosition, commit_ms: int, db=None) -> None:
        """_write_position writes the position row in the open transaction of `db` (None: the apply connection)."""
        db = self.db if db is None else db
        db.execute(_CREATE_POSITION)
        db.execute(f"INSERT OR REPLACE INTO {POSITION_TABLE}(id, name, ledger, entry, record, commit_ms) "
                        "VALUES (0, ?, ?, ?, ?, ?)", (self.name, *at, commit_ms))

    @contextlib.contextmanager
    def _committing(self):
        """_committing lets the apply connection's own commits by the commit hook (`_refuse_commits`)."""
        self._may_commit = True
        try:
            yield
        finally:
            self._may_commit = False

    def _commit(self) -> None:
        """_commit commits the apply connection's transaction."""
        with self._committing():
            self.db.execute("COMMIT")

    def _load(self, source) -> None:
        """_load replaces the file's content with apsw connection `source`'s (SQLite backup API), in WAL mode
        again; the group ends first."""
        with self._using:
            committed = self._end_group()
            with self._committing():
                with self.db.backup("main", source, "main") as backup:
                    backup.step(-1)
                self.db.execute("PRAGMA journal_mode=WAL").fetchall()
        self._tell(committed)

    def _run(self, txn: Transaction, at: RecordPosition | None, db=None) -> None:
        """_run runs `txn`'s steps in the open transaction; a schema change is checked for definitions this process lacks.

        A step that ends the transaction (SQLite rolls it all back for a constraint declared
        ON CONFLICT ROLLBACK) fails the record: what the changeset would then do outside a
        transaction is refused by the commit hook (`_refuse_commits`), not committed. `db` is another
        connection set up as this one (a snapshot's copy); None: this one.
        """
        import apsw
        db = self.db if db is None else db
        for kind, value in txn.steps:
            if kind == CHANGESET:
                self._apply_changeset(value, at, db)
            elif kind == SQL:
                try:
                    db.execute(value)
                except apsw.Error as exc:
                    lacking = definition.missing_in(exc, value)
                    if lacking is not None:
                        raise self._missing(lacking, at) from exc
                    raise ReplicaStopped(f"replica of {self.name!r} stopped at log position {_show(at)}: the "
                                         f"schema statement {value!r} failed: {exc}", _as_position(at)) from exc
            # a SKIP step changes nothing here: the record it names was skipped where it failed
            if not db.in_transaction:
                raise self._ended(at)
        if txn.has_schema:
            lacking = definition.missing(db)
            if lacking is not None:
                raise self._missing(lacking, at)

    def _ended(self, at: RecordPosition | None) -> "TransactionEnded":
        return TransactionEnded(f"replica of {self.name!r} stopped at log position {_show(at)}: the record ended "
                                f"its own transaction (a constraint declared ON CONFLICT ROLLBACK met a row of "
                                f"the changeset in the order it applies)", _as_position(at))

    def _apply_changeset(self, changeset: bytes, at: RecordPosition, db) -> None:
        import apsw
        conflicts: list[tuple[str, str]] = []

        def conflict(reason: int, change) -> int:      # `change` lives only during the call
            values = change.new if change.op == "INSERT" else change.old
            conflicts.append((change.name, f"{apsw.mapping_session_conflict.get(reason, reason)} on {change.op} "
                                           f"of {values!r}, the replica has {change.conflict!r}"))
            return apsw.SQLITE_CHANGESET_ABORT
        try:
            apsw.Changeset.apply(changeset, db, conflict=conflict)
        except apsw.Error as exc:
            if not db.in_transaction:
                raise self._ended(at) from exc
            if conflicts:
                table, what = conflicts[0]
            else:
                table, what = _first_table(changeset), f"{type(exc).__name__}: {exc}"
            raise ReplicaStopped(f"replica of {self.name!r} stopped at log position {_show(at)}, table {table!r}: "
                                 f"the changeset does not apply ({what}); the replica differs from the leader",
                                 _as_position(at), table) from exc

    # -- snapshots ------------------------------------------------------------------------------------
    def snapshot(self, out: BinaryIO) -> Callable[[], None]:
        """snapshot pins the file's current state in a read transaction and returns the function copying it.

        The copy (SQLite backup API) runs on the snapshot thread while records are applied again.
        """
        import apsw
        reader = apsw.Connection(self.path)
        with self._using:
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM sqlite_schema").fetchall()    # the read transaction starts here
            applied = [(m.record, m.at, m.commit_ms) for m in self._group if m.state is MATCHED]

        def persist() -> None:
            try:
                with tempfile.TemporaryDirectory(prefix="walkit-sqlite-") as scratch:
                    copy_path = os.path.join(scratch, "snapshot.db")
                    backup_into(copy_path, reader)
                    if applied:
                        self._apply_to_copy(copy_path, applied)
                    with open(copy_path, "rb") as copied:
                        shutil.copyfileobj(copied, out, 1 << 20)
            finally:
                reader.execute("COMMIT")
                reader.close()
        return persist

    def _apply_to_copy(self, path: str, applied: list) -> None:
        """_apply_to_copy applies records the group holds applied but not committed to the copy at `path`, so a
        snapshot holds everything up to the position it is taken at (the node's, not the file's)."""
        import apsw
        copy = open_file(path, self.name)
        try:
            begin_immediate(copy)
            for record, at, _ in applied:
                self._run(Transaction.decode(record), at, copy)
            _, at, commit_ms = applied[-1]
            self._write_position(at, commit_ms, copy)
            copy.execute("COMMIT")
            copy.execute("PRAGMA journal_mode=DELETE").fetchall()
        except apsw.Error as exc:
            raise OperationalError(f"the snapshot of {self.name!r} could not apply the records at "
                                   f"{_show(applied[0][1])}..{_show(applied[-1][1])}: {exc}") from exc
        finally:
            copy.close()

    def restore(self, src: BinaryIO) -> None:
        """restore replaces the file's content with a snapshot, unless the file applied as much already."""
        import apsw
        with tempfile.TemporaryDirectory(prefix="walkit-sqlite-") as scratch:
            copy_path = os.path.join(scratch, "snapshot.db")
            with open(copy_path, "wb") as copied:
                shutil.copyfileobj(src, copied, 1 << 20)
            snap = apsw.Connection(copy_path)
            try:
                check_name(snap, "the snapshot", self.name)
                at, _ = read_position(snap)
                if self.position is not None and (at is None or at <= self.position):
                    log.info("%s: %s applied %s already; the snapshot at %s is not loaded", self.name, self.path,
                             _show(self.position), _show(at))
                    return
                self._load(snap)
            finally:
                snap.close()
        self.position, self.commit_ms = read_position(self.db)
        self.through = self.position
        self._entry, self._index = None, -1
        log.info("%s: %s restored from the snapshot at %s", self.name, self.path, _show(self.position))
        try:
            self.check_definitions()
        except MissingFunction as exc:          # the node stops at its next record; connect reports it
            self.failed = exc
            log.error("%s: %s", self.name, exc)

    def close(self) -> None:
        """close closes the apply connection."""
        self.db.close()


def _refuse_commits(machine: SqliteMachine) -> Callable[[], bool]:
    """_refuse_commits is the apply connection's commit hook: it refuses (True) a commit that writes the file
    other than the machine's own. The session module applies the rest of a changeset in autocommit
    once a constraint declared ON CONFLICT ROLLBACK rolled the transaction back: those commits would
    put changes in the file that are in no record. (It holds the machine weakly: no cycle.)"""
    import apsw
    ref = weakref.ref(machine)

    def hook() -> bool:
        alive = ref()
        return alive is not None and not alive._may_commit and alive.db.txn_state("main") == apsw.SQLITE_TXN_WRITE
    return hook


def backup_into(path: str, source, source_schema: str = "main") -> None:
    """backup_into copies `source`'s database into a new file at `path` with the SQLite backup API."""
    import apsw
    dest = apsw.Connection(path)
    try:
        with dest.backup("main", source, source_schema) as backup:
            while not backup.done:
                backup.step(-1)
    finally:
        dest.close()


def _first_table(changeset: bytes) -> str | None:
    import apsw
    try:
        for change in apsw.Changeset.iter(changeset):
            return change.name
    except apsw.Error:
        return None
    return None


def _as_position(at: RecordPosition | None) -> Position | None:
    return None if at is None else Position(at[0], at[1])


def _show(at: RecordPosition | None) -> str:
    """_show prints a record position as L:E (or L:E#R for a record after the first of its entry)."""
    if at is None:
        return "the start"
    return f"{at[0]}:{at[1]}" + (f"#{at[2]}" if at[2] else "")


def now_ms() -> int:
    """now_ms is the wall clock in milliseconds (the commit time records carry)."""
    return time.time_ns() // 1_000_000
