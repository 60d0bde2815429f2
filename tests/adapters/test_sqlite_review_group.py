"""A review of SQLite group commit (commit 0c5d004): write transactions share the log's round trip.

The guarantees under attack (SqliteMachine's module doc, "Group commit"): the leader's file
never holds what the log does not, and no reader sees a member before its group committed;
every COMMIT that returned is in the log and applied once on every node, and every node's file
ends identical; a member sees every earlier member's writes, and a transaction that read an
older state fails "database is locked" instead of writing on it; a record is never appended on
top of a member that is not in the log. Nodes run on an in-process MemoryCluster (sqlitehelpers).
Members are held in flight at known moments: HeldAppend holds the leader's next acknowledged
entry before it is applied (the I/O thread waits there, so later appends queue behind it), and
GatedAppends (below) holds records before they are appended, to let them through or refuse them.

A docstring paragraph starting "Regression" names a bug of 0c5d004 that this review found and the
commit that fixed it: the test fails on the code before that commit.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest

apsw = pytest.importorskip("apsw")

import walkit.adapters.sqlite as sq                                          # noqa: E402
from walkit.adapters.sqlite import definition                               # noqa: E402
from walkit.adapters.sqlite.connection import Connection                    # noqa: E402
from walkit.adapters.sqlite.database import Database                        # noqa: E402
from walkit.adapters.sqlite.machine import MATCHED, RUNNING, SqliteMachine  # noqa: E402
from walkit.errors import NotLeader as WalkitNotLeader                      # noqa: E402
from walkit.testing.processes import wait_until                             # noqa: E402

from .sqlite_review_helpers import (                                         # noqa: E402
    HeldAppend, Interrupted, commit_in_thread, file_rows, interrupting, keeps_nothing,
)
from .sqlitehelpers import cluster, nodes, unique                           # noqa: E402,F401 - fixtures
from .test_sqlite_review_kept_trial import pair, rows                        # noqa: E402

#: A member that counts the rows before it: `n` runs 1, 2, 3... only if each saw every earlier one.
INSERT_NEXT = "INSERT INTO t(who, n) SELECT ?, count(*) + 1 FROM t"
#: How long a test waits for something that must happen at once (a COMMIT whose group can commit).
PROMPTLY_S = 10


class GatedAppends:
    """GatedAppends holds the records a leader sends to the log from now on (its node's submit_async).

    Each COMMIT is then in flight with its record at the gate, not appended. `let_through(k)`
    appends the first k held, in order (with the epoch they were sent with); `refuse()` fails the
    rest as never appended (NotLeader, maybe_in_log False), as a leadership ending does. `open()`
    lets every later record straight through.
    """

    def __init__(self, monkeypatch, node) -> None:
        self._submit = node.submit_async
        self._lock = threading.Lock()
        self._held: list[tuple[bytes, dict, Future]] = []
        self._open = False
        monkeypatch.setattr(node, "submit_async", self._submit_async)

    @property
    def held(self) -> int:
        with self._lock:
            return len(self._held)

    def _submit_async(self, record: bytes, **options) -> Future:
        with self._lock:
            if not self._open:
                future: Future = Future()
                self._held.append((record, options, future))
                return future
        return self._submit(record, **options)

    def let_through(self, count: int) -> None:
        with self._lock:
            passing, self._held = self._held[:count], self._held[count:]
        for record, options, future in passing:
            try:
                appended = self._submit(record, **options)
            except BaseException as exc:  # noqa: BLE001 - NotLeader at once: the COMMIT learns it
                future.set_exception(exc)
            else:
                appended.add_done_callback(lambda done, mine=future: _settle(mine, done))

    def refuse(self) -> None:
        with self._lock:
            refused, self._held = self._held, []
        for _, _, future in refused:
            future.set_exception(WalkitNotLeader("the gate refused it: never appended", None))

    def open(self) -> None:
        with self._lock:
            self._open = True


@pytest.fixture
def gated(nodes, monkeypatch):
    """gated(conn) puts GatedAppends on `conn`'s node; what it still holds at the end is refused, before the
    nodes close, so no COMMIT waits on it then."""
    gates: list[GatedAppends] = []

    def gate(conn) -> GatedAppends:
        gates.append(GatedAppends(monkeypatch, conn._database.node))
        return gates[-1]
    yield gate
    for made in gates:
        made.refuse()


def _settle(future: Future, done: Future) -> None:
    """_settle gives the gate's future the outcome of the real submit's."""
    error = done.exception()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(done.result())


def another(nodes, conn, **options) -> sq.Connection:
    """another is one more connection to `conn`'s node, closed with the test's nodes."""
    options.setdefault("check_same_thread", False)
    made = sq.connect(conn._database.path, name=conn._database.name, **options)
    nodes.opened.append(made)
    return made


def counted_table(leader, follower) -> None:
    """counted_table makes table t of INSERT_NEXT on the leader and waits until the follower has it."""
    leader.execute("CREATE TABLE t(who TEXT PRIMARY KEY, n INTEGER)")
    follower.read_barrier()


def counts(conn) -> list[int]:
    """counts is column n of table t, in order."""
    return [n for (n,) in conn.execute("SELECT n FROM t ORDER BY n")]


def lock_free(database) -> bool:
    """lock_free: no writer holds the leader's write lock (a member that committed let it go once sent)."""
    return not database.write_lock.locked()


def sent_member_after(database, before: list):
    """sent_member_after is a predicate: a member not in `before` has its record sent (it was tried, and its
    writer let the write lock go, which it does once the record is handed to the log)."""
    return lambda: lock_free(database) and any(m.state is not RUNNING for m in database.machine.members
                                               if m not in before)


def finished(thread: threading.Thread, outcome: dict, what: str) -> dict:
    """finished waits (PROMPTLY_S) for a commit_in_thread to end and returns its outcome."""
    wait_until(lambda: not thread.is_alive(), PROMPTLY_S, f"{what}'s COMMIT never returned")
    return outcome


def committed_once_decided(conn, outcome: dict) -> None:
    """committed_once_decided: a writer that came while a record rolled back here may still reach the log
    either committed at once or waited for the log to decide it, refused "database is locked" past its
    timeout; then it commits (the same transaction, again) once the log decided."""
    if "error" in outcome:
        assert isinstance(outcome["error"], sq.OperationalError) and "database is locked" in str(outcome["error"]), \
            outcome
        conn.rollback()
        with conn:
            conn.execute(INSERT_NEXT, ("third",))
    else:
        assert outcome.get("ok"), outcome


def identical(leader, follower, sql: str = "SELECT * FROM t ORDER BY 1") -> list:
    """identical waits until the follower applied what the leader did, checks both files hold the same and
    neither node stopped; it returns the rows."""
    follower.read_barrier()
    wait_until(lambda: file_rows(leader._database.path, sql) == rows(follower, sql), PROMPTLY_S,
               lambda: f"the leader's file has {file_rows(leader._database.path, sql)}, the follower "
                       f"{rows(follower, sql)}")
    for conn in (leader, follower):
        assert conn._database.machine.failed is None, conn._database.machine.failed
    assert leader.position == follower.position
    return rows(follower, sql)


# -- readers and the group's one COMMIT --------------------------------------------------------------

def test_no_reader_sees_members_until_their_group_commits_and_no_commit_returns_before_it(nodes, gated):
    """Three members are in flight, held at the gate; then the first is in the log and applied (matched)
    while the other two are not. Neither time does another connection of the leader or a plain SQLite
    connection on its file see any of them, and no COMMIT returns; once all three are in the log the
    group commits them together, each having counted the ones before it."""
    leader, follower = pair(nodes)
    counted_table(leader, follower)
    database, machine, path = leader._database, leader._database.machine, leader._database.path
    reader = another(nodes, leader)
    gate = gated(leader)
    commits = []
    for i in (1, 2, 3):
        commits.append(commit_in_thread(another(nodes, leader), INSERT_NEXT, (f"member {i}",)))
        wait_until(lambda: gate.held == i and lock_free(database), PROMPTLY_S, f"member {i} was never sent")

    def nobody_sees_a_member() -> None:
        assert rows(reader) == [] and file_rows(path) == []
        assert not any(outcome for _, outcome in commits), commits

    nobody_sees_a_member()                                      # three in flight, none in the log
    through = machine.through
    gate.let_through(1)
    wait_until(lambda: machine.through != through, PROMPTLY_S, "the log never gave the first back")
    nobody_sees_a_member()                                      # the first is in the log: the group waits
    gate.let_through(2)
    for i, (thread, outcome) in enumerate(commits, 1):
        assert finished(thread, outcome, f"member {i}").get("ok"), outcome
    assert rows(reader) == identical(leader, follower) == [("member 1", 1), ("member 2", 2), ("member 3", 3)]
    assert keeps_nothing(machine)


def test_a_refused_append_drops_its_member_and_every_member_after_it(nodes, gated):
    """The first member reaches the log; the second's append is refused, and the third, built on the
    second, goes with it (refused as an ended leadership refuses it). The group commits the first
    alone, and the next transaction counts the first only."""
    leader, follower = pair(nodes)
    counted_table(leader, follower)
    database, machine = leader._database, leader._database.machine
    gate = gated(leader)
    commits = []
    for i in (1, 2, 3):
        commits.append(commit_in_thread(another(nodes, leader), INSERT_NEXT, (f"member {i}",)))
        wait_until(lambda: gate.held == i and lock_free(database), PROMPTLY_S, f"member {i} was never sent")
    through = machine.through
    gate.let_through(1)
    wait_until(lambda: machine.through != through, PROMPTLY_S, "the log never gave the first back")
    gate.refuse()
    gate.open()
    outcomes = [finished(thread, outcome, f"member {i}") for i, (thread, outcome) in enumerate(commits, 1)]
    assert outcomes[0].get("ok"), outcomes[0]
    for outcome in outcomes[1:]:
        assert isinstance(outcome.get("error"), sq.NotLeader), outcome
    assert file_rows(database.path) == [("member 1", 1)]
    with leader:
        leader.execute(INSERT_NEXT, ("next",))
    assert identical(leader, follower) == [("member 1", 1), ("next", 2)]
    assert keeps_nothing(machine)


def test_a_record_sent_in_an_ended_leadership_is_never_appended_even_when_its_node_leads_again(nodes, gated):
    """Two members are sent in the leader's epoch, held at the gate. The leader steps down: the first
    reaches the node while it does not lead (refused, never appended) and is dropped, with the second,
    built on it. The node leads again, in a new epoch; then the second reaches it: it was sent for the
    ended epoch, on a state the log never had, so it is refused too (submit_async's epoch)."""
    name = unique("epoch")
    leader = nodes.connect(name, "n0")
    wait_until(lambda: leader.is_leader, 30, "n0 never led")
    follower = nodes.connect(name, "n1", replica=True)              # it never campaigns: n0 leads again
    counted_table(leader, follower)
    database, node = leader._database, leader._database.node
    epoch = node.epoch
    gate = gated(leader)
    commits = []
    for i in (1, 2):
        commits.append(commit_in_thread(another(nodes, leader), INSERT_NEXT, (f"member {i}",)))
        wait_until(lambda: gate.held == i and lock_free(database), PROMPTLY_S, f"member {i} was never sent")
    node.step_down()
    wait_until(lambda: not leader.is_leader, PROMPTLY_S, "the leader never stepped down")
    gate.let_through(1)
    assert isinstance(finished(*commits[0], "the first").get("error"), sq.NotLeader), commits[0][1]
    wait_until(lambda: leader.is_leader, 30, "n0 never led again")
    assert node.epoch != epoch
    gate.let_through(1)
    assert isinstance(finished(*commits[1], "the second").get("error"), sq.NotLeader), commits[1][1]
    gate.open()
    with leader:
        leader.execute(INSERT_NEXT, ("next",))
    assert identical(leader, follower) == [("next", 1)]


# -- serializability ---------------------------------------------------------------------------------

@pytest.mark.parametrize("group", [True, False], ids=["group", "own-connections"])
def test_many_writers_reading_and_writing_through_the_group_lose_no_update(nodes, monkeypatch, group):
    """Six threads, each with its own connection, increment one counter 12 times each, three ways: an
    UPDATE n = n + 1; BEGIN IMMEDIATE, SELECT n, UPDATE n = ? (it wrote first: a member); BEGIN,
    SELECT n, UPDATE n = ? (it read first: on its own connection, "database is locked" if the file
    moved since, then retried). Every transaction also adds a row to t by INSERT_NEXT. No update is
    lost, every transaction counted all before it, and with the group on, members did join groups in
    flight (with it off, none did)."""
    leader, follower = pair(nodes)
    leader.execute("CREATE TABLE c(id INTEGER PRIMARY KEY, n INTEGER)")
    counted_table(leader, follower)
    with leader:
        leader.execute("INSERT INTO c VALUES (0, 0)")
    machine = leader._database.machine
    behind: list[int] = []
    new_member = machine._new_member

    def spy(epoch):
        member = new_member(epoch)
        behind.append(len(machine._group) - 1)            # members before it, in flight
        return member
    monkeypatch.setattr(machine, "_new_member", spy)
    errors: list = []

    def increment(conn, how: str, label: str) -> None:
        while True:
            try:
                if how == "update":
                    with conn:
                        conn.execute("UPDATE c SET n = n + 1")
                        conn.execute(INSERT_NEXT, (label,))
                    return
                conn.execute("BEGIN IMMEDIATE" if how == "immediate" else "BEGIN")
                (seen,) = conn.execute("SELECT n FROM c").fetchone()
                conn.execute("UPDATE c SET n = ?", (seen + 1,))
                conn.execute(INSERT_NEXT, (label,))
                conn.commit()
                return
            except sq.OperationalError as exc:
                conn.rollback()
                if how != "deferred" or "database is locked" not in str(exc):
                    raise

    def work(conn, how: str, k: int) -> None:
        try:
            for i in range(12):
                increment(conn, how, f"{how}-{k}-{i}")
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append((how, k, exc))
    threads = [threading.Thread(target=work, args=(another(nodes, leader, timeout=30.0, group_commit=group), how, k),
                                daemon=True)
               for k, how in enumerate(["update", "update", "immediate", "immediate", "deferred", "deferred"])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert not any(thread.is_alive() for thread in threads)
    assert rows(leader, "SELECT n FROM c") == [(72,)]
    assert counts(leader) == list(range(1, 73))
    identical(leader, follower, "SELECT * FROM c UNION ALL SELECT n, who FROM t ORDER BY 1, 2")
    if group:
        assert max(behind) >= 1, "no member ever joined a group in flight: the test did not test the group"
    else:
        assert not any(behind), "a transaction joined a group while group_commit was off"


def test_a_transaction_that_read_before_it_wrote_fails_database_is_locked_once_a_group_it_did_not_see_commits(nodes):
    """BEGIN; SELECT reads the file without the member in flight; its INSERT must not join the group
    (it would write on a state it did not read): it waits until the group drained and then fails as
    SQLite does, SQLITE_BUSY_SNAPSHOT."""
    leader, follower = pair(nodes)
    counted_table(leader, follower)
    database = leader._database
    reader = another(nodes, leader, timeout=30.0)
    with HeldAppend() as held:
        first = commit_in_thread(leader, INSERT_NEXT, ("member",))
        assert held.reached.wait(30)
        wait_until(lambda: lock_free(database), PROMPTLY_S, "the member was never sent")
        reader.execute("BEGIN")
        assert counts(reader) == []
        write = commit_in_thread(reader, INSERT_NEXT, ("read first",))
        wait_until(lambda: database.write_lock.locked(), PROMPTLY_S, "the reader's write never took the write lock")
        assert len(database.machine.members) == 1                 # it waits; it did not join
        held.release()
        assert finished(*first, "the member").get("ok"), first[1]
        error = finished(*write, "the reader").get("error")
    reader.rollback()
    assert isinstance(error, sq.OperationalError) and "database is locked" in str(error), error
    assert getattr(error, "sqlite_errorname", None) == "SQLITE_BUSY_SNAPSHOT", error
    assert identical(leader, follower) == [("member", 1)]


# -- a leader deposed with members in flight ---------------------------------------------------------

def test_a_leader_deposed_with_members_in_flight_keeps_those_in_the_log_drops_the_others_and_ends_identical(nodes):
    """The first member's entry is in the log (held before it is applied); two more members queue behind
    it. The leader's I/O thread stays frozen until its session is lost and the follower took over,
    recovered the first member and wrote one of its own. Then the old leader goes on: the first
    member commits, the two behind it fail and are dropped, and it applies the new leader's record."""
    leader, follower = pair(nodes)
    counted_table(leader, follower)
    database, machine = leader._database, leader._database.machine
    store = database.client.store
    with HeldAppend() as held:
        first = commit_in_thread(leader, INSERT_NEXT, ("in the log",))
        assert held.reached.wait(30)
        behind = []
        for i in (2, 3):
            before = machine.members
            behind.append(commit_in_thread(another(nodes, leader), INSERT_NEXT, (f"behind {i}",)))
            wait_until(sent_member_after(database, before), PROMPTLY_S, f"member {i} was never sent")
        store._heartbeat = lambda: None                               # frozen: its registrations lapse
        try:
            wait_until(lambda: follower.is_leader, 60, "the follower never took over from the frozen leader")
        finally:
            del store._heartbeat
        with follower:
            follower.execute(INSERT_NEXT, ("new leader",))
        assert rows(follower) == [("in the log", 1), ("new leader", 2)]
        assert file_rows(database.path) == []                         # the group is still open
        held.release()
        assert finished(*first, "the member in the log").get("ok"), first[1]
        for i, (thread, outcome) in enumerate(behind, 2):
            assert isinstance(finished(thread, outcome, f"member {i}").get("error"), (sq.NotLeader, sq.CommitFailed))
    wait_until(lambda: file_rows(database.path) == rows(follower), 30,
               lambda: f"the old leader has {file_rows(database.path)}, the new one {rows(follower)}")
    assert rows(follower) == [("in the log", 1), ("new leader", 2)]
    assert machine.failed is None and keeps_nothing(machine) and leader.position == follower.position


def third_then_release(database, third, held, first) -> None:
    """third_then_release commits a third transaction while the first is held, lets the first go, and checks
    that both COMMITs ended as the log decided."""
    before = database.machine.members
    last = commit_in_thread(third, INSERT_NEXT, ("third",))
    wait_until(lambda: sent_member_after(database, before)() or not last[0].is_alive(), PROMPTLY_S,
               "the third transaction was never sent")
    held.release()
    assert finished(*first, "the first").get("ok"), first[1]
    committed_once_decided(third, finished(*last, "the third"))


# -- an interrupt (KeyboardInterrupt) at each step of a member's life ----------------------------------

@pytest.mark.parametrize("function, line", [
    pytest.param(SqliteMachine.join, "member = self._new_member(epoch)", id="join-before-its-savepoint"),
    pytest.param(SqliteMachine.join, "SQLITE_DBCONFIG_ENABLE_TRIGGER, 1", id="join-after-its-savepoint"),
    pytest.param(SqliteMachine.settle, "member.record, member.state = record, KEPT", id="settle-after-its-trial"),
    pytest.param(Database.send, "return self._send(member, record)", id="send-before-the-append"),
    pytest.param(Database._send, "return", id="send-after-the-append"),
    pytest.param(Database.finish, "at = self._outcome(future)", id="finish-waiting-for-the-log"),
    pytest.param(Connection._commit, "database.finish(member, sent)", id="commit-after-letting-the-lock-go"),
])
def test_an_interrupt_in_a_members_commit_leaves_the_group_serial_and_the_nodes_identical(nodes, function, line):
    """A member is in the log, held before it is applied; the second transaction is interrupted at one
    line of its way from first write to COMMIT's end; a third commits while the first is still held.
    Whatever the second became (nothing, or a record in the log), the third counted every row the log
    puts before it, the COMMITs that returned are applied once, no node stops and the files are equal.

    Regression (fixed in 016de5b): interrupted right after join made its savepoint, the member was in
    the group with nobody running it, so the group never committed and every later write failed
    "database is locked"; interrupted after its append, or while waiting for the log, the member was
    rolled back while its record reached the log, and the third, joining at once, counted a state
    without it (n = 2 twice)."""
    leader, follower = pair(nodes)
    counted_table(leader, follower)
    database, machine = leader._database, leader._database.machine
    interrupted, third = another(nodes, leader, timeout=3.0), another(nodes, leader, timeout=1.0)
    try:
        with HeldAppend() as held:
            first = commit_in_thread(leader, INSERT_NEXT, ("first",))
            assert held.reached.wait(30)
            wait_until(lambda: lock_free(database), PROMPTLY_S, "the first member was never sent")
            with interrupting(function, line) as fired:
                with pytest.raises(Interrupted):
                    interrupted.execute(INSERT_NEXT, ("interrupted",))
                    interrupted.commit()
            assert fired
            interrupted.rollback()
            assert not any(m.state is RUNNING for m in machine.members), "a member nobody runs is left in the group"
            third_then_release(database, third, held, first)
        held_rows = identical(leader, follower)
        assert [who for who, _ in held_rows if who != "interrupted"] == ["first", "third"]
        assert counts(leader) == list(range(1, len(held_rows) + 1)), held_rows
        assert keeps_nothing(machine)
    finally:
        _unwedge(machine)


def _unwedge(machine) -> None:
    """_unwedge stops a node whose group holds a member nobody runs (an interrupted join's): the COMMITs
    waiting for that group end (ReplicaStopped), so the test's nodes close."""
    if any(m.state is RUNNING and machine._running is not m for m in machine.members):
        machine.failed = sq.ReplicaStopped("the test left this node's group with a member nobody runs", None)


# -- the group ended while members are in flight -------------------------------------------------------

@pytest.fixture
def started():
    """started is a function of the database's definition (registered before the nodes connect, so no group
    is ended by it), called as `NAME()`, that sets the returned Event: a statement calling it runs."""
    event, name = threading.Event(), unique("started")
    sq.create_function(name, 0, lambda: event.set() or 1)
    yield name, event
    definition._registered.pop(("function", name.lower(), 0), None)


def _on_conflict_rollback(conn, started) -> None:
    """_on_conflict_rollback: a statement of the running member meets UNIQUE ... ON CONFLICT ROLLBACK, and
    SQLite rolls back the apply connection's whole transaction."""
    with pytest.raises(sq.IntegrityError):
        conn.execute("INSERT INTO u VALUES (2, 1)")


def _interrupted_statement(conn, started) -> None:
    """_interrupted_statement: the running member's long INSERT is interrupted (Connection.interrupt, as a
    watchdog does); SQLite rolls back the whole transaction an interrupted INSERT is in."""
    name, running = started
    outcome: list = []

    def insert() -> None:
        try:
            conn.execute(f"INSERT INTO u(v) WITH RECURSIVE s(v) AS (SELECT {name}() + 10 UNION ALL SELECT v + 1 "
                         f"FROM s WHERE v < 1000000000) SELECT v FROM s")
        except BaseException as exc:  # noqa: BLE001 - judged below
            outcome.append(exc)
    statement = threading.Thread(target=insert, daemon=True)
    statement.start()
    assert running.wait(PROMPTLY_S), "the long statement never started"
    conn.interrupt()
    statement.join(PROMPTLY_S)
    assert not statement.is_alive() and isinstance(outcome[0], sq.OperationalError), outcome
    assert "interrupted" in str(outcome[0])


def _definition_registered(conn, started) -> None:
    """_definition_registered: walkit.adapters.sqlite.create_function after connect ends the group."""
    name = unique("late_fn")
    sq.create_function(name, 1, lambda x: x, deterministic=True)
    definition._registered.pop(("function", name.lower(), 1), None)


@pytest.mark.parametrize("end, matched", [
    pytest.param(_on_conflict_rollback, True, id="on-conflict-rollback-the-member-before-matched"),
    pytest.param(_on_conflict_rollback, False, id="on-conflict-rollback-the-member-before-in-flight"),
    pytest.param(_interrupted_statement, False, id="interrupted-statement-the-member-before-in-flight"),
    pytest.param(_definition_registered, False, id="definition-registered-the-member-before-in-flight"),
])
def test_a_group_ended_under_its_members_commits_the_matched_and_the_next_writer_counts_every_one(started, nodes,
                                                                                                 end, matched):
    """The first member is in the log, either applied (matched: the group waits for the second, running)
    or held before it is applied; then the group ends under it (the second, if any, running its last
    statement). The first's COMMIT returns and it is applied once, the second is gone, and the next
    writer counts the first.

    Regression (fixed in 016de5b): the group ended rolled back the first while its record was still
    on its way to the log, and nothing kept the next writer out until the log gave it back: the third
    joined a new group on a state without it and counted 0 rows before it (with an UPDATE instead,
    its changeset conflicted and every node stopped at its record)."""
    leader, follower = pair(nodes)
    counted_table(leader, follower)
    leader.execute("CREATE TABLE u(id INTEGER PRIMARY KEY, v UNIQUE ON CONFLICT ROLLBACK)")
    with leader:
        leader.execute("INSERT INTO u VALUES (1, 1)")
    database, machine = leader._database, leader._database.machine
    second, third = another(nodes, leader), another(nodes, leader, timeout=1.0)
    with HeldAppend() as held:
        first = commit_in_thread(leader, INSERT_NEXT, ("first",))
        assert held.reached.wait(30)
        wait_until(lambda: lock_free(database), PROMPTLY_S, "the first member was never sent")
        if end is not _definition_registered:                   # registering waits for a running member
            second.execute(INSERT_NEXT, ("second",))
        if matched:
            held.release()
            wait_until(lambda: machine.members[0].state is MATCHED, PROMPTLY_S, "the first was never matched")
        end(second, started)
        second.rollback()
        third_then_release(database, third, held, first)
    assert identical(leader, follower) == [("first", 1), ("third", 2)]
    assert keeps_nothing(machine)


# -- a write forwarded from a follower -----------------------------------------------------------------

def test_a_forwarded_write_joins_the_group_and_a_forwarded_read_then_write_fails_database_is_locked(nodes):
    """A follower's write transaction, run on the leader, joins the group behind a member in flight and
    counts it; its COMMIT returns once the follower applied it. A follower's transaction that read its
    own copy (without the member in flight on the leader) and then writes is refused, "database is
    locked", as a local one is."""
    leader, follower = pair(nodes, forward_address="127.0.0.1")
    counted_table(leader, follower)
    database, machine = leader._database, leader._database.machine
    with HeldAppend() as held:
        first = commit_in_thread(leader, INSERT_NEXT, ("leader",))
        assert held.reached.wait(30)
        wait_until(lambda: lock_free(database), PROMPTLY_S, "the first member was never sent")
        before = machine.members
        forwarded = commit_in_thread(follower, INSERT_NEXT, ("forwarded",))
        wait_until(sent_member_after(database, before), PROMPTLY_S, "the forwarded write never joined the group")
        held.release()
        assert finished(*first, "the leader's").get("ok"), first[1]
        assert finished(*forwarded, "the forwarded").get("ok"), forwarded[1]
    assert counts(follower) == [1, 2]                        # its COMMIT returned once applied there
    reader = another(nodes, follower)
    with HeldAppend() as held:
        second = commit_in_thread(leader, INSERT_NEXT, ("leader again",))
        assert held.reached.wait(30)
        wait_until(lambda: lock_free(database), PROMPTLY_S, "the member was never sent")
        reader.execute("BEGIN")
        assert counts(reader) == [1, 2]                      # the follower's state: without the member
        with pytest.raises(sq.OperationalError, match="database is locked"):
            reader.execute(INSERT_NEXT, ("read first",))
        reader.rollback()
        held.release()
        assert finished(*second, "the leader's").get("ok"), second[1]
    assert [who for who, _ in identical(leader, follower)] == ["forwarded", "leader", "leader again"]


# -- a snapshot taken mid-group ----------------------------------------------------------------------

def test_a_snapshot_taken_mid_group_holds_the_matched_members_and_a_node_restored_from_it_ends_identical(
        nodes, monkeypatch):
    """A snapshot is taken when the first member was applied (matched) and the second still runs, the
    file holding neither. The copy holds the first and not the second; a node that starts from that
    snapshot ends as the others."""
    leader, follower = pair(nodes)
    counted_table(leader, follower)
    database, machine = leader._database, leader._database.machine
    copies: list = []
    apply_to_copy = machine._apply_to_copy

    def spy(path, applied):
        apply_to_copy(path, applied)
        copies.append(file_rows(path))
    monkeypatch.setattr(machine, "_apply_to_copy", spy)
    second = another(nodes, leader)
    with HeldAppend() as held:
        first = commit_in_thread(leader, INSERT_NEXT, ("first",))
        assert held.reached.wait(30)
        wait_until(lambda: lock_free(database), PROMPTLY_S, "the first member was never sent")
        second.execute(INSERT_NEXT, ("second",))
        held.release()
        wait_until(lambda: machine.members[0].state is MATCHED, PROMPTLY_S, "the first was never matched")
        assert database.node.snapshot_now(30) is not None
        assert copies == [[("first", 1)]] and file_rows(database.path) == []
        second.commit()
        assert finished(*first, "the first").get("ok"), first[1]
    restored: list = []
    restore = SqliteMachine.restore

    def restore_spy(self, src):
        restored.append(self.path)
        return restore(self, src)
    monkeypatch.setattr(SqliteMachine, "restore", restore_spy)
    late = nodes.connect(database.name, "late")
    late.read_barrier()
    assert late._database.path in restored
    assert rows(late) == identical(leader, follower) == [("first", 1), ("second", 2)]
    assert late.position == leader.position


# -- what a member reads, and its connection's own settings -------------------------------------------

@pytest.mark.parametrize("reaches_the_log", [True, False], ids=["read-member-in-the-log", "read-member-refused"])
def test_a_transaction_that_read_members_in_flight_and_wrote_nothing_commits_only_once_they_are_in_the_file(
        nodes, gated, reaches_the_log):
    """BEGIN IMMEDIATE joins the group and reads the member before it, in flight (the SQLite guide: what
    a transaction of a group reads may not be in the log yet). Its COMMIT, with nothing to write, returns
    only once that member is in the log and in the file, and fails (CommitFailed) if it never is.

    Regression (fixed in af84fbf): the COMMIT returned at once, having read a member that might never
    reach the log."""
    leader, follower = pair(nodes)
    counted_table(leader, follower)
    database, path = leader._database, leader._database.path
    reader = another(nodes, leader)
    gate = gated(leader)
    first = commit_in_thread(leader, INSERT_NEXT, ("in flight",))
    wait_until(lambda: gate.held == 1 and lock_free(database), PROMPTLY_S, "the member was never sent")
    reader.execute("BEGIN IMMEDIATE")
    assert counts(reader) == [1]                                     # it reads the member before it
    file_at_commit: list = []
    outcome: dict = {}

    def commit() -> None:
        try:
            reader.commit()
            file_at_commit.append(file_rows(path))
            outcome["ok"] = True
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            outcome["error"] = exc
    committing = threading.Thread(target=commit, daemon=True)
    committing.start()
    wait_until(lambda: len(database.machine.members) == 1, PROMPTLY_S, "the reader never left the group")
    assert committing.is_alive()                                     # it waits for what it read
    if reaches_the_log:
        gate.let_through(1)
        assert finished(committing, outcome, "the reader").get("ok"), outcome
        assert file_at_commit == [[("in flight", 1)]]
        assert finished(*first, "the member").get("ok"), first[1]
    else:
        gate.refuse()
        assert isinstance(finished(committing, outcome, "the reader").get("error"), sq.CommitFailed), outcome
        assert isinstance(finished(*first, "the member").get("error"), sq.NotLeader), first[1]
    gate.open()
    assert identical(leader, follower) == ([("in flight", 1)] if reaches_the_log else [])


def test_a_pragma_set_inside_a_member_stays_on_its_own_connection(nodes):
    """A PRAGMA that sets something, run in a transaction of the group, is the connection's own, as in
    sqlite3: its later writes fail, the other connections' do not.

    Regression (fixed in af84fbf and 375cce6): it ran on the apply connection; PRAGMA query_only = ON
    there made every later write of every connection fail."""
    leader, follower = pair(nodes)
    counted_table(leader, follower)
    mine, other = another(nodes, leader), another(nodes, leader)
    mine.execute(INSERT_NEXT, ("mine",))
    mine.execute("PRAGMA query_only = ON")
    mine.commit()
    with other:
        other.execute(INSERT_NEXT, ("other",))
    with pytest.raises(sq.OperationalError, match="readonly"):
        mine.execute(INSERT_NEXT, ("mine again",))
    mine.rollback()
    assert identical(leader, follower) == [("mine", 1), ("other", 2)]
