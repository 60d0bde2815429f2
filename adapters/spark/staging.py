"""walkit.adapters.spark.staging keeps the rows a write task produced until the driver's commit publishes them.

A write task (an executor) saves its rows in a ledger of its own (records.py's row encoding,
many rows per entry, walkit.replication.batch), closes it and sends the ledger's id to the
driver in its commit message. The commit publishes the rows of every task in a fixed order
(writer.py). A staged ledger is what makes a replayed micro-batch safe: the commit that was
cut short by a crash resumes from the ledgers it had named, whatever the replayed tasks
produce. Streaming tasks also register their ledger under

    spark/staging/<query id>/<ledger id>      {"batch": <batch id>, "sink": "topic/NAME"}

so the commit of batch B deletes every ledger staged for batches up to B, also those of
attempts that died before their commit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pyspark.sql.datasource import WriterCommitMessage

from walkit.errors import NoSuchKey, NoSuchLedger, WalkitError
from walkit.replication import batch as entries

STAGING = "spark/staging"
#: Bytes of rows per staged entry.
ENTRY_BYTES = 256 * 1024


@dataclass
class Staged(WriterCommitMessage):
    """Staged is a write task's commit message: its query and batch (streaming), ledger (None: no rows) and row count."""

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
        """add stages one encoded row."""
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
            self.client.store.create(f"{STAGING}/{self.query}/{self.ledger.ledger_id}",
                                     json.dumps({"batch": self.batch, "sink": self.sink}).encode())

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
