"""A review of commit 436cd28: the apply connection's commit hook, the trial made one step with the append, and the skip look-up.

The hook (machine._refuse_commits) refuses every commit of the apply connection that writes
the file unless the machine set `_may_commit`. These tests drive every legitimate path that
writes the file through that connection (records with schema steps of each kind, a skip
record, a definition registered later, a snapshot restored into a new and into an older file,
a node started from a snapshot, `restore`) and check that none is refused: no node stops and
every file ends as the leader's. They also check that the write lock's drop of a stale trial
never drops a live one while writers race.
"""

from __future__ import annotations

import io
import threading

import pytest

apsw = pytest.importorskip("apsw")

import walkit.adapters.sqlite as sq                                          # noqa: E402
from walkit.adapters.sqlite.machine import SqliteMachine                    # noqa: E402
from walkit.adapters.sqlite.records import Transaction                      # noqa: E402
from walkit.core.loglist import Position                                    # noqa: E402
from walkit.testing.processes import wait_until                             # noqa: E402

from .sqlite_review_helpers import file_rows                                 # noqa: E402
from .sqlitehelpers import cluster, log_records, nodes, unique               # noqa: E402,F401 - fixtures

#: Schema statements of every kind a record carries, with data changes between them.
SCHEMA_STEPS = [
    "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)",
    "INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, 'c')",
    "CREATE TABLE c AS SELECT id, v || '!' AS w FROM t WHERE id > 1",
    "ALTER TABLE t ADD COLUMN extra INTEGER DEFAULT 5",
    "ALTER TABLE c RENAME TO c2",
    "ALTER TABLE c2 RENAME COLUMN w TO ww",
    "CREATE INDEX t_v ON t(v)",
    "CREATE UNIQUE INDEX c2_ww ON c2(ww)",
    "CREATE VIEW tv AS SELECT id, v FROM t",
    "CREATE TABLE audit(id INTEGER PRIMARY KEY AUTOINCREMENT, what)",
    "CREATE TRIGGER t_audit AFTER UPDATE ON t BEGIN INSERT INTO audit(what) VALUES (new.id); END",
    "UPDATE t SET v = 'B' WHERE id = 2",
    "DROP TRIGGER t_audit",
    "DROP VIEW tv",
    "DROP INDEX t_v",
    "CREATE TABLE gone(x)",
    "DROP TABLE gone",
]


def schema_and_rows(read) -> list:
    """schema_and_rows is what must be equal on every node: the schema (not the position table) and the rows."""
    schema = read("SELECT type, name, sql FROM sqlite_schema WHERE name NOT LIKE '_walkit%' "
                  "AND name NOT LIKE 'sqlite_%' ORDER BY name")
    tables = [row[1] for row in schema if row[0] == "table"]
    return [schema] + [read(f"SELECT * FROM {table} ORDER BY 1") for table in tables]


def conn_reader(conn):
    return lambda sql: conn.execute(sql).fetchall()


def file_reader(path):
    return lambda sql: file_rows(path, sql)


def sql_record(*statements: str) -> bytes:
    """sql_record is a transaction record of SQL steps, for a machine without a log."""
    made = Transaction(commit_ms=1, node="n1")
    for statement in statements:
        made.add_sql(statement)
    return made.encode()


def pair(nodes, name, **options):
    first = nodes.connect(name, "n0", **options)
    second = nodes.connect(name, "n1", **options)
    wait_until(lambda: first.is_leader or second.is_leader, 30, "no leader")
    return (first, second) if first.is_leader else (second, first)


def assert_running(*conns) -> None:
    for conn in conns:
        database = conn._database
        assert database.machine.failed is None, f"{database.node_id} stopped: {database.machine.failed}"
        assert database.node.failed is None, f"{database.node_id} stopped: {database.node.failed}"
        assert getattr(database.machine, "_may_commit", False) is False


# -- the bare machine: every kind of step, a skip, a definition, snapshots ------------------------------

