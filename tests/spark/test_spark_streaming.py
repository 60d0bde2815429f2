"""A streaming topic-to-topic query whose driver is SIGKILLed mid-run and restarted from its checkpoint."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys

import pytest

import walkit
from walkit.adapters.spark.staging import STAGING

from ..integration.helpers import child_pids, pid_alive, wait_until
from .conftest import spark_environment
from .kafkaclients import consume_all, create_topic, end_offsets, produce

pytestmark = pytest.mark.slow

PROGRAM = os.path.join(os.path.dirname(__file__), "copy_program.py")
RECORDS = 1200


def start_driver(broker, checkpoint, log, *extra):
    """start_driver runs copy_program.py as its own driver process (its own JVM)."""
    return subprocess.Popen([sys.executable, PROGRAM, broker.metadata_url, "copy-in", "copy-out", str(checkpoint),
                             *extra], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=spark_environment(), cwd=os.path.dirname(str(checkpoint)))


def descendants(pid: int) -> set[int]:
    found, queue = set(), [pid]
    while queue:
        for child in child_pids(queue.pop()):
            if child not in found:
                found.add(child)
                queue.append(child)
    return found


def sink_markers(client) -> list[dict]:
    prefix = "spark/sinks/topic/copy-out"
    return [json.loads(client.store.get(f"{prefix}/{query}")[0]) for query in client.store.children(prefix)]


def test_killed_driver_restarted_from_its_checkpoint_writes_every_record_exactly_once(broker, tmp_path):
    create_topic(broker.bootstrap, "copy-in", 3)
    create_topic(broker.bootstrap, "copy-out", 3)
    produced = produce(broker.bootstrap, "copy-in", [(str(i % 7).encode(), f"record {i}".encode())
                                                     for i in range(RECORDS)])
    checkpoint = tmp_path / "checkpoint"
    log_path = tmp_path / "drivers.log"
    with open(log_path, "ab") as log, walkit.Client(broker.metadata_url) as client:
        driver = start_driver(broker, checkpoint, log, "--max-records", "300")
        family: set[int] = set()
        try:
            def mid_run():                       # a commit publishing, or some batches written
                if driver.poll() is not None:
                    return "exited"
                family.update(descendants(driver.pid))
                markers = sink_markers(client)
                written = sum(end_offsets(broker.bootstrap, "copy-out", 3).values())
                return any(m["state"] == "writing" for m in markers) or written >= 300
            state = wait_until(mid_run, 180, interval=0.01, message=lambda: open(log_path).read()[-3000:])
            assert state is True, f"the driver exited on its own:\n{open(log_path).read()[-3000:]}"
            os.kill(driver.pid, signal.SIGKILL)
            driver.wait(30)
            written_at_kill = sum(end_offsets(broker.bootstrap, "copy-out", 3).values())
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait(30)
            # the JVM exits when its parent's pipe closes, its Python workers with it
            family |= descendants(driver.pid)
            wait_until(lambda: not any(pid_alive(pid) for pid in family), 60,
                       message="the killed driver's JVM and workers did not exit")
        assert written_at_kill < RECORDS, "the query had finished before it was killed"

        restarted = start_driver(broker, checkpoint, log, "--max-records", "300", "--available-now")
        try:
            assert restarted.wait(240) == 0, open(log_path).read()[-3000:]
        finally:
            if restarted.poll() is None:
                restarted.kill()
                restarted.wait(30)
    copied = consume_all(broker.bootstrap, "copy-out", 3)
    counts = collections.Counter(m.value() for m in copied)
    assert len(copied) == RECORDS, f"{len(copied)} records for {RECORDS}: {[v for v, n in counts.items() if n > 1][:5]}"
    assert set(counts) == {value for _, value, _, _, _ in produced} and max(counts.values()) == 1
    assert all(m.key() == str(int(m.value().split()[1]) % 7).encode() for m in copied)
    with walkit.Client(broker.metadata_url) as client:             # the restart collected what the kill left
        assert staged_for(client, "topic/copy-out") == []


def staged_for(client, sink: str) -> list[str]:
    """staged_for lists the staged-ledger keys registered for `sink` (staging.py)."""
    keys = [f"{STAGING}/{query}/{ledger}" for query in client.store.children(STAGING)
            for ledger in client.store.children(f"{STAGING}/{query}")]
    return [key for key in keys if json.loads(client.store.get(key)[0])["sink"] == sink]
