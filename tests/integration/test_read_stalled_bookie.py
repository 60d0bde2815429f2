"""A catch-up read while one replica's bookie is held with SIGSTOP, with real bookie processes.

A stopped bookie neither answers nor drops its connection, so only a timeout tells the reader
it is gone. The read must still deliver every entry, in order, from the other replicas, and
the stop must cost it one request timeout: the reader asks a bookie that timed out last for
the rest of the read. (Before, every later window of the read asked it first again and waited
out another timeout: this test saw 6 stalls of 2 s.) A log reader carries that over from one
ledger to the next.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

import walkit
from walkit.local import LocalCluster

pytestmark = pytest.mark.slow

REQUEST_TIMEOUT = 2.0        # seconds: the reader's wait for a bookie that does not answer
ENTRIES = 30_000             # about 14 top-ups of the reader's default window of 4,096
BEFORE_STOP = 5_000          # entries consumed before the bookie is stopped


def read_through_a_stop(cluster: LocalCluster, records, before_stop: int) -> tuple[list, list[float]]:
    """read_through_a_stop takes `before_stop` items of `records`, holds bookie 0 with SIGSTOP
    (the first replica of a third of the entries), takes the rest and lets the bookie go. It
    returns every item and the seconds each wait for the next one took after the stop."""
    got = [next(records) for _ in range(before_stop)]
    victim = cluster.pid(0)
    os.kill(victim, signal.SIGSTOP)
    try:
        arrivals = [time.monotonic()]
        for item in records:
            got.append(item)
            arrivals.append(time.monotonic())
    finally:
        os.kill(victim, signal.SIGCONT)
    return got, [b - a for a, b in zip(arrivals, arrivals[1:])]


def assert_at_most_one_stall(gaps: list[float]) -> None:
    stalls = [round(g, 2) for g in gaps if g >= 0.75 * REQUEST_TIMEOUT]
    assert len(stalls) <= 1, f"the read stalled {len(stalls)} times waiting for the stopped bookie: {stalls}"


def test_catch_up_read_goes_on_in_order_with_one_stall_while_a_replica_is_stopped(tmp_path):
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage="memory") as cluster:
        with walkit.Client(cluster.metadata_url) as client:
            writer = client.create_ledger(3, 2, 2, password=b"pw")
            payloads = [os.urandom(100) for _ in range(ENTRIES)]
            for start in range(0, ENTRIES, 1000):
                writer.append_many(payloads[start:start + 1000])
            writer.close()

        with walkit.Client(cluster.metadata_url, request_timeout=REQUEST_TIMEOUT) as client:
            ledger = client.open_ledger(writer.ledger_id, password=b"pw")
            got, gaps = read_through_a_stop(cluster, ledger.read(), BEFORE_STOP)

    assert [e.entry_id for e in got] == list(range(ENTRIES))
    assert [e.payload for e in got] == payloads
    assert_at_most_one_stall(gaps)


def test_log_read_across_ledgers_stalls_once_while_a_replica_is_stopped(tmp_path):
    with LocalCluster(bookies=3, data_dir=str(tmp_path / "cluster"), storage="memory") as cluster:
        with walkit.Client(cluster.metadata_url) as client:
            writer = client.open_log("stalled", roll_entries=1000)
            records = [os.urandom(100) for _ in range(6000)]
            positions = []
            for start in range(0, len(records), 500):       # a roll needs a pause in the appends
                futures = [writer.append_async(r) for r in records[start:start + 500]]
                positions += [f.result(30) for f in futures]
            writer.close()
            assert len({p.ledger_id for p in positions}) >= 5

        with walkit.Client(cluster.metadata_url, request_timeout=REQUEST_TIMEOUT) as client:
            got, gaps = read_through_a_stop(cluster, iter(client.read_log("stalled")), 500)

    assert [r.position for r in got] == positions
    assert [r.payload for r in got] == records
    assert_at_most_one_stall(gaps)
