"""The shipped pipelines: the incremental Parquet archive and the windowed counts, on the shared local Spark."""

from __future__ import annotations

import datetime
import json

import pytest

import walkit
from walkit.adapters.spark.jobs.archive import archive
from walkit.adapters.spark.jobs.windowed_counts import windowed_counts

from .kafkaclients import consume_all, create_topic, produce

pytestmark = pytest.mark.slow


def test_archive_run_twice_on_a_growing_log_writes_each_record_to_parquet_once(spark, broker, tmp_path):
    output, checkpoint = str(tmp_path / "archive"), str(tmp_path / "checkpoint")
    with walkit.Client(broker.metadata_url) as client:
        writer = client.open_log("archived")
        first = [writer.append(f"first {i}".encode()) for i in range(40)]
        archive(spark, broker.metadata_url, output, checkpoint, log="archived", max_records=25)
        assert sorted(r.value for r in spark.read.parquet(output).collect()) == \
            sorted(f"first {i}".encode() for i in range(40))
        writer.roll()
        second = [writer.append(f"second {i}".encode()) for i in range(30)]
        writer.close()
    archive(spark, broker.metadata_url, output, checkpoint, log="archived", max_records=25)
    rows = spark.read.parquet(output).collect()
    assert sorted((r.ledger_id, r.entry_id, r.value) for r in rows) == sorted(
        [(p.ledger_id, p.entry_id, f"first {i}".encode()) for i, p in enumerate(first)]
        + [(p.ledger_id, p.entry_id, f"second {i}".encode()) for i, p in enumerate(second)])


def test_windowed_counts_writes_each_closed_window_once_to_the_output_topic(spark, broker, tmp_path):
    create_topic(broker.bootstrap, "clicks", 2)
    create_topic(broker.bootstrap, "click-counts", 1)
    base = 1_700_000_000_000 - 1_700_000_000_000 % 60_000          # a minute boundary, in ms
    records = [(b"a", b"x", None, base + 1_000 * i) for i in range(5)]              # minute 0: a x5
    records += [(b"b", b"x", None, base + 2_000 * i) for i in range(3)]             # minute 0: b x3
    records += [(b"a", b"x", None, base + 60_000 + 500 * i) for i in range(2)]      # minute 1: a x2
    records += [(b"c", b"x", None, base + 10 * 60_000)]        # minute 10: moves the watermark past 0 and 1
    produce(broker.bootstrap, "clicks", records)
    query = windowed_counts(spark, broker.metadata_url, "clicks", "click-counts", str(tmp_path / "checkpoint"),
                            window="1 minute", watermark="1 minute", available_now=True)
    query.awaitTermination()
    assert query.exception() is None
    counts = [json.loads(m.value()) for m in consume_all(broker.bootstrap, "click-counts", 1)]
    def minute(n: int) -> str:
        return datetime.datetime.fromtimestamp(base / 1000 + 60 * n, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert sorted((c["key"], c["window_start"], c["window_end"], c["count"]) for c in counts) == [
        ("a", minute(0), minute(1), 5), ("a", minute(1), minute(2), 2), ("b", minute(0), minute(1), 3)]
