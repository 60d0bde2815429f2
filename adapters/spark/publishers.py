"""walkit.adapters.spark.publishers put a write's staged rows into its sink: a topic or a log.

Both answer the marker protocol (markers.py) with three calls: `mark` (where the sink ends now:
the records after it will be this write's), `written` (which rows of an interrupted write
already arrived after that mark) and `publish` (the rows not yet there).

- TopicPublisher produces through the Kafka protocol to the partitions' leaders with an
  idempotent producer: a partition's log is written only by its leader's walkit.replicate
  node, which numbers the offsets and keeps the partition state every broker applies (a batch
  appended beside it would break both). Rows carry the header `walkit.spark.write` =
  "NAME:BATCH:ROW" when published under a marker, which is how `written` finds them.
- LogPublisher appends as the log's single writer (`open_log` fences any other). The records
  after its mark are a prefix of the write's rows, in order.

A streaming query's log writer stays open between its micro-batches. Spark runs a Python
DataSourceStreamWriter.commit in a Python worker of the driver (PythonStreamingSinkCommitRunner,
a PythonPlannerRunner: pyspark.sql.worker.python_streaming_sink_runner, forked by pyspark.daemon)
and, with spark.python.worker.reuse (the default), hands the worker back to an idle pool for the
next call, where it waits up to a minute (PythonWorkerFactory's idle timeout). So the commit of
the next micro-batch usually runs in the same process, and finds the writer the last commit left
there (`_open_logs`, by metadata, key, log, password and query). It appends with it as long as it
is still the log's writer: the log's last ledger is the writer's and still OPEN. Otherwise
(another process's commit opened the log in between: idle workers are handed out in turn; a
new worker; a restarted driver) the commit opens the log again, fencing the other writer and
starting a new ledger, as every commit did before. A commit that fails closes its writer.
The check and the appends are not atomic: a writer outside the query that opens the log in
between fences this one (its appends then fail, and the query's replay resumes). Two writers
of one log break the protocol anyway (module doc of markers.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from walkit.adapters.spark.cluster import catalog, partition_log, resolve_topics
from walkit.adapters.spark.errors import ClusterUnreachable, SinkError
from walkit.adapters.spark.index import LogIndex
from walkit.adapters.spark.options import SinkOptions
from walkit.adapters.spark.records import decode_row
from walkit.adapters.spark.scan import topic_columns
from walkit.core.loglist import Position
from walkit.core.metadata import OPEN
from walkit.errors import WalkitError

TAG_HEADER = "walkit.spark.write"


def bootstrap_servers(client, options) -> list[str]:
    """bootstrap_servers is option kafka.bootstrap.servers, or the brokers registered in the metadata store."""
    if options.credentials.bootstrap:
        return [server.strip() for server in options.credentials.bootstrap.split(",") if server.strip()]
    brokers = catalog(client).brokers()
    if not brokers:
        raise ClusterUnreachable(f"no topics broker is registered in the cluster at {options.metadata}: "
                                 f"writes to a topic go through a broker (walkit topics serve)")
    return [f"{b.host}:{b.port}" for b in brokers.values()]


def publisher_for(client, options: SinkOptions, query: str | None = None):
    """publisher_for is the sink's publisher; `query` names a streaming query whose log writer may stay open."""
    return LogPublisher(client, options, query) if options.log is not None else TopicPublisher(client, options)


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
        """mark is where each partition ends now (a lower bound of where this write's records will be)."""
        return {str(p): self._index(p).end_offset() or 0 for p in range(self.topic.partitions)}

    def written(self, tag: str, since: dict) -> set[int]:
        """written is the rows of the write tagged `tag` that reached the topic after `since`."""
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
        kafka.compression.type and logs in with the query's SASL and TLS credentials. A broker
        certificate the CA does not vouch for, or a refused login, fails the write at once,
        naming the cause; any other failure once `timeout` passed.
        """
        from confluent_kafka import KafkaException, Producer
        broker_errors: list = []
        self._producer = producer = Producer({
            "bootstrap.servers": ",".join(bootstrap_servers(self.client, self.options)), "acks": "all",
            "enable.idempotence": True, "linger.ms": 5, "client.id": "walkit-spark",
            "compression.type": self.options.compression, "error_cb": broker_errors.append,
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
                    self._refused(broker_errors)
                except KafkaException as exc:
                    raise SinkError(f"producing to topic {self.topic.name!r} failed: {exc}") from None
            producer.poll(0)
            sent += 1
        deadline = time.monotonic() + self.options.timeout
        left = len(producer)
        while left and time.monotonic() < deadline:
            self._refused(broker_errors)
            left = producer.flush(min(0.5, max(0.0, deadline - time.monotonic())))
        if failures or left:
            self._refused(broker_errors)
            cause = repr(failures[0]) if failures else f"{left} records unacknowledged after {self.options.timeout} s"
            seen = f" (the connection to the broker: {broker_errors[-1].str()})" if broker_errors else ""
            raise SinkError(f"producing to topic {self.topic.name!r} failed: {cause}{seen}")
        return sent

    def _refused(self, broker_errors: list) -> None:
        """_refused raises SinkError when the broker refused the producer for good: its certificate or the login."""
        from confluent_kafka import KafkaError
        for error in broker_errors:
            text = error.str()
            if "certificate verify failed" in text:
                raise SinkError(f"producing to topic {self.topic.name!r} failed: the broker's certificate could not "
                                f"be verified with the CA of kafka.ssl.ca.location "
                                f"({self.options.credentials.tls.ca if self.options.credentials.tls else None}); "
                                f"librdkafka: {text}")
            if error.code() == KafkaError._AUTHENTICATION:
                raise SinkError(f"producing to topic {self.topic.name!r} failed: the broker refused the login "
                                f"(kafka.sasl.jaas.config, WALKIT_SASL_USERNAME); librdkafka: {text}")

    def close(self) -> None:
        """close drops what a failed publish left queued and ends the producer's connections."""
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.purge()
            producer.close()


