"""sqlite3's documented behaviours, run on `sqlite3` and `walkit.adapters.sqlite` by the same test bodies (fast tier).

Each test runs twice, once per module (`api.module`): a test asserts the result or the exception
class and message that sqlite3 gives, so a difference between the two shows up as the walkit
case failing. What a replicated database cannot honour (a write outside the log) is asserted
as NotSupportedError on walkit (`api.replicated`), and listed in docs/guides/sqlite.md.
"""

from __future__ import annotations

import collections.abc
import sqlite3
import sys
import threading
import urllib.parse

import pytest

import walkit.adapters.sqlite as sq

from .sqlitehelpers import memory_cluster, unique


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """cluster is a walkit client on in-process bookies, and one replicated database kept open for the module.

    Electing a new database's leader takes about a second; tests that need no empty database
    share this one (each with tables of its own names), on connections of their own.
    """
    directory = tmp_path_factory.mktemp("sqlite-compat")
    with memory_cluster(directory) as made:
        client = made.client()
        shared = str(directory / f"{unique('shared')}.db")
        keeper = sq.connect(shared, client=client, check_same_thread=False)
        yield client, shared
        keeper.close()
        client.close()


class Api:
    """Api is one module under test and how its tests open databases."""

    def __init__(self, module, directory, cluster) -> None:
        self.module = module
        self.directory = directory
        self.client, self.shared = cluster if cluster else (None, None)
        self.replicated = module is sq
        self.opened: list = []

    def path(self, stem: str = "compat") -> str:
        """path is a new database file (on walkit, the replicated database named after it)."""
        return str(self.directory / f"{unique(stem)}.db")

    def connect(self, database: str | None = None, *, fresh: bool = False, **options):
        """connect opens `database` with sqlite3's `options`; by default a new file on sqlite3 and the shared database
        on walkit, an empty database on both with `fresh=True`."""
        if self.replicated:
            options.setdefault("client", self.client)
            database = database or (self.path() if fresh else self.shared)
        conn = self.module.connect(database or self.path(), **options)
        self.opened.append(conn)
        return conn

    def close(self) -> None:
        for conn in reversed(self.opened):
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - a test closed it, or made it in another thread
                pass


@pytest.fixture(params=["sqlite3", "walkit"])
def api(request, tmp_path):
    module = sqlite3 if request.param == "sqlite3" else sq
    made = Api(module, tmp_path, request.getfixturevalue("cluster") if module is sq else None)
    yield made
    made.close()


@pytest.fixture
def conn(api):
    return api.connect()


def outcome(call):
    """outcome is ("ok", result) or (exception class, message) of `call()`: what both modules must agree on."""
    try:
        return "ok", call()
    except Exception as exc:  # noqa: BLE001 - the exception is the result compared
        return type(exc), str(exc)


# -- the module ----------------------------------------------------------------------------------
def test_module_has_sqlite3_constants(api):
    names = [name for name in dir(sqlite3) if name.startswith("SQLITE_")]
    assert {name: getattr(api.module, name) for name in names} == {name: getattr(sqlite3, name) for name in names}


def test_enable_shared_cache_is_deprecated_and_not_supported_by_walkit(api):
    if api.replicated:                             # a setting of the C library, not of a replicated database
        with pytest.raises(sqlite3.NotSupportedError, match="do not share a cache"):
            api.module.enable_shared_cache(False)
    else:
        with pytest.warns(DeprecationWarning):
            api.module.enable_shared_cache(False)


def test_adapt_uses_registered_adapters_and_conform_else_cannot_adapt(api):
    class Point:
        def __conform__(self, protocol):
            return "1;2" if protocol is sqlite3.PrepareProtocol else None
    assert api.module.adapt(Point()) == "1;2"
    assert outcome(lambda: api.module.adapt(object())) == (sqlite3.ProgrammingError, "can't adapt")
    assert api.module.adapt(object(), api.module.PrepareProtocol, "alt") == "alt"


def test_connection_has_the_exception_classes(conn, api):
    for name in ("Warning", "Error", "InterfaceError", "DatabaseError", "DataError", "OperationalError",
                 "IntegrityError", "InternalError", "ProgrammingError", "NotSupportedError"):
        assert getattr(conn, name) is getattr(sqlite3, name) is getattr(api.module, name)


def test_row_is_a_sequence(conn, api):
    conn.row_factory = api.module.Row
    row = conn.execute("SELECT 1 AS a, 2 AS b").fetchone()
    assert isinstance(row, collections.abc.Sequence)
    assert (list(row), row["B"], row.keys(), len(row)) == ([1, 2], 2, ["a", "b"], 2)


