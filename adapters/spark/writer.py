"""walkit.adapters.spark.writer writes DataFrames into a topic or a log, each micro-batch exactly once.

Write tasks stage their rows in ledgers (staging.py); the commit, on the driver, publishes
them: to a log through its single writer (`open_log` fences any other), to a topic through
the Kafka protocol to the partitions' leaders with an idempotent producer, the one public way
in: a partition's log is written only by its leader's walkit.replicate node, which numbers
the offsets and keeps the partition state every broker applies (a batch appended beside it
would break both).

A micro-batch replayed after a failure is not written twice. The commit of batch B of query
Q keeps a marker in the cluster's metadata store, compare-and-swapped:

    spark/sinks/<topic/NAME | log/NAME>/<Q>   {"batch": B, "state": "writing", "staged": [[ledger, rows]...],
                                               "from": <where the sink ended before B>}
                                              then {"batch": B, "state": "done"}

- A commit that finds B (or a later batch) done publishes nothing: its batch was written
  before the crash that made Spark replay it.
- One that finds B "writing" resumes the interrupted commit with the staged ledgers the marker
  names (not the replay's): it finds what already reached the sink, then publishes the rest.
  In a log, the records after "from" (the first ledger the interrupted writer appended to)
  are a prefix of the batch's rows; in a topic, each published record carries the header
  `walkit.spark.write` = "Q:B:i" (i: the row's place in the batch), and the partitions are
  read from their ends in "from" once the bookies confirmed everything acknowledged.

Batch writes (df.write) publish the same way without a marker: a failed job is not retried.
"""

from __future__ import annotations

import json
import uuid

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, LongType, ShortType, StringType, StructType

from walkit.adapters.spark.cluster import catalog, connect, partition_log, reaching, resolve_topics
from walkit.adapters.spark.errors import ClusterUnreachable, OptionError, SparkSourceError
from walkit.adapters.spark.index import LogIndex
from walkit.adapters.spark.options import SinkOptions
from walkit.adapters.spark.records import decode_row, encode_row
from walkit.adapters.spark.scan import topic_columns
from walkit.adapters.spark.staging import BATCH_WRITE, SINKS, Stage, collect, delete, staged_rows, sweep
from walkit.core.loglist import Position
from walkit.errors import BadVersion, NodeExists, NoSuchKey

TAG_HEADER = "walkit.spark.write"


class SinkError(SparkSourceError):
    """SinkError is raised when publishing a micro-batch fails or its marker was changed by someone else."""


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


def bootstrap_servers(client, options) -> list[str]:
    """bootstrap_servers is option kafka.bootstrap.servers, or the brokers registered in the metadata store."""
    if options.credentials.bootstrap:
        return [server.strip() for server in options.credentials.bootstrap.split(",") if server.strip()]
    brokers = catalog(client).brokers()
    if not brokers:
        raise ClusterUnreachable(f"no topics broker is registered in the cluster at {options.metadata}: "
                                 f"writes to a topic go through a broker (walkit topics serve)")
    return [f"{b.host}:{b.port}" for b in brokers.values()]


