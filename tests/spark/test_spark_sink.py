"""The sink's commit protocol without Spark: a commit cut short is resumed by its replay, nothing twice.

Spark replays a micro-batch whose commit did not finish; these tests cut the commit off after
some rows reached the topic or the log (the staged rows stop, as when the driver dies), then
run the replay's commit with rows staged anew, as replayed tasks would, and a third commit of
the same batch, as after a crash between the marker and Spark's own commit log.
"""

from __future__ import annotations

import collections

import pytest

import walkit
from walkit.adapters.spark import writer as sink
from walkit.adapters.spark.options import SinkOptions
from walkit.adapters.spark.records import encode_row
from walkit.adapters.spark.staging import STAGING

from .kafkaclients import consume_all, create_topic

pytestmark = pytest.mark.slow

QUERY = "7b1f0c1e-0000-4000-8000-000000000001"


class Crash(Exception):
    """Crash stands for the driver dying in the middle of a commit."""


def stage_rows(options, rows, batch):
    """stage_rows stages rows as two write tasks of micro-batch `batch` would; it returns their commit messages."""
    half = len(rows) // 2
    return [sink.stage(options, lambda row: row, part, QUERY, batch) for part in (rows[:half], rows[half:])]


def cut_after(monkeypatch, count):
    """cut_after makes the next commit's staged rows stop with Crash after `count` rows."""
    original = sink.staged_rows

    def cut(*args, **kwargs):
        for i, row in enumerate(original(*args, **kwargs)):
            if i == count:
                monkeypatch.setattr(sink, "staged_rows", original)
                raise Crash()
            yield row
    monkeypatch.setattr(sink, "staged_rows", cut)


@pytest.mark.parametrize("kind", ["topic", "log"])
def test_a_commit_cut_short_is_resumed_by_its_replay_and_a_third_commit_writes_nothing(broker, monkeypatch, kind):
    name = f"resume-{kind}"
    if kind == "topic":
        create_topic(broker.bootstrap, name, 2)
        options = SinkOptions(broker.metadata_url, topic=name)
    else:
        options = SinkOptions(broker.metadata_url, log=name)
    values = [f"row {i}".encode() for i in range(100)]
    rows = [encode_row(i % 2 if kind == "topic" else None, b"k", value, None) for i, value in enumerate(values)]
    writer = sink.StreamWriter.__new__(sink.StreamWriter)
    writer.options = options

    cut_after(monkeypatch, 40)
    with pytest.raises(Crash):
        writer.commit(stage_rows(options, rows, 0), 0)
    writer.commit(stage_rows(options, rows[::-1], 0), 0)          # the replay stages its rows in another order
    writer.commit(stage_rows(options, rows, 0), 0)                # replayed again after the marker said done

    if kind == "topic":
        written = [m.value() for m in consume_all(broker.bootstrap, name, 2)]
    else:
        with walkit.Client(broker.metadata_url) as client, client.read_log(name) as reading:
            written = [record.payload for record in reading]
    assert collections.Counter(written) == collections.Counter(values)
    if kind == "log":
        assert written == values                  # the interrupted commit's order: its staged ledgers
    with walkit.Client(broker.metadata_url) as client:
        assert client.store.children(f"{STAGING}/{QUERY}") == []   # every staged ledger was collected