# -- statements, cursors and transactions --------------------------------------------------------
def test_lastrowid_follows_each_execute_but_not_executemany(conn):
    cur = conn.cursor()
    cur.execute("CREATE TABLE ids(id INTEGER PRIMARY KEY, v)")
    cur.execute("INSERT INTO ids(v) VALUES ('a')")
    assert cur.lastrowid == 1
    cur.execute("UPDATE ids SET v = 'b'")
    assert (cur.rowcount, cur.lastrowid) == (1, 1)               # the connection's last inserted rowid
    many = conn.executemany("INSERT INTO ids(v) VALUES (?)", [("c",), ("d",)])
    assert (many.rowcount, many.lastrowid) == (2, None)


def test_description_is_none_without_result_columns(conn):
    cur = conn.execute("CREATE TABLE described(a, b)")
    assert (cur.description, cur.rowcount) == (None, -1)
    cur.execute("INSERT INTO described VALUES (1, 2)")
    assert cur.description is None
    cur.execute("SELECT a, b AS bee FROM described WHERE 0")
    assert cur.description == (("a",) + (None,) * 6, ("bee",) + (None,) * 6)


def test_fetchmany_uses_arraysize(conn):
    cur = conn.execute("SELECT 1 UNION SELECT 2 UNION SELECT 3")
    cur.arraysize = 2
    assert (cur.fetchmany(), cur.fetchmany(), cur.fetchmany()) == ([(1,), (2,)], [(3,)], [])


def test_text_factory_decodes_text(conn):
    conn.text_factory = bytes
    assert conn.execute("SELECT 'é'").fetchone() == ("é".encode(),)
    conn.text_factory = lambda data: data.decode() + "!"
    assert conn.execute("SELECT 'a'").fetchone() == ("a!",)


def test_row_factory_builds_rows(conn):
    conn.row_factory = lambda cursor, row: {column[0]: value for column, value in zip(cursor.description, row)}
    assert conn.execute("SELECT 1 AS a, 2 AS b").fetchall() == [{"a": 1, "b": 2}]


def test_parse_decltypes_converts_by_declared_type(api):
    import datetime
    conn = api.connect(detect_types=api.module.PARSE_DECLTYPES)
    conn.execute("CREATE TABLE typed(d date, ts timestamp, n NUMBER(10))")
    conn.execute("INSERT INTO typed VALUES (?, ?, 5)", (datetime.date(2020, 1, 2), datetime.datetime(2020, 1, 2, 3, 4)))
    api.module.register_converter("number", lambda data: int(data) * 100)
    try:
        assert conn.execute("SELECT * FROM typed").fetchall() == [
            (datetime.date(2020, 1, 2), datetime.datetime(2020, 1, 2, 3, 4), 500)]
    finally:
        del api.module.converters["NUMBER"]


def test_python_values_bind_as_sqlite_values(conn):
    assert conn.execute("SELECT ?, ?, ?, ?, ?", (True, 1.5, bytearray(b"ab"), memoryview(b"c"), None)).fetchone() \
        == (1, 1.5, b"ab", b"c", None)
    assert outcome(lambda: conn.execute("SELECT ?", (2 ** 63,))) == (
        OverflowError, "Python int too large to convert to SQLite INTEGER")
    assert outcome(lambda: conn.execute(b"SELECT 1")) == (TypeError, "execute() argument 1 must be str, not bytes")


def test_sql_errors_carry_sqlites_message(conn):
    assert outcome(lambda: conn.execute("SELECT * FROM nowhere")) == (
        sqlite3.OperationalError, "no such table: nowhere")
    assert outcome(lambda: conn.execute("SELEC 1")) == (sqlite3.OperationalError, 'near "SELEC": syntax error')
    conn.execute("CREATE TABLE uniq(a UNIQUE)")
    conn.execute("INSERT INTO uniq VALUES (1)")
    assert outcome(lambda: conn.execute("INSERT INTO uniq VALUES (1)")) == (
        sqlite3.IntegrityError, "UNIQUE constraint failed: uniq.a")
    conn.rollback()


def test_one_statement_per_execute(conn):
    assert outcome(lambda: conn.execute("SELECT 1; SELECT 2")) == (
        sqlite3.ProgrammingError, "You can only execute one statement at a time.")
    assert outcome(lambda: conn.executemany("SELECT ?", [(1,)])) == (
        sqlite3.ProgrammingError, "executemany() can only execute DML statements.")