class TopicPublisher:
    """TopicPublisher produces staged rows to a topic through its brokers (Kafka protocol, idempotent)."""

    def __init__(self, client, options: SinkOptions) -> None:
        self.client = client
        self.options = options
        self.topic = resolve_topics(client, options.metadata, (options.topic,))[options.topic]
        self._producer = None

    def _index(self, partition: int) -> LogIndex:
        return LogIndex(self.client, partition_log(self.topic, partition), self.options.password).refresh(
            missing_ok=True)

    def mark(self) -> dict:
        """mark is where each partition ends now (a lower bound of where this batch's records will be)."""
        return {str(p): self._index(p).end_offset() or 0 for p in range(self.topic.partitions)}

    def written(self, tag: str, since: dict) -> set[int]:
        """written is the rows of the batch tagged `tag` that reached the topic after `since`."""
        found: set[int] = set()
        prefix = f"{tag}:".encode()
        for p in range(self.topic.partitions):
            index = self._index(p)            # its end covers every acknowledged record
            end = index.end_offset()
            lo = max(int(since.get(str(p), 0)), index.earliest() or 0)
            if end is None or end <= lo:
                continue
            for piece in index.split_offsets(self.topic.name, p, lo, end, 1 << 62):
                for columns in topic_columns(self.client, piece, self.options.password, True):
                    for pairs in columns.headers:
                        for name, value in pairs:
                            if name == TAG_HEADER and value and value.startswith(prefix):
                                found.add(int(value[len(prefix):]))
        return found

    def publish(self, rows, tag: str | None, skip) -> int:
        """publish produces the rows whose place is not in `skip`, tagged when `tag` is set; it returns how many.

        The producer is librdkafka's (confluent-kafka), idempotent with acks=all: it writes every
        record Kafka allows (null keys and values together, null header values), compresses with
        kafka.compression.type and logs in with the query's SASL credentials.
        """
        from confluent_kafka import KafkaException, Producer
        self._producer = producer = Producer({
            "bootstrap.servers": ",".join(bootstrap_servers(self.client, self.options)), "acks": "all",
            "enable.idempotence": True, "linger.ms": 5, "client.id": "walkit-spark",
            "compression.type": self.options.compression,
            "message.timeout.ms": int(self.options.timeout * 1000), **self.options.credentials.librdkafka_settings()})
        failures: list = []

        def delivered(error, _message) -> None:
            if error is not None:
                failures.append(error)
        sent = 0
        for i, row in enumerate(rows):
            if i in skip:
                continue
            partition, key, value, headers = decode_row(row)
            if partition is not None and not 0 <= partition < self.topic.partitions:
                raise SinkError(f"a row names partition {partition} of topic {self.topic.name!r}, which has "
                                f"{self.topic.partitions}")
            if tag is not None:
                headers = headers + [(TAG_HEADER, f"{tag}:{i}".encode())]
            extra = {} if partition is None else {"partition": partition}
            while True:
                try:
                    producer.produce(self.topic.name, value=value, key=key, headers=headers or None,
                                     on_delivery=delivered, **extra)
                    break
                except BufferError:                    # the local queue is full: let deliveries drain it
                    producer.poll(0.1)
                except KafkaException as exc:
                    raise SinkError(f"producing to topic {self.topic.name!r} failed: {exc}") from None
            producer.poll(0)
            sent += 1
        left = producer.flush(self.options.timeout)
        if failures or left:
            raise SinkError(f"producing to topic {self.topic.name!r} failed: "
                            + (repr(failures[0]) if failures else f"{left} records unacknowledged after "
                               f"{self.options.timeout} s"))
        return sent

    def close(self) -> None:
        """close drops what a failed publish left queued and ends the producer's connections."""
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.purge()
            producer.close()


class LogPublisher:
    """LogPublisher appends staged rows' values to a log as its single writer."""

    def __init__(self, client, options: SinkOptions) -> None:
        self.client = client
        self.options = options
        self.writer = None

    def _open(self):
        if self.writer is None:
            self.writer = self.client.open_log(self.options.log, password=self.options.password)
        return self.writer

    def mark(self) -> int:
        """mark opens the log (fencing any other writer) and returns the ledger this writer appends to first."""
        return self._open().ledger_id

    def written(self, tag: str, since: int) -> range:
        """written is the rows of the interrupted batch already in the log: the records at or after ledger `since`."""
        self._open()                      # fences the interrupted writer first: nothing more can arrive
        reading = self.client.read_log(self.options.log, start=Position(int(since), 0), password=self.options.password)
        with reading:
            count = sum(1 for _ in reading)
        return range(count)

    def publish(self, rows, tag: str | None, skip) -> int:
        """publish appends the value of every row whose place is not in `skip`; it returns how many."""
        writer = self._open()
        appends = [writer.append_async(decode_row(row)[2] or b"") for i, row in enumerate(rows) if i not in skip]
        for appended in appends:
            appended.result(self.options.timeout)
        return len(appends)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _publisher(client, options: SinkOptions):
    return LogPublisher(client, options) if options.log is not None else TopicPublisher(client, options)


