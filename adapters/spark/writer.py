"""walkit.adapters.spark.writer writes DataFrames into a topic or a log: df.write and writeStream.

Write tasks stage their rows in ledgers (staging.py); the commit, on the driver, publishes
them (publishers.py): to a log through its single writer, to a topic through a broker.

- A streaming micro-batch is written exactly once per query id and batch id: its commit
  follows the marker protocol (markers.py), so a replay of a batch already written publishes
  nothing and one whose commit was cut short resumes it.
- A batch write (df.write) with option writeId is written exactly once per writeId the same
  way (batch 0 of the write named writeId): a rerun after its driver died mid-commit resumes
  the commit with the rows the first run staged, a rerun of a completed write writes nothing.
- A batch write without writeId publishes without a marker: a driver killed during its commit
  leaves part of the rows published, and a rerun writes them all again (at least once).
"""

from __future__ import annotations

import uuid

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, LongType, ShortType, StringType, StructType

from walkit.adapters.spark.cluster import connect, reaching
from walkit.adapters.spark.errors import OptionError
from walkit.adapters.spark.markers import marker_key, needed, publish_once, read_marker
from walkit.adapters.spark.options import SinkOptions
from walkit.adapters.spark.publishers import publisher_for
from walkit.adapters.spark.records import encode_row
from walkit.adapters.spark.staging import BATCH_WRITE, Stage, Staged, collect, delete, is_done, staged_rows, sweep


def row_encoder(schema: StructType, options: SinkOptions):
    """row_encoder checks the columns of a write and returns a function from a Row to its staged bytes.

    A topic takes `value` (binary or string; required), `key` (binary or string), `partition`
    (int) and `headers` (array<struct<key: string, value: binary>>); a log takes `value`.
    """
    fields = {f.name: (i, f.dataType) for i, f in enumerate(schema.fields)}
    text = (BinaryType, StringType)

    def column(name: str, types, required: bool = False):
        if name not in fields:
            if required:
                raise OptionError(f"writing to {options.target} needs a column {name!r} (binary or string); "
                                  f"the DataFrame has {', '.join(fields) or 'no columns'}")
            return None
        index, kind = fields[name]
        if not isinstance(kind, types):
            raise OptionError(f"column {name!r} is {kind.simpleString()}; writing to {options.target} takes "
                              f"{' or '.join(t.typeName() for t in types)}")
        return index

    value = column("value", text, required=True)
    if options.log is not None:
        return lambda row: encode_row(None, None, _bytes(row[value]), None)
    key = column("key", text)
    partition = column("partition", (IntegerType, LongType, ShortType))
    headers = column("headers", (ArrayType,))

    def encode(row) -> bytes:
        pairs = None
        if headers is not None and row[headers]:
            pairs = [(h["key"], _bytes(h["value"])) for h in row[headers]]
        return encode_row(None if partition is None else row[partition], None if key is None else _bytes(row[key]),
                          _bytes(row[value]), pairs)
    return encode


def _bytes(value):
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


def stage(options: SinkOptions, encode, rows, query: str | None, batch: int | None):
    """stage saves a task's rows (on an executor) and returns its commit message (staging.Staged)."""
    client = connect(options.metadata, options.timeout, options.credentials.key)
    with reaching(options.metadata, f"staging rows for {options.target}"):
        staging = Stage(client, options.target, query, batch, options.password)
        try:
            for row in rows:
                staging.add(encode(row))
        except BaseException:
            staging.discard()
            raise
        return staging.finish()