def test_closed_cursor_and_connection_refuse_use(api):
    conn = api.connect()
    cur = conn.cursor()
    cur.close()
    assert outcome(lambda: cur.execute("SELECT 1")) == (sqlite3.ProgrammingError, "Cannot operate on a closed cursor.")
    conn.close()
    assert outcome(lambda: conn.execute("SELECT 1")) == (
        sqlite3.ProgrammingError, "Cannot operate on a closed database.")
    assert outcome(conn.commit) == (sqlite3.ProgrammingError, "Cannot operate on a closed database.")
    assert outcome(conn.close) == ("ok", None)


def test_dml_opens_a_transaction_that_rollback_undoes(conn):
    conn.execute("CREATE TABLE undone(a)")
    assert not conn.in_transaction
    conn.execute("INSERT INTO undone VALUES (1)")
    assert conn.in_transaction
    conn.rollback()
    assert (conn.in_transaction, conn.execute("SELECT * FROM undone").fetchall()) == (False, [])


def test_with_block_commits_or_rolls_back(conn):
    conn.execute("CREATE TABLE blocks(a)")
    with conn:
        conn.execute("INSERT INTO blocks VALUES (1)")
    with pytest.raises(KeyError):
        with conn:
            conn.execute("INSERT INTO blocks VALUES (2)")
            raise KeyError("undo")
    assert conn.execute("SELECT a FROM blocks").fetchall() == [(1,)]


def test_executescript_commits_the_open_transaction_first(conn):
    conn.execute("CREATE TABLE scripted(a)")
    conn.execute("INSERT INTO scripted VALUES (1)")
    conn.executescript("INSERT INTO scripted VALUES (2); INSERT INTO scripted VALUES (3);")
    assert (conn.in_transaction, conn.execute("SELECT a FROM scripted").fetchall()) == (False, [(1,), (2,), (3,)])


def test_isolation_level_none_autocommits(api):
    conn = api.connect(isolation_level=None)
    conn.execute("CREATE TABLE auto(a)")
    conn.execute("INSERT INTO auto VALUES (1)")
    assert not conn.in_transaction
    conn.execute("BEGIN")
    conn.execute("INSERT INTO auto VALUES (2)")
    assert conn.in_transaction
    conn.execute("ROLLBACK")
    assert conn.execute("SELECT a FROM auto").fetchall() == [(1,)]


def test_cursor_factory_must_make_a_cursor(conn, api):
    class Counting(api.module.Cursor):
        pass
    assert isinstance(conn.cursor(Counting), Counting)
    assert outcome(lambda: conn.cursor(factory=lambda connection: 1)) == (
        TypeError, "factory must return a cursor, not int")


def test_returning_gives_rows_rowcount_and_lastrowid(conn):
    conn.execute("CREATE TABLE returned(id INTEGER PRIMARY KEY, a)")
    cur = conn.execute("INSERT INTO returned(a) VALUES (7) RETURNING id, a")
    assert (cur.description[0][0], cur.fetchall(), cur.rowcount, cur.lastrowid) == ("id", [(1, 7)], 1, 1)


def test_executescript_stops_at_the_failing_statement_keeping_the_ones_before(conn):
    assert outcome(lambda: conn.executescript("CREATE TABLE halfway(a); INSERT INTO halfway VALUES (1); "
                                              "INSERT INTO nowhere VALUES (2); INSERT INTO halfway VALUES (3);")) \
        == (sqlite3.OperationalError, "no such table: nowhere")
    assert (conn.in_transaction, conn.execute("SELECT a FROM halfway").fetchall()) == (False, [(1,)])


def test_dropping_a_table_being_read_is_locked(conn):
    conn.execute("CREATE TABLE busy(a)")
    conn.execute("INSERT INTO busy VALUES (1)")
    conn.commit()
    cur = conn.execute("SELECT a FROM busy")
    assert outcome(lambda: conn.execute("DROP TABLE busy")) == (sqlite3.OperationalError, "database table is locked")
    assert cur.fetchall() == [(1,)]


# -- parameters ----------------------------------------------------------------------------------
def test_parameter_sequences_are_indexed_not_iterated(conn):
    class Indexed:
        def __len__(self):
            return 2

        def __getitem__(self, index):
            if index >= 2:
                raise IndexError(index)
            return index * 10

        def __iter__(self):
            raise AssertionError("sqlite3 indexes parameter sequences")
    assert conn.execute("SELECT ?, ?", Indexed()).fetchall() == [(0, 10)]
    assert conn.execute("SELECT ?", "a").fetchall() == [("a",)]       # a str is a sequence of one here


