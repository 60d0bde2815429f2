"""walkit.adapters.topics.catalog keeps topics and brokers in the cluster's metadata store.

    topics/topics/<name>     {"name", "partitions", "configs", "id", "created_ms"}  (JSON)
    topics/brokers/<id>      {"id", "host", "port"}: ephemeral, while the broker lives
    topics/broker-ids        counter: a new broker's id
    topics/producer-ids      counter: InitProducerId's producer ids
    topics/group-buckets     the cluster's count of group buckets (decimal), fixed by its first broker
    topics/acls              the ACL bindings (JSON list, acls.py)

A topic's record changes only by compare-and-set (`update_topic`): CreatePartitions raises its
partition count, AlterConfigs and IncrementalAlterConfigs replace its configs (validated as at
creation); every broker's ownership thread reads the new record when the watch fires.

Partition p of topic t is the replicated machine ``kafka-<t>-<p>-<id>`` (walkit.replicate: its
log is ``replicated-kafka-<t>-<p>-<id>``, one entry per group of record batches), where <id>
starts the topic's id, so a topic deleted and created again under the same name starts from
new logs, elections and snapshots. Group coordination is spread over the cluster's group buckets
(`--group-buckets`, DEFAULT_GROUP_BUCKETS for a new cluster), each the replicated machine
``kafkagroups-<b>`` holding the committed offsets and memberships of its groups (offsets.py).
A group's bucket is a hash of its id modulo the count, so the count never changes once a
cluster has one: with another count, groups would look for their offsets in other buckets.
"""

from __future__ import annotations

import json
import re
import time
import uuid
import zlib
from dataclasses import dataclass, field

from walkit.adapters.topics import errors
from walkit.adapters.topics.errors import KafkaError
from walkit.client.api import DEFAULT_MAX_ENTRY_BYTES
from walkit.errors import BadVersion, ConfigError, NodeExists, NoSuchKey
from walkit.replication.batch import max_record

PREFIX = "topics"
TOPICS = f"{PREFIX}/topics"
BROKERS = f"{PREFIX}/brokers"
GROUP_BUCKETS_KEY = f"{PREFIX}/group-buckets"
#: Group buckets of a new cluster (Kafka has 50 offsets partitions; a bucket costs a node on every broker).
DEFAULT_GROUP_BUCKETS = 16
#: Group buckets of a cluster from before the count was a setting (its bucket logs exist, the key does not).
LEGACY_GROUP_BUCKETS = 4
TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,180}")
#: The most partitions a topic may have.
MAX_PARTITIONS = 10_000
#: Compare-and-set attempts of a change to a topic's record before it gives up (others changed it each time).
UPDATE_ATTEMPTS = 20

#: Topic configs the broker understands, with Kafka's defaults (segment.bytes: walkit's roll size).
DEFAULT_CONFIGS = {
    "cleanup.policy": "delete",
    "delete.retention.ms": "86400000",
    "retention.ms": "604800000",
    "retention.bytes": "-1",
    "segment.ms": "604800000",
    "segment.bytes": str(64 * 1024 * 1024),
    "max.message.bytes": "1048588",
    "message.timestamp.type": "CreateTime",
}
_INTEGER_CONFIGS = {"retention.ms", "retention.bytes", "segment.ms", "segment.bytes", "max.message.bytes",
                    "delete.retention.ms"}
#: cleanup.policy's values: delete (retention), compact (compaction.py) or both.
CLEANUP_POLICIES = {"delete", "compact", "compact,delete", "delete,compact"}
#: The largest record batch a partition stores with walkit's default entry size: a batch is one
#: walkit.replicate record, and a record must fit a log entry of its own (the client's
#: max_entry_bytes, 60 MiB, less 9 bytes). `max.message.bytes` and the broker's
#: `max_message_bytes` go no higher; larger batches are refused (MESSAGE_TOO_LARGE), never split.
MAX_MESSAGE_BYTES = max_record(DEFAULT_MAX_ENTRY_BYTES)


#: The prefix walkit.replicate gives the log of a replicated machine.
REPLICATED_LOG = "replicated-"


def partition_name(topic: "Topic", partition: int) -> str:
    """partition_name is the walkit.replicate name of a topic partition (long topic names are cut)."""
    return f"kafka-{topic.name[:150]}-{partition}-{topic.id[:8] or '0'}"


def partition_log(topic: "Topic", partition: int) -> str:
    """partition_log is the walkit log of a topic partition: its record batches."""
    return REPLICATED_LOG + partition_name(topic, partition)


def bucket_name(bucket: int) -> str:
    """bucket_name is the walkit.replicate name of a group bucket: its committed offsets."""
    return f"kafkagroups-{bucket}"


def group_bucket(group: str, buckets: int) -> int:
    """group_bucket is the bucket (and so the coordinator) of a consumer group in a cluster of `buckets`."""
    return zlib.crc32(group.encode()) % buckets