@dataclass
class _OpenLog:
    """_OpenLog is a log writer and where its next record goes (every record before it was acknowledged)."""

    writer: object
    end: Position


#: Log writers the last commit of a streaming query left open in this process (module doc).
_open_logs: dict[tuple, _OpenLog] = {}


class LogPublisher:
    """LogPublisher appends staged rows' values to a log as its single writer (module doc: the open writer)."""

    def __init__(self, client, options: SinkOptions, query: str | None = None) -> None:
        self.client = client
        self.options = options
        self._key = None if query is None else (options.metadata, options.credentials.key, options.log,
                                                options.password, query)
        self._open: _OpenLog | None = None
        self._published = False

    def _fresh(self) -> _OpenLog:
        """_fresh opens the log, fencing any other writer; appends go to a new, empty ledger."""
        held = _open_logs.pop(self._key, None) if self._key is not None else None
        if held is not None:
            _close_quietly(held.writer)
        writer = self.client.open_log(self.options.log, password=self.options.password)
        self._open = _OpenLog(writer, Position(writer.ledger_id, 0))
        return self._open

    def _kept(self) -> _OpenLog | None:
        """_kept is the writer this query's last commit left in this process, if it is still the log's writer."""
        held = _open_logs.pop(self._key, None) if self._key is not None else None
        if held is None:
            return None
        try:
            ledgers = self.client.log_metadata(self.options.log).ledger_ids
            current = bool(ledgers) and ledgers[-1] == held.writer.ledger_id and \
                self.client.ledger_metadata(held.writer.ledger_id).state == OPEN
        except WalkitError:
            current = False
        if not current:
            _close_quietly(held.writer)
            return None
        self._open = held
        return held

    def _positions(self, opened: _OpenLog) -> _OpenLog:
        """_positions refuses a log of one unbounded ledger: positions there do not start a new ledger per writer."""
        if opened.writer.metadata.config.unbounded:
            raise SinkError(f"log {self.options.log!r} is one unbounded ledger: a streaming write or one with "
                            f"writeId needs a log of ledgers (the default of walkit.LogConfig)")
        return opened

    def mark(self) -> str:
        """mark takes the log, with the writer kept open if it still is the log's, and returns where its next
        record goes ("LEDGER:ENTRY"): this write's records are the log's records from there on."""
        return str(self._positions(self._kept() or self._fresh()).end)

    def written(self, tag: str, since) -> range:
        """written is the rows of the interrupted write already in the log: the records at or after `since`.

        It opens the log first, which fences the interrupted writer: nothing more of it can arrive.
        `since` is "LEDGER:ENTRY", or a ledger id (markers written before writers were kept open).
        """
        self._positions(self._fresh())
        start = Position(since, 0) if isinstance(since, int) else Position.parse(since)
        reading = self.client.read_log(self.options.log, start=start, password=self.options.password)
        with reading:
            count = sum(1 for _ in reading)
        return range(count)

    def publish(self, rows, tag: str | None, skip) -> int:
        """publish appends the value of every row whose place is not in `skip`; it returns how many."""
        opened = self._open or self._fresh()
        appends = [opened.writer.append_async(decode_row(row)[2] or b"") for i, row in enumerate(rows)
                   if i not in skip]
        for appended in appends:
            last = appended.result(self.options.timeout)
            opened.end = Position(last.ledger_id, last.entry_id + 1)
        self._published = True
        return len(appends)

    def close(self) -> None:
        """close keeps a streaming query's writer open for its next commit once a publish completed;
        it closes any other (and one whose publish failed, quietly: the failure is what matters)."""
        opened, self._open = self._open, None
        if opened is None:
            return
        if self._published and self._key is not None:
            _open_logs[self._key] = opened
        elif self._published:
            opened.writer.close()
        else:
            _close_quietly(opened.writer)


def _close_quietly(writer) -> None:
    """_close_quietly closes a writer that may have been fenced or failed; its errors no longer matter."""
    try:
        writer.close()
    except (WalkitError, OSError):
        pass