def test_wrong_number_of_bindings_is_a_programming_error(conn):
    assert outcome(lambda: conn.execute("SELECT ?", (1, 2))) == (
        sqlite3.ProgrammingError, "Incorrect number of bindings supplied. The current statement uses 1, and there "
                                  "are 2 supplied.")


def test_missing_named_parameter_is_a_programming_error(conn):
    assert outcome(lambda: conn.execute("SELECT :a, :b", {"a": 1})) == (
        sqlite3.ProgrammingError, "You did not supply a value for binding parameter :b.")


def test_dict_for_positional_parameters_is_a_programming_error(conn):
    assert outcome(lambda: conn.execute("SELECT ?", {"a": 1})) == (
        sqlite3.ProgrammingError, "Binding 1 has no name, but you supplied a dictionary (which has only names).")


def test_unsupported_parameter_type_is_a_programming_error(conn):
    assert outcome(lambda: conn.execute("SELECT ?, ?", (1, object()))) == (
        sqlite3.ProgrammingError, "Error binding parameter 2: type 'object' is not supported")
    assert outcome(lambda: conn.execute("SELECT 1", None)) == (
        sqlite3.ProgrammingError, "parameters are of unsupported type")


def test_register_adapter_for_int_adapts_ints(conn, api):
    api.module.register_adapter(int, lambda value: f"int {value}")
    try:
        assert conn.execute("SELECT ?", (7,)).fetchone() == ("int 7",)
    finally:
        del api.module.adapters[(int, sqlite3.PrepareProtocol)]


def test_null_character_in_sql_is_refused(conn):
    assert outcome(lambda: conn.execute("SELECT 1\x00")) == (
        sqlite3.ProgrammingError, "the query contains a null character")
    assert outcome(lambda: conn.executescript("SELECT 1;\x00")) == (ValueError, "embedded null character")


# -- callbacks -----------------------------------------------------------------------------------
def test_user_function_exception_is_an_operational_error(conn):
    conn.create_function("boom", 0, lambda: 1 / 0)
    assert outcome(lambda: conn.execute("SELECT boom()").fetchall()) == (
        sqlite3.OperationalError, "user-defined function raised exception")


def test_callback_tracebacks_go_to_unraisablehook(conn, api, monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda args: seen.append(args.exc_type))
    conn.create_function("boom", 0, lambda: 1 / 0)
    api.module.enable_callback_tracebacks(True)
    try:
        with pytest.raises(sqlite3.OperationalError):
            conn.execute("SELECT boom()").fetchall()
    finally:
        api.module.enable_callback_tracebacks(False)
    with pytest.raises(sqlite3.OperationalError):
        conn.execute("SELECT boom()").fetchall()
    assert seen == [ZeroDivisionError]


class Sum:
    def __init__(self):
        self.total = 0

    def step(self, value):
        self.total += value

    def value(self):
        return self.total

    def inverse(self, value):
        self.total -= value

    def finalize(self):
        return self.total


def test_aggregate_over_no_rows_is_null(conn):
    conn.create_aggregate("mysum", 1, Sum)
    assert conn.execute("SELECT mysum(x) FROM (SELECT 1 AS x WHERE 0)").fetchone() == (None,)
    assert conn.execute("SELECT mysum(x) FROM (SELECT 2 AS x UNION SELECT 3)").fetchone() == (5,)


def test_aggregate_errors_name_the_failing_method(conn):
    class FailsIn(Sum):
        def __init__(self):
            super().__init__()
            raise ValueError("init")

    class FailsStep(Sum):
        def step(self, value):
            raise ValueError("step")

    class FailsFinalize(Sum):
        def finalize(self):
            raise ValueError("finalize")
    for name, cls in (("a_init", FailsIn), ("a_step", FailsStep), ("a_final", FailsFinalize)):
        conn.create_aggregate(name, 1, cls)
    assert [outcome(lambda n=name: conn.execute(f"SELECT {n}(1)").fetchall())
            for name in ("a_init", "a_step", "a_final")] == [
        (sqlite3.OperationalError, "user-defined aggregate's '__init__' method raised error"),
        (sqlite3.OperationalError, "user-defined aggregate's 'step' method raised error"),
        (sqlite3.OperationalError, "user-defined aggregate's 'finalize' method raised error")]


