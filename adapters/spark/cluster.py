"""walkit.adapters.spark.cluster connects Spark's processes to a walkit cluster and finds topics in it.

Every Python process Spark runs (the driver's planner, each executor's Python worker) keeps one
walkit Client per metadata URI and reuses it for all its tasks. Connecting checks what a
misconfigured job would otherwise meet as a hang: an sqlite metadata file that does not
exist (it is never created here), a metadata server that does not answer, a cluster without
live bookies; each is a ClusterUnreachable naming the URI.
"""

from __future__ import annotations

import os
import re
import threading
from contextlib import contextmanager

import walkit
from walkit.adapters.spark.errors import ClusterUnreachable, NoSuchTopic
from walkit.errors import MetadataError, NotEnoughBookies, Timeout, WalkitError

_clients: dict[tuple[str, float, str | None], walkit.Client] = {}
_lock = threading.Lock()


def connect(metadata: str, timeout: float = 30.0, key_file: str | None = None) -> walkit.Client:
    """connect returns this process's Client of the cluster at `metadata` (ClusterUnreachable if it cannot).

    `key_file` is the client's key on a secured cluster (credentials.py; None: WALKIT_KEY or none).
    """
    key = (metadata, timeout, key_file)
    with _lock:
        client = _clients.get(key)
        if client is not None:
            return client
        if metadata.startswith("sqlite:"):
            from walkit.plugins import path_of
            path = path_of(metadata.split("?", 1)[0])
            if not os.path.exists(path):
                raise ClusterUnreachable(f"no walkit cluster at {metadata}: the metadata file {path} does not exist")
        try:
            client = walkit.Client(metadata, timeout=timeout, request_timeout=min(10.0, timeout), key=key_file)
        except (WalkitError, OSError) as exc:
            raise ClusterUnreachable(f"cannot reach the walkit cluster at {metadata}: {exc}") from exc
        try:
            bookies = client.bookies()
        except (WalkitError, OSError) as exc:
            client.close()
            raise ClusterUnreachable(f"cannot reach the walkit cluster at {metadata}: {exc}") from exc
        if not bookies:
            client.close()
            raise ClusterUnreachable(f"the walkit cluster at {metadata} has no live bookie: start its bookies "
                                     f"(walkit local, walkit bookie, or walkit topics serve)")
        _clients[key] = client
        return client


@contextmanager
def reaching(metadata: str, what: str):
    """reaching turns timeouts and lost connections inside the block into ClusterUnreachable."""
    try:
        yield
    except (Timeout, MetadataError, NotEnoughBookies) as exc:
        raise ClusterUnreachable(f"{what}: the walkit cluster at {metadata} did not answer: "
                                 f"{type(exc).__name__}: {exc}") from exc


def catalog(client):
    """catalog is the topics catalog of the client's cluster."""
    from walkit.adapters.topics.catalog import Catalog
    return Catalog(client.store)


def resolve_topics(client, metadata: str, names: tuple[str, ...] = (), pattern: str | None = None) -> dict:
    """resolve_topics maps topic names to their catalog records: the names given (NoSuchTopic if one is
    missing) or every topic whose whole name matches `pattern`."""
    topics = catalog(client)
    if pattern is not None:
        regex = re.compile(pattern)
        return {name: topic for name, topic in sorted(topics.topics().items()) if regex.fullmatch(name)}
    found = {}
    for name in names:
        topic = topics.topic(name)
        if topic is None:
            known = sorted(topics.topics())
            raise NoSuchTopic(f"no topic {name!r} in the walkit cluster at {metadata}"
                              + (f" (its topics: {', '.join(known[:20])})" if known else " (it has no topics)"))
        found[name] = topic
    return found


def partition_log(topic, partition: int) -> str:
    """partition_log is the walkit log holding a topic partition's record batches."""
    from walkit.adapters.topics.catalog import partition_log as log_of
    return log_of(topic, partition)


def snapshot_next_offset(client, topic, partition: int, password: bytes = b"") -> int:
    """snapshot_next_offset is a partition's next offset from its latest snapshot (0 without one).

    It answers for a partition whose log holds no batch any more (retention removed them all).
    """
    from walkit.adapters.topics.catalog import partition_name
    from walkit.adapters.topics.partition import PartitionState
    from walkit.replication.snapshots import load_snapshot, read_pointer
    pointer, _ = read_pointer(client.store, partition_name(topic, partition))
    if pointer is None:
        return 0
    state = PartitionState()
    state.restore(load_snapshot(client, pointer, password))
    return state.next_offset


def offsets_for_times(client, options, stamps: dict) -> dict:
    """offsets_for_times maps {(topic, partition): ms} to the first offset of each whose timestamp is at or
    after ms, through a broker's ListOffsets (its time index), as Spark's Kafka source finds them; a
    partition with no such record maps to None (its end)."""
    from kafka import KafkaConsumer, TopicPartition
    from walkit.adapters.spark.publishers import bootstrap_servers
    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers(client, options), client_id="walkit-spark",
                             enable_auto_commit=False, request_timeout_ms=int(options.timeout * 1000) + 1000,
                             **options.credentials.kafka_settings())
    try:
        found = consumer.offsets_for_times({TopicPartition(t, p): ms for (t, p), ms in stamps.items()})
    finally:
        consumer.close()
    return {(tp.topic, tp.partition): (None if at is None else at.offset) for tp, at in found.items()}