def test_the_machine_commits_every_kind_of_schema_step_a_skip_and_a_definition_under_the_hook(tmp_path):
    machine = SqliteMachine(str(tmp_path / "m.db"), "hook")
    machine.find_skip = lambda at: at == (1, len(SCHEMA_STEPS), 0)
    try:
        for entry, statement in enumerate(SCHEMA_STEPS):
            assert machine.apply(sql_record(statement), Position(1, entry)) == (1, entry, 0), statement
            assert machine.position == (1, entry, 0)
        # a record that fails and that the log skips: an empty transaction moves the position
        skipped = len(SCHEMA_STEPS)
        machine.apply(sql_record("INSERT INTO nowhere VALUES (1)"), Position(1, skipped))
        assert machine.failed is None and machine.position == (1, skipped, 0)
        # PRAGMA user_version as a record's step, and several steps in one record
        machine.apply(sql_record("PRAGMA user_version = 7", "INSERT INTO t(id, v) VALUES (9, 'z')"),
                      Position(1, skipped + 1))
        # a definition registered after the file opened, used by the schema
        machine.register(lambda db: db.create_scalar_function("review_hook_double", lambda x: 2 * x, 1,
                                                              deterministic=True))
        machine.apply(sql_record("CREATE TABLE d(x INTEGER CHECK (review_hook_double(x) < 100))",
                                 "INSERT INTO d VALUES (3)"), Position(1, skipped + 2))
        assert machine.failed is None and machine.position == (1, skipped + 2, 0)
        path = machine.path
        assert file_rows(path, "PRAGMA user_version") == [(7,)]
        assert file_rows(path, "SELECT * FROM t ORDER BY 1") == [(1, "a", 5), (2, "B", 5), (3, "c", 5), (9, "z", 5)]
        assert file_rows(path, "SELECT * FROM c2 ORDER BY 1") == [(2, "b!"), (3, "c!")]
        assert file_rows(path, "SELECT what FROM audit") == []      # triggers are off on the apply connection
        assert file_rows(path, "SELECT * FROM d") == [(3,)]
        assert file_rows(path, "SELECT ledger, entry, record FROM _walkit_position") == [(1, skipped + 2, 0)]
        assert getattr(machine, "_may_commit", False) is False and not machine.db.in_transaction
    finally:
        machine.close()


def test_a_snapshot_restores_into_a_new_and_into_an_older_file_and_both_go_on_applying(tmp_path):
    source = SqliteMachine(str(tmp_path / "source.db"), "snap")
    fresh = SqliteMachine(str(tmp_path / "fresh.db"), "snap")
    older = SqliteMachine(str(tmp_path / "older.db"), "snap")
    try:
        for entry, statement in enumerate(SCHEMA_STEPS):
            source.apply(sql_record(statement), Position(1, entry))
            if entry < 3:
                older.apply(sql_record(statement), Position(1, entry))
        image = io.BytesIO()
        source.snapshot(image)()
        for target in (fresh, older):
            image.seek(0)
            target.restore(image)
            assert target.position == source.position and target.failed is None
            assert getattr(target, "_may_commit", False) is False
            after = len(SCHEMA_STEPS)
            target.apply(sql_record("INSERT INTO t(id, v) VALUES (10, 'after')"), Position(1, after))
            assert target.position == (1, after, 0)
        source.apply(sql_record("INSERT INTO t(id, v) VALUES (10, 'after')"), Position(1, len(SCHEMA_STEPS)))
        expected = schema_and_rows(file_reader(source.path))
        assert schema_and_rows(file_reader(fresh.path)) == expected
        assert schema_and_rows(file_reader(older.path)) == expected
    finally:
        for machine in (source, fresh, older):
            machine.close()


def test_the_hook_still_refuses_a_commit_the_machine_did_not_make(tmp_path):
    # The control: the tests above would pass with no hook at all; this shows it is installed.
    machine = SqliteMachine(str(tmp_path / "ctl.db"), "ctl")
    try:
        machine.apply(sql_record("CREATE TABLE t(id INTEGER PRIMARY KEY)"), Position(1, 0))
        with pytest.raises(apsw.ConstraintError):
            machine.db.execute("INSERT INTO t VALUES (1)")
        assert file_rows(machine.path) == []
    finally:
        machine.close()


# -- nodes: schema steps replicated, a node from a snapshot, restore -------------------------------------