def test_window_function_slides_with_inverse(conn):
    conn.create_window_function("winsum", 1, Sum)
    rows = conn.execute("SELECT x, winsum(x) OVER (ORDER BY x ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) "
                        "FROM (SELECT 1 AS x UNION SELECT 2 UNION SELECT 4)").fetchall()
    assert rows == [(1, 1), (2, 3), (4, 6)]

    class NoValue:
        def step(self, value):
            pass
    conn.create_window_function("novalue", 1, NoValue)
    assert outcome(lambda: conn.execute("SELECT novalue(x) OVER () FROM (SELECT 1 AS x)").fetchall()) == (
        sqlite3.OperationalError, "user-defined aggregate's 'value' method not defined")


def test_create_collation_none_removes_it(conn):
    conn.create_collation("reverse", lambda a, b: (a < b) - (a > b))
    assert conn.execute("SELECT x FROM (SELECT 'a' AS x UNION SELECT 'b') ORDER BY x COLLATE reverse").fetchall() \
        == [("b",), ("a",)]
    conn.create_collation("reverse", None)
    assert outcome(lambda: conn.execute("SELECT 'a' ORDER BY 1 COLLATE reverse").fetchall()) == (
        sqlite3.OperationalError, "no such collation sequence: reverse")
    assert outcome(lambda: conn.create_collation("bad", 42)) == (TypeError, "parameter must be callable")


def test_authorizer_denies_and_ignores_without_changing_what_is_written(conn, api):
    conn.execute("CREATE TABLE secrets(public, private)")
    conn.commit()

    def authorizer(action, table, column, database, source):
        if action == api.module.SQLITE_READ and column == "private":
            return api.module.SQLITE_IGNORE if table == "secrets" else api.module.SQLITE_DENY
        return api.module.SQLITE_OK
    conn.set_authorizer(authorizer)
    with conn:
        conn.execute("INSERT INTO secrets VALUES (1, 2)")
    assert conn.execute("SELECT public, private FROM secrets").fetchall() == [(1, None)]
    conn.set_authorizer(lambda *args: api.module.SQLITE_DENY)
    assert outcome(lambda: conn.execute("SELECT 1")) == (sqlite3.DatabaseError, "not authorized")
    conn.set_authorizer(None)
    assert conn.execute("SELECT private FROM secrets").fetchall() == [(2,)]


def test_authorizer_denying_transactions_denies_commit(conn, api):
    conn.execute("CREATE TABLE guarded(a)")
    conn.execute("INSERT INTO guarded VALUES (1)")
    conn.set_authorizer(lambda action, *args: api.module.SQLITE_DENY if action == api.module.SQLITE_TRANSACTION
                        else api.module.SQLITE_OK)
    assert outcome(conn.commit) == (sqlite3.DatabaseError, "not authorized")
    assert outcome(lambda: conn.execute("COMMIT")) == (sqlite3.DatabaseError, "not authorized")
    assert conn.in_transaction
    conn.set_authorizer(None)
    conn.commit()
    assert (conn.in_transaction, conn.execute("SELECT a FROM guarded").fetchall()) == (False, [(1,)])


def test_authorizer_ignoring_commit_leaves_the_transaction_open(conn, api):
    conn.execute("CREATE TABLE kept(a)")
    conn.execute("INSERT INTO kept VALUES (1)")
    conn.set_authorizer(lambda action, operation, *args: api.module.SQLITE_IGNORE
                        if action == api.module.SQLITE_TRANSACTION and operation == "COMMIT" else api.module.SQLITE_OK)
    conn.commit()
    assert conn.in_transaction
    conn.set_authorizer(None)
    conn.commit()
    assert (conn.in_transaction, conn.execute("SELECT a FROM kept").fetchall()) == (False, [(1,)])


def test_progress_handler_interrupts_a_statement(conn):
    conn.set_progress_handler(lambda: 1, 1)
    assert outcome(lambda: conn.execute("SELECT 1").fetchall()) == (sqlite3.OperationalError, "interrupted")
    conn.set_progress_handler(None, 1)
    assert conn.execute("SELECT 1").fetchall() == [(1,)]


