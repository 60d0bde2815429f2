"""tests.support.pause holds a process with SIGSTOP at a moment it is not writing sqlite metadata, for tests.

    with paused(cluster.pid(0), cluster.metadata_url):     # a bookie whose acks stop
        ...                                                 # SIGCONT on the way out

A process stopped inside a write to the sqlite metadata file keeps the file's write lock, and
every other process's metadata writes wait for it until it resumes (what users then see is
pinned down by tests/integration/test_sqlite_metadata_pause.py). A test that holds a bookie to
stop its acknowledgements, or a server to stop its answers, means that process and not the
metadata: a writer that must replace the held bookie needs metadata writes. So `stop` looks at
the stopped process's file locks (Linux /proc/locks): if it was caught holding the metadata
file's write lock, it continues the process, waits until the lock is released, and stops it
again. Other metadata URIs (ZooKeeper, etcd) have no such lock: the process is just stopped.
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import contextmanager
from typing import Iterator

from walkit.testing.processes import pid_state, wait_until

#: The bytes of a WAL-mode sqlite file's -shm that its writers lock: write, checkpoint, recovery.
_WAL_WRITER_LOCKS = range(120, 123)


def sqlite_writer(db_path: str) -> set[int]:
    """sqlite_writer returns the pids holding a writer's lock of the WAL-mode sqlite file `db_path`."""
    try:
        shm = os.stat(db_path + "-shm")
    except FileNotFoundError:
        return set()             # no connection has the file open
    device = f"{os.major(shm.st_dev):02x}:{os.minor(shm.st_dev):02x}:{shm.st_ino}"
    holders = set()
    with open("/proc/locks") as f:
        for line in f:
            fields = line.split()
            if "->" in fields or len(fields) < 8:        # a waiter, not a holder
                continue
            _, kind, _, mode, pid, where, start, end = fields[:8]
            if kind != "POSIX" or mode != "WRITE" or where != device:
                continue
            last = _WAL_WRITER_LOCKS[-1] if end == "EOF" else int(end)
            if int(start) <= _WAL_WRITER_LOCKS[-1] and last >= _WAL_WRITER_LOCKS[0]:
                holders.add(int(pid))
    return holders


def _sqlite_path(metadata_url: str | None) -> str | None:
    if metadata_url is None or not metadata_url.startswith("sqlite://"):
        return None
    return metadata_url[len("sqlite://"):].split("?", 1)[0]


def stop(pid: int, metadata_url: str | None = None, timeout: float = 30.0) -> int:
    """stop holds `pid` with SIGSTOP; with sqlite metadata, never while it holds the file's write lock.

    It returns once the process is stopped (and, with sqlite metadata, not inside a write), with
    the number of SIGSTOPs that took (1 unless it was caught inside a write). It fails the test
    (AssertionError) if that does not happen within `timeout` seconds, and raises
    ProcessLookupError if the process is gone.
    """
    path = _sqlite_path(metadata_url)
    deadline = time.monotonic() + timeout
    attempts = 0
    while True:
        attempts += 1
        os.kill(pid, signal.SIGSTOP)
        wait_until(lambda: pid_state(pid) in ("T", None), max(0.0, deadline - time.monotonic()),
                   f"process {pid} did not stop")
        if pid_state(pid) is None:
            raise ProcessLookupError(f"process {pid} is gone")
        if path is None or pid not in sqlite_writer(path):
            return attempts
        os.kill(pid, signal.SIGCONT)     # caught inside a metadata write: let it finish, then again
        wait_until(lambda: pid not in sqlite_writer(path), max(0.0, deadline - time.monotonic()),
                   f"process {pid} kept the write lock of {path}")


def resume(pid: int) -> None:
    """resume continues a process held by `stop` (SIGCONT); a process that is gone is ignored."""
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


@contextmanager
def paused(pid: int, metadata_url: str | None = None) -> Iterator[None]:
    """paused holds `pid` (see `stop`) for the block, and continues it on the way out."""
    stop(pid, metadata_url)
    try:
        yield
    finally:
        resume(pid)
