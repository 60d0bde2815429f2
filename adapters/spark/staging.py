"""walkit.adapters.spark.staging keeps the rows a write task produced until the driver's commit publishes them.

A write task (an executor) saves its rows in a ledger of its own (records.py's row encoding,
many rows per entry, walkit.replication.batch), closes it and sends the ledger's id to the
driver in its commit message. The commit publishes the rows of every task in a fixed order
(writer.py). A staged ledger is what makes a replayed micro-batch safe: the commit that was
cut short by a crash resumes from the ledgers it had named, whatever the replayed tasks
produce. Every task registers its ledger under

    spark/staging/<query id>/<ledger id>      {"batch": <batch id>, "sink": "topic/NAME", "created": <unix s>}

(a batch write, df.write, stages under its writeId, or without one under the query id
"write-<uuid>" of its writer, batch 0), so the commit of batch B deletes every ledger staged
for batches up to B, also those of attempts that died before their commit, and the janitor
(`sweep`: each batch write's commit, and `walkit spark cleanup`) deletes what a write
abandoned: ledgers of batches their write's marker (markers.py) says are done, and, for writes
without a marker (batch writes without writeId, queries that never committed), those older
than a grace period (a write still running longer than that would lose its staged rows, so it
is long). Ledgers a marker names as "writing" stay until a rerun resumes that commit.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from pyspark.sql.datasource import WriterCommitMessage

from walkit.errors import NoSuchKey, NoSuchLedger, WalkitError
from walkit.replication import batch as entries

STAGING = "spark/staging"
SINKS = "spark/sinks"
#: How old a batch write's staged rows (or those of a query with no marker) must be before the janitor takes them.
GRACE_S = 6 * 3600.0
BATCH_WRITE = "write-"
#: Bytes of rows per staged entry.
ENTRY_BYTES = 256 * 1024


@dataclass
class Staged(WriterCommitMessage):
    """Staged is a write task's commit message: its write's name (`query`) and batch, ledger (None: no rows) and
    row count."""

    query: str | None
    batch: int | None
    ledger_id: int | None
    rows: int


class Stage:
    """Stage collects one task's encoded rows into a ledger (created at the first row)."""

    def __init__(self, client, sink: str, query: str | None, batch: int | None, password: bytes) -> None:
        self.client = client
        self.sink = sink
        self.query = query
        self.batch = batch
        self.password = password
        self.ledger = None
        self.rows = 0
        self._pending: list[bytes] = []
        self._size = 0
        self._appends = []

    def add(self, row: bytes) -> None:
        """add stages one encoded row (the first creates and registers the ledger, so the janitor can find it)."""
        if self.ledger is None:
            self._create()
        self._pending.append(row)
        self._size += len(row)
        self.rows += 1
        if self._size >= ENTRY_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        if self.ledger is None:
            self._create()
        self._appends.append(self.ledger.append_async(entries.encode(self._pending)))
        self._pending, self._size = [], 0

    def _create(self) -> None:
        bookies = max(1, len(self.client.bookies()))
        ensemble = min(3, bookies)
        write_quorum = min(2, ensemble)
        self.ledger = self.client.create_ledger(
            ensemble, write_quorum, write_quorum, password=self.password,
            custom={"walkit.spark": f"rows staged for {self.sink}, query {self.query}, batch {self.batch}"})
        if self.query is not None:
            self.client.store.create(f"{STAGING}/{self.query}/{self.ledger.ledger_id}", json.dumps(
                {"batch": self.batch, "sink": self.sink, "created": time.time()}).encode())

    def finish(self) -> Staged:
        """finish writes the last rows, closes the ledger and returns the task's commit message."""
        try:
            self._flush()
            for appended in self._appends:
                appended.result(self.client.timeout)
            if self.ledger is not None:
                self.ledger.close()
        except BaseException:
            self.discard()
            raise
        return Staged(self.query, self.batch, self.ledger.ledger_id if self.ledger is not None else None, self.rows)

    def discard(self) -> None:
        """discard deletes the ledger of a task that failed."""
        if self.ledger is not None:
            delete([self.ledger.ledger_id], self.client)


def staged_rows(client, ledger_ids: list[int], password: bytes):
    """staged_rows yields the encoded rows of staged ledgers, ledger after ledger, in order."""
    for ledger_id in ledger_ids:
        handle = client.open_ledger(ledger_id, password=password, recover=False)
        if handle.last_add_confirmed < 0:
            continue
        for entry in handle.read(0, handle.last_add_confirmed):
            yield from entries.decode(entry.payload)


def delete(ledger_ids, client) -> None:
    """delete removes staged ledgers (those already gone are fine)."""
    for ledger_id in ledger_ids:
        try:
            client.delete_ledger(ledger_id)
        except NoSuchLedger:
            pass


def collect(client, query: str, upto_batch: int, keep: set[int] = frozenset()) -> int:
    """collect deletes the ledgers staged for `query` by batches up to `upto_batch` (not those in `keep`).

    It returns how many it deleted.
    """
    prefix = f"{STAGING}/{query}"
    deleted = 0
    for child in client.store.children(prefix):
        key = f"{prefix}/{child}"
        try:
            value, version = client.store.get(key)
        except NoSuchKey:
            continue
        ledger_id = int(child)
        if json.loads(value).get("batch", -1) > upto_batch or ledger_id in keep:
            continue
        delete([ledger_id], client)
        try:
            client.store.delete(key, version)
        except WalkitError:
            pass
        deleted += 1
    return deleted


def sweep(client, grace_s: float = GRACE_S, sink: str | None = None, now: float | None = None) -> int:
    """sweep is the janitor: it deletes staged ledgers no commit will publish (module doc) and returns how many.

    Ledgers of a write with a marker (a streaming query, a batch write with writeId) go once the
    marker says their batch is done (or a later one); those of a write without one (a batch write
    without writeId, a query that never committed), once older than `grace_s`. `sink`
    ("topic/NAME", "log/NAME") limits it to one sink's staged rows.
    """
    now = time.time() if now is None else now
    deleted = 0
    for query in client.store.children(STAGING):
        prefix = f"{STAGING}/{query}"
        for child in client.store.children(prefix):
            try:
                value, version = client.store.get(f"{prefix}/{child}")
            except NoSuchKey:
                continue
            staged = json.loads(value)
            if sink is not None and staged.get("sink") != sink:
                continue
            if not _abandoned(client, query, staged, now - grace_s):
                continue
            delete([int(child)], client)
            try:
                client.store.delete(f"{prefix}/{child}", version)
            except WalkitError:
                pass
            deleted += 1
    return deleted


def _abandoned(client, query: str, staged: dict, before: float) -> bool:
    """_abandoned is whether no commit will publish a staged ledger (see sweep)."""
    try:
        marker = json.loads(client.store.get(f"{SINKS}/{staged.get('sink')}/{query}")[0])
    except NoSuchKey:
        return staged.get("created", 0) < before
    return is_done(marker, staged.get("batch", -1))


def is_done(marker: dict | None, batch: int) -> bool:
    """is_done is whether a write's marker (markers.py) says its batch `batch` was published."""
    return marker is not None and (marker["batch"] > batch or (marker["batch"] == batch and marker["state"] == "done"))