def test_trace_callback_sees_each_statement_expanded(conn):
    seen = []
    conn.set_trace_callback(seen.append)
    conn.execute("CREATE TABLE traced(x)")
    conn.execute("INSERT INTO traced VALUES (?)", (5,))
    conn.execute("SELECT x FROM traced").fetchall()
    conn.commit()
    with conn:
        conn.execute("UPDATE traced SET x = 'it''s'")
    conn.execute("BEGIN")
    conn.execute("SAVEPOINT inner")
    conn.execute("DELETE FROM traced")
    conn.execute("RELEASE inner")
    conn.execute("ROLLBACK")
    conn.set_trace_callback(None)
    conn.execute("SELECT 1")
    assert seen == ["CREATE TABLE traced(x)", "BEGIN ", "INSERT INTO traced VALUES (5)", "SELECT x FROM traced",
                    "COMMIT", "BEGIN ", "UPDATE traced SET x = 'it''s'", "COMMIT", "BEGIN", "SAVEPOINT inner",
                    "DELETE FROM traced", "RELEASE inner", "ROLLBACK"]


def test_limits_are_read_and_set(conn, api):
    length = api.module.SQLITE_LIMIT_LENGTH
    previous = conn.getlimit(length)
    assert conn.setlimit(length, 100) == previous and conn.getlimit(length) == 100
    assert outcome(lambda: conn.execute("SELECT ?", ("x" * 101,)).fetchall())[0] is sqlite3.DataError
    assert outcome(lambda: conn.getlimit(99)) == (sqlite3.ProgrammingError, "'category' is out of bounds")


def test_loading_extensions_is_not_supported_by_walkit(conn, api):
    if api.replicated:                             # C code in one connection is not on the other nodes
        with pytest.raises(sqlite3.NotSupportedError, match="not on the other nodes"):
            conn.enable_load_extension(True)
        with pytest.raises(sqlite3.NotSupportedError, match="not on the other nodes"):
            conn.load_extension("./extension")
    elif hasattr(conn, "enable_load_extension"):   # sqlite3 has it when its SQLite was built with it
        conn.enable_load_extension(False)
    else:
        assert not hasattr(conn, "load_extension")


# -- cursors and descriptions --------------------------------------------------------------------
def test_description_follows_alter_table(conn):
    conn.execute("CREATE TABLE grows(a)")
    cur = conn.cursor()
    cur.execute("SELECT * FROM grows")
    conn.execute("ALTER TABLE grows ADD COLUMN b")
    cur.execute("SELECT * FROM grows")
    assert [column[0] for column in cur.description] == ["a", "b"]


def test_parse_colnames_strips_the_type_and_converts(api):
    conn = api.connect(detect_types=api.module.PARSE_COLNAMES)
    cur = conn.execute("SELECT '2024-02-29' AS \"day [date]\", 1 AS plain")
    assert [column[0] for column in cur.description] == ["day", "plain"]
    import datetime
    assert cur.fetchone() == (datetime.date(2024, 2, 29), 1)


def test_recursive_use_of_a_cursor_is_refused(conn):
    cur = conn.cursor()

    def reenter(use):
        try:
            cur.execute("SELECT 2") if use == "execute" else cur.fetchone()
        except sqlite3.ProgrammingError as exc:
            return str(exc)
        return "allowed"
    conn.create_function("reenter", 1, reenter)
    assert cur.execute("SELECT reenter('execute')").fetchone() == ("Recursive use of cursors not allowed.",)
    assert cur.execute("SELECT reenter('fetch')").fetchone() == ("Recursive use of cursors not allowed.",)


# -- connections ---------------------------------------------------------------------------------
def test_isolation_level_is_validated(api):
    assert outcome(lambda: api.connect(isolation_level="BOGUS")) == (
        ValueError, "isolation_level string must be '', 'DEFERRED', 'IMMEDIATE', or 'EXCLUSIVE'")
    assert outcome(lambda: api.connect(isolation_level=1)) == (TypeError, "isolation_level must be str or None")
    conn = api.connect()

    def set_level(value):
        conn.isolation_level = value
    assert outcome(lambda: set_level("NOPE"))[0] is ValueError
    assert outcome(lambda: set_level(7)) == (TypeError, "isolation_level must be str or None")


def test_close_from_another_thread_is_refused(conn):
    seen = []

    def close():
        seen.append(outcome(conn.close))
    thread = threading.Thread(target=close)
    thread.start()
    thread.join()
    assert seen[0][0] is sqlite3.ProgrammingError
    assert seen[0][1].startswith("SQLite objects created in a thread can only be used in that same thread.")
    assert conn.execute("SELECT 1").fetchall() == [(1,)]


