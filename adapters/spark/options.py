"""walkit.adapters.spark.options checks the options of the "walkit" data source.

Reads (Spark's Kafka source names where they exist):

    metadata                walkit metadata URI of the cluster (required)
    topic | subscribePattern | log
                            topics: one, a comma list, or a regular expression; or one walkit log
    startingOffsets         earliest | latest | per partition JSON {"t": {"0": 42, "1": -2}}
                            (-2 earliest, -1 latest); for a log: earliest | latest | LEDGER:ENTRY
    endingOffsets           batch reads only: latest | JSON as above (-1 latest) | LEDGER:ENTRY
    maxOffsetsPerTrigger    streaming: at most this many records per micro-batch
    failOnDataLoss          true (default) | false: skip what retention removed instead of failing
    minPartitions           at least this many Spark partitions (large ranges are split)
    maxRecordsPerPartition  split a range of more records than this (default 250,000)
    password                the logs' password (default empty)
    timeout                 seconds each call to the cluster may take (default 30)

Writes: `metadata`, `topic` (one) or `log`, `password`, `timeout`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from walkit.adapters.spark.errors import OptionError
from walkit.core.loglist import Position

EARLIEST = -2
LATEST = -1
DEFAULT_MAX_RECORDS_PER_PARTITION = 250_000
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,180}")


@dataclass(frozen=True)
class SourceOptions:
    """SourceOptions are the checked options of a read (see the module doc).

    `starting` and `ending` are "earliest", "latest", a dict {(topic, partition): offset} for
    topics (EARLIEST, LATEST or an offset) or a Position for a log.
    """

    metadata: str
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    log: str | None = None
    starting: object = "earliest"
    ending: object = "latest"
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    min_partitions: int = 1
    max_records_per_partition: int = DEFAULT_MAX_RECORDS_PER_PARTITION
    password: bytes = b""
    timeout: float = 30.0

    @property
    def target(self) -> str:
        """target names what is read, for messages."""
        if self.log is not None:
            return f"log {self.log!r}"
        if self.pattern is not None:
            return f"topics matching {self.pattern!r}"
        return f"topic{'s' if len(self.topics) > 1 else ''} {', '.join(self.topics)}"


@dataclass(frozen=True)
class SinkOptions:
    """SinkOptions are the checked options of a write: one topic or one log."""

    metadata: str
    topic: str | None = None
    log: str | None = None
    password: bytes = b""
    timeout: float = 30.0

    @property
    def target(self) -> str:
        """target is "topic/NAME" or "log/NAME": the sink's name in messages and in the metadata store."""
        return f"topic/{self.topic}" if self.topic is not None else f"log/{self.log}"


def _get(options, name: str) -> str | None:
    value = options.get(name)
    if value is None:
        value = options.get(name.lower())
    return None if value is None else str(value)