class BatchWriter(DataSourceWriter):
    """BatchWriter is `df.write.format("walkit")`: tasks stage rows, the commit publishes them in task order.

    Its tasks register their staged ledgers under the writer's own id ("write-<uuid>", staging.py),
    so what a failed or abandoned write staged is found again: the commit and abort delete their
    own, and each commit sweeps the sink's abandoned ones (staging.sweep; `walkit spark cleanup`).
    """

    def __init__(self, options: SinkOptions, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise OptionError(f"{options.target} can only be appended to: use mode('append')")
        self.options = options
        self.encode = row_encoder(schema, options)
        self.job = f"{BATCH_WRITE}{uuid.uuid4()}"

    def write(self, iterator):
        """write stages this task's rows (on an executor)."""
        return stage(self.options, self.encode, iterator, self.job, 0)

    def commit(self, messages) -> None:
        """commit publishes every task's rows and deletes the staged ledgers, then sweeps abandoned ones."""
        client = connect(self.options.metadata, self.options.timeout, self.options.credentials.key)
        ledgers = [m.ledger_id for m in messages if m is not None and m.ledger_id is not None]
        with reaching(self.options.metadata, f"writing to {self.options.target}"):
            publisher = _publisher(client, self.options)
            try:
                publisher.publish(staged_rows(client, ledgers, self.options.password), None, ())
            finally:
                publisher.close()
            collect(client, self.job, 0)
            sweep(client, sink=self.options.target)

    def abort(self, messages) -> None:
        """abort deletes the staged ledgers of a failed write."""
        client = connect(self.options.metadata, self.options.timeout, self.options.credentials.key)
        delete([m.ledger_id for m in messages if m is not None and m.ledger_id is not None], client)
        collect(client, self.job, 0)


class StreamWriter(DataSourceStreamWriter):
    """StreamWriter is `writeStream.format("walkit")`: each micro-batch exactly once (see the module doc)."""

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
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
        ledgers = [[m.ledger_id, m.rows] for m in staged if m.ledger_id is not None]
        client = connect(self.options.metadata, self.options.timeout, self.options.credentials.key)
        if query is None:                      # no task ran: nothing to write
            return
        key = f"{SINKS}/{self.options.target}/{query}"
        with reaching(self.options.metadata, f"writing to {self.options.target}"):
            marker, version = _read_marker(client, key)
            if marker is not None and (marker["batch"] > batchId or
                                       (marker["batch"] == batchId and marker["state"] == "done")):
                collect(client, query, batchId)      # a replay of a batch already written
                return
            publisher = _publisher(client, self.options)
            tag = f"{query}:{batchId}"
            try:
                if marker is not None and marker["batch"] == batchId and marker["state"] == "writing":
                    ledgers = marker["staged"]
                    skip = publisher.written(tag, marker["from"])
                else:
                    since = publisher.mark()
                    version = _write_marker(client, key, {"batch": batchId, "state": "writing", "staged": ledgers,
                                                          "from": since}, version)
                    skip = ()
                rows = staged_rows(client, [ledger for ledger, _ in ledgers], self.options.password)
                publisher.publish(rows, tag, skip)
            finally:
                publisher.close()
            _write_marker(client, key, {"batch": batchId, "state": "done"}, version)
            collect(client, query, batchId)

    def abort(self, messages, batchId: int) -> None:
        """abort deletes the staged ledgers of a failed micro-batch, unless an interrupted commit still needs them."""
        staged = [m for m in messages if m is not None and m.ledger_id is not None]
        if not staged:
            return
        client = connect(self.options.metadata, self.options.timeout, self.options.credentials.key)
        marker, _ = _read_marker(client, f"{SINKS}/{self.options.target}/{staged[0].query}")
        keep = {ledger for ledger, _ in marker.get("staged", [])} if marker else set()
        delete([m.ledger_id for m in staged if m.ledger_id not in keep], client)


def _read_marker(client, key: str):
    try:
        value, version = client.store.get(key)
    except NoSuchKey:
        return None, None
    return json.loads(value), version


def _write_marker(client, key: str, marker: dict, version) -> int:
    """_write_marker stores the marker by compare-and-swap; SinkError if another run of the query changed it."""
    value = json.dumps(marker).encode()
    try:
        if version is None:
            return client.store.create(key, value)
        return client.store.put(key, value, version)
    except (BadVersion, NodeExists):
        raise SinkError(f"the marker {key} changed under this commit: is another run of the same query "
                        f"(same checkpoint) writing to the sink?") from None