def test_check_same_thread_false_shares_the_connection(api):
    conn = api.connect(check_same_thread=False)
    seen = []
    thread = threading.Thread(target=lambda: seen.append(conn.execute("SELECT 1").fetchall()))
    thread.start()
    thread.join()
    assert seen == [[(1,)]]


def test_interrupt_from_another_thread_stops_the_running_statement(conn):
    def interrupt_from_a_thread(value):
        thread = threading.Thread(target=conn.interrupt)
        thread.start()
        thread.join()
        return value
    conn.create_function("interrupt_now", 1, interrupt_from_a_thread)
    query = ("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000) "
             "SELECT interrupt_now(i) FROM n")
    assert outcome(lambda: conn.execute(query).fetchall()) == (sqlite3.OperationalError, "interrupted")
    assert conn.execute("SELECT 1").fetchall() == [(1,)]


def test_cannot_open_a_file_in_a_missing_directory(api, tmp_path):
    assert outcome(lambda: api.connect(str(tmp_path / "missing" / "x.db"))) == (
        sqlite3.OperationalError, "unable to open database file")


def test_memory_databases_are_private_to_their_connection(api):
    first = api.connect(":memory:")
    second = api.connect("file:scratch?mode=memory", uri=True)
    first.execute("CREATE TABLE mine(a)")
    first.execute("INSERT INTO mine VALUES (1)")
    first.commit()
    assert first.execute("SELECT a FROM mine").fetchall() == [(1,)]
    assert outcome(lambda: second.execute("SELECT a FROM mine")) == (sqlite3.OperationalError, "no such table: mine")


def test_uri_paths_are_percent_decoded(api, tmp_path):
    (tmp_path / "with space").mkdir()
    path = str(tmp_path / "with space" / f"{unique('uri')}.db")
    conn = api.connect("file:" + urllib.parse.quote(path), uri=True)
    conn.execute("CREATE TABLE t(x)")
    conn.commit()
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,)
    import os
    assert os.path.exists(path)


def test_uri_mode_ro_refuses_writes(api):
    path = api.path()
    writer = api.connect(path)
    writer.execute("CREATE TABLE t(x)")
    writer.execute("INSERT INTO t VALUES (1)")
    writer.commit()
    reader = api.connect(f"file:{path}?mode=ro", uri=True)
    assert reader.execute("SELECT x FROM t").fetchall() == [(1,)]
    assert outcome(lambda: reader.execute("INSERT INTO t VALUES (2)")) == (
        sqlite3.OperationalError, "attempt to write a readonly database")


def test_uri_unknown_mode_is_refused(api):
    assert outcome(lambda: api.connect(f"file:{api.path()}?mode=bogus", uri=True)) == (
        sqlite3.OperationalError, "no such access mode: bogus")


# -- blobs ---------------------------------------------------------------------------------------
@pytest.fixture
def blob_conn(api):
    conn = api.connect(fresh=True)
    conn.execute("CREATE TABLE files(data BLOB)")
    conn.execute("INSERT INTO files VALUES (x'0102030405')")
    conn.commit()
    return conn


def test_blob_reads_like_a_file_and_a_sequence(blob_conn):
    with blob_conn.blobopen("files", "data", 1, readonly=True) as blob:
        assert (len(blob), blob.read(2), blob.tell(), blob[0], blob[-1], blob[1:3], blob[::2]) == (
            5, b"\x01\x02", 2, 1, 5, b"\x02\x03", b"\x01\x03\x05")
        blob.seek(-1, 2)
        assert blob.read() == b"\x05"
        assert outcome(lambda: blob.seek(9)) == (ValueError, "offset out of blob range")
        assert outcome(lambda: blob[9]) == (IndexError, "Blob index out of range")
    assert outcome(blob.read) == (sqlite3.ProgrammingError, "Cannot operate on a closed blob.")
    assert outcome(lambda: blob_conn.blobopen("files", "data", 99)) == (
        sqlite3.OperationalError, "no such rowid: 99")


def test_blob_write_of_the_replicated_database_is_not_supported(blob_conn, api):
    readonly = blob_conn.blobopen("files", "data", 1, readonly=True)
    assert outcome(lambda: readonly.write(b"x")) == (sqlite3.OperationalError, "attempt to write a readonly database")
    readonly.close()
    blob = blob_conn.blobopen("files", "data", 1)
    if api.replicated:                             # a write in place would bypass the log
        with pytest.raises(sqlite3.NotSupportedError, match="bypass the log"):
            blob.write(b"\xff")
    else:
        blob.write(b"\xff")
    blob.close()
    blob_conn.commit()
    expected = b"\x01\x02\x03\x04\x05" if api.replicated else b"\xff\x02\x03\x04\x05"
    assert blob_conn.execute("SELECT data FROM files").fetchone() == (expected,)


