"""The sink's commit protocol without Spark: a commit cut short is resumed by its replay, nothing twice.

Spark replays a micro-batch whose commit did not finish, and a user reruns a batch write named
with writeId; these tests cut the commit off after some rows reached the topic or the log (the
staged rows stop, as when the driver dies), then run the replay's commit with rows staged anew,
as replayed tasks would, and a third commit of the same batch, as after a crash between the
marker and Spark's own commit log. A streaming query's log writer stays open between its
commits in one process, and is replaced once another writer took the log.
"""

from __future__ import annotations

import collections
import dataclasses

import pytest

import walkit
from walkit.adapters.spark import markers
from walkit.adapters.spark import writer as sink
from walkit.adapters.spark.options import SinkOptions
from walkit.adapters.spark.records import encode_row
from walkit.adapters.spark.staging import STAGING

from .kafkaclients import consume_all, create_topic

pytestmark = pytest.mark.slow

QUERY = "7b1f0c1e-0000-4000-8000-000000000001"


class Crash(Exception):
    """Crash stands for the driver dying in the middle of a commit."""


def stage_rows(options, rows, batch, name=QUERY):
    """stage_rows stages rows as two write tasks of batch `batch` of write `name` would; it returns their
    commit messages."""
    half = len(rows) // 2
    return [sink.stage(options, lambda row: row, part, name, batch) for part in (rows[:half], rows[half:])]


def cut_after(monkeypatch, count):
    """cut_after makes the next commit's staged rows stop with Crash after `count` rows."""
    original = markers.staged_rows

    def cut(*args, **kwargs):
        for i, row in enumerate(original(*args, **kwargs)):
            if i == count:
                monkeypatch.setattr(markers, "staged_rows", original)
                raise Crash()
            yield row
    monkeypatch.setattr(markers, "staged_rows", cut)


def streaming_commit(options):
    """streaming_commit is (the write's name, a function committing batch 0 of query QUERY)."""
    writer = sink.StreamWriter.__new__(sink.StreamWriter)
    writer.options = options
    return QUERY, lambda messages: writer.commit(messages, 0)


def named_batch_commit(options):
    """named_batch_commit is (the write's name, a function committing df.write with writeId "daily")."""
    options = dataclasses.replace(options, write_id="daily")
    writer = sink.BatchWriter.__new__(sink.BatchWriter)
    writer.options, writer.job = options, "daily"
    return "daily", writer.commit


def written_to(broker, options) -> list[bytes]:
    """written_to is the values in the sink of `options`, in the order of the topic's partitions or the log.

    A log is opened first: that fences the writer the last commit kept open, so every record it
    appended is readable (readers stop at the bookies' LAC, which follows the writer's
    acknowledgements by up to its explicit-LAC delay, 100 ms).
    """
    if options.topic is not None:
        return [m.value() for m in consume_all(broker.bootstrap, options.topic, 2)]
    with walkit.Client(broker.metadata_url) as client:
        client.open_log(options.log).close()
        with client.read_log(options.log) as reading:
            return [record.payload for record in reading]


@pytest.mark.parametrize("write", [streaming_commit, named_batch_commit], ids=["streaming", "writeId"])
@pytest.mark.parametrize("kind", ["topic", "log"])
def test_a_commit_cut_short_is_resumed_by_its_replay_and_a_third_commit_writes_nothing(broker, monkeypatch, kind,
                                                                                       write):
    name = f"resume-{kind}-{write.__name__}"
    if kind == "topic":
        create_topic(broker.bootstrap, name, 2)
        options = SinkOptions(broker.metadata_url, topic=name)
    else:
        options = SinkOptions(broker.metadata_url, log=name)
    values = [f"row {i}".encode() for i in range(100)]
    rows = [encode_row(i % 2 if kind == "topic" else None, b"k", value, None) for i, value in enumerate(values)]
    staged_as, commit = write(options)

    cut_after(monkeypatch, 40)
    with pytest.raises(Crash):
        commit(stage_rows(options, rows, 0, staged_as))
    commit(stage_rows(options, rows[::-1], 0, staged_as))       # the replay stages its rows in another order
    commit(stage_rows(options, rows, 0, staged_as))             # replayed again after the marker said done

    written = written_to(broker, options)
    assert collections.Counter(written) == collections.Counter(values)
    if kind == "log":
        assert written == values                  # the interrupted commit's order: its staged ledgers
    with walkit.Client(broker.metadata_url) as client:
        assert client.store.children(f"{STAGING}/{staged_as}") == []   # every staged ledger was collected


def test_a_querys_log_commits_in_one_process_append_to_one_ledger_until_another_writer_takes_the_log(broker):
    options = SinkOptions(broker.metadata_url, log="kept-open")
    values = [f"row {i}".encode() for i in range(60)]
    rows = [encode_row(None, None, value, None) for value in values]

    def commit(batch: int) -> None:        # a new StreamWriter each time, as Spark unpickles one per commit
        writer = sink.StreamWriter.__new__(sink.StreamWriter)
        writer.options = options
        writer.commit(stage_rows(options, rows[batch * 10:batch * 10 + 10], batch), batch)
    for batch in range(3):
        commit(batch)
    with walkit.Client(broker.metadata_url) as client:
        first = client.log_metadata("kept-open").ledger_ids
        assert len(first) == 1, first
        client.open_log("kept-open").close()     # another writer takes the log: the kept writer is fenced
        taken = client.log_metadata("kept-open").ledger_ids
    for batch in range(3, 6):
        commit(batch)
    with walkit.Client(broker.metadata_url) as client:
        ledgers = client.log_metadata("kept-open").ledger_ids
        assert len([ledger for ledger in ledgers if ledger > max(taken)]) == 1, (taken, ledgers)
        client.open_log("kept-open").close()     # fences the kept writer: every record it appended is readable
        with client.read_log("kept-open") as reading:
            records = list(reading)
        assert {record.position.ledger_id for record in records[:30]} == set(first)
        assert {record.position.ledger_id for record in records[30:]} == {ledgers[-1]}
        assert client.store.children(f"{STAGING}/{QUERY}") == []
    assert [record.payload for record in records] == values