def test_schema_steps_and_definitions_replicate_to_a_follower_a_node_started_from_a_snapshot_and_a_restore(
        nodes, tmp_path):
    name = unique("hook")
    leader, follower = pair(nodes, name, snapshot_every_records=4, roll_entries=4)
    for statement in SCHEMA_STEPS:
        with leader:
            leader.execute(statement)
    leader.execute("PRAGMA user_version = 7")                 # whatever it does, nothing stops
    with leader:
        leader.execute("UPDATE t SET v = 'C' WHERE id = 3")
    follower.read_barrier()
    assert_running(leader, follower)
    expected = schema_and_rows(conn_reader(leader))
    assert schema_and_rows(conn_reader(follower)) == expected
    restored = str(tmp_path / "restored.db")                  # before the definitions: see the last test
    sq.restore(name, restored, client=nodes.cluster.client())
    assert schema_and_rows(file_reader(restored)) == expected
    sq.create_collation("review_hook_rev", lambda a, b: (a < b) - (a > b))
    sq.create_function("review_hook_double", 1, lambda x: 2 * x, deterministic=True)
    with leader:
        leader.execute("CREATE TABLE d(x TEXT COLLATE review_hook_rev, n INTEGER CHECK (review_hook_double(n) < 100))")
        leader.execute("CREATE INDEX d_x ON d(x)")
        leader.execute("INSERT INTO d VALUES ('a', 1), ('b', 2)")
    client = leader._database.client
    from walkit.replication.snapshots import read_pointer
    wait_until(lambda: read_pointer(client.store, name)[0], 30, "no snapshot was published")
    late = nodes.connect(name, "late")
    late.read_barrier()
    assert_running(late)
    assert late._database.node.snapshot_position is not None, "the new node did not load a snapshot"
    with leader:
        leader.execute("INSERT INTO t(id, v) VALUES (20, 'after the snapshot')")
        leader.execute("INSERT INTO d VALUES ('c', 3)")
    late.read_barrier()
    follower.read_barrier()
    assert_running(leader, follower, late)
    expected = schema_and_rows(conn_reader(leader))
    assert schema_and_rows(conn_reader(late)) == expected == schema_and_rows(conn_reader(follower))


def test_racing_local_writers_never_lose_a_commit_to_the_write_locks_drop_of_a_stale_trial(nodes):
    # _write_locked drops a trial still kept; if it could drop a live one (a commit whose record is in
    # the log and not yet applied), that record would be applied again from scratch, or a commit lost.
    name = unique("race")
    leader, follower = pair(nodes, name)
    with leader:
        leader.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, writer, k)")
    path = leader._database.path
    writers, each = 4, 12
    errors: list = []

    def write(w: int) -> None:
        conn = sq.connect(path, name=name, node_id="n0" if leader._database.node_id == "n0" else "n1",
                          client=leader._database.client, check_same_thread=False)
        try:
            for k in range(each):
                with conn:
                    conn.execute("INSERT INTO t(writer, k) VALUES (?, ?)", (w, k))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            conn.close()
    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads), "a writer hangs"
    assert not errors, errors
    follower.read_barrier()
    assert_running(leader, follower)
    want = sorted((w, k) for w in range(writers) for k in range(each))
    assert sorted(leader.execute("SELECT writer, k FROM t").fetchall()) == want
    assert sorted(follower.execute("SELECT writer, k FROM t").fetchall()) == want
    assert len(log_records(leader)) == 1 + writers * each


def test_restore_of_a_database_whose_check_constraint_uses_a_registered_function(nodes, tmp_path):
    # Regression (older than 436cd28): restore._finish ran PRAGMA integrity_check on a plain apsw
    # connection without the database's definitions (definition.register_all), and integrity_check
    # evaluates CHECK constraints, so a schema whose CHECK calls a function registered with
    # walkit.adapters.sqlite.create_function made every restore fail with "unknown function".
    name = unique("restorefn")
    leader, follower = pair(nodes, name)
    sq.create_function("review_hook_triple", 1, lambda x: 3 * x, deterministic=True)
    with leader:
        leader.execute("CREATE TABLE d(x INTEGER CHECK (review_hook_triple(x) < 100))")   # a collated index fails too
        leader.execute("INSERT INTO d VALUES (4)")
    follower.read_barrier()
    assert_running(leader, follower)
    restored = str(tmp_path / "restored.db")
    sq.restore(name, restored, client=nodes.cluster.client())
    assert file_rows(restored, "SELECT * FROM d") == [(4,)]