def valid_topic_name(name) -> bool:
    """valid_topic_name tells whether `name` can name a topic (Kafka's rule: 1-180 of [A-Za-z0-9._-], not . or ..)."""
    return isinstance(name, str) and TOPIC_NAME.fullmatch(name) is not None and name not in (".", "..")


def check_topic_name(name: str) -> str:
    """check_topic_name returns `name` or raises KafkaError(INVALID_TOPIC_EXCEPTION)."""
    if not valid_topic_name(name):
        raise KafkaError(errors.INVALID_TOPIC_EXCEPTION,
                         f"invalid topic name {name!r}: use 1-180 letters, digits, '.', '_' or '-'")
    return name


def check_configs(configs: dict[str, str], largest_message: int = MAX_MESSAGE_BYTES) -> dict[str, str]:
    """check_configs validates topic configs and returns them; KafkaError(INVALID_CONFIG) otherwise.

    `max.message.bytes` may not pass `largest_message`, the largest batch a partition's log
    entry holds (the broker's, from its client's max_entry_bytes).
    """
    for name, value in configs.items():
        if name not in DEFAULT_CONFIGS:
            raise KafkaError(errors.INVALID_CONFIG, f"unsupported topic config {name!r} "
                                                    f"(supported: {', '.join(sorted(DEFAULT_CONFIGS))})")
        if name in _INTEGER_CONFIGS:
            try:
                number = int(value)
            except (TypeError, ValueError):
                raise KafkaError(errors.INVALID_CONFIG, f"{name} must be an integer, not {value!r}") from None
            if number < -1 or (number <= 0 and name in ("segment.bytes", "segment.ms", "max.message.bytes")):
                raise KafkaError(errors.INVALID_CONFIG, f"{name} = {value} is out of range")
            if name == "max.message.bytes" and number > largest_message:
                raise KafkaError(errors.INVALID_CONFIG, f"max.message.bytes = {value} is above {largest_message}, "
                                                        f"the largest record batch a partition's log entry holds "
                                                        f"(batches are refused, not split)")
        elif name == "cleanup.policy" and value.replace(" ", "") not in CLEANUP_POLICIES:
            raise KafkaError(errors.INVALID_CONFIG,
                             f"cleanup.policy is delete, compact or compact,delete, not {value!r}")
        elif name == "message.timestamp.type" and value != "CreateTime":
            raise KafkaError(errors.INVALID_CONFIG, "only message.timestamp.type=CreateTime is supported")
    return dict(configs)


