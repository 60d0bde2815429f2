"""The DB-API 2.0 surface of walkit.adapters.sqlite, on a leader node over in-process bookies (fast tier)."""

from __future__ import annotations

import datetime
import sqlite3

import pytest

import walkit.adapters.sqlite as sq

from .sqlitehelpers import Nodes, log_records, memory_cluster, unique


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    directory = tmp_path_factory.mktemp("sqlite-dbapi")
    with memory_cluster(directory) as cluster:
        made = Nodes(cluster, directory)
        yield made
        made.close()


@pytest.fixture(scope="module")
def conn(nodes):
    """conn is the leader of a database shared by this module's tests (each uses its own tables)."""
    connection = nodes.connect(unique("dbapi"), "leader")
    assert connection.is_leader
    return connection


def test_module_attributes():
    assert sq.apilevel == "2.0" and sq.paramstyle == "qmark" and sq.threadsafety in (1, 3)
    assert sq.sqlite_version_info >= (3, 50)
    assert issubclass(sq.IntegrityError, sq.DatabaseError) and issubclass(sq.DatabaseError, sq.Error)
    assert sq.IntegrityError is sqlite3.IntegrityError          # code catching sqlite3's classes catches ours
    assert issubclass(sq.NotLeader, sq.OperationalError)
    assert sq.complete_statement("select 1;") and not sq.complete_statement("select 1")


def test_execute_fetch_description_rowcount_lastrowid(conn):
    cur = conn.cursor()
    cur.execute("CREATE TABLE people(id INTEGER PRIMARY KEY, name TEXT, age INTEGER)")
    assert cur.description is None and cur.rowcount == -1
    cur.execute("INSERT INTO people(name, age) VALUES (?, ?)", ("ann", 31))
    assert cur.lastrowid == 1 and cur.rowcount == 1
    cur.execute("INSERT INTO people(name, age) VALUES (:name, :age)", {"name": "bob", "age": 42})
    assert cur.lastrowid == 2
    cur.executemany("INSERT INTO people(name, age) VALUES (?, ?)", [("cy", 5), ("di", 6), ("ed", 7)])
    assert cur.rowcount == 3
    conn.commit()
    cur.execute("SELECT id, name FROM people ORDER BY id")
    assert [d[0] for d in cur.description] == ["id", "name"] and cur.rowcount == -1
    assert cur.fetchone() == (1, "ann")
    assert cur.fetchmany(2) == [(2, "bob"), (3, "cy")]
    assert cur.fetchall() == [(4, "di"), (5, "ed")]
    assert cur.fetchone() is None
    cur.execute("SELECT * FROM people WHERE id < 0")
    assert [d[0] for d in cur.description] == ["id", "name", "age"] and cur.fetchall() == []
    cur.execute("UPDATE people SET age = age + 1 WHERE age < 10")
    assert cur.rowcount == 3
    conn.commit()
    assert [row for row in conn.execute("SELECT age FROM people WHERE age < 10 ORDER BY id")] == [(6,), (7,), (8,)]


def test_parameter_styles_and_types(conn):
    conn.execute("CREATE TABLE vals(a, b, c, d, e)")
    with conn:
        conn.execute("INSERT INTO vals VALUES (?, ?, ?, ?, ?)", (1, 2.5, "x", b"\x00\xff", None))
        conn.execute("INSERT INTO vals VALUES (?1, ?2, ?3, ?4, ?5)", (2, 3.5, "y", None, 7))
        conn.execute("INSERT INTO vals VALUES (:a, :b, :c, :d, :e)", dict(a=3, b=0.0, c="z", d=memoryview(b"m"), e=True))
    assert conn.execute("SELECT * FROM vals ORDER BY a").fetchall() == [
        (1, 2.5, "x", b"\x00\xff", None), (2, 3.5, "y", None, 7), (3, 0.0, "z", b"m", 1)]
    with pytest.raises(sq.ProgrammingError):
        conn.execute("SELECT ?", (1, 2))
    with pytest.raises(sq.ProgrammingError):
        conn.execute("SELECT ?", (object(),))


