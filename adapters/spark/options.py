"""walkit.adapters.spark.options checks the options of the "walkit" data source.

Reads (Spark's Kafka source names where they exist):

    metadata                walkit metadata URI of the cluster (required)
    topic | subscribe | subscribePattern | assign | log
                            topics: one or a comma list, a regular expression, JSON
                            {"t": [0, 1]} of partitions; or one walkit log
    startingOffsets         earliest | latest | per partition JSON {"t": {"0": 42, "1": -2}}
                            (-2 earliest, -1 latest); for a log: earliest | latest | LEDGER:ENTRY
    startingOffsetsByTimestamp  JSON {"t": {"0": 1700000000000}}: per partition, the first offset
                            whose timestamp is at or after it (the broker's ListOffsets)
    startingTimestamp       the same for every partition (ms since the epoch)
    endingOffsets           batch reads only: latest | JSON as above (-1 latest) | LEDGER:ENTRY
    maxOffsetsPerTrigger    streaming: at most this many records per micro-batch
    minOffsetsPerTrigger    streaming: wait for at least this many new records before a micro-batch,
    maxTriggerDelay           but no longer than maxTriggerDelay (15m; "30s", "500ms", "2m", "1h")
    failOnDataLoss          true (default) | false: skip what retention removed instead of failing
    includeHeaders          true (default) | false: leave the headers column out
    minPartitions           at least this many Spark partitions (large ranges are split)
    maxRecordsPerPartition  split a range of more records than this (default 250,000)
    password                the logs' password (default empty)
    timeout                 seconds each call to the cluster may take (default 30)

Credentials (reads and writes; credentials.py): `key`, the client's key file on a secured
cluster (default: the WALKIT_KEY environment variable); `kafka.security.protocol` (PLAINTEXT,
SASL_PLAINTEXT, SSL, SASL_SSL), `kafka.sasl.mechanism`, `kafka.sasl.jaas.config` for a broker
that requires SASL (default: WALKIT_SASL_USERNAME and WALKIT_SASL_PASSWORD); the PEM files of
TLS, `kafka.ssl.ca.location`, `kafka.ssl.certificate.location`, `kafka.ssl.key.location`,
`kafka.ssl.key.password` (default: WALKIT_SSL_CA_LOCATION...); `kafka.bootstrap.servers` (the
brokers; default: those registered in the metadata store). Java key stores
(`kafka.ssl.truststore.*`, `kafka.ssl.keystore.*`) are refused, naming the PEM options.

Writes: `metadata`, `topic` (one) or `log`, `password`, `timeout`, `kafka.compression.type`
(none, gzip, snappy, lz4, zstd), `writeId` (batch writes: the write's name, which makes it
exactly once; writer.py), the credentials.

Any other option is an OptionError naming it and the closest valid one.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field

from walkit.adapters.spark.credentials import CREDENTIAL_OPTIONS, Credentials, parse_credentials
from walkit.adapters.spark.errors import OptionError
from walkit.core.loglist import Position

EARLIEST = -2
LATEST = -1
DEFAULT_MAX_RECORDS_PER_PARTITION = 250_000
DEFAULT_MAX_TRIGGER_DELAY = 15 * 60.0
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,180}")
_WRITE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")

#: Every option a read takes, as Spark's Kafka source spells them where it has them.
SOURCE_OPTIONS = (
    "metadata", "topic", "subscribe", "subscribePattern", "assign", "log", "startingOffsets", "endingOffsets",
    "startingOffsetsByTimestamp", "startingTimestamp", "maxOffsetsPerTrigger", "minOffsetsPerTrigger",
    "maxTriggerDelay", "failOnDataLoss", "includeHeaders", "minPartitions", "maxRecordsPerPartition", "password",
    "timeout", *CREDENTIAL_OPTIONS)
#: Every option a write takes.
SINK_OPTIONS = ("metadata", "topic", "log", "password", "timeout", "kafka.compression.type", "writeId",
                *CREDENTIAL_OPTIONS)


#: Options Spark itself puts among a data source's (a streaming sink's checkpoint; load(path), save(path)).
SPARKS_OWN = ("path", "checkpointlocation")


def check_names(options, known: tuple[str, ...], what: str) -> None:
    """check_names raises OptionError for an option not in `known`, naming the closest valid one (difflib).

    Spark hands options over case-insensitively (CaseInsensitiveDict), so names compare lower-case.
    """
    by_lower = {name.lower(): name for name in known}
    for name in options:
        if str(name).lower() in by_lower or str(name).lower() in SPARKS_OWN:
            continue
        close = difflib.get_close_matches(str(name).lower(), list(by_lower), n=1, cutoff=0.6)
        hint = f"; did you mean {by_lower[close[0]]}?" if close else f"; {what} takes {', '.join(known)}"
        raise OptionError(f"unknown option {name!r} for {what}{hint}")


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
    min_offsets_per_trigger: int | None = None
    max_trigger_delay: float = DEFAULT_MAX_TRIGGER_DELAY
    fail_on_data_loss: bool = True
    include_headers: bool = True
    assigned: dict | None = None
    starting_timestamps: object = None
    credentials: Credentials = field(default_factory=Credentials)
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
    compression: str = "none"
    credentials: Credentials = field(default_factory=Credentials)
    write_id: str | None = None

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


def _bool(options, name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None:
        return default
    if raw.lower() not in ("true", "false"):
        raise OptionError(f"option {name} must be true or false, not {raw!r}")
    return raw.lower() == "true"


_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)?\s*")
_UNITS = {"ms": 0.001, "s": 1.0, None: 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def _duration(options, name: str, default: float) -> float:
    raw = _get(options, name)
    if raw is None:
        return default
    match = _DURATION.fullmatch(raw)
    if not match:
        raise OptionError(f"option {name} is a duration like 30s, 500ms, 15m or 1h, not {raw!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _assign(raw: str) -> dict[str, tuple[int, ...]]:
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not doc or not all(
            isinstance(parts, list) and parts and all(isinstance(p, int) and not isinstance(p, bool) and p >= 0
                                                      for p in parts) for parts in doc.values()):
        raise OptionError(f'option assign is JSON like {{"topic": [0, 1]}}, not {raw!r}')
    for name in doc:
        _topic_names(name)
    return {name: tuple(sorted(set(parts))) for name, parts in doc.items()}


def _timestamps(options):
    """_timestamps is startingOffsetsByTimestamp as {(topic, partition): ms}, startingTimestamp as an int, or None."""
    by_partition, every = _get(options, "startingOffsetsByTimestamp"), _get(options, "startingTimestamp")
    if by_partition is not None and every is not None:
        raise OptionError("give one of the options startingOffsetsByTimestamp and startingTimestamp")
    if every is not None:
        try:
            return int(every)
        except ValueError:
            raise OptionError(f"option startingTimestamp is milliseconds since the epoch, not {every!r}") from None
    if by_partition is None:
        return None
    stamps = parse_offsets(by_partition, "startingOffsetsByTimestamp", False)
    if not isinstance(stamps, dict) or any(ms < 0 for ms in stamps.values()):
        raise OptionError(f"option startingOffsetsByTimestamp is JSON like "
                          f'{{"topic": {{"0": 1700000000000}}}}, not {by_partition!r}')
    return stamps


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
    check_names(options, SOURCE_OPTIONS, "a read")
    metadata = _metadata(options)
    topic, pattern, log = _get(options, "topic") or _get(options, "subscribe"), _get(options, "subscribePattern"), \
        _get(options, "log")
    assign = _get(options, "assign")
    given = [name for name, value in (("topic", topic), ("subscribePattern", pattern), ("assign", assign),
                                      ("log", log)) if value]
    if len(given) != 1:
        raise OptionError("give exactly one of the options topic, subscribePattern and log, or assign"
                          + (f" (got {', '.join(given)})" if given else ""))
    topics: tuple[str, ...] = ()
    assigned = None
    if topic:
        topics = _topic_names(topic)
    if assign:
        assigned = _assign(assign)
        topics = tuple(assigned)
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
    fail = _bool(options, "failOnDataLoss", True)
    stamps = _timestamps(options)
    if stamps is not None and (log is not None or _get(options, "startingOffsets") is not None):
        raise OptionError("startingOffsetsByTimestamp and startingTimestamp are for topics, instead of startingOffsets")
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
        for name in ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay"):
            if _get(options, name) is not None:
                raise OptionError(f"option {name} is for streaming reads")
    least, most = _positive_int(options, "minOffsetsPerTrigger"), _positive_int(options, "maxOffsetsPerTrigger")
    if least is not None and most is not None and least > most:
        raise OptionError(f"option minOffsetsPerTrigger ({least}) is above maxOffsetsPerTrigger ({most})")
    return SourceOptions(
        metadata=metadata, topics=topics, pattern=pattern or None, log=log, starting=starting, ending=ending,
        max_offsets_per_trigger=most, min_offsets_per_trigger=least,
        max_trigger_delay=_duration(options, "maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY), fail_on_data_loss=fail,
        include_headers=_bool(options, "includeHeaders", True), assigned=assigned, starting_timestamps=stamps,
        credentials=parse_credentials(options),
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
    check_names(options, SINK_OPTIONS, "a write")
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
    compression = (_get(options, "kafka.compression.type") or "none").lower()
    if compression not in CODECS:
        raise OptionError(f"option kafka.compression.type is one of {', '.join(CODECS)}, not {compression!r}")
    write_id = _get(options, "writeId")
    if write_id is not None and not _WRITE_ID.fullmatch(write_id):
        raise OptionError(f"option writeId names a write with 1-200 letters, digits, '.', '_' or '-', starting with a "
                          f"letter or digit, not {write_id!r}")
    return SinkOptions(metadata=metadata, topic=topic, log=log or None,
                       password=(_get(options, "password") or "").encode(), timeout=_timeout(options),
                       compression=compression, credentials=parse_credentials(options), write_id=write_id)
