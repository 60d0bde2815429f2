"""Record batches as a topics broker stored them, read from the partition's walkit log (not through the broker)."""

from __future__ import annotations

import walkit
from walkit.testing.processes import wait_until
from walkit.adapters.spark.records import batches
from walkit.adapters.topics.batches import COMPRESSION, info
from walkit.adapters.topics.catalog import Catalog, partition_log

#: Kafka's codec ids (a record batch's attributes, low 3 bits).
CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def stored_batches(metadata_url: str, topic: str, partition: int = 0) -> list[bytes]:
    """stored_batches are the record batches of a topic partition's log, in offset order, byte for byte."""
    with walkit.Client(metadata_url) as client:
        name = partition_log(Catalog(client.store).topic(topic), partition)
        return [batch for record in client.read_log(name) for batch in batches(record.payload)]


def codec_ids(stored: list[bytes]) -> list[int]:
    """codec_ids are the codec ids of `stored` batches, one per batch."""
    return [info(batch).attributes & COMPRESSION for batch in stored]


def record_count(stored: list[bytes]) -> int:
    """record_count is how many records `stored` batches hold."""
    return sum(info(batch).records for batch in stored)


def wait_stored(metadata_url: str, topic: str, count: int, partition: int = 0) -> list[bytes]:
    """wait_stored returns a partition's stored batches once they hold `count` records.

    A reader sees a ledger's entries up to its LAC, which trails the acknowledgements the
    producer got by an entry until the writer's next add or explicit LAC.
    """
    def complete() -> list[bytes] | None:
        stored = stored_batches(metadata_url, topic, partition)
        return stored if record_count(stored) == count else None
    return wait_until(complete, 30, interval=0.1, message=f"{count} records stored in {topic}-{partition}")
