"""Spark reads topic batches of every codec: one topic written by confluent-kafka with gzip, snappy, lz4 and zstd."""

from __future__ import annotations

import pytest

from tests.support.topicslog import CODEC_IDS, codec_ids, wait_stored

from .kafkaclients import create_topic, produce

pytestmark = pytest.mark.slow

CODECS = ("gzip", "snappy", "lz4", "zstd")


def test_batch_read_decodes_records_of_each_codec(spark, broker):
    create_topic(broker.bootstrap, "codecs", 1)
    acked = []
    for codec in CODECS:                          # one flush per codec: batches of one codec each
        records = [(f"{codec}-{i}".encode(), f"{codec} value {i} {'.' * 200}".encode(), [("codec", codec.encode())])
                   for i in range(10)]
        acked += produce(broker.bootstrap, "codecs", records, **{"compression.type": codec})
    stored = wait_stored(broker.metadata_url, "codecs", 40)
    assert sorted(set(codec_ids(stored))) == [CODEC_IDS[c] for c in CODECS]
    rows = spark.read.format("walkit").option("metadata", broker.metadata_url).option("topic", "codecs").load().collect()
    got = sorted((r.key, r.value, r.partition, r.offset, [(h.key, h.value) for h in r.headers]) for r in rows)
    assert got == sorted(acked) and len(got) == 40