def _positive_int(options, name: str) -> int | None:
    raw = _get(options, name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option {name} must be a positive integer, not {raw!r}") from None
    if value <= 0:
        raise OptionError(f"option {name} must be a positive integer, not {raw!r}")
    return value


def _timeout(options) -> float:
    raw = _get(options, "timeout")
    if raw is None:
        return 30.0
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise OptionError(f"option timeout must be a positive number of seconds, not {raw!r}")
    return value


def _metadata(options) -> str:
    metadata = _get(options, "metadata")
    if not metadata:
        raise OptionError("option metadata is required: the walkit cluster's metadata URI, "
                          "e.g. sqlite:///path/walkit-data/metadata.db or zk://host:2181/walkit")
    if "://" not in metadata:
        raise OptionError(f"option metadata must be a metadata URI (sqlite:///..., zk://..., etcd://...), "
                          f"not {metadata!r}")
    return metadata


def _topic_names(raw: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in raw.split(",") if name.strip())
    if not names:
        raise OptionError(f"option topic names no topic: {raw!r}")
    for name in names:
        if not _TOPIC.fullmatch(name):
            raise OptionError(f"option topic: {name!r} is not a topic name (1-180 letters, digits, '.', '_', '-')")
    return names


def parse_source(options, *, streaming: bool) -> SourceOptions:
    """parse_source checks a read's options; it raises OptionError naming the bad one."""
    metadata = _metadata(options)
    topic, pattern, log = _get(options, "topic") or _get(options, "subscribe"), _get(options, "subscribePattern"), \
        _get(options, "log")
    given = [name for name, value in (("topic", topic), ("subscribePattern", pattern), ("log", log)) if value]
    if len(given) != 1:
        raise OptionError("give exactly one of the options topic, subscribePattern and log"
                          + (f" (got {', '.join(given)})" if given else ""))
    topics: tuple[str, ...] = ()
    if topic:
        topics = _topic_names(topic)
    if pattern:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise OptionError(f"option subscribePattern {pattern!r} is not a regular expression: {exc}") from None
    if log is not None:
        from walkit.core.loglist import check_log_name
        try:
            check_log_name(log)
        except ValueError as exc:
            raise OptionError(f"option log: {exc}") from None
    fail = (_get(options, "failOnDataLoss") or "true").lower()
    if fail not in ("true", "false"):
        raise OptionError(f"option failOnDataLoss must be true or false, not {fail!r}")
    starting = parse_offsets(_get(options, "startingOffsets") or ("latest" if streaming else "earliest"),
                             "startingOffsets", log is not None)
    ending = parse_offsets(_get(options, "endingOffsets") or "latest", "endingOffsets", log is not None)
    if streaming and _get(options, "endingOffsets") is not None:
        raise OptionError("option endingOffsets is for batch reads; a streaming query reads on as records arrive")
    if not streaming:
        if starting == "latest" or (isinstance(starting, dict) and LATEST in starting.values()):
            raise OptionError("startingOffsets latest (-1) is not allowed in a batch read: it would read nothing")
        if ending == "earliest" or (isinstance(ending, dict) and EARLIEST in ending.values()):
            raise OptionError("endingOffsets earliest (-2) is not allowed in a batch read: it would read nothing")
        if _get(options, "maxOffsetsPerTrigger") is not None:
            raise OptionError("option maxOffsetsPerTrigger is for streaming reads")
    return SourceOptions(
        metadata=metadata, topics=topics, pattern=pattern or None, log=log, starting=starting, ending=ending,
        max_offsets_per_trigger=_positive_int(options, "maxOffsetsPerTrigger"), fail_on_data_loss=fail == "true",
        min_partitions=_positive_int(options, "minPartitions") or 1,
        max_records_per_partition=_positive_int(options, "maxRecordsPerPartition") or DEFAULT_MAX_RECORDS_PER_PARTITION,
        password=(_get(options, "password") or "").encode(), timeout=_timeout(options))


def parse_offsets(raw: str, name: str, for_log: bool):
    """parse_offsets reads a startingOffsets / endingOffsets value (see the module doc)."""
    text = raw.strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    if for_log:
        try:
            return Position.parse(text)
        except (ValueError, TypeError):
            raise OptionError(f"option {name} of a log is earliest, latest or LEDGER:ENTRY, not {raw!r}") from None
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not doc:
        raise OptionError(f"option {name} is earliest, latest or JSON like "
                          f'{{"topic": {{"0": 23, "1": -2}}}}, not {raw!r}')
    offsets: dict[tuple[str, int], int] = {}
    for topic, partitions in doc.items():
        if not isinstance(partitions, dict):
            raise OptionError(f"option {name}: the value of topic {topic!r} must map partitions to offsets")
        for partition, offset in partitions.items():
            try:
                number = int(partition)
            except ValueError:
                raise OptionError(f"option {name}: {partition!r} of topic {topic!r} is not a partition number") from None
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < EARLIEST or number < 0:
                raise OptionError(f"option {name}: offset {offset!r} of {topic}-{partition} must be an "
                                  f"offset, -2 (earliest) or -1 (latest)")
            offsets[(topic, number)] = offset
    return offsets


def parse_sink(options) -> SinkOptions:
    """parse_sink checks a write's options: `metadata` and exactly one of `topic` (a single topic) and `log`."""
    metadata = _metadata(options)
    topic, log = _get(options, "topic"), _get(options, "log")
    if bool(topic) == bool(log):
        raise OptionError("a write needs exactly one of the options topic and log")
    if topic:
        names = _topic_names(topic)
        if len(names) != 1:
            raise OptionError(f"a write goes to one topic, not {topic!r}")
        topic = names[0]
    else:
        from walkit.core.loglist import check_log_name
        try:
            check_log_name(log)
        except ValueError as exc:
            raise OptionError(f"option log: {exc}") from None
    return SinkOptions(metadata=metadata, topic=topic, log=log or None,
                       password=(_get(options, "password") or "").encode(), timeout=_timeout(options))