def test_row_factory_and_converters(conn):
    conn.execute("CREATE TABLE events(id INTEGER PRIMARY KEY, day date, at timestamp)")
    day, at = datetime.date(2024, 2, 29), datetime.datetime(2024, 2, 29, 12, 30, 1, 5000)
    with conn:
        conn.execute("INSERT INTO events(day, at) VALUES (?, ?)", (day, at))
    cur = conn.cursor()
    cur.row_factory = sq.Row
    row = cur.execute("SELECT id, day, at FROM events").fetchone()
    assert row["ID"] == row[0] == 1 and row.keys() == ["id", "day", "at"] and row["day"] == "2024-02-29"
    typed = sq.connect(conn._database.path, name=conn._database.name, detect_types=sq.PARSE_DECLTYPES,
                       check_same_thread=False)
    try:
        assert typed.execute("SELECT day, at FROM events").fetchone() == (day, at)
        assert typed.execute("SELECT day || '' FROM events").fetchone()[0] == "2024-02-29"   # no declared type
    finally:
        typed.close()


def test_with_block_commits_and_rolls_back_and_sql_errors_leave_the_log_untouched(conn):
    conn.execute("CREATE TABLE ledger_rows(k TEXT PRIMARY KEY, v INTEGER)")
    with conn:
        conn.execute("INSERT INTO ledger_rows VALUES ('a', 1)")
    before = len(log_records(conn))
    with pytest.raises(sq.IntegrityError):
        with conn:
            conn.execute("INSERT INTO ledger_rows VALUES ('b', 2)")
            conn.execute("INSERT INTO ledger_rows VALUES ('a', 3)")      # duplicate key
    with pytest.raises(sq.OperationalError):
        with conn:
            conn.execute("UPDATE ledger_rows SET v = 9")
            conn.execute("UPDATE no_such_table SET v = 9")
    conn.execute("INSERT INTO ledger_rows VALUES ('c', 3)")
    conn.rollback()
    assert not conn.in_transaction
    assert conn.execute("SELECT * FROM ledger_rows").fetchall() == [("a", 1)]
    assert len(log_records(conn)) == before, "a rolled-back transaction reached the log"


def test_explicit_transactions_savepoints_and_autocommit(conn):
    conn.execute("CREATE TABLE sp(x INTEGER PRIMARY KEY)")
    conn.execute("BEGIN")
    conn.execute("INSERT INTO sp VALUES (1)")
    conn.execute("SAVEPOINT inner_sp")
    conn.execute("INSERT INTO sp VALUES (2)")
    conn.execute("ROLLBACK TO inner_sp")
    conn.execute("RELEASE inner_sp")
    conn.execute("INSERT INTO sp VALUES (3)")
    conn.execute("COMMIT")
    assert conn.execute("SELECT x FROM sp").fetchall() == [(1,), (3,)]
    conn.isolation_level = None                                     # autocommit: each statement commits
    try:
        conn.execute("INSERT INTO sp VALUES (4)")
        assert not conn.in_transaction
        conn.execute("SAVEPOINT outer_sp")
        conn.execute("INSERT INTO sp VALUES (5)")
        conn.execute("RELEASE outer_sp")                            # releasing the outermost one commits
    finally:
        conn.isolation_level = ""
    assert conn.execute("SELECT x FROM sp ORDER BY x").fetchall() == [(1,), (3,), (4,), (5,)]
    with pytest.raises(sq.OperationalError):
        conn.execute("COMMIT")


def test_executescript_and_one_statement_per_execute(conn):
    conn.executescript("""
        CREATE TABLE script_t(a INTEGER PRIMARY KEY, b);   -- a comment
        INSERT INTO script_t(b) VALUES ('one');
        BEGIN;
        INSERT INTO script_t(b) VALUES ('two');
        INSERT INTO script_t(b) SELECT b || '!' FROM script_t;
        COMMIT;
        CREATE INDEX script_b ON script_t(b);
    """)
    assert conn.execute("SELECT b FROM script_t ORDER BY a").fetchall() == [("one",), ("two",), ("one!",), ("two!",)]
    with pytest.raises(sq.ProgrammingError):
        conn.execute("SELECT 1; SELECT 2")
    assert conn.execute("SELECT 1; -- trailing comment").fetchall() == [(1,)]
    with pytest.raises(sq.ProgrammingError):
        conn.executemany("SELECT ?", [(1,)])