class BatchWriter(DataSourceWriter):
    """BatchWriter is `df.write.format("walkit")`: tasks stage rows, the commit publishes them in task order.

    Its tasks register their staged ledgers under the write's name (staging.py): the writeId, or
    the writer's own id "write-<uuid>" without one, so what a failed or abandoned write staged is
    found again: the commit and abort delete their own, and each commit sweeps the sink's
    abandoned ones (staging.sweep; `walkit spark cleanup`). With a writeId whose marker says the
    write was done (checked once, on the driver, when Spark makes the writer), the tasks stage
    nothing and the commit publishes nothing.
    """

    def __init__(self, options: SinkOptions, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise OptionError(f"{options.target} can only be appended to: use mode('append')")
        self.options = options
        self.encode = row_encoder(schema, options)
        self.job = options.write_id or f"{BATCH_WRITE}{uuid.uuid4()}"
        self.done = False
        if options.write_id is not None:
            client = connect(options.metadata, options.timeout, options.credentials.key)
            with reaching(options.metadata, f"reading the marker of write {options.write_id!r}"):
                self.done = is_done(read_marker(client, marker_key(options, options.write_id))[0], 0)

    def write(self, iterator):
        """write stages this task's rows (on an executor); nothing for a named write already done."""
        if self.done:
            return Staged(self.job, 0, None, 0)
        return stage(self.options, self.encode, iterator, self.job, 0)

    def commit(self, messages) -> None:
        """commit publishes every task's rows (once per writeId, if given), deletes the staged ledgers
        and sweeps abandoned ones."""
        client = connect(self.options.metadata, self.options.timeout, self.options.credentials.key)
        staged = [[m.ledger_id, m.rows] for m in messages if m is not None and m.ledger_id is not None]
        with reaching(self.options.metadata, f"writing to {self.options.target}"):
            if self.options.write_id is not None:
                publish_once(client, self.options, self.job, 0, staged, keep_open=False)
            else:
                publisher = publisher_for(client, self.options)
                try:
                    publisher.publish(staged_rows(client, [ledger for ledger, _ in staged], self.options.password),
                                      None, ())
                finally:
                    publisher.close()
            collect(client, self.job, 0)
            sweep(client, sink=self.options.target)

    def abort(self, messages) -> None:
        """abort deletes the staged ledgers of a failed write, unless an interrupted commit still needs them."""
        client = connect(self.options.metadata, self.options.timeout, self.options.credentials.key)
        keep = needed(client, self.options, self.job) if self.options.write_id is not None else set()
        delete([m.ledger_id for m in messages if m is not None and m.ledger_id is not None and m.ledger_id not in keep],
               client)
        collect(client, self.job, 0, keep)


class StreamWriter(DataSourceStreamWriter):
    """StreamWriter is `writeStream.format("walkit")`: each micro-batch exactly once (markers.py)."""

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        if options.write_id is not None:
            raise OptionError("option writeId is for batch writes (df.write): a streaming write is written exactly "
                              "once per query id and batch id already")
        self.options = options
        self.encode = row_encoder(schema, options)

    def write(self, iterator):
        """write stages this task's rows under its query and batch id (on an executor)."""
        from pyspark import TaskContext
        context = TaskContext.get()
        query = context.getLocalProperty("sql.streaming.queryId") if context else None
        batch = context.getLocalProperty("streaming.sql.batchId") if context else None
        return stage(self.options, self.encode, iterator, query, int(batch) if batch is not None else None)

    def commit(self, messages, batchId: int) -> None:
        """commit publishes micro-batch `batchId` unless it was published before, resuming a cut-short commit."""
        staged = [m for m in messages if m is not None]
        query = next((m.query for m in staged if m.query), None)
        if query is None:                      # no task ran: nothing to write
            return
        client = connect(self.options.metadata, self.options.timeout, self.options.credentials.key)
        with reaching(self.options.metadata, f"writing to {self.options.target}"):
            publish_once(client, self.options, query, batchId,
                         [[m.ledger_id, m.rows] for m in staged if m.ledger_id is not None], keep_open=True)
            collect(client, query, batchId)

    def abort(self, messages, batchId: int) -> None:
        """abort deletes the staged ledgers of a failed micro-batch, unless an interrupted commit still needs them."""
        staged = [m for m in messages if m is not None and m.ledger_id is not None]
        if not staged:
            return
        client = connect(self.options.metadata, self.options.timeout, self.options.credentials.key)
        keep = needed(client, self.options, staged[0].query)
        delete([m.ledger_id for m in staged if m.ledger_id not in keep], client)
