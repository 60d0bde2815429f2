"""Streaming writes: a driver SIGKILLed mid-run and restarted from its checkpoints writes every record exactly
once, into a topic and into a log; a log sink appends every micro-batch of a query to one ledger."""

from __future__ import annotations

import collections
import json
import os

import pytest

import walkit
from walkit.adapters.spark.staging import STAGING

from .drivers import finish, kill_when, start_driver
from .kafkaclients import consume_all, create_topic, end_offsets, produce

pytestmark = pytest.mark.slow

PROGRAM = os.path.join(os.path.dirname(__file__), "copy_program.py")
RECORDS = 1200


def sink_markers(client, sink: str) -> list[dict]:
    """sink_markers are the markers of every query writing to `sink` ("topic/NAME", "log/NAME")."""
    prefix = f"spark/sinks/{sink}"
    return [json.loads(client.store.get(f"{prefix}/{query}")[0]) for query in client.store.children(prefix)]


def log_values(client, name: str) -> list[bytes]:
    with client.read_log(name) as reading:
        return [record.payload for record in reading]


def test_killed_driver_restarted_from_its_checkpoint_writes_every_record_exactly_once(broker, tmp_path):
    create_topic(broker.bootstrap, "copy-in", 3)
    create_topic(broker.bootstrap, "copy-out", 3)
    produced = produce(broker.bootstrap, "copy-in", [(str(i % 7).encode(), f"record {i}".encode())
                                                     for i in range(RECORDS)])
    checkpoint = tmp_path / "checkpoint"
    log_path = tmp_path / "drivers.log"
    args = (broker.metadata_url, "copy-in", "copy-out", checkpoint, "--max-records", "300", "--log", "copy-log")
    with walkit.Client(broker.metadata_url) as client:
        def mid_run():                       # a commit publishing, or some batches written
            markers = sink_markers(client, "topic/copy-out") + sink_markers(client, "log/copy-log")
            written = sum(end_offsets(broker.bootstrap, "copy-out", 3).values())
            return any(m["state"] == "writing" for m in markers) or written >= 300
        kill_when(start_driver(PROGRAM, args, log_path, tmp_path), mid_run, log_path)
        written_at_kill = sum(end_offsets(broker.bootstrap, "copy-out", 3).values())
        assert written_at_kill < RECORDS, "the query had finished before it was killed"

        finish(start_driver(PROGRAM, (*args, "--available-now"), log_path, tmp_path), log_path)
        assert staged_for(client, "topic/copy-out") == staged_for(client, "log/copy-log") == []
        # The restarted driver exits right after its last commit, and may take the commit's writer
        # with it before its explicit LAC went out (docs/guides/spark.md: those records become
        # readable when the log's next writer recovers the ledger): be that next writer.
        client.open_log("copy-log").close()
        logged = log_values(client, "copy-log")
    copied = consume_all(broker.bootstrap, "copy-out", 3)
    counts = collections.Counter(m.value() for m in copied)
    assert len(copied) == RECORDS, f"{len(copied)} records for {RECORDS}: {[v for v, n in counts.items() if n > 1][:5]}"
    assert set(counts) == {value for _, value, _, _, _ in produced} and max(counts.values()) == 1
    assert all(m.key() == str(int(m.value().split()[1]) % 7).encode() for m in copied)
    assert sorted(logged) == sorted(value for _, value, _, _, _ in produced), \
        f"{len(logged)} log records for {RECORDS}, {len(logged) - len(set(logged))} twice"


def test_a_log_sink_appends_every_micro_batch_of_a_query_to_one_ledger(spark, broker, tmp_path):
    batches, per_batch = 6, 20
    create_topic(broker.bootstrap, "ledger-in", 1)
    produced = [value for _, value, _, _, _ in produce(broker.bootstrap, "ledger-in", [
        (None, f"record {i}".encode()) for i in range(batches * per_batch)])]
    source = (spark.readStream.format("walkit").option("metadata", broker.metadata_url).option("topic", "ledger-in")
              .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(per_batch)).load())
    query = (source.select("value").writeStream.format("walkit").option("metadata", broker.metadata_url)
             .option("log", "ledger-out").option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(180), "the query did not finish in 180 s"
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    with walkit.Client(broker.metadata_url) as client:
        [marker] = sink_markers(client, "log/ledger-out")
        assert marker == {"batch": batches - 1, "state": "done"}
        ledgers = client.log_metadata("ledger-out").ledger_ids
        client.open_log("ledger-out").close()   # fences the query's writer: its last records become readable
        assert log_values(client, "ledger-out") == produced
    assert len(ledgers) == 1, f"{len(ledgers)} ledgers for {batches} micro-batches"


def staged_for(client, sink: str) -> list[str]:
    """staged_for lists the staged-ledger keys registered for `sink` (staging.py)."""
    keys = [f"{STAGING}/{query}/{ledger}" for query in client.store.children(STAGING)
            for ledger in client.store.children(f"{STAGING}/{query}")]
    return [key for key in keys if json.loads(client.store.get(key)[0])["sink"] == sink]
