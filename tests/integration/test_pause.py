"""tests.support.pause: a process held by a test is never held inside a write to the sqlite metadata file.

Tests that hold a bookie or a server with SIGSTOP mean that process's answers, not the metadata:
a held process that kept the metadata file's write lock stalled every other writer, and a roll
in test_log_handover.py timed out after 30 s (CI, 2026-11-28).
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys

import pytest

from tests.support import pause

from .helpers import pid_state, wait_until

pytestmark = pytest.mark.processes          # every test here starts a process (tests/conftest.py tiers)

#: Creates the table, says so on stdout, then takes the file's write lock over and over, inside
#: each transaction ~20 times as long as outside it.
BUSY_WRITER = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA journal_mode = WAL")
db.execute("CREATE TABLE IF NOT EXISTS t (x)")
print("ready", flush=True)
while True:
    db.execute("BEGIN IMMEDIATE")
    db.execute("INSERT INTO t VALUES (1)")
    time.sleep(0.02)
    db.execute("COMMIT")
    time.sleep(0.001)
"""

#: Takes the write lock and stops itself inside the transaction.
STOPPED_WRITER = """
import os, signal, sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA journal_mode = WAL")
db.execute("CREATE TABLE IF NOT EXISTS t (x)")
db.execute("BEGIN IMMEDIATE")
db.execute("INSERT INTO t VALUES (1)")
os.kill(os.getpid(), signal.SIGSTOP)
db.execute("COMMIT")
"""


@pytest.fixture
def child():
    """child starts `python -c script path` processes and kills every one at the end."""
    made: list[subprocess.Popen] = []

    def start(script: str, path: str) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-c", script, path], stdout=subprocess.PIPE, text=True)
        made.append(process)
        return process
    yield start
    for process in made:
        process.send_signal(signal.SIGCONT)
        process.kill()
        process.wait()


def test_sqlite_writer_names_a_process_stopped_inside_a_write_and_no_one_after_it(tmp_path, child):
    path = str(tmp_path / "metadata.db")
    holder = child(STOPPED_WRITER, path)
    wait_until(lambda: pid_state(holder.pid) == "T", message="the writer never stopped in its transaction")
    assert pause.sqlite_writer(path) == {holder.pid}
    holder.send_signal(signal.SIGCONT)
    assert holder.wait(10) == 0
    assert pause.sqlite_writer(path) == set()


def test_stop_holds_a_busy_writer_only_outside_its_transactions(tmp_path, child):
    path = str(tmp_path / "metadata.db")
    writer = child(BUSY_WRITER, path)
    assert writer.stdout.readline().strip() == "ready"
    attempts = []
    while len(attempts) < 5 or (sum(attempts) == len(attempts) and len(attempts) < 40):
        attempts.append(pause.stop(writer.pid, f"sqlite://{path}"))
        try:
            assert pid_state(writer.pid) == "T"
            assert writer.pid not in pause.sqlite_writer(path)
            other = sqlite3.connect(path, timeout=5, isolation_level=None)
            other.execute("BEGIN IMMEDIATE")        # the write lock is free while the writer is held
            other.execute("INSERT INTO t VALUES (2)")
            other.execute("COMMIT")
            other.close()
        finally:
            pause.resume(writer.pid)
    # Caught inside a transaction ~95% of the time: stop had to let it go and try again (on a
    # loaded machine the writer runs less, so up to 40 holds are made until one needed it).
    assert sum(attempts) > len(attempts), attempts


def test_stop_without_sqlite_metadata_just_stops(tmp_path, child):
    writer = child(BUSY_WRITER, str(tmp_path / "other.db"))
    assert writer.stdout.readline().strip() == "ready"
    with pause.paused(writer.pid, "zk://127.0.0.1:2181/walkit"):
        assert pid_state(writer.pid) == "T"
    wait_until(lambda: pid_state(writer.pid) != "T", message="the writer was not continued")