def test_commit_while_a_select_is_being_read(conn):
    conn.execute("CREATE TABLE loop_t(id INTEGER PRIMARY KEY, n)")
    with conn:
        conn.executemany("INSERT INTO loop_t(n) VALUES (?)", [(i,) for i in range(20)])
    seen = []
    for (ident,) in conn.cursor().execute("SELECT id FROM loop_t ORDER BY id"):
        conn.execute("UPDATE loop_t SET n = n * 10 WHERE id = ?", (ident,))
        conn.commit()
        seen.append(ident)
    assert len(seen) == 20
    assert conn.execute("SELECT sum(n) FROM loop_t").fetchone()[0] == 10 * sum(range(20))


def test_closed_connection_and_cursor(nodes):
    other = nodes.connect(unique("closing"), "solo")
    cur = other.cursor()
    cur.close()
    with pytest.raises(sq.ProgrammingError):
        cur.execute("SELECT 1")
    other.close()
    with pytest.raises(sq.ProgrammingError):
        other.execute("SELECT 1")


def test_functions_aggregates_and_collations(conn):
    conn.create_function("twice", 1, lambda v: v * 2, deterministic=True)

    class Longest:
        def __init__(self):
            self.best = ""

        def step(self, value):
            self.best = max(self.best, value, key=len)

        def finalize(self):
            return self.best
    conn.create_aggregate("longest", 1, Longest)
    sq.create_collation("reverse", lambda a, b: (a < b) - (a > b))    # the schema uses it: on the database
    conn.execute("CREATE TABLE words(w TEXT PRIMARY KEY COLLATE reverse, n)")
    with conn:
        conn.executemany("INSERT INTO words VALUES (?, twice(?))", [("a", 1), ("ccc", 2), ("bb", 3)])
    assert conn.execute("SELECT longest(w), sum(n) FROM words").fetchone() == ("ccc", 12)
    assert [w for (w,) in conn.execute("SELECT w FROM words ORDER BY w")] == ["ccc", "bb", "a"]


def test_journal_mode_stays_wal_and_iterdump(conn):
    assert conn.execute("PRAGMA journal_mode=DELETE").fetchone()[0].lower() == "wal"
    conn.execute("CREATE TABLE dumped(x)")
    with conn:
        conn.execute("INSERT INTO dumped VALUES ('it''s')")
    dump = "\n".join(conn.iterdump())
    assert "CREATE TABLE dumped" in dump and "it''s" in dump


def test_temp_tables_stay_local_and_unreplicated_writes_are_refused(conn, nodes):
    conn.execute("CREATE TEMP TABLE scratch(x)")
    conn.execute("INSERT INTO scratch VALUES (1)")                  # TEMP: local, no log record
    conn.commit()
    assert conn.execute("SELECT x FROM scratch").fetchall() == [(1,)]
    raw = conn._db                                                   # bypassing the capture is refused
    conn.execute("CREATE TABLE guarded(x)")
    import apsw
    with pytest.raises(apsw.ConstraintError):
        raw.execute("INSERT INTO guarded VALUES (1)")
    assert conn.execute("SELECT count(*) FROM guarded").fetchone() == (0,)


def test_cli_commands_have_help():
    from click.testing import CliRunner

    from walkit.cli import main
    runner = CliRunner()
    for command in ("replica", "restore", "status", "shell"):
        result = runner.invoke(main, ["sqlite", command, "--help"])
        assert result.exit_code == 0 and "--metadata" in result.output and "Example" in result.output, command


def test_database_aggregates_are_null_over_no_rows_and_fail_as_in_sqlite3(conn):
    class Total:
        def __init__(self):
            self.total = 0

        def step(self, value):
            self.total += value

        def finalize(self):
            return self.total if self.total < 100 else 1 / 0
    sq.create_aggregate("db_total", 1, Total)                 # on the database, as connection aggregates behave
    conn.execute("CREATE TABLE totals(x)")
    with conn:
        conn.executemany("INSERT INTO totals VALUES (?)", [(2,), (3,), (200,)])
    assert conn.execute("SELECT db_total(x) FROM totals WHERE x < 0").fetchone() == (None,)
    assert conn.execute("SELECT db_total(x) FROM totals WHERE x < 10").fetchone() == (5,)
    with pytest.raises(sq.OperationalError, match="user-defined aggregate's 'finalize' method raised error"):
        conn.execute("SELECT db_total(x) FROM totals").fetchone()