@dataclass(frozen=True)
class Topic:
    """Topic is a topic's record in the metadata store."""

    name: str
    partitions: int
    configs: dict = field(default_factory=dict)
    id: str = ""
    created_ms: int = 0

    def config(self, name: str) -> str:
        """config is the value of a topic config (its default when not set)."""
        return self.configs.get(name, DEFAULT_CONFIGS[name])

    def int_config(self, name: str) -> int:
        """int_config is an integer topic config."""
        return int(self.config(name))

    @property
    def uuid(self) -> uuid.UUID:
        """uuid is the topic id as a UUID."""
        return uuid.UUID(self.id) if self.id else uuid.UUID(int=0)

    def log_options(self) -> dict:
        """log_options are the walkit LogConfig fields that follow from the topic's configs."""
        return {"roll_bytes": self.int_config("segment.bytes"), "roll_age_s": self.int_config("segment.ms") / 1000}

    def to_bytes(self) -> bytes:
        """to_bytes encodes the record as JSON."""
        return json.dumps({"name": self.name, "partitions": self.partitions, "configs": self.configs,
                           "id": self.id, "created_ms": self.created_ms}, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "Topic":
        """from_bytes decodes a record written by `to_bytes`."""
        doc = json.loads(data)
        return cls(doc["name"], doc["partitions"], doc.get("configs", {}), doc.get("id", ""), doc.get("created_ms", 0))


@dataclass(frozen=True)
class BrokerInfo:
    """BrokerInfo is a live broker's registration: its id and where clients reach it."""

    id: int
    host: str
    port: int

    def to_bytes(self) -> bytes:
        """to_bytes encodes the registration as JSON."""
        return json.dumps({"id": self.id, "host": self.host, "port": self.port}).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "BrokerInfo":
        """from_bytes decodes a registration written by `to_bytes`."""
        doc = json.loads(data)
        return cls(int(doc["id"]), doc["host"], int(doc["port"]))


class Catalog:
    """Catalog reads and changes topics and broker registrations in a MetadataStore (blocking calls)."""

    def __init__(self, store) -> None:
        self.store = store

    def create_topic(self, name: str, partitions: int, configs: dict[str, str] | None = None,
                     largest_message: int = MAX_MESSAGE_BYTES) -> Topic:
        """create_topic stores a new topic; KafkaError(TOPIC_ALREADY_EXISTS) if it exists (see check_configs)."""
        check_topic_name(name)
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise KafkaError(errors.INVALID_PARTITIONS, f"{partitions} partitions (use 1 to {MAX_PARTITIONS})")
        topic = Topic(name, partitions, check_configs(configs or {}, largest_message), uuid.uuid4().hex,
                      int(time.time() * 1000))
        try:
            self.store.create(f"{TOPICS}/{name}", topic.to_bytes())
        except NodeExists:
            raise KafkaError(errors.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists") from None
        return topic

    def topic(self, name: str) -> Topic | None:
        """topic returns a topic's record, or None (at once for a name no topic can have: "", "a/b", ...)."""
        if not valid_topic_name(name):
            return None
        try:
            value, _ = self.store.get(f"{TOPICS}/{name}")
        except NoSuchKey:
            return None
        return Topic.from_bytes(value)

    def topics(self) -> dict[str, Topic]:
        """topics returns every topic by name."""
        found = {}
        for name in self.store.children(TOPICS):
            topic = self.topic(name)
            if topic is not None:
                found[name] = topic
        return found

    def update_topic(self, name: str, change) -> Topic:
        """update_topic replaces a topic's record with `change(topic)` by compare-and-set and returns it.

        `change` is asked again if another broker changed the record meanwhile; it raises KafkaError
        to refuse. KafkaError(UNKNOWN_TOPIC_OR_PARTITION) if the topic does not exist.
        """
        if not valid_topic_name(name):
            raise KafkaError(errors.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name!r}")
        key = f"{TOPICS}/{name}"
        for _ in range(UPDATE_ATTEMPTS):
            try:
                value, version = self.store.get(key)
            except NoSuchKey:
                raise KafkaError(errors.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name!r}") from None
            changed = change(Topic.from_bytes(value))
            try:
                self.store.put(key, changed.to_bytes(), version)
            except BadVersion:
                continue
            except NoSuchKey:
                raise KafkaError(errors.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name!r}") from None
            return changed
        raise KafkaError(errors.UNKNOWN_SERVER_ERROR, f"topic {name!r} changed {UPDATE_ATTEMPTS} times meanwhile")

    def delete_topic(self, name: str) -> Topic:
        """delete_topic removes a topic's record (its leaders then delete the logs); KafkaError if absent."""
        if not valid_topic_name(name):
            raise KafkaError(errors.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name!r}")
        try:
            value, version = self.store.get(f"{TOPICS}/{name}")
            self.store.delete(f"{TOPICS}/{name}", version)
        except NoSuchKey:
            raise KafkaError(errors.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name!r}") from None
        return Topic.from_bytes(value)

    def brokers(self) -> dict[int, BrokerInfo]:
        """brokers returns the live brokers by id."""
        found = {}
        for child in self.store.children(BROKERS):
            try:
                value, _ = self.store.get(f"{BROKERS}/{child}")
            except NoSuchKey:
                continue
            broker = BrokerInfo.from_bytes(value)
            found[broker.id] = broker
        return found

    def register_broker(self, broker: BrokerInfo):
        """register_broker registers a live broker (ephemeral); it returns the registration session."""
        return self.store.register(f"{BROKERS}/{broker.id}", broker.to_bytes())

    def group_buckets(self, wanted: int | None, existed) -> int:
        """group_buckets is the cluster's count of group buckets, recorded by the first broker to ask.

        A cluster without the key gets `wanted` (DEFAULT_GROUP_BUCKETS if None), unless
        `existed()` says its bucket logs exist already: a cluster from before the setting, which
        keeps LEGACY_GROUP_BUCKETS. A `wanted` count other than the recorded one is refused
        (ConfigError): a group's committed offsets live in the bucket its id hashes to, so
        another count would leave them where no coordinator looks.
        """
        try:
            value, _ = self.store.get(GROUP_BUCKETS_KEY)
        except NoSuchKey:
            value = str(LEGACY_GROUP_BUCKETS if existed() else wanted or DEFAULT_GROUP_BUCKETS).encode()
            try:
                self.store.create(GROUP_BUCKETS_KEY, value)
            except NodeExists:
                value, _ = self.store.get(GROUP_BUCKETS_KEY)
        recorded = int(value)
        if wanted is not None and wanted != recorded:
            raise ConfigError(f"this cluster has {recorded} group buckets (metadata key {GROUP_BUCKETS_KEY}), not "
                              f"{wanted}: committed offsets live in the bucket a group's id hashes to, so the count "
                              f"cannot change; start with --group-buckets {recorded}, or without the option")
        return recorded

    def new_broker_id(self) -> int:
        """new_broker_id draws an id for a broker that was given none (1, 2, 3, ...)."""
        return self.store.next_id(f"{PREFIX}/broker-ids") + 1

    def new_producer_id(self) -> int:
        """new_producer_id draws a cluster-wide unique producer id (InitProducerId)."""
        return self.store.next_id(f"{PREFIX}/producer-ids") + 1
