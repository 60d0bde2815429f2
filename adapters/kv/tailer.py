"""walkit.adapters.kv.tailer reads the store's log: a follower's tail and a new leader's replay.

`read_from` continues the record numbering exactly (records.py): entries already applied are
skipped and a gap raises LogTruncated, also where walkit's reader cannot see one (a reader
that starts at the beginning of a log whose first ledgers were truncated). Whoever catches
LogTruncated loads the snapshot and reads on from its position.
"""

from __future__ import annotations

import logging
import threading
from typing import Iterator

from walkit import Position
from walkit.errors import LogTruncated, NoSuchLog
from walkit.adapters.kv.records import entry_header

log = logging.getLogger("walkit.adapters.kv")


def read_from(client, name: str, start: Position | None, index: int, *, follow: bool, password: bytes = b"",
              poll: float = 0.5) -> Iterator:
    """read_from yields the LogRecords of log `name` from `start` whose records continue at number `index`."""
    expected = index
    for record in client.read_log(name, start=start, follow=follow, password=password, poll=poll):
        _, first, count = entry_header(record.payload)
        if first + count <= expected:
            continue
        if first != expected:
            raise LogTruncated(f"log {name!r}: entry {record.position} starts at record {first}, "
                               f"but record {expected} comes next: earlier records were truncated")
        expected += count
        yield record


def after(position: Position) -> Position:
    """after is the position just after `position`."""
    return Position(position.ledger_id, position.entry_id + 1)


class Tailer:
    """Tailer follows the log on its own thread and hands every entry to the replica's event loop.

    It has its own Client, so `stop()` can interrupt a read that waits for new entries by
    closing it. On LogTruncated (truncation overtook it) it loads the snapshot through
    `membership.load_latest` and reads on from the snapshot's position.
    """

    def __init__(self, membership, start: Position | None, index: int) -> None:
        self._membership = membership
        self._start = start
        self._index = index
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._client = None
        self._thread = threading.Thread(target=self._run, name="walkit-kv-tailer", daemon=True)

    def start(self) -> "Tailer":
        """start starts the tailing thread."""
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """stop ends tailing; once it returns, no more entries are handed to the loop."""
        self._stopped.set()
        with self._lock:
            client = self._client
        if client is not None:
            client.close()
        self._thread.join(timeout)

    def _run(self) -> None:
        membership = self._membership
        while True:
            try:
                client = membership.new_client()
                break
            except Exception as exc:  # noqa: BLE001 - try again until stopped
                log.warning("tailer: cannot connect: %s", exc)
                if self._stopped.wait(1.0):
                    return
        with self._lock:
            self._client = client
        if self._stopped.is_set():
            client.close()
            return
        replica, loop = membership.replica, membership.loop
        start, index = self._start, self._index
        try:
            while not self._stopped.is_set():
                try:
                    for record in read_from(client, membership.log_name, start, index, follow=True,
                                            password=membership.password):
                        if self._stopped.is_set():
                            return
                        loop.call_soon_threadsafe(replica.apply_log_records, (record,))
                        _, first, count = entry_header(record.payload)
                        start, index = after(record.position), first + count
                except LogTruncated as exc:
                    log.info("tailer: %s; loading the snapshot", exc)
                    loaded = membership.load_latest(client)
                    if loaded is not None:
                        state, pointer = loaded
                        loop.call_soon_threadsafe(replica.install, state, pointer)
                        start, index = after(pointer.position), pointer.index
                except NoSuchLog:
                    self._stopped.wait(0.2)         # no leader created the log yet
                except Exception as exc:  # noqa: BLE001 - keep following; stop() ends it
                    if self._stopped.is_set():
                        return
                    log.warning("tailer: reading the log failed (%s: %s); retrying", type(exc).__name__, exc)
                    self._stopped.wait(0.5)
        finally:
            client.close()
