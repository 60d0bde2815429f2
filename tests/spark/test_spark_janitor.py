"""Staged rows a write leaves behind are found and deleted: the janitor (staging.sweep, `walkit spark cleanup`).

A batch write's driver (batch_write_program.py, its own JVM) is SIGKILLed while its tasks stage
rows; `walkit spark cleanup` then deletes the staged ledgers, and the rerun writes every row
once. The sweep's rules are checked on registrations made by hand: a streaming query's rows go
once its marker says their batch is done, a batch write's once older than the grace period.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

import pytest

import walkit
from walkit.adapters.spark.staging import STAGING, Stage, sweep

from .drivers import finish, kill_when, start_driver
from .kafkaclients import consume_all, create_topic
from .test_spark_streaming import staged_for

pytestmark = pytest.mark.slow

PROGRAM = os.path.join(os.path.dirname(__file__), "batch_write_program.py")
ROWS = 2000


def test_a_batch_write_killed_while_staging_leaves_nothing_after_cleanup_and_its_rerun_writes_once(broker, tmp_path):
    create_topic(broker.bootstrap, "janitor-out", 2)
    log_path = tmp_path / "driver.log"
    args = (broker.metadata_url, "janitor-out", ROWS)
    with walkit.Client(broker.metadata_url) as client:
        kill_when(start_driver(PROGRAM, (*args, "--slow-ms", "20"), log_path, tmp_path),
                  lambda: staged_for(client, "topic/janitor-out"), log_path, interval=0.05)
        left = staged_for(client, "topic/janitor-out")
        assert left, "the kill left no staged rows to clean up"
        ledgers = [int(key.rsplit("/", 1)[1]) for key in left]
        cleanup = subprocess.run([sys.executable, "-m", "walkit", "spark", "cleanup", "--metadata",
                                  broker.metadata_url, "--older-than", "0s", "--sink", "topic/janitor-out"],
                                 capture_output=True, text=True, timeout=60)
        assert cleanup.returncode == 0 and f"deleted {len(left)} staged ledger" in cleanup.stdout, cleanup
        assert staged_for(client, "topic/janitor-out") == []
        assert not set(ledgers) & set(client.list_ledgers())

        finish(start_driver(PROGRAM, args, log_path, tmp_path), log_path)
        assert staged_for(client, "topic/janitor-out") == []
    written = collections.Counter(m.value() for m in consume_all(broker.bootstrap, "janitor-out", 2))
    assert written == collections.Counter(str(i).encode() for i in range(ROWS))


def test_the_sweep_takes_done_batches_and_old_batch_writes_and_keeps_the_rest(broker):
    with walkit.Client(broker.metadata_url) as client:
        def staged(query, batch):
            stage = Stage(client, "log/swept", query, batch, b"")
            stage.add(b"row")
            return stage.finish().ledger_id
        query = "5f0c0000-0000-4000-8000-00000000000a"
        done, pending = staged(query, 3), staged(query, 4)
        young_write = staged("write-young", 0)
        client.store.create(f"spark/sinks/log/swept/{query}", json.dumps({"batch": 3, "state": "done"}).encode())
        assert sweep(client, sink="log/swept") == 1                     # batch 3 is done; 4 and the write stay
        assert sorted(client.store.children(f"{STAGING}/{query}")) == [str(pending)]
        assert client.store.children(f"{STAGING}/write-young") == [str(young_write)]
        assert sweep(client, grace_s=0.0, sink="log/swept") == 1        # past the grace: the batch write goes
        assert client.store.children(f"{STAGING}/write-young") == []
        assert done not in client.list_ledgers() and young_write not in client.list_ledgers()
        client.store.put(f"spark/sinks/log/swept/{query}", json.dumps({"batch": 4, "state": "done"}).encode(),
                         client.store.get(f"spark/sinks/log/swept/{query}")[1])
        assert sweep(client, sink="log/swept") == 1 and client.store.children(f"{STAGING}/{query}") == []
        client.store.delete(f"spark/sinks/log/swept/{query}")