@pytest.mark.parametrize("old, new", [(1, 2), (2, 1), (5, 40), (40, 5)])
def test_deleting_a_row_and_inserting_another_with_its_value_of_a_unique_on_conflict_rollback_column(nodes, old, new):
    # A plain "replace a row" (DELETE one row, INSERT another with its UNIQUE ON CONFLICT ROLLBACK
    # value) commits when its changeset lists the DELETE first, and is refused with IntegrityError
    # when it lists the INSERT first (here (2, 1) and (5, 40)): the INSERT meets the old row, and the
    # clause rolls the whole apply back (docs/guides/sqlite.md#guarantees says so). Before 436cd28 the
    # refused ones left the leader's file holding what the log does not; the review found them refused
    # with OperationalError "query aborted", now IntegrityError. Either way the files agree.
    name = unique("rbk")
    leader, follower = pair(nodes, name)
    with leader:
        leader.execute("CREATE TABLE u(id INTEGER PRIMARY KEY, k TEXT UNIQUE ON CONFLICT ROLLBACK)")
        leader.execute("INSERT INTO u VALUES (?, 'x')", (old,))
    error = None
    try:
        with leader:
            leader.execute("DELETE FROM u WHERE id = ?", (old,))
            leader.execute("INSERT INTO u VALUES (?, 'x')", (new,))
    except sq.Error as exc:
        error = exc
    follower.read_barrier()
    assert_running(leader, follower)
    assert file_rows(leader._database.path, "SELECT * FROM u") == follower.execute("SELECT * FROM u").fetchall()
    assert error is None or isinstance(error, sq.IntegrityError), f"refused with {error!r}, not IntegrityError"
    expected = [(old, "x")] if error is not None else [(new, "x")]
    assert follower.execute("SELECT * FROM u").fetchall() == expected


def test_a_write_gives_up_after_its_timeout_while_the_apply_thread_waits_for_another_programs_lock(nodes):
    # Regression (436cd28): Connection._write_locked called machine.drop_trial(), which took
    # SqliteMachine._using with no timeout. While the apply thread holds _using in begin_immediate (a
    # record to apply, and another program holding the file's write lock: begin_immediate waits as
    # long as it takes), a write on the leader waited there for good instead of raising "database is
    # locked" after connect's `timeout`, as it did before (its own statement met the other program's
    # lock). Now it looks for a kept trial first and waits at most that timeout
    # (SqliteMachine.drop_trial with a timeout). A record the leader applies while no writer holds the write
    # lock is one a failed or interrupted commit left in the log, or the old leader's tail on a new
    # leader; here it is appended straight through the node.
    name = unique("busy")
    leader, follower = pair(nodes, name)
    with leader:
        leader.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")
    database = leader._database
    before = database.machine.position
    other = apsw.Connection(database.path)                  # another program
    outcome: list = []
    writer = conn = None
    try:
        other.execute("BEGIN IMMEDIATE")
        made = Transaction(commit_ms=1, node=database.node_id)
        made.add_sql("CREATE TABLE left_in_the_log(x)")
        database.node.submit_async(made.encode())
        wait_until(lambda: database.machine._using.locked(), 30, "the apply thread does not wait for the file")
        assert database.machine.position == before
        conn = sq.connect(database.path, name=name, node_id=database.node_id, client=database.client,
                          timeout=0.5, check_same_thread=False)

        def write() -> None:
            try:
                conn.execute("INSERT INTO t VALUES (1, 'x')")
                outcome.append("committed")
            except BaseException as exc:  # noqa: BLE001 - judged below
                outcome.append(exc)
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        writer.join(10)                                     # 20 times the timeout
        hung = writer.is_alive()
    finally:
        if other.in_transaction:
            other.execute("ROLLBACK")
        other.close()
        if writer is not None:
            writer.join(60)
        if conn is not None:
            conn.close()
    assert not hung, "the write waited past its timeout (10 s for timeout=0.5) for the apply thread"
    assert isinstance(outcome[0], sq.OperationalError), outcome