def test_blob_of_a_temp_table_is_writable(conn):
    conn.execute("CREATE TEMP TABLE scratch(data BLOB)")
    conn.execute("INSERT INTO scratch VALUES (zeroblob(3))")
    conn.commit()
    with conn.blobopen("scratch", "data", 1, name="temp") as blob:
        blob.write(b"ab")
        blob[2] = 99
        assert outcome(lambda: blob.__setitem__(0, 256)) == (ValueError, "byte must be in range(0, 256)")
        assert outcome(lambda: blob.__setitem__(slice(0, 2), b"xyz")) == (
            IndexError, "Blob slice assignment is wrong size")
        blob[0:3:2] = b"AC"
    assert conn.execute("SELECT data FROM temp.scratch").fetchone() == (b"AbC",)


# -- copies --------------------------------------------------------------------------------------
@pytest.fixture
def filled(api):
    conn = api.connect(fresh=True)
    conn.executescript("""
        CREATE TABLE accounts(id INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT, balance INTEGER);
        INSERT INTO accounts(owner, balance) VALUES ('ann', 100), ('it''s bob', 0);
        CREATE INDEX accounts_owner ON accounts(owner);
        CREATE VIEW rich AS SELECT owner FROM accounts WHERE balance > 10;
    """)
    return conn


DUMP = [
    "BEGIN TRANSACTION;",
    "CREATE TABLE accounts(id INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT, balance INTEGER);",
    "INSERT INTO \"accounts\" VALUES(1,'ann',100);",
    "INSERT INTO \"accounts\" VALUES(2,'it''s bob',0);",
    "CREATE INDEX accounts_owner ON accounts(owner);",
    "CREATE VIEW rich AS SELECT owner FROM accounts WHERE balance > 10;",
    "DELETE FROM \"sqlite_sequence\";",
    "INSERT INTO \"sqlite_sequence\" VALUES('accounts',2);",
    "COMMIT;",
]


def test_iterdump_yields_sqlite3s_statements_and_restores_into_sqlite3(filled):
    lines = list(filled.iterdump())
    assert lines == DUMP
    restored = sqlite3.connect(":memory:")
    restored.executescript("\n".join(lines))
    assert restored.execute("SELECT * FROM rich").fetchall() == [("ann",)]
    assert restored.execute("SELECT seq FROM sqlite_sequence").fetchall() == [(2,)]


def test_serialize_is_a_plain_database_file(filled):
    data = filled.serialize()
    restored = sqlite3.connect(":memory:")
    restored.deserialize(data)
    assert restored.execute("SELECT owner FROM accounts ORDER BY id").fetchall() == [("ann",), ("it's bob",)]
    assert restored.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name").fetchall() == [
        ("accounts",), ("sqlite_sequence",)]


def test_deserialize_into_a_replicated_database_is_not_supported(filled, api):
    data = filled.serialize()
    target = api.connect()
    if api.replicated:                             # it would replace the database outside the log
        with pytest.raises(sqlite3.NotSupportedError, match="outside the log"):
            target.deserialize(data)
    else:
        target.deserialize(data)
        assert target.execute("SELECT count(*) FROM accounts").fetchone() == (2,)


def test_backup_copies_into_a_sqlite3_connection_with_progress(filled, tmp_path):
    steps = []
    target = sqlite3.connect(tmp_path / "backup.db")
    filled.backup(target, pages=1, progress=lambda status, remaining, total: steps.append(remaining))
    assert target.execute("SELECT owner FROM accounts ORDER BY id").fetchall() == [("ann",), ("it's bob",)]
    assert steps and steps[-1] == 0
    assert list(target.iterdump()) == DUMP


def test_backup_target_must_be_a_sqlite3_connection(filled, api):
    assert outcome(lambda: filled.backup(object())) == (
        TypeError, "backup() argument 'target' must be sqlite3.Connection, not object")
    other = api.connect(fresh=True)
    if api.replicated:                             # it would replace a replicated database outside the log
        with pytest.raises(sqlite3.NotSupportedError, match="outside the log"):
            filled.backup(other)
    else:
        filled.backup(other)
        assert other.execute("SELECT count(*) FROM accounts").fetchone() == (2,)
